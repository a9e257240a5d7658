//! The one writer of the held-device checkpoint (`held.json` under `--state-dir`, see
//! [`crate::platform::checkpoint`]).
//!
//! Allocate calls [`HeldCheckpoint::save`] before answering when it handed out something
//! new; the ledger's release path calls [`HeldCheckpoint::save_in_background`] after the
//! kubelet released devices. Both write the store's held set as it is when the write
//! starts (under the checkpoint's lock), so a later write never loses a newer record. Every
//! write runs on a blocking thread, off the async workers.

use std::sync::Arc;

use crate::platform::checkpoint::{Checkpoint, CheckpointError};
use crate::state::Store;

/// Persists the store's held set; `None` inside: not persisted (no `--state-dir`).
#[derive(Debug, Clone)]
pub(crate) struct HeldCheckpoint {
    checkpoint: Option<Arc<Checkpoint>>,
    store: Store,
}

/// Why the held set was not persisted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HeldError {
    /// The checkpoint file could not be written (the error names it).
    #[error(transparent)]
    Write(#[from] CheckpointError),
    /// The blocking write task panicked or was cancelled.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

impl HeldCheckpoint {
    /// Persist `store`'s held set into `checkpoint` (`None`: a no-op writer).
    pub(crate) fn new(checkpoint: Option<Arc<Checkpoint>>, store: Store) -> Self {
        Self { checkpoint, store }
    }

    /// Write the held set now and wait for it; `Ok` when nothing is persisted.
    pub(crate) async fn save(&self) -> Result<(), HeldError> {
        let Some(checkpoint) = self.checkpoint.clone() else {
            return Ok(());
        };
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            checkpoint.save_with(|| store.current().held.as_ref().clone())
        })
        .await??;
        Ok(())
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
