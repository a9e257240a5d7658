//! Health figures on the fake `libnvidia-ml` (crates/fake-nvml), node: 8 GPUs × 7 MIG slices.
//!
//! - health event → ListAndWatch frame: an XID is injected into the fake
//!   (`fakeNvmlInjectEvent`), the daemon (in process: `gpu-slicer run` with the NVML backend
//!   and the health monitor, `testkit::Node::run`) turns it into an Unhealthy frame that the kubelet emulator receives over
//!   a real unix socket; timed from injection to the frame. The device recovers after a 10 ms
//!   quiet period before the next event. The fake's wait wakes as soon as an event is
//!   injected (as a driver's does), so the figure is the daemon's path.
//! - NVML discovery time of the 8 × 7 node through nvml-wrapper and the fake.
//! - idle CPU of the built `gpu-slicer run` (utime+stime from /proc/<pid>/stat over 10 s),
//!   with the NVML watcher waiting on the fake, and with the sim backend for comparison.
//!
//! Run: `cargo bench --bench health` (`BENCH_QUICK=1` for fewer iterations and a 3 s idle window).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use gpu_slicer::bench;
use gpu_slicer::testkit::{
    DeviceInfo, KubeletEmulator, Node, PrivateFake, fake_driver_root, fake_lib, write_mig_minors,
};

const GPUS: u32 = 8;
const SLICES: u32 = 7;
const CONFIG: &str = "flags: {migStrategy: mixed}\n";
const RESOURCE: &str = "nvidia.com/mig-1g.10gb";

use gpu_slicer::testkit::percentile as pct;

fn report(name: &str, v: &[Duration], target: &str) {
    println!(
        "{name:<44} n={:<5} p50={:>9.1?} p99={:>9.1?} max={:>9.1?}  (target {target})",
        v.len(),
        pct(v, 0.5),
        pct(v, 0.99),
        pct(v, 1.0),
    );
    // Collected by hack/bench.sh into its figure table.
    println!(
        "FIGURE|{name}|p50 {:.1?} / p99 {:.1?}",
        pct(v, 0.5),
        pct(v, 0.99)
    );
}

/// 8 × A100-80GB, each split into 7 × 1g.10gb (GPU instances 7..13 as the driver places them).
fn node_yaml() -> String {
    let mut s = String::from("name: bench-8x7\ngpus:\n");
    for g in 0..GPUS {
        s += &format!(
            "  - index: {g}\n    uuid: GPU-00000000-0000-4000-8000-0000000000{g:02x}\n    product: NVIDIA A100-SXM4-80GB\n    pciBusId: \"00000000:{:02X}:00.0\"\n    numaNode: {}\n    mig:\n      enabled: true\n      devices:\n",
            0x10 + g * 8,
            g / 4
        );
        for gi in 7..7 + SLICES {
            s += &format!(
                "        - {{uuid: MIG-00000000-0000-4000-8000-0000000{g:02x}{gi:03x}, profile: 1g.10gb, gpuInstanceId: {gi}}}\n"
            );
        }
    }
    s
}

/// A private copy of the fake (own inode, own state) serving `node`, with the MIG minors of
/// its GPUs under `<dir>/proc`; kept loaded so the configuration survives until NVML opens it.
struct Fake {
    lib: PrivateFake,
    proc_root: PathBuf,
}

impl Fake {
    fn new(dir: &Path, node: &str) -> Self {
        std::fs::create_dir_all(dir).expect("mkdir");
        let lib = PrivateFake::new(dir);
        lib.set_node(node);
        let minors: Vec<u32> = (0..GPUS).collect();
        let proc_root = write_mig_minors(&dir.join("proc"), &minors);
        Self { lib, proc_root }
    }
}

fn discovery(fake: &Fake, runs: usize) -> Vec<Duration> {
    let mut discover = bench::nvml_discovery(&fake.lib.path, &fake.proc_root, None);
    (0..runs)
        .map(|_| {
            let (d, (_, migs, _)) = discover();
            assert_eq!(migs, (GPUS * SLICES) as usize);
            d
        })
        .collect()
}

async fn latency(fake: &Fake, events: usize) -> Vec<Duration> {
    let dir = gpu_slicer::testkit::temp_dir();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, CONFIG).expect("config");
    // A host driver for the spec's driver edits (NVML nodes always carry it).
    let driver_root = fake_driver_root(dir.path(), "570.124.06");
    let arg = |p: &Path| p.to_str().expect("UTF-8 path").to_string();
    let node = Node::run(&[
        "--backend",
        "nvml",
        "--nvml-lib",
        &arg(&fake.lib.path),
        "--proc-root",
        &arg(&fake.proc_root),
        "--health-quiet-period",
        "10ms",
        "--container-driver-root",
        &arg(&driver_root),
        "--config",
        &arg(&config),
        "--no-config-watch",
    ])
    .await
    .expect("daemon registered");
    let mut frames = node.emulator.devices(RESOURCE).expect("frames");
    let down = |f: &Vec<DeviceInfo>| f.iter().filter(|d| !d.healthy).count();
    let mut out = Vec::with_capacity(events);
    // Let the watcher register before the first event (events before registration are lost).
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..events {
        let gpu = i as u32 % GPUS;
        let t = Instant::now();
        fake.lib
            .inject(&format!(r#"{{"gpu":{gpu},"kind":"xid","xid":79}}"#));
        tokio::time::timeout(
            Duration::from_secs(10),
            frames.wait_for(|f| down(f) == SLICES as usize),
        )
        .await
        .expect("unhealthy frame")
        .expect("emulator alive");
        out.push(t.elapsed());
        tokio::time::timeout(Duration::from_secs(10), frames.wait_for(|f| down(f) == 0))
            .await
            .expect("recovery frame")
            .expect("emulator alive");
    }
    let _ = node.stop().await;
    out
}

fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of `pid` in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of proc(5), counted from the state (field 3).
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

/// Idle CPU of the built binary over `window`, once every resource is registered.
async fn idle_cpu(
    dir: &Path,
    backend: &str,
    args: &[(&str, PathBuf)],
    envs: &[(&str, PathBuf)],
    window: Duration,
) -> String {
    let plugin_dir = dir.join("dp");
    let emulator = KubeletEmulator::start(&plugin_dir).await.expect("emulator");
    let config = dir.join("config.yaml");
    std::fs::write(&config, CONFIG).expect("config");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"));
    cmd.args(["run", "--backend", backend, "--config"])
        .arg(&config)
        .arg("--device-plugin-dir")
        .arg(&plugin_dir)
        .arg("--cdi-dir")
        .arg(dir.join("cdi"))
        // As deployed, HTTP endpoint and ledger on (an ephemeral port; the socket is absent,
        // so the ledger retries every interval).
        .arg("--http-listen=127.0.0.1:0")
        .arg("--labels-file")
        .arg(dir.join("labels"))
        .arg("--pod-resources-socket")
        .arg(dir.join("pod-resources.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for (flag, value) in args {
        cmd.arg(flag).arg(value);
    }
    for (key, value) in envs {
        cmd.env(key, value);
    }
    let mut child = cmd.spawn().expect("spawn");
    let names = vec![RESOURCE.to_string()];
    tokio::time::timeout(Duration::from_secs(20), emulator.wait_registered(&names, 1))
        .await
        .expect("registered");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = child.id().expect("pid");
    let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Threads:"))
                .map(|l| l[8..].trim().to_string())
        })
        .unwrap_or_default();
    let before = cpu_ticks(pid);
    tokio::time::sleep(window).await;
    let ticks = cpu_ticks(pid) - before;
    let _ = child.start_kill();
    let _ = child.wait().await;
    emulator.shutdown().await;
    let secs = ticks as f64 / clk_tck();
    format!(
        "{ticks} ticks = {:.3} s CPU in {:?} = {:.2} % of one core, threads {threads}",
        secs,
        window,
        100.0 * secs / window.as_secs_f64()
    )
}

fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let (events, discoveries, window) = if quick {
        (50, 20, Duration::from_secs(3))
    } else {
        (500, 200, Duration::from_secs(10))
    };
    let dir = tempfile::Builder::new()
        .prefix("gsh")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let node = node_yaml();
    let node_path = dir.path().join("node.yaml");
    std::fs::write(&node_path, &node).expect("node");

    let fake = Fake::new(&dir.path().join("discover"), &node);
    let d = discovery(&fake, discoveries);
    report("NVML discovery, 8 GPUs x 7 MIG (fake)", &d, "none set");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let fake = Fake::new(&dir.path().join("latency"), &node);
    let l = rt.block_on(latency(&fake, events));
    report("XID -> Unhealthy ListAndWatch frame", &l, "<= 10 ms");

    let idle = dir.path().join("idle");
    std::fs::create_dir_all(&idle).expect("mkdir");
    let lib = idle.join("libnvidia-ml.so.1");
    std::fs::copy(fake_lib(), &lib).expect("copy fake");
    let minors: Vec<u32> = (0..GPUS).collect();
    write_mig_minors(&idle.join("proc"), &minors);
    let nvml = rt.block_on(idle_cpu(
        &idle.join("n"),
        "nvml",
        &[
            ("--nvml-lib", lib),
            ("--proc-root", idle.join("proc")),
            (
                "--container-driver-root",
                fake_driver_root(&idle, "570.124.06"),
            ),
        ],
        &[("FAKE_NVML_NODE", node_path.clone())],
        window,
    ));
    println!("idle run --backend nvml (fake, watcher on):   {nvml}");
    println!("FIGURE|idle run CPU, --backend nvml (fake, watcher on)|{nvml}");
    let sim = rt.block_on(idle_cpu(
        &dir.path().join("idle-sim"),
        &format!("sim:{}", node_path.display()),
        &[],
        &[],
        window,
    ));
    println!("idle run --backend sim (same node):           {sim}");
    println!("FIGURE|idle run CPU, --backend sim (same node)|{sim}");
}
