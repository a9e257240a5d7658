//! The MIG layout actor: takes idle GPUs to the layout `flags.migLayouts` names, live.
//!
//! It follows the store (a config change, a release of held devices) and a timer. Each
//! round reads the layout file and every GPU's instances through NVML
//! ([`crate::platform::mig`]) and plans each GPU ([`crate::domain::miglayout`]). A GPU that
//! needs steps is repartitioned only when idle: none of its devices held (the store's held
//! set: Allocate answers, pruned by the PodResources ledger) and no compute process on it
//! (NVML). Then:
//!
//! 1. the GPU is drained in the store (`Store::drain`, apart from health events): its devices
//!    leave ListAndWatch and are refused by Allocate with reason `mig-layout-applying`, so
//!    nothing new lands;
//! 2. idleness is checked again (an Allocate may have raced step 1);
//! 3. the steps run (a failed step rolls the GPU back, [`crate::platform::mig::apply`]);
//! 4. a re-scan is requested from the reloader and awaited, so the transition plans the new
//!    MIG devices and the spec names them; only then is the GPU marked healthy again, so no
//!    device that no longer exists is ever advertised as allocatable.
//!
//! Other GPUs are never touched. A GPU that is busy, whose MIG mode differs from the
//! layout's (changing it needs a reset, which is never done) or whose steps failed is
//! pending: logged when its reason changes, `gpu_slicer_mig_layout_pending{gpu}` = 1, and
//! retried next round. `/readyz` is not affected. A GPU whose MIG devices DRA claims make
//! (`flags.dra.dynamicMig`) is never repartitioned: it stays pending while the layout wants
//! it changed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nvml_wrapper::Nvml;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::domain::config::MigLayouts;
use crate::domain::fleet::MigOutcome;
use crate::domain::miglayout::{GpuPlan, PlanStatus};
use crate::platform::mig::{self as ops, MigGpu};
use crate::runtime::error::blocking;
use crate::runtime::metrics::{GpuLabels, Metrics};
use crate::runtime::triggers::Cause;
use crate::runtime::{Context, Handle};
use crate::state::Store;

/// Why a round failed, or why a GPU stays pending (its reason is this error's message).
#[derive(Debug, thiserror::Error)]
pub(crate) enum MigLayoutRunError {
    /// The layout file could not be read or planned from.
    #[error(transparent)]
    Layout(Box<crate::domain::miglayout::MigLayoutError>),
    /// NVML could not be opened.
    #[error(transparent)]
    Open(#[from] crate::domain::inventory::InventoryError),
    /// Reading the GPUs' instances or their processes failed.
    #[error(transparent)]
    Read(#[from] ops::MigOpError),
    /// The steps failed (and were rolled back as far as NVML allowed).
    #[error(transparent)]
    Apply(Box<ops::ApplyFailure>),
    /// A blocking NVML task did not complete.
    #[error(transparent)]
    Task(Box<crate::runtime::error::AppError>),
    /// Devices of the GPU are held by containers.
    #[error("devices of this GPU are allocated")]
    Held,
    /// Compute processes run on the GPU.
    #[error("compute processes run on it (pids {0:?})")]
    Processes(Vec<u32>),
}

impl From<crate::domain::miglayout::MigLayoutError> for MigLayoutRunError {
    fn from(e: crate::domain::miglayout::MigLayoutError) -> Self {
        Self::Layout(Box::new(e))
    }
}

impl From<crate::runtime::error::AppError> for MigLayoutRunError {
    fn from(e: crate::runtime::error::AppError) -> Self {
        Self::Task(Box::new(e))
    }
}

/// How the actor reaches NVML and how often it retries pending GPUs.
#[derive(Debug, Clone)]
pub(crate) struct MigLayoutSettings {
    /// The NVML library (`--nvml-lib`), `None` for the system's.
    pub(crate) nvml_lib: Option<PathBuf>,
    /// Retry interval for pending GPUs (a release also wakes it).
    pub(crate) interval: Duration,
}

/// Reason code a drained GPU's devices carry while it is repartitioned (a short code: it is
/// also the `reason` label of `gpu_slicer_device_healthy`).
const DRAIN_REASON: &str = "mig-layout-applying";
/// How long to wait for the re-scan that advertises a new layout.
const RESCAN_WAIT: Duration = Duration::from_secs(30);

/// What the actor is handed by the supervisor.
#[derive(Debug, Clone)]
pub(crate) struct MigLayoutPeers {
    /// Asks the reloader for the re-scan that advertises a new layout.
    pub(crate) rescan: mpsc::Sender<Cause>,
}

/// Where the layout in force stands after the last round (the Node's
/// `nvidia.com/mig.config.state`, [`crate::runtime::fleet`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MigReport {
    /// The layout the round applied (`flags.migLayouts.layout`, or the Node's label).
    pub(crate) layout: String,
    /// Every GPU in it (success), some waiting (pending), or the layout unusable (failed).
    pub(crate) outcome: MigOutcome,
    /// Why pending or failed.
    pub(crate) detail: Option<String>,
}

/// Start the actor; it runs until the daemon stops, and exposes each round's
/// [`MigReport`] (`None` while no layout is configured).
pub(crate) fn spawn(
    settings: MigLayoutSettings,
    peers: MigLayoutPeers,
    ctx: &Context,
) -> Handle<watch::Receiver<Option<MigReport>>> {
    let token = ctx.child_token();
    let (tx, rx) = watch::channel(None);
    ctx.tracker.spawn(run(
        settings,
        ctx.store.clone(),
        peers.rescan,
        (ctx.metrics.clone(), tx),
        token,
    ));
    Handle::new(rx)
}

/// Run until `token` is cancelled.
async fn run(
    settings: MigLayoutSettings,
    store: Store,
    rescan: mpsc::Sender<Cause>,
    (metrics, report): (Arc<Metrics>, watch::Sender<Option<MigReport>>),
    token: CancellationToken,
) {
    let mut changes = store.subscribe();
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reasons: BTreeMap<String, String> = BTreeMap::new();
    loop {
        tokio::select! {
            biased;
            () = token.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
        }
        let Some(layouts) = store.current().config.mig_layouts.clone() else {
            metrics.mig_layout_pending.clear();
            reasons.clear();
            report.send_if_modified(|r| r.take().is_some());
            continue;
        };
        let round = tokio::select! {
            biased;
            () = token.cancelled() => return,
            r = round(&settings, &layouts, &store, &rescan) => r,
        };
        let publish = |outcome, detail: Option<&String>| {
            let next = Some(MigReport {
                layout: layouts.layout.clone(),
                outcome,
                detail: detail.cloned(),
            });
            report.send_if_modified(|r| std::mem::replace(r, next.clone()) != next);
        };
        let pending = match round {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, file = %layouts.file.display(), layout = %layouts.layout, "MIG layout not applied");
                publish(MigOutcome::Failed, Some(&e.to_string()));
                continue;
            }
        };
        match pending
            .iter()
            .find_map(|(uuid, r)| r.as_ref().map(|r| (uuid, r)))
        {
            Some((uuid, r)) => publish(MigOutcome::Pending, Some(&format!("GPU {uuid}: {r}"))),
            None => publish(MigOutcome::Success, None),
        }
        for (uuid, reason) in &pending {
            let value = i64::from(reason.is_some());
            metrics
                .mig_layout_pending
                .get_or_create(&GpuLabels { gpu: uuid.clone() })
                .set(value);
            match reason {
                Some(r) if reasons.get(uuid) != Some(r) => {
                    tracing::warn!(gpu = %uuid, reason = %r, layout = %layouts.layout, "MIG layout pending");
                    reasons.insert(uuid.clone(), r.clone());
                }
                Some(_) => {}
                None => {
                    reasons.remove(uuid);
                }
            }
        }
        // Changes this round made (health, held) must not wake the next one at once.
        changes.borrow_and_update();
    }
}

/// One pass over every GPU: GPU UUID → pending reason (None: in its layout now).
async fn round(
    settings: &MigLayoutSettings,
    layouts: &MigLayouts,
    store: &Store,
    rescan: &mpsc::Sender<Cause>,
) -> Result<Vec<(String, Option<String>)>, MigLayoutRunError> {
    let (lib, file, layout) = (
        settings.nvml_lib.clone(),
        layouts.file.clone(),
        layouts.layout.clone(),
    );
    // One NVML session per round, shared by its checks and steps (opened and shut down on
    // blocking threads: both are driver calls).
    let (nvml, gpus, plans) = blocking("MIG layout planning", move || {
        let parsed = ops::load_file(&file)?;
        let nvml = crate::platform::nvml::open_nvml(lib.as_deref())?;
        let gpus = ops::read(&nvml)?;
        let plans = ops::plan_all(&parsed, &layout, &gpus)?;
        Ok::<_, MigLayoutRunError>((Arc::new(nvml), gpus, plans))
    })
    .await??;
    // GPUs whose instances DRA claims make and destroy (`flags.dra.dynamicMig`) are theirs:
    // the layout would destroy a claim's instance under its container.
    let dynamic = store.current().config.dra.dynamic_mig.clone();
    let mut out = Vec::new();
    for (gpu, plan) in gpus.into_iter().zip(plans) {
        let uuid = gpu.facts.uuid.clone();
        let on_demand = dynamic
            .as_ref()
            .is_some_and(|d| d.selects_gpu(gpu.facts.index, &uuid));
        let reason = match plan.status {
            PlanStatus::Unchanged => None,
            _ if on_demand => Some(format!(
                "its MIG devices are made per DRA claim (flags.dra.dynamicMig selects GPU {}): the layout leaves it as it is",
                gpu.facts.index
            )),
            PlanStatus::Pending => plan.reason.clone(),
            PlanStatus::Changed => repartition(&nvml, store, rescan, gpu, plan)
                .await
                .err()
                .map(|e| e.to_string()),
        };
        out.push((uuid, reason));
    }
    let _ = blocking("NVML shutdown", move || drop(nvml)).await;
    Ok(out)
}

/// Why `gpu` is busy ([`MigLayoutRunError::Held`] or [`MigLayoutRunError::Processes`]), if
/// it is; `Err` when that cannot be told.
async fn busy(
    nvml: &Arc<Nvml>,
    store: &Store,
    gpu: &MigGpu,
) -> Result<Option<MigLayoutRunError>, MigLayoutRunError> {
    if crate::domain::miglayout::held_gpus(&store.current()).contains(&gpu.facts.uuid) {
        return Ok(Some(MigLayoutRunError::Held));
    }
    let (nvml, index) = (nvml.clone(), gpu.facts.index);
    let pids = blocking("compute process check", move || {
        ops::compute_processes(&nvml, index)
    })
    .await??;
    Ok((!pids.is_empty()).then_some(MigLayoutRunError::Processes(pids)))
}

/// Whether the inventory GPU `g` lists the MIG devices `now` has (by GPU and compute instance).
fn devices_match(g: &crate::domain::inventory::Gpu, now: &MigGpu) -> bool {
    now.instances
        .iter()
        .filter(|i| !i.compute_instances.is_empty())
        .all(|i| {
            g.mig_devices
                .iter()
                .any(|m| m.gpu_instance_id == i.id && m.profile == i.profile)
        })
}

/// Drain, re-check, apply, re-scan, undrain. `Err`: why the GPU is still pending.
async fn repartition(
    nvml: &Arc<Nvml>,
    store: &Store,
    rescan: &mpsc::Sender<Cause>,
    gpu: MigGpu,
    plan: GpuPlan,
) -> Result<(), MigLayoutRunError> {
    if let Some(why) = busy(nvml, store, &gpu).await? {
        return Err(why);
    }
    let uuid = gpu.facts.uuid.clone();
    // A drain of its own, not a health event: ending it leaves any XID recorded meanwhile.
    let drain = |on: bool| {
        if let Err(e) = store.drain(&uuid, on.then_some(DRAIN_REASON)) {
            tracing::debug!(gpu = %uuid, error = %e, "GPU has no planned devices to mark");
        }
    };
    drain(true);
    if let Some(why) = busy(nvml, store, &gpu).await? {
        drain(false);
        return Err(why);
    }
    tracing::info!(gpu = %uuid, steps = plan.steps.len(), "applying MIG layout");
    let nvml = nvml.clone();
    let steps = plan.steps.clone();
    let index = gpu.facts.index;
    let (result, now) = blocking("MIG layout steps", move || {
        let result = ops::apply(&nvml, &gpu, &steps).map_err(MigLayoutRunError::Apply);
        // What the GPU holds now, success or not: the re-scan must show exactly this.
        let now = ops::read_gpu(&nvml, index)?;
        Ok::<_, MigLayoutRunError>((result, now))
    })
    .await??;
    let want = now
        .instances
        .iter()
        .filter(|g| !g.compute_instances.is_empty())
        .count();
    // Re-scan and wait until the store serves the GPU's new MIG devices before undraining.
    let mut changes = store.subscribe();
    let _ = rescan.send(Cause::Rescan).await;
    let shown = |s: &crate::domain::snapshot::Snapshot| {
        s.inventory
            .gpu(&uuid)
            .is_some_and(|g| g.mig_devices.len() == want && devices_match(g, &now))
    };
    // Map to a bool at once: the `Ref` `wait_for` returns holds the store's read lock, and
    // `set_health` below takes its write lock.
    let rescanned = tokio::time::timeout(RESCAN_WAIT, changes.wait_for(|s| shown(s)))
        .await
        .is_ok_and(|r| r.is_ok());
    if !rescanned {
        tracing::warn!(gpu = %uuid, "the re-scan did not show the GPU's MIG devices in time");
    }
    drain(false);
    match result {
        Ok(()) => {
            tracing::info!(gpu = %uuid, "MIG layout applied");
            Ok(())
        }
        Err(e) => {
            tracing::error!(gpu = %uuid, error = %e, "MIG layout failed");
            Err(e)
        }
    }
}

#[cfg(test)]
mod mig_daemon_tests;
