//! Benchmark: the DRA driver's hot paths.
//!
//! `cargo bench --bench dra` prints medians of `RUNS` runs of
//! - ResourceSlice build (`node_devices` + `slices::build`) and JSON serialisation for the
//!   `dgx-h100` and `mixed-a100` sim nodes;
//! - the NodePrepareResources handler for one claim without the API round trip
//!   (`Driver::prepare` with the in-memory claim map: resolve, cut the CDI spec, write the
//!   spec file and the checkpoint atomically with fsync, then unprepare to reset), in a
//!   temp dir.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_slicer::domain::cdi::{GenerateOptions, NoProbe, generate};
use gpu_slicer::domain::dra::claim::ClaimRef;
use gpu_slicer::domain::dra::slices;
use gpu_slicer::domain::snapshot::Snapshot;
use gpu_slicer::domain::view::Overlay;
use gpu_slicer::platform::dra_state::{DraFiles, Prepared};
use gpu_slicer::runtime::dra::Driver;
use gpu_slicer::state::Store;
use gpu_slicer::testkit::fixtures;
use gpu_slicer::testkit::kubelet::dra::Claims;

const RUNS: usize = 201;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn slices_bench(profile: &str) {
    let (inv, _, plan) = fixtures::planned(profile, "version: v1\nflags:\n  migStrategy: mixed\n");
    let target = slices::SliceTarget {
        driver: "gpu-slicer.io",
        node_name: "node-a",
        node_uid: Some("uid"),
        generation: 1,
    };
    let mut times = Vec::with_capacity(RUNS);
    let mut bytes = 0;
    for _ in 0..RUNS {
        let t = Instant::now();
        let health = slices::health_map(&plan, &Overlay::default());
        let devices = slices::node_devices(&inv, &plan, &health);
        let built = slices::build(&target, &devices);
        let out = serde_json::to_vec(&built).expect("json");
        times.push(t.elapsed());
        bytes = out.len();
        black_box(out);
    }
    println!(
        "slices {profile:<11} build+serialise  median {:>9.1?}  ({bytes} bytes JSON)",
        median(times)
    );
}

fn prepare_bench() {
    let (inv, cfg, plan) =
        fixtures::planned("mixed-a100", "version: v1\nflags:\n  migStrategy: mixed\n");
    let spec = generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe).expect("spec");
    let mut snap = Snapshot::serving(cfg, inv, plan);
    snap.spec = Some(Arc::new(spec));
    let dir = tempfile::tempdir().expect("tempdir");
    let files = DraFiles {
        checkpoint: dir.path().join("state/dra-prepared.json"),
        cdi_dir: dir.path().join("cdi"),
        driver: "gpu-slicer.io".into(),
    };
    let claims = Claims::new();
    let uid = "aaaaaaaa-0000-4000-8000-000000000001";
    claims.put(serde_json::json!({"metadata": {"namespace": "ml", "name": "a", "uid": uid},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu-slicer.io", "pool": "node-a", "device": "gpu-2"}]}}}}));
    let driver = Driver::new(
        "gpu-slicer.io",
        "node-a",
        Store::new(snap),
        claims,
        files,
        Prepared::default(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let want = [ClaimRef {
        namespace: "ml".into(),
        uid: uid.into(),
        name: "a".into(),
    }];
    let mut times = Vec::with_capacity(RUNS);
    rt.block_on(async {
        for _ in 0..RUNS {
            let t = Instant::now();
            let out = driver.prepare(&want).await;
            times.push(t.elapsed());
            assert!(out[uid].is_ok(), "{out:?}");
            driver.unprepare(&want).await;
        }
    });
    println!(
        "prepare one claim (spec + checkpoint, fsync)  median {:>9.1?}",
        median(times)
    );
}

fn main() {
    slices_bench("dgx-h100");
    slices_bench("mixed-a100");
    prepare_bench();
}
