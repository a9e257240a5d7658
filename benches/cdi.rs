//! Benchmark: CDI spec generation + serialisation for synthetic nodes.
//!
//! `cargo bench --bench cdi` prints, for N GPUs × 7 MIG slices (N = 1 … 64), the median of
//! `RUNS` runs of `cdi::generate` + `Spec::to_bytes` (YAML and JSON) and the time per CDI
//! device, so linear growth shows as a flat per-device column. Then the same for whole GPUs
//! split 48 ways with `isolation: memory+mps`, whose 48 share devices per GPU (by UUID and by
//! index, with the memory hook and MPS edits) dominate the spec.

use std::time::Duration;

use gpu_slicer::bench::{self, Format};

const RUNS: usize = 31;

/// Median wall time of generate + serialise for `gpus` A100s × `migs` slices (or whole GPUs
/// split `replicas` ways with `memory+mps`), and the device count.
fn measure(gpus: u32, migs: u32, replicas: Option<u32>, format: Format) -> (Duration, usize) {
    let mut generate = bench::cdi_spec(gpus, migs, replicas, format);
    let mut times = Vec::with_capacity(RUNS);
    let mut devices = 0;
    for _ in 0..RUNS {
        let (took, n) = generate();
        times.push(took);
        devices = n;
    }
    times.sort();
    (times[times.len() / 2], devices)
}

fn main() {
    println!("cdi generate + serialise, median of {RUNS} runs (N GPUs x 7 MIG slices)");
    println!(
        "{:>5} {:>8} {:>6} {:>12} {:>12}",
        "gpus", "devices", "format", "median", "per device"
    );
    for format in [Format::Yaml, Format::Json] {
        for gpus in [1, 2, 4, 8, 16, 32, 64] {
            let (t, n) = measure(gpus, 7, None, format);
            println!(
                "{gpus:>5} {n:>8} {format:>6} {:>10.1}µs {:>10.2}µs",
                t.as_secs_f64() * 1e6,
                t.as_secs_f64() * 1e6 / n as f64
            );
            if gpus == 8 || gpus == 64 {
                // Collected by hack/bench.sh into its figure table.
                println!(
                    "FIGURE|CDI generate+{format}, {gpus} A100 x 7 MIG ({n} CDI devices)|{:.1}µs",
                    t.as_secs_f64() * 1e6
                );
            }
        }
    }
    println!("with shares: N whole GPUs x 48 replicas, isolation memory+mps");
    for format in [Format::Yaml, Format::Json] {
        for gpus in [1, 8, 64] {
            let (t, n) = measure(gpus, 0, Some(48), format);
            println!(
                "{gpus:>5} {n:>8} {format:>6} {:>10.1}µs {:>10.2}µs",
                t.as_secs_f64() * 1e6,
                t.as_secs_f64() * 1e6 / n as f64
            );
        }
    }
}
