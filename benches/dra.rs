//! Benchmark: the DRA driver's hot paths.
//!
//! `cargo bench --bench dra` prints medians of `RUNS` runs of
//! - ResourceSlice build (`node_devices` + `slices::build`) and JSON serialisation for the
//!   `dgx-h100` and `mixed-a100` sim nodes;
//! - the NodePrepareResources handler for one claim without the API round trip
//!   (`Driver::prepare` with the in-memory claim map: resolve, cut the CDI spec, write the
//!   claim's record, the spec file and the checkpoint atomically with fsync, then unprepare to
//!   reset), laid out as deployed: the CDI dir on tmpfs (`/dev/shm`, as `/var/run/cdi` is),
//!   the state dir on disk (a temp dir under `/tmp`);
//! - NodePrepareResources end to end through the emulators: the kubelet's DRA client over the
//!   real unix socket, the driver reading the claim with the `kube` client over HTTP from the
//!   API-server emulator (status writes on), then NodeUnprepareResources; p50/p99.
//!
//! Figures go to `hack/bench.sh` as `FIGURE|` lines, methods as `METHOD|` lines.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_slicer::domain::cdi::{GenerateOptions, NoProbe, generate};
use gpu_slicer::domain::dra::claim::ClaimRef;
use gpu_slicer::domain::dra::slices;
use gpu_slicer::domain::snapshot::Snapshot;
use gpu_slicer::domain::view::Overlay;
use gpu_slicer::platform::dra_state::{DraFiles, Prepared};
use gpu_slicer::runtime::dra::{DraSettings, Driver};
use gpu_slicer::state::Store;
use gpu_slicer::testkit::fixtures;
use gpu_slicer::testkit::kubelet::dra::{Claims, KubeletClaim, register};
use gpu_slicer::testkit::stats::percentile;

const RUNS: usize = 201;
const UID: &str = "aaaaaaaa-0000-4000-8000-000000000001";

fn median(v: &[Duration]) -> Duration {
    percentile(v, 0.5)
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
    let mut count = 0;
    for _ in 0..RUNS {
        let t = Instant::now();
        let health = slices::health_map(&plan, &Overlay::default());
        let devices = slices::node_devices(&inv, &plan, &health);
        let built = slices::build(&target, &devices);
        let out = serde_json::to_vec(&built).expect("json");
        times.push(t.elapsed());
        bytes = out.len();
        count = devices.devices.len();
        black_box(out);
    }
    let m = median(&times);
    println!("slices {profile:<11} build+serialise  median {m:>9.1?}  ({bytes} bytes JSON)");
    println!(
        "FIGURE|DRA ResourceSlice build + JSON, {profile} ({count} devices, {bytes} B)|{m:.1?}"
    );
}

/// `mixed-a100` with its node CDI spec, as the daemon serves it.
fn store() -> Store {
    let (inv, cfg, plan) =
        fixtures::planned("mixed-a100", "version: v1\nflags:\n  migStrategy: mixed\n");
    let spec = generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe).expect("spec");
    let mut snap = Snapshot::serving(cfg, inv, plan);
    snap.spec = Some(Arc::new(spec));
    Store::new(snap)
}

/// A temp dir for CDI specs on tmpfs, as `/var/run/cdi` is on a node (else under `/tmp`).
fn cdi_tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("tempdir")
}

/// `state_on_tmpfs`: the checkpoint on tmpfs too, which leaves the handler's own cost
/// without the disk's fsync.
fn prepare_bench(state_on_tmpfs: bool) {
    let dir = if state_on_tmpfs {
        cdi_tempdir()
    } else {
        tempfile::tempdir().expect("tempdir")
    };
    let cdi = cdi_tempdir();
    let files = DraFiles {
        checkpoint: dir.path().join("state/dra-prepared.json"),
        cdi_dir: cdi.path().to_path_buf(),
        driver: "gpu-slicer.io".into(),
    };
    let claims = Claims::new();
    claims.put(serde_json::json!({"metadata": {"namespace": "ml", "name": "a", "uid": UID},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu-slicer.io", "pool": "node-a", "device": "gpu-2"}]}}}}));
    let driver = Driver::new(
        "gpu-slicer.io",
        "node-a",
        store(),
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
        uid: UID.into(),
        name: "a".into(),
    }];
    let mut times = Vec::with_capacity(RUNS);
    rt.block_on(async {
        for _ in 0..RUNS {
            let t = Instant::now();
            let out = driver.prepare(&want).await;
            times.push(t.elapsed());
            assert!(out[UID].is_ok(), "{out:?}");
            driver.unprepare(&want).await;
        }
    });
    let m = median(&times);
    let state = fs_of(dir.path());
    println!(
        "prepare one claim (record + spec on tmpfs, checkpoint on {state}, fsync)  median {m:>9.1?}"
    );
    println!(
        "FIGURE|DRA NodePrepareResources handler, one claim, no API (record + spec on tmpfs, checkpoint on {state}, fsync)|{m:.1?}"
    );
    println!(
        "METHOD|DRA prepare handler: Driver::prepare of one whole-GPU claim on mixed-a100 from an in-memory claim map (resolve, per-claim CDI spec cut from the node spec, three atomic writes with fsync: record, spec, checkpoint), unprepare between runs; median of {RUNS}; state dir on {state}, CDI dir on {}",
        fs_of(cdi.path())
    );
}

/// The file system type of `path` (fsync costs differ by orders of magnitude).
fn fs_of(path: &std::path::Path) -> String {
    std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(path)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// NodePrepareResources over the kubelet's socket, the claim read from the API emulator.
async fn end_to_end(calls: usize) -> Vec<Duration> {
    use gpu_slicer::testkit::apiserver::ApiServer;
    gpu_slicer::platform::kube::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let cdi = cdi_tempdir();
    let server = ApiServer::start().await.expect("api server");
    let claim: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ml", "name": "a", "uid": UID},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu-slicer.io", "pool": "node-a", "device": "gpu-2"}]}}}}))
        .expect("claim");
    server.insert(&claim).expect("insert");
    let ctx = gpu_slicer::runtime::Context::new(store());
    let settings = DraSettings {
        driver: "gpu-slicer.io".into(),
        node: "node-a".into(),
        registry_dir: dir.path().join("reg"),
        plugins_dir: dir.path().join("plugins"),
        cdi_dir: cdi.path().to_path_buf(),
        state_dir: dir.path().join("state"),
        proc_root: dir.path().join("proc"),
        health_resend: Duration::from_secs(20),
        socket_check: Duration::from_secs(1),
    };
    let claims = gpu_slicer::platform::kube::KubeClaims::new(server.client().expect("client"));
    let _driver = gpu_slicer::runtime::dra::spawn(settings, Arc::new(claims), &ctx)
        .await
        .expect("driver");
    let kubelet = register(&dir.path().join("reg/gpu-slicer.io-reg.sock"))
        .await
        .expect("registered");
    let want = [KubeletClaim {
        namespace: "ml".into(),
        uid: UID.into(),
        name: "a".into(),
    }];
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        let out = kubelet.prepare(&want, None).await.expect("prepare");
        times.push(t.elapsed());
        assert!(out[UID].is_ok(), "{out:?}");
        kubelet.unprepare(&want).await.expect("unprepare");
    }
    ctx.token.cancel();
    ctx.tracker.close();
    ctx.tracker.wait().await;
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
    slices_bench("dgx-h100");
    slices_bench("mixed-a100");
    prepare_bench(false);
    prepare_bench(true);
    end_to_end_bench();
}
