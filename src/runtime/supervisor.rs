//! The supervisor: wiring and ordered shutdown, nothing else.
//!
//! It builds the state store from what an earlier run left (the CDI spec on disk, the
//! held-device checkpoint), runs the first transition through the [`Reloader`](crate::runtime::reloader::Reloader) (the same
//! path every reload takes), then spawns the actors, each on one `TaskTracker` and stopped
//! by a child of the caller's `CancellationToken`:
//!
//! - the reloader (triggers → load/discover → transition → spec → commit);
//! - the front-end ([`FrontEnd`]): the plugin manager (one gRPC server per planned
//!   resource, registration), or in DRA mode ([`RunSettings::dra`]) the DRA driver over the
//!   same store, never both; each owns its readiness, Events and failures;
//! - the MPS reconciler, the health monitor, metrics, the ledger, HTTP, the node-labels
//!   writer (file and, with `--labels-to-node`, Node) and, with `--config-dir`, the fleet actor (Node labels → config, state back).
//!
//! Shutdown and the front-end's failures are watched here and never wait behind a reload:
//! the reloader is just another task. The stop has a deadline. The CDI spec is left in place on
//! purpose: containers that already run still reference it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::domain::allocate::HealthUpdate;
use crate::domain::cdi::shares::HookSettings;
use crate::domain::config::Config;
use crate::domain::inventory::{Backend, Inventory};
use crate::domain::plan::Plan;
use crate::platform::checkpoint::Checkpoint;
use crate::platform::versioned::Decoded;
pub(crate) use crate::runtime::error::AppError;
use crate::runtime::error::blocking;
use crate::runtime::front_end::{FrontEnd, FrontEndPeers, FrontEndSettings};
use crate::runtime::held::HeldCheckpoint;
use crate::runtime::http::{self, HttpPeers, Readiness};
use crate::runtime::ledger::{Ledger, LedgerPeers};
use crate::runtime::miglayout::MigLayoutPeers;
use crate::runtime::plugin::{Backoff, PluginSettings, WatchError};
use crate::runtime::reloader::{self, ReloaderPeers, ReloaderSettings, Reloads};
pub(crate) use crate::runtime::reloader::{ConfigLoader, ReloadStatus};
use crate::runtime::triggers::{Cause, TriggerSettings};
use crate::runtime::usage::UsagePeers;
use crate::runtime::{Context, Handle};
use crate::state::Store;

/// How long an ordered shutdown may take before tasks are abandoned.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);

/// How the daemon reloads.
#[derive(Clone)]
pub(crate) struct ReloadSettings {
    /// Re-reads the config; `None`: the config never changes, only the inventory.
    pub(crate) load: Option<ConfigLoader>,
    /// What triggers a reload.
    pub(crate) triggers: TriggerSettings,
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
pub(crate) struct Running {
    /// The plan served at start (see `reloads` for the current one).
    pub(crate) plan: Arc<Plan>,
    /// The inventory discovered at start.
    pub(crate) inventory: Arc<Inventory>,
    /// Outcome of every reload.
    pub(crate) reloads: watch::Receiver<ReloadStatus>,
    /// Handles into the live actors, read through [`Running::probe`].
    probe: Probe,
}

impl Running {
    /// Handles into the live daemon (its store, reload requests, metrics, ledger, HTTP
    /// address, usage rounds), for an embedder that watches it closely: the tests.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "only tests watch the daemon this closely")
    )]
    pub(crate) fn probe(&self) -> &Probe {
        &self.probe
    }
}

/// Handles into a started daemon's actors (see [`Running::probe`]). The daemon itself
/// talks to its actors through their peers, never through these.
#[derive(Debug, Clone)]
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "only tests watch the daemon this closely")
)]
pub(crate) struct Probe {
    /// The state store: read snapshots, send health events (`set_health`).
    pub(crate) store: Store,
    /// Ask for a reload (config and inventory).
    pub(crate) reload: mpsc::Sender<Cause>,
    /// The agent's metrics (the same registry `/metrics` serves).
    pub(crate) metrics: Arc<crate::runtime::metrics::Metrics>,
    /// The allocation ledger, when a PodResources socket was configured.
    pub(crate) ledger: Option<Ledger>,
    /// Where the HTTP endpoint listens, when enabled.
    pub(crate) http_addr: Option<std::net::SocketAddr>,
    /// The usage sampler's rounds, when sampling is on.
    pub(crate) usage: Option<crate::runtime::usage::UsageWatch>,
}

/// Settings of [`run`].
#[derive(Debug)]
pub(crate) struct RunSettings {
    /// Validated config.
    pub(crate) config: Config,
    /// Plugin socket directory.
    pub(crate) device_plugin_dir: PathBuf,
    /// The kubelet's registration socket.
    pub(crate) kubelet_socket: PathBuf,
    /// CDI spec directory.
    pub(crate) cdi_dir: PathBuf,
    /// Where the held-device checkpoint lives (`--state-dir`); `None`: not persisted.
    pub(crate) state_dir: Option<PathBuf>,
    /// Registration retry timing.
    pub(crate) backoff: Backoff,
    /// The hook share devices run (default: this executable, system NVML).
    pub(crate) hook: Option<HookSettings>,
    /// Told once every actor is started (before registration completes).
    pub(crate) on_ready: Option<oneshot::Sender<Running>>,
    /// Health events from outside (embedders, tests). Each is applied with
    /// [`Store::set_health`]; events for unknown devices are logged.
    pub(crate) health_events: Option<mpsc::Receiver<HealthUpdate>>,
    /// Live reconfiguration.
    pub(crate) reload: ReloadSettings,
    /// MPS control daemon supervision (binary, backoff), used when the plan has MPS shares.
    pub(crate) mps: crate::runtime::mps::daemon::SupervisorConfig,
    /// The health monitor (NVML events or sim injection → policy → device state); `None`:
    /// no monitoring.
    pub(crate) health_monitor: Option<crate::runtime::health::HealthSettings>,
    /// HTTP endpoint address (`:9400`, `127.0.0.1:0`); `None` serves no HTTP.
    pub(crate) http_listen: Option<String>,
    /// PodResources ledger; `None` runs without one.
    pub(crate) ledger: Option<crate::runtime::ledger::LedgerSettings>,
    /// The NFD feature file of node labels (`--labels-file`); `None` writes no labels.
    pub(crate) labels: Option<crate::runtime::labels::LabelsSettings>,
    /// `--labels-to-node`: the same labels patched onto the agent's Node; `None`: off.
    pub(crate) node_labels: Option<crate::runtime::node_labels::NodeLabelsSettings>,
    /// Metrics registry to record into (injected so embedders can read it).
    pub(crate) metrics: Arc<crate::runtime::metrics::Metrics>,
    /// Usage sampling; `None`: off (`--usage-interval 0`).
    pub(crate) usage: Option<crate::runtime::usage::UsageSettings>,
    /// Apply `flags.migLayouts` to idle GPUs through NVML (None: never repartition).
    pub(crate) mig_layouts: Option<crate::runtime::miglayout::MigLayoutSettings>,
    /// DRA mode: serve the GPUs through the DRA driver instead of device-plugin servers;
    /// `None`: device-plugin mode.
    pub(crate) dra: Option<crate::runtime::dra::DraModeSettings>,
    /// Fleets as code (`--config-dir`): follow the Node's labels, report on it; `None`: off.
    pub(crate) fleet: Option<crate::runtime::fleet::FleetSettings>,
}

impl RunSettings {
    /// Settings for a device-plugin directory, with the kubelet socket inside it.
    pub(crate) fn new(
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
            node_labels: None,
            metrics: Arc::default(),
            usage: None,
            mig_layouts: None,
            dra: None,
            fleet: None,
        }
    }
}

/// Run the daemon until `shutdown` is cancelled (or a resource fails).
pub(crate) async fn run(
    settings: RunSettings,
    backend: Arc<dyn Backend>,
    shutdown: CancellationToken,
) -> Result<(), AppError> {
    let hook = match settings.hook.clone() {
        Some(h) => h,
        None => crate::platform::cdi_host::current_exe_hook(None).map_err(|e| {
            AppError::Transition(crate::domain::transition::TransitionError::Cdi(e))
        })?,
    };
    // What an earlier run left, read before anything is written.
    let checkpoint = settings
        .state_dir
        .clone()
        .map(|dir| Arc::new(Checkpoint::new(dir)));
    let initial = load_state(checkpoint.clone(), &settings.cdi_dir, &settings.config).await?;
    let ctx = Context {
        store: Store::new(initial),
        metrics: settings.metrics.clone(),
        tracker: TaskTracker::new(),
        token: shutdown.child_token(),
    };
    let held = HeldCheckpoint::new(checkpoint, ctx.store.clone());
    let started = spawn_actors(settings, backend, hook, held, &ctx).await;
    let (front, on_ready, running) = match started {
        Ok(started) => started,
        Err(e) => {
            // Whatever started before the failure stops with it.
            stop(&ctx).await;
            return Err(e);
        }
    };
    if let Some(tx) = on_ready {
        // The embedder may have stopped listening; serving goes on regardless.
        let _ = tx.send(running);
    }
    wait_and_stop(&ctx, &shutdown, front).await
}

/// The state store's first snapshot: the spec an earlier run left in `cdi_dir` and the
/// held set it checkpointed.
async fn load_state(
    checkpoint: Option<Arc<Checkpoint>>,
    cdi_dir: &std::path::Path,
    config: &Config,
) -> Result<crate::state::Snapshot, AppError> {
    let (cdi_dir, kind) = (cdi_dir.to_path_buf(), config.cdi_kind.clone());
    blocking("state loading", move || {
        let held = match checkpoint.as_deref().map(|c| (c, c.load())) {
            None => crate::domain::snapshot::Held::default(),
            Some((c, loaded)) => match loaded? {
                Decoded::Current(held) => held,
                Decoded::Legacy(held) => {
                    // Written back now, so a crash before the first Allocate cannot leave
                    // the old schema behind for a newer release to meet.
                    c.save_with(|| held.clone())?;
                    tracing::info!(
                        from = 1,
                        to = crate::platform::versioned::SCHEMA,
                        held = held.len(),
                        "held-device checkpoint rewritten in this release's schema"
                    );
                    held
                }
            },
        };
        if !held.is_empty() {
            tracing::info!(held = held.len(), "held devices read from the checkpoint");
        }
        Ok::<_, AppError>(crate::runtime::reloader::initial(&cdi_dir, &kind, held))
    })
    .await?
}

/// Start every actor in order: the reloader's first transition, then the MPS daemons
/// (their replicas Unhealthy until up) before any resource is served, the front-end, and
/// the followers. Returns the front-end, the embedder's channel and what it is told.
async fn spawn_actors(
    settings: RunSettings,
    backend: Arc<dyn Backend>,
    hook: HookSettings,
    held: HeldCheckpoint,
    ctx: &Context,
) -> Result<(FrontEnd, Option<oneshot::Sender<Running>>, Running), AppError> {
    // One inotify fd (read on the reactor) for the kubelet socket's directory and the
    // config file's.
    let fs = crate::platform::fswatch::DirWatch::new().map_err(|source| {
        AppError::Watch(WatchError::Watch {
            path: settings.kubelet_socket.display().to_string(),
            source,
        })
    })?;
    let reloader = ReloaderSettings {
        config: settings.config,
        backend,
        load: settings.reload.load,
        triggers: settings.reload.triggers,
        cdi_dir: settings.cdi_dir,
        hook,
    };
    let (reloads, first_spec) =
        reloader::spawn(reloader, ReloaderPeers { fs: fs.clone() }, ctx).await?;
    crate::runtime::mps::health::spawn(settings.mps, ctx);
    let readiness = Arc::new(Readiness::following(ctx.store.clone()));
    let front = match settings.dra {
        Some(dra) => FrontEndSettings::Dra(Box::new(dra)),
        None => FrontEndSettings::Plugin(PluginSettings {
            device_plugin_dir: settings.device_plugin_dir,
            kubelet_socket: settings.kubelet_socket,
            backoff: settings.backoff,
        }),
    };
    let peers = FrontEndPeers {
        fs,
        held: held.clone(),
        readiness: readiness.clone(),
    };
    let front = FrontEnd::start(front, peers, first_spec, ctx).await?;
    let followers = Followers {
        labels: settings.labels,
        node_labels: settings.node_labels,
        ledger: settings.ledger,
        dra_pool: front.dra_pool(),
        dra_view: front.dra_view(),
        usage: settings.usage,
        http_listen: settings.http_listen,
        health_monitor: settings.health_monitor,
        health_events: settings.health_events,
        mig_layouts: settings.mig_layouts,
        fleet: settings.fleet,
    };
    let running = followers
        .spawn(held, readiness, reloads.get().clone(), ctx)
        .await?;
    Ok((front, settings.on_ready, running))
}

/// The actors that follow the store once resources are served, each optional.
struct Followers {
    labels: Option<crate::runtime::labels::LabelsSettings>,
    node_labels: Option<crate::runtime::node_labels::NodeLabelsSettings>,
    ledger: Option<crate::runtime::ledger::LedgerSettings>,
    dra_pool: Option<crate::runtime::ledger::DraPool>,
    /// The DRA driver's prepared claims, for `/v1/state`.
    dra_view: Option<watch::Receiver<Arc<crate::domain::usage::DraReport>>>,
    usage: Option<crate::runtime::usage::UsageSettings>,
    http_listen: Option<String>,
    health_monitor: Option<crate::runtime::health::HealthSettings>,
    health_events: Option<mpsc::Receiver<HealthUpdate>>,
    mig_layouts: Option<crate::runtime::miglayout::MigLayoutSettings>,
    fleet: Option<crate::runtime::fleet::FleetSettings>,
}

impl Followers {
    /// Start them; returns what the embedder is told.
    async fn spawn(
        self,
        held: HeldCheckpoint,
        readiness: Arc<Readiness>,
        reloads: Reloads,
        ctx: &Context,
    ) -> Result<Running, AppError> {
        spawn_metrics(ctx);
        if let Some(settings) = self.labels {
            crate::runtime::labels::spawn(settings, ctx);
        }
        if let Some(settings) = self.node_labels {
            crate::runtime::node_labels::spawn(settings, ctx);
        }
        let ledger = self.ledger.map(|settings| {
            let peers = LedgerPeers {
                held: Some(held),
                reload: Some(reloads.requester.clone()),
                dra: self.dra_pool,
            };
            crate::runtime::ledger::spawn(settings, peers, ctx).into_inner()
        });
        let usage = match self.usage {
            Some(settings) => {
                let peers = UsagePeers {
                    ledger: ledger.as_ref().map(Ledger::subscribe),
                    dra: self.dra_view,
                };
                let handle = crate::runtime::usage::spawn(settings, peers, ctx)
                    .map_err(AppError::UsageThread)?;
                Some(handle.into_inner())
            }
            None => None,
        };
        let http_addr = match self.http_listen.as_deref() {
            Some(addr) => {
                let listener = http::bind(addr).await?;
                let peers = HttpPeers {
                    readiness: readiness.clone(),
                    usage: usage.clone(),
                };
                http::spawn(listener, peers, ctx).into_inner()
            }
            None => None,
        };
        if let Some(settings) = self.health_monitor {
            crate::runtime::health::spawn(settings, ctx);
        }
        if let Some(events) = self.health_events {
            crate::runtime::health::spawn_external(events, ctx);
        }
        let mig = spawn_mig_layouts(self.mig_layouts, &reloads, ctx);
        if let Some(settings) = self.fleet {
            let peers = crate::runtime::fleet::FleetPeers {
                reload: reloads.requester.clone(),
                reloads: reloads.status.clone(),
                mig,
            };
            crate::runtime::fleet::spawn(settings, peers, ctx);
        }
        let first = ctx.store.current();
        Ok(Running {
            plan: first.plan.clone(),
            inventory: first.inventory.clone(),
            reloads: reloads.status,
            probe: Probe {
                store: ctx.store.clone(),
                reload: reloads.requester,
                metrics: ctx.metrics.clone(),
                ledger,
                http_addr,
                usage,
            },
        })
    }
}

/// Mirror every resource's view into the metrics as the store changes.
fn spawn_metrics(ctx: &Context) -> Handle {
    let token = ctx.child_token();
    ctx.tracker.spawn(crate::runtime::metrics::follow_store(
        ctx.store.clone(),
        ctx.metrics.clone(),
        token,
    ));
    Handle::new(())
}

/// The MIG layout actor, when the backend can change MIG instances.
fn spawn_mig_layouts(
    settings: Option<crate::runtime::miglayout::MigLayoutSettings>,
    reloads: &Reloads,
    ctx: &Context,
) -> Option<tokio::sync::watch::Receiver<Option<crate::runtime::miglayout::MigReport>>> {
    match settings {
        Some(settings) => {
            let peers = MigLayoutPeers {
                rescan: reloads.requester.clone(),
            };
            Some(crate::runtime::miglayout::spawn(settings, peers, ctx).into_inner())
        }
        None if ctx.store.current().config.mig_layouts.is_some() => {
            tracing::warn!(
                "flags.migLayouts is set but the backend cannot change MIG instances (NVML only): ignored"
            );
            None
        }
        None => None,
    }
}

/// Serve until `shutdown` is cancelled or the front-end fails, then stop every actor within
/// [`SHUTDOWN_DEADLINE`].
async fn wait_and_stop(
    ctx: &Context,
    shutdown: &CancellationToken,
    mut front: FrontEnd,
) -> Result<(), AppError> {
    let failure = tokio::select! {
        () = shutdown.cancelled() => None,
        e = front.failed() => Some(e),
    };
    tracing::info!("shutting down");
    let stopped = stop(ctx).await;
    if let Some(e) = failure {
        return Err(e);
    }
    if !stopped {
        return Err(AppError::ShutdownTimeout(SHUTDOWN_DEADLINE));
    }
    tracing::info!("stopped");
    Ok(())
}

/// Cancel every actor and wait for their tasks; false when the deadline passed first.
async fn stop(ctx: &Context) -> bool {
    ctx.token.cancel();
    ctx.tracker.close();
    tokio::time::timeout(SHUTDOWN_DEADLINE, ctx.tracker.wait())
        .await
        .is_ok()
}
