//! The NVML backend over the fake `libnvidia-ml.so` (crates/fake-nvml) must see exactly what
//! the sim backend sees on the same node file; plus the backend's failure paths.
//!
//! Each test copies the fake library to its own path (a new inode is a new instance with its
//! own state, nvml.md §7: a [`PrivateFake`]) and configures it through `fakeNvmlSetNodeJson`
//! before NVML opens it.

use std::ffi::{CString, c_char};
use std::path::{Path, PathBuf};

use crate::domain::inventory::{Backend, InventoryError};
use crate::platform::nvml::NvmlBackend;
use crate::platform::sim::SimBackend;
use crate::testkit::{PrivateFake, fake_lib, rerun_alone, write_mig_minors};

/// A private copy of the fake in a directory of its own, configured with `node` (None: no
/// driver).
struct Fake {
    dir: tempfile::TempDir,
    path: PathBuf,
    // Keeps the instance (and its configuration) loaded until NVML has opened it too.
    copy: PrivateFake,
}

impl Fake {
    fn new(node: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = PrivateFake::new(dir.path());
        if let Some(node) = node {
            fake.set_node(node);
        }
        Self {
            dir,
            path: fake.path.clone(),
            copy: fake,
        }
    }

    /// A backend over this fake, with a generated mig-minors file and an empty sysfs.
    fn backend(&self, gpu_minors: &[u32]) -> NvmlBackend {
        let proc_root = write_mig_minors(&self.dir.path().join("proc"), gpu_minors);
        NvmlBackend::new(Some(self.path.clone()), proc_root)
            .with_sys_root(self.dir.path().join("sys"))
    }
}

fn node_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/nodes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("hack/nodes")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    files
}

#[test]
fn nvml_over_fake_matches_sim_for_every_node_file() {
    for file in node_files() {
        let text = std::fs::read_to_string(&file).expect("read node file");
        // The topology too: the fake answers the topology calls from the same section the
        // sim reads (node files without one have none on both sides).
        let sim = SimBackend::from_file(&file)
            .expect("sim")
            .discover()
            .expect("sim");
        let minors: Vec<u32> = sim.gpus.iter().map(|g| g.minor).collect();
        let fake = Fake::new(Some(&text));
        let mut nvml = fake.backend(&minors).discover().expect("nvml discover");
        assert_eq!(nvml.source, "nvml");
        nvml.source = sim.source.clone();
        assert_eq!(nvml, sim, "{}", file.display());
    }
}

#[test]
fn missing_mig_minors_file_leaves_minors_unknown() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/nodes/mixed-a100.yaml"),
    )
    .expect("read");
    let fake = Fake::new(Some(&text));
    let inv = NvmlBackend::new(Some(fake.path.clone()), fake.dir.path().join("no-proc"))
        .discover()
        .expect("discover");
    let (_, mig) = inv.migs().next().expect("a MIG device");
    assert_eq!((mig.gi_cap_minor, mig.ci_cap_minor), (None, None));
}

#[test]
fn no_driver_is_a_clear_nvml_error() {
    let fake = Fake::new(None);
    let err = fake.backend(&[]).discover().unwrap_err();
    assert!(matches!(err, InventoryError::Nvml { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("libnvidia-ml.so.1"), "{msg}");
    assert!(msg.to_lowercase().contains("driver"), "{msg}");
}

#[test]
fn device_error_names_the_device_and_call() {
    let node = r#"
gpus:
  - index: 0
    uuid: GPU-00000000-0000-0000-0000-000000000000
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "0000:07:00.0"
  - index: 1
    uuid: GPU-00000000-0000-0000-0000-000000000001
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "0000:08:00.0"
    nvmlErrors: {nvmlDeviceGetMinorNumber: 15}
"#;
    let fake = Fake::new(Some(node));
    let err = fake.backend(&[0, 1]).discover().unwrap_err();
    let InventoryError::NvmlDevice {
        call,
        device,
        message,
    } = &err
    else {
        panic!("expected NvmlDevice, got {err:?}");
    };
    assert_eq!(*call, "nvmlDeviceGetMinorNumber");
    assert!(
        device.contains("GPU 1") && device.contains("GPU-00000000-0000-0000-0000-000000000001"),
        "{device}"
    );
    assert!(message.contains("fell off the bus"), "{message}");
}

// ------------------------------------------------------------------ topology

fn hack_node(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("hack/nodes")
            .join(name),
    )
    .expect("read node file")
}

#[test]
fn nvswitch_board_pairs_are_all_nvlink_connected_through_nvml() {
    let fake = Fake::new(Some(&hack_node("topo-nvswitch-h100.yaml")));
    let inv = fake.backend(&[]).discover().expect("discover");
    let t = inv.topology.expect("a topology");
    assert_eq!(t.len(), 8);
    for a in 0..8 {
        for b in (0..8).filter(|&b| b != a) {
            assert_eq!(t.link(a, b).nvlinks, 18, "pair {a}-{b}");
        }
    }
    assert!(fake.copy.topology_calls() > 0);
}

/// Two bridged pairs; GPU 0 reports NV4 to GPU 1, GPU 1 reports NV2 back, and GPU 2's side
/// of its PCIe link to GPU 3 differs from GPU 3's.
const ASYMMETRIC: &str = r#"
gpus:
  - {index: 0, uuid: GPU-00000000-0000-0000-0000-000000000000, product: NVIDIA H100 NVL, memoryMiB: 95830, pciBusId: "0000:10:00.0", numaNode: 0}
  - {index: 1, uuid: GPU-00000000-0000-0000-0000-000000000001, product: NVIDIA H100 NVL, memoryMiB: 95830, pciBusId: "0000:18:00.0", numaNode: 0}
  - {index: 2, uuid: GPU-00000000-0000-0000-0000-000000000002, product: NVIDIA H100 NVL, memoryMiB: 95830, pciBusId: "0000:20:00.0", numaNode: 1}
  - {index: 3, uuid: GPU-00000000-0000-0000-0000-000000000003, product: NVIDIA H100 NVL, memoryMiB: 95830, pciBusId: "0000:28:00.0", numaNode: 1}
topology:
  matrix:
    - "X   NV4 SYS SYS"
    - "NV2 X   SYS SYS"
    - "SYS SYS X   PIX"
    - "SYS SYS PHB X"
"#;

#[test]
fn asymmetric_answers_keep_the_worse_side_and_a_usable_topology() {
    let fake = Fake::new(Some(ASYMMETRIC));
    let inv = fake
        .backend(&[])
        .discover()
        .expect("discover, never an error");
    let t = inv.topology.expect("a topology");
    let cells: Vec<String> = t.matrix.iter().map(|r| r.join(" ")).collect();
    assert_eq!(
        cells,
        [
            "X NV2 SYS SYS",
            "NV2 X SYS SYS",
            "SYS SYS X PHB",
            "SYS SYS PHB X"
        ],
        "the worse answer of each disagreeing pair"
    );
}

#[test]
fn unsupported_topology_calls_give_a_pcie_only_topology() {
    let node = ASYMMETRIC.replace("topology:\n", "topology:\n  unsupported: [nvlink]\n");
    let fake = Fake::new(Some(&node));
    let t = fake
        .backend(&[])
        .discover()
        .expect("discover")
        .topology
        .expect("topology");
    assert!(
        (0..4).all(|a| (0..4).all(|b| t.link(a, b).nvlinks == 0)),
        "no NVLink without the NVLink calls"
    );
    assert_eq!(t.matrix[2][3], "PHB");
    // Neither call: the driver says nothing, so there is no topology at all (as a node file
    // without a `topology` section), and discovery still succeeds.
    let node = ASYMMETRIC.replace(
        "topology:\n",
        "topology:\n  unsupported: [nvlink, commonAncestor]\n",
    );
    let fake = Fake::new(Some(&node));
    let inv = fake.backend(&[]).discover().expect("discover");
    assert_eq!(inv.topology, None);
    assert_eq!(inv.gpus.len(), 4);
}

#[test]
fn fabric_attached_gpus_carry_their_clique_through_nvml() {
    let node = r#"
gpus:
  - {index: 0, uuid: GPU-00000000-0000-0000-0000-000000000000, product: NVIDIA H100 80GB HBM3, pciBusId: "0000:10:00.0",
     fabric: {clusterUuid: 3f1c2a4b-5d6e-4f70-8192-a3b4c5d6e7f8, cliqueId: 32766}}
  - {index: 1, uuid: GPU-00000000-0000-0000-0000-000000000001, product: NVIDIA H100 80GB HBM3, pciBusId: "0000:18:00.0",
     fabric: {clusterUuid: 3f1c2a4b-5d6e-4f70-8192-a3b4c5d6e7f8, cliqueId: 32766, state: inProgress}}
  - {index: 2, uuid: GPU-00000000-0000-0000-0000-000000000002, product: NVIDIA H100 80GB HBM3, pciBusId: "0000:20:00.0"}
"#;
    let fake = Fake::new(Some(node));
    let nvml = fake.backend(&[]).discover().expect("discover");
    let cliques: Vec<Option<&str>> = nvml
        .gpus
        .iter()
        .map(|g| g.fabric_clique.as_deref())
        .collect();
    assert_eq!(
        cliques,
        [
            Some("3f1c2a4b-5d6e-4f70-8192-a3b4c5d6e7f8.32766"),
            None,
            None
        ],
        "only a completed registration attaches"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("node.yaml");
    std::fs::write(&file, node).expect("write");
    let sim = SimBackend::from_file(&file)
        .expect("sim")
        .discover()
        .expect("sim");
    let sim_cliques: Vec<Option<&str>> = sim
        .gpus
        .iter()
        .map(|g| g.fabric_clique.as_deref())
        .collect();
    assert_eq!(sim_cliques, cliques);
}

// ------------------------------------------------------------------ NVML event watcher

use std::time::Duration;

use crate::platform::nvml_events::{HealthEvent, HealthEventKind, NvmlEventWatcher, reprobe};
use tokio::sync::mpsc::UnboundedReceiver;

const EVENT_NODE: &str = r#"
gpus:
  - index: 0
    uuid: GPU-00000000-0000-0000-0000-000000000000
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "0000:07:00.0"
  - index: 1
    uuid: GPU-00000000-0000-0000-0000-000000000001
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "0000:08:00.0"
    mig:
      enabled: true
      devices:
        - {uuid: MIG-00000000-0000-0000-0000-000000000002, profile: 3g.40gb, gpuInstanceId: 2}
events:
  - {gpu: 0, kind: xid, xid: 79, afterMs: 50}
  - {gpu: 1, kind: xid, xid: 94, gpuInstanceId: 2, computeInstanceId: 0, afterMs: 100}
"#;

async fn next(rx: &mut UnboundedReceiver<HealthEvent>) -> HealthEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a health event within 10 s")
        .expect("watcher alive")
}

#[tokio::test]
async fn watcher_delivers_scheduled_xids_with_mig_attribution() {
    let fake = Fake::new(Some(EVENT_NODE));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let path = fake.path.clone();
    let watcher = tokio::task::spawn_blocking(move || {
        NvmlEventWatcher::start(Some(path), Duration::from_millis(200), tx)
    })
    .await
    .expect("join")
    .expect("watcher starts");

    let first = next(&mut rx).await;
    assert_eq!(
        first,
        HealthEvent {
            gpu_uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            gpu_instance_id: None,
            compute_instance_id: None,
            kind: HealthEventKind::Xid(79),
        }
    );
    let second = next(&mut rx).await;
    assert_eq!(
        second,
        HealthEvent {
            gpu_uuid: "GPU-00000000-0000-0000-0000-000000000001".into(),
            gpu_instance_id: Some(2),
            compute_instance_id: Some(0),
            kind: HealthEventKind::Xid(94),
        }
    );
    tokio::task::spawn_blocking(move || watcher.stop())
        .await
        .expect("stop joins");
}

#[tokio::test]
async fn watcher_reports_gpu_loss_and_reprobe_sees_recovery() {
    let node = EVENT_NODE.split("events:").next().expect("node part");
    let fake = Fake::new(Some(node));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let path = fake.path.clone();
    let watcher = tokio::task::spawn_blocking(move || {
        NvmlEventWatcher::start(Some(path), Duration::from_millis(200), tx)
    })
    .await
    .expect("join")
    .expect("watcher starts");
    let gpu1 = "GPU-00000000-0000-0000-0000-000000000001";

    fake.copy.inject(r#"{"gpu":0,"kind":"doubleBitEcc"}"#);
    let ev = next(&mut rx).await;
    assert_eq!(ev.kind, HealthEventKind::DoubleBitEcc);

    fake.copy.inject(r#"{"gpu":1,"kind":"gpuLost"}"#);
    let ev = next(&mut rx).await;
    assert_eq!(
        (ev.gpu_uuid.as_str(), ev.kind),
        (gpu1, HealthEventKind::GpuLost)
    );

    let (lib, u) = (fake.path.clone(), gpu1.to_string());
    let (lost_probe, watcher) = tokio::task::spawn_blocking(move || {
        let r = (reprobe(Some(&lib), &u), watcher.reprobe(&u));
        (r, watcher)
    })
    .await
    .expect("join");
    assert_eq!(lost_probe, (false, false));

    fake.copy.inject(r#"{"gpu":1,"kind":"recover"}"#);
    let u = gpu1.to_string();
    let watcher = tokio::task::spawn_blocking(move || {
        assert!(watcher.reprobe(&u), "GPU answers again after recovery");
        watcher
    })
    .await
    .expect("join");
    tokio::task::spawn_blocking(move || drop(watcher))
        .await
        .expect("drop joins");
}

#[test]
fn watcher_start_fails_clearly_without_driver() {
    let fake = Fake::new(None);
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let err = NvmlEventWatcher::start(Some(fake.path.clone()), Duration::from_millis(100), tx)
        .unwrap_err();
    assert!(err.to_string().contains("libnvidia-ml.so.1"), "{err}");
}

// ------------------------------------------------------------------ memory limits (raw ABI)

#[repr(C)]
struct SetLimits {
    name_space: *const c_char,
    soft: u64,
    hard: u64,
}

#[repr(C)]
struct GetLimits {
    name_space: *const c_char,
    soft: u64,
    hard: u64,
    used: u64,
}

#[test]
fn fake_records_memory_limits_per_cgroup() {
    let fake = Fake::new(Some(EVENT_NODE));
    let cg = CString::new("/sys/fs/cgroup/pod-a").expect("no NUL");
    let other = CString::new("/sys/fs/cgroup/pod-b").expect("no NUL");
    type Dev = *mut std::ffi::c_void;
    // SAFETY: symbols have the nvml.h signatures declared here; every pointer passed lives
    // across its call.
    unsafe {
        let lib = fake.copy.library();
        let init: libloading::Symbol<unsafe extern "C" fn() -> u32> =
            lib.get(b"nvmlInit_v2").expect("init");
        let by_index: libloading::Symbol<unsafe extern "C" fn(u32, *mut Dev) -> u32> =
            lib.get(b"nvmlDeviceGetHandleByIndex_v2").expect("by index");
        let set: libloading::Symbol<unsafe extern "C" fn(Dev, *mut SetLimits) -> u32> =
            lib.get(b"nvmlDeviceSetMemoryLimits_v1").expect("set");
        let get: libloading::Symbol<unsafe extern "C" fn(Dev, *mut GetLimits) -> u32> =
            lib.get(b"nvmlDeviceGetMemoryLimits_v1").expect("get");
        let shutdown: libloading::Symbol<unsafe extern "C" fn() -> u32> =
            lib.get(b"nvmlShutdown").expect("shutdown");
        assert_eq!(init(), 0);
        let mut dev: Dev = std::ptr::null_mut();
        assert_eq!(by_index(0, &mut dev), 0);
        let mut req = SetLimits {
            name_space: cg.as_ptr(),
            soft: 4 << 30,
            hard: 8 << 30,
        };
        assert_eq!(set(dev, &mut req), 0);
        let mut out = GetLimits {
            name_space: cg.as_ptr(),
            soft: 0,
            hard: 0,
            used: 7,
        };
        assert_eq!(get(dev, &mut out), 0);
        assert_eq!((out.soft, out.hard, out.used), (4 << 30, 8 << 30, 0));
        out.name_space = other.as_ptr();
        assert_eq!(
            get(dev, &mut out),
            6,
            "NOT_FOUND for a cgroup without limits"
        );
        assert_eq!(shutdown(), 0);
    }
}

// ------------------------------------------------------------------ env-driven fake (spawned)

/// Set in the child process spawned by `env_configured_fake_serves_node_and_event_file`.
const CHILD_ENV: &str = "GPU_SLICER_NVML_FAKE_CHILD";

/// Parent half: the env vars a spawned `gpu-slicer` would get (`FAKE_NVML_NODE`,
/// `FAKE_NVML_EVENT_FILE`) configure the fake; they cannot be set in-process safely, so the
/// test re-runs this binary with them, executing only `env_child`.
#[test]
fn env_configured_fake_serves_node_and_event_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = dir.path().join("node.yaml");
    std::fs::write(&node, EVENT_NODE.split("events:").next().expect("node")).expect("write");
    rerun_alone("platform::nvml::nvml_fake_tests::env_child", |c| {
        c.env(CHILD_ENV, dir.path())
            .env("FAKE_NVML_NODE", &node)
            .env("FAKE_NVML_EVENT_FILE", dir.path().join("events.jsonl"));
    });
}

/// Child half (a no-op unless spawned by the test above).
#[test]
fn env_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV).map(PathBuf::from) else {
        return;
    };
    let lib = dir.join("libnvidia-ml.so.1");
    std::fs::copy(fake_lib(), &lib).expect("copy fake");
    let inv = NvmlBackend::new(Some(lib.clone()), dir.join("proc"))
        .with_sys_root(dir.join("sys"))
        .discover()
        .expect("discover from FAKE_NVML_NODE");
    assert_eq!(inv.gpus.len(), 2);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher =
        NvmlEventWatcher::start(Some(lib), Duration::from_millis(200), tx).expect("watcher starts");
    // Writers create the file whole: temp file + rename.
    let tmp = dir.join("events.tmp");
    std::fs::write(&tmp, "{\"gpu\":1,\"kind\":\"xid\",\"xid\":48}\n").expect("write");
    std::fs::rename(&tmp, dir.join("events.jsonl")).expect("rename");
    let ev = rt.block_on(next(&mut rx));
    assert_eq!(ev.kind, HealthEventKind::Xid(48));
    assert_eq!(ev.gpu_uuid, "GPU-00000000-0000-0000-0000-000000000001");
    assert!(
        !dir.join("events.jsonl").exists(),
        "the fake consumes the file"
    );
    watcher.stop();
}

/// Every NVML symbol the backend and the watcher call (directly or through nvml-wrapper 0.13),
/// plus the two the wrapper's `Drop`s need. A missing one would only fail at run time.
#[test]
fn fake_exports_every_symbol_the_agent_calls() {
    let fake = Fake::new(None);
    let symbols = [
        "nvmlInit_v2",
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetAttributes_v2",
        "nvmlDeviceGetNumaNodeId",
        "nvmlEventSetCreate",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait_v2",
        "nvmlEventSetFree",
        "nvmlDeviceSetMemoryLimits_v1",
        "nvmlDeviceGetMemoryLimits_v1",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlDeviceGetGpuFabricInfoV",
        "fakeNvmlSetNodeJson",
        "fakeNvmlInjectEvent",
        "fakeNvmlTopologyCalls",
    ];
    let missing: Vec<&str> = symbols
        .iter()
        .copied()
        // SAFETY: only looks the address up; nothing is called.
        .filter(|s| unsafe { fake.copy.library().get::<*const ()>(s.as_bytes()) }.is_err())
        .collect();
    assert!(missing.is_empty(), "missing exports: {missing:?}");
}
