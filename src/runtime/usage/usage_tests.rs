//! Usage end to end: the daemon (sim backend, and the real NVML path over the fake
//! libnvidia-ml) with the kubelet emulator serving PodResources and writing its device-manager
//! checkpoint, `<proc-root>/<pid>/cgroup` files shaped like a kubelet's, and the node file's
//! `usage` section. Checks per-share memory, idle shares, placeable requests, unattributed
//! processes, `promtool check metrics`, `/v1/state` and the frame `gpu-slicer top --once`
//! draws of it (the binary's `top`, in a pipe and in tmux: tests/cli_usage.rs).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::domain::config::{self, Overrides};
use crate::domain::usage::UsageReport;
use crate::platform::nvml::NvmlBackend;
use crate::platform::sim::SimBackend;
use crate::platform::usage::{CHECKPOINT_FILE, NvmlUsage, SimUsage, UsageSource};
use crate::runtime::ledger::LedgerSettings;
use crate::runtime::supervisor::RunSettings;
use crate::runtime::usage::UsageSettings;
use crate::testkit::kubelet::{KubeletEmulator, PodRef, pod_uid};
use crate::testkit::{
    Node, PrivateFake, STEP, fake_driver_root, http, promtool_check, temp_dir, wait_until, within,
};

const GPU0: &str = "GPU-00000000-0000-4000-8000-0000000000a0";
const GPU1: &str = "GPU-00000000-0000-4000-8000-0000000000a1";
const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const CONFIG: &str =
    "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n";

fn node(usage: &str) -> String {
    format!(
        "name: usage-test\ngpus:\n\
         - {{index: 0, uuid: {GPU0}, product: NVIDIA H100 80GB HBM3, pciBusId: \"0000:18:00.0\"}}\n\
         - {{index: 1, uuid: {GPU1}, product: NVIDIA H100 80GB HBM3, pciBusId: \"0000:2a:00.0\"}}\n\
         {usage}"
    )
}

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    http(addr, "GET", path).await.1
}

/// Poll `/metrics` until every line in `want` is in it.
async fn metrics_with(addr: std::net::SocketAddr, want: &[String]) -> String {
    wait_until(STEP, || async {
        let body = get(addr, "/metrics").await;
        want.iter()
            .all(|w| body.contains(w.as_str()))
            .then_some(body)
    })
    .await
    .expect("usage metrics")
}

fn systemd_cgroup(uid: &str) -> String {
    format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope\n",
        uid.replace('-', "_")
    )
}

fn cgroupfs_cgroup(uid: &str) -> String {
    format!(
        "12:memory:/kubepods/besteffort/pod{uid}/{CID}\n11:pids:/kubepods/besteffort/pod{uid}/{CID}\n0::/\n"
    )
}

fn write_cgroup(proc_root: &Path, pid: u32, text: &str) {
    let dir = proc_root.join(pid.to_string());
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("cgroup"), text).expect("cgroup");
}

async fn usage_end_to_end(nvml: bool) {
    let dir = temp_dir();
    let node_path = dir.path().join("node.yaml");
    std::fs::write(&node_path, node("")).expect("node");
    let proc_root = dir.path().join("proc");
    std::fs::create_dir_all(&proc_root).expect("proc");
    let emulator = KubeletEmulator::start(dir.path().join("dp"))
        .await
        .expect("emulator");
    let pr_socket = dir.path().join("pr.sock");
    emulator
        .serve_pod_resources(&pr_socket)
        .expect("podresources");
    // On NVML nodes the spec carries the driver: give it a fake host driver root.
    let overrides = Overrides {
        container_driver_root: nvml.then(|| {
            fake_driver_root(dir.path(), "570.124.06")
                .display()
                .to_string()
                .into()
        }),
        ..Overrides::default()
    };
    let config = config::parse(CONFIG, "test.yaml", &overrides).expect("config");
    let mut settings = RunSettings::new(config, dir.path().join("dp"), dir.path().join("cdi"));
    settings.http_listen = Some("127.0.0.1:0".into());
    settings.ledger = Some(LedgerSettings {
        socket: pr_socket,
        interval: Duration::from_millis(100),
    });
    let fake = nvml.then(|| {
        let f = PrivateFake::new(dir.path());
        f.set_node(&node(""));
        f
    });
    let (backend, source): (
        Arc<dyn crate::domain::inventory::Backend>,
        Box<dyn UsageSource>,
    ) = match &fake {
        Some(f) => (
            Arc::new(
                NvmlBackend::new(Some(f.path.clone()), dir.path().join("no-proc"))
                    .with_sys_root(dir.path().join("sys")),
            ),
            Box::new(NvmlUsage::new(Some(f.path.clone()))),
        ),
        None => {
            let sim = SimBackend::from_file(&node_path).expect("node file");
            let spec = sim.spec().clone();
            (
                Arc::new(sim),
                Box::new(SimUsage::new(spec, Some(node_path.clone()))),
            )
        }
    };
    settings.usage = Some(UsageSettings {
        source,
        interval: Duration::from_millis(100),
        idle_window: Duration::from_millis(300),
        proc_root: proc_root.clone(),
        checkpoint: dir.path().join("dp").join(CHECKPOINT_FILE),
    });
    let h = Node::launch(dir, emulator, settings, backend)
        .await
        .expect("daemon started");
    let addr = h.running.probe().http_addr.expect("http");

    // Before anything is held: the device, capacity and reason families have series (the
    // share families get theirs with the first holder).
    let fresh: Vec<String> = [
        format!("gpu_slicer_device_utilization_ratio{{uuid=\"{GPU1}\"}} 0"),
        format!("gpu_slicer_device_memory_used_bytes{{uuid=\"{GPU1}\",kind=\"gpu\"}} 0"),
        format!("gpu_slicer_device_memory_total_bytes{{uuid=\"{GPU1}\",kind=\"gpu\"}} "),
        "gpu_slicer_idle_shares{resource=\"nvidia.com/gpu\"} 0".into(),
        "gpu_slicer_placeable_requests{resource=\"nvidia.com/gpu\",size=\"4\"} 2".into(),
        "gpu_slicer_unattributed_processes{reason=\"no-cgroup\"} 0".into(),
    ]
    .into();
    metrics_with(addr, &fresh).await;

    // Four single-replica pods: 2 + 2 replicas stay free on the two GPUs.
    let mut held = Vec::new();
    for name in ["a", "b", "c", "d"] {
        let pod = PodRef {
            namespace: "ml".into(),
            name: name.into(),
            container: "main".into(),
        };
        let a = h
            .emulator
            .allocate_for(pod.clone(), "nvidia.com/gpu", 1)
            .await
            .expect("allocate");
        let gpu = a.device_ids[0]
            .split("::")
            .next()
            .expect("uuid")
            .to_string();
        held.push((pod, gpu));
    }
    let on_gpu0: Vec<&PodRef> = held
        .iter()
        .filter(|(_, g)| g == GPU0)
        .map(|(p, _)| p)
        .collect();
    assert_eq!(on_gpu0.len(), 2, "distributed placement: {held:?}");
    let (x, y) = (on_gpu0[0], on_gpu0[1]);
    // Their processes: x under the systemd driver, y under cgroupfs; a host process too.
    write_cgroup(&proc_root, 4242, &systemd_cgroup(&pod_uid(x)));
    write_cgroup(&proc_root, 4343, &cgroupfs_cgroup(&pod_uid(y)));
    write_cgroup(&proc_root, 999, "0::/system.slice/sshd.service\n");
    let usage = format!(
        "usage:\n  devices:\n    {GPU0}:\n      utilizationPercent: 35\n      processes:\n      - {{pid: 4242, memoryMiB: 1024}}\n      - {{pid: 4343, memoryMiB: 3072}}\n      - {{pid: 999, memoryMiB: 16}}\n"
    );
    match &fake {
        Some(f) => f.set_node(&node(&usage)),
        None => std::fs::write(h.dir.path().join("node.yaml"), node(&usage)).expect("node"),
    }

    let share = |p: &PodRef, what: &str, v: u64| {
        format!(
            "gpu_slicer_share_memory_{what}_bytes{{namespace=\"ml\",pod=\"{}\",container=\"main\",resource=\"nvidia.com/gpu\"}} {v}",
            p.name
        )
    };
    let quarter = (81559u64 << 20) / 4;
    let want = vec![
        share(x, "used", 1024 << 20),
        share(y, "used", 3072 << 20),
        share(x, "granted", quarter),
        // The two pods on GPU 1 run nothing: idle after the 300 ms window.
        "gpu_slicer_idle_shares{resource=\"nvidia.com/gpu\"} 2".to_string(),
        "gpu_slicer_placeable_requests{resource=\"nvidia.com/gpu\",size=\"4\"} 0".to_string(),
        "gpu_slicer_placeable_requests{resource=\"nvidia.com/gpu\",size=\"2\"} 2".to_string(),
        "gpu_slicer_placeable_requests{resource=\"nvidia.com/gpu\",size=\"1\"} 4".to_string(),
        "gpu_slicer_unattributed_processes{reason=\"not-a-pod\"} 1".to_string(),
        format!("gpu_slicer_device_utilization_ratio{{uuid=\"{GPU0}\"}} 0.35"),
        format!(
            "gpu_slicer_device_memory_used_bytes{{uuid=\"{GPU0}\",kind=\"gpu\"}} {}",
            4112u64 << 20
        ),
        format!(
            "gpu_slicer_device_memory_total_bytes{{uuid=\"{GPU1}\",kind=\"gpu\"}} {}",
            81559u64 << 20
        ),
    ];
    let body = metrics_with(addr, &want).await;
    promtool_check(&body);

    // /v1/state and top --once (the frame `top` draws of it, off a terminal) show the same
    // node.
    let text = get(addr, "/v1/state").await;
    let state: serde_json::Value = serde_json::from_str(&text).expect("state JSON");
    assert_eq!(state["gpus"][0]["uuid"], GPU0);
    assert_eq!(state["gpus"][0]["shares"].as_array().map(Vec::len), Some(2));
    let report: UsageReport = serde_json::from_str(&text).expect("the report top reads");
    let frame = crate::cli::top::render(&report, false);
    eprintln!("top --once:\n{frame}");
    for line in [
        format!("GPU 0 {GPU0} NVIDIA H100 80GB HBM3  util 35%"),
        format!("ml/{}/main", x.name),
        "1.0 GiB".to_string(),
        "3.0 GiB".to_string(),
        "idle".to_string(),
        "nvidia.com/gpu               1:4 2:2 3:0 4:0  idle shares 2".to_string(),
        "unattributed processes: 1 (not-a-pod 1)".to_string(),
    ] {
        assert!(frame.contains(&line), "{line:?} not in:\n{frame}");
    }
    assert!(
        !frame.contains('\x1b'),
        "no colour off a terminal:\n{frame}"
    );
    drop(fake);
    h.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_daemon_attributes_usage_to_shares() {
    usage_end_to_end(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_nvml_daemon_attributes_usage_to_shares() {
    usage_end_to_end(true).await;
}

/// The sampler sleeps between rounds on a channel: a long interval does not delay the stop.
#[tokio::test]
async fn a_sleeping_sampler_stops_at_once() {
    let dir = temp_dir();
    let emulator = KubeletEmulator::start(dir.path().join("dp"))
        .await
        .expect("emulator");
    let config = config::parse(CONFIG, "test.yaml", &Overrides::default()).expect("config");
    let mut settings = RunSettings::new(config, dir.path().join("dp"), dir.path().join("cdi"));
    let sim = SimBackend::open("dgx-h100").expect("profile");
    settings.usage = Some(UsageSettings {
        source: Box::new(SimUsage::new(sim.spec().clone(), None)),
        interval: Duration::from_secs(3600),
        idle_window: Duration::from_secs(60),
        proc_root: dir.path().join("proc"),
        checkpoint: dir.path().join("dp").join(CHECKPOINT_FILE),
    });
    let h = Node::launch(dir, emulator, settings, Arc::new(sim))
        .await
        .expect("daemon started");
    // The first round runs at once.
    let mut rx = h.running.probe().usage.clone().expect("sampling on");
    within("first round", rx.wait_for(|d| d.report.sampled_at_ms > 0))
        .await
        .expect("sampler alive");
    let started = std::time::Instant::now();
    h.stop().await.expect("clean stop");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "stop took {:?}",
        started.elapsed()
    );
}

/// The NVML usage path over the fake and the sim source agree on a node with MIG GPUs, whole
/// GPUs and processes on both: processes on a GPU in MIG mode are reported on their MIG
/// device, and no utilisation exists there.
#[test]
fn nvml_usage_over_fake_matches_sim_with_mig() {
    let usage = "usage:\n  devices:\n\
        \x20   MIG-1b2c3d4e-0000-4a00-8000-000000000007:\n      memoryUsedMiB: 2048\n      processes: [{pid: 10, memoryMiB: 1024}, {pid: 11, memoryMiB: 512}]\n\
        \x20   MIG-2c3d4e5f-0000-4b00-8000-000000000003: {processes: [{pid: 20, memoryMiB: 300}]}\n\
        \x20   GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02: {utilizationPercent: 50, processes: [{pid: 30, memoryMiB: 4000}]}\n";
    let text = format!(
        "{}{usage}",
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/hack/nodes/mixed-a100.yaml"
        ))
        .expect("node")
    );
    let spec = node_spec::NodeSpec::parse(&text, "mixed-a100 + usage").expect("valid");
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = PrivateFake::new(dir.path());
    fake.set_node(&text);
    let mut nvml = NvmlUsage::new(Some(fake.path.clone()));
    let over_nvml = nvml.sample().expect("nvml sample");
    let over_sim = crate::platform::usage::sample_from_spec(&spec);
    assert_eq!(over_nvml, over_sim);
    use crate::domain::usage::DeviceKind;
    let mig_gpu = &over_nvml.devices[0];
    assert_eq!((mig_gpu.kind, mig_gpu.utilization), (DeviceKind::Gpu, None));
    let mig = over_nvml
        .devices
        .iter()
        .find(|d| d.uuid == "MIG-1b2c3d4e-0000-4a00-8000-000000000007")
        .expect("MIG device");
    assert_eq!((mig.kind, mig.memory_used), (DeviceKind::Mig, 2048 << 20));
    let pids: Vec<(u32, &str)> = over_nvml
        .processes
        .iter()
        .map(|p| (p.pid, p.device.as_str()))
        .collect();
    assert_eq!(
        pids,
        vec![
            (10, "MIG-1b2c3d4e-0000-4a00-8000-000000000007"),
            (11, "MIG-1b2c3d4e-0000-4a00-8000-000000000007"),
            (20, "MIG-2c3d4e5f-0000-4b00-8000-000000000003"),
            (30, "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02"),
        ]
    );
    let whole = over_nvml
        .devices
        .iter()
        .find(|d| d.uuid == "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02")
        .expect("GPU 2");
    assert_eq!(whole.utilization, Some(0.5));
}

/// DRA mode: a claim prepared through the kubelet's DRA side and held by a container
/// (PodResources `dynamic_resources`) is attributed to that pod like a device-plugin
/// allocation: every replica of its GPU in the metrics, the whole GPU's memory granted to the
/// pod, the GPU no longer placeable, `/v1/state` and `top` naming the pod; and no drift,
/// though the kubelet lists no device-plugin device as allocatable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_claims_are_attributed_to_the_pods_that_hold_them() {
    use crate::runtime::dra::{DraModeSettings, DraSettings};
    use crate::testkit::kubelet::dra::{Claims, KubeletClaim, register};
    use crate::testkit::kubelet::{ClaimDevice, HeldClaim};

    let dir = temp_dir();
    let node_path = dir.path().join("node.yaml");
    std::fs::write(&node_path, node("")).expect("node");
    let emulator = KubeletEmulator::start(dir.path().join("dp"))
        .await
        .expect("emulator");
    let pr_socket = dir.path().join("pr.sock");
    emulator
        .serve_pod_resources(&pr_socket)
        .expect("podresources");
    let config = config::parse(CONFIG, "test.yaml", &Overrides::default()).expect("config");
    let mut settings = RunSettings::new(config, dir.path().join("dp"), dir.path().join("cdi"));
    settings.http_listen = Some("127.0.0.1:0".into());
    settings.ledger = Some(LedgerSettings {
        socket: pr_socket,
        interval: Duration::from_millis(100),
    });
    let uid = "00000000-0000-4000-8000-00000000c1a1";
    let claims = Claims::new();
    claims.put(serde_json::json!({
        "metadata": {"namespace": "ml", "name": "train", "uid": uid},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu-slicer.io", "pool": "node-a", "device": "gpu-0"}]}}}}));
    settings.dra = Some(DraModeSettings {
        driver: DraSettings {
            driver: "gpu-slicer.io".into(),
            node: "node-a".into(),
            registry_dir: dir.path().join("reg"),
            plugins_dir: dir.path().join("plugins"),
            cdi_dir: dir.path().join("cdi"),
            state_dir: dir.path().join("state"),
            proc_root: dir.path().join("proc"),
            health_resend: Duration::from_secs(20),
            socket_check: Duration::from_millis(50),
            extras: Default::default(),
        },
        claims,
        publish: None,
    });
    let sim = SimBackend::from_file(&node_path).expect("node file");
    settings.usage = Some(UsageSettings {
        source: Box::new(SimUsage::new(sim.spec().clone(), Some(node_path.clone()))),
        interval: Duration::from_millis(100),
        idle_window: Duration::from_secs(3600),
        proc_root: dir.path().join("proc"),
        checkpoint: dir.path().join("dp").join(CHECKPOINT_FILE),
    });
    let h = Node::launch(dir, emulator, settings, Arc::new(sim))
        .await
        .expect("daemon");
    let addr = h.running.probe().http_addr.expect("http");

    let kubelet = within(
        "registration",
        crate::testkit::node::wait_until(Duration::from_secs(10), || async {
            register(&h.dir.path().join("reg/gpu-slicer.io-reg.sock"))
                .await
                .ok()
        }),
    )
    .await
    .expect("registered");
    let claim = KubeletClaim {
        namespace: "ml".into(),
        uid: uid.into(),
        name: "train".into(),
    };
    let prepared = kubelet
        .prepare(std::slice::from_ref(&claim), None)
        .await
        .expect("prepare");
    let devices = prepared[uid].clone().expect("claim prepared");
    h.emulator.hold_claim(HeldClaim {
        pod: PodRef {
            namespace: "ml".into(),
            name: "trainer".into(),
            container: "main".into(),
        },
        namespace: "ml".into(),
        name: "train".into(),
        devices: devices
            .into_iter()
            .map(|(device, cdi_ids)| ClaimDevice {
                driver: "gpu-slicer.io".into(),
                pool: "node-a".into(),
                device,
                cdi_ids,
            })
            .collect(),
    });

    let mut want: Vec<String> = (0..4)
        .map(|r| format!(
            "gpu_slicer_pod_device_allocation{{namespace=\"ml\",pod=\"trainer\",container=\"main\",resource=\"nvidia.com/gpu\",device=\"{GPU0}::{r}\"}} 1"
        ))
        .collect();
    want.extend([
        format!(
            "gpu_slicer_share_memory_granted_bytes{{namespace=\"ml\",pod=\"trainer\",container=\"main\",resource=\"nvidia.com/gpu\"}} {}",
            81559u64 << 20
        ),
        "gpu_slicer_allocated_devices{resource=\"nvidia.com/gpu\"} 4".into(),
        "gpu_slicer_placeable_requests{resource=\"nvidia.com/gpu\",size=\"4\"} 1".into(),
        "gpu_slicer_ledger_drift_devices 0".into(),
    ]);
    metrics_with(addr, &want).await;
    let text = get(addr, "/v1/state").await;
    let state: serde_json::Value = serde_json::from_str(&text).expect("state JSON");
    assert_eq!(state["gpus"][0]["uuid"], GPU0);
    let shares = state["gpus"][0]["shares"].to_string();
    assert!(shares.contains("\"trainer\""), "{shares}");
    // The prepared claim, beside the usage (the fields above unchanged).
    let dra = &state["dra"]["preparedClaims"];
    assert_eq!(dra.as_array().map(Vec::len), Some(1), "{state}");
    assert_eq!(
        (&dra[0]["uid"], &dra[0]["namespace"], &dra[0]["name"]),
        (
            &serde_json::json!(uid),
            &serde_json::json!("ml"),
            &serde_json::json!("train")
        )
    );
    assert_eq!(dra[0]["devices"][0]["device"], "gpu-0");
    assert_eq!(dra[0]["devices"][0]["request"], "gpu");
    assert_eq!(
        dra[0]["devices"][0]["cdiIds"][0],
        format!("k8s.gpu-slicer.io/claim={uid}-gpu-0")
    );
    assert!(
        dra[0]["preparedAtMs"].as_u64().is_some_and(|t| t > 0),
        "{state}"
    );
    let report: UsageReport = serde_json::from_str(&text).expect("the report top reads");
    let frame = crate::cli::top::render(&report, false);
    assert!(frame.contains("ml/trainer/main"), "{frame}");

    // Released (the pod is gone): the series go with it.
    h.emulator.release("ml", "trainer");
    metrics_with(
        addr,
        &["gpu_slicer_allocated_devices{resource=\"nvidia.com/gpu\"} 0".to_string()],
    )
    .await;
    // Unprepared: the claim leaves /v1/state.
    let done = kubelet.unprepare(&[claim]).await.expect("unprepare");
    assert_eq!(done[uid], "");
    let gone = crate::testkit::node::wait_until(Duration::from_secs(10), || async {
        let state: serde_json::Value = serde_json::from_str(&get(addr, "/v1/state").await).ok()?;
        let claims = state["dra"]["preparedClaims"].as_array()?.len();
        (claims == 0).then_some(())
    })
    .await;
    assert!(gone.is_some(), "{}", get(addr, "/v1/state").await);
    h.stop().await.expect("clean stop");
}
