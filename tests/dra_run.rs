//! `gpu-slicer run --dra` end to end, the built binary on the `mixed-a100` sim node against the
//! in-process API-server emulator (through `--kubeconfig`) and the kubelet's DRA side
//! (plugin watcher, NodePrepareResources / NodeUnprepareResources over the real sockets): the
//! node's ResourceSlice appears and follows a config change, no device-plugin socket is
//! served, a claim allocated in the emulator is prepared into a per-claim CDI spec that
//! parses, a SIGKILL and a restart keep the prepared claim (answered again without the API),
//! also with the checkpoint cut short (recovered whole from the claim's record and spec),
//! and Unprepare removes the spec. A restarting kubelet (every slice of the node deleted at
//! once, the registration socket gone) gets the same devices published and a registration
//! again; MIG devices carry their SM and engine capacities; a cut checkpoint is told as an
//! Event on the Node.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use gpu_slicer::testkit::{ApiServer, Fault, Verb};
use gpu_slicer::testkit::{DraPluginConn, KubeletClaim};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceSlice,
};
use kube::Api;
use kube::api::PostParams;

const DRIVER: &str = "gpu-slicer.io";
const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(60);

fn spawn_agent(dir: &Path, config: &Path) -> tokio::process::Child {
    common::dra_command(dir, "sim:mixed-a100", config, NODE)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn reg_socket(dir: &Path) -> PathBuf {
    dir.join("reg").join(format!("{DRIVER}-reg.sock"))
}

/// Register as the plugin watcher does, once the agent has bound its socket.
async fn registered(dir: &Path) -> DraPluginConn {
    common::dra_registered(&reg_socket(dir), WAIT).await
}

/// The device names of our pool once it is one complete slice, and its generation.
fn pool(slices: &[ResourceSlice]) -> Option<(i64, Vec<String>)> {
    let [s] = slices else { return None };
    (s.spec.driver == DRIVER && s.spec.pool.resource_slice_count == 1).then(|| {
        let names = s.spec.devices.iter().flatten().map(|d| d.name.clone());
        (s.spec.pool.generation, names.collect())
    })
}

async fn wait_pool(
    server: &ApiServer,
    what: &str,
    mut check: impl FnMut(i64, &[String]) -> bool,
) -> (i64, Vec<String>) {
    let mut seen = None;
    let ok = server
        .wait_for::<ResourceSlice, _>(WAIT, |all| match pool(all) {
            Some((g, names)) if check(g, &names) => {
                seen = Some((g, names));
                true
            }
            _ => false,
        })
        .await;
    assert!(
        ok,
        "{what}: slices now {:#?}",
        server.list::<ResourceSlice>()
    );
    seen.unwrap_or_default()
}

fn allocation(device: &str) -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(vec![DeviceRequestAllocationResult {
                request: "gpu".into(),
                driver: DRIVER.into(),
                pool: NODE.into(),
                device: device.into(),
                ..Default::default()
            }]),
            config: None,
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn run_dra_publishes_prepares_and_keeps_claims_across_a_restart() {
    let dir = common::short_tempdir();
    let server = ApiServer::start().await.unwrap();
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": NODE, "uid": "5e1f6c2a-0000-4000-8000-00000000000a"}
    }))
    .unwrap();
    server.insert(&node).unwrap();
    std::fs::write(dir.path().join("kubeconfig"), server.kubeconfig(None)).unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "flags: {migStrategy: none}\n").unwrap();
    let mut agent = spawn_agent(dir.path(), &config);

    // The slice appears: whole GPUs only under migStrategy none.
    let (first, whole) = wait_pool(&server, "published", |_, names| !names.is_empty()).await;
    assert!(whole.iter().all(|n| !n.contains("-mig-")), "{whole:?}");
    let owner = server.list::<ResourceSlice>()[0]
        .metadata
        .owner_references
        .clone()
        .unwrap();
    assert_eq!(owner[0].name, NODE);
    // No device-plugin server in DRA mode.
    let dp: Vec<_> = std::fs::read_dir(dir.path().join("dp"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        dp.iter().all(|n| !n.to_string_lossy().ends_with(".sock")),
        "{dp:?}"
    );

    // A config change (the file is watched) changes the slice: MIG devices appear.
    std::fs::write(&config, "flags: {migStrategy: mixed}\n").unwrap();
    let (_, mixed) = wait_pool(&server, "slice after the config change", |g, names| {
        g > first && names.iter().any(|n| n.contains("-mig-"))
    })
    .await;
    let gpu = mixed
        .iter()
        .find(|n| !n.contains("-mig-"))
        .cloned()
        .expect("a whole GPU under mixed");

    // A claim, allocated as the scheduler would, prepared through the kubelet's side.
    let claims: Api<ResourceClaim> = Api::namespaced(server.client().unwrap(), "ml");
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu-slicer.io"}}]}}
    }))
    .unwrap();
    let uid = claims
        .create(&PostParams::default(), &claim)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    server
        .allocate_claim("ml", "train", &allocation(&gpu))
        .unwrap();
    let kc = [KubeletClaim {
        namespace: "ml".into(),
        uid: uid.clone(),
        name: "train".into(),
    }];
    let kubelet = registered(dir.path()).await;
    let answer = kubelet.prepare(&kc, None).await.unwrap();
    let devices = answer[&uid].clone().unwrap();
    let want_id = format!("k8s.{DRIVER}/claim={uid}-{gpu}");
    assert_eq!(devices, [(gpu.clone(), vec![want_id.clone()])]);
    let spec_path = dir
        .path()
        .join("cdi")
        .join(format!("k8s.{DRIVER}-claim_{uid}.json"));
    // The claim's record beside the specs, removed with it at Unprepare.
    let record = dir
        .path()
        .join(format!("cdi/k8s.{DRIVER}-claim-records/{uid}.json"));
    assert!(record.exists());
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    assert_eq!(spec["kind"], format!("k8s.{DRIVER}/claim"));
    assert_eq!(spec["devices"][0]["name"], format!("{uid}-{gpu}"));
    assert!(
        !spec["devices"][0]["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{spec}"
    );

    // SIGKILL, restart: the claim is still prepared (answered from the checkpoint, the API
    // refusing every claim GET meanwhile), and its spec is still there.
    agent.kill().await.unwrap();
    server.inject(Fault::status(Verb::Get, "/resourceclaims/", 500));
    let mut agent = spawn_agent(dir.path(), &config);
    let kubelet = registered(dir.path()).await;
    let again = kubelet.prepare(&kc, None).await.unwrap();
    assert_eq!(again[&uid], Ok(vec![(gpu.clone(), vec![want_id.clone()])]));
    assert!(spec_path.exists());

    // SIGKILL again, the checkpoint cut short: the claim comes back whole from its record
    // and spec (namespace, name, request, pool: the entry as prepared), still without the API.
    // (The checkpoint is a schema-2 envelope, `platform::versioned`: the claims under `data`.)
    let checkpoint = dir.path().join("state/dra-prepared.json");
    let entry = |path: &Path| -> serde_json::Value {
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(path).unwrap()).unwrap()["data"]
            ["claims"][&uid]
            .clone()
    };
    let prepared = entry(&checkpoint);
    assert_eq!(prepared["namespace"], "ml", "{prepared}");
    assert_eq!(prepared["devices"][0]["request"], "gpu", "{prepared}");
    agent.kill().await.unwrap();
    std::fs::write(&checkpoint, "{\"bootId\": ").unwrap();
    let mut agent = spawn_agent(dir.path(), &config);
    let kubelet = registered(dir.path()).await;
    let again = kubelet.prepare(&kc, None).await.unwrap();
    assert_eq!(again[&uid], Ok(vec![(gpu.clone(), vec![want_id])]));
    assert_eq!(
        entry(&checkpoint),
        prepared,
        "recovered and written back as prepared"
    );
    server.clear_faults();

    // Unprepare removes the spec.
    let gone = kubelet.unprepare(&kc).await.unwrap();
    assert_eq!(gone[&uid], "");
    assert!(!spec_path.exists());
    assert!(!record.exists());

    let pid = nix::unistd::Pid::from_raw(i32::try_from(agent.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(WAIT, agent.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!reg_socket(dir.path()).exists());
    server.stop().await;
}

#[tokio::test]
async fn a_restarting_kubelet_wipes_the_slices_and_the_registration_and_both_come_back() {
    let dir = common::short_tempdir();
    let server = ApiServer::start().await.unwrap();
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": NODE, "uid": "5e1f6c2a-0000-4000-8000-00000000000b"}
    }))
    .unwrap();
    server.insert(&node).unwrap();
    std::fs::write(dir.path().join("kubeconfig"), server.kubeconfig(None)).unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "flags: {migStrategy: mixed}\n").unwrap();
    // A checkpoint cut short by a crash: kept aside, and a Warning Event on the Node says so.
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    std::fs::write(dir.path().join("state/dra-prepared.json"), "{\"bootId\": ").unwrap();
    let mut agent = spawn_agent(dir.path(), &config);
    let told = server
        .wait_for::<k8s_openapi::api::core::v1::Event, _>(WAIT, |events| {
            events.iter().any(|e| {
                e.reason.as_deref() == Some("DraCheckpointRecovered")
                    && e.involved_object.name.as_deref() == Some(NODE)
            })
        })
        .await;
    assert!(
        told,
        "{:#?}",
        server.list::<k8s_openapi::api::core::v1::Event>()
    );

    let (_, before) = wait_pool(&server, "published", |_, names| {
        names.iter().any(|n| n.contains("-mig-"))
    })
    .await;
    // The MIG devices carry the profile's SMs and engines end to end (A100-80GB 1g.10gb).
    let slice = serde_json::to_value(&server.list::<ResourceSlice>()[0]).unwrap();
    let mig = slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "gpu-0-mig-1g10gb-19-0")
        .unwrap_or_else(|| panic!("no gpu-0-mig-1g10gb-19-0 in {before:?}"));
    assert_eq!(mig["capacity"]["multiprocessors"]["value"], "14", "{mig}");
    assert_eq!(mig["capacity"]["copyEngines"]["value"], "1", "{mig}");
    registered(dir.path()).await;

    // The kubelet restarts: it deletes every slice of its node at once and, having cleaned
    // its plugin registry, no longer sees our registration socket.
    std::fs::remove_file(reg_socket(dir.path())).unwrap();
    assert_eq!(server.delete_node_slices(NODE), 1);
    let (_, after) = wait_pool(&server, "re-published after the kubelet's wipe", |_, _| {
        true
    })
    .await;
    assert_eq!(after, before);
    let kubelet = registered(dir.path()).await;
    assert_eq!(kubelet.info.name, DRIVER);

    let pid = nix::unistd::Pid::from_raw(i32::try_from(agent.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(WAIT, agent.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    server.stop().await;
}
