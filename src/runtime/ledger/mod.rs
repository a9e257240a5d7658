//! Allocation ledger: which pod/container holds which device, reconciled periodically
//! against the kubelet's PodResources v1 API (`List` and `GetAllocatableResources` on
//! `…/pod-resources/kubelet.sock`), with drift detection.
//!
//! Talks to the kubelet (gRPC client over a unix socket), reads the live plan through a
//! [`ViewSource`] (the state store's views), publishes a [`LedgerSnapshot`] on a
//! `tokio::sync::watch` channel and mirrors it into [`Metrics`]. The reconciliation itself,
//! [`reconcile`](mod@reconcile), is pure.
//!
//! In DRA mode ([`LedgerPeers::dra`]) the kubelet reports our devices per container as the
//! devices of DRA claims (`dynamic_resources`: driver, pool, device): each device of our
//! driver and pool is attributed to its container under the plan's resource and device IDs
//! of the same physical device (a whole GPU, its replicas, or a MIG device), so metrics,
//! usage and `top` name the pod as for a device-plugin device; and the kubelet's allocatable
//! list, which only covers device plugins, is not compared with the plan.
//!
//! An absent or unreachable socket degrades the ledger rather than failing the daemon: the
//! first failure is logged once, `gpu_slicer_ledger_up` drops to 0, the last known
//! allocations are kept (a kubelet restart must not make the agent forget what containers
//! hold), and the ledger retries quietly every interval until the kubelet answers again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

use crate::domain::allocate::ResourceView;
use crate::proto::podresources as pb;
use crate::runtime::held::HeldCheckpoint;
use crate::runtime::metrics::{Metrics, PodLabels, ResourceLabels};
use crate::runtime::triggers::Cause;
use crate::runtime::{Context, Handle};
use crate::state::Store;
use pb::pod_resources_lister_client::PodResourcesListerClient;

mod reconcile;

use reconcile::domain;
pub(crate) use reconcile::dra_assigned;
pub(crate) use reconcile::{ClaimedDevice, DraPool, Drift, Front, KubeletReport, reconcile};

/// Default PodResources socket of the kubelet.
pub(crate) const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// Default reconciliation interval.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// Errors of one reconciliation round.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LedgerError {
    /// The socket could not be dialled (absent, refused, not a socket).
    #[error("cannot connect to pod-resources socket {path}: {reason}")]
    Connect {
        path: String,
        /// The whole cause chain: tonic's own message is only "transport error".
        reason: String,
    },
    /// The kubelet answered an RPC with an error.
    #[error("pod-resources {rpc} on {path} failed: {status}")]
    Rpc {
        rpc: &'static str,
        path: String,
        status: Box<tonic::Status>,
    },
    /// The kubelet did not answer within the interval.
    #[error("pod-resources {rpc} on {path} did not answer within {timeout:?}")]
    Timeout {
        rpc: &'static str,
        path: String,
        timeout: Duration,
    },
}

/// Who holds a device (the same value usage attribution joins on).
pub(crate) use crate::domain::usage::Holder;

/// One reconciliation's outcome. `Default` is the state before the first round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LedgerSnapshot {
    /// The last round reached the kubelet. When false, `allocations` are the last known.
    pub(crate) up: bool,
    /// Completed rounds so far (0: the kubelet was never reached).
    pub(crate) rounds: u64,
    /// Rounds so far that did not reach the kubelet.
    pub(crate) failed_rounds: u64,
    /// resource → device ID → holder, for every resource the kubelet reports (ours or not).
    pub(crate) allocations: BTreeMap<String, BTreeMap<String, Holder>>,
    /// resource → device IDs the kubelet can allocate, for the resources in the plan.
    pub(crate) kubelet_allocatable: BTreeMap<String, BTreeSet<String>>,
    /// Mismatches found by the last successful round, sorted.
    pub(crate) drift: Vec<Drift>,
    /// When the last successful round sent `List`: an allocation made after it could not
    /// be in it (see `Held::prune`).
    pub(crate) taken_at: Option<std::time::Instant>,
}

impl LedgerSnapshot {
    /// Device IDs of `resource` that containers hold, per the last successful round.
    ///
    /// This is what a reload keeps in the CDI spec: a device listed here must stay
    /// resolvable even when the new plan drops it, until the holder goes away. Empty for
    /// an unknown resource and before the kubelet was ever reached.
    pub(crate) fn allocated_ids(&self, resource: &str) -> BTreeSet<String> {
        self.allocations
            .get(resource)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    #[cfg(test)]
    /// Who holds `device` of `resource`, if anyone.
    pub(crate) fn holder(&self, resource: &str, device: &str) -> Option<&Holder> {
        self.allocations.get(resource)?.get(device)
    }
}

/// The live plan as the ledger sees it: the current view of every served resource. A
/// closure so a reload that swaps the plan is seen on the next round.
pub(crate) type ViewSource = Arc<dyn Fn() -> Vec<Arc<ResourceView>> + Send + Sync>;

/// Where and how often to reconcile.
#[derive(Debug, Clone)]
pub(crate) struct LedgerSettings {
    /// PodResources socket.
    pub(crate) socket: PathBuf,
    /// Time between rounds (also each RPC's timeout).
    pub(crate) interval: Duration,
}

impl Default for LedgerSettings {
    fn default() -> Self {
        Self {
            socket: PathBuf::from(DEFAULT_POD_RESOURCES_SOCKET),
            interval: DEFAULT_INTERVAL,
        }
    }
}

/// Whether the kubelet is reachable, so that a state change is logged once and a
/// persisting failure is not logged every interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Reachability {
    /// No round ran yet.
    #[default]
    Unknown,
    /// The last round succeeded.
    Up,
    /// The last round failed.
    Down,
}

impl Reachability {
    /// Record a round's outcome; true when this is a change worth a log line.
    pub(crate) fn record(&mut self, ok: bool) -> bool {
        let next = if ok { Self::Up } else { Self::Down };
        let changed = *self != next;
        *self = next;
        changed
    }
}

/// A running ledger: follow it with [`Ledger::subscribe`].
#[derive(Debug, Clone)]
pub(crate) struct Ledger {
    rx: watch::Receiver<Arc<LedgerSnapshot>>,
}

impl Ledger {
    /// Follow the snapshots; the receiver sees the latest at once.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Arc<LedgerSnapshot>> {
        self.rx.clone()
    }

    #[cfg(test)]
    /// The latest snapshot.
    pub(crate) fn snapshot(&self) -> Arc<LedgerSnapshot> {
        self.rx.borrow().clone()
    }
}

/// Shortest time a held device must be missing from the kubelet's list before it is
/// released (see [`spawn`]).
pub(crate) const RELEASE_GRACE_MIN: Duration = Duration::from_secs(1);

/// What the ledger is handed by the supervisor, for releases.
#[derive(Debug, Clone, Default)]
pub(crate) struct LedgerPeers {
    /// Persists the held set after a release (`None`: nothing persisted).
    pub(crate) held: Option<HeldCheckpoint>,
    /// Asks the reloader for a rewrite that drops released CDI devices from the spec.
    pub(crate) reload: Option<mpsc::Sender<Cause>>,
    /// DRA mode: whose claimed devices are ours (`None`: device-plugin mode).
    pub(crate) dra: Option<DraPool>,
}

/// Turns a round's claimed devices into (holder, resource, device IDs) entries.
type ClaimMapper =
    Arc<dyn Fn(&[ClaimedDevice]) -> Vec<(Holder, String, Vec<String>)> + Send + Sync>;

/// Start the ledger: the views come from the state store (a re-plan is seen on the next
/// round); the first round runs at once, and the snapshot starts as
/// `LedgerSnapshot::default()` (down, nothing known). Every successful round releases, in
/// the store, held devices the kubelet no longer reports, then persists the held set and
/// asks for a reload through `peers` (the spec may drop devices kept only for the released
/// holders). A round that fails releases nothing.
pub(crate) fn spawn(settings: LedgerSettings, peers: LedgerPeers, ctx: &Context) -> Handle<Ledger> {
    let token = ctx.child_token();
    let live = ctx.store.clone();
    let views: ViewSource = Arc::new(move || live.current().views.values().cloned().collect());
    let (tx, rx) = watch::channel(Arc::new(LedgerSnapshot::default()));
    ctx.metrics.ledger_up.set(0);
    // A device recorded by Allocate may be missing from a list taken just after it (the
    // kubelet records it once Allocate answered): only a device missing for longer than
    // this is released.
    let grace = (settings.interval * 2).max(RELEASE_GRACE_MIN);
    let claims: Option<ClaimMapper> = peers.dra.clone().map(|pool| {
        let live = ctx.store.clone();
        Arc::new(move |claimed: &[ClaimedDevice]| dra_assigned(claimed, &pool, &live.current()))
            as ClaimMapper
    });
    ctx.tracker.spawn(reconcile_loop(
        settings,
        (views, claims),
        ctx.metrics.clone(),
        tx,
        token.clone(),
    ));
    let ledger = Ledger { rx };
    ctx.tracker.spawn(release_held(
        ledger.subscribe(),
        ctx.store.clone(),
        peers,
        grace,
        token,
    ));
    Handle::new(ledger)
}

async fn release_held(
    mut snapshots: watch::Receiver<Arc<LedgerSnapshot>>,
    store: Store,
    peers: LedgerPeers,
    grace: Duration,
    token: CancellationToken,
) {
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            changed = snapshots.changed() => if changed.is_err() { return },
        }
        let snapshot = snapshots.borrow_and_update().clone();
        if let (true, Some(taken_at)) = (snapshot.up, snapshot.taken_at) {
            let held: BTreeMap<String, BTreeSet<String>> = snapshot
                .allocations
                .iter()
                .map(|(r, devices)| (r.clone(), devices.keys().cloned().collect()))
                .collect();
            if let Some(now_held) = store.release(&held, taken_at, grace) {
                tracing::info!(
                    held = now_held.len(),
                    "held devices released by the kubelet"
                );
                if let Some(reload) = &peers.reload {
                    // Full: a reload is already pending, which covers this release.
                    let _ = reload.try_send(Cause::Released);
                }
                if let Some(held) = &peers.held {
                    held.save_in_background();
                }
            }
        }
    }
}

async fn connect(path: &Path) -> Result<PodResourcesListerClient<Channel>, LedgerError> {
    let shown = path.display().to_string();
    let err = |e: tonic::transport::Error| {
        let mut reason = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            // Wrappers often repeat their source's text: name each cause once.
            let text = c.to_string();
            if !reason.ends_with(&text) {
                reason.push_str(": ");
                reason.push_str(&text);
            }
            cause = c.source();
        }
        LedgerError::Connect {
            path: shown.clone(),
            reason,
        }
    };
    let channel = Endpoint::from_shared(format!("unix://{shown}"))
        .map_err(err)?
        .connect()
        .await
        .map_err(err)?;
    Ok(PodResourcesListerClient::new(channel))
}

async fn query(
    client: &mut PodResourcesListerClient<Channel>,
    path: &Path,
    timeout: Duration,
) -> Result<KubeletReport, LedgerError> {
    let shown = || path.display().to_string();
    let list = tokio::time::timeout(timeout, client.list(pb::ListPodResourcesRequest {}))
        .await
        .map_err(|_| LedgerError::Timeout {
            rpc: "List",
            path: shown(),
            timeout,
        })?
        .map_err(|status| LedgerError::Rpc {
            rpc: "List",
            path: shown(),
            status: Box::new(status),
        })?
        .into_inner();
    let alloc = tokio::time::timeout(
        timeout,
        client.get_allocatable_resources(pb::AllocatableResourcesRequest {}),
    )
    .await
    .map_err(|_| LedgerError::Timeout {
        rpc: "GetAllocatableResources",
        path: shown(),
        timeout,
    })?
    .map_err(|status| LedgerError::Rpc {
        rpc: "GetAllocatableResources",
        path: shown(),
        status: Box::new(status),
    })?
    .into_inner();
    Ok(KubeletReport::from_pb(list, alloc))
}

async fn reconcile_loop(
    settings: LedgerSettings,
    (views, claims): (ViewSource, Option<ClaimMapper>),
    metrics: Arc<Metrics>,
    tx: watch::Sender<Arc<LedgerSnapshot>>,
    token: CancellationToken,
) {
    let socket = settings.socket.display().to_string();
    let mut client: Option<PodResourcesListerClient<Channel>> = None;
    let mut reach = Reachability::default();
    let mut published = PublishedPods::default();
    let (mut rounds, mut failed_rounds) = (0u64, 0u64);
    let mut ticker = tokio::time::interval(settings.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = token.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let taken_at = std::time::Instant::now();
        let round = async {
            if client.is_none() {
                client = Some(connect(&settings.socket).await?);
            }
            match client.as_mut() {
                Some(c) => query(c, &settings.socket, settings.interval).await,
                None => unreachable!("client was just set"),
            }
        };
        let outcome = tokio::select! {
            () = token.cancelled() => break,
            r = round => r,
        };
        match outcome {
            Ok(mut report) => {
                rounds += 1;
                let front = match &claims {
                    Some(map) => {
                        let held = map(&report.claimed);
                        report.assigned.extend(held);
                        Front::Dra
                    }
                    None => Front::DevicePlugin,
                };
                let mut snapshot = reconcile(&report, &views(), rounds, front);
                snapshot.taken_at = Some(taken_at);
                snapshot.failed_rounds = failed_rounds;
                if reach.record(true) {
                    tracing::info!(socket = %socket, pods = report.assigned.len(), "pod-resources ledger up");
                }
                let drifted = snapshot.drift.len();
                if drifted > 0 && snapshot.drift != tx.borrow().drift {
                    tracing::warn!(socket = %socket, devices = drifted, first = ?snapshot.drift.first(), "allocation drift");
                }
                published.publish(&metrics, &snapshot, &views());
                metrics.ledger_up.set(1);
                metrics
                    .ledger_drift
                    .set(i64::try_from(drifted).unwrap_or(i64::MAX));
                tx.send_replace(Arc::new(snapshot));
            }
            Err(error) => {
                // A broken channel is rebuilt next round.
                client = None;
                if reach.record(false) {
                    tracing::warn!(socket = %socket, %error, "pod-resources ledger down; keeping last known allocations and retrying quietly");
                } else {
                    tracing::debug!(socket = %socket, %error, "pod-resources ledger still down");
                }
                metrics.ledger_up.set(0);
                failed_rounds += 1;
                tx.send_modify(|s| {
                    let mut down = LedgerSnapshot::clone(s);
                    down.up = false;
                    down.failed_rounds = failed_rounds;
                    *s = Arc::new(down);
                });
            }
        }
    }
    tracing::debug!(socket = %socket, "ledger stopped");
}

/// The per-pod and per-resource allocation series last published, so that series of
/// released devices or removed resources are deleted instead of lingering.
#[derive(Debug, Default)]
struct PublishedPods {
    pods: BTreeSet<(String, String, String, String, String)>,
    resources: BTreeSet<String>,
}

impl PublishedPods {
    fn publish(
        &mut self,
        metrics: &Metrics,
        snapshot: &LedgerSnapshot,
        views: &[Arc<ResourceView>],
    ) {
        let mut pods = BTreeSet::new();
        for (resource, devices) in &snapshot.allocations {
            for (device, h) in devices {
                pods.insert((
                    h.namespace.clone(),
                    h.pod.clone(),
                    h.container.clone(),
                    resource.clone(),
                    device.clone(),
                ));
            }
        }
        let labels = |(namespace, pod, container, resource, device): &(
            String,
            String,
            String,
            String,
            String,
        )| PodLabels {
            namespace: namespace.clone(),
            pod: pod.clone(),
            container: container.clone(),
            resource: resource.clone(),
            device: device.clone(),
        };
        for gone in self.pods.difference(&pods) {
            metrics.pod_allocation.remove(&labels(gone));
        }
        for p in &pods {
            metrics.pod_allocation.get_or_create(&labels(p)).set(1);
        }
        self.pods = pods;

        // Allocated counts for every planned resource (0 when nothing is held) and for
        // resources still held after a reload removed them (their devices stay in the CDI
        // spec for the holder). For a planned resource only devices the plan has count:
        // an ID the kubelet lists that this node does not have (a stale checkpoint, a
        // previous MIG layout) is drift, reported as such, not used capacity.
        let mut resources: BTreeSet<String> =
            views.iter().map(|v| v.resource.name.clone()).collect();
        resources.extend(
            snapshot
                .allocations
                .keys()
                .filter(|r| views.iter().any(|v| domain(&v.resource.name) == domain(r)))
                .cloned(),
        );
        for gone in self.resources.difference(&resources) {
            metrics.allocated.remove(&ResourceLabels {
                resource: gone.clone(),
            });
        }
        for r in &resources {
            let planned = views.iter().find(|v| v.resource.name == *r);
            let n = snapshot.allocations.get(r).map_or(0, |held| match planned {
                Some(v) => held
                    .keys()
                    .filter(|id| v.resource.device(id).is_some())
                    .count(),
                None => held.len(),
            });
            metrics
                .allocated
                .get_or_create(&ResourceLabels {
                    resource: r.clone(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.resources = resources;
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod ops_tests;
