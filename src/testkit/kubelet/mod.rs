//! Kubelet emulator: the kubelet's side of the device plugin protocol, in-process.
//!
//! Serves `Registration` on `<dir>/kubelet.sock`; on every `Register` it does what the
//! kubelet's device manager does: dial the plugin's endpoint, read its options, keep a
//! ListAndWatch stream open (latest frame observable through a watch channel), and on demand
//! call GetPreferredAllocation then Allocate, tracking what it handed out. It can simulate
//! a kubelet restart (stop serving, delete every socket in the directory, create
//! `kubelet.sock` again) and serves PodResources v1 from its allocations and the DRA claims
//! held for containers (`KubeletEmulator::hold_claim`, in unit tests). Like the kubelet's device manager
//! it keeps `<dir>/kubelet_internal_checkpoint` (see [`KubeletEmulator::save_checkpoint`]).
//!
//! Used by `gpu-slicer demo`, the integration tests and the benchmarks; talks to
//! `crate::runtime::plugin` only over real unix sockets.

#[cfg(feature = "testkit")]
pub(crate) mod dra;
mod pod_claims;
mod pod_resources;

#[cfg(test)]
pub(crate) use pod_claims::ClaimDevice;
pub(crate) use pod_claims::HeldClaim;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

use crate::domain::allocate::{ContainerAllocation, MountEntry};
use crate::proto::deviceplugin as pb;
use pb::device_plugin_client::DevicePluginClient;
use pb::registration_server::{Registration, RegistrationServer};

/// How long stopping the emulator's servers may take.
const STOP_DEADLINE: Duration = Duration::from_secs(2);

/// Errors of the emulator.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    /// A socket could not be bound or removed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// No plugin is registered (and connected) for the resource.
    #[error("no plugin registered for resource {0}")]
    NotRegistered(String),
    /// Not enough free healthy devices for a kubelet-style allocation.
    #[error("resource {resource}: {wanted} devices wanted, {free} free and healthy")]
    NotEnoughDevices {
        resource: String,
        wanted: usize,
        free: usize,
    },
    /// The plugin answered an RPC with an error.
    #[error("{rpc} on resource {resource} failed: {code:?}: {message}")]
    Rpc {
        rpc: &'static str,
        resource: String,
        code: tonic::Code,
        message: String,
    },
}

/// A device as the emulator last saw it in ListAndWatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kubelet device ID.
    pub id: String,
    /// `Healthy` was reported.
    pub healthy: bool,
    /// NUMA node from the topology, if any.
    pub(crate) numa_node: Option<i64>,
}

/// Who an allocation is for (PodResources reports it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PodRef {
    /// Namespace.
    pub(crate) namespace: String,
    /// Pod name.
    pub(crate) name: String,
    /// Container name.
    pub(crate) container: String,
}

/// One allocation the emulator made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// Owner.
    pub(crate) pod: PodRef,
    /// Resource name.
    pub(crate) resource: String,
    /// Device IDs allocated.
    pub device_ids: Vec<String>,
    /// The plugin's answer.
    pub response: ContainerAllocation,
}

/// What the emulator knows of one registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// Socket file name the plugin registered.
    pub(crate) endpoint: String,
    /// Options sent at registration.
    pub(crate) get_preferred_allocation_available: bool,
    /// How many times this resource registered and delivered a first ListAndWatch frame.
    pub(crate) count: u64,
    /// ListAndWatch frames received over all connections.
    pub(crate) frames: u64,
    /// Whether the latest ListAndWatch stream is still open.
    pub(crate) open: bool,
}

#[derive(Debug)]
struct PluginConn {
    client: DevicePluginClient<Channel>,
    preferred: bool,
    token: CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    plugins: BTreeMap<String, PluginConn>,
    devices: BTreeMap<String, watch::Sender<Vec<DeviceInfo>>>,
    allocations: Vec<Allocation>,
    /// DRA claims prepared for containers (see `KubeletEmulator::hold_claim`).
    claims: Vec<HeldClaim>,
    next_pod: u64,
    server: Option<(CancellationToken, JoinHandle<()>)>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    socket: PathBuf,
    tracker: TaskTracker,
    token: CancellationToken,
    state: Mutex<State>,
    registered: watch::Sender<BTreeMap<String, Registered>>,
}

impl Inner {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent between statements; a panic elsewhere must not stop
        // the emulator from answering.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The emulator. Cheap to share behind `&`; stop it with [`KubeletEmulator::shutdown`].
#[derive(Debug)]
pub struct KubeletEmulator {
    inner: Arc<Inner>,
}

impl KubeletEmulator {
    /// Serve `Registration` on `<dir>/kubelet.sock` (the directory is created).
    pub async fn start(dir: impl Into<PathBuf>) -> Result<Self, EmulatorError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|source| EmulatorError::Io {
            action: "create",
            path: dir.display().to_string(),
            source,
        })?;
        let socket = dir.join(crate::proto::KUBELET_SOCKET_NAME);
        let inner = Arc::new(Inner {
            dir,
            socket,
            tracker: TaskTracker::new(),
            token: CancellationToken::new(),
            state: Mutex::new(State::default()),
            registered: watch::Sender::new(BTreeMap::new()),
        });
        let emulator = Self { inner };
        emulator.serve_registration()?;
        Ok(emulator)
    }

    fn serve_registration(&self) -> Result<(), EmulatorError> {
        let inner = &self.inner;
        let path = inner.socket.clone();
        let listener =
            tokio::net::UnixListener::bind(&path).map_err(|source| EmulatorError::Io {
                action: "bind",
                path: path.display().to_string(),
                source,
            })?;
        let token = inner.token.child_token();
        let service = RegistrationService {
            inner: Arc::downgrade(inner),
        };
        let stop = token.clone().cancelled_owned();
        let handle = inner.tracker.spawn(async move {
            if let Err(e) = Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop)
                .await
            {
                tracing::error!(error = %e, "emulated kubelet registration server failed");
            }
        });
        inner.state().server = Some((token, handle));
        Ok(())
    }

    /// Registrations by resource; changes when a plugin registers and streams its first
    /// device list.
    pub fn registrations(&self) -> watch::Receiver<BTreeMap<String, Registered>> {
        self.inner.registered.subscribe()
    }

    /// Wait until every resource in `resources` has registered at least `count` times.
    pub async fn wait_registered(&self, resources: &[String], count: u64) {
        let mut rx = self.registrations();
        // The sender lives as long as `self`, so this only ends when the condition holds.
        let _ = rx
            .wait_for(|m| {
                resources
                    .iter()
                    .all(|r| m.get(r).is_some_and(|reg| reg.count >= count))
            })
            .await;
    }

    /// The latest device list of a resource (kept across plugin re-registrations).
    pub fn devices(&self, resource: &str) -> Option<watch::Receiver<Vec<DeviceInfo>>> {
        self.inner
            .state()
            .devices
            .get(resource)
            .map(|s| s.subscribe())
    }

    fn client(&self, resource: &str) -> Result<(DevicePluginClient<Channel>, bool), EmulatorError> {
        self.inner
            .state()
            .plugins
            .get(resource)
            .map(|p| (p.client.clone(), p.preferred))
            .ok_or_else(|| EmulatorError::NotRegistered(resource.to_string()))
    }

    /// Call GetPreferredAllocation for one container.
    pub async fn preferred(
        &self,
        resource: &str,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Result<Vec<String>, EmulatorError> {
        let (mut client, _) = self.client(resource)?;
        let request = pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: must_include.to_vec(),
                allocation_size: i32::try_from(size).unwrap_or(i32::MAX),
            }],
        };
        let response = client
            .get_preferred_allocation(request)
            .await
            .map_err(|s| rpc_error("GetPreferredAllocation", resource, &s))?;
        Ok(response
            .into_inner()
            .container_responses
            .into_iter()
            .next()
            .map(|c| c.device_i_ds)
            .unwrap_or_default())
    }

    /// Call Allocate for one container with exactly these IDs (nothing is recorded).
    pub async fn allocate_ids(
        &self,
        resource: &str,
        ids: &[String],
    ) -> Result<ContainerAllocation, EmulatorError> {
        let (mut client, _) = self.client(resource)?;
        let request = pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            }],
        };
        let response = client
            .allocate(request)
            .await
            .map_err(|s| rpc_error("Allocate", resource, &s))?;
        Ok(response
            .into_inner()
            .container_responses
            .into_iter()
            .next()
            .map(from_pb)
            .unwrap_or_default())
    }

    /// Allocate `count` devices of `resource` the way the kubelet does: free healthy
    /// devices from the latest frame, GetPreferredAllocation (when offered), then Allocate.
    /// The allocation is recorded for a generated pod name.
    pub async fn allocate(
        &self,
        resource: &str,
        count: usize,
    ) -> Result<Allocation, EmulatorError> {
        let pod = {
            let mut state = self.inner.state();
            state.next_pod += 1;
            PodRef {
                namespace: "default".into(),
                name: format!("pod-{}", state.next_pod),
                container: "main".into(),
            }
        };
        self.allocate_for(pod, resource, count).await
    }

    /// As [`allocate`](Self::allocate) for a given pod/container.
    pub(crate) async fn allocate_for(
        &self,
        pod: PodRef,
        resource: &str,
        count: usize,
    ) -> Result<Allocation, EmulatorError> {
        let (_, preferred) = self.client(resource)?;
        let free: Vec<String> = {
            let state = self.inner.state();
            let used: BTreeSet<&str> = state
                .allocations
                .iter()
                .filter(|a| a.resource == resource)
                .flat_map(|a| a.device_ids.iter().map(String::as_str))
                .collect();
            state
                .devices
                .get(resource)
                .map(|d| {
                    d.borrow()
                        .iter()
                        .filter(|d| d.healthy && !used.contains(d.id.as_str()))
                        .map(|d| d.id.clone())
                        .collect()
                })
                .unwrap_or_default()
        };
        if free.len() < count {
            return Err(EmulatorError::NotEnoughDevices {
                resource: resource.to_string(),
                wanted: count,
                free: free.len(),
            });
        }
        let mut ids = if preferred {
            self.preferred(resource, &free, &[], count).await?
        } else {
            Vec::new()
        };
        // Like the kubelet, only trust a hint that is a proper answer.
        let valid = ids.len() == count
            && ids.iter().all(|id| free.contains(id))
            && ids.iter().collect::<BTreeSet<_>>().len() == count;
        if !valid {
            ids = free[..count].to_vec();
        }
        let response = self.allocate_ids(resource, &ids).await?;
        let allocation = Allocation {
            pod,
            resource: resource.to_string(),
            device_ids: ids,
            response,
        };
        self.inner.state().allocations.push(allocation.clone());
        self.save_checkpoint()?;
        Ok(allocation)
    }

    /// Rewrite `<dir>/kubelet_internal_checkpoint` from the allocations and the devices
    /// last seen.
    fn save_checkpoint(&self) -> Result<(), EmulatorError> {
        let text = {
            let state = self.inner.state();
            let devices: BTreeMap<String, Vec<DeviceInfo>> = state
                .devices
                .iter()
                .map(|(r, tx)| (r.clone(), tx.borrow().clone()))
                .collect();
            checkpoint_json(&state.allocations, &devices)
        };
        let path = self.inner.dir.join(CHECKPOINT_FILE);
        let tmp = self.inner.dir.join(format!(".{CHECKPOINT_FILE}.tmp"));
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|source| EmulatorError::Io {
                action: "write",
                path: path.display().to_string(),
                source,
            })
    }

    /// Every allocation made so far.
    pub(crate) fn allocations(&self) -> Vec<Allocation> {
        self.inner.state().allocations.clone()
    }

    /// Forget the allocations and claims of a pod (the pod was deleted).
    pub(crate) fn release(&self, namespace: &str, name: &str) {
        let mut state = self.inner.state();
        state
            .allocations
            .retain(|a| !(a.pod.namespace == namespace && a.pod.name == name));
        state
            .claims
            .retain(|c| !(c.pod.namespace == namespace && c.pod.name == name));
        drop(state);
        if let Err(e) = self.save_checkpoint() {
            tracing::warn!(error = %e, "emulated kubelet checkpoint not written");
        }
    }

    /// Simulate a kubelet restart: stop serving, drop plugin connections, delete every
    /// socket in the directory (plugin sockets included), then create `kubelet.sock` again
    /// and accept registrations. Allocations survive, as with the kubelet's checkpoint.
    pub async fn restart(&self) -> Result<(), EmulatorError> {
        let (server, plugins) = {
            let mut state = self.inner.state();
            (state.server.take(), std::mem::take(&mut state.plugins))
        };
        for p in plugins.values() {
            p.token.cancel();
        }
        if let Some((token, handle)) = server {
            token.cancel();
            if tokio::time::timeout(STOP_DEADLINE, handle).await.is_err() {
                tracing::warn!("emulated kubelet server did not stop in time");
            }
        }
        let dir = &self.inner.dir;
        let entries = std::fs::read_dir(dir).map_err(|source| EmulatorError::Io {
            action: "list",
            path: dir.display().to_string(),
            source,
        })?;
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_socket()) {
                let path = entry.path();
                if let Err(source) = crate::runtime::socket::remove(&path) {
                    return Err(EmulatorError::Io {
                        action: "remove",
                        path: path.display().to_string(),
                        source,
                    });
                }
            }
        }
        self.serve_registration()
    }

    /// Serve PodResources v1 on `path`, answering from this emulator's allocations and
    /// latest device lists, until the emulator shuts down.
    pub fn serve_pod_resources(&self, path: &Path) -> Result<(), EmulatorError> {
        pod_resources::serve(&self.inner, path)
    }

    /// Stop every server and connection and remove `kubelet.sock`.
    pub async fn shutdown(self) {
        self.inner.token.cancel();
        self.inner.tracker.close();
        if tokio::time::timeout(STOP_DEADLINE, self.inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("emulated kubelet tasks did not stop in time");
        }
        let _ = crate::runtime::socket::remove(&self.inner.socket);
    }
}

/// File name of the device manager's checkpoint.
pub(crate) const CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";

/// The UID the emulator gives a pod: UUID-shaped and stable for a namespace/name, so tests
/// can lay out `<proc-root>/<pid>/cgroup` files for it before the pod exists.
pub(crate) fn pod_uid(pod: &PodRef) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut next = || {
        for b in pod.namespace.bytes().chain([b'/']).chain(pod.name.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    let (a, b) = (next(), next());
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

/// The device manager's checkpoint for `allocations`, in the kubelet's JSON form
/// (`pkg/kubelet/cm/devicemanager/checkpoint`): `{"Data":{"PodDeviceEntries":[{"PodUID",
/// "ContainerName","ResourceName","DeviceIDs":{"<numa>":[ids]},"AllocResp"}],
/// "RegisteredDevices":{resource:[ids]}},"Checksum":n}`. Device IDs are keyed by the NUMA
/// node ListAndWatch reported (`-1` without one). Unlike the kubelet's, `AllocResp` is empty
/// and `Checksum` is 0: the agent reads neither.
pub(crate) fn checkpoint_json(
    allocations: &[Allocation],
    devices: &BTreeMap<String, Vec<DeviceInfo>>,
) -> String {
    let entries: Vec<serde_json::Value> = allocations
        .iter()
        .map(|a| {
            let mut per_numa: BTreeMap<String, Vec<&str>> = BTreeMap::new();
            for id in &a.device_ids {
                let numa = devices
                    .get(&a.resource)
                    .and_then(|d| d.iter().find(|d| &d.id == id))
                    .and_then(|d| d.numa_node)
                    .unwrap_or(-1);
                per_numa.entry(numa.to_string()).or_default().push(id);
            }
            serde_json::json!({
                "PodUID": pod_uid(&a.pod),
                "ContainerName": a.pod.container,
                "ResourceName": a.resource,
                "DeviceIDs": per_numa,
                "AllocResp": "",
            })
        })
        .collect();
    let registered: BTreeMap<&str, Vec<&str>> = devices
        .iter()
        .map(|(r, d)| (r.as_str(), d.iter().map(|d| d.id.as_str()).collect()))
        .collect();
    serde_json::json!({
        "Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered},
        "Checksum": 0,
    })
    .to_string()
}

fn rpc_error(rpc: &'static str, resource: &str, status: &Status) -> EmulatorError {
    EmulatorError::Rpc {
        rpc,
        resource: resource.to_string(),
        code: status.code(),
        message: status.message().to_string(),
    }
}

fn from_pb(c: pb::ContainerAllocateResponse) -> ContainerAllocation {
    ContainerAllocation {
        cdi_devices: c.cdi_devices.into_iter().map(|d| d.name).collect(),
        envs: c.envs.into_iter().collect(),
        mounts: c
            .mounts
            .into_iter()
            .map(|m| MountEntry {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        annotations: c.annotations.into_iter().collect(),
        device_specs: c
            .devices
            .into_iter()
            .map(|d| crate::domain::allocate::DeviceSpecEntry {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
    }
}

fn to_devices(frame: pb::ListAndWatchResponse) -> Vec<DeviceInfo> {
    // A frame the daemon encoded always decodes; a broken one reads as no devices, which
    // every test waiting for devices reports.
    frame
        .devices()
        .unwrap_or_default()
        .into_iter()
        .map(|d| DeviceInfo {
            healthy: d.health == crate::proto::HEALTHY,
            numa_node: d.topology.and_then(|t| t.nodes.first().map(|n| n.id)),
            id: d.id,
        })
        .collect()
}

/// The emulated kubelet's Registration service.
#[derive(Debug)]
struct RegistrationService {
    /// Weak so the server task does not keep the emulator alive.
    inner: std::sync::Weak<Inner>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let req = request.into_inner();
        if req.version != crate::proto::VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported device plugin API version {}",
                req.version
            )));
        }
        if req.resource_name.is_empty() || req.endpoint.contains('/') || req.endpoint.is_empty() {
            return Err(Status::invalid_argument(format!(
                "bad registration: resource `{}`, endpoint `{}`",
                req.resource_name, req.endpoint
            )));
        }
        let Some(inner) = self.inner.upgrade() else {
            return Err(Status::unavailable("kubelet emulator is shutting down"));
        };
        tracing::debug!(resource = %req.resource_name, endpoint = %req.endpoint, "emulated kubelet: register");
        // As the kubelet does, answer first and dial the plugin in the background.
        let token = inner.token.child_token();
        let task_inner = inner.clone();
        inner.tracker.spawn(async move {
            let resource = req.resource_name.clone();
            if let Err(e) = connect_plugin(task_inner, req, token).await {
                tracing::warn!(resource = %resource, error = %e, "emulated kubelet: plugin connection ended");
            }
        });
        Ok(Response::new(pb::Empty {}))
    }
}

/// Dial a registered plugin and follow its ListAndWatch stream until cancelled or closed.
async fn connect_plugin(
    inner: Arc<Inner>,
    req: pb::RegisterRequest,
    token: CancellationToken,
) -> Result<(), EmulatorError> {
    let resource = req.resource_name.clone();
    let path = inner.dir.join(&req.endpoint);
    let err = |rpc, s: &Status| rpc_error(rpc, &resource, s);
    let channel = Endpoint::from_shared(format!("unix://{}", path.display()))
        .map_err(|e| err("connect", &Status::unavailable(e.to_string())))?
        .connect()
        .await
        .map_err(|e| err("connect", &Status::unavailable(e.to_string())))?;
    let mut client = DevicePluginClient::new(channel);
    let options = client
        .get_device_plugin_options(pb::Empty {})
        .await
        .map_err(|s| err("GetDevicePluginOptions", &s))?
        .into_inner();
    let mut stream = client
        .list_and_watch(pb::Empty {})
        .await
        .map_err(|s| err("ListAndWatch", &s))?
        .into_inner();
    let devices = {
        let mut state = inner.state();
        if let Some(old) = state.plugins.insert(
            resource.clone(),
            PluginConn {
                client,
                preferred: options.get_preferred_allocation_available,
                token: token.clone(),
            },
        ) {
            old.token.cancel();
        }
        state
            .devices
            .entry(resource.clone())
            .or_insert_with(|| watch::Sender::new(Vec::new()))
            .clone()
    };
    let mut first = true;
    loop {
        let message = tokio::select! {
            () = token.cancelled() => return Ok(()),
            m = stream.message() => m,
        };
        match message {
            Ok(Some(frame)) => {
                devices.send_replace(to_devices(frame));
                let counted = !first;
                first = false;
                inner.registered.send_modify(|m| {
                    let entry = m.entry(resource.clone()).or_insert(Registered {
                        endpoint: req.endpoint.clone(),
                        get_preferred_allocation_available: options
                            .get_preferred_allocation_available,
                        count: 0,
                        frames: 0,
                        open: true,
                    });
                    if !counted {
                        entry.endpoint.clone_from(&req.endpoint);
                        entry.get_preferred_allocation_available =
                            options.get_preferred_allocation_available;
                        entry.count += 1;
                    }
                    entry.frames += 1;
                    entry.open = true;
                });
            }
            end => {
                inner.registered.send_modify(|m| {
                    if let Some(entry) = m.get_mut(&resource) {
                        entry.open = false;
                    }
                });
                return match end {
                    Err(s) => Err(err("ListAndWatch", &s)),
                    _ => Ok(()),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_is_what_the_agent_reads_with_stable_uuid_shaped_pod_uids() {
        let pod = PodRef {
            namespace: "ml".into(),
            name: "a".into(),
            container: "main".into(),
        };
        let uid = pod_uid(&pod);
        assert_eq!(uid, pod_uid(&pod.clone()));
        assert_eq!(uid.len(), 36, "{uid}");
        assert_eq!(uid.matches('-').count(), 4, "{uid}");
        let other = PodRef {
            name: "b".into(),
            ..pod.clone()
        };
        assert_ne!(uid, pod_uid(&other));
        let allocations = vec![Allocation {
            pod: pod.clone(),
            resource: "nvidia.com/gpu".into(),
            device_ids: vec!["GPU-x::1".into(), "GPU-x::0".into()],
            response: ContainerAllocation::default(),
        }];
        let devices = BTreeMap::from([(
            "nvidia.com/gpu".to_string(),
            vec![
                DeviceInfo {
                    id: "GPU-x::0".into(),
                    healthy: true,
                    numa_node: Some(0),
                },
                DeviceInfo {
                    id: "GPU-x::1".into(),
                    healthy: true,
                    numa_node: None,
                },
            ],
        )]);
        let text = checkpoint_json(&allocations, &devices);
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(
            v["Data"]["PodDeviceEntries"][0]["DeviceIDs"],
            serde_json::json!({"0": ["GPU-x::0"], "-1": ["GPU-x::1"]})
        );
        let entries = crate::domain::usage::parse_checkpoint(&text, "emulator").expect("parses");
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].pod_uid, uid);
        assert_eq!(entries[0].container, "main");
        assert_eq!(entries[0].device_ids, vec!["GPU-x::0", "GPU-x::1"]);
    }
}
