//! MPS daemons inside the node daemon: a reconciler that follows the state store's MPS
//! daemon set, starting new daemons, stopping removed ones and restarting only those whose
//! settings changed, and that mirrors each daemon's state onto the health of the replicas
//! it serves.
//!
//! Nothing waits for a daemon to come up: its replicas are advertised Unhealthy
//! ("starting") until it is, so neither startup, a reload nor `/readyz` is held up. Health
//! is keyed by the replicas' kubelet device IDs (`<uuid>::<n>`), never by the GPU or MIG
//! UUID: the NVML health monitor owns those keys, and a daemon coming back must not clear
//! an XID that NVML reported on the same GPU (nor the reverse).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::daemon::{DaemonState, DaemonStates, Supervisor, SupervisorConfig};
use crate::domain::inventory::Health;
use crate::domain::mps::DaemonSpec;
use crate::domain::plan::Plan;
use crate::domain::transition::mps_change;
use crate::runtime::{Context, Handle};
use crate::state::{Snapshot, Store};

/// Replica device IDs per daemon UUID.
type Replicas = BTreeMap<String, Vec<String>>;

/// The replicas each daemon of `daemons` serves in `plan`.
fn replicas_of(plan: &Plan, daemons: &[DaemonSpec]) -> Replicas {
    let mut replicas: Replicas = daemons
        .iter()
        .map(|d| (d.uuid.clone(), Vec::new()))
        .collect();
    for (_, device) in plan.devices() {
        if let (Some(ids), Some(_)) = (replicas.get_mut(&device.physical.uuid), device.replica) {
            ids.push(device.id.clone());
        }
    }
    replicas
}

/// The running daemons: one supervisor (and token) per daemon, so one can be replaced
/// without touching the others.
#[derive(Debug)]
pub(crate) struct Reconciler {
    store: Store,
    config: SupervisorConfig,
    tracker: TaskTracker,
    token: CancellationToken,
    running: BTreeMap<String, (DaemonSpec, CancellationToken)>,
    seen: Option<Arc<Vec<DaemonSpec>>>,
}

impl Reconciler {
    /// A reconciler with no daemon running yet.
    pub(crate) fn new(
        store: Store,
        config: SupervisorConfig,
        tracker: &TaskTracker,
        token: CancellationToken,
    ) -> Self {
        Self {
            store,
            config,
            tracker: tracker.clone(),
            token,
            running: BTreeMap::new(),
            seen: None,
        }
    }

    /// Bring the running daemons in line with `snapshot`'s set. Synchronous: the replicas
    /// of started daemons are marked starting before this returns, so a resource served
    /// after it is never advertised healthy before its daemon is up.
    pub(crate) fn reconcile(&mut self, snapshot: &Snapshot) {
        if self
            .seen
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &snapshot.mps))
        {
            return;
        }
        self.seen = Some(snapshot.mps.clone());
        let current: Vec<DaemonSpec> = self.running.values().map(|(s, _)| s.clone()).collect();
        let change = mps_change(&current, &snapshot.mps);
        if change.start.is_empty() && change.stop.is_empty() {
            return;
        }
        for uuid in &change.stop {
            if let Some((_, token)) = self.running.remove(uuid) {
                token.cancel();
            }
        }
        tracing::info!(
            start = change.start.len(),
            stop = change.stop.len(),
            keep = change.keep.len(),
            bin = %self.config.control_bin.display(),
            "MPS control daemons follow the plan"
        );
        for spec in change.start {
            let token = self.token.child_token();
            let replicas = replicas_of(&snapshot.plan, std::slice::from_ref(&spec));
            self.running
                .insert(spec.uuid.clone(), (spec.clone(), token.clone()));
            let sup = Supervisor::start(
                vec![spec],
                self.config.clone(),
                &self.tracker,
                token.clone(),
            );
            follow(sup, replicas, self.store.clone(), &self.tracker, token);
        }
    }
}

/// Start the reconciler: the daemons of the store's current snapshot are started (their
/// replicas marked starting) before this returns, so a resource served after it is never
/// advertised healthy before its daemon is up; then it follows the store, reconciling on
/// every change of the MPS daemon set, until the daemon stops.
pub(crate) fn spawn(settings: SupervisorConfig, ctx: &Context) -> Handle {
    let token = ctx.child_token();
    let mut reconciler = Reconciler::new(
        ctx.store.clone(),
        settings,
        &ctx.tracker,
        token.child_token(),
    );
    let mut rx = ctx.store.subscribe();
    let first = rx.borrow_and_update().clone();
    reconciler.reconcile(&first);
    ctx.tracker.spawn(async move {
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
            let snapshot = rx.borrow_and_update().clone();
            reconciler.reconcile(&snapshot);
        }
    });
    Handle::new(())
}

/// Mirror one supervisor's daemon states onto its replicas until its token is cancelled.
fn follow(
    sup: Supervisor,
    replicas: Replicas,
    store: Store,
    tracker: &TaskTracker,
    token: CancellationToken,
) {
    let mut rx = sup.states();
    let mut last = DaemonStates::new();
    let current = rx.borrow_and_update().clone();
    mirror(&store, &replicas, &current, &mut last);
    tracker.spawn(async move {
        loop {
            tokio::select! {
                // A replaced daemon: once cancelled, never write health again, or a
                // stopping daemon would mark the new one's replicas down.
                biased;
                () = token.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
            if token.is_cancelled() {
                return;
            }
            let current = rx.borrow_and_update().clone();
            mirror(&store, &replicas, &current, &mut last);
        }
    });
}

/// Apply the daemons whose state changed since `last` to their replicas' health.
fn mirror(health: &Store, replicas: &Replicas, current: &DaemonStates, last: &mut DaemonStates) {
    for (uuid, state) in current {
        let before = last.get(uuid).map(DaemonState::is_up);
        if before == Some(state.is_up()) {
            continue;
        }
        // The device state carries a short code (it becomes the `reason` metric label and
        // the Allocate refusal); the daemon's own words go to the log line below.
        let (h, reason) = match state {
            DaemonState::Up => (Health::Healthy, "mps-up"),
            DaemonState::Starting => (Health::Unhealthy, "mps-starting"),
            DaemonState::Down { .. } => (Health::Unhealthy, "mps-down"),
        };
        for id in replicas.get(uuid).into_iter().flatten() {
            if let Err(e) = health.set_health(id, h, reason) {
                tracing::warn!(device = %id, error = %e, "MPS health update ignored");
            }
        }
        tracing::info!(uuid = %uuid, health = %h, reason, state = %state, "MPS daemon state applied to its devices");
        last.insert(uuid.clone(), state.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_state_marks_only_its_replicas_and_leaves_gpu_keys_alone() {
        let (inv, _, plan) = crate::testkit::fixtures::planned(
            "mixed-a100",
            "flags: {migStrategy: mixed, mpsRoot: /tmp/mps}\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n",
        );
        let health = Store::new(crate::domain::snapshot::Snapshot::serving(
            crate::testkit::fixtures::config("flags: {migStrategy: mixed}\n"),
            inv.clone(),
            plan,
        ));
        let (g2, g3) = (inv.gpus[2].uuid.clone(), inv.gpus[3].uuid.clone());
        let replicas: Replicas = [&g2, &g3]
            .iter()
            .map(|u| ((*u).clone(), vec![format!("{u}::0"), format!("{u}::1")]))
            .collect();
        // NVML says GPU 3 is bad (GPU-UUID key); the MPS daemon of GPU 3 is up.
        health.set_health(&g3, Health::Unhealthy, "xid 79").unwrap();
        let mut last = DaemonStates::new();
        let down = DaemonState::Down {
            reason: "killed by signal 9".into(),
        };
        let states: DaemonStates = [(g2.clone(), down), (g3.clone(), DaemonState::Up)].into();
        mirror(&health, &replicas, &states, &mut last);
        let view = health.view("nvidia.com/gpu").unwrap();
        let unhealthy = |id: &str| view.get(id).unwrap().1.health == Health::Unhealthy;
        assert!(unhealthy(&format!("{g2}::0")) && unhealthy(&format!("{g2}::1")));
        assert!(
            unhealthy(&format!("{g3}::0")),
            "the daemon being up must not clear the NVML event"
        );
        let states: DaemonStates =
            [(g2.clone(), DaemonState::Up), (g3.clone(), DaemonState::Up)].into();
        mirror(&health, &replicas, &states, &mut last);
        let view = health.view("nvidia.com/gpu").unwrap();
        assert_eq!(
            view.get(&format!("{g2}::1")).unwrap().1.health,
            Health::Healthy
        );
        assert_eq!(
            view.get(&format!("{g3}::1")).unwrap().1.health,
            Health::Unhealthy
        );
    }
}
