//! The health task: connects an event source to the policy ([`Tracker`]) and the policy to
//! the daemon's device state (the state store, [`crate::state::Store`]), which streams every change to ListAndWatch.
//!
//! Sources:
//! - `--backend nvml`: the [`NvmlEventWatcher`] (its own OS thread; blocking NVML never runs on
//!   the async workers). Re-probes before recovery run on `spawn_blocking`.
//! - `--backend sim:*`: an injector fed by the node file's `events` timeline and by a JSON-lines
//!   file (`--health-events-file`, the line format of the fake NVML's event file, including
//!   `{"gpu":N,"kind":"recover"}`), read and removed on every poll. A `gpuLost` event marks the
//!   GPU lost until a `recover` line, so a sim re-probe fails until then, as NVML's would.
//!
//! Events name a GPU by index or UUID and a MIG instance by GI/CI ids; they are mapped to GPU
//! and MIG UUIDs through the inventory, so the keys stay valid whatever positions the plan
//! gives devices. The task is owned by the daemon's `TaskTracker` and stops on its token; the
//! NVML thread is told to stop and not waited for (it ends when its current wait returns).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use node_spec::{EventLine, EventSpec};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::domain::allocate::HealthUpdate;
use crate::domain::health::{Event, EventKind, Tracker, Transition, XidFilter};
use crate::domain::inventory::{Health, Inventory};
use crate::platform::nvml_events::{HealthEvent, HealthEventKind, NvmlEventWatcher};
use crate::runtime::{Context, Handle};
use crate::state::{Snapshot, Store};

/// Longest single NVML event wait. Long, so an idle node costs (almost) no CPU; short enough
/// that stopping the thread (checked after every wait) fits the daemon's 5 s shutdown deadline.
pub(crate) const NVML_WAIT_TIMEOUT: Duration = Duration::from_secs(2);

/// How often the sim injector looks for `--health-events-file`.
pub(crate) const SIM_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Where health events come from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// The NVML event watcher on the library at `lib_path` (`None`: the system's).
    Nvml {
        /// NVML library.
        lib_path: Option<PathBuf>,
        /// Longest single wait (bounds stop latency).
        wait_timeout: Duration,
    },
    /// The sim injector.
    Sim {
        /// The node file's `events`, `afterMs` after the monitor starts.
        timeline: Vec<EventSpec>,
        /// JSON-lines file polled for more events.
        events_file: Option<PathBuf>,
        /// Poll interval of `events_file`.
        poll: Duration,
    },
}

/// What the health task needs.
#[derive(Debug, Clone)]
pub(crate) struct HealthSettings {
    /// Event source.
    pub(crate) source: Source,
    /// Which XIDs count (`DP_DISABLE_HEALTHCHECKS` / `DP_ENABLE_HEALTHCHECKS`).
    pub(crate) filter: XidFilter,
    /// Quiet period before recovery.
    pub(crate) quiet_period: Duration,
}

impl HealthSettings {}

/// Start the health task unless health checks are off or there is no GPU.
/// Transitions go to the store; the task ends when the daemon stops.
///
/// `inventory` follows re-scans: a new inventory (a changed MIG layout) re-maps GPU
/// instance / compute instance ids to MIG UUIDs without restarting the watcher, and keeps
/// the policy's state (a GPU waiting for its quiet period stays so).
pub(crate) fn spawn(settings: HealthSettings, ctx: &Context) -> Handle {
    let inventory = ctx.store.subscribe();
    if !settings.filter.any_enabled() {
        tracing::info!(
            "health checks disabled (DP_DISABLE_HEALTHCHECKS); no health watcher started"
        );
        return Handle::new(());
    }
    if inventory.borrow().inventory.gpus.is_empty() {
        tracing::info!("no GPUs; no health watcher started");
        return Handle::new(());
    }
    ctx.tracker.spawn(run(
        settings,
        inventory,
        ctx.store.clone(),
        ctx.child_token(),
    ));
    Handle::new(())
}

/// Apply health events from outside (embedders, tests) with [`Store::set_health`] until
/// the sender goes away or the daemon stops; events for unknown devices are
/// logged.
pub(crate) fn spawn_external(events: mpsc::Receiver<HealthUpdate>, ctx: &Context) -> Handle {
    let token = ctx.child_token();
    ctx.tracker
        .spawn(apply_external(events, ctx.store.clone(), token));
    Handle::new(())
}

async fn apply_external(
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

/// Start the event source: the NVML watcher (on a blocking thread, sending on `tx`) or the
/// sim's timeline and events file. `None` when the watcher cannot start (logged).
async fn open_source(
    source: Source,
    tx: mpsc::UnboundedSender<HealthEvent>,
) -> Option<(Prober, Option<Sim>, tokio::time::Interval)> {
    let mut poll = tokio::time::interval(SIM_POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (probe, sim) = match source {
        Source::Nvml {
            lib_path,
            wait_timeout,
        } => {
            let lib = lib_path.clone();
            let started =
                tokio::task::spawn_blocking(move || NvmlEventWatcher::start(lib, wait_timeout, tx))
                    .await;
            match started {
                Ok(Ok(watcher)) => (Prober::Nvml { watcher, lib_path }, None),
                Ok(Err(e)) => {
                    // Discovery worked moments ago, so this is rare; devices keep the health
                    // discovery gave them rather than all going down on a monitoring failure.
                    tracing::error!(error = %e, "health watcher not started; device health is not monitored");
                    return None;
                }
                Err(e) => {
                    tracing::error!(error = %e, "health watcher start-up did not complete");
                    return None;
                }
            }
        }
        Source::Sim {
            timeline,
            events_file,
            poll: every,
        } => {
            // Nothing sends on the channel for the sim: its branch below stays off.
            drop(tx);
            poll = tokio::time::interval(every);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut sim = Sim {
                pending: Vec::new(),
                events_file,
            };
            let start = tokio::time::Instant::now();
            for ev in timeline {
                sim.schedule(
                    start + Duration::from_millis(ev.after_ms),
                    EventLine::Event(ev),
                );
            }
            (
                Prober::Sim {
                    lost: BTreeSet::new(),
                },
                Some(sim),
            )
        }
    };
    Some((probe, sim, poll))
}

/// The task body.
async fn run(
    settings: HealthSettings,
    mut inventory_rx: watch::Receiver<Arc<Snapshot>>,
    health: Store,
    token: CancellationToken,
) {
    let inventory = inventory_rx.borrow_and_update().inventory.clone();
    let mut inventory_open = true;
    let gpus = inventory.gpus.iter().map(|g| g.uuid.clone()).collect();
    let mut monitor = Monitor {
        tracker: Tracker::new(settings.filter.clone(), settings.quiet_period, gpus),
        inventory,
        health,
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let Some((mut probe, mut sim, mut poll)) = open_source(settings.source, tx).await else {
        return;
    };
    let events_from_nvml = matches!(probe, Prober::Nvml { .. });
    let mut events_open = events_from_nvml;
    tracing::info!(
        source = if events_from_nvml { "nvml" } else { "sim" },
        quiet_period = ?settings.quiet_period,
        "health monitor started"
    );
    loop {
        let probe_at = monitor
            .tracker
            .next_probe_at()
            .map(tokio::time::Instant::from_std);
        let sim_due = sim.as_ref().and_then(Sim::next_due);
        let sim_polls = sim.as_ref().is_some_and(|s| s.events_file.is_some());
        tokio::select! {
            () = token.cancelled() => break,
            changed = inventory_rx.changed(), if inventory_open => match changed {
                // The store changes on every health event too: only a new inventory matters.
                Ok(()) => {
                    let inventory = inventory_rx.borrow_and_update().inventory.clone();
                    if !Arc::ptr_eq(&inventory, &monitor.inventory) {
                        monitor
                            .tracker
                            .set_gpus(inventory.gpus.iter().map(|g| g.uuid.clone()).collect());
                        monitor.inventory = inventory;
                        tracing::info!("health monitor follows the re-scanned inventory");
                    }
                }
                Err(_) => inventory_open = false,
            },
            ev = rx.recv(), if events_open => match ev {
                Some(ev) => monitor.on_event(&ev),
                None => {
                    tracing::error!("NVML event watcher ended; device health is no longer monitored");
                    events_open = false;
                }
            },
            () = sleep_until(probe_at), if probe_at.is_some() => {
                monitor.probe_due(&probe).await;
            }
            () = sleep_until(sim_due), if sim_due.is_some() => {
                if let Some(sim) = &mut sim {
                    for inj in sim.take_due(tokio::time::Instant::now()) {
                        monitor.inject(&mut probe, inj);
                    }
                }
            }
            _ = poll.tick(), if sim_polls => {
                if let Some(sim) = &mut sim {
                    sim.read_file(tokio::time::Instant::now());
                }
            }
        }
    }
    if let Prober::Nvml { watcher, .. } = probe {
        // Joining would wait for the current NVML wait to time out (up to
        // NVML_WAIT_TIMEOUT): tell the thread to stop and let it end on its own.
        watcher.detach();
    }
    tracing::info!("health monitor stopped");
}

/// Sleep until `at`, or forever when there is nothing to wait for.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// How a GPU is re-probed before its devices recover.
#[derive(Debug)]
enum Prober {
    /// Ask NVML (a fresh handle on a blocking thread) whether the GPU answers.
    Nvml {
        watcher: NvmlEventWatcher,
        lib_path: Option<PathBuf>,
    },
    /// A sim GPU answers unless a `gpuLost` event marked it and no `recover` line cleared it.
    Sim { lost: BTreeSet<String> },
}

impl Prober {
    async fn probe(&self, gpu: &str) -> bool {
        match self {
            Prober::Nvml { lib_path, .. } => {
                let (lib, uuid) = (lib_path.clone(), gpu.to_string());
                tokio::task::spawn_blocking(move || {
                    crate::platform::nvml_events::reprobe(lib.as_deref(), &uuid)
                })
                .await
                .unwrap_or(false)
            }
            Prober::Sim { lost } => !lost.contains(gpu),
        }
    }
}

/// The sim injector's schedule and event file.
#[derive(Debug)]
struct Sim {
    /// EventLines not yet due, sorted by time.
    pending: Vec<(tokio::time::Instant, EventLine)>,
    events_file: Option<PathBuf>,
}

impl Sim {
    fn schedule(&mut self, at: tokio::time::Instant, inj: EventLine) {
        let i = self.pending.partition_point(|(t, _)| *t <= at);
        self.pending.insert(i, (at, inj));
    }

    fn next_due(&self) -> Option<tokio::time::Instant> {
        self.pending.first().map(|(at, _)| *at)
    }

    fn take_due(&mut self, now: tokio::time::Instant) -> Vec<EventLine> {
        let n = self.pending.partition_point(|(t, _)| *t <= now);
        self.pending.drain(..n).map(|(_, inj)| inj).collect()
    }

    /// Schedule every line of the events file (then remove it, so each line counts once).
    /// Bad lines are reported with file and line number and skipped.
    fn read_file(&mut self, now: tokio::time::Instant) {
        let Some(path) = &self.events_file else {
            return;
        };
        let Some(text) = read_and_remove(path) else {
            return;
        };
        let path = path.display().to_string();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match EventLine::parse(line) {
                Ok(inj) => {
                    let after = match &inj {
                        EventLine::Event(ev) => Duration::from_millis(ev.after_ms),
                        EventLine::Recover(_) => Duration::ZERO,
                    };
                    self.schedule(now + after, inj);
                }
                Err(e) => {
                    tracing::warn!(file = %path, line = n + 1, error = %e, "health event line skipped");
                }
            }
        }
    }
}

fn read_and_remove(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(file = %path.display(), error = %e, "cannot remove the health events file; its lines may be applied again");
    }
    Some(text)
}

/// Policy plus the state it drives.
#[derive(Debug)]
struct Monitor {
    tracker: Tracker,
    inventory: Arc<Inventory>,
    health: Store,
}

impl Monitor {
    /// Feed one source event through the policy and apply what changes.
    fn on_event(&mut self, ev: &HealthEvent) {
        let now = Instant::now();
        for event in self.resolve(ev) {
            let transitions = self.tracker.on_event(&event, now);
            if transitions.is_empty() {
                tracing::info!(gpu = %ev.gpu_uuid, kind = %ev.kind, "health event: no change (ignored or already unhealthy)");
            }
            self.apply(&transitions);
        }
    }

    /// Map an event's GI/CI ids to MIG UUIDs. An XID NVML attributes to an instance marks
    /// that slice; ids that match no known slice mark the whole GPU (safer than ignoring it).
    fn resolve(&self, ev: &HealthEvent) -> Vec<Event> {
        let kind = match &ev.kind {
            HealthEventKind::Xid(x) => EventKind::Xid(*x),
            HealthEventKind::DoubleBitEcc => EventKind::DoubleBitEcc,
            HealthEventKind::SingleBitEcc => EventKind::SingleBitEcc,
            HealthEventKind::GpuLost => EventKind::GpuLost,
            HealthEventKind::WaitError(m) => EventKind::WaitError(m.clone()),
        };
        let whole = || {
            vec![Event {
                gpu_uuid: Some(ev.gpu_uuid.clone()),
                mig_uuid: None,
                kind: kind.clone(),
            }]
        };
        let Some(gi) = ev.gpu_instance_id else {
            return whole();
        };
        let Some(gpu) = self.inventory.gpu(&ev.gpu_uuid) else {
            return whole();
        };
        let migs: Vec<Event> = gpu
            .mig_devices
            .iter()
            .filter(|m| {
                m.gpu_instance_id == gi
                    && ev
                        .compute_instance_id
                        .is_none_or(|ci| m.compute_instance_id == ci)
            })
            .map(|m| Event {
                gpu_uuid: Some(ev.gpu_uuid.clone()),
                mig_uuid: Some(m.uuid.clone()),
                kind: kind.clone(),
            })
            .collect();
        if migs.is_empty() {
            tracing::warn!(gpu = %ev.gpu_uuid, gpu_instance = gi, compute_instance = ev.compute_instance_id, "event names no known MIG device; marking the whole GPU");
            return whole();
        }
        migs
    }

    /// Re-probe every GPU whose devices have been quiet for the quiet period.
    async fn probe_due(&mut self, prober: &Prober) {
        for gpu in self.tracker.due_for_probe(Instant::now()) {
            let ok = prober.probe(&gpu).await;
            if !ok {
                tracing::info!(gpu = %gpu, "re-probe failed; devices stay unhealthy for another quiet period");
            }
            let transitions = self.tracker.on_probe(&gpu, ok, Instant::now());
            self.apply(&transitions);
        }
    }

    /// Turn one sim injection into an event (or a recovery of the lost mark).
    fn inject(&mut self, prober: &mut Prober, inj: EventLine) {
        let index = match &inj {
            EventLine::Event(ev) => ev.gpu,
            EventLine::Recover(gpu) => *gpu,
        };
        let Some(uuid) = self
            .inventory
            .gpus
            .iter()
            .find(|g| g.index == index)
            .map(|g| g.uuid.clone())
        else {
            tracing::warn!(
                gpu = index,
                "health event for a GPU index this node lacks; skipped"
            );
            return;
        };
        let lost = match prober {
            Prober::Sim { lost } => lost,
            Prober::Nvml { .. } => return,
        };
        let ev = match inj {
            EventLine::Recover(_) => {
                lost.remove(&uuid);
                tracing::info!(gpu = %uuid, "sim GPU answers again");
                return;
            }
            EventLine::Event(ev) => ev,
        };
        let kind = match ev.kind {
            node_spec::EventKind::Xid => match ev.xid {
                Some(x) => HealthEventKind::Xid(x),
                None => {
                    tracing::warn!(gpu = index, "xid event without `xid`; skipped");
                    return;
                }
            },
            node_spec::EventKind::DoubleBitEcc => HealthEventKind::DoubleBitEcc,
            node_spec::EventKind::SingleBitEcc => HealthEventKind::SingleBitEcc,
            node_spec::EventKind::GpuLost => {
                lost.insert(uuid.clone());
                HealthEventKind::GpuLost
            }
        };
        self.on_event(&HealthEvent {
            gpu_uuid: uuid,
            gpu_instance_id: ev.gpu_instance_id,
            compute_instance_id: ev.compute_instance_id,
            kind,
        });
    }

    /// Apply transitions to the device state (each reaches ListAndWatch at once) and log them.
    fn apply(&self, transitions: &[Transition]) {
        for t in transitions {
            let (health, reason) = match &t.unhealthy {
                Some(reason) => (Health::Unhealthy, reason.as_str()),
                None => (Health::Healthy, "recovered"),
            };
            match self.health.set_health(&t.uuid, health, reason) {
                Ok(changed) => tracing::info!(
                    device = %t.uuid,
                    health = %health,
                    reason,
                    resources = ?changed,
                    "health transition"
                ),
                // E.g. a GPU in MIG mode with no slice served: nothing to show the kubelet.
                Err(e) => tracing::info!(
                    device = %t.uuid,
                    health = %health,
                    reason,
                    error = %e,
                    "health transition reaches no served device"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_schedule_keeps_order() {
        let t0 = tokio::time::Instant::now();
        let mut sim = Sim {
            pending: Vec::new(),
            events_file: None,
        };
        sim.schedule(t0 + Duration::from_millis(20), EventLine::Recover(2));
        sim.schedule(t0, EventLine::Recover(0));
        sim.schedule(t0 + Duration::from_millis(10), EventLine::Recover(1));
        assert_eq!(sim.next_due(), Some(t0));
        assert_eq!(
            sim.take_due(t0 + Duration::from_millis(10)),
            vec![EventLine::Recover(0), EventLine::Recover(1)]
        );
        assert_eq!(sim.pending.len(), 1);
    }
}
