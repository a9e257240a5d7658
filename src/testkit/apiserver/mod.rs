//! Kubernetes API-server emulator: in-process, over real HTTP on `127.0.0.1`, speaking what the
//! agent's `kube` client uses. Objects are stored as JSON (any kind in its table: Nodes,
//! Events, Pods, ConfigMaps, ResourceSlices, ResourceClaims, ResourceClaimTemplates,
//! DeviceClasses) with one resourceVersion counter; it serves `/version`
//! (`ApiServer::set_version`, in unit tests), GET, LIST and WATCH (field and
//! label selectors, resourceVersion, bookmarks, 410 Gone after [`ApiServer::compact`],
//! `timeoutSeconds`, `sendInitialEvents`), create (`generateName` too), update, patch (JSON
//! merge; strategic merge treated as merge: maps merge, lists are replaced; RFC 6902 JSON
//! patch; server-side apply as a merge without field ownership), delete (with uid and
//! resourceVersion preconditions) and deletecollection; 409 on a stale resourceVersion or an
//! existing name; `status` kept out of main-resource writes for kinds with a status
//! subresource (nodes, pods, resourceclaims) and `/status` writes changing only it;
//! `metadata.generation` bumped on every `spec` change.
//!
//! Faults and policy for tests: [`ApiServer::require_tokens`] (401 without a known bearer
//! token), [`ApiServer::authorize`] (403 where the closure says no), [`ApiServer::admit`]
//! (an admission hook over old and new object, e.g. a ValidatingAdmissionPolicy's CEL),
//! [`ApiServer::inject`] (a status code or a delay for the next N matching requests),
//! [`ApiServer::go_down`] / [`ApiServer::come_up`] (connections refused, every open watch cut,
//! the store kept, as an API server restart). Every request is logged:
//! [`ApiServer::requests`], [`ApiServer::count`].
//!
//! ```ignore
//! let api = ApiServer::start().await?;
//! api.insert(&node("n1"));                        // any k8s-openapi object
//! let client = api.client()?;                     // a kube::Client for it (or api.kubeconfig())
//! let nodes: kube::Api<Node> = kube::Api::all(client);
//! let n = nodes.get("n1").await?;
//! api.allocate_claim("ns", "claim", allocation); // writes status.allocation, as a scheduler
//! api.allocate_share("ns", "claim", &ShareRequest::new("gpu", drv, pool, "gpu-2")
//!     .with("memory", "10Gi"));                   // a share: shareID + consumedCapacity
//! api.inject(Fault::status(Verb::Patch, "/nodes/", 403).times(2));
//! assert_eq!(api.count(Verb::Watch, "/api/v1/nodes"), 1);
//! api.stop().await;
//! ```
//!
//! Used by the integration tests (node labels, DRA) and benches; talks to the code under
//! test only over HTTP.

mod schedule;
mod serve;
mod store;
mod watch;
mod write;

pub use schedule::{ShareAllocated, ShareRequest};

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::resource::v1::AllocationResult;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use serve::{AdmitFn, AuthorizeFn, Policy, Shared};
use store::{Key, Kind, Store};

/// Errors of the emulator's own helpers.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The type is not one the emulator stores.
    #[error("the emulator does not store {0}")]
    UnknownKind(&'static str),
    /// An object did not (de)serialize.
    #[error("{kind} {name}: {source}")]
    Json {
        kind: &'static str,
        name: String,
        #[source]
        source: serde_json::Error,
    },
    /// A client for the emulator could not be built.
    #[error("kube client for the emulator: {0}")]
    Client(#[source] kube::Error),
    /// The emulator's own URL did not parse.
    #[error("bad emulator URL {0}")]
    Url(String),
    /// A share the scheduler would not allocate (no such device, no capacity left).
    #[error("cannot allocate a share of {device}: {message}")]
    Unschedulable { device: String, message: String },
    /// The object a helper works on does not exist.
    #[error("{kind} {namespace}/{name} does not exist")]
    Missing {
        kind: &'static str,
        namespace: String,
        name: String,
    },
}

/// A Kubernetes verb, as RBAC names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    /// The RBAC spelling (`deletecollection`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

/// Who a request is from (the token's user, as `request.userInfo` shows it to admission).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct User {
    pub username: String,
    pub groups: Vec<String>,
    /// E.g. `authentication.kubernetes.io/node-name` for a service-account token bound to a pod.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// The user of requests when no tokens are required.
    pub fn admin() -> User {
        User {
            username: "system:admin".into(),
            groups: vec!["system:masters".into()],
            extra: BTreeMap::new(),
        }
    }

    /// A service account's user, with the node-name claim of a pod-bound token.
    pub fn service_account(namespace: &str, name: &str, node: Option<&str>) -> User {
        let mut extra = BTreeMap::new();
        if let Some(node) = node {
            extra.insert(
                "authentication.kubernetes.io/node-name".into(),
                vec![node.to_owned()],
            );
        }
        User {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
            ],
            extra,
        }
    }
}

/// One request as served.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub verb: Verb,
    pub(crate) path: String,
    /// The raw query string.
    pub query: String,
    /// The authenticated user (empty when refused before authentication).
    pub(crate) user: String,
    /// The status code answered (200 for a watch that streamed).
    pub code: u16,
}

/// What an injected fault does.
#[derive(Debug, Clone)]
pub(crate) enum FaultAction {
    /// Answer with this status code (a Kubernetes `Status` body).
    Status(u16),
    /// Wait this long, then serve the request.
    Delay(Duration),
}

/// A fault for requests matching a verb and a path substring.
#[derive(Debug, Clone)]
pub struct Fault {
    pub(crate) verb: Option<Verb>,
    pub(crate) path_contains: Option<String>,
    pub(crate) action: FaultAction,
    /// How many requests it hits; `None`: until [`ApiServer::clear_faults`].
    pub(crate) times: Option<usize>,
}

impl Fault {
    /// Answer `code` to `verb` on paths containing `path`.
    pub fn status(verb: Verb, path: &str, code: u16) -> Fault {
        Fault {
            verb: Some(verb),
            path_contains: Some(path.into()),
            action: FaultAction::Status(code),
            times: None,
        }
    }
    /// Delay `verb` on paths containing `path`.
    pub fn delay(verb: Verb, path: &str, by: Duration) -> Fault {
        Fault {
            verb: Some(verb),
            path_contains: Some(path.into()),
            action: FaultAction::Delay(by),
            times: None,
        }
    }
    /// Only for the next `n` matching requests.
    pub fn times(mut self, n: usize) -> Fault {
        self.times = Some(n.max(1));
        self
    }
}

/// A write as admission sees it (`object` is `None` for a delete, `old_object` for a create).
#[derive(Debug)]
pub struct Admission<'a> {
    pub verb: Verb,
    pub resource: &'static str,
    /// `status` or empty.
    pub subresource: &'static str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub user: &'a User,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
}

/// An admission refusal: the status code (403 Forbidden, 422 Invalid) and message.
#[derive(Debug, Clone)]
pub struct Denial {
    pub code: u16,
    pub message: String,
}

/// A running emulator; stopped by [`ApiServer::stop`] (or when dropped, less tidily).
#[derive(Debug)]
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    down: Mutex<CancellationToken>,
    /// The accept loop, awaited before the port is bound again.
    accepting: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl ApiServer {
    /// Listens on a free port of 127.0.0.1.
    pub async fn start() -> Result<ApiServer, ApiServerError> {
        // Any kube client of this process (ours, or one a test builds from the kubeconfig)
        // finds ring installed as the TLS provider.
        crate::platform::kube::install_crypto_provider();
        let (changed, _) = tokio::sync::watch::channel(0);
        let (bookmark, _) = tokio::sync::watch::channel(0);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            changed,
            bookmark,
            policy: Mutex::new(Policy::default()),
            log: Mutex::new(Vec::new()),
            tracker: TaskTracker::new(),
        });
        let listener = bind(
            "127.0.0.1:0"
                .parse()
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
        )
        .await?;
        let addr = listener
            .local_addr()
            .map_err(|source| ApiServerError::Bind {
                addr: "127.0.0.1:0".into(),
                source,
            })?;
        let down = CancellationToken::new();
        let accepting =
            shared
                .tracker
                .spawn(serve::accept_loop(shared.clone(), listener, down.clone()));
        Ok(ApiServer {
            shared,
            addr,
            down: Mutex::new(down),
            accepting: Mutex::new(Some(accepting)),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig naming this server, with `token` as the user's bearer token.
    pub fn kubeconfig(&self, token: Option<&str>) -> String {
        let user = match token {
            Some(t) => format!("{{\"token\": \"{t}\"}}"),
            None => "{}".into(),
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: emu\n  cluster: {{server: \"{}\"}}\nusers:\n- name: u\n  user: {user}\ncontexts:\n- name: emu\n  context: {{cluster: emu, user: u}}\ncurrent-context: emu\n",
            self.url()
        )
    }

    /// A `kube::Client` for this server (no token; see [`ApiServer::client_with_token`]).
    pub fn client(&self) -> Result<kube::Client, ApiServerError> {
        self.client_with_token(None)
    }

    /// A `kube::Client` presenting `token`; kube's own retries are off so faults are seen.
    pub fn client_with_token(&self, token: Option<&str>) -> Result<kube::Client, ApiServerError> {
        let url: hyper::Uri = match self.url().parse() {
            Ok(u) => u,
            Err(e) => return Err(ApiServerError::Url(format!("{}: {e}", self.url()))),
        };
        crate::platform::kube::install_crypto_provider();
        let mut config = kube::Config::new(url);
        config.default_retry = false;
        config.auth_info.token = token.map(|t| t.to_owned().into());
        kube::Client::try_from(config).map_err(ApiServerError::Client)
    }

    // ---- objects ----

    /// Stores `object` as given (status included), as if written by someone else.
    pub fn insert<K: k8s_openapi::Resource + Serialize>(
        &self,
        object: &K,
    ) -> Result<(), ApiServerError> {
        let kind = Kind::of::<K>().ok_or(ApiServerError::UnknownKind(K::KIND))?;
        let value = serde_json::to_value(object).map_err(|source| ApiServerError::Json {
            kind: K::KIND,
            name: String::new(),
            source,
        })?;
        let key = key_of(kind, &value);
        self.put_value(key, value);
        Ok(())
    }

    /// The object `namespace/name` (namespace empty for cluster-scoped kinds).
    pub fn get<K: k8s_openapi::Resource + DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<K> {
        let kind = Kind::of::<K>()?;
        let key = Key {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        };
        let value = self.shared.store().objects.get(&key).cloned()?;
        serde_json::from_value(value).ok()
    }

    /// Every stored object of the kind, in name order.
    pub fn list<K: k8s_openapi::Resource + DeserializeOwned>(&self) -> Vec<K> {
        let Some(kind) = Kind::of::<K>() else {
            return Vec::new();
        };
        let store = self.shared.store();
        let values: Vec<Value> = store
            .objects
            .iter()
            .filter(|(k, _)| k.kind == kind)
            .map(|(_, v)| v.clone())
            .collect();
        drop(store);
        values
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    /// Deletes `namespace/name` as someone else would (watches see DELETED).
    pub fn remove<K: k8s_openapi::Resource>(&self, namespace: &str, name: &str) -> bool {
        let Some(kind) = Kind::of::<K>() else {
            return false;
        };
        let key = Key {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        };
        let mut store = self.shared.store();
        let removed = store.remove(&key).is_some();
        let rv = store.rv;
        drop(store);
        self.shared.notify(rv);
        removed
    }

    /// Deletes every ResourceSlice of Node `node` in one step, whoever wrote it, and returns
    /// how many: what a kubelet does when it starts (a DeleteCollection with the field selector
    /// `spec.nodeName=<node>`), so drivers publish again from scratch.
    pub fn delete_node_slices(&self, node: &str) -> usize {
        let Some(kind) = Kind::of::<k8s_openapi::api::resource::v1::ResourceSlice>() else {
            return 0;
        };
        let mut store = self.shared.store();
        let keys: Vec<Key> = store
            .objects
            .iter()
            .filter(|(k, v)| {
                k.kind == kind && v.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in &keys {
            store.remove(key);
        }
        let rv = store.rv;
        drop(store);
        self.shared.notify(rv);
        keys.len()
    }

    /// Changes the stored labels of Node `name` (`None` removes a key), as `kubectl label`.
    pub fn label_node(
        &self,
        name: &str,
        labels: &[(&str, Option<&str>)],
    ) -> Result<(), ApiServerError> {
        let patch: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        self.modify::<k8s_openapi::api::core::v1::Node>("", name, |v| {
            store::merge_patch(v, &json!({"metadata": {"labels": patch}}));
        })
    }

    /// Writes `status.allocation` of claim `namespace/name`, as the scheduler does when it
    /// allocates devices (`reservedFor` left as it is).
    pub fn allocate_claim(
        &self,
        namespace: &str,
        name: &str,
        allocation: &AllocationResult,
    ) -> Result<(), ApiServerError> {
        let allocation =
            serde_json::to_value(allocation).map_err(|source| ApiServerError::Json {
                kind: "ResourceClaim",
                name: name.into(),
                source,
            })?;
        self.modify::<k8s_openapi::api::resource::v1::ResourceClaim>(namespace, name, |v| {
            store::merge_patch(v, &json!({"status": {"allocation": Value::Null}}));
            store::merge_patch(v, &json!({"status": {"allocation": allocation}}));
        })
    }

    /// Applies `f` to the stored JSON of `namespace/name` and stores the result (a new version).
    pub(crate) fn modify<K: k8s_openapi::Resource>(
        &self,
        namespace: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Result<(), ApiServerError> {
        let kind = Kind::of::<K>().ok_or(ApiServerError::UnknownKind(K::KIND))?;
        let key = Key {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        };
        let mut store = self.shared.store();
        let mut value =
            store
                .objects
                .get(&key)
                .cloned()
                .ok_or_else(|| ApiServerError::Missing {
                    kind: K::KIND,
                    namespace: namespace.into(),
                    name: name.into(),
                })?;
        f(&mut value);
        store.put(key, value);
        let rv = store.rv;
        drop(store);
        self.shared.notify(rv);
        Ok(())
    }

    fn put_value(&self, key: Key, value: Value) {
        let mut store = self.shared.store();
        store.put(key, value);
        let rv = store.rv;
        drop(store);
        self.shared.notify(rv);
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().rv
    }

    /// Waits (up to `timeout`) until `check` holds for the store's objects of kind `K`.
    pub async fn wait_for<K, F>(&self, timeout: Duration, mut check: F) -> bool
    where
        K: k8s_openapi::Resource + DeserializeOwned,
        F: FnMut(&[K]) -> bool,
    {
        let mut changed = self.shared.changed.subscribe();
        let wait = async {
            loop {
                changed.borrow_and_update();
                if check(&self.list::<K>()) {
                    return true;
                }
                if changed.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or(false)
    }

    // ---- watch control ----

    /// Forgets the change history: watches resuming from an older version get 410 Gone.
    pub fn compact(&self) {
        self.shared.store().compact();
    }

    /// Makes every watch that allows bookmarks send one now.
    pub fn bookmark(&self) {
        self.shared.bookmark.send_modify(|n| *n += 1);
    }

    #[cfg(test)]
    /// What `/version` answers from now on: `major` and `minor` as a server writes them
    /// (`"1"`, `"34"`); the default is 1.36.
    pub(crate) fn set_version(&self, major: &str, minor: &str) {
        self.shared.policy().version = Some((major.to_owned(), minor.to_owned()));
    }

    // ---- policy and faults ----

    /// From now on only these bearer tokens are accepted (401 otherwise), each as its user.
    pub fn require_tokens(&self, tokens: HashMap<String, User>) {
        self.shared.policy().tokens = Some(tokens);
    }

    /// An authorizer: a request it refuses is answered 403.
    pub fn authorize(&self, f: impl Fn(&User, &RequestRecord) -> bool + Send + Sync + 'static) {
        let f: Arc<AuthorizeFn> = Arc::new(f);
        self.shared.policy().authorize = Some(f);
    }

    /// An admission hook for create, update, patch and delete.
    pub fn admit(&self, f: impl Fn(&Admission<'_>) -> Result<(), Denial> + Send + Sync + 'static) {
        let f: Arc<AdmitFn> = Arc::new(f);
        self.shared.policy().admit = Some(f);
    }

    /// Adds a fault; the first matching fault answers a request.
    pub fn inject(&self, fault: Fault) {
        self.shared.policy().faults.push(fault);
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.shared.policy().faults.clear();
    }

    /// Stops listening and cuts every connection and watch; the store is kept.
    pub fn go_down(&self) {
        lock(&self.down).cancel();
    }

    /// Listens again on the same port after [`ApiServer::go_down`].
    pub async fn come_up(&self) -> Result<(), ApiServerError> {
        let previous = lock(&self.accepting).take();
        if let Some(previous) = previous {
            // The old loop drops its listener when it ends; only then is the port free.
            let _ = previous.await;
        }
        // Closed connections may hold the port for a moment after the loop ended.
        let mut tries = 0;
        let listener = loop {
            match bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries >= 100 => return Err(e),
                Err(_) => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let down = CancellationToken::new();
        *lock(&self.down) = down.clone();
        let accepting =
            self.shared
                .tracker
                .spawn(serve::accept_loop(self.shared.clone(), listener, down));
        *lock(&self.accepting) = Some(accepting);
        Ok(())
    }

    // ---- request log ----

    /// Every request served so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.log().clone()
    }

    /// How many requests with `verb` had a path starting with `path`.
    pub fn count(&self, verb: Verb, path: &str) -> usize {
        self.shared
            .log()
            .iter()
            .filter(|r| r.verb == verb && r.path.starts_with(path))
            .count()
    }

    /// Cuts every connection and waits for the emulator's tasks to end.
    pub async fn stop(&self) {
        self.go_down();
        self.shared.tracker.close();
        self.shared.tracker.wait().await;
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        lock(&self.down).cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ApiServerError> {
    // SO_REUSEADDR: the port is bound again after go_down while the old connections linger.
    let err = |source| ApiServerError::Bind {
        addr: addr.to_string(),
        source,
    };
    let socket = tokio::net::TcpSocket::new_v4().map_err(err)?;
    socket.set_reuseaddr(true).map_err(err)?;
    socket.bind(addr).map_err(err)?;
    socket.listen(1024).map_err(err)
}

fn key_of(kind: Kind, value: &Value) -> Key {
    let s = |p: &str| {
        value
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    Key {
        kind,
        namespace: if kind.namespaced {
            s("/metadata/namespace")
        } else {
            String::new()
        },
        name: s("/metadata/name"),
    }
}
