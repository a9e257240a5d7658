//! The labels writer: follows the state store and keeps the NFD feature file
//! (`--labels-file`) equal to the node's labels.
//!
//! Every committed snapshot (start, config reload, re-scan, MIG change, health) is turned
//! into a label set by the pure [`crate::domain::labels::build`]; the file is rewritten only
//! when that set differs from the one last written, so health flaps and allocations cause
//! no writes. A failed write is logged and retried on a timer (labels are an aid to the
//! scheduler, never a reason to stop serving devices). A node with no GPUs has no labels:
//! the file is removed. On shutdown the file is removed, as GPU Feature Discovery removes
//! its own: a node whose agent is gone should not keep advertising what it served. File
//! operations run on blocking threads through [`crate::platform::labels_file`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::domain::labels::{self, NodeLabels};
use crate::platform::labels_file;
use crate::runtime::{Context, Handle};
use crate::state::Store;

/// Default of `--labels-file`: NFD's local feature directory, a file of our own (GFD writes
/// `gfd` beside it, so both can coexist while a cluster migrates).
pub(crate) const DEFAULT_LABELS_FILE: &str =
    "/etc/kubernetes/node-feature-discovery/features.d/gpu-slicer";

/// How long after a failed write the writer tries again.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_secs(30);

/// Settings of the labels writer.
#[derive(Debug, Clone)]
pub(crate) struct LabelsSettings {
    /// The feature file.
    pub(crate) path: PathBuf,
    /// Retry delay after a failed write.
    pub(crate) retry: Duration,
}

impl LabelsSettings {
    /// Write `path`, retrying failures every [`RETRY_INTERVAL`].
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            retry: RETRY_INTERVAL,
        }
    }
}

/// Start the writer; it stops (and removes the file) when the daemon stops.
pub(crate) fn spawn(settings: LabelsSettings, ctx: &Context) -> Handle {
    let token = ctx.child_token();
    ctx.tracker
        .spawn(follow(settings, ctx.store.clone(), token));
    Handle::new(())
}

async fn follow(settings: LabelsSettings, store: Store, token: CancellationToken) {
    let mut rx = store.subscribe();
    // What the file holds now, as far as this writer knows; `None` until a write succeeds.
    let mut written: Option<BTreeMap<String, String>> = None;
    // What the labels last matched were built from: most commits (health events, every
    // Allocate's held set) change none of these, and then nothing is rebuilt.
    let mut built_from: Option<LabelInputs> = None;
    loop {
        let snapshot = rx.borrow_and_update().clone();
        let inputs = LabelInputs::of(&snapshot);
        let mut retry = None;
        if built_from.as_ref().is_none_or(|b| !b.same(&inputs)) {
            let next = labels::build(&snapshot.inventory, &snapshot.config, &snapshot.plan);
            if written.as_ref() == Some(&next.labels) {
                built_from = Some(inputs);
            } else {
                for warning in &next.warnings {
                    tracing::warn!(file = %settings.path.display(), warning = %warning, "node labels");
                }
                if apply(&settings.path, &next).await {
                    written = Some(next.labels);
                    built_from = Some(inputs);
                } else {
                    retry = Some(tokio::time::sleep(settings.retry));
                }
            }
        }
        let retry = async {
            match retry {
                Some(sleep) => sleep.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = token.cancelled() => break,
            changed = rx.changed() => if changed.is_err() { break },
            () = retry => {}
        }
    }
    if written.is_some() {
        let path = settings.path.clone();
        match tokio::task::spawn_blocking(move || labels_file::remove(&path)).await {
            Ok(Ok(_)) => tracing::info!(file = %settings.path.display(), "node labels removed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "node labels not removed"),
            Err(e) => tracing::warn!(error = %e, "node labels not removed"),
        }
    }
}

/// The parts of a snapshot the labels are built from (only these: holding the whole
/// snapshot would keep its views and held set alive).
pub(crate) struct LabelInputs {
    pub(crate) inventory: Arc<crate::domain::inventory::Inventory>,
    pub(crate) config: Arc<crate::domain::config::Config>,
    pub(crate) plan: Arc<crate::domain::plan::Plan>,
}

impl LabelInputs {
    pub(crate) fn of(s: &crate::domain::snapshot::Snapshot) -> Self {
        Self {
            inventory: s.inventory.clone(),
            config: s.config.clone(),
            plan: s.plan.clone(),
        }
    }

    pub(crate) fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inventory, &other.inventory)
            && Arc::ptr_eq(&self.config, &other.config)
            && Arc::ptr_eq(&self.plan, &other.plan)
    }
}

/// Write (or, with no labels, remove) the file; `true` when the file now matches.
async fn apply(path: &std::path::Path, next: &NodeLabels) -> bool {
    let (path_owned, text, empty) = (path.to_path_buf(), next.to_feature_file(), next.is_empty());
    let result = tokio::task::spawn_blocking(move || {
        if empty {
            labels_file::remove(&path_owned).map(|_| None)
        } else {
            labels_file::write(&path_owned, text.as_bytes()).map(Some)
        }
    })
    .await;
    match result {
        Ok(Ok(outcome)) => {
            tracing::info!(
                file = %path.display(),
                labels = next.labels.len(),
                written = outcome.is_some_and(|o| o == labels_file::WriteOutcome::Written),
                "node labels updated"
            );
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "node labels not written; retrying");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "node labels task failed; retrying");
            false
        }
    }
}
