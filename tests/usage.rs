//! Usage end to end: the daemon (sim backend, and the real NVML path over the fake
//! libnvidia-ml) with the kubelet emulator serving PodResources and writing its device-manager
//! checkpoint, `<proc-root>/<pid>/cgroup` files shaped like a kubelet's, and the node file's
//! `usage` section. Checks per-share memory, idle shares, placeable requests, unattributed
//! processes, `promtool check metrics`, `/v1/state` and `gpu-slicer top --once` (and the
//! interactive view in tmux when tmux is installed).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{PrivateFake, launch, short_tempdir, within};
use gpu_slicer::domain::config::{self, Overrides};
use gpu_slicer::platform::nvml::NvmlBackend;
use gpu_slicer::platform::sim::SimBackend;
use gpu_slicer::platform::usage::{CHECKPOINT_FILE, NvmlUsage, SimUsage, UsageSource};
use gpu_slicer::runtime::ledger::LedgerSettings;
use gpu_slicer::runtime::supervisor::RunSettings;
use gpu_slicer::runtime::usage::UsageSettings;
use gpu_slicer::testkit::kubelet::{KubeletEmulator, PodRef, pod_uid};

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

/// Poll `/metrics` until every line in `want` is in it.
async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    common::http(addr, "GET", path).await.1
}

/// Poll `/metrics` until every line in `want` is in it.
async fn metrics_with(addr: std::net::SocketAddr, want: &[String]) -> String {
    within("usage metrics", async {
        loop {
            let body = get(addr, "/metrics").await;
            if want.iter().all(|w| body.contains(w.as_str())) {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
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
    let dir = short_tempdir();
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
            common::fake_driver_root(dir.path(), "570.124.06")
                .display()
                .to_string()
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
        Arc<dyn gpu_slicer::domain::inventory::Backend>,
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
    let h = launch(dir, emulator, settings, backend).await;
    let addr = h.running.http_addr.expect("http");

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
    let scrape = h.dir.path().join("scrape.txt");
    std::fs::write(&scrape, &body).expect("write scrape");
    match std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&scrape).expect("open"))
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => eprintln!(
            "SKIPPED promtool check (not installed: {e}; hack/install-deps.sh installs it)"
        ),
    }

    // /v1/state and top --once show the same node.
    let state: serde_json::Value =
        serde_json::from_str(&get(addr, "/v1/state").await).expect("state JSON");
    assert_eq!(state["gpus"][0]["uuid"], GPU0);
    assert_eq!(state["gpus"][0]["shares"].as_array().map(Vec::len), Some(2));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["top", "--once", "--endpoint", &format!("http://{addr}")])
        .env("NO_COLOR", "1")
        .output()
        .expect("top");
    assert!(
        out.status.success(),
        "top: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let frame = String::from_utf8(out.stdout).expect("utf-8");
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
    if !nvml {
        tmux_view(addr, h.dir.path());
    }
    drop(fake);
    h.stop().await.expect("clean stop");
}

/// The interactive view in a real terminal: tmux runs `top`, the pane is captured.
fn tmux_view(addr: std::net::SocketAddr, dir: &Path) {
    if std::process::Command::new("tmux")
        .arg("-V")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED tmux capture (tmux not installed; hack/install-deps.sh installs it)");
        return;
    }
    let socket = dir.join("tmux.sock");
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .args(args)
            .output()
            .expect("tmux")
    };
    let cmd = format!(
        "{} top --endpoint http://{addr}",
        env!("CARGO_BIN_EXE_gpu-slicer")
    );
    let started = tmux(&[
        "new-session",
        "-d",
        "-x",
        "200",
        "-y",
        "50",
        "-s",
        "top",
        &cmd,
    ]);
    assert!(
        started.status.success(),
        "tmux: {}",
        String::from_utf8_lossy(&started.stderr)
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let pane = loop {
        let cap = tmux(&["capture-pane", "-p", "-t", "top"]);
        let text = String::from_utf8_lossy(&cap.stdout).to_string();
        if text.contains("unattributed processes") {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "top never drew:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    tmux(&["kill-server"]);
    assert!(pane.contains(&format!("GPU 1 {GPU1}")), "{pane}");
    // The screen was cleared: the frame starts at the top line.
    assert!(pane.starts_with("gpu-slicer top:"), "{pane}");
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
    let dir = short_tempdir();
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
    let h = launch(dir, emulator, settings, Arc::new(sim)).await;
    // The first round runs at once.
    let mut rx = h.running.usage.clone().expect("sampling on");
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
    let over_sim = gpu_slicer::platform::usage::sample_from_spec(&spec);
    assert_eq!(over_nvml, over_sim);
    use gpu_slicer::domain::usage::DeviceKind;
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

/// `top` against nothing: exit 1 naming the URL; a bad `--endpoint`: exit 2 naming the flag.
#[test]
fn top_errors_name_the_endpoint() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["top", "--once", "--endpoint", &format!("http://{addr}")])
        .output()
        .expect("top");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("http://{addr}/v1/state")), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["top", "--once", "--endpoint", "https://node:9400"])
        .output()
        .expect("top");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("`--endpoint` = `https://node:9400`"), "{err}");
}

/// DRA mode: a claim prepared through the kubelet's DRA side and held by a container
/// (PodResources `dynamic_resources`) is attributed to that pod like a device-plugin
/// allocation: every replica of its GPU in the metrics, the whole GPU's memory granted to the
/// pod, the GPU no longer placeable, `/v1/state` and `top` naming the pod; and no drift,
/// though the kubelet lists no device-plugin device as allocatable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_claims_are_attributed_to_the_pods_that_hold_them() {
    use gpu_slicer::runtime::dra::{DraModeSettings, DraSettings};
    use gpu_slicer::testkit::kubelet::dra::{Claims, KubeletClaim, register};
    use gpu_slicer::testkit::kubelet::{ClaimDevice, HeldClaim};

    let dir = short_tempdir();
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
    let h = launch(dir, emulator, settings, Arc::new(sim)).await;
    let addr = h.running.http_addr.expect("http");

    let kubelet = within(
        "registration",
        gpu_slicer::testkit::node::wait_until(Duration::from_secs(10), || async {
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
    let prepared = kubelet.prepare(&[claim], None).await.expect("prepare");
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
    let state: serde_json::Value =
        serde_json::from_str(&get(addr, "/v1/state").await).expect("state JSON");
    assert_eq!(state["gpus"][0]["uuid"], GPU0);
    let shares = state["gpus"][0]["shares"].to_string();
    assert!(shares.contains("\"trainer\""), "{shares}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["top", "--once", "--endpoint", &format!("http://{addr}")])
        .env("NO_COLOR", "1")
        .output()
        .expect("top");
    let frame = String::from_utf8_lossy(&out.stdout);
    assert!(frame.contains("ml/trainer/main"), "{frame}");

    // Released (the pod is gone): the series go with it.
    h.emulator.release("ml", "trainer");
    metrics_with(
        addr,
        &["gpu_slicer_allocated_devices{resource=\"nvidia.com/gpu\"} 0".to_string()],
    )
    .await;
    h.stop().await.expect("clean stop");
}
