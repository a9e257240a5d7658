//! Benchmark: the DRA driver's hot paths.
//!
//! `cargo bench --bench dra` prints (as `FIGURE|` lines for `hack/bench.sh`) medians of
//! `RUNS` runs of
//! - ResourceSlice build (`node_devices` + `slices::build`) and JSON serialisation for the
//!   `dgx-h100` and `mixed-a100` sim nodes, and for 8 × H100 with MIG on and every GPU
//!   dynamic (every placement of every profile published, with its counter set), in the
//!   1.34 and 1.35+ layouts;
//! - the NodePrepareResources handler for one claim without the API round trip
//!   (`Driver::prepare` with the in-memory claim map: resolve, cut the CDI spec, write the
//!   spec file and the checkpoint atomically with fsync, then unprepare to reset), in a
//!   temp dir: a whole GPU; a 10 GiB share of a GPU with driver-enforced memory (the spec
//!   carries the memory-limit hook); and a dynamic MIG 1g.5gb on the fake NVML library,
//!   where the MIG create (GPU + compute instance, read back through NVML discovery) and
//!   the destroy are timed apart from the rest of Prepare.

// The test harness's helpers (the fake library's location) serve the bench too.
#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_slicer::domain::cdi::shares::HookSettings;
use gpu_slicer::domain::cdi::{GenerateOptions, NoProbe, generate};
use gpu_slicer::domain::config::DeviceSelector;
use gpu_slicer::domain::dra::claim::ClaimRef;
use gpu_slicer::domain::dra::partition::{MadeInstance, Placement};
use gpu_slicer::domain::dra::slices::{self, SliceFormat};
use gpu_slicer::domain::inventory::{Backend, Inventory};
use gpu_slicer::domain::snapshot::Snapshot;
use gpu_slicer::domain::view::Overlay;
use gpu_slicer::platform::dra_mig::{Found, InstanceError, InstanceOps, Made, NvmlInstances};
use gpu_slicer::platform::dra_state::{DraFiles, Prepared};
use gpu_slicer::runtime::dra::{Driver, DriverExtras};
use gpu_slicer::state::Store;
use gpu_slicer::testkit::fixtures;
use gpu_slicer::testkit::kubelet::dra::Claims;

const RUNS: usize = 201;
const UID: &str = "aaaaaaaa-0000-4000-8000-000000000001";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn target() -> slices::SliceTarget<'static> {
    slices::SliceTarget {
        driver: "gpu-slicer.io",
        node_name: "node-a",
        node_uid: Some("uid"),
        generation: 1,
    }
}

fn slices_bench(what: &str, inv: &Inventory, config: &str, format: SliceFormat) {
    let cfg = fixtures::config(config);
    let plan = gpu_slicer::domain::plan::build(inv, &cfg).expect("plan");
    let dynamic = cfg.dra.dynamic_mig.as_ref();
    let mut times = Vec::with_capacity(RUNS);
    let (mut bytes, mut count, mut devices) = (0, 0, 0);
    for _ in 0..RUNS {
        let t = Instant::now();
        let health = slices::health_map(&plan, &Overlay::default());
        let devs = slices::node_devices_with(inv, &plan, &health, dynamic);
        let built = slices::build_for(&target(), &devs, format);
        let out = serde_json::to_vec(&built).expect("json");
        times.push(t.elapsed());
        (bytes, count, devices) = (out.len(), built.len(), devs.devices.len());
        black_box(out);
    }
    println!(
        "FIGURE|ResourceSlices {what}: build + JSON ({devices} devices, {count} slices)|median {:.1?}, {bytes} bytes",
        median(times)
    );
}

/// A store serving `inv` under `config`, with its node spec (and MPS daemons).
fn store_of(inv: Inventory, config: &str) -> Store {
    let cfg = fixtures::config(config);
    let plan = gpu_slicer::domain::plan::build(&inv, &cfg).expect("plan");
    let spec = generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe).expect("spec");
    let mut snap = Snapshot::serving(cfg, inv, plan);
    snap.spec = Some(Arc::new(spec));
    Store::new(snap)
}

fn files(dir: &std::path::Path) -> DraFiles {
    DraFiles {
        checkpoint: dir.join("state/dra-prepared.json"),
        cdi_dir: dir.join("cdi"),
        driver: "gpu-slicer.io".into(),
    }
}

/// Median of `Driver::prepare` of one claim whose one result is `result`.
fn prepare_bench(store: Store, result: serde_json::Value, extras: DriverExtras) -> Duration {
    let dir = tempfile::tempdir().expect("tempdir");
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
        (files(dir.path()), Prepared::default()),
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
    median(times)
}

fn result(device: &str) -> serde_json::Value {
    serde_json::json!({"request": "gpu", "driver": "gpu-slicer.io", "pool": "node-a", "device": device})
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
    let fake = common::PrivateFake::new(dir.path());
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
    let total = prepare_bench(store, result("gpu-4-mig-1g5gb-19-3"), extras);
    let create = median(ops.create.lock().expect("lock").clone());
    let destroy = median(ops.destroy.lock().expect("lock").clone());
    println!(
        "FIGURE|Prepare, dynamic MIG 1g.5gb on the fake NVML: whole / MIG create alone / the rest|median {total:.1?} / {create:.1?} / {:.1?}",
        total.saturating_sub(create)
    );
    println!("FIGURE|Unprepare's MIG destroy on the fake NVML|median {destroy:.1?}");
}

fn main() {
    for profile in ["dgx-h100", "mixed-a100"] {
        let inv = fixtures::inventory(profile);
        let config = "version: v1\nflags:\n  migStrategy: mixed\n";
        slices_bench(profile, &inv, config, SliceFormat::Split);
    }
    // 8 × H100 with MIG on, every GPU dynamic: every placement published.
    let mut dgx = fixtures::inventory("dgx-h100");
    for g in &mut dgx.gpus {
        g.mig_mode.current = true;
    }
    let all = "version: v1\nflags:\n  dra: {dynamicMig: all}\n";
    assert!(matches!(
        fixtures::config(all).dra.dynamic_mig,
        Some(DeviceSelector::All)
    ));
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

    let plain = store_of(
        fixtures::inventory("mixed-a100"),
        "version: v1\nflags:\n  migStrategy: mixed\n",
    );
    let whole = prepare_bench(plain, result("gpu-2"), DriverExtras::default());
    println!("FIGURE|Prepare one claim, a whole GPU (spec + checkpoint, fsync)|median {whole:.1?}");
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
    let hooked = prepare_bench(shared, share, hook);
    println!(
        "FIGURE|Prepare one claim, a 10 GiB share with the memory-limit hook (spec + checkpoint, fsync)|median {hooked:.1?}"
    );
    mig_prepare_bench();
    println!(
        "METHOD|dra: medians of {RUNS} runs; Prepare in process (Driver::prepare, no API round trip), files in a temp dir with fsync; MIG create = GPU + compute instance through the fake libnvidia-ml and the MIG device read back through NVML discovery"
    );
}
