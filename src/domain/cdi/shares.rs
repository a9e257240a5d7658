//! Per-share CDI devices: `<device>-share-<k>` = k of the N replicas of a GPU or MIG device
//! whose resource is shared with an enforced isolation level (`memory`, `mps`,
//! `memory+mps`).
//!
//! Pure: reads the [`Plan`] (which devices are split how many ways, one replica's memory),
//! the MPS daemon layout from `crate::domain::mps` (pipe directories, shm), and the host path of
//! the hook binary given by the caller. [`super::generate`](fn@super::generate) appends the devices built here
//! to the spec; the device plugin answers a k-replica Allocate with [`share_device_name`].
//!
//! Naming: every physical device is already in the spec twice, by UUID and by index
//! (`0`, `1:3`); each gets its shares as `<name>-share-<k>` (`0-share-3`,
//! `GPU-…-share-3`, `1:3-share-2`). The UUID form is what Allocate answers (stable across
//! re-enumeration), the index form is for people typing `podman run --device`.
//!
//! What a k-share device carries, besides the parent's device nodes:
//! - `memory` levels: a `createRuntime` hook `gpu-slicer cdi-hook set-memory-limit
//!   --device <GPU UUID> --bytes <k × one replica's memory>`, run by the runtime on the host
//!   after the container's cgroup exists and before its process starts. The hook fails
//!   closed, so a container whose limit cannot be set never starts. CDI 0.3.0 already
//!   has hooks, so no newer `cdiVersion` is needed.
//! - `mps` levels: `CUDA_MPS_PIPE_DIRECTORY` and the pipe + shm bind mounts of the
//!   device's own control daemon (`<mpsRoot>/<uuid>/shm` at `/dev/shm`: a share never
//!   names another daemon's shm), `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = k × 100 / N` and
//!   `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT = 0=<k × one replica>M`. The daemon's defaults
//!   (one replica's worth per client process, `crate::domain::mps`) stay the binding ceiling: the
//!   client variables can only lower it, so they state the container's entitlement and
//!   let a process ask for less, never more.

use std::path::PathBuf;

use super::{ContainerEdits, Device, Hook, Mount};
use crate::domain::config::Isolation;
use crate::domain::plan::Plan;

/// Seconds the runtime gives the memory-limit hook (NVML init on a busy node can be slow).
pub(crate) const HOOK_TIMEOUT_SECS: i64 = 30;

/// Where the memory-limit hook lives and what it is told, on the HOST the runtime runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HookSettings {
    /// Absolute host path of the `gpu-slicer` binary the runtime executes.
    pub(crate) path: PathBuf,
    /// `--nvml-lib` passed to the hook (default: the system's libnvidia-ml.so.1).
    pub(crate) nvml_lib: Option<PathBuf>,
    /// `KEY=VALUE` environment of the hook process.
    pub(crate) env: Vec<String>,
}

/// What the generator needs to add share devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShareOptions {
    /// The plan: which devices are split N ways with which isolation (shared, not copied:
    /// the daemon's plan has hundreds of devices).
    pub(crate) plan: std::sync::Arc<Plan>,
    /// `flags.mpsRoot` (required when any resource uses MPS).
    pub(crate) mps_root: Option<PathBuf>,
    /// The memory-limit hook.
    pub(crate) hook: HookSettings,
}

/// The limits of one share: k of N replicas of one physical device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShareLimits {
    /// `GPU-…` or `MIG-…`.
    pub(crate) uuid: String,
    /// Parent GPU UUID (the memory limit is set on the GPU handle).
    pub(crate) gpu_uuid: String,
    /// `i` or `i:j`.
    pub(crate) index_name: String,
    /// Isolation level of the resource.
    pub(crate) isolation: Isolation,
    /// Shares granted.
    pub(crate) k: u32,
    /// Replicas of the device.
    pub(crate) of: u32,
    /// Hard memory limit: k × one replica's memory.
    pub(crate) memory_bytes: u64,
    /// Active thread percentage of the device: k × 100 / N, rounded down.
    pub(crate) thread_percent: u32,
}

/// `<device name>-share-<k>`: the CDI device of k shares of `device` (a UUID or index name).
pub(crate) fn share_device_name(device: &str, k: u32) -> String {
    format!("{device}-share-{k}")
}

/// The limits of k shares of a device split `of` ways, `per_replica` bytes each.
pub(crate) fn limits_for(per_replica: u64, k: u32, of: u32) -> (u64, u32) {
    let memory = per_replica.saturating_mul(u64::from(k));
    let threads = k.saturating_mul(100) / of.max(1);
    (memory, threads)
}

/// Every share of every device whose resource has an enforced isolation level, sorted by
/// UUID then k.
pub(crate) fn share_limits(plan: &Plan) -> Vec<ShareLimits> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (resource, device) in plan.devices() {
        let (Some(sharing), Some(replica)) = (&resource.sharing, device.replica) else {
            continue;
        };
        if sharing.isolation == Isolation::None || !seen.insert(device.physical.uuid.clone()) {
            continue;
        }
        for k in 1..=replica.of {
            let (memory_bytes, thread_percent) =
                limits_for(device.share.memory_bytes, k, replica.of);
            out.push(ShareLimits {
                uuid: device.physical.uuid.clone(),
                gpu_uuid: device.physical.gpu_uuid.clone(),
                index_name: device.physical.index_name(),
                isolation: sharing.isolation,
                k,
                of: replica.of,
                memory_bytes,
                thread_percent,
            });
        }
    }
    out.sort_by(|a, b| (&a.uuid, a.k).cmp(&(&b.uuid, b.k)));
    out
}

/// The `createRuntime` hook that sets the hard limit of k shares.
pub(crate) fn memory_hook(hook: &HookSettings, gpu_uuid: &str, bytes: u64) -> Hook {
    let path = hook.path.display().to_string();
    let mut args = vec![
        path.clone(),
        "cdi-hook".into(),
        "set-memory-limit".into(),
        "--device".into(),
        gpu_uuid.to_string(),
        "--bytes".into(),
        bytes.to_string(),
    ];
    if let Some(lib) = &hook.nvml_lib {
        args.push("--nvml-lib".into());
        args.push(lib.display().to_string());
    }
    Hook {
        hook_name: "createRuntime".into(),
        path,
        args,
        env: hook.env.clone(),
        timeout: Some(HOOK_TIMEOUT_SECS),
    }
}

/// Share devices for `opts.plan`, given the already generated parent devices (looked up
/// by UUID and index name for their device nodes). Errors name the device when an MPS
/// level has no MPS root or a parent is missing from the spec.
pub(crate) fn share_devices(
    opts: &ShareOptions,
    parents: &[Device],
) -> std::result::Result<Vec<Device>, super::CdiError> {
    let limits = share_limits(&opts.plan);
    if limits.is_empty() {
        return Ok(Vec::new());
    }
    let daemons = match &opts.mps_root {
        Some(root) => {
            crate::domain::mps::daemons(&opts.plan, root).map_err(|e| super::CdiError::Edits {
                device: "(MPS shares)".into(),
                rule: e.to_string(),
            })?
        }
        None => Vec::new(),
    };
    let mut out = Vec::with_capacity(limits.len() * 2);
    for s in &limits {
        let parent =
            parents
                .iter()
                .find(|d| d.name == s.uuid)
                .ok_or_else(|| super::CdiError::Edits {
                    device: share_device_name(&s.uuid, s.k),
                    rule: "the shared device is not in this node's inventory".into(),
                })?;
        let mut edits = ContainerEdits {
            device_nodes: parent.container_edits.device_nodes.clone(),
            ..ContainerEdits::default()
        };
        if s.isolation.uses_memory_limit() {
            edits
                .hooks
                .push(memory_hook(&opts.hook, &s.gpu_uuid, s.memory_bytes));
        }
        if s.isolation.uses_mps() {
            let Some(daemon) = daemons.iter().find(|d| d.uuid == s.uuid) else {
                return Err(super::CdiError::Edits {
                    device: share_device_name(&s.uuid, s.k),
                    rule: "uses MPS but no MPS root is configured (flags.mpsRoot)".into(),
                });
            };
            mps_edits(&mut edits, daemon, s);
        }
        for name in [&s.uuid, &s.index_name] {
            out.push(Device {
                name: share_device_name(name, s.k),
                container_edits: edits.clone(),
            });
        }
    }
    Ok(out)
}

fn mps_edits(edits: &mut ContainerEdits, daemon: &crate::domain::mps::DaemonSpec, s: &ShareLimits) {
    mps_client(edits, daemon, Some(s.thread_percent), s.memory_bytes);
}

/// The edits of an MPS client of `daemon`: its pipe directory and `/dev/shm`, plus
/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (when given) and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
/// (`pinned_bytes`, in whole MiB) for the one device the daemon sees. Also used for DRA
/// claim shares (`crate::domain::dra::cdi`).
pub(crate) fn mps_client(
    edits: &mut ContainerEdits,
    daemon: &crate::domain::mps::DaemonSpec,
    thread_percent: Option<u32>,
    pinned_bytes: u64,
) {
    let client = daemon.client_edits();
    edits
        .env
        .extend(client.env.iter().map(|(k, v)| format!("{k}={v}")));
    if let Some(t) = thread_percent {
        edits
            .env
            .push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={t}"));
    }
    // The daemon sees one device, index 0.
    edits.env.push(format!(
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}M",
        pinned_bytes >> 20
    ));
    edits
        .mounts
        .extend(client.mounts.into_iter().map(|(host, container)| Mount {
            host_path: host.display().to_string(),
            container_path: container,
            mount_type: None,
            options: vec!["rbind".into(), "nosuid".into(), "nodev".into()],
        }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_scale_with_k_and_never_exceed_the_device() {
        // Property over many splits: k shares are exactly k × one share, monotonic, and N
        // shares fit the device they split.
        for device_memory in [1u64 << 30, 80 << 30, 81_920 * (1 << 20) + 12_345, 7] {
            for of in 2..=48u32 {
                let per = device_memory / u64::from(of);
                let mut last = (0, 0);
                for k in 1..=of {
                    let (mem, thr) = limits_for(per, k, of);
                    assert_eq!(mem, per * u64::from(k));
                    assert!(mem <= device_memory, "k={k} of={of}");
                    assert!(thr <= 100 && thr >= last.1 && mem >= last.0);
                    assert_eq!(thr, k * 100 / of);
                    last = (mem, thr);
                }
                assert_eq!(last.1, 100, "N of N shares is the whole device");
            }
        }
    }

    #[test]
    fn hook_names_the_gpu_bytes_and_library() {
        let hook = HookSettings {
            path: "/usr/bin/gpu-slicer".into(),
            nvml_lib: Some("/lib/libnvidia-ml.so.1".into()),
            env: vec!["A=1".into()],
        };
        let h = memory_hook(&hook, "GPU-1", 3 << 30);
        assert_eq!(h.hook_name, "createRuntime");
        assert_eq!(h.path, "/usr/bin/gpu-slicer");
        assert_eq!(
            h.args.join(" "),
            "/usr/bin/gpu-slicer cdi-hook set-memory-limit --device GPU-1 --bytes 3221225472 --nvml-lib /lib/libnvidia-ml.so.1"
        );
        assert_eq!(h.env, vec!["A=1"]);
        assert_eq!(h.timeout, Some(HOOK_TIMEOUT_SECS));
    }
}
