//! The supervisor: wiring and ordered shutdown, nothing else.
//!
//! It builds the state store from what an earlier run left (the CDI spec on disk, the
//! held-device checkpoint), runs the first transition through the [`Reloader`] (the same
//! path every reload takes), then spawns the actors, each on one `TaskTracker` and stopped
//! by a child of the caller's `CancellationToken`:
//!
//! - the reloader (triggers → load/discover → transition → spec → commit);
//! - the plugin manager (one gRPC server per planned resource, registration);
//! - the MPS reconciler, the health monitor, metrics, the ledger, HTTP and the node-labels
//!   writer.
//!
//! Shutdown and resource failures are watched here and never wait behind a reload: the
//! reloader is just another task. The stop has a deadline. The CDI spec is left in place on
//! purpose: containers that already run still reference it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::domain::allocate::HealthUpdate;
use crate::domain::cdi::shares::HookSettings;
use crate::domain::config::Config;
use crate::domain::inventory::{Backend, Inventory};
use crate::domain::plan::Plan;
use crate::platform::checkpoint::Checkpoint;
pub use crate::runtime::error::AppError;
use crate::runtime::error::blocking;
use crate::runtime::plugin::{
    self, Backoff, PluginContext, PluginError, PluginSettings, WatchError,
};
use crate::runtime::reloader::Reloader;
pub use crate::runtime::reloader::{ConfigLoader, ReloadStatus};
use crate::runtime::triggers::{Cause, TriggerSettings, Triggers};
use crate::state::Store;

/// How long an ordered shutdown may take before tasks are abandoned.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);

/// How the daemon reloads.
#[derive(Clone)]
pub struct ReloadSettings {
    /// Re-reads the config; `None`: the config never changes, only the inventory.
    pub load: Option<ConfigLoader>,
    /// What triggers a reload.
    pub triggers: TriggerSettings,
}

impl std::fmt::Debug for ReloadSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadSettings")
            .field("load", &self.load.as_ref().map(|_| "<loader>"))
            .field("triggers", &self.triggers)
            .finish()
    }
}

/// What a started daemon exposes to its embedder (tests, demo).
#[derive(Debug, Clone)]
pub struct Running {
    /// The state store: read snapshots, send health events (`set_health`).
    pub store: Store,
    /// The plan served at start (see `reloads` for the current one).
    pub plan: Arc<Plan>,
    /// The inventory discovered at start.
    pub inventory: Arc<Inventory>,
    /// Ask for a reload (config and inventory).
    pub reload: mpsc::Sender<Cause>,
    /// Outcome of every reload.
    pub reloads: watch::Receiver<ReloadStatus>,
    /// The agent's metrics (the same registry `/metrics` serves).
    pub metrics: Arc<crate::runtime::metrics::Metrics>,
    /// What `/readyz` reports.
    pub readiness: Arc<crate::runtime::http::Readiness>,
    /// The allocation ledger, when a PodResources socket was configured.
    pub ledger: Option<crate::runtime::ledger::Ledger>,
    /// Where the HTTP endpoint listens, when enabled.
    pub http_addr: Option<std::net::SocketAddr>,
    /// The usage sampler's rounds, when sampling is on.
    pub usage: Option<crate::runtime::usage::UsageWatch>,
}

/// Settings of [`run`].
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
    /// Where the held-device checkpoint lives (`--state-dir`); `None`: not persisted.
    pub state_dir: Option<PathBuf>,
    /// Registration retry timing.
    pub backoff: Backoff,
    /// The hook share devices run (default: this executable, system NVML).
    pub hook: Option<HookSettings>,
    /// Told once every actor is started (before registration completes).
    pub on_ready: Option<oneshot::Sender<Running>>,
    /// Health events from outside (embedders, tests). Each is applied with
    /// [`Store::set_health`]; events for unknown devices are logged.
    pub health_events: Option<mpsc::Receiver<HealthUpdate>>,
    /// Live reconfiguration.
    pub reload: ReloadSettings,
    /// MPS control daemon supervision (binary, backoff), used when the plan has MPS shares.
    pub mps: crate::runtime::mps::daemon::SupervisorConfig,
    /// The health monitor (NVML events or sim injection → policy → device state); `None`:
    /// no monitoring.
    pub health_monitor: Option<crate::runtime::health::HealthSettings>,
    /// HTTP endpoint address (`:9400`, `127.0.0.1:0`); `None` serves no HTTP.
    pub http_listen: Option<String>,
    /// PodResources ledger; `None` runs without one.
    pub ledger: Option<crate::runtime::ledger::LedgerSettings>,
    /// The NFD feature file of node labels (`--labels-file`); `None` writes no labels.
    pub labels: Option<crate::runtime::labels::LabelsSettings>,
    /// Metrics registry to record into (injected so embedders can read it).
    pub metrics: Arc<crate::runtime::metrics::Metrics>,
    /// Usage sampling; `None`: off (`--usage-interval 0`).
    pub usage: Option<crate::runtime::usage::UsageSettings>,
    /// Apply `flags.migLayouts` to idle GPUs through NVML (None: never repartition).
    pub mig_layouts: Option<crate::runtime::miglayout::MigLayoutSettings>,
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
            state_dir: None,
            backoff: Backoff::default(),
            hook: None,
            on_ready: None,
            health_events: None,
            reload: ReloadSettings {
                load: None,
                triggers: TriggerSettings::default(),
            },
            mps: crate::runtime::mps::daemon::SupervisorConfig::default(),
            health_monitor: None,
            http_listen: None,
            ledger: None,
            labels: None,
            metrics: Arc::default(),
            usage: None,
            mig_layouts: None,
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
        state_dir,
        backoff,
        hook,
        on_ready,
        health_events,
        reload,
        mps,
        health_monitor,
        http_listen,
        ledger,
        labels,
        metrics,
        usage,
        mig_layouts,
    } = settings;
    let hook = match hook {
        Some(h) => h,
        None => crate::platform::cdi_host::current_exe_hook(None).map_err(|e| {
            AppError::Transition(crate::domain::transition::TransitionError::Cdi(e))
        })?,
    };
    let readiness = Arc::new(crate::runtime::http::Readiness::default());
    // What an earlier run left, read before anything is written.
    let checkpoint = state_dir.map(|dir| Arc::new(Checkpoint::new(dir)));
    let initial = {
        let (checkpoint, cdi_dir, kind) =
            (checkpoint.clone(), cdi_dir.clone(), config.cdi_kind.clone());
        blocking("state loading", move || {
            let held = checkpoint
                .as_deref()
                .map(Checkpoint::load)
                .transpose()?
                .unwrap_or_default();
            if !held.is_empty() {
                tracing::info!(held = held.len(), "held devices read from the checkpoint");
            }
            Ok::<_, AppError>(crate::runtime::reloader::initial(&cdi_dir, &kind, held))
        })
        .await??
    };
    let store = Store::new(initial);
    let (status, status_rx) = watch::channel(ReloadStatus {
        applied: 0,
        unchanged: 0,
        failed: 0,
        last_error: None,
        plan: Arc::default(),
        last_diff: None,
    });
    let reloader = Reloader {
        store: store.clone(),
        backend,
        load: reload.load,
        cdi_dir,
        hook: Some(hook),
        metrics: metrics.clone(),
        status,
    };
    // The first transition: discover, plan, write the spec (held devices kept), commit.
    reloader.start(config).await?;
    let first = store.current();
    readiness
        .spec_written
        .store(first.spec_written, std::sync::atomic::Ordering::Release);

    let stale = plugin::remove_stale_sockets(&device_plugin_dir, &first.resource_names());
    if !stale.is_empty() {
        tracing::info!(sockets = ?stale, "removed sockets of resources no longer planned");
    }
    let tracker = TaskTracker::new();
    let token = shutdown.child_token();
    // One inotify fd (read on the reactor) for the kubelet socket's directory and the
    // config file's.
    let fs = crate::platform::fswatch::DirWatch::new().map_err(|source| {
        AppError::Watch(WatchError::Watch {
            path: kubelet_socket.display().to_string(),
            source,
        })
    })?;
    let watch = plugin::KubeletWatch::start(&kubelet_socket, &fs)?;
    let triggers = Triggers::start(&reload.triggers, &fs, &tracker, &token)?;
    drop(fs);
    let requester = triggers.requester();
    // MPS daemons starting (their replicas Unhealthy until up) before any resource is served.
    let mut mps = crate::runtime::mps::health::Reconciler::new(
        store.clone(),
        mps,
        &tracker,
        token.child_token(),
    );
    mps.reconcile(&first);
    crate::runtime::mps::health::spawn(mps, &tracker, token.clone());
    let (fail_tx, mut fail_rx) = mpsc::channel::<PluginError>(16);
    let ctx = PluginContext {
        settings: Arc::new(PluginSettings {
            device_plugin_dir,
            kubelet_socket,
            backoff,
        }),
        store: store.clone(),
        checkpoint: checkpoint.clone(),
        tracker: tracker.clone(),
        metrics: metrics.clone(),
        readiness: readiness.clone(),
    };
    plugin::spawn_manager(ctx, watch, fail_tx, token.clone());
    tracker.spawn(crate::runtime::metrics::follow_store(
        store.clone(),
        metrics.clone(),
        token.clone(),
    ));
    tracker.spawn(follow_spec(store.clone(), readiness.clone(), token.clone()));
    if let Some(settings) = labels {
        crate::runtime::labels::spawn(settings, store.clone(), &tracker, token.clone());
    }
    let ledger = ledger.map(|settings| {
        let (checkpoint, store_for_release, requester) =
            (checkpoint.clone(), store.clone(), requester.clone());
        let on_release: crate::runtime::ledger::OnRelease = Arc::new(move |_| {
            // The spec may drop devices kept only for the released holders.
            let _ = requester.try_send(Cause::Released);
            if let Some(cp) = checkpoint.clone() {
                let store = store_for_release.clone();
                // Off the async workers; a failure is logged, the next save retries.
                tokio::task::spawn_blocking(move || {
                    if let Err(e) = cp.save_with(|| store.current().held.as_ref().clone()) {
                        tracing::error!(error = %e, "held devices not persisted after release");
                    }
                });
            }
        });
        crate::runtime::ledger::start_for_daemon(
            settings,
            &store,
            on_release,
            metrics.clone(),
            &tracker,
            &token,
        )
    });
    let usage = match usage {
        Some(settings) => Some(
            crate::runtime::usage::spawn(
                settings,
                store.clone(),
                ledger
                    .as_ref()
                    .map(crate::runtime::ledger::Ledger::subscribe),
                metrics.clone(),
                &tracker,
                token.clone(),
            )
            .map_err(AppError::UsageThread)?,
        ),
        None => None,
    };
    let http_addr = match http_listen.as_deref() {
        Some(addr) => {
            let listener = crate::runtime::http::bind(addr).await?;
            let local = crate::runtime::http::local_addr(&listener);
            let serve = crate::runtime::http::serve_with_state(
                listener,
                metrics.clone(),
                readiness.clone(),
                usage.clone(),
                token.clone(),
            );
            tracker.spawn(serve);
            local
        }
        None => None,
    };
    if let Some(settings) = health_monitor {
        crate::runtime::health::spawn(settings, store.clone(), &tracker, token.child_token());
    }
    if let Some(events) = health_events {
        tracker.spawn(apply_health_events(events, store.clone(), token.clone()));
    }
    tracker.spawn(reloader.run(triggers, token.clone()));
    match mig_layouts {
        Some(settings) => {
            tracker.spawn(crate::runtime::miglayout::run(
                settings,
                store.clone(),
                requester.clone(),
                metrics.clone(),
                token.clone(),
            ));
        }
        None if first.config.mig_layouts.is_some() => {
            tracing::warn!(
                "flags.migLayouts is set but the backend cannot change MIG instances (NVML only): ignored"
            );
        }
        None => {}
    }
    if let Some(tx) = on_ready {
        // The embedder may have stopped listening; serving goes on regardless.
        let _ = tx.send(Running {
            store: store.clone(),
            plan: first.plan.clone(),
            inventory: first.inventory.clone(),
            reload: requester,
            reloads: status_rx,
            metrics,
            readiness,
            ledger,
            http_addr,
            usage,
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
    if let Some(e) = failure {
        return Err(e.into());
    }
    if stopped.is_err() {
        return Err(AppError::ShutdownTimeout(SHUTDOWN_DEADLINE));
    }
    tracing::info!("stopped");
    Ok(())
}

/// `/readyz`'s spec flag follows the store: set once a spec for the plan is on disk.
async fn follow_spec(
    store: Store,
    readiness: Arc<crate::runtime::http::Readiness>,
    token: CancellationToken,
) {
    let mut rx = store.subscribe();
    loop {
        let written = rx.borrow_and_update().spec_written;
        readiness
            .spec_written
            .store(written, std::sync::atomic::Ordering::Release);
        tokio::select! {
            () = token.cancelled() => return,
            changed = rx.changed() => if changed.is_err() { return },
        }
    }
}

/// Apply health events until the sender goes away or the daemon stops.
async fn apply_health_events(
    mut events: mpsc::Receiver<HealthUpdate>,
    store: Store,
    token: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            () = token.cancelled() => return,
            event = events.recv() => event,
        };
        let Some(event) = event else { return };
        match store.set_health(&event.key, event.health, &event.reason) {
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
