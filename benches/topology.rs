//! Benchmark: topology-aware placement and topology discovery.
//!
//! `cargo bench --bench topology` prints
//! - the in-process GetPreferredAllocation cost (the handler's work: view lookup and
//!   placement, `bench::Served::preferred`, with every GPU free, in a rotating kubelet order) on the 8-GPU
//!   bridged-pairs node and the 16-GPU pairs node, for sizes 1, 2, 3, 4 and 8 (targets
//!   ≤ 50 µs at 8 GPUs, ≤ 1 ms at 16);
//! - topology discovery on the fake NVML (`bench::nvml_discovery` with and without the
//!   topology, and its topology call count) for the bridged-pairs, NVSwitch and 16-GPU nodes,
//!   without delay and with `FAKE_NVML_TOPOLOGY_DELAY=1ms` (the 600 ms a real driver may take
//!   per call is that count × 600 ms, paid once at start-up, never per allocation).
//!
//! `BENCH_QUICK=1` runs fewer calls.

use std::path::Path;
use std::time::{Duration, Instant};

use gpu_slicer::bench::{self, Served};
use gpu_slicer::testkit::{PrivateFake, fake_lib};

const RESOURCE: &str = "nvidia.com/gpu";

fn node_file(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("hack/nodes")
        .join(name)
}

/// The benches' one percentile helper.
fn pct(v: &[Duration], p: u32) -> Duration {
    gpu_slicer::testkit::percentile(v, f64::from(p) / 100.0)
}

fn preferred_bench(file: &str, calls: usize) {
    let path = node_file(file);
    let served = Served::new(
        path.to_str().expect("UTF-8 path"),
        "version: v1\n",
        RESOURCE,
    );
    let ids = served.devices();
    let n = ids.len();
    let target = if n <= 8 { "<= 50 µs" } else { "<= 1 ms" };
    for size in [1usize, 2, 3, 4, 8] {
        let mut times = Vec::with_capacity(calls);
        for c in 0..calls {
            // The kubelet sends its free list in random order: rotate it per call.
            let mut order = ids.clone();
            order.rotate_left(c % n);
            let t = Instant::now();
            let got = served.preferred(&order, &[], size);
            times.push(t.elapsed());
            assert_eq!(got.len(), size);
            std::hint::black_box(got);
        }
        let p50 = pct(&times, 50);
        let p99 = pct(&times, 99);
        println!(
            "FIGURE|in-process preferred, {n} GPUs ({file}), size {size}|p50 {p50:.1?} / p99 {p99:.1?} (target {target})"
        );
    }
}

/// Discovery on a private copy of the fake configured by `FAKE_NVML_NODE`, held loaded so
/// its call count survives NVML's open and close.
fn discovery_bench(file: &str, delay: Option<&str>, rounds: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = PrivateFake::new(dir.path());
    // SAFETY: the bench is single-threaded here (no thread reads the environment while it
    // changes); the fake reads these variables on each call.
    unsafe {
        std::env::set_var("FAKE_NVML_NODE", node_file(file));
        std::env::remove_var("FAKE_NVML_TOPOLOGY_COUNTER");
        match delay {
            Some(d) => std::env::set_var("FAKE_NVML_TOPOLOGY_DELAY", d),
            None => std::env::remove_var("FAKE_NVML_TOPOLOGY_DELAY"),
        }
    }
    let mut discover = bench::nvml_discovery(
        &fake.path,
        &dir.path().join("no-proc"),
        Some(&dir.path().join("sys")),
    );
    let mut times = Vec::with_capacity(rounds);
    let mut gpus = 0;
    let before = fake.topology_calls();
    for _ in 0..rounds {
        let (took, (found, _, topology)) = discover();
        times.push(took);
        assert!(topology, "{file}: a topology");
        gpus = found;
    }
    let per_round = (fake.topology_calls() - before) / rounds as u64;
    println!(
        "FIGURE|NVML discovery on the fake, {gpus} GPUs ({file}), topology delay {}|median {:.1?} ({per_round} topology calls, once per discovery; if each took 600 ms: {:.0} s)",
        delay.unwrap_or("0"),
        pct(&times, 50),
        per_round as f64 * 0.6
    );
}

fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let calls = if quick { 500 } else { 5000 };
    preferred_bench("topo-bridged-pairs.yaml", calls);
    preferred_bench("topo-pairs-16.yaml", calls);
    let rounds = if quick { 3 } else { 11 };
    for file in [
        "topo-bridged-pairs.yaml",
        "topo-nvswitch-h100.yaml",
        "topo-pairs-16.yaml",
    ] {
        discovery_bench(file, None, rounds);
    }
    discovery_bench(
        "topo-bridged-pairs.yaml",
        Some("1ms"),
        if quick { 1 } else { 3 },
    );
    // For comparison: the same node without its topology section is plain discovery.
    discovery_bench_without_topology(rounds);
}

/// Discovery of the dgx-h100 node (no `topology` section: every topology call answers
/// NOT_SUPPORTED): the baseline the topology adds to.
fn discovery_bench_without_topology(rounds: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = dir.path().join("libnvidia-ml.so.1");
    std::fs::copy(fake_lib(), &lib).expect("copy fake");
    // SAFETY: single-threaded here, as above.
    unsafe {
        std::env::set_var("FAKE_NVML_NODE", node_file("dgx-h100.yaml"));
        std::env::remove_var("FAKE_NVML_TOPOLOGY_DELAY");
        std::env::remove_var("FAKE_NVML_TOPOLOGY_COUNTER");
    }
    let mut discover = bench::nvml_discovery(
        &lib,
        &dir.path().join("no-proc"),
        Some(&dir.path().join("sys")),
    );
    // Timed around the call, inventory freed included, as this baseline always was.
    let times: Vec<Duration> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(discover());
            t.elapsed()
        })
        .collect();
    println!(
        "FIGURE|NVML discovery on the fake, 8 GPUs (dgx-h100.yaml, no topology section)|median {:.1?}",
        pct(&times, 50)
    );
}
