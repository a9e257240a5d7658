//! Fleets as code, the runtime: the Node's labels choose the config (`--config-dir`,
//! `--config-label`, `--config-default`) and the MIG layout (`nvidia.com/mig.config`), and
//! the outcome goes back onto the Node as state labels and Events.
//!
//! Two halves share one [`Selection`] (in `selection`):
//!
//! - the reloader's config loader ([`Selection::load`]): on every reload it lists the
//!   directory (through `..data`, one version), chooses the key from the labels last handed
//!   over ([`crate::domain::fleet::choose_config`]; before the Node was ever read, the name
//!   recorded in `--state-dir`), loads that file with the command-line overrides and puts the
//!   MIG label's layout over `flags.migLayouts.layout`. What it chose, or why it refused, is
//!   recorded for the actor. A refusal fails the reload, so the last good config keeps
//!   serving through the existing transition;
//! - the actor ([`spawn`]): follows the Node ([`crate::runtime::node_watch`]); a change of
//!   either selecting label (never our own state labels echoed back) is debounced (a label
//!   flapping settles into one reload), handed to the selection and turned into one reload
//!   request. After each reload, and each MIG round, it works out the state labels, patches
//!   only what differs ([`crate::domain::fleet::label_patch`]), records an Event for every
//!   switch, refusal and failure, and the applied name in `--state-dir`. Failed API calls
//!   (403, 409, 5xx, the API down) are logged and retried after a jittered backoff; nothing
//!   about them is fatal and nothing changes on the node meanwhile.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::domain::fleet::{
    self, CONFIG_APPLIED_LABEL, CONFIG_STATE_LABEL, ConfigOutcome, MIG_CONFIG_LABEL,
    MIG_STATE_LABEL, MigOutcome,
};
use crate::platform::kube::{EventKind, NodeApi};
use crate::runtime::miglayout::MigReport;
use crate::runtime::node_watch::{self, NodeView, NodeWatchSettings};
use crate::runtime::reloader::ReloadStatus;
use crate::runtime::triggers::Cause;
use crate::runtime::{Context, Handle};
use crate::state::Store;

mod selection;

pub(crate) use selection::Selection;

/// Most Events kept while the API refuses them (the oldest are dropped).
const MAX_QUEUED_EVENTS: usize = 32;

/// Settings of the actor.
#[derive(Debug)]
pub(crate) struct FleetSettings {
    /// Shared with the reloader's loader.
    pub(crate) selection: Selection,
    /// The agent's own Node; `None`: labels are not followed (no API), the config stays
    /// the one chosen at start.
    pub(crate) node: Option<NodeWatchSettings>,
    /// Where the applied name is recorded (`--state-dir`); `None`: not recorded.
    pub(crate) state_dir: Option<PathBuf>,
    /// A label change waits this long for the next before the reload (a flapping label
    /// becomes one reload).
    pub(crate) settle: Duration,
    /// ... but never longer than this after the first change.
    pub(crate) settle_cap: Duration,
}

impl FleetSettings {
    /// Defaults: 300 ms settle, capped at 2 s.
    pub(crate) fn new(selection: Selection, node: Option<NodeWatchSettings>) -> Self {
        Self {
            selection,
            node,
            state_dir: None,
            settle: Duration::from_millis(300),
            settle_cap: Duration::from_secs(2),
        }
    }
}

/// What the actor is handed by the supervisor.
#[derive(Debug)]
pub(crate) struct FleetPeers {
    /// Asks the reloader for a config reload.
    pub(crate) reload: mpsc::Sender<Cause>,
    /// Every reload's outcome.
    pub(crate) reloads: watch::Receiver<ReloadStatus>,
    /// The MIG layout actor's rounds; `None`: the backend cannot change MIG instances.
    pub(crate) mig: Option<watch::Receiver<Option<MigReport>>>,
}

/// Start the actor (and its Node watcher). Exposes the state labels it wants on the Node.
pub(crate) fn spawn(
    settings: FleetSettings,
    peers: FleetPeers,
    ctx: &Context,
) -> Handle<watch::Receiver<BTreeMap<String, String>>> {
    let token = ctx.child_token();
    let (tx, rx) = watch::channel(BTreeMap::new());
    let Some(node) = settings.node.clone() else {
        tracing::warn!(
            dir = %settings.selection.dir().display(),
            "no Kubernetes API: the Node's labels are not followed, the config chosen at start stays"
        );
        return Handle::new(rx);
    };
    let api = node.api.clone();
    let view = node_watch::spawn(node, ctx).into_inner();
    let actor = Actor::new(settings, api, ctx.store.clone(), tx);
    ctx.tracker.spawn(actor.run(view, peers, token));
    Handle::new(rx)
}

/// One Event waiting to be recorded.
#[derive(Debug, Clone)]
struct PendingEvent {
    kind: EventKind,
    reason: &'static str,
    message: String,
}

/// The config part of the state, with the error a refusal carries.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ConfigState {
    outcome: ConfigOutcome,
    error: Option<String>,
}

struct Actor {
    selection: Selection,
    api: NodeApi,
    store: Store,
    state_dir: Option<PathBuf>,
    settle: Duration,
    settle_cap: Duration,
    desired_tx: watch::Sender<BTreeMap<String, String>>,
    /// The Node as last seen (watch or our own patch's answer).
    node: Option<NodeView>,
    /// The labels last handed to the selection.
    handed: Option<BTreeMap<String, String>>,
    /// Labels waiting for the settle delay: (first change, fire at).
    settling: Option<(Instant, Instant)>,
    /// The config in force (and the one recorded in the state dir).
    applied: Option<String>,
    config: Option<ConfigState>,
    mig: Option<(String, MigOutcome, Option<String>)>,
    events: VecDeque<PendingEvent>,
    attempt: u32,
    retry_at: Option<Instant>,
    jitter: std::collections::hash_map::RandomState,
    /// Failed calls since the last success, for a summary a minute at most.
    outage: crate::runtime::retry_summary::RetrySummary,
}

impl Actor {
    fn new(
        s: FleetSettings,
        api: NodeApi,
        store: Store,
        desired_tx: watch::Sender<BTreeMap<String, String>>,
    ) -> Self {
        let applied = s.selection.recorded();
        Self {
            selection: s.selection,
            api,
            store,
            state_dir: s.state_dir,
            settle: s.settle,
            settle_cap: s.settle_cap,
            desired_tx,
            node: None,
            handed: None,
            settling: None,
            applied,
            config: None,
            mig: None,
            events: VecDeque::new(),
            attempt: 0,
            retry_at: None,
            jitter: std::collections::hash_map::RandomState::new(),
            outage: crate::runtime::retry_summary::RetrySummary::default(),
        }
    }

    async fn run(
        mut self,
        mut view: watch::Receiver<Option<NodeView>>,
        peers: FleetPeers,
        token: CancellationToken,
    ) {
        let FleetPeers {
            reload,
            mut reloads,
            mut mig,
        } = peers;
        loop {
            let wake = [self.settling.map(|(_, at)| at), self.retry_at]
                .into_iter()
                .flatten()
                .min();
            let mig_changed = async {
                match mig.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let timer = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let mut mig_closed = false;
            tokio::select! {
                () = token.cancelled() => return,
                changed = view.changed() => {
                    if changed.is_err() { return }
                    let seen = view.borrow_and_update().clone();
                    self.seen(seen);
                }
                changed = reloads.changed() => if changed.is_err() { return },
                open = mig_changed => mig_closed = !open,
                () = timer => {}
            }
            if mig_closed {
                mig = None;
            }
            self.hand_over(&reload);
            let status = reloads.borrow().clone();
            let report = mig.as_ref().map(|rx| rx.borrow().clone());
            self.evaluate(&status, report).await;
            self.report().await;
        }
    }

    /// A new view of the Node: a change of a selecting label starts (or extends) the settle
    /// delay; anything else (our own patch echoed back) changes nothing.
    fn seen(&mut self, seen: Option<NodeView>) {
        let Some(seen) = seen else { return };
        let label = self.selection.label();
        let flapped = self
            .node
            .as_ref()
            .is_none_or(|prev| fleet::selection_changed(&prev.labels, &seen.labels, label));
        self.node = Some(seen);
        self.settle_if(flapped);
    }

    /// Start the settle delay when the Node's selecting labels differ from those handed
    /// over; extend it when they moved again (`flapped`).
    fn settle_if(&mut self, flapped: bool) {
        let Some(node) = &self.node else { return };
        let label = self.selection.label();
        let differs = self
            .handed
            .as_ref()
            .is_none_or(|h| fleet::selection_changed(h, &node.labels, label));
        let now = Instant::now();
        self.settling = match (self.settling, &self.handed) {
            // The first view: no delay, the node serves its pool's config at once.
            (None, None) => Some((now, now)),
            (None, Some(_)) if differs => Some((now, now + self.settle)),
            (Some((first, _)), _) if flapped => {
                Some((first, (now + self.settle).min(first + self.settle_cap)))
            }
            (keep, _) => keep,
        };
    }

    /// After the settle delay: hand the labels over and ask for one reload.
    fn hand_over(&mut self, reload: &mpsc::Sender<Cause>) {
        let Some((_, at)) = self.settling else { return };
        if Instant::now() < at {
            return;
        }
        self.settling = None;
        let Some(node) = &self.node else { return };
        let labels = node.labels.clone();
        if self.handed.as_ref().is_some_and(|before| {
            !fleet::selection_changed(before, &labels, self.selection.label())
        }) {
            // Flapped back to what is in force: nothing to reload.
            return;
        }
        let generation = self.selection.set_labels(labels.clone());
        tracing::info!(
            node = self.api.name(),
            label = self.selection.label(),
            value = labels
                .get(self.selection.label())
                .map(String::as_str)
                .unwrap_or("(unset)"),
            mig_layout = labels
                .get(MIG_CONFIG_LABEL)
                .map(String::as_str)
                .unwrap_or("(unset)"),
            generation,
            "node labels select the config: reloading"
        );
        self.handed = Some(labels);
        // A full queue means a reload is pending already; it reads the labels just set.
        let _ = reload.try_send(Cause::ConfigFile);
    }

    /// Work out the config and MIG state from the last load, the store and the MIG actor.
    async fn evaluate(&mut self, status: &ReloadStatus, mig: Option<Option<MigReport>>) {
        let (wanted, last) = self.selection.status();
        let Some(last) = last else { return };
        let settled = last.generation >= wanted && self.settling.is_none();
        if settled {
            let next = match &last.result {
                Err(e) => Some(self.refused(e.clone())),
                Ok(chosen) if self.store.current().config.source == chosen.source => {
                    Some(ConfigState {
                        outcome: ConfigOutcome::Applied {
                            name: chosen.key.clone(),
                        },
                        error: None,
                    })
                }
                Ok(_) => status.last_error.clone().map(|e| self.refused(e)),
            };
            if let Some(next) = next {
                self.config_changed(next).await;
            }
        }
        let label = self.handed.as_ref().and_then(|l| {
            fleet::choose_layout(l.get(MIG_CONFIG_LABEL).map(String::as_str), None)
                .map(str::to_owned)
        });
        let next = label.map(|layout| {
            let layout_error = last
                .result
                .as_ref()
                .ok()
                .and_then(|c| c.layout_error.clone());
            let (outcome, detail) = match (settled, layout_error, &mig) {
                (false, _, _) => (MigOutcome::Pending, None),
                (true, Some(e), _) => (MigOutcome::Failed, Some(e)),
                (true, None, None) => (
                    MigOutcome::Failed,
                    Some("the backend cannot change MIG instances (NVML only)".to_owned()),
                ),
                (true, None, Some(Some(r))) if r.layout == layout => (r.outcome, r.detail.clone()),
                (true, None, Some(_)) => (MigOutcome::Pending, None),
            };
            (layout, outcome, detail)
        });
        self.mig_changed(next);
    }

    fn refused(&self, error: String) -> ConfigState {
        ConfigState {
            outcome: ConfigOutcome::Refused {
                kept: self.applied.clone(),
            },
            error: Some(error),
        }
    }

    async fn config_changed(&mut self, next: ConfigState) {
        if self.config.as_ref() == Some(&next) {
            return;
        }
        let label = self.selection.label().to_owned();
        let value = self
            .handed
            .as_ref()
            .and_then(|l| l.get(&label).cloned())
            .unwrap_or_else(|| "(unset)".into());
        match (&next.outcome, &next.error) {
            (ConfigOutcome::Applied { name }, _) => {
                tracing::info!(node = self.api.name(), config = %name, %label, %value, "config applied");
                self.queue(
                    EventKind::Normal,
                    "ConfigApplied",
                    format!("config {name} applied (label {label}={value})"),
                );
                if self.applied.as_deref() != Some(name) {
                    self.applied = Some(name.clone());
                    self.record(name).await;
                }
            }
            (ConfigOutcome::Refused { kept }, error) => {
                let kept = kept.as_deref().unwrap_or("the config loaded at start");
                let error = error.as_deref().unwrap_or("reload failed");
                tracing::error!(node = self.api.name(), %label, %value, %error, %kept, "config refused; the last good config keeps serving");
                self.queue(
                    EventKind::Warning,
                    "ConfigRefused",
                    format!("label {label}={value}: {error}; keeping {kept}"),
                );
            }
        }
        self.config = Some(next);
    }

    fn mig_changed(&mut self, next: Option<(String, MigOutcome, Option<String>)>) {
        if self.mig == next {
            return;
        }
        if let Some((layout, outcome, detail)) = &next {
            let detail = detail.as_deref().unwrap_or("");
            tracing::info!(node = self.api.name(), %layout, state = outcome.as_str(), %detail, "MIG layout state");
            let was = self.mig.as_ref().map(|(l, o, _)| (l.as_str(), *o));
            if was != Some((layout.as_str(), *outcome)) {
                match outcome {
                    MigOutcome::Success => self.queue(
                        EventKind::Normal,
                        "MigLayoutApplied",
                        format!("label {MIG_CONFIG_LABEL}={layout}: layout applied"),
                    ),
                    MigOutcome::Failed => self.queue(
                        EventKind::Warning,
                        "MigLayoutFailed",
                        format!("label {MIG_CONFIG_LABEL}={layout}: {detail}"),
                    ),
                    MigOutcome::Pending => {}
                }
            }
        }
        self.mig = next;
    }

    fn queue(&mut self, kind: EventKind, reason: &'static str, message: String) {
        if self.events.len() >= MAX_QUEUED_EVENTS {
            let dropped = self.events.pop_front();
            tracing::debug!(?dropped, "event queue full: oldest dropped");
        }
        self.events.push_back(PendingEvent {
            kind,
            reason,
            message,
        });
    }

    async fn record(&self, name: &str) {
        let Some(dir) = self.state_dir.clone() else {
            return;
        };
        let name = name.to_owned();
        let written = crate::runtime::error::blocking("applied-config record", move || {
            crate::platform::fleet_state::write(&dir, &name)
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "applied config not recorded"),
            Err(error) => tracing::warn!(%error, "applied config not recorded"),
        }
    }

    /// The state labels wanted on the Node.
    fn desired(&self) -> BTreeMap<String, String> {
        fleet::state_labels(
            self.config.as_ref().map(|c| &c.outcome),
            self.mig.as_ref().map(|(_, o, _)| *o),
        )
    }

    /// Patch what differs and record queued Events, unless backing off.
    async fn report(&mut self) {
        let desired = self.desired();
        self.desired_tx.send_if_modified(|d| {
            let changed = *d != desired;
            d.clone_from(&desired);
            changed
        });
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        self.retry_at = None;
        let Some(node) = &self.node else { return };
        let written: BTreeSet<String> = [CONFIG_STATE_LABEL, CONFIG_APPLIED_LABEL, MIG_STATE_LABEL]
            .into_iter()
            .map(str::to_owned)
            .collect();
        // Nothing decided yet: do not remove what an earlier run reported.
        let patch = match self.config {
            Some(_) => fleet::label_patch(&node.labels, &desired, &written),
            None => BTreeMap::new(),
        };
        if !patch.is_empty() {
            match self.api.patch_labels(&patch).await {
                Ok(patched) => {
                    tracing::debug!(node = self.api.name(), labels = ?patch, "state labels patched");
                    let labels = patched.metadata.labels.unwrap_or_default();
                    if let Some(n) = self.node.as_mut() {
                        n.labels = labels;
                    }
                    // The answer may carry a relabel the watch has not delivered yet.
                    self.settle_if(false);
                }
                Err(error) => return self.failed("patch the state labels", &error),
            }
        }
        let uid = self.node.as_ref().and_then(|n| n.uid.clone());
        while let Some(event) = self.events.front().cloned() {
            match self
                .api
                .event(uid.as_deref(), event.kind, event.reason, &event.message)
                .await
            {
                Ok(()) => {
                    self.events.pop_front();
                }
                Err(error) => return self.failed("record an Event", &error),
            }
        }
        self.attempt = 0;
        if let Some(o) = self.outage.recovered(std::time::Instant::now()) {
            tracing::info!(node = self.api.name(), failures = o.failures, lasted = ?o.lasted,
                "Node reports written again");
        }
    }

    /// Log the refused call and back off before the next one.
    fn failed(&mut self, what: &'static str, error: &crate::platform::kube::KubeError) {
        use std::hash::{BuildHasher, Hasher};
        let mut h = self.jitter.build_hasher();
        h.write_u32(self.attempt);
        let sample = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
        let delay = fleet::backoff(
            self.attempt,
            Duration::from_millis(500),
            Duration::from_secs(60),
            sample,
        );
        self.attempt = self.attempt.saturating_add(1);
        self.retry_at = Some(Instant::now() + delay);
        let code = error.status_code();
        let hint = match code {
            Some(403) => "refused: check the RBAC and the gpu-slicer-own-node-labels policy",
            Some(409) => "conflict",
            Some(_) => "API error",
            None => "API unreachable",
        };
        tracing::warn!(node = self.api.name(), %error, ?code, retry_in = ?delay, "cannot {what} ({hint}); retrying");
        if let Some(o) = self.outage.failed(std::time::Instant::now()) {
            tracing::warn!(node = self.api.name(), failures = o.failures, lasted = ?o.lasted,
                "Node reports not written: the API server has refused or not answered; still retrying");
        }
    }
}

#[cfg(test)]
mod fleet_tests;
