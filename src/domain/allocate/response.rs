//! What a valid container request is answered with.
//!
//! gpu-slicer is CDI first: every answer carries `cdi_devices` (one qualified name per
//! backing GPU / MIG device, `"{cdi_kind}={uuid}"`, deduplicated; for a resource shared
//! with an enforced isolation level the k-share device `"{cdi_kind}={uuid}-share-{k}"`,
//! whose edits carry the memory-limit hook and MPS limits of k shares) and the same names in a
//! `cdi.k8s.io/` container annotation for kubelets and runtimes that only read annotations.
//! The incumbent's `envvar` and `volume-mounts` formats are added only when
//! `deviceListStrategy` asks for them. The share granted is always stated in
//! `GPU_SLICER_*` env so workloads and MPS wrappers can bind to it.

use std::collections::{BTreeMap, HashSet};

use crate::domain::config::{Config, DeviceIdStrategy, DeviceListStrategy, Isolation};
use crate::domain::devnodes::DeviceNodes;
use crate::domain::plan::{Device, Resource};

/// Env var carrying the granted memory in bytes (sum over the request).
pub(crate) const ENV_MEMORY_BYTES: &str = "GPU_SLICER_MEMORY_BYTES";
/// Env var carrying the granted compute percent (sum over the request).
pub(crate) const ENV_COMPUTE_PERCENT: &str = "GPU_SLICER_COMPUTE_PERCENT";
/// Env var carrying the number of units granted.
pub(crate) const ENV_REPLICAS: &str = "GPU_SLICER_REPLICAS";
/// NVIDIA's device list env var.
pub(crate) const ENV_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Container directory of NVIDIA's volume-mounts device list.
pub(crate) const VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";
/// Name part of the annotation key before the resource-specific suffix.
const ANNOTATION_PLUGIN: &str = "gpu-slicer";
/// Longest key part after the annotation prefix (a Kubernetes qualified-name part).
const ANNOTATION_NAME_MAX: usize = 63;

/// A mount in the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    /// Path in the container.
    pub(crate) container_path: String,
    /// Path on the host.
    pub(crate) host_path: String,
    /// Read-only.
    pub(crate) read_only: bool,
}

/// A device node in the answer (`passDeviceSpecs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceSpecEntry {
    /// Path in the container.
    pub(crate) container_path: String,
    /// Path on the host.
    pub(crate) host_path: String,
    /// cgroup permissions (`rw`, `rwm`).
    pub(crate) permissions: String,
}

/// The answer to one container request, in domain terms.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerAllocation {
    /// Fully qualified CDI device names, deduplicated, in request order.
    pub cdi_devices: Vec<String>,
    /// Container env.
    pub(crate) envs: BTreeMap<String, String>,
    /// Container mounts.
    pub(crate) mounts: Vec<MountEntry>,
    /// Container annotations.
    pub(crate) annotations: BTreeMap<String, String>,
    /// Device nodes, only with `passDeviceSpecs` (see [`add_device_specs`]).
    pub(crate) device_specs: Vec<DeviceSpecEntry>,
}

#[cfg(test)]
/// Build the answer for validated devices of `resource`.
pub(crate) fn build_response(
    cfg: &Config,
    resource: &Resource,
    devices: &[&Device],
) -> ContainerAllocation {
    build(cfg, resource, devices).0
}

/// The answer for validated devices of `resource`, and the CDI device names it uses
/// (without `<kind>=`, as the held set records them).
pub(crate) fn build(
    cfg: &Config,
    resource: &Resource,
    devices: &[&Device],
) -> (ContainerAllocation, Vec<String>) {
    // Requests name a handful of devices: a linear scan beats hashing.
    let mut physical: Vec<&Device> = Vec::with_capacity(devices.len());
    for d in devices {
        if !physical.iter().any(|p| p.physical.uuid == d.physical.uuid) {
            physical.push(d);
        }
    }
    let names: Vec<String> = physical
        .iter()
        .map(|d| cdi_device_name(resource, devices, d))
        .collect();
    let cdi_devices: Vec<String> = names
        .iter()
        .map(|name| format!("{}={name}", cfg.cdi_kind))
        .collect();
    let mut out = ContainerAllocation {
        annotations: BTreeMap::from([(
            annotation_key(&cfg.cdi_annotation_prefix, &resource.name),
            cdi_devices.join(","),
        )]),
        cdi_devices,
        ..ContainerAllocation::default()
    };
    let ids: Vec<String> = physical
        .iter()
        .map(|d| match cfg.device_id_strategy {
            DeviceIdStrategy::Uuid => d.physical.uuid.clone(),
            DeviceIdStrategy::Index => d.physical.index_name(),
        })
        .collect();
    if cfg
        .device_list_strategy
        .contains(&DeviceListStrategy::Envvar)
    {
        out.envs
            .insert(ENV_VISIBLE_DEVICES.to_string(), ids.join(","));
    }
    // As the incumbent does, volume-mounts replaces the env list with the mount directory.
    if cfg
        .device_list_strategy
        .contains(&DeviceListStrategy::VolumeMounts)
    {
        out.envs.insert(
            ENV_VISIBLE_DEVICES.to_string(),
            VOLUME_MOUNTS_ROOT.to_string(),
        );
        out.mounts = ids
            .iter()
            .map(|id| MountEntry {
                container_path: format!("{VOLUME_MOUNTS_ROOT}/{id}"),
                host_path: "/dev/null".to_string(),
                read_only: true,
            })
            .collect();
    }
    let memory: u64 = devices.iter().map(|d| d.share.memory_bytes).sum();
    let compute: u32 = devices.iter().map(|d| d.share.compute_percent).sum();
    out.envs
        .insert(ENV_MEMORY_BYTES.to_string(), memory.to_string());
    out.envs
        .insert(ENV_COMPUTE_PERCENT.to_string(), compute.to_string());
    out.envs
        .insert(ENV_REPLICAS.to_string(), devices.len().to_string());
    (out, names)
}

/// The CDI device a request gets for the physical device behind `d`: the physical device
/// itself, or, for a resource shared with an enforced isolation level, the
/// `<uuid>-share-<k>` device whose edits bind k shares (k = the request's replicas of that
/// physical device).
pub(crate) fn cdi_device_name(resource: &Resource, devices: &[&Device], d: &Device) -> String {
    let enforced = resource
        .sharing
        .as_ref()
        .is_some_and(|s| s.isolation != Isolation::None);
    if !enforced {
        return d.physical.uuid.clone();
    }
    let k = devices
        .iter()
        .filter(|o| o.physical.uuid == d.physical.uuid)
        .count();
    crate::domain::cdi::shares::share_device_name(
        &d.physical.uuid,
        u32::try_from(k).unwrap_or(u32::MAX),
    )
}

/// `<prefix>gpu-slicer_<resource>`: one key per resource, so a container that takes two
/// resources gets two annotations rather than a clash. The part after the prefix must be a
/// qualified-name part (≤ 63 characters, alphanumeric at both ends, `[A-Za-z0-9_.-]`); long
/// resource names are shortened and made unique with a hash.
pub(crate) fn annotation_key(prefix: &str, resource: &str) -> String {
    // Built in one buffer: every Allocate answer carries this key.
    let mut key =
        String::with_capacity(prefix.len() + ANNOTATION_PLUGIN.len() + 1 + resource.len());
    key.push_str(prefix);
    key.push_str(ANNOTATION_PLUGIN);
    key.push('_');
    key.extend(resource.chars().map(|c| {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
            c
        } else {
            '_'
        }
    }));
    // Every character of the name part is ASCII now, so byte lengths are character counts.
    if key.len() - prefix.len() > ANNOTATION_NAME_MAX {
        let hash = format!("{:08x}", fnv1a(resource.as_bytes()));
        key.truncate(prefix.len() + ANNOTATION_NAME_MAX - hash.len() - 1);
        key.push('-');
        key.push_str(&hash);
    }
    while key.len() > prefix.len() && key.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        key.pop();
    }
    key
}

/// 32-bit FNV-1a: a stable hash (unlike std's), so keys do not change across restarts.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// With `passDeviceSpecs`, add DeviceSpecs (`rw`, host path under `devRoot`) for the control
/// nodes and every node of the granted physical devices, deduplicated. Without it, nothing.
pub(crate) fn add_device_specs(
    out: &mut ContainerAllocation,
    cfg: &Config,
    nodes: &DeviceNodes,
    devices: &[&Device],
) {
    if !cfg.pass_device_specs {
        return;
    }
    let mut seen = HashSet::new();
    let paths = crate::domain::devnodes::CONTROL_NODES
        .iter()
        .map(|p| (*p).to_string())
        .chain(
            devices
                .iter()
                .filter_map(|d| nodes.of(&d.physical.uuid))
                .flatten()
                .cloned(),
        );
    for path in paths {
        if seen.insert(path.clone()) {
            let host = cfg.dev_root.join(path.trim_start_matches('/'));
            out.device_specs.push(DeviceSpecEntry {
                host_path: host.display().to_string(),
                container_path: path,
                permissions: "rw".to_string(),
            });
        }
    }
}
