//! Watch streams of the emulator: synthetic `ADDED` events for the current state when asked
//! (no resourceVersion, `0`, or `sendInitialEvents`), then every matching change from the
//! store's history after the requested version; `BOOKMARK`s when the client allows them (on
//! [`super::ApiServer::bookmark`] and every bookmark interval); an `ERROR` event with a 410
//! `Status` when the version was compacted away; the end of the stream at `timeoutSeconds`,
//! when the client goes away or when the server goes down.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::serve::{Body, Shared, event_line, status, stream_response, visible};
use super::store::{Kind, Selectors};

/// Starts one watch; its task runs on the emulator's tracker.
pub(crate) fn start(
    shared: Arc<Shared>,
    down: CancellationToken,
    kind: Kind,
    namespace: Option<String>,
    sel: Selectors,
    params: &HashMap<String, String>,
) -> Response<Body> {
    let rv_param = params
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or("");
    let bookmarks = params
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true" || v == "1");
    let send_initial = params.get("sendInitialEvents").is_some_and(|v| v == "true");
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs);
    let from = match rv_param {
        "" | "0" => None,
        v => match v.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => return status(400, "BadRequest", &format!("invalid resourceVersion {v:?}")),
        },
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let watch = Watch {
        shared: shared.clone(),
        kind,
        namespace,
        sel,
        bookmarks,
    };
    shared.tracker.spawn(async move {
        let deadline = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = down.cancelled() => {},
            () = deadline => {},
            () = watch.run(tx, from, send_initial) => {},
        }
    });
    stream_response(rx)
}

struct Watch {
    shared: Arc<Shared>,
    kind: Kind,
    namespace: Option<String>,
    sel: Selectors,
    bookmarks: bool,
}

impl Watch {
    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object = json!({"kind": self.kind.kind, "apiVersion": self.kind.api_version(), "metadata": meta});
        event_line("BOOKMARK", &object)
    }

    fn gone(rv: u64, oldest: u64) -> Bytes {
        let object = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {rv} ({oldest})"), "reason": "Expired", "code": 410});
        event_line("ERROR", &object)
    }

    /// The lines for changes after `cursor`, and the version they bring the watch to; `Err`
    /// with the 410 line when `cursor` was compacted away.
    fn pending(&self, cursor: u64) -> Result<(Vec<Bytes>, u64), Bytes> {
        let store = self.shared.store();
        if cursor < store.oldest {
            return Err(Self::gone(cursor, store.oldest));
        }
        let in_scope = |ns: &str| self.namespace.as_deref().is_none_or(|want| want == ns);
        let lines = store
            .history
            .iter()
            .filter(|c| c.rv > cursor && c.key.kind == self.kind && in_scope(&c.key.namespace))
            .filter_map(|c| {
                let old = c.old.as_ref().map(|o| self.sel.matches(o));
                visible(c.change, self.sel.matches(&c.object), old)
                    .map(|t| event_line(t, &c.object))
            })
            .collect();
        Ok((lines, store.rv))
    }

    async fn run(self, tx: mpsc::Sender<Bytes>, from: Option<u64>, send_initial: bool) {
        let mut changed = self.shared.changed.subscribe();
        let mut bookmark_now = self.shared.bookmark.subscribe();
        let interval = self.shared.policy().bookmark_interval;
        let mut cursor = match from {
            Some(rv) if !send_initial => rv,
            _ => {
                let (items, rv): (Vec<Value>, u64) = {
                    let store = self.shared.store();
                    (
                        store.list(self.kind, self.namespace.as_deref(), &self.sel),
                        store.rv,
                    )
                };
                for item in &items {
                    if tx.send(event_line("ADDED", item)).await.is_err() {
                        return;
                    }
                }
                if send_initial && self.bookmarks && tx.send(self.bookmark(rv, true)).await.is_err()
                {
                    return;
                }
                rv
            }
        };
        loop {
            changed.borrow_and_update();
            match self.pending(cursor) {
                Err(gone) => {
                    let _ = tx.send(gone).await;
                    return;
                }
                Ok((lines, rv)) => {
                    for line in lines {
                        if tx.send(line).await.is_err() {
                            return;
                        }
                    }
                    cursor = rv;
                }
            }
            let tick = async {
                match interval {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            let send_bookmark = tokio::select! {
                r = changed.changed() => if r.is_err() { return } else { false },
                r = bookmark_now.changed() => if r.is_err() { return } else { true },
                () = tick => true,
                () = tx.closed() => return,
            };
            if send_bookmark
                && self.bookmarks
                && tx.send(self.bookmark(cursor, false)).await.is_err()
            {
                return;
            }
        }
    }
}
