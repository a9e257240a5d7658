//! The API-server emulator through the real `kube` client over HTTP: get/list/watch with
//! resourceVersion and bookmarks, 410 Gone after compaction, create/update/patch/delete with
//! 409 conflicts, status subresource, 401/403, injected faults, restarts, the request log,
//! the claim-allocation helper. (The agent's own client against it: `platform::kube` unit
//! tests.)

use std::collections::HashMap;
use std::time::Duration;

use gpu_slicer::testkit::node;
use gpu_slicer::testkit::{ApiServer, Denial, Fault, User, Verb};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use tokio_stream::StreamExt;

const T: Duration = Duration::from_secs(10);

fn slice(name: &str, node: &str) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: "gpu-slicer.io".into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation: 1,
                resource_slice_count: 1,
            },
            ..ResourceSliceSpec::default()
        },
    }
}

async fn next<S, K>(s: &mut S) -> WatchEvent<K>
where
    S: tokio_stream::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin,
{
    tokio::time::timeout(T, s.next())
        .await
        .expect("watch event in time")
        .expect("stream open")
        .expect("event")
}

#[tokio::test]
async fn get_list_watch_with_field_selector_and_bookmarks() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node("n1", &[("a", "1")])).unwrap();
    api.insert(&node("n2", &[])).unwrap();
    let nodes: Api<Node> = Api::all(api.client().unwrap());
    let n1 = nodes.get("n1").await.unwrap();
    assert_eq!(n1.metadata.labels.unwrap()["a"], "1");
    let err = nodes.get("nope").await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err:?}"
    );

    let listed = nodes
        .list(&ListParams::default().fields("metadata.name=n2"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    let rv = listed.metadata.resource_version.unwrap();

    let params = WatchParams::default()
        .fields("metadata.name=n1")
        .timeout(60);
    let mut w = Box::pin(nodes.watch(&params, &rv).await.unwrap());
    api.label_node("n2", &[("x", Some("y"))]).unwrap(); // not n1: not seen
    api.label_node("n1", &[("a", Some("2"))]).unwrap();
    match next(&mut w).await {
        WatchEvent::Modified(n) => assert_eq!(n.metadata.labels.unwrap()["a"], "2"),
        other => panic!("{other:?}"),
    }
    api.bookmark();
    match next(&mut w).await {
        WatchEvent::Bookmark(b) => assert_eq!(
            b.metadata.resource_version,
            api.resource_version().to_string()
        ),
        other => panic!("{other:?}"),
    }
    api.remove::<Node>("", "n1");
    assert!(matches!(next(&mut w).await, WatchEvent::Deleted(_)));
    assert_eq!(api.count(Verb::Watch, "/api/v1/nodes"), 1);
    assert_eq!(api.count(Verb::Get, "/api/v1/nodes/n1"), 1);
    let watch = api
        .requests()
        .into_iter()
        .find(|r| r.verb == Verb::Watch)
        .unwrap();
    assert!(
        watch.query.contains("fieldSelector=metadata.name%3Dn1"),
        "{}",
        watch.query
    );
    api.stop().await;
}

#[tokio::test]
async fn watch_from_a_compacted_version_is_gone() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node("n1", &[])).unwrap();
    let old = api.resource_version().to_string();
    api.label_node("n1", &[("a", Some("1"))]).unwrap();
    api.compact();
    let nodes: Api<Node> = Api::all(api.client().unwrap());
    let mut w = Box::pin(nodes.watch(&WatchParams::default(), &old).await.unwrap());
    match next(&mut w).await {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("{other:?}"),
    }
    // A watch with no version starts with the current state.
    let mut w = Box::pin(nodes.watch(&WatchParams::default(), "0").await.unwrap());
    assert!(
        matches!(next(&mut w).await, WatchEvent::Added(n) if n.metadata.name.as_deref() == Some("n1"))
    );
    api.stop().await;
}

#[tokio::test]
async fn writes_conflicts_status_subresource_and_generations() {
    let api = ApiServer::start().await.unwrap();
    let slices: Api<ResourceSlice> = Api::all(api.client().unwrap());
    let pp = PostParams::default();
    let created = slices.create(&pp, &slice("s1", "n1")).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let again = slices.create(&pp, &slice("s1", "n1")).await.unwrap_err();
    assert!(
        matches!(again, kube::Error::Api(ref s) if s.code == 409),
        "{again:?}"
    );

    let mut stale = created.clone();
    let mut fresh = created.clone();
    fresh.spec.pool.generation = 2;
    let updated = slices.replace("s1", &pp, &fresh).await.unwrap();
    assert_eq!(
        updated.metadata.generation,
        Some(2),
        "spec change bumps generation"
    );
    stale.spec.pool.generation = 3;
    let conflict = slices.replace("s1", &pp, &stale).await.unwrap_err();
    assert!(
        matches!(conflict, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"),
        "{conflict:?}"
    );

    let mut gen_named = slice("", "n1");
    gen_named.metadata.name = None;
    gen_named.metadata.generate_name = Some("0-gpu-slicer.io-n1-".into());
    let g = slices.create(&pp, &gen_named).await.unwrap();
    assert!(g.metadata.name.unwrap().starts_with("0-gpu-slicer.io-n1-"));

    let n1 = slices
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(n1.items.len(), 2);
    let json = serde_json::json!([{"op": "replace", "path": "/spec/pool/generation", "value": 5}]);
    let patched = slices
        .patch(
            "s1",
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(json).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.pool.generation, 5);
    let ssa = PatchParams::apply("gpu-slicer");
    let applied = slices
        .patch("s9", &ssa, &Patch::Apply(&slice("s9", "n2")))
        .await
        .unwrap();
    assert_eq!(applied.spec.node_name.as_deref(), Some("n2"));

    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("other".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert!(
        matches!(slices.delete("s1", &dp).await.unwrap_err(), kube::Error::Api(s) if s.code == 409)
    );
    slices.delete("s1", &DeleteParams::default()).await.unwrap();
    slices
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields("spec.nodeName=n1"),
        )
        .await
        .unwrap();
    assert_eq!(api.list::<ResourceSlice>().len(), 1);

    // Nodes: a main-resource patch cannot change status, a /status patch only status.
    let mut n = node("n1", &[]);
    n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
        phase: Some("Running".into()),
        ..Default::default()
    });
    api.insert(&n).unwrap();
    let nodes: Api<Node> = Api::all(api.client().unwrap());
    let p = serde_json::json!({"metadata": {"labels": {"a": "1"}}, "status": {"phase": "Gone"}});
    let out = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    assert_eq!(out.status.unwrap().phase.as_deref(), Some("Running"));
    let out = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    assert_eq!(out.status.unwrap().phase.as_deref(), Some("Gone"));
    assert_eq!(out.metadata.labels.unwrap()["a"], "1");
    api.stop().await;
}

#[tokio::test]
async fn tokens_authorization_admission_and_faults() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node("n1", &[])).unwrap();
    let agent = User::service_account("gpu-slicer", "gpu-slicer", Some("n1"));
    api.require_tokens(HashMap::from([("good".to_owned(), agent)]));
    api.authorize(|user, req| !(req.verb == Verb::Delete && user.username.contains("gpu-slicer")));
    api.admit(|a| {
        match a
            .object
            .and_then(|o| o.pointer("/metadata/labels/forbidden"))
        {
            Some(_) => Err(Denial {
                code: 403,
                message: format!("{} may not set forbidden", a.user.username),
            }),
            None => Ok(()),
        }
    });
    let anon: Api<Node> = Api::all(api.client().unwrap());
    assert!(matches!(anon.get("n1").await.unwrap_err(), kube::Error::Api(s) if s.code == 401));
    let nodes: Api<Node> = Api::all(api.client_with_token(Some("good")).unwrap());
    nodes.get("n1").await.unwrap();
    assert!(
        matches!(nodes.delete("n1", &DeleteParams::default()).await.unwrap_err(), kube::Error::Api(s) if s.code == 403)
    );
    let p = serde_json::json!({"metadata": {"labels": {"forbidden": "x"}}});
    let denied = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap_err();
    assert!(
        matches!(denied, kube::Error::Api(ref s) if s.code == 403 && s.message.contains("may not set")),
        "{denied:?}"
    );

    api.inject(Fault::status(Verb::Get, "/nodes/n1", 500).times(2));
    for _ in 0..2 {
        assert!(matches!(nodes.get("n1").await.unwrap_err(), kube::Error::Api(s) if s.code == 500));
    }
    nodes.get("n1").await.unwrap();
    api.inject(Fault::delay(Verb::Get, "/nodes/n1", Duration::from_millis(200)).times(1));
    let started = std::time::Instant::now();
    nodes.get("n1").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(api.requests().iter().filter(|r| r.code == 500).count(), 2);
    api.stop().await;
}

#[tokio::test]
async fn down_cuts_watches_and_up_serves_the_same_store() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node("n1", &[])).unwrap();
    let nodes: Api<Node> = Api::all(api.client().unwrap());
    let mut w = Box::pin(
        nodes
            .watch(&WatchParams::default().fields("metadata.name=n1"), "0")
            .await
            .unwrap(),
    );
    assert!(matches!(next(&mut w).await, WatchEvent::Added(_)));
    api.go_down();
    let ended = tokio::time::timeout(T, w.next())
        .await
        .expect("stream ends when the server goes down");
    assert!(!matches!(ended, Some(Ok(_))), "{ended:?}");
    assert!(nodes.get("n1").await.is_err());
    api.come_up().await.unwrap();
    assert_eq!(
        nodes.get("n1").await.unwrap().metadata.name.as_deref(),
        Some("n1")
    );
    api.stop().await;
}

#[tokio::test]
async fn allocate_claim_writes_status_allocation() {
    let api = ApiServer::start().await.unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(api.client().unwrap(), "ns");
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "c1", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu-slicer.io"}}]}}
    }))
    .unwrap();
    let created = claims.create(&PostParams::default(), &claim).await.unwrap();
    let mut w = Box::pin(
        claims
            .watch(
                &WatchParams::default(),
                &created.metadata.resource_version.unwrap(),
            )
            .await
            .unwrap(),
    );
    let allocation = AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(vec![DeviceRequestAllocationResult {
                request: "gpu".into(),
                driver: "gpu-slicer.io".into(),
                pool: "n1".into(),
                device: "gpu-0".into(),
                ..Default::default()
            }]),
            config: None,
        }),
        ..Default::default()
    };
    api.allocate_claim("ns", "c1", &allocation).unwrap();
    match next(&mut w).await {
        WatchEvent::Modified(c) => {
            let results = c
                .status
                .unwrap()
                .allocation
                .unwrap()
                .devices
                .unwrap()
                .results
                .unwrap();
            assert_eq!(results[0].device, "gpu-0");
        }
        other => panic!("{other:?}"),
    }
    assert!(api.allocate_claim("ns", "missing", &allocation).is_err());
    api.stop().await;
}
