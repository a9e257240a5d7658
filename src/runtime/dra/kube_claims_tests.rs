//! The DRA driver reading claims through the real `kube` client from the in-process API
//! server emulator: a claim allocated as the scheduler would (`allocate_claim`) is prepared;
//! a deleted and re-created claim (new UID), an unallocated one, a missing one, 403 and 500
//! answers are each that claim's error; a slow answer still prepares. A prepared claim's
//! `status.devices` names the physical devices it holds and loses our entries at Unprepare
//! (another driver's kept, a 409 read again, a 403 never failing the prepare), all under
//! exactly the RBAC of `deploy/dra/rbac.yaml` and the API's rule that entries match the
//! allocation.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::platform::kube::KubeClaims;
use crate::runtime::Context;
use crate::runtime::dra::spawn;
use crate::testkit::apiserver::{Admission, ApiServer, Denial, Fault, RequestRecord, User, Verb};
use crate::testkit::kubelet::dra::{KubeletClaim, register};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

const DRIVER: &str = "gpu-slicer.io";

use super::kubelet_tests::{settings, store};

async fn create(api: &Api<ResourceClaim>, name: &str) -> String {
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu-slicer.io"}}]}}
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &claim).await.unwrap();
    created.metadata.uid.unwrap()
}

fn allocation(device: &str) -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(vec![DeviceRequestAllocationResult {
                request: "gpu".into(),
                driver: DRIVER.into(),
                pool: "node-a".into(),
                device: device.into(),
                ..Default::default()
            }]),
            config: None,
        }),
        ..Default::default()
    }
}

fn k(name: &str, uid: &str) -> KubeletClaim {
    KubeletClaim {
        namespace: "ml".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

#[tokio::test]
async fn claims_come_from_the_api_and_its_failures_are_the_claims_errors() {
    crate::platform::kube::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServer::start().await.unwrap();
    let client = server.client().unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "ml");
    let good = create(&claims, "good").await;
    server
        .allocate_claim("ml", "good", &allocation("gpu-2"))
        .unwrap();
    let pending = create(&claims, "pending").await;
    let old = create(&claims, "replaced").await;
    claims
        .delete("replaced", &DeleteParams::default())
        .await
        .unwrap();
    let new = create(&claims, "replaced").await;
    assert_ne!(old, new);
    server
        .allocate_claim("ml", "replaced", &allocation("gpu-3"))
        .unwrap();
    let denied = create(&claims, "denied").await;
    let failing = create(&claims, "failing").await;
    let slow = create(&claims, "slow").await;
    server
        .allocate_claim("ml", "slow", &allocation("gpu-3"))
        .unwrap();
    server.inject(Fault::status(Verb::Get, "/resourceclaims/denied", 403));
    server.inject(Fault::status(Verb::Get, "/resourceclaims/failing", 500));
    server.inject(Fault::delay(
        Verb::Get,
        "/resourceclaims/slow",
        Duration::from_millis(200),
    ));

    let ctx = Context::new(store());
    let _handle = spawn(
        settings(dir.path()),
        Arc::new(KubeClaims::new(client)),
        &ctx,
    )
    .await
    .unwrap();
    let kubelet = register(&dir.path().join(format!("reg/{DRIVER}-reg.sock")))
        .await
        .unwrap();
    let answer = kubelet
        .prepare(
            &[
                k("good", &good),
                k("pending", &pending),
                k("replaced", &old),
                k("absent", "00000000-0000-4000-8000-0000000000aa"),
                k("denied", &denied),
                k("failing", &failing),
                k("slow", &slow),
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(answer.len(), 7);
    assert_eq!(
        answer[&good].as_ref().unwrap()[0].1,
        [format!("k8s.{DRIVER}/claim={good}-gpu-2")]
    );
    let err = |uid: &str| answer[uid].clone().unwrap_err();
    assert!(err(&pending).contains("not allocated"), "{}", err(&pending));
    assert!(err(&old).contains("re-created"), "{}", err(&old));
    assert!(err("00000000-0000-4000-8000-0000000000aa").contains("not found"));
    assert!(err(&denied).contains("403"), "{}", err(&denied));
    assert!(err(&failing).contains("500"), "{}", err(&failing));
    assert!(answer[&slow].is_ok(), "{:?}", answer[&slow]);
    ctx.token.cancel();
    ctx.tracker.close();
    ctx.tracker.wait().await;
    server.stop().await;
}

/// The rules `deploy/dra/rbac.yaml` grants the agent's service account: (apiGroups,
/// resources, verbs, resourceNames) of the ClusterRole and of the Role (events in `default`).
fn granted_rules() -> Vec<(Value, Option<String>)> {
    let text = std::fs::read_to_string("deploy/dra/rbac.yaml").unwrap();
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).unwrap();
        if matches!(v["kind"].as_str(), Some("ClusterRole" | "Role")) {
            let ns = v["metadata"]["namespace"].as_str().map(str::to_string);
            for rule in v["rules"].as_array().unwrap() {
                out.push((rule.clone(), ns.clone()));
            }
        }
    }
    out
}

/// Whether `rules` allow `verb` on `group`/`resource` (`resource/sub`) named `name` in `ns`.
fn allows(
    rules: &[(Value, Option<String>)],
    (group, resource, name, ns): (&str, &str, &str, &str),
    verb: &str,
) -> bool {
    let has = |list: &Value, want: &str| {
        list.as_array()
            .is_some_and(|l| l.iter().any(|x| x == want || x == "*"))
    };
    rules.iter().any(|(r, role_ns)| {
        role_ns.as_deref().is_none_or(|n| n == ns)
            && has(&r["apiGroups"], group)
            && has(&r["resources"], resource)
            && has(&r["verbs"], verb)
            && (r.get("resourceNames").is_none() || has(&r["resourceNames"], name))
    })
}

/// RBAC as the API server applies it to `record`: the path's group, resource (with its
/// subresource), name and namespace against the granted rules; a claim status write also
/// needs, as on 1.36+ servers, `associated-node:update` on `resourceclaims/driver` for our
/// driver.
fn rbac(rules: &[(Value, Option<String>)], record: &RequestRecord) -> bool {
    let parts: Vec<&str> = record.path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _v, rest @ ..] => ("", rest),
        ["apis", g, _v, rest @ ..] => (*g, rest),
        _ => return false,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (*ns, rest),
        _ => ("", rest),
    };
    let (resource, name) = match rest {
        [r] => ((*r).to_string(), ""),
        [r, n] => ((*r).to_string(), *n),
        [r, n, sub] => (format!("{r}/{sub}"), *n),
        _ => return false,
    };
    let verb = record.verb.as_str();
    let status_write = resource == "resourceclaims/status" && verb == "update";
    allows(rules, (group, &resource, name, ns), verb)
        && (!status_write
            || allows(
                rules,
                (group, "resourceclaims/driver", DRIVER, ns),
                "associated-node:update",
            ))
}

/// The API's validation of `status.devices`: each entry's driver, pool and device must be
/// one of the allocation's results.
fn entries_match_the_allocation(a: &Admission<'_>) -> Result<(), Denial> {
    let Some(obj) = a.object.filter(|_| a.subresource == "status") else {
        return Ok(());
    };
    let key = |v: &Value| {
        (
            v["driver"].as_str().map(str::to_string),
            v["pool"].as_str().map(str::to_string),
            v["device"].as_str().map(str::to_string),
        )
    };
    let allocated: Vec<_> = obj
        .pointer("/status/allocation/devices/results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(key)
        .collect();
    for d in obj["status"]["devices"].as_array().into_iter().flatten() {
        if !allocated.contains(&key(d)) {
            return Err(Denial {
                code: 422,
                message: format!("status.devices: {d} is not allocated"),
            });
        }
    }
    Ok(())
}

fn our_entries(server: &ApiServer, name: &str) -> Vec<Value> {
    let claim = server.get::<ResourceClaim>("ml", name).unwrap();
    let all = serde_json::to_value(claim.status.and_then(|s| s.devices)).unwrap();
    all.as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["driver"] == DRIVER)
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_prepared_claim_says_in_its_status_which_devices_it_holds() {
    crate::platform::kube::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServer::start().await.unwrap();
    let rules = granted_rules();
    let denied = Arc::new(AtomicUsize::new(0));
    let seen = denied.clone();
    server.require_tokens(HashMap::from([(
        "agent".to_string(),
        User::service_account("gpu-slicer", "gpu-slicer", Some("node-a")),
    )]));
    server.authorize(move |_, record| {
        let ok = rbac(&rules, record);
        if !ok {
            seen.fetch_add(1, Ordering::Relaxed);
        }
        ok
    });
    server.admit(entries_match_the_allocation);
    let claim = |name: &str, uid: &str, gpu: &str, mig: &str| -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
            "status": {
                "allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": gpu},
                    {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": mig},
                    {"request": "gpu", "driver": "net.example.com", "pool": "node-a", "device": "nic-0"}]}},
                "devices": [{"driver": "net.example.com", "pool": "node-a", "device": "nic-0",
                             "data": {"mac": "02:00:00:00:00:01"}}]}
        }))
        .unwrap()
    };
    let uid = "00000000-0000-4000-8000-0000000005a1";
    let forbidden = "00000000-0000-4000-8000-0000000005a2";
    server
        .insert(&claim("train", uid, "gpu-2", "gpu-0-mig-1g10gb-19-1"))
        .unwrap();
    server
        .insert(&claim(
            "no-status",
            forbidden,
            "gpu-3",
            "gpu-0-mig-1g10gb-19-2",
        ))
        .unwrap();
    server.inject(Fault::status(
        Verb::Update,
        "/resourceclaims/no-status/status",
        403,
    ));

    let ctx = Context::new(store());
    let client = server.client_with_token(Some("agent")).unwrap();
    let _handle = spawn(
        settings(dir.path()),
        Arc::new(KubeClaims::new(client)),
        &ctx,
    )
    .await
    .unwrap();
    let kubelet = register(&dir.path().join(format!("reg/{DRIVER}-reg.sock")))
        .await
        .unwrap();
    let answer = kubelet
        .prepare(&[k("train", uid), k("no-status", forbidden)], None)
        .await
        .unwrap();
    assert!(answer[uid].is_ok(), "{answer:?}");
    assert!(
        answer[forbidden].is_ok(),
        "a status the API refuses never fails the prepare"
    );

    // Our two entries appear beside the other driver's, naming the physical devices.
    let written = server
        .wait_for::<ResourceClaim, _>(Duration::from_secs(10), |_| {
            our_entries(&server, "train").len() == 2
        })
        .await;
    assert!(written, "{:#?}", server.get::<ResourceClaim>("ml", "train"));
    let ours = our_entries(&server, "train");
    assert_eq!(ours[0]["device"], "gpu-2");
    assert_eq!(
        ours[0]["data"]["uuid"],
        "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02"
    );
    assert_eq!(
        ours[1]["data"]["uuid"],
        "MIG-1b2c3d4e-0000-4a00-8000-000000000008"
    );
    assert_eq!(ours[1]["data"]["profile"], "1g.10gb");
    assert_eq!(ours[1]["conditions"][0]["type"], "Ready");
    assert_eq!(ours[1]["conditions"][0]["status"], "True");
    let all = server.get::<ResourceClaim>("ml", "train").unwrap();
    assert_eq!(
        all.status.unwrap().devices.unwrap().len(),
        3,
        "the other driver's entry kept"
    );
    assert!(our_entries(&server, "no-status").is_empty());

    // Unprepare takes our entries away, through a lost race (409) on the first write.
    server.inject(Fault::status(Verb::Update, "/resourceclaims/train/status", 409).times(1));
    let done = kubelet.unprepare(&[k("train", uid)]).await.unwrap();
    assert_eq!(done[uid], "");
    let removed = server
        .wait_for::<ResourceClaim, _>(Duration::from_secs(10), |_| {
            our_entries(&server, "train").is_empty()
        })
        .await;
    assert!(removed, "{:#?}", server.get::<ResourceClaim>("ml", "train"));
    let left = server.get::<ResourceClaim>("ml", "train").unwrap();
    assert_eq!(
        left.status.unwrap().devices.unwrap()[0].driver,
        "net.example.com"
    );
    assert_eq!(
        denied.load(Ordering::Relaxed),
        0,
        "every request within deploy/dra/rbac.yaml: {:#?}",
        server.requests()
    );
    assert!(
        server.count(
            Verb::Update,
            "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/train/status"
        ) >= 3
    );
    ctx.token.cancel();
    ctx.tracker.close();
    ctx.tracker.wait().await;
    server.stop().await;
}

/// A crash between a prepare's answer and its status write (here: the write refused once)
/// loses nothing: the kubelet does not prepare a running pod's claim again, so the agent
/// that starts from the checkpoint writes the status of every claim it recovers.
#[tokio::test]
async fn a_recovered_claim_gets_its_status_written_after_a_restart() {
    crate::platform::kube::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServer::start().await.unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(server.client().unwrap(), "ml");
    let uid = create(&claims, "train").await;
    server
        .allocate_claim("ml", "train", &allocation("gpu-2"))
        .unwrap();
    let status_path = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/train/status";
    server.inject(Fault::status(Verb::Update, "/resourceclaims/train/status", 403).times(1));

    let start = || async {
        let ctx = Context::new(store());
        let handle = spawn(
            settings(dir.path()),
            Arc::new(KubeClaims::new(server.client().unwrap())),
            &ctx,
        )
        .await
        .unwrap();
        (ctx, handle)
    };
    let (ctx, handle) = start().await;
    let kubelet = register(&dir.path().join(format!("reg/{DRIVER}-reg.sock")))
        .await
        .unwrap();
    let answer = kubelet.prepare(&[k("train", &uid)], None).await.unwrap();
    assert!(answer[&uid].is_ok(), "{answer:?}");
    // The one write was refused (a 403 is not tried again): no status yet.
    let refused = crate::testkit::wait_until(crate::testkit::STEP, || async {
        (server.count(Verb::Update, status_path) == 1).then_some(())
    })
    .await;
    assert!(refused.is_some(), "{:#?}", server.requests());
    assert!(our_entries(&server, "train").is_empty());
    ctx.token.cancel();
    ctx.tracker.close();
    ctx.tracker.wait().await;
    drop((handle, kubelet));

    let (ctx, _handle) = start().await;
    let written = server
        .wait_for::<ResourceClaim, _>(Duration::from_secs(10), |_| {
            our_entries(&server, "train").len() == 1
        })
        .await;
    assert!(written, "{:#?}", server.requests());
    assert_eq!(our_entries(&server, "train")[0]["device"], "gpu-2");
    ctx.token.cancel();
    ctx.tracker.close();
    ctx.tracker.wait().await;
    server.stop().await;
}

/// `limits: {nvidia.com/gpu: 1}` on a DRA node (KEP-5004): the scheduler writes a special
/// claim for the pod (its annotation, the pod as owner, one request per container and
/// resource, allocated from the class whose `extendedResourceName` is `nvidia.com/gpu`), and
/// the kubelet prepares it like any claim.
#[tokio::test]
async fn the_schedulers_claim_for_an_extended_resource_is_prepared_like_any_claim() {
    crate::platform::kube::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServer::start().await.unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(server.client().unwrap(), "ml");
    let special: ResourceClaim = serde_json::from_value(json!({
        "metadata": {
            "name": "trainer-extended-resources-x7k2p", "namespace": "ml",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "trainer",
                                 "uid": "00000000-0000-4000-8000-00000000f00d", "controller": true}]
        },
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
            "deviceClassName": "gpu.gpu-slicer.io", "allocationMode": "ExactCount", "count": 1}}]}}
    }))
    .unwrap();
    let created = claims
        .create(&PostParams::default(), &special)
        .await
        .unwrap();
    let uid = created.metadata.uid.unwrap();
    let mut allocated = allocation("gpu-3");
    if let Some(results) = allocated.devices.as_mut().and_then(|d| d.results.as_mut()) {
        results[0].request = "container-0-request-0".into();
    }
    server
        .allocate_claim("ml", "trainer-extended-resources-x7k2p", &allocated)
        .unwrap();

    let ctx = Context::new(store());
    let _handle = spawn(
        settings(dir.path()),
        Arc::new(KubeClaims::new(server.client().unwrap())),
        &ctx,
    )
    .await
    .unwrap();
    let kubelet = register(&dir.path().join(format!("reg/{DRIVER}-reg.sock")))
        .await
        .unwrap();
    let answer = kubelet
        .prepare(&[k("trainer-extended-resources-x7k2p", &uid)], None)
        .await
        .unwrap();
    let devices = answer[&uid].clone().unwrap();
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0].1, [format!("k8s.{DRIVER}/claim={uid}-gpu-3")]);
    let spec = dir
        .path()
        .join(format!("cdi/k8s.{DRIVER}-claim_{uid}.json"));
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(text.contains("/dev/nvidia3"), "{text}");
    ctx.token.cancel();
    ctx.tracker.close();
    ctx.tracker.wait().await;
    server.stop().await;
}
