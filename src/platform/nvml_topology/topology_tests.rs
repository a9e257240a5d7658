//! Topology end to end over the fake NVML: the daemon reads the GPU-pair topology once at
//! start-up and never on the allocation path. With `FAKE_NVML_TOPOLOGY_DELAY=600ms` (about
//! what a real driver takes per NVLink pair query), GetPreferredAllocation and Allocate rounds
//! make no topology call at all: the fake's call counter says so (no timing is asserted).
//!
//! The delay is an environment variable the fake reads per call; it cannot be set in-process
//! safely, so the test re-runs this binary with it, executing only `delayed_child`.

use std::sync::Arc;

use crate::domain::config::{self, Overrides};
use crate::platform::nvml::NvmlBackend;
use crate::runtime::supervisor::RunSettings;
use crate::testkit::kubelet::KubeletEmulator;
use crate::testkit::{Node, PrivateFake, fake_driver_root, rerun_alone, temp_dir, within};

/// Set in the child process spawned by the parent test.
const CHILD_ENV: &str = "GPU_SLICER_TOPOLOGY_CHILD";

/// Three PCIe GPUs: 0 and 1 behind one switch (PIX), 2 on the other socket.
const NODE: &str = r#"
name: topo-delay
gpus:
  - {index: 0, uuid: GPU-00000000-0000-4000-8000-0000000000c0, product: NVIDIA L40S, memoryMiB: 46068, pciBusId: "0000:10:00.0", numaNode: 0}
  - {index: 1, uuid: GPU-00000000-0000-4000-8000-0000000000c1, product: NVIDIA L40S, memoryMiB: 46068, pciBusId: "0000:18:00.0", numaNode: 0}
  - {index: 2, uuid: GPU-00000000-0000-4000-8000-0000000000c2, product: NVIDIA L40S, memoryMiB: 46068, pciBusId: "0000:90:00.0", numaNode: 1}
topology:
  matrix:
    - "X   PIX SYS"
    - "PIX X   SYS"
    - "SYS SYS X"
"#;

#[test]
fn allocation_rounds_make_no_topology_call_with_a_slow_driver() {
    rerun_alone(
        "platform::nvml_topology::topology_tests::delayed_child",
        |c| {
            c.env(CHILD_ENV, "1")
                .env("FAKE_NVML_TOPOLOGY_DELAY", "600ms");
        },
    );
}

/// Child half (a no-op unless spawned by the test above).
#[test]
fn delayed_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(delayed_round());
}

async fn delayed_round() {
    let dir = temp_dir();
    let fake = PrivateFake::new(dir.path());
    fake.set_node(NODE);
    let emulator = KubeletEmulator::start(dir.path().join("dp"))
        .await
        .expect("emulator");
    let overrides = Overrides {
        container_driver_root: Some(
            fake_driver_root(dir.path(), "570.124.06")
                .display()
                .to_string()
                .into(),
        ),
        ..Overrides::default()
    };
    let config = config::parse("version: v1\n", "test.yaml", &overrides).expect("config");
    let settings = RunSettings::new(config, dir.path().join("dp"), dir.path().join("cdi"));
    let backend = Arc::new(
        NvmlBackend::new(Some(fake.path.clone()), dir.path().join("no-proc"))
            .with_sys_root(dir.path().join("sys")),
    );
    let h = Node::launch(dir, emulator, settings, backend)
        .await
        .expect("daemon started");
    let at_start = fake.topology_calls();
    // 3·2 common-ancestor calls and one link-state call per GPU (PCIe boards: NOT_SUPPORTED
    // on link 0 ends the walk).
    assert_eq!(at_start, 9, "the topology is read at start-up");

    let resource = "nvidia.com/gpu";
    let mut rx = h.emulator.devices(resource).expect("listed");
    let listed = within("3 GPUs listed", rx.wait_for(|d| d.len() == 3))
        .await
        .expect("emulator alive")
        .clone();
    let ids: Vec<String> = listed.iter().map(|d| d.id.clone()).collect();
    let on_socket_1: Vec<String> = listed
        .iter()
        .filter(|d| !d.id.ends_with("c2"))
        .map(|d| d.id.clone())
        .collect();
    for order in [ids.clone(), ids.iter().rev().cloned().collect()] {
        let mut got = h
            .emulator
            .preferred(resource, &order, &[], 2)
            .await
            .expect("preferred");
        got.sort();
        let mut want = on_socket_1.clone();
        want.sort();
        assert_eq!(got, want, "the PIX pair, whatever the kubelet's order");
    }
    let alloc = h.emulator.allocate(resource, 2).await.expect("allocate");
    assert_eq!(alloc.device_ids.len(), 2);
    assert_eq!(
        fake.topology_calls(),
        at_start,
        "no topology call after start-up"
    );
    h.stop().await.expect("clean stop");
}
