//! The daemon's wiring: discover → plan → CDI spec → one device-plugin server per resource →
//! registration, then serve until shutdown.
//!
//! Every task runs on one `TaskTracker` and stops through a child of the caller's
//! `CancellationToken`. Shutdown is ordered: servers stop and unlink their sockets, the
//! kubelet watch ends, and the whole stop has a deadline. The CDI spec is left in place on
//! purpose: containers that already run still reference it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::allocate::{DeviceNodes, HealthMap, HealthUpdate};
use crate::config::Config;
use crate::inventory::{Backend, Inventory, InventoryError};
use crate::plan::{Plan, PlanError};
use crate::plugin::{self, Backoff, PluginContext, PluginError, PluginSettings, WatchError};

/// How long an ordered shutdown may take before tasks are abandoned.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);

/// Errors of the daemon.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
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
    /// Write (atomically) the spec for `plan` into `cdi_dir`.
    fn write(
        &self,
        cdi_dir: &Path,
        inventory: &Inventory,
        plan: &Plan,
        config: &Config,
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
    ) -> Result<(), SpecWriterError> {
        tracing::warn!(cdi_dir = %cdi_dir.display(), "no CDI spec writer configured; spec not written");
        Ok(())
    }
}

/// The real writer: generate the spec from the inventory (stat'ing host device nodes under
/// the configured dev root), check it, and write it atomically as `<vendor>-<class>.yaml`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CdiSpecWriter;

impl SpecWriter for CdiSpecWriter {
    fn write(
        &self,
        cdi_dir: &Path,
        inventory: &Inventory,
        _plan: &Plan,
        config: &Config,
    ) -> Result<(), SpecWriterError> {
        let err = |e: crate::cdi::CdiError| SpecWriterError {
            dir: cdi_dir.display().to_string(),
            message: e.to_string(),
        };
        let dev_root = (config.dev_root != Path::new("/")).then(|| config.dev_root.clone());
        let opts = crate::cdi::generate::GenerateOptions {
            kind: config.cdi_kind.clone(),
            dev_root,
        };
        let spec =
            crate::cdi::generate::generate(inventory, &opts, &crate::cdi::generate::HostProbe)
                .map_err(err)?;
        let format = crate::cdi::Format::Yaml;
        let bytes = spec.to_bytes(format).map_err(err)?;
        let name = crate::cdi::spec_file_name(&config.cdi_kind, format);
        let outcome = crate::cdi::writer::write_spec(cdi_dir, &name, &bytes).map_err(err)?;
        tracing::info!(dir = %cdi_dir.display(), file = %name, ?outcome, "CDI spec");
        Ok(())
    }
}

/// What a started daemon exposes to its embedder (tests, demo, the health subsystem).
#[derive(Debug, Clone)]
pub struct Running {
    /// Live device state: call `set_health` to report GPU/MIG health events.
    pub health: HealthMap,
    /// The plan being served.
    pub plan: Arc<Plan>,
    /// The inventory discovered.
    pub inventory: Arc<Inventory>,
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
    /// The health monitor (NVML events or sim injection → policy → device state); `None`:
    /// no monitoring.
    pub health_monitor: Option<crate::health::monitor::HealthSettings>,
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
            spec_writer: Arc::new(CdiSpecWriter),
            on_ready: None,
            health_events: None,
            health_monitor: None,
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
        health_monitor,
    } = settings;
    // NVML discovery blocks: keep it off the async workers.
    let discovered = tokio::task::spawn_blocking(move || backend.discover())
        .await
        .map_err(|e| AppError::Blocking {
            task: "inventory discovery",
            message: e.to_string(),
        })?;
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
        let (inventory, plan, config, dir) = (
            inventory.clone(),
            plan.clone(),
            config.clone(),
            cdi_dir.clone(),
        );
        tokio::task::spawn_blocking(move || spec_writer.write(&dir, &inventory, &plan, &config))
            .await
            .map_err(|e| AppError::Blocking {
                task: "CDI spec writing",
                message: e.to_string(),
            })??;
    }
    let health = HealthMap::new(&plan);
    let watch = plugin::KubeletWatch::start(&kubelet_socket)?;
    let tracker = TaskTracker::new();
    let token = shutdown.child_token();
    let ctx = PluginContext {
        settings: Arc::new(PluginSettings {
            device_plugin_dir,
            kubelet_socket,
            backoff,
        }),
        health: health.clone(),
        config,
        nodes: Arc::new(DeviceNodes::new(&inventory)),
        tracker: tracker.clone(),
    };
    let (fail_tx, mut fail_rx) = mpsc::channel::<PluginError>(plan.resources.len().max(1));
    for resource in health.resource_names() {
        let (ctx, kubelet, token, fail_tx) = (
            ctx.clone(),
            watch.subscribe(),
            token.child_token(),
            fail_tx.clone(),
        );
        tracker.spawn(async move {
            let name = resource.clone();
            if let Err(e) = plugin::run_resource(resource, ctx, kubelet, token).await {
                tracing::error!(resource = %name, error = %e, "resource stopped");
                // Full only if every resource failed already; the first error is enough.
                let _ = fail_tx.try_send(e);
            }
        });
    }
    drop(fail_tx);
    if let Some(settings) = health_monitor {
        let (inventory, health) = (inventory.clone(), health.clone());
        crate::health::monitor::spawn(settings, inventory, health, &tracker, token.child_token());
    }
    if let Some(events) = health_events {
        tracker.spawn(apply_health_events(events, health.clone(), token.clone()));
    }
    if let Some(tx) = on_ready {
        // The embedder may have stopped listening; serving goes on regardless.
        let _ = tx.send(Running {
            health,
            plan: plan.clone(),
            inventory,
        });
    }
    let failure = tokio::select! {
        () = shutdown.cancelled() => None,
        Some(e) = fail_rx.recv() => Some(e),
    };
    tracing::info!("shutting down");
    token.cancel();
    tracker.close();
    let stopped = tokio::time::timeout(SHUTDOWN_DEADLINE, tracker.wait()).await;
    // Resource tasks are gone: the inotify watch can end now.
    drop(watch);
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
