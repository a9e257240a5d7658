//! The reloader: the one actor that changes what the daemon serves.
//!
//! Triggers ([`crate::runtime::triggers`]) → config load and inventory discovery on blocking
//! threads → device-node probe → [`crate::domain::transition::next`] → CDI spec written
//! atomically (every held device kept) → [`Store::commit`]. Every other actor follows the
//! store: plugin servers start and stop with the plan, streams send changed views, the MPS
//! reconciler and metrics follow. Startup runs the same steps once, from the snapshot an
//! earlier run left (spec on disk, held-device checkpoint).
//!
//! It runs as its own task: a slow reload never blocks shutdown or failure handling, and a
//! cancelled reload stops between steps, committing nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::domain::cdi::generate::{NodeInfo, NodeProbe};
use crate::domain::cdi::shares::HookSettings;
use crate::domain::cdi::{self, Format, Spec};
use crate::domain::config::{Config, ConfigError};
use crate::domain::devnodes::DeviceNodes;
use crate::domain::inventory::{Backend, Inventory, InventoryError};
use crate::domain::plan::PlanDiff;
use crate::domain::snapshot::Snapshot;
use crate::domain::transition::{self, Host};
use crate::platform::cdi_host::VisibleProbe;
use crate::platform::cdi_writer;
use crate::platform::fswatch::DirWatch;
use crate::runtime::error::{AppError, SpecWriteError, blocking};
use crate::runtime::metrics::Metrics;
use crate::runtime::triggers::{Cause, Causes, TriggerSettings, Triggers};
use crate::runtime::{Context, Handle};
use crate::state::Store;

/// Loads the config again on reload (file, environment and flags, as at start).
pub(crate) type ConfigLoader = Arc<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// How many times one reload re-runs the transition when Allocate handed out a device of
/// the old plan while the spec was being written (each round keeps what was held then).
const MAX_ROUNDS: usize = 3;

/// What the reloads so far came to; published after each one.
#[derive(Debug, Clone)]
pub(crate) struct ReloadStatus {
    /// Reloads that published a new plan.
    pub(crate) applied: u64,
    /// Reloads that found nothing to change.
    pub(crate) unchanged: u64,
    /// Reloads refused (the previous state kept serving).
    pub(crate) failed: u64,
    /// The last refusal, if the last reload failed.
    pub(crate) last_error: Option<String>,
    /// The plan being served.
    pub(crate) plan: Arc<crate::domain::plan::Plan>,
    /// What the last applied reload changed.
    pub(crate) last_diff: Option<PlanDiff>,
}

/// What the reloader needs: the config served first, how to load it again, what
/// triggers a reload, where the spec goes and the hook its share devices run.
pub(crate) struct ReloaderSettings {
    /// The validated config of the first transition.
    pub(crate) config: Config,
    /// Discovers the inventory.
    pub(crate) backend: Arc<dyn Backend>,
    /// Re-reads the config; `None`: the config never changes, only the inventory.
    pub(crate) load: Option<ConfigLoader>,
    /// What triggers a reload.
    pub(crate) triggers: TriggerSettings,
    /// CDI spec directory.
    pub(crate) cdi_dir: PathBuf,
    /// The hook share devices run.
    pub(crate) hook: HookSettings,
}

impl fmt::Debug for ReloaderSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloaderSettings")
            .field("cdi_dir", &self.cdi_dir)
            .field("load", &self.load.as_ref().map(|_| "<loader>"))
            .field("triggers", &self.triggers)
            .finish_non_exhaustive()
    }
}

/// What the reloader is handed by the supervisor.
#[derive(Debug)]
pub(crate) struct ReloaderPeers {
    /// The daemon's one inotify fd (the config file's directory is watched on it).
    pub(crate) fs: Arc<DirWatch>,
}

/// What a running reloader exposes.
#[derive(Debug, Clone)]
pub(crate) struct Reloads {
    /// Ask for a reload (config and inventory).
    pub(crate) requester: mpsc::Sender<Cause>,
    /// Outcome of every reload.
    pub(crate) status: watch::Receiver<ReloadStatus>,
}

/// Run the first transition (its errors stop the daemon: nothing is served yet), then
/// start the triggers and the task serving them until the daemon stops.
pub(crate) async fn spawn(
    settings: ReloaderSettings,
    peers: ReloaderPeers,
    ctx: &Context,
) -> Result<(Handle<Reloads>, FirstSpec), AppError> {
    let (status, status_rx) = watch::channel(ReloadStatus {
        applied: 0,
        unchanged: 0,
        failed: 0,
        last_error: None,
        plan: Arc::default(),
        last_diff: None,
    });
    let reloader = Reloader {
        store: ctx.store.clone(),
        backend: settings.backend,
        load: settings.load,
        cdi_dir: settings.cdi_dir,
        hook: Some(settings.hook),
        metrics: ctx.metrics.clone(),
        status,
        unkeepable: std::sync::Mutex::default(),
    };
    // The first transition: discover, plan, commit; the spec (held devices kept) is written
    // beside what starts next, and the reloader serves triggers once it is on disk.
    let write = ctx.tracker.spawn(reloader.start(settings.config).await?);
    let token = ctx.child_token();
    let triggers = Triggers::start(&settings.triggers, &peers.fs, &ctx.tracker, &token)?;
    let requester = triggers.requester();
    let (first_tx, first_rx) = oneshot::channel();
    ctx.tracker.spawn(async move {
        // A reload must not race the first write: it would commit (and write) a spec the
        // first write could then overwrite.
        let first = match write.await {
            Ok(result) => result,
            Err(e) => Err(AppError::Blocking {
                task: "CDI spec writing",
                message: e.to_string(),
            }),
        };
        let ok = first.is_ok();
        let _ = first_tx.send(first);
        if ok {
            reloader.run(triggers, token).await;
        }
    });
    Ok((
        Handle::new(Reloads {
            requester,
            status: status_rx,
        }),
        FirstSpec(first_rx),
    ))
}

/// The first spec's write, started by [`spawn`] beside the front-ends: awaited by the
/// supervisor, whose start fails as before when the write does.
#[derive(Debug)]
pub(crate) struct FirstSpec(oneshot::Receiver<Result<(), AppError>>);

impl FirstSpec {
    /// Wait until the first spec is on disk (or its write failed).
    pub(crate) async fn written(self) -> Result<(), AppError> {
        match self.0.await {
            Ok(result) => result,
            // The writer went away: only when the daemon is being stopped.
            Err(_) => Ok(()),
        }
    }
}

/// The reload actor and its dependencies.
pub(crate) struct Reloader {
    pub(crate) store: Store,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) load: Option<ConfigLoader>,
    pub(crate) cdi_dir: PathBuf,
    pub(crate) hook: Option<HookSettings>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) status: watch::Sender<ReloadStatus>,
    /// Held CDI devices already reported as impossible to keep (logged once each).
    pub(crate) unkeepable: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl fmt::Debug for Reloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloader")
            .field("cdi_dir", &self.cdi_dir)
            .field("load", &self.load.as_ref().map(|_| "<loader>"))
            .finish_non_exhaustive()
    }
}

/// The snapshot a run starts from: nothing served yet, the spec an earlier run left in
/// `cdi_dir` (so held devices can be carried over) and the held set it checkpointed.
pub(crate) fn initial(cdi_dir: &Path, kind: &str, held: crate::state::Held) -> Snapshot {
    let name = cdi::spec_file_name(kind, Format::Yaml);
    let path = cdi_dir.join(&name);
    let spec = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| Spec::parse(&text, &path).ok())
        .map(Arc::new);
    Snapshot {
        spec,
        held: Arc::new(held),
        ..Snapshot::default()
    }
}

/// Stat every node the inventory's devices use under the config's dev root (nothing when
/// the dev root is `/`: the spec then names container paths only).
fn probe_nodes(nodes: &DeviceNodes, config: &Config) -> BTreeMap<PathBuf, NodeInfo> {
    if config.dev_root == Path::new("/") {
        return BTreeMap::new();
    }
    let probe = VisibleProbe::new(&config.driver_root, config.container_driver_root.as_deref());
    nodes
        .all_paths()
        .into_iter()
        .filter_map(|p| {
            let host = config.dev_root.join(p.trim_start_matches('/'));
            probe.probe(&host).map(|info| (host, info))
        })
        .collect()
}

impl Reloader {
    /// The first transition, from the snapshot an earlier run left. Its errors stop the
    /// daemon (nothing is served yet). With `failOnInitError: false` a node whose driver
    /// cannot be initialised serves nothing instead of crash-looping, as NVIDIA's plugin.
    async fn start(
        &self,
        config: Config,
    ) -> Result<impl Future<Output = Result<(), AppError>> + Send + 'static, AppError> {
        let backend = self.backend.clone();
        let discovered = blocking("inventory discovery", move || backend.discover()).await?;
        let (inventory, no_driver) = match discovered {
            Ok(inventory) => (inventory, false),
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
        let current = self.store.current();
        let next = self
            .next(&current, Arc::new(config), Arc::new(inventory), no_driver)
            .await?;
        // Committed before the spec is written: the plugin servers start and register while
        // the spec is made durable, and serve nothing from this plan until it is (see
        // `Snapshot::spec_pending`). Nothing can be handed out before that, so the write
        // needs no second round for devices handed out meanwhile.
        let spec = next.state.spec.clone();
        let kept = next.state.kept.clone();
        let snapshot = self.store.commit_before_write(next.state);
        self.metrics.record_skipped(&snapshot.skipped);
        tracing::info!(
            source = %snapshot.inventory.source,
            gpus = snapshot.inventory.gpus.len(),
            resources = next.diff.added.len(),
            "plan built"
        );
        self.status.send_modify(|s| s.plan = snapshot.plan.clone());
        let (store, dir, generation) = (
            self.store.clone(),
            self.cdi_dir.clone(),
            snapshot.generation,
        );
        let unkeepable = missing_held(&snapshot);
        if !unkeepable.is_empty() {
            self.report_unkeepable(unkeepable);
        }
        Ok(async move {
            if let Some(spec) = spec {
                blocking("CDI spec writing", move || write(&dir, &spec, &kept)).await??;
            }
            store.spec_now_written(generation);
            Ok(())
        })
    }

    /// Serve reload triggers until `token` is cancelled. A reload in progress is abandoned
    /// (between steps, before its commit) when the token fires.
    async fn run(self, mut triggers: Triggers, token: CancellationToken) {
        loop {
            let causes = tokio::select! {
                biased;
                () = token.cancelled() => return,
                causes = triggers.next() => match causes {
                    Some(c) => c,
                    None => return,
                },
            };
            let result = tokio::select! {
                biased;
                () = token.cancelled() => {
                    tracing::info!(cause = causes.label(), "reload abandoned: shutting down");
                    return;
                }
                result = self.reload(causes) => result,
            };
            self.report(causes, result);
        }
    }

    /// Load and/or discover as `causes` ask, then apply; on any error the store is untouched.
    async fn reload(&self, causes: Causes) -> Result<Option<PlanDiff>, AppError> {
        let current = self.store.current();
        let config = match (&self.load, causes.config) {
            (Some(load), true) => {
                let load = load.clone();
                Arc::new(blocking("config loading", move || load()).await??)
            }
            _ => current.config.clone(),
        };
        let inventory = if causes.inventory {
            let backend = self.backend.clone();
            Arc::new(blocking("inventory discovery", move || backend.discover()).await??)
        } else {
            current.inventory.clone()
        };
        let kept_released = causes.held && held_shrank_below_spec(&current);
        if config == current.config && inventory == current.inventory && !kept_released {
            return Ok(None);
        }
        self.apply(config, inventory, false).await.map(Some)
    }

    /// Transition, write the spec, commit; again (at most [`MAX_ROUNDS`]) if a device of the
    /// old plan was handed out meanwhile, so the committed spec has every held device.
    async fn apply(
        &self,
        config: Arc<Config>,
        inventory: Arc<Inventory>,
        no_driver: bool,
    ) -> Result<PlanDiff, AppError> {
        let mut first_diff = None;
        for _ in 0..MAX_ROUNDS {
            let current = self.store.current();
            let next = self
                .next(&current, config.clone(), inventory.clone(), no_driver)
                .await?;
            if let Some(spec) = next.state.spec.clone() {
                let (dir, kept) = (self.cdi_dir.clone(), next.state.kept.clone());
                blocking("CDI spec writing", move || write(&dir, &spec, &kept)).await??;
            }
            let committed = self.store.commit(next.state);
            self.metrics.record_skipped(&committed.skipped);
            first_diff.get_or_insert(next.diff);
            let missing = missing_held(&committed);
            if missing.is_empty() {
                break;
            }
            // Held before this round and still missing: neither this node nor the previous
            // spec has them (a checkpoint from another node, a GPU swapped). A rewrite
            // cannot add them; say so once instead of retrying.
            let known = current.held.cdi_names();
            let (unkeepable, handed_out): (Vec<String>, Vec<String>) =
                missing.into_iter().partition(|n| known.contains(n));
            self.report_unkeepable(unkeepable);
            if handed_out.is_empty() {
                break;
            }
            tracing::info!("a device was handed out during the reload; writing the spec again");
        }
        Ok(first_diff.unwrap_or_default())
    }

    /// Device nodes, their probe and the driver's spec edits, then the transition from
    /// `current`: what the next spec and plan are (nothing written or committed).
    async fn next(
        &self,
        current: &Snapshot,
        config: Arc<Config>,
        inventory: Arc<Inventory>,
        no_driver: bool,
    ) -> Result<transition::Next, AppError> {
        {
            let devices = Arc::new(transition::device_nodes(&inventory, no_driver)?);
            let host = {
                let (devs, cfg, inv) = (devices.clone(), config.clone(), inventory.clone());
                let equip = !no_driver && cdi::equips_driver(&inventory, &config.driver_root);
                let hook = self
                    .hook
                    .as_ref()
                    .map(|h| h.path.clone())
                    .unwrap_or_default();
                // One trip to a blocking thread for both: each trip is a thread hand-off,
                // which a busy node pays for in scheduling delay on the start path.
                let (nodes, driver) =
                    blocking("device node probe and driver discovery", move || {
                        let nodes = probe_nodes(&devs, &cfg);
                        let driver = if equip {
                            crate::platform::driver::spec_edits(
                                &cfg,
                                inv.driver_version.as_deref(),
                                &[],
                                &hook,
                            )?
                            .map(|(_, edits)| edits)
                        } else {
                            None
                        };
                        Ok::<_, crate::platform::driver::DriverError>((nodes, driver))
                    })
                    .await??;
                Host {
                    nodes,
                    hook: self.hook.clone(),
                    driver,
                    no_driver,
                }
            };
            let next = transition::next(current, config.clone(), inventory, devices, &host)?;
            crate::runtime::report::log_skipped(&config.source, &next.state.skipped);
            Ok(next)
        }
    }

    /// Log, once per name for the life of the daemon, held CDI devices no spec can carry.
    fn report_unkeepable(&self, names: Vec<String>) {
        let mut reported = self
            .unkeepable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let new: Vec<String> = names
            .into_iter()
            .filter(|n| reported.insert(n.clone()))
            .collect();
        if !new.is_empty() {
            tracing::warn!(
                devices = ?new,
                "held devices (from the checkpoint) are neither on this node nor in the previous CDI spec: the spec cannot keep them"
            );
        }
    }

    fn report(&self, causes: Causes, result: Result<Option<PlanDiff>, AppError>) {
        if causes.config || result.is_err() {
            self.metrics.record_reload(result.is_ok());
        }
        let plan = self.store.current().plan.clone();
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

/// Held CDI device names the committed spec lacks.
fn missing_held(committed: &Snapshot) -> Vec<String> {
    let Some(spec) = &committed.spec else {
        return Vec::new();
    };
    let have: std::collections::BTreeSet<&str> =
        spec.devices.iter().map(|d| d.name.as_str()).collect();
    committed
        .held
        .cdi_names()
        .into_iter()
        .filter(|n| !have.contains(n.as_str()))
        .collect()
}

/// Whether the spec carries a device only because it was held and nothing holds it now:
/// then a rewrite drops it.
fn held_shrank_below_spec(current: &Snapshot) -> bool {
    let held = current.held.cdi_names();
    current.kept.iter().any(|name| !held.contains(name))
}

/// Write `spec` as `<vendor>-<class>.yaml` in `dir`.
fn write(dir: &Path, spec: &Spec, kept: &[String]) -> Result<(), AppError> {
    let err = |e: cdi::CdiError| {
        AppError::Spec(SpecWriteError {
            dir: dir.display().to_string(),
            source: Box::new(e),
        })
    };
    let format = Format::Yaml;
    let name = cdi::spec_file_name(&spec.kind, format);
    let bytes = spec.to_bytes(format).map_err(err)?;
    let outcome = cdi_writer::write_spec(dir, &name, &bytes).map_err(err)?;
    if !kept.is_empty() {
        tracing::info!(devices = ?kept, "CDI devices kept for running containers");
    }
    tracing::info!(dir = %dir.display(), file = %name, ?outcome, kept = kept.len(), "CDI spec");
    Ok(())
}

#[cfg(test)]
mod reload_tests;
