//! MPS daemons inside the node daemon: start them before their resources are advertised and
//! mirror each daemon's state onto the health of the replicas it serves.
//!
//! Called once by `crate::app::run` with the plan, the [`HealthMap`] and the daemon's
//! tracker/token. Health is keyed by the replicas' kubelet device IDs (`<uuid>::<n>`), never
//! by the GPU or MIG UUID: the NVML health task owns those keys, and a daemon coming back
//! must not clear an XID that NVML reported on the same GPU (nor the reverse).

use std::collections::BTreeMap;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::daemon::{DaemonState, DaemonStates, Supervisor, SupervisorConfig};
use super::{Result, daemons_for};
use crate::allocate::HealthMap;
use crate::config::Config;
use crate::inventory::Health;
use crate::plan::Plan;

/// Replica device IDs per daemon UUID.
type Replicas = BTreeMap<String, Vec<String>>;

/// Start one control daemon per MPS-shared GPU/MIG device of `plan` on `tracker` (stopped
/// by `token`), wait until they are up (at most the supervisor's ready timeout), set the
/// health of their replicas, and keep it in step with the daemons. Returns `None` when the
/// plan uses no MPS. A daemon still down after the wait is not fatal: its replicas are
/// advertised Unhealthy and become Healthy once the supervisor's restarts succeed.
pub async fn start(
    plan: &Plan,
    cfg: &Config,
    supervisor: SupervisorConfig,
    health: &HealthMap,
    tracker: &TaskTracker,
    token: CancellationToken,
) -> Result<Option<Supervisor>> {
    let daemons = daemons_for(plan, cfg)?;
    if daemons.is_empty() {
        return Ok(None);
    }
    let mut replicas: Replicas = daemons
        .iter()
        .map(|d| (d.uuid.clone(), Vec::new()))
        .collect();
    for (_, device) in plan.devices() {
        if let (Some(ids), Some(_)) = (replicas.get_mut(&device.physical.uuid), device.replica) {
            ids.push(device.id.clone());
        }
    }
    let wait = supervisor.ready_timeout;
    tracing::info!(daemons = daemons.len(), bin = %supervisor.control_bin.display(), "starting MPS control daemons");
    let sup = Supervisor::start(daemons, supervisor, tracker, token.clone());
    if let Err(e) = sup.wait_up(wait).await {
        tracing::error!(error = %e, "MPS control daemons not all up; their devices are advertised Unhealthy until they are");
    }
    let mut rx = sup.states();
    let mut last = DaemonStates::new();
    let current = rx.borrow_and_update().clone();
    mirror(health, &replicas, &current, &mut last);
    let health = health.clone();
    tracker.spawn(async move {
        loop {
            tokio::select! {
                // A reload replaces this set of daemons: once cancelled, never write health
                // again, or a stopping daemon would mark the new set's replicas down.
                biased;
                () = token.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
            if token.is_cancelled() {
                return;
            }
            let current = rx.borrow_and_update().clone();
            mirror(&health, &replicas, &current, &mut last);
        }
    });
    Ok(Some(sup))
}

/// Apply the daemons whose state changed since `last` to their replicas' health.
fn mirror(
    health: &HealthMap,
    replicas: &Replicas,
    current: &DaemonStates,
    last: &mut DaemonStates,
) {
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
    use crate::config::{self, Overrides};
    use crate::inventory::{Backend, sim::SimBackend};

    #[test]
    fn daemon_state_marks_only_its_replicas_and_leaves_gpu_keys_alone() {
        let cfg = config::parse(
            "flags: {migStrategy: mixed, mpsRoot: /tmp/mps}\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n",
            "t.yaml",
            &Overrides::default(),
        )
        .unwrap();
        let inv = SimBackend::open("mixed-a100").unwrap().discover().unwrap();
        let plan = crate::plan::build(&inv, &cfg).unwrap();
        let health = HealthMap::new(&plan);
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
