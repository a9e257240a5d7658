//! The emulator's HTTP side: the accept loop, URL routing (`/api/v1/…`, `/apis/<g>/<v>/…`,
//! namespaced or not, `/status`), authentication and authorization, injected faults, and the
//! verbs (get, list, watch, create, update, patch, delete, deletecollection) over
//! [`super::store`]. Watches are newline-delimited JSON streams fed from the store's history.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::store::{ChangeType, Key, Kind, Selectors, Store};
use super::write::{WriteRequest, get, write};
use super::{Admission, Denial, Fault, FaultAction, RequestRecord, User, Verb};

pub(crate) type Body = BoxBody<Bytes, Infallible>;
pub(crate) type AuthorizeFn = dyn Fn(&User, &RequestRecord) -> bool + Send + Sync;
pub(crate) type AdmitFn = dyn Fn(&Admission<'_>) -> Result<(), Denial> + Send + Sync;

/// What the handlers share: the store, its change signal, the policy and the request log.
pub(crate) struct Shared {
    pub(crate) store: Mutex<Store>,
    /// The latest resourceVersion; watches wait on it.
    pub(crate) changed: watch::Sender<u64>,
    /// Bumped to make every watch that asked for bookmarks send one now.
    pub(crate) bookmark: watch::Sender<u64>,
    pub(crate) policy: Mutex<Policy>,
    pub(crate) log: Mutex<Vec<RequestRecord>>,
    pub(crate) tracker: TaskTracker,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// Authentication, authorization, admission, faults and bookmark pacing.
#[derive(Default)]
pub(crate) struct Policy {
    /// When set, a request needs `Authorization: Bearer <token>` naming one of these.
    pub(crate) tokens: Option<HashMap<String, User>>,
    pub(crate) authorize: Option<Arc<AuthorizeFn>>,
    pub(crate) admit: Option<Arc<AdmitFn>>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) bookmark_interval: Option<Duration>,
    /// What `/version` answers (`None`: [`DEFAULT_VERSION`]).
    pub(crate) version: Option<(String, String)>,
}

/// The version the emulator claims to be unless told otherwise: `(major, minor)`.
pub(crate) const DEFAULT_VERSION: (&str, &str) = ("1", "36");

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        lock(&self.store)
    }
    pub(crate) fn policy(&self) -> std::sync::MutexGuard<'_, Policy> {
        lock(&self.policy)
    }
    pub(crate) fn log(&self) -> std::sync::MutexGuard<'_, Vec<RequestRecord>> {
        lock(&self.log)
    }
    /// Wakes the watches after the store changed.
    pub(crate) fn notify(&self, rv: u64) {
        self.changed.send_replace(rv);
    }
}

/// Accepts connections on `listener` until `down` is cancelled; then every connection (and
/// with it every watch) is dropped at once, as when an API server process dies.
pub(crate) async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    down: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            () = down.cancelled() => return,
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let (shared, down) = (shared.clone(), down.clone());
        let tracker = shared.tracker.clone();
        tracker.spawn(async move {
            let conn_down = down.clone();
            let service = service_fn(move |req| {
                let (shared, down) = (shared.clone(), down.clone());
                async move { Ok::<_, Infallible>(handle(shared, down, req).await) }
            });
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {},
                () = conn_down.cancelled() => {},
            }
        });
    }
}

/// Where a request goes.
#[derive(Debug)]
pub(crate) struct Route {
    pub(crate) kind: Kind,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) status: bool,
}

fn route(path: &str) -> Result<Route, String> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (gv, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => (format!("api/{v}"), rest),
        ["apis", g, v, rest @ ..] => (format!("apis/{g}/{v}"), rest),
        _ => return Err(format!("no API at {path}")),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, rest @ ..] => {
            (Some((*ns).to_owned()), [&[*plural], rest].concat())
        }
        _ => (None, rest.to_vec()),
    };
    let kind = match rest.first() {
        Some(plural) => {
            Kind::find(&gv, plural).ok_or_else(|| format!("the server could not find {path}"))?
        }
        None => return Err(format!("no resource in {path}")),
    };
    if kind.namespaced != namespace.is_some() && (rest.len() > 1 || !kind.namespaced) {
        return Err(format!(
            "{} are {}namespaced: {path}",
            kind.plural,
            if kind.namespaced { "" } else { "not " }
        ));
    }
    match rest.as_slice() {
        [_] => Ok(Route {
            kind,
            namespace,
            name: None,
            status: false,
        }),
        [_, name] => Ok(Route {
            kind,
            namespace,
            name: Some((*name).to_owned()),
            status: false,
        }),
        [_, name, "status"] => Ok(Route {
            kind,
            namespace,
            name: Some((*name).to_owned()),
            status: true,
        }),
        _ => Err(format!("the server could not find {path}")),
    }
}

/// Decodes one `application/x-www-form-urlencoded` component.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(b) => {
                    out.push(b);
                    i += 2;
                }
                None => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

/// `/version`, as `kubectl version` and client libraries read it (not logged: it is not a
/// resource request).
fn version(shared: &Shared) -> Response<Body> {
    let (major, minor) = shared
        .policy()
        .version
        .clone()
        .unwrap_or_else(|| (DEFAULT_VERSION.0.to_owned(), DEFAULT_VERSION.1.to_owned()));
    let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    respond(
        200,
        &json!({"major": major, "minor": minor, "gitVersion": format!("v{major}.{digits}.0"),
                "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.25", "compiler": "gc", "platform": "linux/amd64"}),
    )
}

/// A Kubernetes `Status` error response.
pub(crate) fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code});
    respond(code, &body)
}

pub(crate) fn respond(code: u16, body: &Value) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn reason_of(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

async fn handle(
    shared: Arc<Shared>,
    down: CancellationToken,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let params = query(parts.uri.query());
    let path = parts.uri.path().to_owned();
    if path == "/version" && parts.method == Method::GET {
        return version(&shared);
    }
    let route = match route(&path) {
        Ok(r) => r,
        Err(message) => return status(404, "NotFound", &message),
    };
    let watching = matches!(params.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (&parts.method, route.name.is_some()) {
        (&Method::GET, false) if watching => Verb::Watch,
        (&Method::GET, false) => Verb::List,
        (&Method::GET, true) => Verb::Get,
        (&Method::POST, false) => Verb::Create,
        (&Method::PUT, true) => Verb::Update,
        (&Method::PATCH, true) => Verb::Patch,
        (&Method::DELETE, true) => Verb::Delete,
        (&Method::DELETE, false) => Verb::DeleteCollection,
        _ => return status(405, "MethodNotAllowed", &format!("{} {path}", parts.method)),
    };
    let token = parts
        .headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let content_type = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let mut record = RequestRecord {
        verb,
        path: path.clone(),
        query: parts.uri.query().unwrap_or("").to_owned(),
        user: String::new(),
        code: 200,
    };
    let response = authorize_and_serve(
        &shared,
        &down,
        &route,
        &params,
        token,
        &content_type,
        body,
        &mut record,
    )
    .await;
    record.code = response.status().as_u16();
    shared.log().push(record);
    response
}

#[allow(clippy::too_many_arguments)]
async fn authorize_and_serve(
    shared: &Arc<Shared>,
    down: &CancellationToken,
    route: &Route,
    params: &HashMap<String, String>,
    token: Option<String>,
    content_type: &str,
    body: Incoming,
    record: &mut RequestRecord,
) -> Response<Body> {
    let fault = take_fault(shared, record);
    if let Some(FaultAction::Delay(d)) = &fault {
        tokio::time::sleep(*d).await;
    }
    if let Some(FaultAction::Status(code)) = fault {
        return status(
            code,
            reason_of(code),
            &format!(
                "injected failure for {} {}",
                record.verb.as_str(),
                record.path
            ),
        );
    }
    let (user, admit) = match authorize(shared, route, token, record) {
        Ok(allowed) => allowed,
        Err(Refusal(code, reason, message)) => return status(code, reason, &message),
    };
    let sel = match Selectors::parse(
        params.get("fieldSelector").map(String::as_str),
        params.get("labelSelector").map(String::as_str),
    ) {
        Ok(s) => s,
        Err(message) => return status(400, "BadRequest", &message),
    };
    let parsed = match json_body(body).await {
        Ok(v) => v,
        Err(Refusal(code, reason, message)) => return status(code, reason, &message),
    };
    let ns = route.namespace.as_deref();
    match record.verb {
        Verb::Get => get(shared, route),
        Verb::List => {
            let store = shared.store();
            let items = store.list(route.kind, ns, &sel);
            respond(200, &list_body(route.kind, store.rv, items))
        }
        Verb::Watch => super::watch::start(
            shared.clone(),
            down.clone(),
            route.kind,
            route.namespace.clone(),
            sel,
            params,
        ),
        Verb::DeleteCollection => delete_collection(shared, route, &sel),
        verb => {
            let req = WriteRequest {
                verb,
                route,
                params,
                content_type,
                body: parsed,
                user: &user,
                admit: admit.as_deref(),
            };
            match write(shared, &req) {
                Ok((code, v)) => respond(code, &v),
                Err(f) => f.into_response(),
            }
        }
    }
}

/// An error answer before the request is served: status code, reason, message.
struct Refusal(u16, &'static str, String);

/// Who asks (by bearer token when the policy has tokens) and whether the policy lets them;
/// `Ok`: the user and the admission hook writes go through. `Err`: the 401 or 403.
fn authorize(
    shared: &Shared,
    route: &Route,
    token: Option<String>,
    record: &mut RequestRecord,
) -> Result<(User, Option<Arc<AdmitFn>>), Refusal> {
    let (user, authorize, admit) = {
        let policy = shared.policy();
        let user = match (&policy.tokens, token) {
            (None, _) => User::admin(),
            (Some(tokens), Some(t)) => match tokens.get(&t) {
                Some(u) => u.clone(),
                None => return Err(Refusal(401, "Unauthorized", "Unauthorized".into())),
            },
            (Some(_), None) => return Err(Refusal(401, "Unauthorized", "Unauthorized".into())),
        };
        (user, policy.authorize.clone(), policy.admit.clone())
    };
    record.user = user.username.clone();
    if let Some(authorize) = authorize
        && !authorize(&user, record)
    {
        let message = format!(
            "{} cannot {} resource {:?} at {}",
            user.username,
            record.verb.as_str(),
            route.kind.plural,
            record.path
        );
        return Err(Refusal(403, "Forbidden", message));
    }
    Ok((user, admit))
}

/// The request body as JSON (`None`: empty); `Err`: the 400.
async fn json_body(body: Incoming) -> Result<Option<Value>, Refusal> {
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Err(Refusal(400, "BadRequest", format!("reading the body: {e}"))),
    };
    if body.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| Refusal(400, "BadRequest", format!("the body is not JSON: {e}")))
}

/// DELETE of a collection: every object the selectors match, answered as a list of them.
fn delete_collection(shared: &Shared, route: &Route, sel: &Selectors) -> Response<Body> {
    let ns = route.namespace.as_deref();
    let mut store = shared.store();
    let items = store.list(route.kind, ns, sel);
    for item in &items {
        let name = item
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let key = Key {
            kind: route.kind,
            namespace: ns.unwrap_or("").to_owned(),
            name: name.to_owned(),
        };
        store.remove(&key);
    }
    let rv = store.rv;
    drop(store);
    shared.notify(rv);
    respond(200, &list_body(route.kind, rv, items))
}

fn list_body(kind: Kind, rv: u64, items: Vec<Value>) -> Value {
    json!({"kind": format!("{}List", kind.kind), "apiVersion": kind.api_version(),
           "metadata": {"resourceVersion": rv.to_string()}, "items": items})
}

/// The first fault matching the request, used up by one.
fn take_fault(shared: &Shared, record: &RequestRecord) -> Option<FaultAction> {
    let mut policy = shared.policy();
    let i = policy.faults.iter().position(|f| {
        f.verb.is_none_or(|v| v == record.verb)
            && f.path_contains
                .as_deref()
                .is_none_or(|p| record.path.contains(p))
    })?;
    let fault = &mut policy.faults[i];
    let action = fault.action.clone();
    match &mut fault.times {
        Some(1) => {
            policy.faults.remove(i);
        }
        Some(n) => *n -= 1,
        None => {}
    }
    Some(action)
}

/// The body of a watch stream: lines of JSON sent through `tx`.
pub(crate) fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// The `WatchEvent` line for `object`.
pub(crate) fn event_line(change: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": change, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// What a watch sends for one history entry, given its selectors (objects moving out of the
/// selection are reported deleted, moving in added, as the API server does).
pub(crate) fn visible(
    change: ChangeType,
    new_match: bool,
    old_match: Option<bool>,
) -> Option<&'static str> {
    match (change, old_match.unwrap_or(false), new_match) {
        (ChangeType::Added | ChangeType::Deleted, _, true) => Some(change.as_str()),
        (ChangeType::Modified, true, true) => Some("MODIFIED"),
        (ChangeType::Modified, false, true) => Some("ADDED"),
        (ChangeType::Modified, true, false) => Some("DELETED"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_queries() {
        let r = route("/api/v1/nodes/n1").unwrap();
        assert_eq!(
            (r.kind.plural, r.name.as_deref(), r.namespace),
            ("nodes", Some("n1"), None)
        );
        let r = route("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status").unwrap();
        assert_eq!(
            (r.kind.kind, r.namespace.as_deref(), r.status),
            ("ResourceClaim", Some("ns"), true)
        );
        assert!(route("/api/v1/namespaces/ns/nodes").is_err());
        assert!(route("/apis/resource.k8s.io/v1/widgets").is_err());
        let q = query(Some("fieldSelector=metadata.name%3Dn1&watch=1&x=a+b"));
        assert_eq!(q["fieldSelector"], "metadata.name=n1");
        assert_eq!(q["x"], "a b");
    }
}
