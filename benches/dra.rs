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

// The test harness's helpers (the fake library's location) serve the bench too.
#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_slicer::domain::cdi::shares::HookSettings;
use gpu_slicer::domain::cdi::{GenerateOptions, NoProbe, generate};
use gpu_slicer::domain::dra::claim::ClaimRef;
use gpu_slicer::domain::dra::partition::{MadeInstance, Placement};
use gpu_slicer::domain::dra::slices::{self, SliceFormat};
use gpu_slicer::domain::inventory::{Backend, Inventory};
use gpu_slicer::domain::snapshot::Snapshot;
use gpu_slicer::domain::view::Overlay;
use gpu_slicer::platform::dra_mig::{Found, InstanceError, InstanceOps, Made, NvmlInstances};
use gpu_slicer::platform::dra_state::{DraFiles, Prepared};
use gpu_slicer::runtime::dra::{DraSettings, Driver, DriverExtras};
use gpu_slicer::state::Store;
use gpu_slicer::testkit::fixtures;
use gpu_slicer::testkit::kubelet::dra::{Claims, KubeletClaim, register};
use gpu_slicer::testkit::stats::percentile;

const RUNS: usize = 201;
const UID: &str = "aaaaaaaa-0000-4000-8000-000000000001";
const MIXED: &str = "version: v1\nflags:\n  migStrategy: mixed\n";

fn median(v: &[Duration]) -> Duration {
    percentile(v, 0.5)
}

fn slices_bench(what: &str, inv: &Inventory, config: &str, format: SliceFormat) {
    let cfg = fixtures::config(config);
    let plan = gpu_slicer::domain::plan::build(inv, &cfg).expect("plan");
    let dynamic = cfg.dra.dynamic_mig.as_ref();
    let target = slices::SliceTarget {
        driver: "gpu-slicer.io",
        node_name: "node-a",
        node_uid: Some("uid"),
        generation: 1,
    };
    let mut times = Vec::with_capacity(RUNS);
    let (mut bytes, mut count, mut devices) = (0, 0, 0);
    for _ in 0..RUNS {
        let t = Instant::now();
        let health = slices::health_map(inv, &plan, &Overlay::default());
        let devs = slices::node_devices_with(inv, &plan, &health, dynamic);
        let built = slices::build_for(&target, &devs, format);
        let out = serde_json::to_vec(&built).expect("json");
        times.push(t.elapsed());
        (bytes, count, devices) = (out.len(), built.len(), devs.devices.len());
        black_box(out);
    }
    let m = median(&times);
    println!("slices {what:<11} build+serialise  median {m:>9.1?}  ({bytes} bytes JSON)");
    println!(
        "FIGURE|DRA ResourceSlice build + JSON, {what} ({devices} devices, {count} slices, {bytes} B)|{m:.1?}"
    );
}

/// A store serving `inv` under `config`, with its node CDI spec, as the daemon serves it.
fn store_of(inv: Inventory, config: &str) -> Store {
    let cfg = fixtures::config(config);
    let plan = gpu_slicer::domain::plan::build(&inv, &cfg).expect("plan");
    let spec = generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe).expect("spec");
    let mut snap = Snapshot::serving(cfg, inv, plan);
    snap.spec = Some(Arc::new(spec));
    Store::new(snap)
}

/// `mixed-a100` with its node CDI spec.
fn store() -> Store {
    store_of(fixtures::inventory("mixed-a100"), MIXED)
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

/// Median of `Driver::prepare` of one claim whose one result is `result`; the file systems
/// of the state and CDI dirs, for the method line.
fn prepare_bench(
    store: Store,
    result: serde_json::Value,
    extras: DriverExtras,
) -> (Duration, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cdi = cdi_tempdir();
    let files = DraFiles {
        checkpoint: dir.path().join("state/dra-prepared.json"),
        cdi_dir: cdi.path().to_path_buf(),
        driver: "gpu-slicer.io".into(),
    };
    let claims = Claims::new();
    claims.put(
        serde_json::json!({"metadata": {"namespace": "ml", "name": "a", "uid": UID},
        "status": {"allocation": {"devices": {"results": [result]}}}}),
    );
    let driver = Driver::with_extras(
        "gpu-slicer.io",
        "node-a",
        store,
        claims,
        (files, Prepared::default()),
        extras,
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
            let un = driver.unprepare(&want).await;
            assert!(un[UID].is_ok(), "{un:?}");
        }
    });
    (median(&times), fs_of(dir.path()), fs_of(cdi.path()))
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

fn prepare_benches() {
    let (m, state_fs, cdi_fs) = prepare_bench(store(), result("gpu-2"), DriverExtras::default());
    println!(
        "prepare one claim (record + spec on tmpfs, checkpoint on disk, fsync)  median {m:>9.1?}"
    );
    println!(
        "FIGURE|DRA NodePrepareResources handler, one claim, no API (record + spec on tmpfs, checkpoint on disk, fsync)|{m:.1?}"
    );
    println!(
        "METHOD|DRA prepare handler: Driver::prepare of one whole-GPU claim on mixed-a100 from an in-memory claim map (resolve, per-claim CDI spec cut from the node spec, three atomic writes with fsync: record, spec, checkpoint), unprepare between runs; median of {RUNS}; state dir on {state_fs}, CDI dir on {cdi_fs}"
    );
    let shared = store_of(
        fixtures::inventory("mixed-a100"),
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.mem, replicas: 4, devices: [2], isolation: memory}\n",
    );
    let mut share = result("gpu-2");
    share["shareID"] = "5a4e0000-0000-4000-8000-000000000001".into();
    share["consumedCapacity"] = serde_json::json!({"memory": "10Gi", "compute": "0"});
    let hook = DriverExtras {
        hook: Some(HookSettings {
            path: "/opt/gpu-slicer/bin/gpu-slicer".into(),
            nvml_lib: None,
            env: vec![],
        }),
        ..DriverExtras::default()
    };
    let (m, _, _) = prepare_bench(shared, share, hook);
    println!(
        "FIGURE|DRA NodePrepareResources handler, a 10 GiB share (spec with the memory-limit hook), same layout|{m:.1?}"
    );
}

/// [`InstanceOps`] that times the NVML work of the one it wraps.
#[derive(Debug)]
struct Timed {
    inner: NvmlInstances,
    create: Mutex<Vec<Duration>>,
    destroy: Mutex<Vec<Duration>>,
}

impl InstanceOps for Timed {
    fn create(&self, at: &Placement) -> Result<Made, InstanceError> {
        let t = Instant::now();
        let made = self.inner.create(at);
        self.create.lock().expect("lock").push(t.elapsed());
        made
    }
    fn destroy(&self, made: &MadeInstance) -> Result<(), InstanceError> {
        let t = Instant::now();
        let r = self.inner.destroy(made);
        self.destroy.lock().expect("lock").push(t.elapsed());
        r
    }
    fn instances(&self, index: u32, uuid: &str) -> Result<Vec<Found>, InstanceError> {
        self.inner.instances(index, uuid)
    }
}

fn mig_prepare_bench() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = gpu_slicer::testkit::PrivateFake::new(dir.path());
    let node =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mig/a100-40gb.yaml");
    fake.set_node(&std::fs::read_to_string(node).expect("node file"));
    let proc_root = dir.path().join("proc");
    std::fs::create_dir_all(proc_root.join("driver/nvidia-caps")).expect("proc");
    std::fs::write(
        proc_root.join("driver/nvidia-caps/mig-minors"),
        node_spec::mig_minors_file(&[0, 1, 2, 3, 4, 5, 6, 7]),
    )
    .expect("mig-minors");
    let backend =
        gpu_slicer::platform::nvml::NvmlBackend::new(Some(fake.path.clone()), proc_root.clone());
    let inv = backend.discover().expect("discover");
    let ops = Arc::new(Timed {
        inner: NvmlInstances {
            lib: Some(fake.path.clone()),
            proc_root,
        },
        create: Mutex::default(),
        destroy: Mutex::default(),
    });
    let extras = DriverExtras {
        instances: Some(ops.clone()),
        ..DriverExtras::default()
    };
    let store = store_of(
        inv,
        "version: v1\nflags:\n  migStrategy: mixed\n  dra: {dynamicMig: [4]}\n",
    );
    let (total, _, _) = prepare_bench(store, result("gpu-4-mig-1g5gb-19-3"), extras);
    let create = median(&ops.create.lock().expect("lock"));
    let destroy = median(&ops.destroy.lock().expect("lock"));
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
    use gpu_slicer::testkit::apiserver::ApiServer;
    gpu_slicer::platform::kube::install_crypto_provider();
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
        extras: DriverExtras::default(),
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
    for profile in ["dgx-h100", "mixed-a100"] {
        slices_bench(
            profile,
            &fixtures::inventory(profile),
            MIXED,
            SliceFormat::Split,
        );
    }
    // 8 × H100 with MIG on, every GPU dynamic: every placement published.
    let mut dgx = fixtures::inventory("dgx-h100");
    for g in &mut dgx.gpus {
        g.mig_mode.current = true;
    }
    let all = "version: v1\nflags:\n  dra: {dynamicMig: all}\n";
    slices_bench(
        "8 x H100, every placement, 1.35+",
        &dgx,
        all,
        SliceFormat::Split,
    );
    slices_bench(
        "8 x H100, every placement, 1.34",
        &dgx,
        all,
        SliceFormat::Combined,
    );
    prepare_benches();
    mig_prepare_bench();
    end_to_end_bench();
}
