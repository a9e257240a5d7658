//! The claim-status writer: after the kubelet has its answer, the driver queues what a
//! prepared claim's `status.devices` should say (or, at Unprepare, that this driver's entries
//! go), and this task writes it through the [`ClaimSource`], one claim at a time in queue
//! order, so the prepare never waits on the API. A failed write is tried again with backoff
//! (200 ms doubling, five tries); a 403 is not retried and logged once per run at warn (the
//! RBAC grants `resourceclaims/status`; 1.36+ servers also want the `resourceclaims/driver`
//! rule), since the claim works without its status. The queue is bounded: when it is full the
//! entry is dropped with a warning rather than holding the prepare.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::domain::dra::claim::ClaimRef;
use crate::domain::dra::status::DeviceStatus;
use crate::platform::claims::{ClaimSource, ClaimSourceError};

/// Most claims waiting for their status write.
const QUEUE: usize = 1024;
/// Tries per write.
const TRIES: u32 = 5;
/// First wait between tries (doubling).
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// One claim's status to write: its devices, or none to remove this driver's entries.
#[derive(Debug, Clone)]
pub(crate) struct StatusJob {
    pub(crate) claim: ClaimRef,
    pub(crate) devices: Vec<DeviceStatus>,
}

/// Where the driver queues status writes.
#[derive(Debug, Clone)]
pub(crate) struct StatusQueue(mpsc::Sender<StatusJob>);

impl StatusQueue {
    /// Queue `job`; never waits (a full queue drops it, with a warning).
    pub(crate) fn push(&self, job: StatusJob) {
        if let Err(e) = self.0.try_send(job) {
            let claim = match &e {
                mpsc::error::TrySendError::Full(j) | mpsc::error::TrySendError::Closed(j) => {
                    j.claim.to_string()
                }
            };
            tracing::warn!(%claim, error = %e, "claim status not queued");
        }
    }
}

/// Start the writer for `driver` on `tracker`, until `stop`.
pub(crate) fn spawn(
    claims: Arc<dyn ClaimSource>,
    driver: String,
    tracker: &TaskTracker,
    stop: CancellationToken,
) -> StatusQueue {
    let (tx, mut rx) = mpsc::channel::<StatusJob>(QUEUE);
    tracker.spawn(async move {
        let mut forbidden_told = false;
        loop {
            let job = tokio::select! {
                () = stop.cancelled() => return,
                job = rx.recv() => match job { Some(j) => j, None => return },
            };
            let written = tokio::select! {
                () = stop.cancelled() => return,
                r = write(claims.as_ref(), &driver, &job) => r,
            };
            match written {
                Ok(()) => tracing::debug!(claim = %job.claim, devices = job.devices.len(), "claim status written"),
                Err(ClaimSourceError::Status { code: Some(403), message, .. }) if !forbidden_told => {
                    forbidden_told = true;
                    tracing::warn!(claim = %job.claim, error = %message, "claim status not written: forbidden (grant update on resourceclaims/status and, on 1.36+, associated-node:update on resourceclaims/driver); not told again");
                }
                Err(ClaimSourceError::Status { code: Some(403), .. }) => {}
                Err(error) => tracing::warn!(claim = %job.claim, %error, "claim status not written"),
            }
        }
    });
    StatusQueue(tx)
}

async fn write(
    claims: &dyn ClaimSource,
    driver: &str,
    job: &StatusJob,
) -> Result<(), ClaimSourceError> {
    let mut wait = FIRST_BACKOFF;
    let mut tries = 1;
    loop {
        match claims
            .set_device_status(&job.claim, driver, &job.devices)
            .await
        {
            Ok(()) => return Ok(()),
            Err(
                e @ ClaimSourceError::Status {
                    code: Some(403), ..
                },
            ) => return Err(e),
            Err(e) if tries >= TRIES => return Err(e),
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait = wait.saturating_mul(2);
                tries += 1;
            }
        }
    }
}
