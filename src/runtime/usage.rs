//! The usage sampler: one blocking thread that, every `--usage-interval`, reads the GPUs
//! (NVML or the sim node), the `cgroup` files of their processes and the kubelet's
//! device-manager checkpoint, attributes usage to shares (`crate::domain::usage`) and
//! publishes the result.
//!
//! The thread sleeps on a channel between rounds (`recv_timeout`), so it costs nothing
//! between samples and stops at once when the daemon's token is cancelled; a round stuck in
//! a driver call never holds up shutdown (the owning task waits for it a bounded time).
//!
//! **Where the latest usage lives.** Not in the state store: a sample every few seconds
//! would wake every store subscriber (ListAndWatch streams, metrics follower) for nothing.
//! The sampler publishes its own `watch` of [`StateDocument`] instead. Each round reads the
//! store once (one snapshot) and the ledger once, so a report is consistent with one
//! generation, which it names. `GET /v1/state` serves the JSON rendered once per round: a
//! request costs a reference count, however large the node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::domain::usage::{
    self, DraReport, IdleTracker, Inputs, ReportInputs, Sample, UsageReport,
};
use crate::platform::usage::{UsageSource, read_cgroups, read_checkpoint};
use crate::runtime::ledger::LedgerSnapshot;
use crate::runtime::metrics::Metrics;
use crate::runtime::{Context, Handle};
use crate::state::Store;

/// How long shutdown waits for a round in progress.
const STOP_WAIT: Duration = Duration::from_secs(1);

/// What the sampler needs.
#[derive(Debug)]
pub(crate) struct UsageSettings {
    /// Where GPU figures come from.
    pub(crate) source: Box<dyn UsageSource>,
    /// Time between rounds (> 0).
    pub(crate) interval: Duration,
    /// A share is idle after this long without a process or compute.
    pub(crate) idle_window: Duration,
    /// Root of `/proc` for `<pid>/cgroup`.
    pub(crate) proc_root: PathBuf,
    /// The kubelet's `kubelet_internal_checkpoint`.
    pub(crate) checkpoint: PathBuf,
}

/// One published round: the report and its JSON.
#[derive(Debug)]
pub(crate) struct StateDocument {
    /// The report (only tests read it; `json` is what is served).
    #[cfg(test)]
    pub(crate) report: UsageReport,
    /// `report` as JSON, rendered once.
    pub(crate) json: Bytes,
}

impl StateDocument {
    fn new(report: UsageReport) -> Self {
        let json = serde_json::to_vec(&report).map_or_else(|_| Bytes::new(), Bytes::from);
        Self {
            #[cfg(test)]
            report,
            json,
        }
    }
}

/// Follow the sampler's rounds.
pub(crate) type UsageWatch = watch::Receiver<Arc<StateDocument>>;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

struct Sampler {
    settings: UsageSettings,
    store: Store,
    ledger: Option<watch::Receiver<Arc<LedgerSnapshot>>>,
    dra: Option<watch::Receiver<Arc<DraReport>>>,
    metrics: Arc<Metrics>,
    tx: watch::Sender<Arc<StateDocument>>,
    idle: IdleTracker,
    last: Option<(Sample, u64)>,
    last_error: Option<String>,
    checkpoint_error: Option<String>,
}

impl Sampler {
    fn round(&mut self) {
        let error = match self.settings.source.sample() {
            Ok(sample) => {
                if self.last_error.take().is_some() {
                    tracing::info!("usage sampling works again");
                }
                self.last = Some((sample, unix_ms()));
                None
            }
            Err(e) => {
                let text = e.to_string();
                if self.last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "usage sample failed; keeping the last figures");
                }
                self.last_error = Some(text.clone());
                Some(text)
            }
        };
        let (sample, sampled_at_ms) = self.last.clone().unwrap_or_default();
        let snapshot = self.store.current();
        let ledger = self.ledger.as_ref().map(|rx| rx.borrow().clone());
        let holders = ledger
            .as_ref()
            .map(|l| l.allocations.clone())
            .unwrap_or_default();
        let pids: BTreeSet<u32> = sample.processes.iter().map(|p| p.pid).collect();
        let cgroups = read_cgroups(&self.settings.proc_root, pids);
        let checkpoint = if sample.processes.is_empty() {
            Vec::new()
        } else {
            match read_checkpoint(&self.settings.checkpoint) {
                Ok(entries) => {
                    self.checkpoint_error = None;
                    entries
                }
                Err(e) => {
                    let text = e.to_string();
                    // Once per distinct error, not every round.
                    if self.checkpoint_error.as_deref() != Some(text.as_str()) {
                        tracing::warn!(error = %text, "kubelet checkpoint unreadable; processes stay unattributed");
                    }
                    self.checkpoint_error = Some(text);
                    Vec::new()
                }
            }
        };
        let attribution = usage::attribute(&Inputs {
            sample: &sample,
            cgroups: &cgroups,
            checkpoint: &checkpoint,
            holders: &holders,
            views: &snapshot.views,
        });
        let idle = self.idle.observe(
            &attribution.shares,
            Instant::now(),
            self.settings.idle_window,
        );
        // Allocated: what the kubelet reports when the ledger has reached it, else what
        // Allocate handed out (never pruned without a ledger: errs on "not free").
        let allocated: BTreeMap<String, BTreeSet<String>> = match &ledger {
            Some(l) if l.rounds > 0 => snapshot
                .views
                .keys()
                .map(|r| (r.clone(), l.allocated_ids(r)))
                .collect(),
            _ => snapshot
                .held
                .resources
                .iter()
                .map(|(r, ids)| (r.clone(), ids.keys().cloned().collect()))
                .collect(),
        };
        let mut report = usage::report(&ReportInputs {
            generation: snapshot.generation,
            sampled_at_ms,
            interval: self.settings.interval,
            idle_window: self.settings.idle_window,
            inventory: &snapshot.inventory,
            views: &snapshot.views,
            sample: &sample,
            attribution: &attribution,
            idle: &idle,
            allocated: &allocated,
        });
        report.error = error;
        report.dra = self.dra.as_ref().map(|rx| DraReport::clone(&rx.borrow()));
        self.metrics.usage.publish(&report);
        tracing::trace!(
            devices = sample.devices.len(),
            processes = sample.processes.len(),
            shares = attribution.shares.len(),
            "usage sampled"
        );
        self.tx.send_replace(Arc::new(StateDocument::new(report)));
    }
}

/// What the sampler is handed by the supervisor.
#[derive(Debug, Default)]
pub(crate) struct UsagePeers {
    /// The PodResources ledger's snapshots, when there is one (holder names come from it).
    pub(crate) ledger: Option<watch::Receiver<Arc<LedgerSnapshot>>>,
    /// The DRA driver's prepared claims, when the node serves DRA (a view beside the store:
    /// see `crate::runtime::dra::driver::Driver::prepared_view`).
    pub(crate) dra: Option<watch::Receiver<Arc<DraReport>>>,
}

/// Start the sampler thread (first round at once) and the task that stops it when the
/// daemon stops. The handle exposes the sampler's rounds.
pub(crate) fn spawn(
    settings: UsageSettings,
    peers: UsagePeers,
    ctx: &Context,
) -> std::io::Result<Handle<UsageWatch>> {
    let (store, metrics, ledger) = (ctx.store.clone(), ctx.metrics.clone(), peers.ledger);
    let dra = peers.dra;
    let token = ctx.child_token();
    let interval = settings.interval;
    let initial = UsageReport {
        generation: 0,
        sampled_at_ms: 0,
        interval_seconds: interval.as_secs_f64(),
        idle_window_seconds: settings.idle_window.as_secs_f64(),
        error: None,
        gpus: Vec::new(),
        idle_shares: BTreeMap::new(),
        placeable: Vec::new(),
        unattributed_processes: BTreeMap::new(),
        topology: None,
        dra: dra.as_ref().map(|rx| DraReport::clone(&rx.borrow())),
    };
    let (tx, rx) = watch::channel(Arc::new(StateDocument::new(initial)));
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let mut sampler = Sampler {
        settings,
        store,
        ledger,
        dra,
        metrics,
        tx,
        idle: IdleTracker::default(),
        last: None,
        last_error: None,
        checkpoint_error: None,
    };
    std::thread::Builder::new()
        .name("usage".into())
        .spawn(move || {
            loop {
                let started = Instant::now();
                sampler.round();
                match stop_rx.recv_timeout(interval.saturating_sub(started.elapsed())) {
                    Err(RecvTimeoutError::Timeout) => {}
                    // Told to stop, or the stopping task is gone.
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            let _ = done_tx.send(());
        })?;
    ctx.tracker.spawn(stop_on_cancel(stop_tx, done_rx, token));
    tracing::info!(interval_s = interval.as_secs_f64(), "usage sampler started");
    Ok(Handle::new(rx))
}

async fn stop_on_cancel(
    stop: Sender<()>,
    done: tokio::sync::oneshot::Receiver<()>,
    token: CancellationToken,
) {
    token.cancelled().await;
    let _ = stop.send(());
    if tokio::time::timeout(STOP_WAIT, done).await.is_err() {
        // A driver call that does not return: the thread ends with the process.
        tracing::warn!("usage sampler still in a round at shutdown; not waiting for it");
    }
}

#[cfg(test)]
mod usage_tests;
