//! Benchmark: CDI spec generation + serialisation for synthetic nodes.
//!
//! `cargo bench --bench cdi` prints, for N GPUs × 7 MIG slices (N = 1 … 64), the median of
//! `RUNS` runs of `cdi::generate` + `Spec::to_bytes` (YAML and JSON) and the time per CDI
//! device, so linear growth shows as a flat per-device column. Then the same for whole GPUs
//! split 48 ways with `isolation: memory+mps`, whose 48 share devices per GPU (by UUID and by
//! index, with the memory hook and MPS edits) dominate the spec.

use std::hint::black_box;
use std::time::{Duration, Instant};

use gpu_slicer::domain::cdi::{self, Format, GenerateOptions, NoProbe};
use gpu_slicer::domain::inventory::{Gpu, Inventory, MigDevice, MigMode};

const RUNS: usize = 31;

/// A node with `gpus` A100s, each split into `migs` 1g.10gb slices.
pub fn synthetic_inventory(gpus: u32, migs: u32) -> Inventory {
    let gpus = (0..gpus)
        .map(|i| Gpu {
            index: i,
            uuid: format!("GPU-00000000-0000-4000-8000-{i:012x}"),
            product: "NVIDIA A100-SXM4-80GB".into(),
            memory_bytes: 80 << 30,
            minor: i,
            pci_bus_id: format!("0000:{i:02x}:00.0"),
            numa_node: Some(0),
            compute_capability: "8.0".into(),
            mig_mode: MigMode {
                current: migs > 0,
                pending: migs > 0,
            },
            mig_compute_slices: 7,
            fabric_clique: None,
            mig_devices: (0..migs)
                .map(|j| {
                    let gi = 7 + j;
                    MigDevice {
                        uuid: format!("MIG-00000000-0000-4000-8000-{i:06x}{j:06x}"),
                        parent_uuid: format!("GPU-00000000-0000-4000-8000-{i:012x}"),
                        parent_index: i,
                        index: j,
                        profile: "1g.10gb".into(),
                        gpu_instance_id: gi,
                        compute_instance_id: 0,
                        memory_bytes: 10 << 30,
                        compute_slices: 1,
                        gi_cap_minor: Some(node_spec::gi_cap_minor(i, gi)),
                        ci_cap_minor: Some(node_spec::ci_cap_minor(i, gi, 0)),
                    }
                })
                .collect(),
        })
        .collect();
    Inventory {
        source: "bench".into(),
        driver_version: None,
        cuda_driver_version: None,
        gpus,
        topology: None,
    }
}

/// Median wall time of generate + serialise of `inv` with `opts`, and the device count.
fn time_generate(
    inv: &Inventory,
    opts: &GenerateOptions,
    format: Format,
    runs: usize,
) -> (Duration, usize) {
    let mut times = Vec::with_capacity(runs);
    let mut devices = 0;
    for _ in 0..runs {
        let start = Instant::now();
        let spec = match cdi::generate(black_box(inv), opts, &NoProbe) {
            Ok(s) => s,
            Err(e) => panic!("generate: {e}"),
        };
        let bytes = match spec.to_bytes(format) {
            Ok(b) => b,
            Err(e) => panic!("serialise: {e}"),
        };
        black_box(&bytes);
        times.push(start.elapsed());
        devices = spec.devices.len();
    }
    times.sort();
    (times[times.len() / 2], devices)
}

/// Median wall time of generate + serialise for `gpus` × `migs`, and the device count.
pub fn measure(gpus: u32, migs: u32, format: Format, runs: usize) -> (Duration, usize) {
    let inv = synthetic_inventory(gpus, migs);
    let opts = GenerateOptions::new("gpu-slicer.io/gpu");
    time_generate(&inv, &opts, format, runs)
}

/// As [`measure`] for `gpus` whole GPUs each split `replicas` ways with `memory+mps`.
pub fn measure_shares(gpus: u32, replicas: u32, format: Format, runs: usize) -> (Duration, usize) {
    let inv = synthetic_inventory(gpus, 0);
    let text = format!(
        "flags: {{mpsRoot: /run/nvidia/mps}}\nsharing:\n  timeSlicing:\n    resources:\n    - {{name: gpu, replicas: {replicas}, isolation: memory+mps}}\n"
    );
    let cfg = match gpu_slicer::domain::config::parse(&text, "bench", &Default::default()) {
        Ok(c) => c,
        Err(e) => panic!("config: {e}"),
    };
    let plan = match gpu_slicer::domain::plan::build(&inv, &cfg) {
        Ok(p) => p,
        Err(e) => panic!("plan: {e}"),
    };
    let opts = GenerateOptions {
        shares: Some(cdi::shares::ShareOptions {
            plan: plan.into(),
            mps_root: cfg.mps_root.clone(),
            hook: cdi::shares::HookSettings {
                path: "/usr/local/bin/gpu-slicer".into(),
                nvml_lib: None,
                env: Vec::new(),
            },
        }),
        ..GenerateOptions::new("gpu-slicer.io/gpu")
    };
    time_generate(&inv, &opts, format, runs)
}

fn main() {
    println!("cdi generate + serialise, median of {RUNS} runs (N GPUs x 7 MIG slices)");
    println!(
        "{:>5} {:>8} {:>6} {:>12} {:>12}",
        "gpus", "devices", "format", "median", "per device"
    );
    for format in [Format::Yaml, Format::Json] {
        for gpus in [1, 2, 4, 8, 16, 32, 64] {
            let (t, n) = measure(gpus, 7, format, RUNS);
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
            let (t, n) = measure_shares(gpus, 48, format, RUNS);
            println!(
                "{gpus:>5} {n:>8} {format:>6} {:>10.1}µs {:>10.2}µs",
                t.as_secs_f64() * 1e6,
                t.as_secs_f64() * 1e6 / n as f64
            );
        }
    }
}
