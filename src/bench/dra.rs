//! The DRA driver's hot paths: the ResourceSlices of a node, NodePrepareResources without
//! the API (an in-memory claim map) for a whole GPU, a share bound by the memory-limit hook
//! and a MIG device made on demand on the fake NVML, and the driver serving the kubelet's
//! socket with its claims read from an API server.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::domain::cdi::shares::HookSettings;
use crate::domain::cdi::{GenerateOptions, NoProbe, generate};
use crate::domain::dra::claim::ClaimRef;
use crate::domain::dra::partition::{MadeInstance, Placement};
use crate::domain::dra::slices::{self, SliceFormat, SliceTarget};
use crate::domain::inventory::{Backend, Inventory};
use crate::domain::snapshot::Snapshot;
use crate::domain::view::Overlay;
use crate::platform::dra_mig::{Found, InstanceError, InstanceOps, Made, NvmlInstances};
use crate::platform::dra_state::{DraFiles, Prepared};
use crate::runtime::Context;
use crate::runtime::dra::{DraSettings, Driver, DriverExtras};
use crate::state::Store;
use crate::testkit::PrivateFake;
use crate::testkit::apiserver::ApiServer;
use crate::testkit::fixtures;
use crate::testkit::kubelet::dra::Claims;

/// The driver name every DRA bench uses.
const DRIVER: &str = "gpu-slicer.io";
/// The one claim the prepare benches prepare.
const UID: &str = "aaaaaaaa-0000-4000-8000-000000000001";
/// `mixed-a100`'s MIG devices served one by one.
const MIXED: &str = "version: v1\nflags:\n  migStrategy: mixed\n";

/// The ResourceSlices of the sim node `profile` under `config` (MIG mode switched on on
/// every GPU first when `mig_on`), for an API server of version `kubernetes` (`1.34`: counter
/// sets and their devices in one slice; `1.35` and later: apart). One call of the closure
/// builds them (device health, the node's devices, the slices) and serialises them as JSON,
/// and returns the time that took (what it made is freed after the clock is read) with the
/// JSON's bytes, the slices and the devices.
///
/// # Panics
/// When the node, config or plan fails, or `kubernetes` is not `major.minor`.
pub fn dra_slices(
    profile: &str,
    mig_on: bool,
    config: &str,
    kubernetes: &str,
) -> impl FnMut() -> (Duration, (usize, usize, usize)) + use<> {
    let mut inv = fixtures::inventory(profile);
    if mig_on {
        for g in &mut inv.gpus {
            g.mig_mode.current = true;
        }
    }
    let cfg = fixtures::config(config);
    let plan = crate::domain::plan::build(&inv, &cfg).unwrap_or_else(|e| panic!("plan: {e}"));
    let (major, minor) = kubernetes
        .split_once('.')
        .unwrap_or_else(|| panic!("{kubernetes}: not major.minor"));
    let format = SliceFormat::for_server(major, minor);
    move || {
        let target = SliceTarget {
            driver: DRIVER,
            node_name: "node-a",
            node_uid: Some("uid"),
            generation: 1,
        };
        let start = Instant::now();
        let health = slices::health_map(&inv, &plan, &Overlay::default());
        let devs = slices::node_devices_with(&inv, &plan, &health, cfg.dra.dynamic_mig.as_ref());
        let built = slices::build_for(&target, &devs, format);
        let out = serde_json::to_vec(&built).unwrap_or_else(|e| panic!("json: {e}"));
        let took = start.elapsed();
        let figures = (out.len(), built.len(), devs.devices.len());
        black_box(out);
        (took, figures)
    }
}

/// A store serving `inv` under `config`, with its node CDI spec, as the daemon serves it.
fn store_of(inv: Inventory, config: &str) -> Store {
    let cfg = fixtures::config(config);
    let plan = crate::domain::plan::build(&inv, &cfg).unwrap_or_else(|e| panic!("plan: {e}"));
    let spec = generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe)
        .unwrap_or_else(|e| panic!("spec: {e}"));
    let mut snap = Snapshot::serving(cfg, inv, plan);
    snap.spec = Some(Arc::new(spec));
    Store::new(snap)
}

/// A temp dir for CDI specs on tmpfs, as `/var/run/cdi` is on a node (else under `/tmp`).
fn cdi_tempdir() -> TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap_or_else(|e| panic!("tempdir: {e}"))
}

/// The allocation result of request `gpu` naming `device` of pool `node-a`.
fn result(device: &str) -> serde_json::Value {
    serde_json::json!({"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device})
}

/// The file system type of `path` (fsync costs differ by orders of magnitude).
fn fs_of(path: &Path) -> String {
    std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(path)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
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
        self.create
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(t.elapsed());
        made
    }
    fn destroy(&self, made: &MadeInstance) -> Result<(), InstanceError> {
        let t = Instant::now();
        let r = self.inner.destroy(made);
        self.destroy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(t.elapsed());
        r
    }
    fn instances(&self, index: u32, uuid: &str) -> Result<Vec<Found>, InstanceError> {
        self.inner.instances(index, uuid)
    }
}

/// The NodePrepareResources handler (`Driver::prepare`) for one claim whose one result is
/// fixed, without the API: the claim comes from an in-memory map. Laid out as deployed: the
/// CDI dir on tmpfs (`/dev/shm`, as `/var/run/cdi` is; else under `/tmp`), the state dir on
/// disk (a temp dir under `/tmp`). [`DraPrepare::prepare`] and [`DraPrepare::unprepare`]
/// alternate.
#[derive(Debug)]
pub struct DraPrepare {
    driver: Driver,
    claim: [ClaimRef; 1],
    state: TempDir,
    cdi: TempDir,
    /// The MIG operations, timed (dynamic MIG only).
    instances: Option<Arc<Timed>>,
    /// The fake NVML the MIG device is made on, kept loaded (dynamic MIG only).
    _fake: Option<(PrivateFake, TempDir)>,
}

impl DraPrepare {
    /// A whole GPU (`gpu-2`) of `mixed-a100`.
    pub fn whole_gpu() -> Self {
        Self::new(
            store_of(fixtures::inventory("mixed-a100"), MIXED),
            result("gpu-2"),
            DriverExtras::default(),
            None,
        )
    }

    /// A 10 GiB share of `mixed-a100`'s GPU 2, shared with `isolation: memory`: the claim's
    /// spec carries the memory-limit hook.
    pub fn share() -> Self {
        let store = store_of(
            fixtures::inventory("mixed-a100"),
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.mem, replicas: 4, devices: [2], isolation: memory}\n",
        );
        let mut share = result("gpu-2");
        share["shareID"] = "5a4e0000-0000-4000-8000-000000000001".into();
        share["consumedCapacity"] = serde_json::json!({"memory": "10Gi", "compute": "0"});
        let extras = DriverExtras {
            hook: Some(HookSettings {
                path: "/opt/gpu-slicer/bin/gpu-slicer".into(),
                nvml_lib: None,
                env: vec![],
            }),
            ..DriverExtras::default()
        };
        Self::new(store, share, extras, None)
    }

    /// A MIG 1g.5gb made on demand (placement `gpu-4-mig-1g5gb-19-3`, GPU 4 dynamic) on a
    /// private copy of the fake NVML serving `node` (a node file's text: A100-40GB GPUs with
    /// MIG on), discovered through NVML; the MIG create and destroy are timed apart
    /// ([`DraPrepare::instance_times`]).
    pub fn dynamic_mig(node: &str) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let fake = PrivateFake::new(dir.path());
        fake.set_node(node);
        let proc_root = dir.path().join("proc");
        crate::testkit::write_mig_minors(&proc_root, &[0, 1, 2, 3, 4, 5, 6, 7]);
        let backend =
            crate::platform::nvml::NvmlBackend::new(Some(fake.path.clone()), proc_root.clone());
        let inv = backend
            .discover()
            .unwrap_or_else(|e| panic!("discover: {e}"));
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
        let mut prepare = Self::new(store, result("gpu-4-mig-1g5gb-19-3"), extras, Some(ops));
        prepare._fake = Some((fake, dir));
        prepare
    }

    fn new(
        store: Store,
        result: serde_json::Value,
        extras: DriverExtras,
        instances: Option<Arc<Timed>>,
    ) -> Self {
        let state = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let cdi = cdi_tempdir();
        let files = DraFiles {
            checkpoint: state.path().join("state/dra-prepared.json"),
            cdi_dir: cdi.path().to_path_buf(),
            driver: DRIVER.into(),
        };
        let claims = Claims::new();
        claims.put(
            serde_json::json!({"metadata": {"namespace": "ml", "name": "a", "uid": UID},
            "status": {"allocation": {"devices": {"results": [result]}}}}),
        );
        let driver = Driver::with_extras(
            DRIVER,
            "node-a",
            store,
            claims,
            (files, Prepared::default()),
            extras,
        );
        Self {
            driver,
            claim: [ClaimRef {
                namespace: "ml".into(),
                uid: UID.into(),
                name: "a".into(),
            }],
            state,
            cdi,
            instances,
            _fake: None,
        }
    }

    /// Prepare the claim: the time the handler took (its answer is checked after the clock
    /// is read).
    ///
    /// # Panics
    /// When the claim is not prepared.
    pub async fn prepare(&self) -> Duration {
        let start = Instant::now();
        let out = self.driver.prepare(&self.claim).await;
        let took = start.elapsed();
        assert!(out[UID].is_ok(), "{out:?}");
        took
    }

    /// Unprepare the claim (not timed).
    ///
    /// # Panics
    /// When the claim is not unprepared.
    pub async fn unprepare(&self) {
        let un = self.driver.unprepare(&self.claim).await;
        assert!(un[UID].is_ok(), "{un:?}");
    }

    /// The file system types of the state dir and the CDI dir, for the method line.
    pub fn file_systems(&self) -> (String, String) {
        (fs_of(self.state.path()), fs_of(self.cdi.path()))
    }

    /// Each MIG create and each destroy so far (empty unless [`DraPrepare::dynamic_mig`]).
    pub fn instance_times(&self) -> (Vec<Duration>, Vec<Duration>) {
        self.instances
            .as_ref()
            .map_or_else(Default::default, |ops| {
                let take = |m: &Mutex<Vec<Duration>>| {
                    m.lock().unwrap_or_else(PoisonError::into_inner).clone()
                };
                (take(&ops.create), take(&ops.destroy))
            })
    }
}

/// The DRA driver as `run --dra` spawns it (one whole-GPU node, `mixed-a100`), serving the
/// kubelet's registration and DRA sockets under `root` (`reg/`, `plugins/`) and reading its
/// claims with the `kube` client from an API server; the status of a prepared claim is
/// written back there.
#[derive(Debug)]
pub struct DraDriver {
    ctx: Context,
    registration: PathBuf,
    /// Kept for as long as the driver runs, as the supervisor keeps it.
    _handle: crate::runtime::dra::DraHandle,
}

impl DraDriver {
    /// Spawn the driver on the current runtime: sockets under `root`, per-claim specs in
    /// `cdi_dir`, state in `root/state`, claims from `server`.
    ///
    /// # Panics
    /// When the driver does not start.
    pub async fn start(server: &ApiServer, root: &Path, cdi_dir: &Path) -> Self {
        let ctx = Context::new(store_of(fixtures::inventory("mixed-a100"), MIXED));
        let settings = DraSettings {
            driver: DRIVER.into(),
            node: "node-a".into(),
            registry_dir: root.join("reg"),
            plugins_dir: root.join("plugins"),
            cdi_dir: cdi_dir.to_path_buf(),
            state_dir: root.join("state"),
            proc_root: root.join("proc"),
            health_resend: Duration::from_secs(20),
            socket_check: Duration::from_secs(1),
            extras: DriverExtras::default(),
        };
        let client = server.client().unwrap_or_else(|e| panic!("client: {e}"));
        let claims = crate::platform::kube::KubeClaims::new(client);
        let handle = crate::runtime::dra::spawn(settings, Arc::new(claims), &ctx)
            .await
            .unwrap_or_else(|e| panic!("driver: {e}"));
        Self {
            ctx,
            registration: root.join("reg").join(format!("{DRIVER}-reg.sock")),
            _handle: handle,
        }
    }

    /// The registration socket the kubelet's plugin watcher finds.
    pub fn registration_socket(&self) -> &Path {
        &self.registration
    }

    /// Stop the driver and wait for its tasks.
    pub async fn stop(self) {
        self.ctx.token.cancel();
        self.ctx.tracker.close();
        self.ctx.tracker.wait().await;
    }
}
