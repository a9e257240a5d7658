//! MPS: the CUDA Multi-Process Service control daemons gpu-slicer runs for shared devices.
//!
//! The pure half lives here: from a [`Plan`] and `Config.mps_root` derive one
//! [`DaemonSpec`] per physical device (GPU or MIG UUID) whose resource is shared with an
//! MPS isolation level, with its pipe/log directories, environment and the default limits
//! sent through the control interface; and the edits ([`MpsClientEdits`]) that Allocate
//! and the CDI generator hand a container so its CUDA clients reach that daemon.
//! `runtime::mps::daemon` runs and supervises the daemons (`nvidia-cuda-mps-control`); the device
//! plugin reads their state to mark devices Unhealthy while a daemon is down.
//!
//! # Thread-percentage design
//!
//! MPS limits are per *client process* (per CUDA context), not per container: every
//! client of a daemon's server is capped at the active-thread percentage and pinned-memory
//! limit the daemon was given (`set_default_active_thread_percentage`,
//! `set_default_device_pinned_mem_limit`, sent before any server exists so they apply to
//! every server the daemon spawns). A client's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` can
//! only lower that cap, never raise it; `set_active_thread_percentage <server PID>`
//! changes the cap for a whole server, i.e. for every tenant at once (the daemon runs one
//! server at a time, and containers normally share a UID), so there is no per-client
//! ceiling to hand out.
//!
//! Decision: the daemon default is the per-replica floor, `100 / replicas` of the physical
//! device (integer, like NVIDIA's plugin; for a MIG device relative to the MIG device),
//! and the pinned-memory default is the per-replica memory. That floor is what makes a
//! share *bind*: no tenant can exceed one replica's worth per process, whatever its
//! environment says. Raising the default to `k / N` so a k-share container could set
//! `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = k × 100 / N` would let every 1-share tenant raise
//! itself to `k / N` by dropping that variable, so we do not do it.
//!
//! Consequence: a container holding k replicas (only possible with
//! `failRequestsGreaterThanOne: false`; MPS sharing rejects k > 1 by default, as NVIDIA's
//! plugin does) gets k/N of the device by running up to k client processes (e.g. one per
//! rank); a single process in it gets 1/N. The k-share CDI device (`crate::domain::cdi::shares`)
//! still sets `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = k × 100 / N` and a pinned limit of k
//! shares: they state the container's entitlement (tools read them) and can only lower a
//! process's cap, never raise it past the floor; the book says so instead of promising
//! k/N to one process. A container with replicas on two devices
//! cannot use both through MPS (one `CUDA_MPS_PIPE_DIRECTORY` per process); Allocate has to
//! keep MPS requests on one device.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::domain::config::Config;
use crate::domain::plan::Plan;

/// Directory inside the container under which each daemon's pipe directory is mounted.
pub(crate) const CONTAINER_MPS_ROOT: &str = "/mps";

/// Default client/daemon binary.
pub(crate) const DEFAULT_CONTROL_BIN: &str = "nvidia-cuda-mps-control";

/// Default size bound of each daemon's `/dev/shm` tmpfs (`--mps-shm-size`). A bound, not a
/// reservation: pages are used (and charged to the writer's cgroup) only when written. One
/// per daemon, so a node with 8 shared GPUs caps MPS shared memory at 8 GiB, where NVIDIA's
/// plugin gives all daemons and tenants together one tmpfs of half the node's RAM.
pub(crate) const DEFAULT_SHM_SIZE: &str = "1Gi";

/// Errors of the MPS manager.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MpsError {
    /// A resource uses MPS but no `flags.mpsRoot` is set.
    #[error(
        "resource {resource} uses MPS but no MPS root is configured (set flags.mpsRoot or --mps-root)"
    )]
    NoMpsRoot { resource: String },
    /// A device UUID that cannot name a directory.
    #[error("device id `{uuid}` cannot be used as an MPS directory name")]
    BadUuid { uuid: String },
    /// Creating a daemon's directories failed.
    #[error("cannot create {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The daemon's `/dev/shm` (`<mpsRoot>/<uuid>/shm`) could not be mounted.
    #[error(
        "cannot mount a {size_bytes}-byte tmpfs at {path} as the /dev/shm of the MPS daemon for {uuid}: {source}"
    )]
    Shm {
        uuid: String,
        path: PathBuf,
        size_bytes: u64,
        #[source]
        source: std::io::Error,
    },
    /// The daemon could not be given its own mount namespace with its `/dev/shm`.
    #[error(
        "cannot start {bin} for {uuid} in a mount namespace of its own with {shm} as /dev/shm: {source}"
    )]
    Namespace {
        bin: PathBuf,
        uuid: String,
        shm: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The control binary could not be started.
    #[error("cannot start {bin} for {uuid}: {source}")]
    Spawn {
        bin: PathBuf,
        uuid: String,
        #[source]
        source: std::io::Error,
    },
    /// A control command failed or timed out.
    #[error("MPS control command `{command}` for {uuid} failed: {message}")]
    Control {
        uuid: String,
        command: String,
        message: String,
    },
    /// The daemon exited while being set up.
    #[error("MPS control daemon for {uuid} exited during start-up: {status}")]
    ExitedEarly { uuid: String, status: String },
    /// Not every daemon came up in time.
    #[cfg(test)]
    #[error("MPS control daemons not up after {waited:?}: {down}")]
    NotUp {
        waited: std::time::Duration,
        down: String,
    },
}

/// Result alias for this module.
pub(crate) type Result<T, E = MpsError> = std::result::Result<T, E>;

/// One MPS control daemon gpu-slicer runs: everything needed to start and configure it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DaemonSpec {
    /// `GPU-…` or `MIG-…`: the only device the daemon sees.
    pub(crate) uuid: String,
    /// The GPU (parent for MIG devices): compute mode is a GPU setting.
    pub(crate) gpu_uuid: String,
    /// Resource whose replicas the daemon serves.
    pub(crate) resource: String,
    /// Replicas of this device.
    pub(crate) replicas: u32,
    /// `<mpsRoot>/<uuid>/pipe`: control pipe, mounted into clients.
    pub(crate) pipe_dir: PathBuf,
    /// `<mpsRoot>/<uuid>/log`: control and server logs.
    pub(crate) log_dir: PathBuf,
    /// `<mpsRoot>/<uuid>/shm`: this daemon's `/dev/shm` and its clients' (a size-bounded
    /// tmpfs the supervisor mounts; see [`DaemonSpec::client_edits`]).
    pub(crate) shm_dir: PathBuf,
    /// Default active thread percentage: `100 / replicas` of this device.
    pub(crate) active_thread_percentage: u32,
    /// Default pinned device memory per client, MiB: one replica's memory.
    pub(crate) pinned_mem_limit_mib: u64,
}

impl DaemonSpec {
    /// Environment of the daemon and of every control-client invocation.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        vec![
            // MIG UUIDs are valid here; the daemon then sees exactly one device, index 0.
            ("CUDA_VISIBLE_DEVICES".into(), self.uuid.clone()),
            (
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                self.pipe_dir.display().to_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".into(),
                self.log_dir.display().to_string(),
            ),
        ]
    }

    /// Control commands that set the default limits, in the order they are sent.
    pub(crate) fn default_limit_commands(&self) -> Vec<String> {
        vec![
            // Device index 0: the daemon only sees its one device.
            format!(
                "set_default_device_pinned_mem_limit 0 {}M",
                self.pinned_mem_limit_mib
            ),
            format!(
                "set_default_active_thread_percentage {}",
                self.active_thread_percentage
            ),
        ]
    }

    /// Where the pipe directory appears inside a container.
    pub(crate) fn container_pipe_dir(&self) -> String {
        format!("{CONTAINER_MPS_ROOT}/{}/pipe", self.uuid)
    }

    /// What a container allocated replicas of this device needs to reach the daemon.
    ///
    /// MPS clients and the server exchange data through POSIX shared memory, so a client
    /// must see the `/dev/shm` the server uses: the container gets this daemon's
    /// [`DaemonSpec::shm_dir`] at `/dev/shm`, and the supervisor runs the daemon (and so
    /// the server it spawns) in a mount namespace of its own with that same directory as
    /// its `/dev/shm`. One directory per daemon, never one for all: tenants of different
    /// devices must not read each other's segments, and a tenant filling its `/dev/shm`
    /// fills only its daemon's bounded tmpfs. The host's own `/dev/shm` is never used:
    /// exposing it would leak host segments to tenants.
    pub(crate) fn client_edits(&self) -> MpsClientEdits {
        let pipe = self.container_pipe_dir();
        MpsClientEdits {
            env: vec![("CUDA_MPS_PIPE_DIRECTORY".into(), pipe.clone())],
            mounts: vec![
                (self.pipe_dir.clone(), pipe),
                (self.shm_dir.clone(), "/dev/shm".into()),
            ],
        }
    }
}

/// Container edits for an MPS share: environment and bind mounts (host → container).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct MpsClientEdits {
    /// Environment variables, in order.
    pub(crate) env: Vec<(String, String)>,
    /// Bind mounts: host path, container path.
    pub(crate) mounts: Vec<(PathBuf, String)>,
}

/// The daemons a plan needs, keyed and sorted by device UUID.
///
/// Errors when a resource uses MPS but `cfg.mps_root` is unset (config loading fills a
/// default, so this only happens for hand-built configs).
pub(crate) fn daemons_for(plan: &Plan, cfg: &Config) -> Result<Vec<DaemonSpec>> {
    match &cfg.mps_root {
        Some(root) => daemons(plan, root),
        None => match plan
            .resources
            .iter()
            .find(|r| r.sharing.as_ref().is_some_and(|s| s.isolation.uses_mps()))
        {
            Some(r) => Err(MpsError::NoMpsRoot {
                resource: r.name.clone(),
            }),
            None => Ok(Vec::new()),
        },
    }
}

/// The daemons a plan needs under `mps_root`: one per physical device whose resource is
/// shared with an MPS isolation level, sorted by UUID.
pub(crate) fn daemons(plan: &Plan, mps_root: &Path) -> Result<Vec<DaemonSpec>> {
    let mut out: BTreeMap<String, DaemonSpec> = BTreeMap::new();
    for (resource, device) in plan.devices() {
        let Some(sharing) = &resource.sharing else {
            continue;
        };
        if !sharing.isolation.uses_mps() {
            continue;
        }
        let Some(replica) = device.replica else {
            continue;
        };
        let uuid = &device.physical.uuid;
        if out.contains_key(uuid) {
            continue;
        }
        check_uuid(uuid)?;
        let dir = mps_root.join(uuid);
        out.insert(
            uuid.clone(),
            DaemonSpec {
                uuid: uuid.clone(),
                gpu_uuid: device.physical.gpu_uuid.clone(),
                resource: resource.name.clone(),
                replicas: replica.of,
                pipe_dir: dir.join("pipe"),
                log_dir: dir.join("log"),
                shm_dir: dir.join("shm"),
                // Relative to this physical device (the MIG device for MIG), not the GPU:
                // the daemon only sees this device.
                active_thread_percentage: 100 / replica.of.max(1),
                pinned_mem_limit_mib: device.share.memory_bytes >> 20,
            },
        );
    }
    Ok(out.into_values().collect())
}

/// A UUID becomes a directory name: refuse anything that could escape `mps_root`.
fn check_uuid(uuid: &str) -> Result<()> {
    let ok = !uuid.is_empty()
        && uuid != "."
        && uuid != ".."
        && uuid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(MpsError::BadUuid { uuid: uuid.into() })
    }
}

#[cfg(test)]
mod tests;
