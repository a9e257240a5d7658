//! HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (process alive), `/readyz`
//! (registered with the kubelet and CDI spec written) and `/v1/state` (the node's usage as
//! JSON, for `gpu-slicer top`), on hyper 1.
//!
//! It reads [`crate::runtime::metrics::Metrics`], a [`Readiness`] handle that the supervisor
//! updates and the usage sampler's watch (`/v1/state` answers the JSON the sampler rendered
//! once per round, so a request's work does not grow with the node); it owns nothing else. Unknown paths get 404, other methods 405. Clients are
//! bounded by [`guard`]: a connection cap (the oldest goes first), a header-read timeout,
//! and paced, rate-limited accept errors, so idle connections cannot exhaust descriptors.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::runtime::metrics::Metrics;
use crate::runtime::usage::UsageWatch;
use crate::runtime::{Context, Handle};
use crate::state::Store;

/// Path of the JSON state document.
pub(crate) const STATE_PATH: &str = "/v1/state";

mod guard;

/// Errors of the HTTP endpoint.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// `/readyz` says no: what is missing (CDI spec, registrations), `; `-separated.
    #[error("{}", .missing.join("; "))]
    NotReady { missing: Vec<String> },
}

/// What `/readyz` reports: each flag is set by the part of the agent that owns it.
///
/// Whether the CDI spec is written is read from the state store when the readiness
/// follows one ([`Readiness::following`], as the daemon's does): the snapshot's
/// `spec_written`, so nothing copies it. `registered` is derived: the supervisor names the resources of the plan being served
/// ([`Readiness::expect_resources`], again after every re-plan) and each resource task
/// reports its registration ([`Readiness::mark_registered`]); the flag is true while every
/// expected resource is registered. Embedders that manage readiness themselves may store
/// the flags directly.
#[derive(Debug, Default)]
pub(crate) struct Readiness {
    /// Every planned resource is registered with the kubelet.
    pub(crate) registered: AtomicBool,
    /// The CDI spec for the current plan is on disk; read only when no store is followed
    /// (embedders that manage readiness themselves).
    pub(crate) spec_written: AtomicBool,
    resources: Mutex<ResourceRegistrations>,
    /// The daemon's state: the spec flag is its snapshot's.
    store: Option<Store>,
}

#[derive(Debug, Default)]
struct ResourceRegistrations {
    expected: BTreeSet<String>,
    registered: BTreeSet<String>,
}

impl ResourceRegistrations {
    fn all_registered(&self) -> bool {
        !self.expected.is_empty() && self.expected.is_subset(&self.registered)
    }
}

impl Readiness {
    /// A readiness whose spec flag is `store`'s current snapshot's `spec_written`.
    pub(crate) fn following(store: Store) -> Self {
        Self {
            store: Some(store),
            ..Self::default()
        }
    }

    fn spec_written(&self) -> bool {
        match &self.store {
            Some(store) => store.current().spec_written,
            None => self.spec_written.load(Ordering::Acquire),
        }
    }

    /// The resources that must be registered for the agent to be ready (the plan's).
    pub(crate) fn expect_resources<I: IntoIterator<Item = String>>(&self, names: I) {
        let mut r = self
            .resources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        r.expected = names.into_iter().collect();
        let ResourceRegistrations {
            expected,
            registered,
        } = &mut *r;
        registered.retain(|n| expected.contains(n));
        self.registered.store(r.all_registered(), Ordering::Release);
    }

    /// A resource task registered with the kubelet (`true`) or stopped serving (`false`).
    pub(crate) fn mark_registered(&self, resource: &str, registered: bool) {
        let mut r = self
            .resources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if registered {
            r.registered.insert(resource.to_string());
        } else {
            r.registered.remove(resource);
        }
        self.registered.store(r.all_registered(), Ordering::Release);
    }

    /// Whether the agent is ready, and if not, why.
    pub(crate) fn check(&self) -> Result<(), HttpError> {
        let mut missing = Vec::new();
        if !self.spec_written() {
            missing.push("CDI spec not written".to_string());
        }
        if !self.registered.load(Ordering::Acquire) {
            let r = self
                .resources
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let waiting: Vec<&str> = r
                .expected
                .difference(&r.registered)
                .map(String::as_str)
                .collect();
            if waiting.is_empty() {
                missing.push("not registered with the kubelet".to_string());
            } else {
                missing.push(format!(
                    "not registered with the kubelet: {}",
                    waiting.join(", ")
                ));
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(HttpError::NotReady { missing })
        }
    }
}

/// Bind the listen address (`:9400`, `0.0.0.0:9400`, `127.0.0.1:0`).
pub(crate) async fn bind(addr: &str) -> Result<TcpListener, HttpError> {
    let normalised = if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    };
    TcpListener::bind(&normalised)
        .await
        .map_err(|source| HttpError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// What the endpoint is handed by the supervisor.
#[derive(Debug)]
pub(crate) struct HttpPeers {
    /// What `/readyz` reports.
    pub(crate) readiness: Arc<Readiness>,
    /// The usage sampler's rounds for `/v1/state` (`None`: 503).
    pub(crate) usage: Option<UsageWatch>,
}

/// Serve on `listener` (bound by [`bind`], so a bad address fails the start) until the
/// daemon stops. The handle exposes the address it listens on.
pub(crate) fn spawn(
    listener: TcpListener,
    peers: HttpPeers,
    ctx: &Context,
) -> Handle<Option<SocketAddr>> {
    let token = ctx.child_token();
    let addr = local_addr(&listener);
    ctx.tracker.spawn(serve_with_state(
        listener,
        ctx.metrics.clone(),
        peers.readiness,
        peers.usage,
        token,
    ));
    Handle::new(addr)
}

#[cfg(test)]
/// Serve until `shutdown` is cancelled; in-flight requests finish first. `/v1/state`
/// answers 503 (no usage sampler): see [`serve_with_state`].
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    shutdown: CancellationToken,
) {
    serve_with_state(listener, metrics, readiness, None, shutdown).await;
}

/// As `serve` (the tests' form), with `/v1/state` answered from the usage sampler's `state`.
pub(crate) async fn serve_with_state(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    state: Option<UsageWatch>,
    shutdown: CancellationToken,
) {
    let limits = guard::ConnectionLimits::for_this_process();
    let tracker = TaskTracker::new();
    let local = listener.local_addr().ok();
    let addr = local.map_or_else(|| "unknown".to_string(), |a| a.to_string());
    tracing::info!(
        %addr,
        max_connections = limits.max_connections,
        header_read_timeout_s = limits.header_read_timeout.as_secs(),
        "http endpoint listening"
    );
    let slots = guard::Slots::new(limits.max_connections);
    let mut backoff = guard::AcceptBackoff::default();
    let mut accept_warn = guard::LogEvery::new(guard::ACCEPT_WARN_INTERVAL);
    let mut cap_warn = guard::LogEvery::new(guard::ACCEPT_WARN_INTERVAL);
    let mut evicted_since_warn = 0usize;
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => {
                backoff.reset();
                a
            }
            Err(error) => {
                let exhausted = guard::is_exhaustion(&error);
                if let Some(suppressed) = accept_warn.ready(std::time::Instant::now()) {
                    tracing::warn!(%error, exhausted, suppressed, open = slots.len(), "http accept failed; backing off");
                }
                // Out of descriptors: give one back if we hold any, so the connection
                // waiting in the backlog (perhaps the liveness probe) can be accepted; let
                // the evicted task run and close it, then try again at once. Each such
                // round closes one of our own connections, so this cannot spin.
                if exhausted && slots.evict_oldest() {
                    tokio::task::yield_now().await;
                    continue;
                }
                let delay = backoff.failed();
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(delay) => continue,
                }
            }
        };
        let (slot, evicted) = slots.admit();
        evicted_since_warn += evicted;
        if evicted > 0
            && let Some(_) = cap_warn.ready(std::time::Instant::now())
        {
            tracing::warn!(
                max_connections = limits.max_connections,
                closed = std::mem::take(&mut evicted_since_warn),
                "http connection cap reached; closing the oldest connections"
            );
        }
        let metrics = metrics.clone();
        let readiness = readiness.clone();
        let state = state.clone();
        let conn_shutdown = shutdown.clone();
        tracker.spawn(async move {
            let service = service_fn(move |req| {
                let response = route(&req, &metrics, &readiness, state.as_ref());
                async move { Ok::<_, Infallible>(response) }
            });
            let conn = http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(error) = r {
                    tracing::debug!(%error, %peer, "http connection ended with an error");
                },
                // Closed at once (dropped) to make room for a newer connection.
                () = slot.evicted.cancelled() => {},
                () = conn_shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(slot);
        });
    }
    tracker.close();
    tracker.wait().await;
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}

fn route(
    req: &Request<Incoming>,
    metrics: &Metrics,
    readiness: &Readiness,
    state: Option<&UsageWatch>,
) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    let known = matches!(
        req.uri().path(),
        "/metrics" | "/healthz" | "/readyz" | STATE_PATH
    );
    if !known {
        return text(
            StatusCode::NOT_FOUND,
            PLAIN,
            format!("no such path: {}\n", req.uri().path()),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "only GET\n".into());
    }
    match req.uri().path() {
        "/metrics" => {
            // Content negotiation: OpenMetrics for scrapers that ask for it, the classic
            // text format for everything else (curl, promtool, older Prometheus).
            let wants_openmetrics = req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("application/openmetrics-text"));
            if wants_openmetrics {
                text(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    metrics.encode_openmetrics(),
                )
            } else {
                text(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    metrics.encode_prometheus(),
                )
            }
        }
        "/healthz" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        STATE_PATH => match state {
            Some(rx) => {
                let json = rx.borrow().json.clone();
                let mut resp = Response::new(Full::new(json));
                resp.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static("application/json"),
                );
                resp
            }
            None => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                "usage sampling is off (--usage-interval 0)\n".into(),
            ),
        },
        _ => match readiness.check() {
            Ok(()) => text(StatusCode::OK, PLAIN, "ready\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("not ready: {why}\n"),
            ),
        },
    }
}

/// The address a listener is bound to, for logs and tests.
pub(crate) fn local_addr(listener: &TcpListener) -> Option<SocketAddr> {
    listener.local_addr().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_expected_resource_is_registered() {
        let r = Readiness::default();
        r.spec_written.store(true, Ordering::Release);
        assert!(r.check().is_err(), "no plan yet");
        r.expect_resources(["a".to_string(), "b".to_string()]);
        r.mark_registered("a", true);
        assert_eq!(
            r.check().map_err(|e| e.to_string()),
            Err("not registered with the kubelet: b".to_string())
        );
        r.mark_registered("b", true);
        assert!(r.check().is_ok());
        // The kubelet restarted: "a" re-registers.
        r.mark_registered("a", false);
        assert!(r.check().is_err());
        r.mark_registered("a", true);
        assert!(r.check().is_ok());
        // A re-plan removed "b" and added "c".
        r.expect_resources(["a".to_string(), "c".to_string()]);
        assert_eq!(
            r.check().map_err(|e| e.to_string()),
            Err("not registered with the kubelet: c".to_string())
        );
        r.mark_registered("c", true);
        assert!(r.check().is_ok());
    }
}

#[cfg(test)]
mod http_tests;
