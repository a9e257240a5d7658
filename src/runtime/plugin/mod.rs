//! Device plugin transport: one gRPC server per resource on a unix socket in the
//! device-plugin directory, registered with the kubelet and re-registered when the kubelet
//! restarts.
//!
//! - [`service`]: the `DevicePlugin` service (prost ↔ `crate::domain::allocate` domain).
//! - [`registration`]: `Register` on `kubelet.sock`, with backoff.
//! - [`watch`]: inotify watch that reports each (re)creation of `kubelet.sock`.
//! - [`run_resource`]: the lifecycle of one resource: wait for the kubelet, bind, serve,
//!   register, and start over on a kubelet restart; unlink the socket on cancellation.
//!
//! Socket names: `gpu-slicer-<resource name with '/' replaced by '-'>.sock`, e.g.
//! `gpu-slicer-nvidia.com-mig-1g.10gb.sock`. The domain stays in the name so two resources
//! of different vendors never collide, and the prefix keeps them apart from NVIDIA's
//! `nvidia-*.sock` on a node that runs both during a migration.

pub(crate) mod registration;
pub(crate) mod service;
pub(crate) mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::proto::deviceplugin::device_plugin_server::DevicePluginServer;
use crate::runtime::held::HeldCheckpoint;
use crate::runtime::{Context, Handle};
use crate::state::Store;

pub(crate) use registration::Backoff;
#[cfg(test)]
pub(crate) use service::{GENERATION_ANNOTATION, MAX_STREAMS_PER_RESOURCE};
pub(crate) use watch::{KubeletWatch, WatchError};

/// How long a stopping server may take to close its connections.
const SERVER_STOP_DEADLINE: Duration = Duration::from_secs(2);

/// Errors serving a resource.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PluginError {
    /// The resource is not in the plan being served.
    #[error("resource {0} is not in the plan")]
    UnknownResource(String),
    /// Its socket could not be served.
    #[error(transparent)]
    Socket(#[from] crate::runtime::socket::SocketError),
}

/// The socket file name of a resource.
pub fn socket_name(resource: &str) -> String {
    format!("gpu-slicer-{}.sock", resource.replace('/', "-"))
}

/// Where the plugin lives and how it reaches the kubelet.
#[derive(Debug, Clone)]
pub(crate) struct PluginSettings {
    /// Directory of plugin sockets (the kubelet resolves endpoints relative to it).
    pub(crate) device_plugin_dir: PathBuf,
    /// The kubelet's registration socket.
    pub(crate) kubelet_socket: PathBuf,
    /// Registration retry timing.
    pub(crate) backoff: Backoff,
}

/// Remove sockets of ours (`gpu-slicer-*.sock`) in `dir` that serve none of `resources`:
/// left by an earlier run (SIGKILL) whose plan had more resources. The kubelet would keep
/// dialling them. Only sockets are removed, never followed; other files are left alone.
/// Returns the names removed.
pub(crate) fn remove_stale_sockets(dir: &Path, resources: &[String]) -> Vec<String> {
    use std::os::unix::fs::FileTypeExt;
    let wanted: std::collections::BTreeSet<String> =
        resources.iter().map(|r| socket_name(r)).collect();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with("gpu-slicer-") && name.ends_with(".sock");
        let is_socket = entry.file_type().is_ok_and(|t| t.is_socket());
        if !ours || !is_socket || wanted.contains(&name) {
            continue;
        }
        match crate::runtime::socket::remove(&entry.path()) {
            Ok(()) => removed.push(name),
            Err(e) => {
                tracing::warn!(socket = %entry.path().display(), error = %e, "cannot remove stale socket")
            }
        }
    }
    removed.sort();
    removed
}

/// What the plugin manager is handed by the supervisor: the kubelet watch, the
/// held-device checkpoint Allocate writes and the readiness it reports registrations to.
#[derive(Debug)]
pub(crate) struct PluginPeers {
    /// Each (re)creation of `kubelet.sock`.
    pub(crate) watch: KubeletWatch,
    /// Where Allocate persists what it hands out.
    pub(crate) held: HeldCheckpoint,
    /// Told when a resource is registered (or stops being), for `/readyz`.
    pub(crate) readiness: Arc<crate::runtime::http::Readiness>,
}

/// Everything a resource task needs, shared by all resources.
#[derive(Debug, Clone)]
pub(crate) struct PluginContext {
    /// Paths and timing.
    pub(crate) settings: Arc<PluginSettings>,
    /// The state every RPC reads one snapshot of.
    pub(crate) store: Store,
    /// Where Allocate persists what it hands out.
    pub(crate) held: HeldCheckpoint,
    /// Owner of every task spawned for serving.
    pub(crate) tracker: TaskTracker,
    /// RPC latencies, refusals and registrations are recorded here.
    pub(crate) metrics: Arc<crate::runtime::metrics::Metrics>,
    /// Told when a resource is registered (or stops being), for `/readyz`.
    pub(crate) readiness: Arc<crate::runtime::http::Readiness>,
}

/// Failures of resources, as the plugin manager reports them (the supervisor stops the
/// daemon on the first).
pub(crate) type Failures = tokio::sync::mpsc::Receiver<PluginError>;

/// The device-plugin front-end as the daemon runs it: sockets of resources an earlier run
/// served and the current plan does not are removed, `kubelet.sock` is watched through the
/// daemon's inotify instance `fs`, then [`spawn`] serves every planned resource. Returns the
/// resource failures (the daemon stops on the first).
pub(crate) fn start(
    settings: PluginSettings,
    held: HeldCheckpoint,
    readiness: Arc<crate::runtime::http::Readiness>,
    fs: &Arc<crate::platform::fswatch::DirWatch>,
    ctx: &Context,
) -> Result<Failures, WatchError> {
    let planned = ctx.store.current().resource_names();
    let stale = remove_stale_sockets(&settings.device_plugin_dir, &planned);
    if !stale.is_empty() {
        tracing::info!(sockets = ?stale, "removed sockets of resources no longer planned");
    }
    let watch = KubeletWatch::start(&settings.kubelet_socket, fs)?;
    let peers = PluginPeers {
        watch,
        held,
        readiness,
    };
    Ok(spawn(settings, peers, ctx).into_inner())
}

/// Keep one server per planned resource until the daemon stops: every new snapshot whose
/// resource set differs starts servers for added resources and stops (and unlinks)
/// removed ones. Changed resources keep their server: their streams send the new view.
/// A resource that fails is reported on the handle's [`Failures`].
pub(crate) fn spawn(
    settings: PluginSettings,
    peers: PluginPeers,
    ctx: &Context,
) -> Handle<Failures> {
    let PluginPeers {
        watch,
        held,
        readiness,
    } = peers;
    let shared = PluginContext {
        settings: Arc::new(settings),
        store: ctx.store.clone(),
        held,
        tracker: ctx.tracker.clone(),
        metrics: ctx.metrics.clone(),
        readiness,
    };
    let (failures, rx) = tokio::sync::mpsc::channel(16);
    let token = ctx.child_token();
    ctx.tracker.spawn(manage(shared, watch, failures, token));
    Handle::new(rx)
}

async fn manage(
    ctx: PluginContext,
    watch: KubeletWatch,
    failures: tokio::sync::mpsc::Sender<PluginError>,
    token: CancellationToken,
) {
    let mut rx = ctx.store.subscribe();
    let mut running: std::collections::BTreeMap<String, CancellationToken> =
        std::collections::BTreeMap::new();
    loop {
        let names: Vec<String> = rx.borrow_and_update().resource_names();
        if names.iter().ne(running.keys()) {
            ctx.readiness.expect_resources(names.iter().cloned());
            running.retain(|name, t| {
                let keep = names.contains(name);
                if !keep {
                    t.cancel();
                }
                keep
            });
            for name in names {
                if running.contains_key(&name) {
                    continue;
                }
                let instance = token.child_token();
                running.insert(name.clone(), instance.clone());
                let (ctx, kubelet, failures) = (ctx.clone(), watch.subscribe(), failures.clone());
                ctx.tracker.clone().spawn(async move {
                    if let Err(e) = run_resource(name.clone(), ctx, kubelet, instance).await {
                        tracing::error!(resource = %name, error = %e, "resource stopped");
                        // Full only if many resources failed already; the first is enough.
                        let _ = failures.try_send(e);
                    }
                });
            }
        }
        tokio::select! {
            () = token.cancelled() => break,
            changed = rx.changed() => if changed.is_err() { break },
        }
    }
    // Resource tasks stop with their tokens (children of `token`); the inotify watch may
    // end once they have.
    drop(watch);
}

/// Serve one resource until `token` is cancelled: wait for `kubelet.sock`, bind and serve,
/// register; on every kubelet restart (a change on `kubelet`) do it again. The socket is
/// removed when the task stops.
pub(crate) async fn run_resource(
    resource: String,
    ctx: PluginContext,
    mut kubelet: tokio::sync::watch::Receiver<u64>,
    token: CancellationToken,
) -> Result<(), PluginError> {
    if ctx.store.view(&resource).is_none() {
        return Err(PluginError::UnknownResource(resource.clone()));
    }
    let streams = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let endpoint = socket_name(&resource);
    let path = ctx.settings.device_plugin_dir.join(&endpoint);
    // Mark the current generation seen before looking for the socket, so a creation in
    // between is not lost.
    kubelet.borrow_and_update();
    while !ctx.settings.kubelet_socket.exists() {
        tracing::info!(resource = %resource, socket = %ctx.settings.kubelet_socket.display(), "waiting for kubelet socket");
        tokio::select! {
            () = token.cancelled() => return Ok(()),
            changed = kubelet.changed() => if changed.is_err() { return Ok(()) },
        }
    }
    loop {
        let instance = token.child_token();
        let listener = crate::runtime::socket::bind(&path)?;
        let service = service::DevicePluginService::new(
            &resource,
            ctx.store.clone(),
            ctx.held.clone(),
            ctx.metrics.clone(),
            streams.clone(),
            instance.clone(),
        );
        let stop = instance.clone().cancelled_owned();
        let server_resource = resource.clone();
        let mut server = ctx.tracker.spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(crate::runtime::socket::incoming(listener), stop)
                .await;
            if let Err(e) = served {
                tracing::error!(resource = %server_resource, error = %e, "device plugin server failed");
            }
        });
        tracing::debug!(resource = %resource, socket = %path.display(), "serving");
        let request = registration::register_request(&resource, &endpoint);
        let mut server_done = false;
        let restart = tokio::select! {
            () = token.cancelled() => false,
            changed = kubelet.changed() => changed.is_ok(),
            () = registration::register_with_backoff(&ctx.settings.kubelet_socket, request, ctx.settings.backoff) => {
                tracing::info!(resource = %resource, endpoint = %endpoint, "registered with kubelet");
                ctx.metrics.record_registration(&resource);
                ctx.readiness.mark_registered(&resource, true);
                tokio::select! {
                    () = token.cancelled() => false,
                    changed = kubelet.changed() => changed.is_ok(),
                    _ = &mut server => {
                        // The server stopped on its own (error logged there): serve again.
                        server_done = true;
                        true
                    }
                }
            }
        };
        instance.cancel();
        ctx.readiness.mark_registered(&resource, false);
        if !server_done
            && tokio::time::timeout(SERVER_STOP_DEADLINE, &mut server)
                .await
                .is_err()
        {
            tracing::warn!(resource = %resource, "server did not stop in time; aborting it");
            server.abort();
        }
        if let Err(e) = crate::runtime::socket::remove(&path) {
            tracing::warn!(resource = %resource, socket = %path.display(), error = %e, "cannot remove socket");
        }
        if !restart {
            tracing::info!(resource = %resource, "stopped serving");
            return Ok(());
        }
        tracing::info!(resource = %resource, "kubelet restarted; serving and registering again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_keep_the_domain() {
        assert_eq!(
            socket_name("nvidia.com/gpu"),
            "gpu-slicer-nvidia.com-gpu.sock"
        );
        assert_eq!(
            socket_name("nvidia.com/mig-1g.10gb"),
            "gpu-slicer-nvidia.com-mig-1g.10gb.sock"
        );
    }

    /// A drained GPU's devices leave the ListAndWatch frame (the kubelet drops them from the
    /// node's capacity) and come back when the drain ends; other GPUs' devices stay listed.
    #[test]
    fn a_drained_gpu_leaves_the_list_and_watch_frame() {
        const GPU2: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02";
        const GPU3: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03";
        let store = crate::testkit::fixtures::store(
            "mixed-a100",
            "version: v1\nflags: {migStrategy: mixed}\n",
        );
        let ids = |store: &crate::state::Store| -> Vec<String> {
            service::frame(&store.view("nvidia.com/gpu").expect("whole GPUs"))
                .devices()
                .unwrap()
                .into_iter()
                .map(|d| d.id)
                .collect()
        };
        assert_eq!(ids(&store), [GPU2, GPU3]);
        store.drain(GPU2, Some("mig-layout-applying")).unwrap();
        assert_eq!(ids(&store), [GPU3]);
        // An XID during the drain does not bring it back into the list.
        store
            .set_health(GPU2, crate::domain::inventory::Health::Unhealthy, "xid-79")
            .unwrap();
        assert_eq!(ids(&store), [GPU3]);
        store.drain(GPU2, None).unwrap();
        let frame = service::frame(&store.view("nvidia.com/gpu").unwrap());
        let devices = frame.devices().unwrap();
        let gpu2 = devices.iter().find(|d| d.id == GPU2).expect("listed again");
        assert_eq!(gpu2.health, crate::proto::UNHEALTHY, "the XID stays");
    }
}

#[cfg(test)]
mod plugin_tests;
