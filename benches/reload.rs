//! Live reconfiguration benchmark over real unix sockets with the kubelet emulator, on the
//! built-in `dgx-h100` node: rewrite the watched config file (time-slicing replicas 64 ↔ 32,
//! 512 ↔ 256 devices) and time until the emulator holds the new ListAndWatch device list.
//! The figure includes the trigger's settle delay (`gpu_slicer::testkit::Node::RELOAD_SETTLE`), which is
//! printed alongside so the reload's own cost can be read off.
//!
//! Run: `cargo bench --bench reload` (`BENCH_QUICK=1` for fewer iterations).

use std::time::{Duration, Instant};

use gpu_slicer::testkit::Node;

const SETTLE: Duration = Node::RELOAD_SETTLE;

fn config(replicas: u32) -> String {
    format!(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {{name: nvidia.com/gpu, replicas: {replicas}}}\n"
    )
}

use gpu_slicer::testkit::percentile as pct;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds = if std::env::var_os("BENCH_QUICK").is_some() {
        6
    } else {
        30
    };
    let dir = gpu_slicer::testkit::temp_dir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, config(64)).expect("write");
    let node = Node::run(&[
        "--backend",
        "sim:dgx-h100",
        "--config",
        file.to_str().expect("UTF-8 path"),
    ])
    .await
    .expect("daemon registered");
    let mut devices = node.emulator.devices("nvidia.com/gpu").expect("devices");
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let replicas = if i % 2 == 0 { 32 } else { 64 };
        let want = 8 * replicas as usize;
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, config(replicas)).expect("write");
        let t = Instant::now();
        std::fs::rename(&tmp, &file).expect("rename");
        tokio::time::timeout(
            Duration::from_secs(10),
            devices.wait_for(|d| d.len() == want),
        )
        .await
        .expect("new list within 10 s")
        .expect("emulator alive");
        samples.push(t.elapsed());
    }
    println!(
        "reload: config rewrite -> new ListAndWatch list (dgx-h100, 512<->256 devices) n={rounds} p50={:.1?} p99={:.1?} max={:.1?}  (includes settle {SETTLE:?}; reload work ~ p50 - settle)",
        pct(&samples, 0.5),
        pct(&samples, 0.99),
        pct(&samples, 1.0),
    );
    // Collected by hack/bench.sh into its figure table.
    println!(
        "FIGURE|reload: config rewrite -> new ListAndWatch list (incl. {SETTLE:?} settle)|p50 {:.1?} / p99 {:.1?}",
        pct(&samples, 0.5),
        pct(&samples, 0.99),
    );
    let _ = node.stop().await;
}
