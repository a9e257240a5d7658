//! The DRA front-end as the daemon runs it (`run --dra`): the driver over the daemon's store
//! and inotify instance, its readiness on `/readyz` (the kubelet's registration verdict),
//! the Node Event telling what the start recovered or repaired, and, with an API, the
//! ResourceSlice publisher. It never fails once started: it has no resource servers, so
//! the supervisor has nothing to wait on from it but the stop.
//!
//! Talks to: [`super::spawn_watched`] (the driver), [`super::publish`],
//! `crate::runtime::http::Readiness`, `crate::platform::kube::NodeApi` (the Event).

use std::sync::Arc;

use tokio::sync::watch;

use super::{DraModeSettings, DraRuntimeError};
use crate::domain::usage::DraReport;
use crate::platform::dra_state::{LoadOutcome, Repair};
use crate::platform::fswatch::DirWatch;
use crate::runtime::Context;
use crate::runtime::http::Readiness;

/// How many repairs the recovery Event names before it gives a count.
const REPAIRS_SHOWN: usize = 5;

/// Start the driver and, with an API, the slice publisher; `/readyz` waits for the kubelet
/// to accept the driver's registration. Returns the view of its prepared claims.
pub(crate) async fn start(
    dra: DraModeSettings,
    fs: &Arc<DirWatch>,
    readiness: &Arc<Readiness>,
    ctx: &Context,
) -> Result<watch::Receiver<Arc<DraReport>>, DraRuntimeError> {
    let name = dra.driver.driver.clone();
    readiness.expect_resources([name.clone()]);
    let handle = super::spawn_watched(dra.driver, dra.claims, fs, ctx).await?;
    let exposed = handle.into_inner();
    follow_registration(name, exposed.registration.clone(), readiness.clone(), ctx);
    if let Some(p) = dra.publish {
        if let Some(message) = recovery_message(&exposed.loaded, &exposed.repairs) {
            recovery_event(p.node.clone(), message, ctx);
        }
        super::publish::spawn(p, ctx);
    }
    Ok(exposed.prepared)
}

/// Mark the driver registered on `/readyz` while the kubelet's last verdict is a success.
fn follow_registration(
    name: String,
    mut verdicts: watch::Receiver<super::Verdict>,
    readiness: Arc<Readiness>,
    ctx: &Context,
) {
    let token = ctx.child_token();
    ctx.tracker.spawn(async move {
        loop {
            let registered = matches!(*verdicts.borrow_and_update(), Some(Ok(())));
            readiness.mark_registered(&name, registered);
            tokio::select! {
                () = token.cancelled() => return,
                changed = verdicts.changed() => if changed.is_err() { return },
            }
        }
    });
}

/// What the Node is told about the start: a checkpoint kept aside, repairs (bounded: a
/// node with thousands of strays gets a count, not a huge Event); `None` when nothing
/// happened.
fn recovery_message(loaded: &LoadOutcome, repairs: &[Repair]) -> Option<String> {
    let mut messages = Vec::new();
    if let LoadOutcome::Corrupt { kept_as } = loaded {
        messages.push(format!(
            "DRA checkpoint unreadable: kept aside as {}, prepared claims recovered from their records and CDI specs",
            kept_as.display()
        ));
    }
    if !repairs.is_empty() {
        let shown: Vec<String> = repairs
            .iter()
            .take(REPAIRS_SHOWN)
            .map(ToString::to_string)
            .collect();
        let more = repairs.len().saturating_sub(shown.len());
        let tail = if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        };
        messages.push(format!(
            "DRA state repaired at start ({} repairs): {}{tail}",
            repairs.len(),
            shown.join("; ")
        ));
    }
    (!messages.is_empty()).then(|| messages.join(". "))
}

/// Tell the Node once what the driver's start recovered or repaired, so an operator sees it
/// without the agent's logs; the API may be down, then the log lines and the counter are all
/// there is.
fn recovery_event(node: crate::platform::kube::NodeApi, message: String, ctx: &Context) {
    let token = ctx.child_token();
    ctx.tracker.spawn(async move {
        let sent = tokio::select! {
            () = token.cancelled() => return,
            sent = node.event(
                None,
                crate::platform::kube::EventKind::Warning,
                "DraCheckpointRecovered",
                &message,
            ) => sent,
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, "DRA checkpoint recovery Event not recorded");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recovery_message_names_what_happened_and_stays_bounded() {
        assert_eq!(recovery_message(&LoadOutcome::Fresh, &[]), None);
        let repairs: Vec<Repair> = (0..7)
            .map(|i| Repair::Adopted {
                claim: format!("c{i}"),
            })
            .collect();
        let kept = LoadOutcome::Corrupt {
            kept_as: "/state/dra-prepared.json.corrupt".into(),
        };
        let message = recovery_message(&kept, &repairs).expect("something happened");
        assert!(
            message.starts_with(
                "DRA checkpoint unreadable: kept aside as /state/dra-prepared.json.corrupt"
            ),
            "{message}"
        );
        assert!(
            message.contains("DRA state repaired at start (7 repairs)"),
            "{message}"
        );
        assert!(
            message.contains("claim c4:") && !message.contains("claim c5:"),
            "{message}"
        );
        assert!(message.ends_with("; and 2 more"), "{message}");
    }
}
