//! Follows the agent's own Node through the API: one GET, then one WATCH with a field
//! selector on its name (bookmarks on, so a reconnect resumes from a recent version), a new
//! GET only when the server says the version is gone (410). Errors and cut connections
//! (an API restart) reconnect after a jittered exponential backoff
//! ([`crate::domain::fleet::backoff`]), so a fleet of agents does not come back in step.
//! Exposes the Node's labels as a watch channel (`None` until the first answer: the API down
//! at start changes nothing on the node); the label reporter and the config chooser read it.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::WatchEvent;
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::domain::fleet::backoff;
use crate::platform::kube::NodeApi;
use crate::runtime::retry_summary::RetrySummary;
use crate::runtime::{Context, Handle};

/// The Node as the agent last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeView {
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) uid: Option<String>,
}

/// Settings of the watcher.
#[derive(Debug, Clone)]
pub(crate) struct NodeWatchSettings {
    pub(crate) api: NodeApi,
    /// First reconnect delay (before jitter).
    pub(crate) backoff_base: Duration,
    /// Longest reconnect delay.
    pub(crate) backoff_cap: Duration,
}

impl NodeWatchSettings {
    /// 500 ms doubling to 30 s, as client-go's reflector roughly does.
    pub(crate) fn new(api: NodeApi) -> Self {
        Self {
            api,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(30),
        }
    }
}

/// Starts the watcher; the handle exposes the Node's latest view.
pub(crate) fn spawn(
    settings: NodeWatchSettings,
    ctx: &Context,
) -> Handle<watch::Receiver<Option<NodeView>>> {
    let token = ctx.child_token();
    let (tx, rx) = watch::channel(None);
    ctx.tracker.spawn(run(settings, tx, token));
    Handle::new(rx)
}

fn view(node: &Node) -> NodeView {
    NodeView {
        labels: node.metadata.labels.clone().unwrap_or_default(),
        uid: node.metadata.uid.clone(),
    }
}

/// How one watch request ended.
enum Ended {
    /// The server closed it (timeout): watch again at once.
    Closed,
    /// 410: GET again.
    Gone,
    /// An error (its words, logged with the backoff) or a cut connection (`None`): back off.
    Failed(Option<String>),
}

async fn run(s: NodeWatchSettings, tx: watch::Sender<Option<NodeView>>, token: CancellationToken) {
    let jitter = std::collections::hash_map::RandomState::new();
    let mut attempt = 0u32;
    let mut rv: Option<String> = None;
    let mut outage = RetrySummary::default();
    let publish = |node: &Node| {
        let v = view(node);
        tx.send_if_modified(|cur| {
            let changed = cur.as_ref() != Some(&v);
            *cur = Some(v);
            changed
        });
    };
    while !token.is_cancelled() {
        let ended = match rv.clone() {
            None => match s.api.get().await {
                Ok(node) => {
                    if let Some(o) = outage.recovered(Instant::now()) {
                        tracing::info!(node = s.api.name(), failures = o.failures,
                            lasted = ?o.lasted, "own Node read again");
                    }
                    publish(&node);
                    rv = node.metadata.resource_version.clone();
                    attempt = 0;
                    continue;
                }
                Err(error) => Ended::Failed(Some(format!("cannot read own Node: {error}"))),
            },
            Some(from) => tokio::select! {
                () = token.cancelled() => return,
                e = watch_once(&s.api, &from, &mut rv, &publish) => e,
            },
        };
        match ended {
            Ended::Closed => attempt = 0,
            Ended::Gone => rv = None,
            Ended::Failed(reason) => {
                let mut h = jitter.build_hasher();
                h.write_u32(attempt);
                let sample = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
                let delay = backoff(attempt, s.backoff_base, s.backoff_cap, sample);
                // One line per retry, kube-client's own error folded in (its log target is
                // off at the subscriber: cli::logging).
                if let Some(reason) = reason {
                    tracing::warn!(node = s.api.name(), error = %reason, attempt,
                        retry_in = ?delay, "own Node: retrying");
                }
                if let Some(o) = outage.failed(Instant::now()) {
                    tracing::warn!(node = s.api.name(), failures = o.failures, lasted = ?o.lasted,
                        "own Node unreadable: the API server has not answered; still retrying");
                }
                attempt = attempt.saturating_add(1);
                tokio::select! {
                    () = token.cancelled() => return,
                    () = tokio::time::sleep(delay) => {},
                }
            }
        }
    }
}

async fn watch_once(
    api: &NodeApi,
    from: &str,
    rv: &mut Option<String>,
    publish: &impl Fn(&Node),
) -> Ended {
    let stream = match api.watch(from).await {
        Ok(s) => s,
        Err(error) => return Ended::Failed(Some(format!("cannot watch own Node: {error}"))),
    };
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(WatchEvent::Added(node) | WatchEvent::Modified(node)) => {
                publish(&node);
                *rv = node.metadata.resource_version.clone();
            }
            Ok(WatchEvent::Deleted(node)) => {
                tracing::warn!(node = api.name(), "own Node deleted");
                *rv = node.metadata.resource_version.clone();
            }
            Ok(WatchEvent::Bookmark(b)) => *rv = Some(b.metadata.resource_version),
            Ok(WatchEvent::Error(e)) if e.code == 410 => return Ended::Gone,
            Ok(WatchEvent::Error(e)) => {
                return Ended::Failed(Some(format!("watch error {}: {}", e.code, e.message)));
            }
            Err(error) => {
                tracing::debug!(node = api.name(), %error, "watch cut");
                return Ended::Failed(None);
            }
        }
    }
    Ended::Closed
}

#[cfg(test)]
mod node_watch_tests;
