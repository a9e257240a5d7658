//! Allocation ledger: which pod/container holds which device, reconciled periodically
//! against the kubelet's PodResources v1 API (`List` and `GetAllocatableResources` on
//! `…/pod-resources/kubelet.sock`), with drift detection.
//!
//! Talks to the kubelet (gRPC client over a unix socket), reads the live plan through a
//! [`ViewSource`] (the state store's views), publishes a [`LedgerSnapshot`] on a
//! `tokio::sync::watch` channel and mirrors it into [`Metrics`]. The reconciliation itself,
//! [`reconcile`], is pure.
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
use crate::domain::inventory::Health;
use crate::proto::podresources as pb;
use crate::runtime::held::HeldCheckpoint;
use crate::runtime::metrics::{Metrics, PodLabels, ResourceLabels};
use crate::runtime::triggers::Cause;
use crate::runtime::{Context, Handle};
use crate::state::Store;
use pb::pod_resources_lister_client::PodResourcesListerClient;

/// Default PodResources socket of the kubelet.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// Default reconciliation interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// Errors of one reconciliation round.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
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
pub use crate::domain::usage::Holder;

/// A mismatch between what the kubelet reports and what this agent serves.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Drift {
    /// The kubelet says a container holds a device the current plan does not have (a
    /// removed resource or device; it stays in the CDI spec until released).
    AllocatedNotPlanned {
        /// Resource name.
        resource: String,
        /// Device ID.
        device: String,
        /// Who holds it.
        holder: Holder,
    },
    /// A container holds a device that is unhealthy now.
    AllocatedUnhealthy {
        /// Resource name.
        resource: String,
        /// Device ID.
        device: String,
        /// Who holds it.
        holder: Holder,
    },
    /// The kubelet can allocate a device this agent does not advertise.
    KubeletExtra {
        /// Resource name.
        resource: String,
        /// Device ID.
        device: String,
    },
    /// This agent advertises a healthy device the kubelet cannot allocate (not yet seen,
    /// or the ListAndWatch stream is behind).
    KubeletMissing {
        /// Resource name.
        resource: String,
        /// Device ID.
        device: String,
    },
}

/// One reconciliation's outcome. `Default` is the state before the first round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerSnapshot {
    /// The last round reached the kubelet. When false, `allocations` are the last known.
    pub up: bool,
    /// Completed rounds so far (0: the kubelet was never reached).
    pub rounds: u64,
    /// Rounds so far that did not reach the kubelet.
    pub failed_rounds: u64,
    /// resource → device ID → holder, for every resource the kubelet reports (ours or not).
    pub allocations: BTreeMap<String, BTreeMap<String, Holder>>,
    /// resource → device IDs the kubelet can allocate, for the resources in the plan.
    pub kubelet_allocatable: BTreeMap<String, BTreeSet<String>>,
    /// Mismatches found by the last successful round, sorted.
    pub drift: Vec<Drift>,
    /// When the last successful round sent `List`: an allocation made after it could not
    /// be in it (see `Held::prune`).
    pub taken_at: Option<std::time::Instant>,
}

impl LedgerSnapshot {
    /// Device IDs of `resource` that containers hold, per the last successful round.
    ///
    /// This is what a reload keeps in the CDI spec: a device listed here must stay
    /// resolvable even when the new plan drops it, until the holder goes away. Empty for
    /// an unknown resource and before the kubelet was ever reached.
    pub fn allocated_ids(&self, resource: &str) -> BTreeSet<String> {
        self.allocations
            .get(resource)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Who holds `device` of `resource`, if anyone.
    pub fn holder(&self, resource: &str, device: &str) -> Option<&Holder> {
        self.allocations.get(resource)?.get(device)
    }
}

/// The live plan as the ledger sees it: the current view of every served resource. A
/// closure so a reload that swaps the plan is seen on the next round.
pub type ViewSource = Arc<dyn Fn() -> Vec<Arc<ResourceView>> + Send + Sync>;

/// Where and how often to reconcile.
#[derive(Debug, Clone)]
pub struct LedgerSettings {
    /// PodResources socket.
    pub socket: PathBuf,
    /// Time between rounds (also each RPC's timeout).
    pub interval: Duration,
}

impl Default for LedgerSettings {
    fn default() -> Self {
        Self {
            socket: PathBuf::from(DEFAULT_POD_RESOURCES_SOCKET),
            interval: DEFAULT_INTERVAL,
        }
    }
}

/// The answers of one round, in domain terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletReport {
    /// (holder, resource, device IDs) per container and resource.
    pub assigned: Vec<(Holder, String, Vec<String>)>,
    /// (resource, device IDs) the kubelet can allocate.
    pub allocatable: Vec<(String, Vec<String>)>,
    /// Devices of DRA claims, per container (every driver's).
    pub claimed: Vec<ClaimedDevice>,
}

/// One device of a DRA claim a container holds, as PodResources reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedDevice {
    /// The container.
    pub holder: Holder,
    /// Driver.
    pub driver: String,
    /// Pool.
    pub pool: String,
    /// Device name in the pool.
    pub device: String,
}

/// Which front-end serves the plan: what the kubelet's allocatable list can be compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// Device-plugin servers: the kubelet lists their devices as allocatable.
    DevicePlugin,
    /// The DRA driver: the kubelet's allocatable list does not cover its devices.
    Dra,
}

/// The driver and pool whose claimed devices are ours (DRA mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraPool {
    /// Driver name.
    pub driver: String,
    /// Pool (the node name).
    pub pool: String,
}

/// (holder, resource, device IDs) for the devices of `pool`'s claims in `claimed`: each DRA
/// device maps to the plan's devices of the same physical device (the whole GPU or its
/// replicas, or the MIG device), in every resource that serves it. A device the node does
/// not have (any more) is kept under the driver's name, so its holder is still shown.
pub(crate) fn dra_assigned(
    claimed: &[ClaimedDevice],
    pool: &DraPool,
    snapshot: &crate::state::Snapshot,
) -> Vec<(Holder, String, Vec<String>)> {
    use crate::domain::dra::slices;
    let ours: Vec<&ClaimedDevice> = claimed
        .iter()
        .filter(|c| c.driver == pool.driver && c.pool == pool.pool)
        .collect();
    if ours.is_empty() {
        return Vec::new();
    }
    let health = slices::health_map(&snapshot.inventory, &snapshot.plan, &snapshot.overlay);
    let devices = slices::node_devices(&snapshot.inventory, &snapshot.plan, &health);
    let mut by_uuid: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for view in snapshot.views.values() {
        for (d, _) in view.devices() {
            by_uuid
                .entry(d.physical.uuid.as_str())
                .or_default()
                .push((view.resource.name.as_str(), d.id.as_str()));
        }
    }
    let mut out = Vec::new();
    for c in ours {
        let planned = devices
            .get(&c.device)
            .and_then(|d| by_uuid.get(d.uuid.as_str()));
        match planned {
            Some(ids) => out.extend(ids.iter().map(|(resource, id)| {
                (
                    c.holder.clone(),
                    (*resource).to_string(),
                    vec![(*id).to_string()],
                )
            })),
            None => out.push((
                c.holder.clone(),
                pool.driver.clone(),
                vec![c.device.clone()],
            )),
        }
    }
    out
}

impl KubeletReport {
    fn from_pb(
        list: pb::ListPodResourcesResponse,
        alloc: pb::AllocatableResourcesResponse,
    ) -> Self {
        let mut assigned = Vec::new();
        let mut claimed = Vec::new();
        for pod in list.pod_resources {
            for c in pod.containers {
                let holder = Holder {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                };
                for d in c.devices {
                    assigned.push((holder.clone(), d.resource_name, d.device_ids));
                }
                let devices = c
                    .dynamic_resources
                    .into_iter()
                    .flat_map(|r| r.claim_resources);
                claimed.extend(devices.map(|d| ClaimedDevice {
                    holder: holder.clone(),
                    driver: d.driver_name,
                    pool: d.pool_name,
                    device: d.device_name,
                }));
            }
        }
        let allocatable = alloc
            .devices
            .into_iter()
            .map(|d| (d.resource_name, d.device_ids))
            .collect();
        Self {
            assigned,
            allocatable,
            claimed,
        }
    }
}

/// The domain part of a resource name (`nvidia.com` of `nvidia.com/gpu`).
fn domain(resource: &str) -> &str {
    resource.split_once('/').map_or("", |(d, _)| d)
}

/// Pure reconciliation of a kubelet report against the served views.
///
/// Drift is judged only for resources that are "ours": in the plan, or in a domain the
/// plan serves (so `nvidia.com/mig-1g.10gb` still counts after a reload removed it, while
/// another vendor's resources are recorded but never called drift). Under [`Front::Dra`]
/// the kubelet's allocatable list is not compared with the plan.
pub fn reconcile(
    report: &KubeletReport,
    views: &[Arc<ResourceView>],
    rounds: u64,
    front: Front,
) -> LedgerSnapshot {
    let planned: BTreeMap<&str, &ResourceView> = views
        .iter()
        .map(|v| (v.resource.name.as_str(), v.as_ref()))
        .collect();
    let domains: BTreeSet<&str> = planned.keys().map(|r| domain(r)).collect();
    let ours = |r: &str| planned.contains_key(r) || domains.contains(domain(r));

    let mut allocations: BTreeMap<String, BTreeMap<String, Holder>> = BTreeMap::new();
    let mut drift = Vec::new();
    for (holder, resource, ids) in &report.assigned {
        for id in ids {
            allocations
                .entry(resource.clone())
                .or_default()
                .insert(id.clone(), holder.clone());
            if !ours(resource) {
                continue;
            }
            match planned.get(resource.as_str()).and_then(|v| v.get(id)) {
                None => drift.push(Drift::AllocatedNotPlanned {
                    resource: resource.clone(),
                    device: id.clone(),
                    holder: holder.clone(),
                }),
                Some((_, h)) if h.health == Health::Unhealthy => {
                    drift.push(Drift::AllocatedUnhealthy {
                        resource: resource.clone(),
                        device: id.clone(),
                        holder: holder.clone(),
                    });
                }
                Some(_) => {}
            }
        }
    }

    let kubelet_allocatable = match front {
        Front::DevicePlugin => allocatable_drift(&report.allocatable, &planned, &ours, &mut drift),
        Front::Dra => BTreeMap::new(),
    };
    drift.sort();
    LedgerSnapshot {
        up: true,
        rounds,
        failed_rounds: 0,
        allocations,
        kubelet_allocatable,
        drift,
        taken_at: None,
    }
}

/// The kubelet's allocatable devices of our resources, and the drift between them and the
/// plan (device-plugin mode).
fn allocatable_drift(
    allocatable: &[(String, Vec<String>)],
    planned: &BTreeMap<&str, &ResourceView>,
    ours: &dyn Fn(&str) -> bool,
    drift: &mut Vec<Drift>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut kubelet_allocatable: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (resource, ids) in allocatable {
        if ours(resource) {
            kubelet_allocatable
                .entry(resource.clone())
                .or_default()
                .extend(ids.iter().cloned());
        }
    }
    for (name, view) in planned {
        let empty = BTreeSet::new();
        let kubelet = kubelet_allocatable.get(*name).unwrap_or(&empty);
        // A kubelet may or may not list unhealthy devices as allocatable (the real one
        // does, the emulator does not): an extra ID is one we do not advertise at all, a
        // missing one is one we advertise as healthy.
        for id in kubelet {
            if view.get(id).is_none() {
                drift.push(Drift::KubeletExtra {
                    resource: (*name).to_string(),
                    device: id.clone(),
                });
            }
        }
        for (d, h) in view.devices() {
            if h.health == Health::Healthy && !kubelet.contains(&d.id) {
                drift.push(Drift::KubeletMissing {
                    resource: (*name).to_string(),
                    device: d.id.clone(),
                });
            }
        }
    }
    for (resource, ids) in &kubelet_allocatable {
        if !planned.contains_key(resource.as_str()) {
            drift.extend(ids.iter().map(|id| Drift::KubeletExtra {
                resource: resource.clone(),
                device: id.clone(),
            }));
        }
    }
    kubelet_allocatable
}

/// Whether the kubelet is reachable, so that a state change is logged once and a
/// persisting failure is not logged every interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Reachability {
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
    pub fn record(&mut self, ok: bool) -> bool {
        let next = if ok { Self::Up } else { Self::Down };
        let changed = *self != next;
        *self = next;
        changed
    }
}

/// A running ledger: follow it with [`Ledger::subscribe`].
#[derive(Debug, Clone)]
pub struct Ledger {
    rx: watch::Receiver<Arc<LedgerSnapshot>>,
}

impl Ledger {
    /// Follow the snapshots; the receiver sees the latest at once.
    pub fn subscribe(&self) -> watch::Receiver<Arc<LedgerSnapshot>> {
        self.rx.clone()
    }

    /// The latest snapshot.
    pub fn snapshot(&self) -> Arc<LedgerSnapshot> {
        self.rx.borrow().clone()
    }
}

/// Shortest time a held device must be missing from the kubelet's list before it is
/// released (see [`spawn`]).
pub const RELEASE_GRACE_MIN: Duration = Duration::from_secs(1);

/// What the ledger is handed by the supervisor, for releases.
#[derive(Debug, Clone, Default)]
pub struct LedgerPeers {
    /// Persists the held set after a release (`None`: nothing persisted).
    pub held: Option<HeldCheckpoint>,
    /// Asks the reloader for a rewrite that drops released CDI devices from the spec.
    pub reload: Option<mpsc::Sender<Cause>>,
    /// DRA mode: whose claimed devices are ours (`None`: device-plugin mode).
    pub dra: Option<DraPool>,
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
pub fn spawn(settings: LedgerSettings, peers: LedgerPeers, ctx: &Context) -> Handle<Ledger> {
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
        token.clone(),
    ));
    Handle::new(token, ledger)
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
mod tests {
    use super::*;
    use crate::state::Store;

    fn health() -> Store {
        crate::testkit::fixtures::store(
            "dgx-h100",
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n",
        )
    }

    fn views(h: &Store) -> Vec<Arc<ResourceView>> {
        h.current().views.values().cloned().collect()
    }

    fn holder(pod: &str) -> Holder {
        Holder {
            namespace: "ns".into(),
            pod: pod.into(),
            container: "c".into(),
        }
    }

    #[test]
    fn reconcile_finds_holders_and_every_kind_of_drift() {
        let h = health();
        let v = views(&h);
        let ids: Vec<String> = v[0].devices().map(|(d, _)| d.id.clone()).collect();
        h.set_health(&ids[1], Health::Unhealthy, "xid-79").unwrap();
        let v = views(&h);
        let report = KubeletReport {
            assigned: vec![
                (holder("a"), "nvidia.com/gpu".into(), vec![ids[0].clone()]),
                (holder("b"), "nvidia.com/gpu".into(), vec![ids[1].clone()]),
                (
                    holder("c"),
                    "nvidia.com/mig-1g.10gb".into(),
                    vec!["gone".into()],
                ),
                (holder("d"), "example.com/fpga".into(), vec!["f0".into()]),
            ],
            // The kubelet lists all healthy devices but the last, plus one we never had.
            allocatable: vec![(
                "nvidia.com/gpu".into(),
                ids[..ids.len() - 1]
                    .iter()
                    .filter(|i| **i != ids[1])
                    .cloned()
                    .chain(["stale".to_string()])
                    .collect(),
            )],
            ..KubeletReport::default()
        };
        let s = reconcile(&report, &v, 1, Front::DevicePlugin);
        assert!(s.up);
        assert_eq!(
            s.allocated_ids("nvidia.com/gpu"),
            [ids[0].clone(), ids[1].clone()].into()
        );
        assert_eq!(
            s.allocated_ids("nvidia.com/mig-1g.10gb"),
            ["gone".to_string()].into()
        );
        assert_eq!(s.holder("example.com/fpga", "f0"), Some(&holder("d")));
        assert!(s.allocated_ids("nvidia.com/none").is_empty());
        let expected = vec![
            Drift::AllocatedNotPlanned {
                resource: "nvidia.com/mig-1g.10gb".into(),
                device: "gone".into(),
                holder: holder("c"),
            },
            Drift::AllocatedUnhealthy {
                resource: "nvidia.com/gpu".into(),
                device: ids[1].clone(),
                holder: holder("b"),
            },
            Drift::KubeletExtra {
                resource: "nvidia.com/gpu".into(),
                device: "stale".into(),
            },
            Drift::KubeletMissing {
                resource: "nvidia.com/gpu".into(),
                device: ids[ids.len() - 1].clone(),
            },
        ];
        let mut expected = expected;
        expected.sort();
        assert_eq!(s.drift, expected);
    }

    #[test]
    fn allocated_counts_only_devices_the_plan_has() {
        let h = health();
        let v = views(&h);
        let ids: Vec<String> = v[0].devices().map(|(d, _)| d.id.clone()).collect();
        let report = KubeletReport {
            assigned: vec![
                (holder("a"), "nvidia.com/gpu".into(), vec![ids[0].clone()]),
                // A stale ID the kubelet still lists (e.g. from an old layout).
                (
                    holder("b"),
                    "nvidia.com/gpu".into(),
                    vec!["GPU-gone::0".into()],
                ),
                // Held from a resource a reload removed: kept for its holder.
                (
                    holder("c"),
                    "nvidia.com/mig-1g.10gb".into(),
                    vec!["MIG-x".into()],
                ),
            ],
            allocatable: vec![("nvidia.com/gpu".into(), ids.clone())],
            ..KubeletReport::default()
        };
        let snapshot = reconcile(&report, &v, 1, Front::DevicePlugin);
        let metrics = Metrics::new();
        PublishedPods::default().publish(&metrics, &snapshot, &v);
        let text = metrics.encode_prometheus();
        assert!(
            text.contains("gpu_slicer_allocated_devices{resource=\"nvidia.com/gpu\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("gpu_slicer_allocated_devices{resource=\"nvidia.com/mig-1g.10gb\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn a_matching_report_has_no_drift() {
        let h = health();
        let v = views(&h);
        let ids: Vec<String> = v[0].devices().map(|(d, _)| d.id.clone()).collect();
        let report = KubeletReport {
            assigned: vec![(holder("a"), "nvidia.com/gpu".into(), ids[..3].to_vec())],
            allocatable: vec![("nvidia.com/gpu".into(), ids.clone())],
            ..KubeletReport::default()
        };
        let s = reconcile(&report, &v, 7, Front::DevicePlugin);
        assert_eq!(s.drift, vec![]);
        assert_eq!(s.rounds, 7);
        assert_eq!(s.allocated_ids("nvidia.com/gpu").len(), 3);
    }

    #[test]
    fn dra_devices_map_to_the_plan_devices_of_the_same_physical_device() {
        let store = crate::testkit::fixtures::store("mixed-a100", "flags: {migStrategy: mixed}\n");
        let snapshot = store.current();
        let pool = DraPool {
            driver: "gpu-slicer.io".into(),
            pool: "node-a".into(),
        };
        let claimed = |driver: &str, pool: &str, device: &str| ClaimedDevice {
            holder: holder("p"),
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
        };
        let got = dra_assigned(
            &[
                claimed("gpu-slicer.io", "node-a", "gpu-2"),
                claimed("gpu-slicer.io", "node-a", "gpu-0-mig-1g10gb-19-1"),
                claimed("gpu-slicer.io", "node-a", "gpu-7"),
                claimed("gpu-slicer.io", "node-b", "gpu-3"),
                claimed("other.example.com", "node-a", "gpu-3"),
            ],
            &pool,
            &snapshot,
        );
        let got: Vec<(String, Vec<String>)> = got.into_iter().map(|(_, r, ids)| (r, ids)).collect();
        assert_eq!(
            got,
            [
                (
                    "nvidia.com/gpu".to_string(),
                    vec!["GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02".to_string()]
                ),
                (
                    "nvidia.com/mig-1g.10gb".to_string(),
                    vec!["MIG-1b2c3d4e-0000-4a00-8000-000000000008".to_string()]
                ),
                // Not on this node (any more): kept under the driver's name, never dropped.
                ("gpu-slicer.io".to_string(), vec!["gpu-7".to_string()]),
            ]
        );
        // Under the DRA front-end the kubelet's (device-plugin) allocatable list is not drift.
        let report = KubeletReport {
            assigned: vec![(
                holder("p"),
                "nvidia.com/gpu".into(),
                vec!["GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02".into()],
            )],
            ..KubeletReport::default()
        };
        let v = views(&store);
        assert!(reconcile(&report, &v, 1, Front::Dra).drift.is_empty());
        assert!(
            !reconcile(&report, &v, 1, Front::DevicePlugin)
                .drift
                .is_empty()
        );
    }

    #[test]
    fn reachability_reports_only_changes() {
        let mut r = Reachability::default();
        assert!(r.record(false), "first failure is logged");
        assert!(!r.record(false), "a persisting failure is not");
        assert!(!r.record(false));
        assert!(r.record(true), "recovery is logged");
        assert!(!r.record(true));
        assert!(r.record(false));
    }
}

#[cfg(test)]
mod ops_tests;
