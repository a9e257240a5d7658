//! The one writer of the held-device checkpoint (`held.json` under `--state-dir`, see
//! [`crate::platform::checkpoint`]).
//!
//! Allocate calls [`HeldCheckpoint::save`] before answering when it handed out something
//! new; the ledger's release path calls [`HeldCheckpoint::save_in_background`] after the
//! kubelet released devices. Both write the store's held set as it is when the write
//! starts (under the checkpoint's lock), so a later write never loses a newer record. Every
//! write runs on a blocking thread, off the async workers.

use std::sync::Arc;

use crate::platform::checkpoint::Checkpoint;
use crate::state::Store;

/// Persists the store's held set; `None` inside: not persisted (no `--state-dir`).
#[derive(Debug, Clone)]
pub(crate) struct HeldCheckpoint {
    checkpoint: Option<Arc<Checkpoint>>,
    store: Store,
}

impl HeldCheckpoint {
    /// Persist `store`'s held set into `checkpoint` (`None`: a no-op writer).
    pub(crate) fn new(checkpoint: Option<Arc<Checkpoint>>, store: Store) -> Self {
        Self { checkpoint, store }
    }

    /// Write the held set now and wait for it; `Ok` when nothing is persisted. The error
    /// is the reason as text (an I/O error naming the file, or the blocking task's end).
    pub(crate) async fn save(&self) -> Result<(), String> {
        let Some(checkpoint) = self.checkpoint.clone() else {
            return Ok(());
        };
        let store = self.store.clone();
        let saved = tokio::task::spawn_blocking(move || {
            checkpoint.save_with(|| store.current().held.as_ref().clone())
        })
        .await;
        match saved {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Write the held set without waiting (after a release); a failure is logged and the
    /// next write retries.
    pub(crate) fn save_in_background(&self) {
        let Some(checkpoint) = self.checkpoint.clone() else {
            return;
        };
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = checkpoint.save_with(|| store.current().held.as_ref().clone()) {
                tracing::error!(error = %e, "held devices not persisted after release");
            }
        });
    }
}
