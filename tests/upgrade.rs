//! A rolling upgrade of the DaemonSet, file by file: the state the release before versioned
//! state wrote (`tests/fixtures/upgrade/v1`, made by that release) is read by this binary,
//! every held device and prepared claim is still served, and the files are rewritten in this
//! release's schema (a kind, `version: 2` and a SHA-256 of the data, `platform::versioned`).
//! A file from a newer release stops the agent with an error naming it, the file untouched:
//! nothing it holds may be forgotten.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use gpu_slicer::testkit::{ApiServer, KubeletClaim, KubeletEmulator};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};

const SHARES: &str = "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.shared, devices: [3], replicas: 4, isolation: memory}\n";
const WAIT: Duration = Duration::from_secs(60);
/// What the release before held in `dp/state/held.json` (CDI names).
const HELD: [&str; 3] = [
    "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02",
    "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03-share-3",
    "MIG-1b2c3d4e-0000-4a00-8000-000000000007",
];
/// The claims the release before prepared (`dra/`): UID, name, device.
const CLAIMS: [(&str, &str, &str); 2] = [
    ("00000000-0000-4000-8000-000000000003", "one", "gpu-2"),
    ("00000000-0000-4000-8000-000000000004", "two", "gpu-3"),
];

fn fixture(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/upgrade/v1")
        .join(rel)
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn assert_schema_2(file: &Path, kind: &str) {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    assert_eq!(v["version"], 2, "{}: {v}", file.display());
    assert_eq!(v["kind"], kind, "{v}");
    assert!(
        v["checksum"].as_str().unwrap_or("").starts_with("sha256:"),
        "{v}"
    );
}

fn spawn_dp(dir: &Path, config: &Path) -> tokio::process::Child {
    common::run_command(dir, "sim:mixed-a100", config)
        .env("CDI_HOOK_PATH", "/opt/gpu-slicer/bin/gpu-slicer")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn spec(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("cdi/gpu-slicer.io-gpu.yaml")).unwrap_or_default()
}

#[tokio::test]
async fn held_devices_of_the_release_before_stay_in_the_spec_and_the_file_is_rewritten() {
    let dir = common::short_tempdir();
    copy_tree(&fixture("dp"), dir.path());
    let emulator = KubeletEmulator::start(dir.path().join("dp")).await.unwrap();
    let config = dir.path().join("config.yaml");
    // The new release starts with a plan that no longer serves any of the held devices'
    // resources but one: only the checkpoint keeps the others in the spec.
    std::fs::write(&config, "version: v1\nflags: {migStrategy: none}\n").unwrap();
    let mut agent = spawn_dp(dir.path(), &config);
    within_registered(&emulator, 1).await;
    let have = spec(dir.path());
    for name in HELD {
        assert!(
            have.contains(&format!("name: {name}")),
            "{name} lost:\n{have}"
        );
    }
    let held = dir.path().join("state/held.json");
    assert_schema_2(&held, "gpu-slicer.io/held-devices");
    // The rewritten file is read by the next start as well (SIGKILL, restart).
    agent.kill().await.unwrap();
    let mut agent = spawn_dp(dir.path(), &config);
    within_registered(&emulator, 2).await;
    let have = spec(dir.path());
    for name in HELD {
        assert!(
            have.contains(&format!("name: {name}")),
            "{name} lost after the second start:\n{have}"
        );
    }
    agent.kill().await.unwrap();
    emulator.shutdown().await;
}

async fn within_registered(emulator: &KubeletEmulator, count: u64) {
    common::within(
        "registration",
        emulator.wait_registered(&["nvidia.com/gpu".to_string()], count),
    )
    .await;
}

#[tokio::test]
async fn a_checkpoint_from_a_newer_release_stops_the_agent_and_stays_as_it_was() {
    let dir = common::short_tempdir();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let newer = "{\"kind\": \"gpu-slicer.io/held-devices\", \"version\": 3, \"checksum\": \"x\", \"data\": {}}\n";
    std::fs::write(state.join("held.json"), newer).unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, SHARES).unwrap();
    let out = common::run_command(dir.path(), "sim:mixed-a100", &config)
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&*state.join("held.json").to_string_lossy())
            && err.contains("schema version 3 was written by a newer gpu-slicer"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(state.join("held.json")).unwrap(),
        newer
    );
    assert!(spec(dir.path()).is_empty(), "a spec was written anyway");

    // The DRA checkpoint likewise: not kept aside as if damaged, the agent does not start.
    let newer = newer.replace("held-devices", "dra-prepared-claims");
    std::fs::remove_file(state.join("held.json")).unwrap();
    std::fs::write(state.join("dra-prepared.json"), &newer).unwrap();
    let server = ApiServer::start().await.unwrap();
    std::fs::write(dir.path().join("kubeconfig"), server.kubeconfig(None)).unwrap();
    let out = common::dra_command(dir.path(), "sim:mixed-a100", &config, "node-a")
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("schema version 3 was written by a newer gpu-slicer"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(state.join("dra-prepared.json")).unwrap(),
        newer
    );
    let aside = std::fs::read_dir(&state).unwrap().count();
    assert_eq!(aside, 1, "nothing kept aside or added");
}

#[tokio::test]
async fn claims_prepared_by_the_release_before_are_still_prepared_and_held() {
    let dir = common::short_tempdir();
    copy_tree(&fixture("dra"), dir.path());
    // The boot the release before prepared them in (a reboot would void them).
    let boot = dir.path().join("proc/sys/kernel/random");
    std::fs::create_dir_all(&boot).unwrap();
    std::fs::write(boot.join("boot_id"), "fixture-boot-1\n").unwrap();
    let server = ApiServer::start().await.unwrap();
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-a", "uid": "5e1f6c2a-0000-4000-8000-00000000000a"}
    }))
    .unwrap();
    server.insert(&node).unwrap();
    std::fs::write(dir.path().join("kubeconfig"), server.kubeconfig(None)).unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "flags: {migStrategy: mixed}\n").unwrap();
    let mut agent = common::dra_command(dir.path(), "sim:mixed-a100", &config, "node-a")
        .env("PROC_ROOT", dir.path().join("proc"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let reg = dir.path().join("reg/gpu-slicer.io-reg.sock");
    let kubelet = common::dra_registered(&reg, WAIT).await;
    let checkpoint = dir.path().join("state/dra-prepared.json");
    assert_schema_2(&checkpoint, "gpu-slicer.io/dra-prepared-claims");

    // The kubelet asks again (as after its own restart): the same devices, the same CDI IDs.
    let kc = |uid: &str, name: &str| KubeletClaim {
        namespace: "upgrade".into(),
        uid: uid.into(),
        name: name.into(),
    };
    for (uid, name, device) in CLAIMS {
        let answer = kubelet.prepare(&[kc(uid, name)], None).await.unwrap();
        let want = format!("k8s.gpu-slicer.io/claim={uid}-{device}");
        assert_eq!(
            answer[uid],
            Ok(vec![(device.to_string(), vec![want])]),
            "{name}"
        );
    }
    // Held: a new claim the (mistaken) scheduler gives gpu-2 is refused.
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "late", "namespace": "upgrade"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu-slicer.io"}}]}}
    }))
    .unwrap();
    // Its own UID: the emulator numbers UIDs from 1, as it did when the fixture was made.
    let late_uid = "1a7e0000-0000-4000-8000-000000000001".to_string();
    let mut claim = claim;
    claim.metadata.uid = Some(late_uid.clone());
    let allocation = AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(vec![DeviceRequestAllocationResult {
                request: "gpu".into(),
                driver: "gpu-slicer.io".into(),
                pool: "node-a".into(),
                device: "gpu-2".into(),
                ..Default::default()
            }]),
            config: None,
        }),
        ..Default::default()
    };
    claim.status = Some(ResourceClaimStatus {
        allocation: Some(allocation),
        ..Default::default()
    });
    server.insert(&claim).unwrap();
    let refused = kubelet
        .prepare(&[kc(&late_uid, "late")], None)
        .await
        .unwrap();
    let reason = refused[&late_uid].clone().unwrap_err();
    assert!(reason.contains("already prepared"), "{reason}");
    // Unprepare still removes what the release before wrote.
    let (uid, name, _) = CLAIMS[0];
    let done = kubelet.unprepare(&[kc(uid, name)]).await.unwrap();
    assert_eq!(done[uid], "", "{done:?}");
    let spec = dir
        .path()
        .join(format!("cdi/k8s.gpu-slicer.io-claim_{uid}.json"));
    assert!(!spec.exists());
    agent.kill().await.unwrap();
}
