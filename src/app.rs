//! The daemon's wiring: discover → plan → CDI spec → one device-plugin server per resource →
//! registration, then serve until shutdown, re-planning on every reload trigger.
//!
//! Every task runs on one `TaskTracker` and stops through a child of the caller's
//! `CancellationToken`. Shutdown is ordered: servers stop and unlink their sockets, the
//! kubelet watch ends, and the whole stop has a deadline. The CDI spec is left in place on
//! purpose: containers that already run still reference it.
//!
//! Reload (see `crate::reload` for the triggers): load the config and/or re-discover, build
//! the plan, write the CDI spec (keeping every device still allocated to a container), then
//! publish the new plan. Only resources whose devices changed get a new ListAndWatch frame;
//! removed resources stop serving and unlink their socket; added ones start. Any failure
//! before publishing leaves the running state exactly as it was.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::allocate::{AllocationLog, DeviceNodes, HealthMap, HealthUpdate};
use crate::config::{Config, ConfigError};
use crate::inventory::{Backend, Inventory, InventoryError};
use crate::plan::{Plan, PlanDiff, PlanError};
use crate::plugin::{
    self, Backoff, PluginContext, PluginError, PluginSettings, Serving, WatchError,
};
use crate::reload::{Cause, Causes, ReloadError, TriggerSettings, Triggers};

/// How long an ordered shutdown may take before tasks are abandoned.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);

/// Errors of the daemon.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The config could not be loaded again (reload).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Discovery failed.
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    /// The config does not fit this node.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Writing the CDI spec failed.
    #[error(transparent)]
    Spec(#[from] SpecWriterError),
    /// The kubelet directory could not be watched.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// A resource could not be served.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// Reload triggers could not be set up.
    #[error(transparent)]
    Reload(#[from] ReloadError),
    /// The MPS control daemons could not be set up.
    #[error(transparent)]
    Mps(#[from] crate::mps::MpsError),
    /// The HTTP endpoint could not listen.
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    /// A blocking task (discovery, spec writing) panicked or was cancelled.
    #[error("{task} did not complete: {message}")]
    Blocking { task: &'static str, message: String },
    /// Tasks were still running when the shutdown deadline passed.
    #[error("shutdown did not complete within {0:?}")]
    ShutdownTimeout(Duration),
}

/// Error of a [`SpecWriter`].
#[derive(Debug, thiserror::Error)]
#[error("cannot write CDI spec in {dir}: {message}")]
pub struct SpecWriterError {
    /// CDI directory.
    pub dir: String,
    /// What went wrong.
    pub message: String,
}

/// Writes the CDI spec describing a plan before any Allocate is answered. Called on a
/// blocking thread. A trait so tests and embedders can observe or replace it.
pub trait SpecWriter: Send + Sync + fmt::Debug {
    /// Write (atomically) the spec for `plan` into `cdi_dir`. `keep` names CDI devices
    /// (without the kind) still allocated to containers: a device of the previous spec in
    /// `keep` stays in the new one even if the plan no longer produces it, so restarting
    /// such a container never fails on a missing CDI device.
    fn write(
        &self,
        cdi_dir: &Path,
        inventory: &Inventory,
        plan: &Plan,
        config: &Config,
        keep: &BTreeSet<String>,
    ) -> Result<(), SpecWriterError>;
}

/// A spec writer that writes nothing (until `crate::cdi` is wired in).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSpecWriter;

impl SpecWriter for NoSpecWriter {
    fn write(
        &self,
        cdi_dir: &Path,
        _inventory: &Inventory,
        _plan: &Plan,
        _config: &Config,
        _keep: &BTreeSet<String>,
    ) -> Result<(), SpecWriterError> {
        tracing::warn!(cdi_dir = %cdi_dir.display(), "no CDI spec writer configured; spec not written");
        Ok(())
    }
}

/// The real writer: generate the spec from the inventory (stat'ing host device nodes under
/// the configured dev root) plus a `<device>-share-<k>` device per enforced share of the
/// plan, carry over still-allocated devices from the previous spec,
/// check it, and write it atomically as `<vendor>-<class>.yaml`. Remembers the last spec it
/// wrote (the first time: the file already on disk, left by an earlier run) so a reload can
/// carry devices over.
#[derive(Debug, Default)]
pub struct CdiSpecWriter {
    /// The memory-limit hook of share devices (default: this executable, system NVML).
    pub hook: Option<crate::cdi::shares::HookSettings>,
    last: std::sync::Mutex<Option<crate::cdi::Spec>>,
}

impl CdiSpecWriter {
    /// A writer whose share devices run `hook`.
    pub fn with_hook(hook: crate::cdi::shares::HookSettings) -> Self {
        Self {
            hook: Some(hook),
            last: std::sync::Mutex::default(),
        }
    }

    fn previous(&self, path: &Path) -> Option<crate::cdi::Spec> {
        let last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        last.or_else(|| {
            let text = std::fs::read_to_string(path).ok()?;
            crate::cdi::Spec::parse(&text, path).ok()
        })
    }
}

impl SpecWriter for CdiSpecWriter {
    fn write(
        &self,
        cdi_dir: &Path,
        inventory: &Inventory,
        plan: &Plan,
        config: &Config,
        keep: &BTreeSet<String>,
    ) -> Result<(), SpecWriterError> {
        let err = |e: crate::cdi::CdiError| SpecWriterError {
            dir: cdi_dir.display().to_string(),
            message: e.to_string(),
        };
        let dev_root = (config.dev_root != Path::new("/")).then(|| config.dev_root.clone());
        let hook = match &self.hook {
            Some(h) => h.clone(),
            None => crate::cdi::shares::HookSettings::current_exe(None).map_err(err)?,
        };
        let opts = crate::cdi::generate::GenerateOptions {
            kind: config.cdi_kind.clone(),
            dev_root,
            shares: Some(crate::cdi::shares::ShareOptions {
                plan: plan.clone(),
                mps_root: config.mps_root.clone(),
                hook,
            }),
            driver: None,
        };
        let mut spec =
            crate::cdi::generate::generate(inventory, &opts, &crate::cdi::generate::HostProbe)
                .map_err(err)?;
        let format = crate::cdi::Format::Yaml;
        let name = crate::cdi::spec_file_name(&config.cdi_kind, format);
        let mut kept = Vec::new();
        if !keep.is_empty()
            && let Some(previous) = self.previous(&cdi_dir.join(&name))
            && previous.kind == spec.kind
        {
            let have: BTreeSet<String> = spec.devices.iter().map(|d| d.name.clone()).collect();
            for device in previous.devices {
                if keep.contains(&device.name) && !have.contains(&device.name) {
                    kept.push(device.name.clone());
                    spec.devices.push(device);
                }
            }
            spec.devices.sort_by(|a, b| a.name.cmp(&b.name));
        }
        if !kept.is_empty() {
            tracing::info!(devices = ?kept, "CDI devices kept for running containers");
            // A kept device may use a newer spec feature than the generated ones; `generate`
            // checked its own spec, the merged one is checked again.
            spec.cdi_version = crate::cdi::minimum_version(&spec).to_string();
            crate::cdi::validate(&spec).map_err(err)?;
        }
        let bytes = spec.to_bytes(format).map_err(err)?;
        let outcome = crate::cdi::writer::write_spec(cdi_dir, &name, &bytes).map_err(err)?;
        tracing::info!(dir = %cdi_dir.display(), file = %name, ?outcome, kept = kept.len(), "CDI spec");
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(spec);
        Ok(())
    }
}

/// Loads the config again on reload (file, environment and flags, as at start).
pub type ConfigLoader = Arc<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// How the daemon reloads.
#[derive(Clone)]
pub struct ReloadSettings {
    /// Re-reads the config; `None`: the config never changes, only the inventory.
    pub load: Option<ConfigLoader>,
    /// What triggers a reload.
    pub triggers: TriggerSettings,
}

impl fmt::Debug for ReloadSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadSettings")
            .field("load", &self.load.as_ref().map(|_| "<loader>"))
            .field("triggers", &self.triggers)
            .finish()
    }
}

/// What the reloads so far came to; published after each one.
#[derive(Debug, Clone)]
pub struct ReloadStatus {
    /// Reloads that published a new plan.
    pub applied: u64,
    /// Reloads that found nothing to change.
    pub unchanged: u64,
    /// Reloads refused (the previous state kept serving).
    pub failed: u64,
    /// The last refusal, if the last reload failed.
    pub last_error: Option<String>,
    /// The plan being served.
    pub plan: Arc<Plan>,
    /// What the last applied reload changed.
    pub last_diff: Option<PlanDiff>,
}

/// What a started daemon exposes to its embedder (tests, demo, the health subsystem).
#[derive(Debug, Clone)]
pub struct Running {
    /// Live device state: call `set_health` to report GPU/MIG health events.
    pub health: HealthMap,
    /// The plan served at start (see `reloads` for the current one).
    pub plan: Arc<Plan>,
    /// The inventory discovered.
    pub inventory: Arc<Inventory>,
    /// Ask for a reload (config and inventory).
    pub reload: mpsc::Sender<Cause>,
    /// Outcome of every reload.
    pub reloads: watch::Receiver<ReloadStatus>,
    /// Device IDs handed out by Allocate, per resource.
    pub allocations: AllocationLog,
    /// The agent's metrics (the same registry `/metrics` serves).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// What `/readyz` reports.
    pub readiness: Arc<crate::http::Readiness>,
    /// The allocation ledger, when a PodResources socket was configured.
    pub ledger: Option<crate::ledger::Ledger>,
    /// Where the HTTP endpoint listens, when enabled.
    pub http_addr: Option<std::net::SocketAddr>,
}

/// Settings of `app::run`.
#[derive(Debug)]
pub struct RunSettings {
    /// Validated config.
    pub config: Config,
    /// Plugin socket directory.
    pub device_plugin_dir: PathBuf,
    /// The kubelet's registration socket.
    pub kubelet_socket: PathBuf,
    /// CDI spec directory.
    pub cdi_dir: PathBuf,
    /// Registration retry timing.
    pub backoff: Backoff,
    /// Writes the CDI spec before serving.
    pub spec_writer: Arc<dyn SpecWriter>,
    /// Told once every server is started (before registration completes).
    pub on_ready: Option<oneshot::Sender<Running>>,
    /// Health events from the health subsystem (NVML event loop, sim scripts). Each is
    /// applied with [`HealthMap::set_health`]; events for unknown devices are logged.
    pub health_events: Option<mpsc::Receiver<HealthUpdate>>,
    /// Live reconfiguration.
    pub reload: ReloadSettings,
    /// MPS control daemon supervision (binary, backoff), used when the plan has MPS shares.
    pub mps: crate::mps::daemon::SupervisorConfig,
    /// The health monitor (NVML events or sim injection → policy → device state); `None`:
    /// no monitoring.
    pub health_monitor: Option<crate::health::monitor::HealthSettings>,
    /// HTTP endpoint address (`:9400`, `127.0.0.1:0`); `None` serves no HTTP.
    pub http_listen: Option<String>,
    /// PodResources ledger; `None` runs without one.
    pub ledger: Option<crate::ledger::LedgerSettings>,
    /// Metrics registry to record into (injected so embedders can read it).
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl RunSettings {
    /// Settings for a device-plugin directory, with the kubelet socket inside it.
    pub fn new(
        config: Config,
        device_plugin_dir: impl Into<PathBuf>,
        cdi_dir: impl Into<PathBuf>,
    ) -> Self {
        let device_plugin_dir = device_plugin_dir.into();
        Self {
            config,
            kubelet_socket: device_plugin_dir.join(crate::proto::KUBELET_SOCKET_NAME),
            device_plugin_dir,
            cdi_dir: cdi_dir.into(),
            backoff: Backoff::default(),
            spec_writer: Arc::new(CdiSpecWriter::default()),
            on_ready: None,
            health_events: None,
            reload: ReloadSettings {
                load: None,
                triggers: TriggerSettings::default(),
            },
            mps: crate::mps::daemon::SupervisorConfig::default(),
            health_monitor: None,
            http_listen: None,
            ledger: None,
            metrics: Arc::default(),
        }
    }
}

/// Run a blocking closure off the async workers.
async fn blocking<T: Send + 'static>(
    task: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, AppError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AppError::Blocking {
            task,
            message: e.to_string(),
        })
}

/// The state being served, replaced as a whole by a successful reload.
#[derive(Debug, Clone)]
struct Current {
    config: Arc<Config>,
    inventory: Arc<Inventory>,
    plan: Arc<Plan>,
}

/// The daemon's moving parts between start and shutdown.
struct Daemon {
    backend: Arc<dyn Backend>,
    spec_writer: Arc<dyn SpecWriter>,
    cdi_dir: PathBuf,
    load: Option<ConfigLoader>,
    current: Current,
    serving: watch::Sender<Arc<Serving>>,
    /// Shared with every resource server: live health, the Allocate log, metrics, readiness.
    ctx: PluginContext,
    watch: plugin::KubeletWatch,
    /// One token per served resource: cancelling it stops that server and unlinks its socket.
    resources: BTreeMap<String, CancellationToken>,
    token: CancellationToken,
    fail_tx: mpsc::Sender<PluginError>,
    status: watch::Sender<ReloadStatus>,
    /// MPS supervision settings and the token of the running set of control daemons.
    mps: crate::mps::daemon::SupervisorConfig,
    mps_token: CancellationToken,
    /// The inventory being served, for the health monitor.
    inventory_tx: watch::Sender<Arc<Inventory>>,
}

impl Daemon {
    fn spawn_resource(&mut self, resource: String) {
        let (ctx, kubelet, token, fail_tx) = (
            self.ctx.clone(),
            self.watch.subscribe(),
            self.token.child_token(),
            self.fail_tx.clone(),
        );
        self.resources.insert(resource.clone(), token.clone());
        // Health metrics follow the view until the daemon stops or a re-plan removes the
        // resource (its channel closes and its series are forgotten).
        if let Some(views) = self.ctx.health.subscribe(&resource) {
            self.ctx.tracker.spawn(crate::metrics::follow_resource(
                views,
                self.ctx.metrics.clone(),
                self.token.clone(),
            ));
        }
        self.ctx.tracker.spawn(async move {
            let name = resource.clone();
            if let Err(e) = plugin::run_resource(resource, ctx, kubelet, token).await {
                tracing::error!(resource = %name, error = %e, "resource stopped");
                // Full only if many resources failed already; the first error is enough.
                let _ = fail_tx.try_send(e);
            }
        });
    }

    /// CDI device names (without the kind) that allocated devices of the current plan use.
    fn allocated_cdi_names(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let config = &self.current.config;
        let prefix = format!("{}=", config.cdi_kind);
        for (resource, ids) in self.ctx.allocations.snapshot() {
            let Some(r) = self.current.plan.resource(&resource) else {
                continue;
            };
            let devices: Vec<&crate::plan::Device> =
                ids.iter().filter_map(|id| r.device(id)).collect();
            if devices.is_empty() {
                continue;
            }
            for qualified in crate::allocate::build_response(config, r, &devices).cdi_devices {
                if let Some(name) = qualified.strip_prefix(&prefix) {
                    names.insert(name.to_string());
                }
            }
        }
        names
    }

    /// Reload; on any error the running state is untouched.
    async fn reload(&mut self, causes: Causes) -> Result<Option<PlanDiff>, AppError> {
        let config = match (&self.load, causes.config) {
            (Some(load), true) => {
                let load = load.clone();
                Arc::new(blocking("config loading", move || load()).await??)
            }
            _ => self.current.config.clone(),
        };
        let inventory = if causes.inventory {
            let backend = self.backend.clone();
            Arc::new(blocking("inventory discovery", move || backend.discover()).await??)
        } else {
            self.current.inventory.clone()
        };
        if config == self.current.config && inventory == self.current.inventory {
            return Ok(None);
        }
        let plan = Arc::new(crate::plan::build(&inventory, &config)?);
        let daemons = crate::mps::daemons_for(&plan, &config)?;
        let restart_mps = daemons
            != crate::mps::daemons_for(&self.current.plan, &self.current.config)
                .unwrap_or_default();
        let keep = self.allocated_cdi_names();
        {
            let (writer, dir, inventory, plan, config) = (
                self.spec_writer.clone(),
                self.cdi_dir.clone(),
                inventory.clone(),
                plan.clone(),
                config.clone(),
            );
            blocking("CDI spec writing", move || {
                writer.write(&dir, &inventory, &plan, &config, &keep)
            })
            .await??;
        }
        // Past this point nothing fails: publish.
        self.serving.send_replace(Arc::new(Serving {
            config: config.clone(),
            nodes: Arc::new(DeviceNodes::new(&inventory)),
        }));
        if !Arc::ptr_eq(&inventory, &self.current.inventory) {
            self.inventory_tx.send_replace(inventory.clone());
        }
        let diff = self.ctx.health.replace_plan(&plan);
        if restart_mps {
            // The daemons' defaults follow the replica count: the set is replaced as a whole
            // (clients of a replaced daemon reconnect to the new one).
            self.mps_token.cancel();
            self.mps_token = self.token.child_token();
            tracing::info!(
                daemons = daemons.len(),
                "MPS control daemons follow the new plan"
            );
            if let Err(e) = crate::mps::health::start(
                &plan,
                &config,
                self.mps.clone(),
                &self.ctx.health,
                &self.ctx.tracker,
                self.mps_token.clone(),
            )
            .await
            {
                tracing::error!(error = %e, "MPS control daemons for the new plan failed to start");
            }
        }
        for name in &diff.removed {
            if let Some(token) = self.resources.remove(name) {
                token.cancel();
            }
        }
        for name in &diff.added {
            self.spawn_resource(name.clone());
        }
        self.current = Current {
            config,
            inventory,
            plan,
        };
        Ok(Some(diff))
    }

    async fn handle(&mut self, causes: Causes) {
        let result = self.reload(causes).await;
        if causes.config || result.is_err() {
            self.ctx.metrics.record_reload(result.is_ok());
        }
        if matches!(result, Ok(Some(_))) {
            self.ctx
                .readiness
                .expect_resources(self.ctx.health.resource_names());
        }
        let plan = self.current.plan.clone();
        self.status.send_modify(|s| {
            s.plan = plan;
            match &result {
                Ok(Some(diff)) => {
                    s.applied += 1;
                    s.last_error = None;
                    s.last_diff = Some(diff.clone());
                }
                Ok(None) => {
                    s.unchanged += 1;
                    s.last_error = None;
                }
                Err(e) => {
                    s.failed += 1;
                    s.last_error = Some(e.to_string());
                }
            }
        });
        match result {
            Ok(Some(diff)) => tracing::info!(
                cause = causes.label(),
                added = ?diff.added,
                removed = ?diff.removed,
                changed = ?diff.changed,
                unchanged = diff.unchanged.len(),
                "reload applied"
            ),
            // The re-scan timer finds nothing most of the time: keep that out of info logs.
            Ok(None) if !causes.config => {
                tracing::debug!(cause = causes.label(), "reload: nothing changed");
            }
            Ok(None) => tracing::info!(cause = causes.label(), "reload: nothing changed"),
            Err(e) => tracing::error!(
                cause = causes.label(),
                error = %e,
                "reload refused; the previous config and plan keep serving"
            ),
        }
    }
}

/// Run the daemon until `shutdown` is cancelled (or a resource fails).
pub async fn run(
    settings: RunSettings,
    backend: Arc<dyn Backend>,
    shutdown: CancellationToken,
) -> Result<(), AppError> {
    let RunSettings {
        config,
        device_plugin_dir,
        kubelet_socket,
        cdi_dir,
        backoff,
        spec_writer,
        on_ready,
        health_events,
        reload,
        mps,
        health_monitor,
        http_listen,
        ledger,
        metrics,
    } = settings;
    let readiness = Arc::new(crate::http::Readiness::default());
    // NVML discovery blocks: keep it off the async workers.
    let discovered = {
        let backend = backend.clone();
        blocking("inventory discovery", move || backend.discover()).await?
    };
    let (inventory, no_driver) = match discovered {
        Ok(inventory) => (inventory, false),
        // As NVIDIA's plugin: with failOnInitError false a node without a working driver
        // still runs (serving nothing) instead of crash-looping.
        Err(e @ InventoryError::Nvml { .. }) if !config.fail_on_init_error => {
            tracing::warn!(error = %e, "failOnInitError is false: running with no devices");
            let inventory = Inventory {
                source: "none (driver unavailable)".to_string(),
                ..Inventory::default()
            };
            (inventory, true)
        }
        Err(e) => return Err(e.into()),
    };
    // No devices: the config's resources cannot be checked against this node, so serve none.
    let plan = if no_driver {
        Plan::default()
    } else {
        crate::plan::build(&inventory, &config)?
    };
    tracing::info!(source = %inventory.source, gpus = inventory.gpus.len(), resources = plan.resources.len(), "plan built");
    let (inventory, plan, config) = (Arc::new(inventory), Arc::new(plan), Arc::new(config));
    // Without a driver there is no device to describe (an empty spec is invalid CDI).
    if !no_driver {
        let (writer, inventory, plan, config, dir) = (
            spec_writer.clone(),
            inventory.clone(),
            plan.clone(),
            config.clone(),
            cdi_dir.clone(),
        );
        blocking("CDI spec writing", move || {
            writer.write(&dir, &inventory, &plan, &config, &BTreeSet::new())
        })
        .await??;
        readiness
            .spec_written
            .store(true, std::sync::atomic::Ordering::Release);
    }
    let health = HealthMap::new(&plan);
    let watch = plugin::KubeletWatch::start(&kubelet_socket)?;
    let tracker = TaskTracker::new();
    let token = shutdown.child_token();
    let mut triggers = Triggers::start(&reload.triggers, &tracker, &token)?;
    let (serving, serving_rx) = watch::channel(Arc::new(Serving {
        config: config.clone(),
        nodes: Arc::new(DeviceNodes::new(&inventory)),
    }));
    let allocations = AllocationLog::default();
    let (inventory_tx, inventory_rx) = watch::channel(inventory.clone());
    // MPS daemons up (or their devices Unhealthy) before any resource is advertised.
    let mps_token = token.child_token();
    crate::mps::health::start(
        &plan,
        &config,
        mps.clone(),
        &health,
        &tracker,
        mps_token.clone(),
    )
    .await?;
    let ctx = PluginContext {
        settings: Arc::new(PluginSettings {
            device_plugin_dir,
            kubelet_socket,
            backoff,
        }),
        health: health.clone(),
        serving: serving_rx,
        allocations: allocations.clone(),
        tracker: tracker.clone(),
        metrics: metrics.clone(),
        readiness: readiness.clone(),
    };
    // Operations: readiness follows the plan, the ledger reconciles, HTTP serves.
    readiness.expect_resources(health.resource_names());
    let ledger = ledger.map(|settings| {
        crate::ledger::start_for_daemon(
            settings,
            &health,
            &allocations,
            metrics.clone(),
            &tracker,
            &token,
        )
    });
    let http_addr = match http_listen.as_deref() {
        Some(addr) => {
            let listener = crate::http::bind(addr).await?;
            let local = crate::http::local_addr(&listener);
            let serve =
                crate::http::serve(listener, metrics.clone(), readiness.clone(), token.clone());
            tracker.spawn(serve);
            local
        }
        None => None,
    };
    let (fail_tx, mut fail_rx) = mpsc::channel::<PluginError>(16);
    let (status, status_rx) = watch::channel(ReloadStatus {
        applied: 0,
        unchanged: 0,
        failed: 0,
        last_error: None,
        plan: plan.clone(),
        last_diff: None,
    });
    let mut daemon = Daemon {
        backend,
        spec_writer,
        cdi_dir,
        load: reload.load,
        current: Current {
            config,
            inventory: inventory.clone(),
            plan: plan.clone(),
        },
        serving,
        ctx,
        watch,
        resources: BTreeMap::new(),
        token: token.clone(),
        fail_tx,
        status,
        mps,
        mps_token,
        inventory_tx,
    };
    for resource in health.resource_names() {
        daemon.spawn_resource(resource);
    }
    if let Some(settings) = health_monitor {
        crate::health::monitor::spawn(
            settings,
            inventory_rx,
            health.clone(),
            &tracker,
            token.child_token(),
        );
    }
    if let Some(events) = health_events {
        tracker.spawn(apply_health_events(events, health.clone(), token.clone()));
    }
    if let Some(tx) = on_ready {
        // The embedder may have stopped listening; serving goes on regardless.
        let _ = tx.send(Running {
            health,
            plan,
            inventory,
            reload: triggers.requester(),
            reloads: status_rx,
            allocations,
            metrics,
            readiness,
            ledger,
            http_addr,
        });
    }
    let failure = loop {
        tokio::select! {
            () = shutdown.cancelled() => break None,
            Some(e) = fail_rx.recv() => break Some(e),
            Some(causes) = triggers.next() => daemon.handle(causes).await,
        }
    };
    tracing::info!("shutting down");
    token.cancel();
    tracker.close();
    let stopped = tokio::time::timeout(SHUTDOWN_DEADLINE, tracker.wait()).await;
    // Resource tasks are gone: the inotify watch can end now.
    drop(daemon);
    drop(triggers);
    if let Some(e) = failure {
        return Err(e.into());
    }
    if stopped.is_err() {
        return Err(AppError::ShutdownTimeout(SHUTDOWN_DEADLINE));
    }
    tracing::info!("stopped");
    Ok(())
}

/// Apply health events until the sender goes away or the daemon stops.
async fn apply_health_events(
    mut events: mpsc::Receiver<HealthUpdate>,
    health: HealthMap,
    token: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            () = token.cancelled() => return,
            event = events.recv() => event,
        };
        let Some(event) = event else { return };
        match health.set_health(&event.key, event.health, &event.reason) {
            Ok(changed) => tracing::info!(
                device = %event.key,
                health = %event.health,
                reason = %event.reason,
                resources = changed.len(),
                "health changed"
            ),
            Err(e) => tracing::warn!(error = %e, "health event ignored"),
        }
    }
}
