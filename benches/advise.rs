//! `gpu-slicer advise` at fleet scale (synthetic fleets of `gpu_slicer::bench::advise_fleet`,
//! 7-day windows of aggregates as the PromQL returns them):
//! - the binary on a 10 000-GPU export through `--from-file` (plan, HTML report and summary
//!   written): wall time and peak RSS (the child's `ru_maxrss`), best and worst of 3 runs;
//! - the pure advice (classify, size, choose shares, pack, place) on about 10 000 workloads;
//! - the gap to the lower bound on 64-GPU reference fleets (20 seeds; the CLI test's fixture
//!   is seed 7).
//!
//! BENCH_QUICK=1 runs the binary once.

use std::process::Command;
use std::time::{Duration, Instant};

use gpu_slicer::bench::{advise_fleet, advise_pack};

fn main() {
    let runs = if std::env::var_os("BENCH_QUICK").is_some() {
        1
    } else {
        3
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let export = dir.path().join("fleet-10000.json");
    std::fs::write(&export, advise_fleet(10_000, 4, 1)).expect("write export");
    let size = std::fs::metadata(&export).map(|m| m.len()).unwrap_or(0);
    let mut walls = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
            .arg("advise")
            .arg("--from-file")
            .arg(&export)
            .arg("--output")
            .arg(dir.path().join("plan"))
            .arg("--report")
            .arg(dir.path().join("report.html"))
            .arg("--summary-json")
            .arg(dir.path().join("summary.json"))
            .output()
            .expect("run gpu-slicer advise");
        walls.push(t.elapsed());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    walls.sort();
    let rss_kib = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|u| u.max_rss())
        .unwrap_or(0);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).expect("summary"))
            .expect("summary JSON");
    let name = "advise --from-file, 10000 GPUs x 7 days";
    println!(
        "{name} ({} KiB export, {} workloads): wall {:?} .. {:?}, peak RSS {} MiB; GPUs {} -> {} (bound {})",
        size / 1024,
        summary["workloads"].as_array().map_or(0, Vec::len),
        walls[0],
        walls[walls.len() - 1],
        rss_kib / 1024,
        summary["gpusBefore"],
        summary["gpusAfter"],
        summary["lowerBound"]
    );
    println!(
        "FIGURE|{name}|wall {:.2?} (best of {runs}), peak RSS {} MiB",
        walls[0],
        rss_kib / 1024
    );

    let p = advise_pack(&advise_fleet(11_000, 1, 2));
    println!(
        "advise packing, {} workloads ({} GPUs held): {:?}; GPUs {} -> {} (bound {}, gap {:.1} %)",
        p.workloads,
        p.gpus_before,
        p.took,
        p.gpus_before,
        p.gpus_after,
        p.lower_bound,
        gap(p.gpus_after, p.lower_bound)
    );
    println!(
        "FIGURE|advise packing, {} workloads|{:.2?}",
        p.workloads, p.took
    );

    let mut gaps = Vec::new();
    let mut took = Duration::ZERO;
    for seed in 1..=20 {
        let p = advise_pack(&advise_fleet(64, 4, seed));
        gaps.push(gap(p.gpus_after, p.lower_bound));
        took += p.took;
        if seed == 7 {
            println!(
                "advise reference fleet (64 GPUs, seed 7): GPUs {} -> {} (bound {}, gap {:.1} %)",
                p.gpus_before,
                p.gpus_after,
                p.lower_bound,
                gap(p.gpus_after, p.lower_bound)
            );
        }
    }
    gaps.sort_by(f64::total_cmp);
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    println!(
        "advise gap to the lower bound, 20 fleets of 64 GPUs: mean {mean:.1} %, median {:.1} %, max {:.1} % ({:?} each)",
        gaps[gaps.len() / 2],
        gaps[gaps.len() - 1],
        took / 20
    );
    println!(
        "FIGURE|advise gap to the lower bound, 64-GPU fleets|mean {mean:.1} %, max {:.1} %",
        gaps[gaps.len() - 1]
    );
}

/// How far above the bound, in percent of the bound.
fn gap(after: usize, bound: usize) -> f64 {
    if bound == 0 {
        0.0
    } else {
        (after as f64 - bound as f64) / bound as f64 * 100.0
    }
}
