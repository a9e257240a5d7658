//! Device plugin benchmarks over real unix sockets with the kubelet emulator, on the
//! built-in `dgx-h100` node with 64 replicas per GPU (512 devices in one resource):
//! Allocate and GetPreferredAllocation latency, kubelet restart → re-registered, and
//! start → every resource registered. Prints medians and percentiles.
//!
//! Run: `cargo bench --bench plugin` (`BENCH_QUICK=1` for fewer iterations).

use std::path::Path;
use std::time::{Duration, Instant};

use gpu_slicer::bench::Served;
use gpu_slicer::testkit::Node;

const CONFIG: &str =
    "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 64}\n";
const RESOURCE: &str = "nvidia.com/gpu";

struct Stats(Vec<Duration>);

impl Stats {
    fn pct(&self, q: f64) -> Duration {
        gpu_slicer::testkit::percentile(&self.0, q)
    }

    fn report(&self, name: &str, target: &str) {
        println!(
            "{name:<44} n={:<5} p50={:>9.1?} p90={:>9.1?} p99={:>9.1?} max={:>9.1?}  (target {target})",
            self.0.len(),
            self.pct(0.5),
            self.pct(0.9),
            self.pct(0.99),
            self.pct(1.0),
        );
        // Collected by hack/bench.sh into its figure table.
        println!(
            "FIGURE|{}|p50 {:.1?} / p99 {:.1?}",
            name.trim(),
            self.pct(0.5),
            self.pct(0.99)
        );
    }
}

/// `gpu-slicer run` on `dgx-h100` with the config file `config` (not watched).
async fn start_node(config: &Path) -> Node {
    let config = config.to_str().expect("UTF-8 path");
    Node::run(&[
        "--backend",
        "sim:dgx-h100",
        "--config",
        config,
        "--no-config-watch",
    ])
    .await
    .expect("daemon registered")
}

async fn stop_node(node: Node) {
    let _ = node.stop().await;
}

/// Domain-only cost of Allocate and GetPreferredAllocation (no gRPC).
fn core_costs(devices: &[String], calls: usize) -> (Vec<Duration>, Vec<Duration>) {
    let served = Served::new("dgx-h100", CONFIG, RESOURCE);
    let mut a = Vec::with_capacity(calls);
    let mut p = Vec::with_capacity(calls);
    for i in 0..calls {
        let base = (i % 8) * 64;
        let ids = vec![devices[base..base + 4].to_vec()];
        // The Allocate handler's own work: one snapshot, the answer (every rule, with device
        // specs), record what is held (the checkpoint write only happens when the held set
        // grows, i.e. once per device here).
        let t = Instant::now();
        let held = served.allocate(&ids);
        a.push(t.elapsed());
        std::hint::black_box(held);
        let t = Instant::now();
        let got = served.preferred(devices, &[], 4);
        p.push(t.elapsed());
        std::hint::black_box(got);
    }
    (a, p)
}

fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let (starts, calls, restarts) = if quick { (5, 300, 10) } else { (30, 5000, 100) };
    // BENCH_RUNTIME=current: one thread for emulator and daemon (no cross-thread wakeups);
    // default: the multi-threaded runtime the daemon uses.
    let current = std::env::var("BENCH_RUNTIME").is_ok_and(|v| v == "current");
    let rt = if current {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    }
    .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, CONFIG).expect("config");
    rt.block_on(async {
        println!(
            "gpu-slicer plugin bench: dgx-h100, 8 GPUs x 64 replicas = 512 devices of {RESOURCE}; {} runtime",
            if current { "current-thread" } else { "multi-thread" }
        );
        // Start → all registered.
        let mut start_times = Vec::new();
        for _ in 0..starts {
            let node = start_node(&config).await;
            start_times.push(node.started);
            stop_node(node).await;
        }
        let node = start_node(&config).await;
        let devices: Vec<String> = node
            .emulator
            .devices(RESOURCE)
            .expect("devices")
            .borrow()
            .iter()
            .map(|d| d.id.clone())
            .collect();
        assert_eq!(devices.len(), 512);
        // Warm the connection.
        for id in devices.iter().take(50) {
            node.emulator
                .allocate_ids(RESOURCE, std::slice::from_ref(id))
                .await
                .expect("allocate");
        }
        let mut alloc = Vec::with_capacity(calls);
        for i in 0..calls {
            let ids = [devices[i % devices.len()].clone()];
            let t = Instant::now();
            node.emulator
                .allocate_ids(RESOURCE, &ids)
                .await
                .expect("allocate");
            alloc.push(t.elapsed());
        }
        let mut alloc4 = Vec::with_capacity(calls);
        for i in 0..calls {
            // Four replicas of one GPU (IDs sorted: 64 per GPU).
            let base = (i % 8) * 64;
            let ids: Vec<String> = devices[base..base + 4].to_vec();
            let t = Instant::now();
            node.emulator
                .allocate_ids(RESOURCE, &ids)
                .await
                .expect("allocate");
            alloc4.push(t.elapsed());
        }
        let mut pref = Vec::with_capacity(calls);
        for _ in 0..calls {
            let t = Instant::now();
            let got = node
                .emulator
                .preferred(RESOURCE, &devices, &[], 4)
                .await
                .expect("preferred");
            pref.push(t.elapsed());
            assert_eq!(got.len(), 4);
        }
        // The same work without the transport, to show where the time goes.
        let (core_alloc, core_pref) = core_costs(&devices, calls);
        // Kubelet restart → re-registered.
        let names = vec![RESOURCE.to_string()];
        let mut restart_total = Vec::new();
        let mut after_socket = Vec::new();
        for round in 2..restarts + 2 {
            let t = Instant::now();
            node.emulator.restart().await.expect("restart");
            let t_sock = Instant::now();
            tokio::time::timeout(
                Duration::from_secs(10),
                node.emulator.wait_registered(&names, round as u64),
            )
            .await
            .expect("re-registered");
            restart_total.push(t.elapsed());
            after_socket.push(t_sock.elapsed());
        }
        stop_node(node).await;
        println!();
        Stats(alloc).report("Allocate (1 replica)", "p99 <= 200us");
        Stats(alloc4).report("Allocate (4 replicas of one GPU)", "p99 <= 200us");
        Stats(pref).report("GetPreferredAllocation (4 of 512)", "p99 <= 1ms");
        Stats(core_alloc).report("  in-process Allocate handler (4 replicas)", "<= 10 µs");
        Stats(core_pref).report("  in-process preferred (4 of 512)", "<= 50 µs");
        Stats(after_socket).report("kubelet.sock recreated -> re-registered", "<= 50ms");
        Stats(restart_total).report(
            "kubelet restart (stop+delete+recreate) -> re-reg",
            "<= 50ms",
        );
        Stats(start_times).report("start -> all resources registered", "<= 50ms");
    });
}
