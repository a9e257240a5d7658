//! Cost of one usage round on the NVML path (fake `libnvidia-ml`, crates/fake-nvml), node:
//! 8 × A100 each split into 7 × 1g.10gb, one process per MIG device (56), each in a pod
//! holding that MIG device (cgroup files shaped like a kubelet's, a device-manager checkpoint,
//! PodResources holders): the NVML sample alone, and the whole round as the sampler runs it
//! (sample, cgroup reads, checkpoint read, attribution, idle window, report, JSON, metrics).
//! Time per round, p50 / p99 over 300 rounds. BENCH_QUICK=1 runs 50.

use std::time::Duration;

use gpu_slicer::bench::Usage;
use gpu_slicer::testkit::percentile;

const GPUS: u32 = 8;
const SLICES: u32 = 7;

fn show(name: &str, mut times: Vec<Duration>) {
    times.sort();
    let (p50, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
    println!("{name}: p50 {p50:?} / p99 {p99:?} (n={})", times.len());
    println!("FIGURE|{name}|p50 {p50:.2?} / p99 {p99:.2?}");
}

fn main() {
    let rounds = if std::env::var_os("BENCH_QUICK").is_some() {
        50
    } else {
        300
    };
    // The plan, one pod per MIG device, their cgroup files, the checkpoint, the holders.
    let mut usage = Usage::new();
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let (took, processes) = usage.sample();
        times.push(took);
        assert_eq!(processes, (GPUS * SLICES) as usize);
    }
    show(
        "usage: NVML sample, 8 GPUs x 7 MIG, 56 processes (fake NVML)",
        times,
    );

    let times: Vec<Duration> = (0..rounds).map(|_| usage.round()).collect();
    show(
        "usage: whole round (sample, 56 cgroup reads, checkpoint, attribution, report, JSON, metrics)",
        times,
    );
}
