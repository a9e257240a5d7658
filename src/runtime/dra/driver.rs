//! The DRA driver's core, shared by the v1 and v1beta1 services: NodePrepareResources and
//! NodeUnprepareResources per claim, over one snapshot of the state store.
//!
//! ## Who waits for what
//!
//! A Prepare reads its claims from the API ([`ClaimSource`]) concurrently and outside any
//! lock, in the RPC's own future: cutting the call there changes nothing. Everything that
//! changes state runs in a task the driver owns (spawned on its [`TaskTracker`]), and the RPC
//! only awaits that task's result: when the kubelet cancels the call (its deadline, a pod
//! deleted mid-call), tonic drops the RPC future but the task runs to its end, commits or
//! rolls back, and a retry of the same claim finds the result in memory. The ledger
//! ([`Ledger`]) sits behind a plain mutex that is never held across an await: it is taken
//! only to check that devices are free and reserve them, to mark a claim busy, and to commit.
//! A slow read of one claim delays nobody else, and an Unprepare never waits for a Prepare of
//! another claim.
//!
//! ## Why memory and disk agree at every await point
//!
//! A Prepare of N claims: (1) each claim is resolved against what is prepared *and* what
//! other in-flight prepares reserved, and reserved in the ledger (its devices now count as
//! taken; the claim is busy, so a second call for it waits for this one); (2) dynamic MIG
//! devices are made; (3) the records are written, then one fsync of their folder; (4) the
//! specs are written in parallel, then one fsync of the CDI directory; (5) the claims join
//! the next checkpoint write (group commit: one write covers every claim whose files are
//! ready, from any number of concurrent calls) and only once it is on disk do they move from
//! reserved to prepared in memory. A claim that fails after (1) is rolled back: its instances
//! destroyed, its spec and record removed, its reservation dropped, in that order. So at any
//! instant memory holds every device the disk holds (reserved or prepared), and the disk
//! holds a claim in its checkpoint only after its spec and record; a crash leaves either a
//! committed claim, or files without an entry that the next start adopts or removes
//! (`crate::platform::dra_state`), never an entry without its files.
//!
//! An Unprepare: waits for a busy claim, marks it busy, destroys its made MIG instances,
//! removes its spec (one fsync), drops it from memory and writes the checkpoint (group
//! commit), then removes its record. A crash in between leaves an entry without its spec,
//! which the next start finishes removing. An Unprepare of a claim memory does not know
//! still removes any spec or record of it on disk, and writes the checkpoint when an earlier
//! write failed. Every claim gets an entry in the answer; a claim's failure is its own
//! `error`, never the call's. A prepared claim's `status.devices` (and their removal at
//! Unprepare) is queued for [`super::status`] to write afterwards.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::task::TaskTracker;

use super::instances::{MadeForClaim, MigError};
use super::status::{StatusJob, StatusQueue};
use crate::domain::cdi::shares::HookSettings;
use crate::domain::dra::claim::{ClaimRef, NodeContext, Resolved, ResourceClaim, resolve};
use crate::domain::dra::claim_error::ClaimError;
use crate::domain::dra::status::{DeviceStatus, device_status};
use crate::domain::dra::{cdi as dra_cdi, slices};
use crate::domain::usage::{DraReport, PreparedClaimReport, PreparedDeviceReport};
use crate::platform::claims::{ClaimSource, ClaimSourceError};
use crate::platform::dra_mig::InstanceOps;
use crate::platform::dra_state::{
    DraFiles, DraStateError, Prepared, PreparedClaim, PreparedDevice, holdings,
};
use crate::state::Store;

/// What binds shares and makes dynamic MIG devices, beside the claims and files.
#[derive(Debug, Clone, Default)]
pub(crate) struct DriverExtras {
    /// The memory-limit hook share devices run (`None`: claims that need it fail).
    pub(crate) hook: Option<HookSettings>,
    /// MIG instance operations for dynamic MIG (`None`: no NVML, such claims fail).
    pub(crate) instances: Option<Arc<dyn InstanceOps>>,
    /// Test-only fault point (`run --fault dra-after-mig-create`, `fault-injection` builds): SIGKILL this
    /// process right after a claim's MIG instances are made, before its spec and checkpoint.
    pub(crate) kill_after_mig_create: bool,
    /// Unit tests only: hold the work at one stage until the test lets it go.
    #[cfg(test)]
    pub(crate) gate: Option<Arc<Gate>>,
}

/// Where a [`Gate`] holds the work (unit tests cut the RPC there).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// A Prepare, after the MIG instances were made and before any file is written.
    AfterMigMake,
    /// A Prepare, after the records and specs were written and before the checkpoint.
    BeforePrepareCommit,
    /// An Unprepare, after the spec was removed and before the checkpoint.
    BeforeUnprepareCommit,
}

/// Holds the first pass through its stage until [`Gate::release`].
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct Gate {
    stage: Stage,
    armed: std::sync::atomic::AtomicBool,
    reached: tokio::sync::Semaphore,
    release: tokio::sync::Semaphore,
}

#[cfg(test)]
impl Gate {
    /// A gate at `stage`.
    pub(crate) fn at(stage: Stage) -> Arc<Self> {
        Arc::new(Self {
            stage,
            armed: std::sync::atomic::AtomicBool::new(true),
            reached: tokio::sync::Semaphore::new(0),
            release: tokio::sync::Semaphore::new(0),
        })
    }

    /// Wait until the work is held at the stage.
    pub(crate) async fn reached(&self) {
        if let Ok(p) = self.reached.acquire().await {
            p.forget();
        }
    }

    /// Let the held work go on.
    pub(crate) fn release(&self) {
        self.release.add_permits(1);
    }

    async fn pass(&self, stage: Stage) {
        use std::sync::atomic::Ordering;
        if stage == self.stage && self.armed.swap(false, Ordering::SeqCst) {
            self.reached.add_permits(1);
            if let Ok(p) = self.release.acquire().await {
                p.forget();
            }
        }
    }
}

/// The outcome of one claim.
pub(crate) type ClaimOutcome = Result<Vec<PreparedDevice>, ClaimError>;

/// Why a step of the driver's own work (files, checkpoint, MIG) failed, before it is
/// pinned on a claim as a [`ClaimError`].
#[derive(Debug, Clone, thiserror::Error)]
enum StepError {
    /// A record, spec or checkpoint write or removal (shared by every claim it covered).
    #[error("{0}")]
    State(Arc<DraStateError>),
    /// The blocking task doing it failed.
    #[error("{what} task failed: {message}")]
    Task { what: &'static str, message: String },
    /// A claim reached the spec write without a spec.
    #[error("no spec was cut")]
    NoSpec,
    /// The checkpoint write that covered the claim did not take it.
    #[error("the checkpoint did not take it")]
    NotTaken,
    /// A made MIG instance, on a run without NVML.
    #[error("its MIG instances were made through NVML, which this run does not have")]
    NoNvml,
    /// A made MIG instance that was not destroyed.
    #[error("MIG instance {uuid} not destroyed: {source}")]
    Destroy { uuid: String, source: Arc<MigError> },
}

impl StepError {
    fn task(what: &'static str, e: &tokio::task::JoinError) -> Self {
        Self::Task {
            what,
            message: e.to_string(),
        }
    }

    /// This failure as `claim`'s refusal.
    fn for_claim(&self, claim: &ClaimRef) -> ClaimError {
        let claim = claim.to_string();
        match self {
            Self::Task { what, message } => ClaimError::Task {
                claim,
                what,
                message: message.clone(),
            },
            Self::NoNvml | Self::Destroy { .. } => ClaimError::MigDestroy {
                claim,
                message: self.to_string(),
            },
            Self::State(_) | Self::NoSpec | Self::NotTaken => ClaimError::Persistence {
                claim,
                message: self.to_string(),
            },
        }
    }
}

impl From<DraStateError> for StepError {
    fn from(e: DraStateError) -> Self {
        Self::State(Arc::new(e))
    }
}

/// A claim the API could not give.
fn unreadable(want: &ClaimRef, e: ClaimSourceError) -> ClaimError {
    let (claim, message) = (want.to_string(), e.to_string());
    match e {
        ClaimSourceError::NotFound { .. } => ClaimError::ClaimNotFound { claim, message },
        _ => ClaimError::ClaimUnreadable { claim, message },
    }
}

/// The driver core.
#[derive(Debug, Clone)]
pub(crate) struct Driver {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    driver: String,
    node: String,
    store: Store,
    claims: Arc<dyn ClaimSource>,
    files: DraFiles,
    ledger: std::sync::Mutex<Ledger>,
    /// Serialises checkpoint writes; whoever holds it writes for every claim that is ready.
    commit: tokio::sync::Mutex<()>,
    /// The tasks that change state: they outlive a cancelled RPC.
    tasks: TaskTracker,
    extras: DriverExtras,
    /// Where claim status writes are queued (none: status is not written).
    status: std::sync::OnceLock<StatusQueue>,
    /// The prepared claims as `/v1/state` shows them: a view beside the store, sent each
    /// time the committed set changes (see [`Driver::prepared_view`]).
    view: watch::Sender<Arc<DraReport>>,
}

/// What is prepared, what is being prepared, and what the checkpoint on disk has caught up
/// with.
#[derive(Debug, Default)]
struct Ledger {
    /// Committed claims: in the checkpoint on disk (a removal may still be on its way there).
    prepared: Prepared,
    /// Claims an in-flight Prepare reserved: their devices count as taken.
    reserved: BTreeMap<String, Reserved>,
    /// Claims a task is working on; a second call for one waits until the sender drops.
    busy: BTreeMap<String, watch::Sender<()>>,
    /// Changes to what the checkpoint should hold so far.
    seq: u64,
    /// The last change the checkpoint on disk holds.
    written: u64,
    /// When this run committed each prepared claim (Unix ms); claims recovered from the
    /// checkpoint have none (it does not record the time).
    prepared_at: BTreeMap<String, u64>,
}

#[derive(Debug)]
struct Reserved {
    claim: PreparedClaim,
    /// The change number once its files are on disk and it waits for the checkpoint.
    ready: Option<u64>,
    /// The checkpoint write that was to hold it failed.
    failed: Option<StepError>,
}

impl Ledger {
    /// The committed claims as `/v1/state` shows them.
    fn report(&self) -> DraReport {
        let prepared_claims = self
            .prepared
            .claims
            .iter()
            .map(|(uid, c)| PreparedClaimReport {
                uid: uid.clone(),
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                devices: c
                    .devices
                    .iter()
                    .map(|d| PreparedDeviceReport {
                        request: d.request.clone(),
                        device: d.device.clone(),
                        share_id: d.share_id.clone(),
                        cdi_ids: d.cdi_ids.clone(),
                    })
                    .collect(),
                prepared_at_ms: self.prepared_at.get(uid).copied(),
            })
            .collect();
        DraReport { prepared_claims }
    }

    /// Device → holdings of committed and reserved claims.
    fn holdings(&self) -> BTreeMap<String, Vec<crate::domain::dra::capacity::Holding>> {
        holdings(
            self.prepared
                .claims
                .iter()
                .chain(self.reserved.iter().map(|(uid, r)| (uid, &r.claim))),
        )
    }

    /// Mark `uid` busy, or the receiver to wait on when it already is.
    fn claim_busy(&mut self, uid: &str) -> Result<(), watch::Receiver<()>> {
        if let Some(tx) = self.busy.get(uid) {
            return Err(tx.subscribe());
        }
        self.busy.insert(uid.to_string(), watch::channel(()).0);
        Ok(())
    }
}

/// Wait until the task working on a claim is done (its sender dropped).
async fn done(mut rx: watch::Receiver<()>) {
    while rx.changed().await.is_ok() {}
}

/// A claim of a Prepare batch, once resolved and reserved.
struct Work {
    want: ClaimRef,
    resolved: Resolved,
    made: MadeForClaim,
    spec: Option<crate::domain::cdi::Spec>,
    answer: Vec<PreparedDevice>,
}

impl Driver {
    /// A driver over `store` whose claims come from `claims` and whose files are `files`,
    /// starting from `prepared` (the loaded checkpoint), with the hook and MIG instance
    /// operations shares and dynamic MIG devices need.
    pub(crate) fn with_extras(
        driver: &str,
        node: &str,
        store: Store,
        claims: Arc<dyn ClaimSource>,
        (files, prepared): (DraFiles, Prepared),
        extras: DriverExtras,
    ) -> Self {
        let ledger = Ledger {
            prepared,
            ..Ledger::default()
        };
        let (view, _) = watch::channel(Arc::new(ledger.report()));
        Self {
            inner: Arc::new(Inner {
                driver: driver.to_string(),
                node: node.to_string(),
                store,
                claims,
                files,
                ledger: std::sync::Mutex::new(ledger),
                commit: tokio::sync::Mutex::new(()),
                tasks: TaskTracker::new(),
                extras,
                status: std::sync::OnceLock::new(),
                view,
            }),
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        // Nothing panics while holding it; a poisoned ledger is still the ledger.
        self.inner
            .ledger
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The state-changing tasks: closed and waited for at shutdown, so a stop never cuts a
    /// Prepare or Unprepare in half.
    pub(crate) fn tasks(&self) -> &TaskTracker {
        &self.inner.tasks
    }

    /// Report prepared claims in their `status.devices` through `queue` (set once). The
    /// claims recovered from the checkpoint are queued at once: a crash may have come between
    /// a prepare's answer and its status write, and the kubelet does not prepare a running
    /// pod's claims again. The writer leaves alone a status that already says the same.
    pub(crate) fn write_status_with(&self, queue: StatusQueue) {
        if self.inner.status.set(queue).is_err() {
            return;
        }
        let claims = self.ledger().prepared.claims.clone();
        if claims.is_empty() {
            return;
        }
        let devices = slices::snapshot_devices(&self.inner.store.current());
        for (uid, claim) in &claims {
            let want = ClaimRef {
                namespace: claim.namespace.clone(),
                uid: uid.clone(),
                name: claim.name.clone(),
            };
            self.queue_status(&want, self.statuses(&devices, &claim.devices));
        }
    }

    /// What `status.devices` says of the devices `answer` prepared.
    fn statuses(
        &self,
        devices: &slices::NodeDevices,
        answer: &[PreparedDevice],
    ) -> Vec<DeviceStatus> {
        answer
            .iter()
            .filter_map(|a| {
                let d = devices.get(&a.device)?;
                let made = a.made.as_ref().map(|m| m.uuid.as_str());
                Some(
                    device_status(&self.inner.node, d, &a.cdi_ids)
                        .prepared_as(a.share_id.clone(), made),
                )
            })
            .collect()
    }

    fn queue_status(&self, claim: &ClaimRef, devices: Vec<DeviceStatus>) {
        if let Some(q) = self.inner.status.get() {
            q.push(StatusJob {
                claim: claim.clone(),
                devices,
            });
        }
    }

    /// Pool (node) name.
    pub(crate) fn pool(&self) -> &str {
        &self.inner.node
    }

    /// The state store.
    pub(crate) fn store(&self) -> &Store {
        &self.inner.store
    }

    #[cfg(test)]
    /// UIDs of the prepared claims.
    pub(crate) fn prepared_claims(&self) -> Vec<String> {
        self.ledger().prepared.claims.keys().cloned().collect()
    }

    /// Follow the prepared claims as `/v1/state` shows them. A view beside the store rather
    /// than in it: the ledger is the driver's own (its locking and group commit are what keep
    /// memory and disk in step), a claim change is not a change of the node's plan (store
    /// subscribers such as ListAndWatch and the slice publisher must not wake for it), and the
    /// usage sampler, which renders `/v1/state`, reads it once per round as it reads the
    /// PodResources ledger.
    pub(crate) fn prepared_view(&self) -> watch::Receiver<Arc<DraReport>> {
        self.inner.view.subscribe()
    }

    /// Send the committed claims to [`Self::prepared_view`] (with the ledger held, so views
    /// are sent in the order of the changes).
    fn publish_view(&self, ledger: &Ledger) {
        self.inner.view.send_replace(Arc::new(ledger.report()));
    }

    /// How many claims are prepared (checkpointed), and how many devices they hold.
    pub(crate) fn prepared_totals(&self) -> (usize, usize) {
        let ledger = self.ledger();
        let claims = &ledger.prepared.claims;
        (claims.len(), claims.values().map(|c| c.devices.len()).sum())
    }

    #[cfg(test)]
    /// UIDs of the claims a task works on now.
    pub(crate) fn busy_claims(&self) -> Vec<String> {
        self.ledger().busy.keys().cloned().collect()
    }

    /// Prepare every claim; one outcome per claim UID.
    pub(crate) async fn prepare(&self, claims: &[ClaimRef]) -> BTreeMap<String, ClaimOutcome> {
        let mut out = BTreeMap::new();
        let mut fetch: Vec<ClaimRef> = Vec::new();
        {
            let ledger = self.ledger();
            for c in claims {
                if fetch.iter().any(|f| f.uid == c.uid) {
                    // Asked twice in one call: one answer (the second would wait for itself).
                    continue;
                }
                match ledger.prepared.claims.get(&c.uid) {
                    Some(done) => {
                        out.insert(c.uid.clone(), Ok(done.devices.clone()));
                    }
                    None => fetch.push(c.clone()),
                }
            }
        }
        if fetch.is_empty() {
            return out;
        }
        let fetched = self.fetch(fetch).await;
        // From here on the work is the driver's: a dropped RPC future does not stop it.
        let this = self.clone();
        let task = self
            .inner
            .tasks
            .spawn(async move { this.prepare_fetched(fetched).await });
        match task.await {
            Ok(outcomes) => out.extend(outcomes),
            Err(e) => {
                for c in claims {
                    out.entry(c.uid.clone()).or_insert_with(|| {
                        Err(ClaimError::Task {
                            claim: c.to_string(),
                            what: "prepare",
                            message: e.to_string(),
                        })
                    });
                }
            }
        }
        out
    }

    /// GET every claim concurrently; a failure is that claim's alone.
    async fn fetch(
        &self,
        claims: Vec<ClaimRef>,
    ) -> Vec<(ClaimRef, Result<ResourceClaim, ClaimError>)> {
        let mut set = JoinSet::new();
        for (i, c) in claims.into_iter().enumerate() {
            let source = self.inner.claims.clone();
            set.spawn(async move {
                let got = source
                    .get(&c.namespace, &c.name)
                    .await
                    .map_err(|e| unreadable(&c, e));
                (i, c, got)
            });
        }
        let mut got: Vec<_> = set.join_all().await;
        got.sort_by_key(|(i, _, _)| *i);
        got.into_iter().map(|(_, c, g)| (c, g)).collect()
    }

    /// The state-changing part of a Prepare (see the module header for the order).
    async fn prepare_fetched(
        &self,
        mut fetched: Vec<(ClaimRef, Result<ResourceClaim, ClaimError>)>,
    ) -> BTreeMap<String, ClaimOutcome> {
        // A task marks its claims busy one by one and may wait for one while holding the
        // others: every task takes them in UID order, so no two wait on each other.
        fetched.sort_by(|a, b| a.0.uid.cmp(&b.0.uid));
        let mut out = BTreeMap::new();
        let mut work = Vec::new();
        for (want, got) in fetched {
            let claim = match got {
                Ok(c) => c,
                Err(e) => {
                    out.insert(want.uid.clone(), Err(e));
                    continue;
                }
            };
            match self.reserve(&want, &claim).await {
                Ok(Reservation::Done(devices)) => {
                    out.insert(want.uid.clone(), Ok(devices));
                }
                Ok(Reservation::Reserved(resolved)) => work.push(Work {
                    want,
                    resolved,
                    made: MadeForClaim::default(),
                    spec: None,
                    answer: Vec::new(),
                }),
                Err(e) => {
                    out.insert(want.uid.clone(), Err(e));
                }
            }
        }
        let mut failed = Vec::new();
        let mut ok = Vec::new();
        for w in work {
            match self.make_and_cut(w).await {
                Ok(w) => ok.push(w),
                Err((w, e)) => failed.push((w, e)),
            }
        }
        let (ok, more) = self.write_files(ok).await;
        failed.extend(more);
        #[cfg(test)]
        if let Some(g) = &self.inner.extras.gate {
            g.pass(Stage::BeforePrepareCommit).await;
        }
        let (ok, more) = self.commit_prepared(ok).await;
        failed.extend(more);
        for (w, e) in failed {
            tracing::warn!(claim = %w.want, error = %e, "claim not prepared");
            self.roll_back(&w).await;
            out.insert(w.want.uid.clone(), Err(e));
        }
        let devices =
            (!ok.is_empty()).then(|| slices::snapshot_devices(&self.inner.store.current()));
        for w in ok {
            tracing::info!(claim = %w.want, devices = w.answer.len(), "claim prepared");
            if let Some(devices) = &devices {
                self.queue_status(&w.want, self.statuses(devices, &w.answer));
            }
            self.ledger().busy.remove(&w.want.uid);
            out.insert(w.want.uid.clone(), Ok(w.answer));
        }
        out
    }

    /// Resolve `claim` against the node's devices and everything prepared or reserved, and
    /// reserve it; a claim another task works on is waited for first.
    async fn reserve(
        &self,
        want: &ClaimRef,
        claim: &ResourceClaim,
    ) -> Result<Reservation, ClaimError> {
        loop {
            let wait = {
                let mut ledger = self.ledger();
                if let Some(done) = ledger.prepared.claims.get(&want.uid) {
                    return Ok(Reservation::Done(done.devices.clone()));
                }
                match ledger.claim_busy(&want.uid) {
                    Err(rx) => rx,
                    Ok(()) => {
                        let result = self.resolve_locked(&ledger, want, claim);
                        match result {
                            Ok(resolved) => {
                                ledger.reserved.insert(
                                    want.uid.clone(),
                                    Reserved {
                                        claim: self.prepared_claim(want, &resolved, None),
                                        ready: None,
                                        failed: None,
                                    },
                                );
                                return Ok(Reservation::Reserved(resolved));
                            }
                            Err(e) => {
                                ledger.busy.remove(&want.uid);
                                return Err(e);
                            }
                        }
                    }
                }
            };
            done(wait).await;
        }
    }

    fn resolve_locked(
        &self,
        ledger: &Ledger,
        want: &ClaimRef,
        claim: &ResourceClaim,
    ) -> Result<Resolved, ClaimError> {
        let snapshot = self.inner.store.current();
        if snapshot.spec.is_none() {
            return Err(ClaimError::SpecNotWritten {
                claim: want.to_string(),
            });
        }
        let devices = slices::snapshot_devices(&snapshot);
        let taken = ledger.holdings();
        let ctx = NodeContext {
            driver: &self.inner.driver,
            pool: &self.inner.node,
            devices: &devices,
            prepared: &taken,
        };
        resolve(want, claim, &ctx)
    }

    /// The claim as the checkpoint records it.
    fn prepared_claim(
        &self,
        want: &ClaimRef,
        resolved: &Resolved,
        made: Option<&MadeForClaim>,
    ) -> PreparedClaim {
        PreparedClaim {
            namespace: want.namespace.clone(),
            name: want.name.clone(),
            devices: self.answer(want, resolved, made),
        }
    }

    fn answer(
        &self,
        want: &ClaimRef,
        resolved: &Resolved,
        made: Option<&MadeForClaim>,
    ) -> Vec<PreparedDevice> {
        resolved
            .devices
            .iter()
            .map(|d| PreparedDevice {
                request: d.request.clone(),
                pool: self.inner.node.clone(),
                device: d.device.clone(),
                cdi_ids: vec![dra_cdi::qualified_resolved(
                    &self.inner.driver,
                    &want.uid,
                    d,
                )],
                share_id: d.share.as_ref().and_then(|s| s.share_id.clone()),
                consumed: d.share.as_ref().map(|s| s.consumed),
                made: made.and_then(|m| m.records.get(&d.device).cloned()),
            })
            .collect()
    }

    /// Make the claim's MIG instances and cut its spec from the node's.
    async fn make_and_cut(&self, mut w: Work) -> Result<Work, (Work, ClaimError)> {
        let snapshot = self.inner.store.current();
        let ops = self.inner.extras.instances.as_ref();
        match super::instances::make(ops, &w.resolved.devices, &snapshot.config).await {
            Ok(made) => w.made = made,
            Err(MigError::NeedsNvml { request, device }) => {
                let claim = w.want.to_string();
                let e = ClaimError::MigNeedsNvml {
                    claim,
                    request,
                    device,
                };
                return Err((w, e));
            }
            Err(e) => {
                let e = ClaimError::MigCreate {
                    claim: w.want.to_string(),
                    message: e.to_string(),
                };
                return Err((w, e));
            }
        }
        if self.inner.extras.kill_after_mig_create && !w.made.records.is_empty() {
            tracing::error!(claim = %w.want, "fault point dra-after-mig-create: SIGKILL");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        #[cfg(test)]
        if let Some(g) = &self.inner.extras.gate {
            g.pass(Stage::AfterMigMake).await;
        }
        w.answer = self.answer(&w.want, &w.resolved, Some(&w.made));
        if let Some(r) = self.ledger().reserved.get_mut(&w.want.uid) {
            r.claim.devices.clone_from(&w.answer);
        }
        let Some(node_spec) = snapshot.spec.as_ref() else {
            let e = ClaimError::SpecNotWritten {
                claim: w.want.to_string(),
            };
            return Err((w, e));
        };
        let inputs = dra_cdi::SpecInputs {
            node: node_spec,
            hook: self.inner.extras.hook.as_ref(),
            mps: &snapshot.mps,
            made: &w.made.edits,
        };
        match dra_cdi::claim_spec_with(&self.inner.driver, &inputs, &w.resolved) {
            Ok(s) => {
                w.spec = Some(s);
                Ok(w)
            }
            Err(e) => Err((w, e)),
        }
    }

    /// Write every claim's record, one fsync of their folder, then every spec, one fsync of
    /// the CDI directory; the claims whose files are all on disk, and the others.
    async fn write_files(&self, work: Vec<Work>) -> (Vec<Work>, Vec<(Work, ClaimError)>) {
        if work.is_empty() {
            return (work, Vec::new());
        }
        let boot = self.ledger().prepared.boot_id.clone();
        let records: Vec<_> = work
            .iter()
            .map(|w| {
                let (files, uid, boot) =
                    (self.inner.files.clone(), w.want.uid.clone(), boot.clone());
                let claim = PreparedClaim {
                    namespace: w.want.namespace.clone(),
                    name: w.want.name.clone(),
                    devices: w.answer.clone(),
                };
                move || {
                    files
                        .write_record(&uid, &boot, &claim)
                        .map_err(StepError::from)
                }
            })
            .collect();
        let files = self.inner.files.clone();
        let (work, mut failed) = self
            .in_parallel(work, records, move || files.sync_records())
            .await;
        let mut work = work;
        let specs: Vec<_> = work
            .iter_mut()
            .map(|w| {
                let (files, uid, spec) =
                    (self.inner.files.clone(), w.want.uid.clone(), w.spec.take());
                move || match spec {
                    Some(s) => files.write_spec(&uid, &s).map_err(StepError::from),
                    None => Err(StepError::NoSpec),
                }
            })
            .collect();
        let files = self.inner.files.clone();
        let (work, more) = self
            .in_parallel(work, specs, move || files.sync_specs())
            .await;
        failed.extend(more);
        (work, failed)
    }

    /// Run one blocking job per claim at once, then `sync` once when any succeeded; a claim
    /// whose job or the sync failed is split off with the error.
    async fn in_parallel<J, S>(
        &self,
        work: Vec<Work>,
        jobs: Vec<J>,
        sync: S,
    ) -> (Vec<Work>, Vec<(Work, ClaimError)>)
    where
        J: FnOnce() -> Result<(), StepError> + Send + 'static,
        S: FnOnce() -> Result<(), DraStateError> + Send + 'static,
    {
        let results: Vec<Result<(), StepError>> = if jobs.len() == 1 {
            // One claim: its write and the sync in one hop to the blocking pool.
            let job = jobs.into_iter().next().map(|j| {
                move || {
                    j()?;
                    sync().map_err(StepError::from)
                }
            });
            match job {
                Some(j) => vec![
                    tokio::task::spawn_blocking(j)
                        .await
                        .unwrap_or_else(|e| Err(StepError::task("write", &e))),
                ],
                None => Vec::new(),
            }
        } else {
            let mut set = JoinSet::new();
            for (i, j) in jobs.into_iter().enumerate() {
                set.spawn_blocking(move || (i, j()));
            }
            let mut got: Vec<(usize, Result<(), StepError>)> = Vec::new();
            while let Some(r) = set.join_next().await {
                got.push(r.unwrap_or_else(|e| (usize::MAX, Err(StepError::task("write", &e)))));
            }
            got.sort_by_key(|(i, _)| *i);
            let mut results: Vec<Result<(), StepError>> = (0..work.len())
                .map(|_| {
                    Err(StepError::Task {
                        what: "write",
                        message: "it did not answer".into(),
                    })
                })
                .collect();
            for (i, r) in got {
                if let Some(slot) = results.get_mut(i) {
                    *slot = r;
                }
            }
            if results.iter().any(Result::is_ok) {
                let synced = tokio::task::spawn_blocking(move || sync().map_err(StepError::from))
                    .await
                    .unwrap_or_else(|e| Err(StepError::task("sync", &e)));
                if let Err(e) = synced {
                    for r in &mut results {
                        if r.is_ok() {
                            *r = Err(e.clone());
                        }
                    }
                }
            }
            results
        };
        let mut ok = Vec::new();
        let mut failed = Vec::new();
        for (w, r) in work.into_iter().zip(results) {
            match r {
                Ok(()) => ok.push(w),
                Err(e) => {
                    let e = e.for_claim(&w.want);
                    failed.push((w, e));
                }
            }
        }
        (ok, failed)
    }

    /// Put the claims in the next checkpoint write and, once it is on disk, in memory.
    async fn commit_prepared(&self, work: Vec<Work>) -> (Vec<Work>, Vec<(Work, ClaimError)>) {
        if work.is_empty() {
            return (work, Vec::new());
        }
        let upto = {
            let mut ledger = self.ledger();
            for w in &work {
                ledger.seq += 1;
                let seq = ledger.seq;
                if let Some(r) = ledger.reserved.get_mut(&w.want.uid) {
                    r.ready = Some(seq);
                }
            }
            ledger.seq
        };
        // Its error is each claim's `failed` below (or nobody's: a later write covered them).
        let _ = self.write_checkpoint(upto).await;
        let ledger = self.ledger();
        let mut ok = Vec::new();
        let mut failed = Vec::new();
        for w in work {
            if ledger.prepared.claims.contains_key(&w.want.uid) {
                ok.push(w);
            } else {
                let e = ledger
                    .reserved
                    .get(&w.want.uid)
                    .and_then(|r| r.failed.clone())
                    .unwrap_or(StepError::NotTaken)
                    .for_claim(&w.want);
                failed.push((w, e));
            }
        }
        (ok, failed)
    }

    /// Make the checkpoint on disk hold every change up to `upto` (group commit: whoever
    /// writes takes every ready claim and every removal so far); the write's error, if the
    /// one that covered `upto` failed.
    async fn write_checkpoint(&self, upto: u64) -> Result<(), StepError> {
        let _turn = self.inner.commit.lock().await;
        let (snapshot, seq, included) = {
            let ledger = self.ledger();
            if ledger.written >= upto {
                return Ok(());
            }
            let mut snapshot = ledger.prepared.clone();
            let mut included = Vec::new();
            for (uid, r) in &ledger.reserved {
                if r.ready.is_some() && r.failed.is_none() {
                    snapshot.claims.insert(uid.clone(), r.claim.clone());
                    included.push(uid.clone());
                }
            }
            (snapshot, ledger.seq, included)
        };
        let files = self.inner.files.clone();
        let saved = tokio::task::spawn_blocking(move || files.save(&snapshot))
            .await
            .map_err(|e| StepError::task("checkpoint write", &e))
            .and_then(|r| r.map_err(StepError::from));
        let mut ledger = self.ledger();
        match &saved {
            Ok(()) => {
                ledger.written = seq;
                let now = unix_ms();
                let changed = !included.is_empty();
                for uid in included {
                    if let Some(r) = ledger.reserved.remove(&uid) {
                        ledger.prepared_at.insert(uid.clone(), now);
                        ledger.prepared.claims.insert(uid, r.claim);
                    }
                }
                if changed {
                    self.publish_view(&ledger);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, claims = included.len(), "DRA checkpoint not written");
                for uid in included {
                    if let Some(r) = ledger.reserved.get_mut(&uid) {
                        r.failed = Some(e.clone());
                    }
                }
            }
        }
        saved
    }

    /// Undo what a failed Prepare did for `w`: instances, spec, record, then the reservation.
    async fn roll_back(&self, w: &Work) {
        if let Some(ops) = self.inner.extras.instances.as_ref() {
            super::instances::undo(ops, w.made.records.values().cloned().collect()).await;
        }
        let (files, uid) = (self.inner.files.clone(), w.want.uid.clone());
        let removed = tokio::task::spawn_blocking(move || {
            files.remove_spec(&uid)?;
            files.sync_specs()?;
            files.remove_record(&uid)
        })
        .await;
        if !matches!(removed, Ok(Ok(()))) {
            tracing::warn!(claim = %w.want, "files of a claim not prepared not all removed: the next start removes them");
        }
        let mut ledger = self.ledger();
        ledger.reserved.remove(&w.want.uid);
        ledger.busy.remove(&w.want.uid);
    }

    /// Unprepare every claim: remove its spec and its entry. Unknown claims succeed (and lose
    /// whatever of them is still on disk).
    pub(crate) async fn unprepare(
        &self,
        claims: &[ClaimRef],
    ) -> BTreeMap<String, Result<(), ClaimError>> {
        let this = self.clone();
        let owned = claims.to_vec();
        let task = self
            .inner
            .tasks
            .spawn(async move { this.unprepare_owned(owned).await });
        task.await.unwrap_or_else(|e| {
            claims
                .iter()
                .map(|c| {
                    let e = ClaimError::Task {
                        claim: c.to_string(),
                        what: "unprepare",
                        message: e.to_string(),
                    };
                    (c.uid.clone(), Err(e))
                })
                .collect()
        })
    }

    async fn unprepare_owned(
        &self,
        mut claims: Vec<ClaimRef>,
    ) -> BTreeMap<String, Result<(), ClaimError>> {
        // In UID order, as a Prepare takes them (see `prepare_fetched`).
        claims.sort_by(|a, b| a.uid.cmp(&b.uid));
        let mut out = BTreeMap::new();
        // Mark each claim busy (after any task still on it) and take what memory knows.
        let mut mine: Vec<(ClaimRef, Option<PreparedClaim>)> = Vec::new();
        for c in claims {
            if mine.iter().any(|(m, _)| m.uid == c.uid) {
                continue;
            }
            loop {
                let wait = {
                    let mut ledger = self.ledger();
                    ledger.claim_busy(&c.uid).err()
                };
                match wait {
                    Some(rx) => done(rx).await,
                    None => break,
                }
            }
            let known = self.ledger().prepared.claims.get(&c.uid).cloned();
            mine.push((c, known));
        }
        // Their MIG instances go first: a claim whose instance is still there stays
        // prepared, so the kubelet's retry destroys it.
        let mut going = Vec::new();
        for (c, known) in mine {
            match self.destroy_made(known.as_ref()).await {
                Ok(()) => going.push((c, known.is_some())),
                Err(e) => {
                    let e = e.for_claim(&c);
                    tracing::warn!(claim = %c, error = %e, "claim not unprepared");
                    self.ledger().busy.remove(&c.uid);
                    out.insert(c.uid.clone(), Err(e));
                }
            }
        }
        if going.is_empty() {
            return out;
        }
        let result = self.remove_claims(&going).await;
        let mut ledger = self.ledger();
        for (c, known) in going {
            ledger.busy.remove(&c.uid);
            match &result {
                Ok(()) => {
                    if known {
                        tracing::info!(claim = %c, "claim unprepared");
                        self.queue_status(&c, Vec::new());
                    }
                    out.insert(c.uid.clone(), Ok(()));
                }
                Err(e) => {
                    let e = e.for_claim(&c);
                    tracing::warn!(claim = %c, error = %e, "claim not unprepared");
                    out.insert(c.uid.clone(), Err(e));
                }
            }
        }
        out
    }

    /// Specs (one fsync), memory and checkpoint (group commit), then records (one fsync).
    async fn remove_claims(&self, going: &[(ClaimRef, bool)]) -> Result<(), StepError> {
        let uids: Vec<String> = going.iter().map(|(c, _)| c.uid.clone()).collect();
        let files = self.inner.files.clone();
        let specs = uids.clone();
        tokio::task::spawn_blocking(move || {
            for uid in &specs {
                files.remove_spec(uid)?;
            }
            files.sync_specs()
        })
        .await
        .map_err(|e| StepError::task("remove", &e))??;
        #[cfg(test)]
        if let Some(g) = &self.inner.extras.gate {
            g.pass(Stage::BeforeUnprepareCommit).await;
        }
        let upto = {
            let mut ledger = self.ledger();
            let before = ledger.seq;
            for uid in &uids {
                ledger.prepared_at.remove(uid);
                if ledger.prepared.claims.remove(uid).is_some() {
                    ledger.seq += 1;
                }
            }
            if ledger.seq != before {
                self.publish_view(&ledger);
            }
            ledger.seq
        };
        self.write_checkpoint(upto).await?;
        let files = self.inner.files.clone();
        tokio::task::spawn_blocking(move || {
            for uid in &uids {
                files.remove_record(uid)?;
            }
            files.sync_records()
        })
        .await
        .map_err(|e| StepError::task("remove", &e))?
        .map_err(StepError::from)
    }

    /// Destroy the MIG instances made for `claim`.
    async fn destroy_made(&self, claim: Option<&PreparedClaim>) -> Result<(), StepError> {
        let made: Vec<_> = claim
            .into_iter()
            .flat_map(|c| c.devices.iter())
            .filter_map(|d| d.made.clone())
            .collect();
        if made.is_empty() {
            return Ok(());
        }
        let ops = self
            .inner
            .extras
            .instances
            .as_ref()
            .ok_or(StepError::NoNvml)?;
        for m in &made {
            super::instances::destroy(ops, m)
                .await
                .map_err(|e| StepError::Destroy {
                    uuid: m.uuid.clone(),
                    source: Arc::new(e),
                })?;
            tracing::info!(gpu = m.gpu_index, gpu_instance = m.gpu_instance_id, mig = %m.uuid,
                "MIG instance of an unprepared claim destroyed");
        }
        Ok(())
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What [`Driver::reserve`] found.
enum Reservation {
    /// Already prepared (by an earlier call): its answer.
    Done(Vec<PreparedDevice>),
    /// Resolved and reserved: this call prepares it.
    Reserved(Resolved),
}
