//! `--labels-to-node`: the GPU Feature Discovery labels the labels writer puts into the NFD
//! feature file also go straight onto the agent's own Node, for clusters without NFD.
//!
//! Follows the state store as the labels writer does (the same pure
//! [`crate::domain::labels::build`], rebuilt only when the inventory, config or plan
//! changed) and merge-patches the Node with what differs
//! ([`crate::domain::fleet::owned_label_patch`]). What it owns is listed in the Node's
//! [`OWNED_LABELS_ANNOTATION`], written in the same patch: keys it no longer wants are
//! removed, keys it never wrote (GFD's own, an operator's) are never set, changed or
//! removed. The Node is read (GET) at start and after a failure; otherwise the last patch's
//! answer is what it compares against, so a change costs one PATCH. A failed call is logged
//! and retried after a jittered backoff; nothing about the API is fatal.
//!
//! On shutdown the labels stay on the Node (unlike the feature file, which is removed): a
//! restart or rolling update would otherwise strip and re-add the labels pods are scheduled
//! by; the next run takes over what the annotation lists.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::domain::fleet::{self, OWNED_LABELS_ANNOTATION};
use crate::platform::kube::{KubeError, NodeApi};
use crate::runtime::labels::LabelInputs;
use crate::runtime::{Context, Handle};
use crate::state::Store;

/// Settings of the Node labeller.
#[derive(Debug, Clone)]
pub(crate) struct NodeLabelsSettings {
    pub(crate) api: NodeApi,
    /// First retry delay after a failed call (doubles up to `backoff_cap`, jittered).
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_cap: Duration,
}

impl NodeLabelsSettings {
    /// Retries from 500 ms up to 60 s.
    pub(crate) fn new(api: NodeApi) -> Self {
        Self {
            api,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(60),
        }
    }
}

/// Start the labeller; it stops when the daemon stops.
pub(crate) fn spawn(settings: NodeLabelsSettings, ctx: &Context) -> Handle {
    let token = ctx.child_token();
    ctx.tracker
        .spawn(follow(settings, ctx.store.clone(), token));
    Handle::new(())
}

/// The Node's labels and the keys its annotation says we own, as last read or patched.
struct Known {
    labels: BTreeMap<String, String>,
    owned: std::collections::BTreeSet<String>,
}

impl Known {
    fn of(node: k8s_openapi::api::core::v1::Node) -> Self {
        let owned = fleet::owned_keys(
            node.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(OWNED_LABELS_ANNOTATION))
                .map(String::as_str),
        );
        Self {
            labels: node.metadata.labels.unwrap_or_default(),
            owned,
        }
    }
}

async fn follow(settings: NodeLabelsSettings, store: Store, token: CancellationToken) {
    let mut rx = store.subscribe();
    let mut built_from: Option<LabelInputs> = None;
    let mut desired = BTreeMap::new();
    let mut synced = false;
    let mut known: Option<Known> = None;
    let mut attempt: u32 = 0;
    let mut retry_at: Option<Instant> = None;
    let jitter = std::collections::hash_map::RandomState::new();
    loop {
        let snapshot = rx.borrow_and_update().clone();
        let inputs = LabelInputs::of(&snapshot);
        if built_from.as_ref().is_none_or(|b| !b.same(&inputs)) {
            let next =
                crate::domain::labels::build(&inputs.inventory, &inputs.config, &inputs.plan)
                    .labels;
            if next != desired {
                desired = next;
                synced = false;
            }
            built_from = Some(inputs);
        }
        if !synced && retry_at.is_none_or(|at| Instant::now() >= at) {
            match sync(&settings.api, &desired, &mut known).await {
                Ok(()) => {
                    synced = true;
                    attempt = 0;
                    retry_at = None;
                }
                Err(error) => {
                    known = None;
                    let delay = fleet::backoff(
                        attempt,
                        settings.backoff_base,
                        settings.backoff_cap,
                        sample(&jitter, attempt),
                    );
                    attempt = attempt.saturating_add(1);
                    retry_at = Some(Instant::now() + delay);
                    tracing::warn!(node = settings.api.name(), %error, code = ?error.status_code(),
                        retry_in = ?delay, "GPU Feature Discovery labels not put on the Node; retrying");
                }
            }
        }
        let timer = async {
            match retry_at {
                Some(at) if !synced => tokio::time::sleep_until(at).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            () = token.cancelled() => break,
            changed = rx.changed() => if changed.is_err() { break },
            () = timer => {}
        }
    }
}

/// A jitter sample in [0, 1) for `attempt`.
fn sample(jitter: &std::collections::hash_map::RandomState, attempt: u32) -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = jitter.build_hasher();
    h.write_u32(attempt);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Make the Node carry `desired` (GET first when nothing is known of it).
async fn sync(
    api: &NodeApi,
    desired: &BTreeMap<String, String>,
    known: &mut Option<Known>,
) -> Result<(), KubeError> {
    let current = match known.take() {
        Some(k) => k,
        None => Known::of(api.get().await?),
    };
    let patch = fleet::owned_label_patch(&current.labels, desired, &current.owned);
    if !patch.foreign.is_empty() {
        tracing::warn!(node = api.name(), keys = ?patch.foreign,
            "labels already on the Node and not written by gpu-slicer are left as they are");
    }
    if patch.is_empty() {
        *known = Some(current);
        return Ok(());
    }
    let node = api
        .patch_labels_and_annotation(
            &patch.labels,
            patch
                .annotation
                .as_deref()
                .map(|v| (OWNED_LABELS_ANNOTATION, v)),
        )
        .await?;
    tracing::info!(
        node = api.name(),
        changed = patch.labels.len(),
        "GPU Feature Discovery labels on the Node updated"
    );
    *known = Some(Known::of(node));
    Ok(())
}
