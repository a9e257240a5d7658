//! Benchmark: the DRA driver's hot paths.
//!
//! `cargo bench --bench dra` prints medians of `RUNS` runs of
//! - ResourceSlice build (`node_devices` + `slices::build`) and JSON serialisation for the
//!   `dgx-h100` and `mixed-a100` sim nodes, and for 8 × H100 with MIG on and every GPU
//!   dynamic (every placement of every profile published, with its counter set), in the
//!   1.34 and 1.35+ layouts;
//! - the NodePrepareResources handler for one claim without the API round trip
//!   (`Driver::prepare` with the in-memory claim map: resolve, cut the CDI spec, write the
//!   claim's record, the spec file and the checkpoint atomically with fsync, then unprepare to
//!   reset), laid out as deployed: the CDI dir on tmpfs (`/dev/shm`, as `/var/run/cdi` is),
//!   the state dir on disk (a temp dir under `/tmp`): a whole GPU; a 10 GiB share of a GPU
//!   with driver-enforced memory (the spec carries the memory-limit hook); and a dynamic MIG
//!   1g.5gb on the fake NVML library, where the MIG create (GPU + compute instance, read back
//!   through NVML discovery) and the destroy are timed apart from the rest of Prepare;
//! - NodePrepareResources end to end through the emulators: the kubelet's DRA client over the
//!   real unix socket, the driver reading the claim with the `kube` client over HTTP from the
//!   API-server emulator (status writes on), then NodeUnprepareResources; p50/p99.
//!
//! Figures go to `hack/bench.sh` as `FIGURE|` lines, methods as `METHOD|` lines.

use std::time::Duration;

use gpu_slicer::bench::{self, DraDriver, DraPrepare};
use gpu_slicer::testkit::{ApiServer, DraPluginConn, KubeletClaim, percentile};

const RUNS: usize = 201;
const UID: &str = "aaaaaaaa-0000-4000-8000-000000000001";
const MIXED: &str = "version: v1\nflags:\n  migStrategy: mixed\n";

fn median(v: &[Duration]) -> Duration {
    percentile(v, 0.5)
}

fn slices_bench(what: &str, profile: &str, mig_on: bool, config: &str, kubernetes: &str) {
    let mut build = bench::dra_slices(profile, mig_on, config, kubernetes);
    let mut times = Vec::with_capacity(RUNS);
    let (mut bytes, mut count, mut devices) = (0, 0, 0);
    for _ in 0..RUNS {
        let (took, figures) = build();
        times.push(took);
        (bytes, count, devices) = figures;
    }
    let m = median(&times);
    println!("slices {what:<11} build+serialise  median {m:>9.1?}  ({bytes} bytes JSON)");
    println!(
        "FIGURE|DRA ResourceSlice build + JSON, {what} ({devices} devices, {count} slices, {bytes} B)|{m:.1?}"
    );
}

/// A temp dir for CDI specs on tmpfs, as `/var/run/cdi` is on a node (else under `/tmp`).
fn cdi_tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("tempdir")
}

fn result(device: &str) -> serde_json::Value {
    serde_json::json!({"request": "gpu", "driver": "gpu-slicer.io", "pool": "node-a", "device": device})
}

/// Median of `DraPrepare::prepare` of its one claim, unprepared between runs.
fn prepare_bench(prepare: &DraPrepare) -> Duration {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut times = Vec::with_capacity(RUNS);
    rt.block_on(async {
        for _ in 0..RUNS {
            times.push(prepare.prepare().await);
            prepare.unprepare().await;
        }
    });
    median(&times)
}

fn prepare_benches() {
    let whole = DraPrepare::whole_gpu();
    let m = prepare_bench(&whole);
    let (state_fs, cdi_fs) = whole.file_systems();
    println!(
        "prepare one claim (record + spec on tmpfs, checkpoint on disk, fsync)  median {m:>9.1?}"
    );
    println!(
        "FIGURE|DRA NodePrepareResources handler, one claim, no API (record + spec on tmpfs, checkpoint on disk, fsync)|{m:.1?}"
    );
    println!(
        "METHOD|DRA prepare handler: Driver::prepare of one whole-GPU claim on mixed-a100 from an in-memory claim map (resolve, per-claim CDI spec cut from the node spec, three atomic writes with fsync: record, spec, checkpoint), unprepare between runs; median of {RUNS}; state dir on {state_fs}, CDI dir on {cdi_fs}"
    );
    let m = prepare_bench(&DraPrepare::share());
    println!(
        "FIGURE|DRA NodePrepareResources handler, a 10 GiB share (spec with the memory-limit hook), same layout|{m:.1?}"
    );
}

fn mig_prepare_bench() {
    let node =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mig/a100-40gb.yaml");
    let mig = DraPrepare::dynamic_mig(&std::fs::read_to_string(node).expect("node file"));
    let total = prepare_bench(&mig);
    let (create, destroy) = mig.instance_times();
    let (create, destroy) = (median(&create), median(&destroy));
    println!(
        "FIGURE|DRA NodePrepareResources handler, a dynamic MIG 1g.5gb on the fake NVML: whole / MIG create alone / the rest|{total:.1?} / {create:.1?} / {:.1?}",
        total.saturating_sub(create)
    );
    println!("FIGURE|DRA NodeUnprepareResources' MIG destroy on the fake NVML|{destroy:.1?}");
    println!(
        "METHOD|DRA capacity and MIG: the same handler for a 10 GiB share of a GPU shared with `isolation: memory`, and for a dynamic MIG placement on tests/fixtures/mig/a100-40gb.yaml through a private copy of the fake libnvidia-ml; MIG create = GPU + compute instance through NVML and the MIG device read back through NVML discovery, destroy = compute + GPU instance; medians of {RUNS}"
    );
}

/// NodePrepareResources over the kubelet's socket, the claim read from the API emulator.
async fn end_to_end(calls: usize) -> Vec<Duration> {
    let dir = tempfile::tempdir().expect("tempdir");
    let cdi = cdi_tempdir();
    let server = ApiServer::start().await.expect("api server");
    let claim: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ml", "name": "a", "uid": UID},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
            "status": {"allocation": {"devices": {"results": [result("gpu-2")]}}}}))
        .expect("claim");
    server.insert(&claim).expect("insert");
    let driver = DraDriver::start(&server, dir.path(), cdi.path()).await;
    let kubelet = DraPluginConn::register(driver.registration_socket())
        .await
        .expect("registered");
    let want = [KubeletClaim {
        namespace: "ml".into(),
        uid: UID.into(),
        name: "a".into(),
    }];
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = std::time::Instant::now();
        let out = kubelet.prepare(&want, None).await.expect("prepare");
        times.push(t.elapsed());
        assert!(out[UID].is_ok(), "{out:?}");
        kubelet.unprepare(&want).await.expect("unprepare");
    }
    driver.stop().await;
    server.stop().await;
    times
}

fn end_to_end_bench() {
    let calls = if std::env::var_os("BENCH_QUICK").is_some() {
        200
    } else {
        1000
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let times = rt.block_on(end_to_end(calls));
    let (p50, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
    println!("prepare end to end (socket + API GET)  p50 {p50:>9.1?}  p99 {p99:>9.1?}");
    println!(
        "FIGURE|DRA NodePrepareResources end to end, one claim (kubelet socket, claim GET from the API emulator)|p50 {p50:.1?} / p99 {p99:.1?}"
    );
    println!(
        "METHOD|DRA prepare end to end: the kubelet emulator's DRA client over the real unix socket to the driver (one tokio worker, as run), which GETs the claim with the kube client over HTTP from the in-process API-server emulator, writes record, spec and checkpoint, answers, then queues the status write; NodeUnprepareResources between calls (not timed); CDI dir on tmpfs, state dir on disk; {calls} calls"
    );
}

fn main() {
    for profile in ["dgx-h100", "mixed-a100"] {
        slices_bench(profile, profile, false, MIXED, "1.35");
    }
    // 8 × H100 with MIG on, every GPU dynamic: every placement published.
    let all = "version: v1\nflags:\n  dra: {dynamicMig: all}\n";
    slices_bench(
        "8 x H100, every placement, 1.35+",
        "dgx-h100",
        true,
        all,
        "1.35",
    );
    slices_bench(
        "8 x H100, every placement, 1.34",
        "dgx-h100",
        true,
        all,
        "1.34",
    );
    prepare_benches();
    mig_prepare_bench();
    end_to_end_bench();
}
