//! The gpu-slicer node description format.
//!
//! A node file describes what a GPU node has: GPUs with their identity, memory and PCI/NUMA
//! placement, MIG mode and MIG devices. It is read by three parties that must agree on it:
//! the sim backend of `gpu-slicer` (demos, tests, Podman development hosts), the fake
//! `libnvidia-ml.so` used in CI (which serves the same node through the real NVML ABI), and
//! the golden tests that compare the two. Keeping the format in its own small crate lets the
//! fake library use it without linking the agent.
//!
//! Parsing is strict (unknown keys are errors) and every error names the file and the field.
//! [`NodeSpec::validate`] checks the physical rules: unique UUIDs/indices/minors, and MIG
//! layouts that fit the product (compute slices and memory slices add up, profiles exist).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

mod engines;
mod placements;
mod products;
mod topology;
mod usage;

pub use engines::{MigEngines, mig_engines};
pub use placements::{
    GiProfile, PlaceError, Placed, check_place, gi_profile, gi_profiles, search_placements,
};
pub use products::{
    MigProfileInfo, PRODUCTS, Product, lookup_product, product_names, profile_name_from_memory,
};
pub use topology::{
    TopoCell, TopoRow, TopologySpec, parse_cell as parse_topology_cell, render_topo_matrix,
};
pub use usage::{DeviceUsageSpec, ProcessSpec, UsageSpec};

/// Errors reading or validating a node description.
#[derive(Debug, thiserror::Error)]
pub enum NodeSpecError {
    /// The file could not be read.
    #[error("cannot read node file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML/JSON for the node format (unknown key, wrong type, ...).
    #[error("invalid node file {path}: {message}")]
    Parse { path: String, message: String },
    /// The file parsed but describes a node that cannot exist.
    #[error("invalid node file {path}: field `{field}`: {message}")]
    Invalid {
        path: String,
        field: String,
        message: String,
    },
}

/// A whole node: the GPUs it has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    /// Free-form name shown in `inventory` output.
    #[serde(default)]
    pub name: Option<String>,
    /// Driver version string reported by NVML (`nvmlSystemGetDriverVersion`).
    #[serde(default = "default_driver_version")]
    pub driver_version: String,
    /// CUDA driver version as NVML encodes it (12040 = 12.4).
    #[serde(default = "default_cuda_version")]
    pub cuda_driver_version: i32,
    /// The GPUs, in any order; they are sorted by index on load.
    pub gpus: Vec<GpuSpec>,
    /// Health events to inject (sim backend and fake NVML): see [`EventSpec`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventSpec>,
    /// What the devices are doing (sim backend and fake NVML usage figures): see
    /// [`UsageSpec`].
    #[serde(default, skip_serializing_if = "UsageSpec::is_empty")]
    pub usage: UsageSpec,
    /// GPU-pair topology (NVLink, PCIe): see [`TopologySpec`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologySpec>,
}

fn default_driver_version() -> String {
    "570.124.06".to_string()
}

fn default_cuda_version() -> i32 {
    12080
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuSpec {
    /// NVML index (0-based, dense).
    pub index: u32,
    /// NVML UUID, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Product name as NVML reports it, e.g. `NVIDIA A100-SXM4-80GB`.
    pub product: String,
    /// Total framebuffer memory in MiB. Defaults to the product's size.
    #[serde(default, rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
    /// Minor number of `/dev/nvidia<minor>`. Defaults to the index.
    #[serde(default)]
    pub minor: Option<u32>,
    /// PCI bus id; any case, 4- or 8-digit domain (normalised to `0000:07:00.0`).
    pub pci_bus_id: String,
    /// NUMA node, or absent when the platform reports none.
    #[serde(default)]
    pub numa_node: Option<i64>,
    /// CUDA compute capability `major.minor`. Defaults to the product's.
    #[serde(default)]
    pub compute_capability: Option<String>,
    /// MIG state; absent means the GPU does not support MIG or has it disabled.
    #[serde(default)]
    pub mig: Option<MigSpec>,
    /// Fake NVML only: NVML return codes to answer for given symbols on this GPU,
    /// e.g. `{"nvmlDeviceGetMinorNumber": 15}` (15 = GPU_IS_LOST).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nvml_errors: BTreeMap<String, u32>,
    /// Multi-node NVLink fabric registration (`nvmlDeviceGetGpuFabricInfoV`); absent: the
    /// GPU is not fabric-capable (NOT_SUPPORTED).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<FabricSpec>,
}

/// What `nvmlDeviceGetGpuFabricInfoV` reports for a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FabricSpec {
    /// Cluster UUID (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, all zero on NVLink systems
    /// that are not multi-node capable).
    pub cluster_uuid: String,
    /// Clique ID within the cluster.
    pub clique_id: u32,
    /// Registration state: `notSupported`, `notStarted`, `inProgress` or `completed`
    /// (default).
    #[serde(default = "default_fabric_state")]
    pub state: String,
    /// NVML return code of the registration, meaningful when completed (default 0).
    #[serde(default)]
    pub status: u32,
}

fn default_fabric_state() -> String {
    "completed".into()
}

impl FabricSpec {
    /// `nvmlGpuFabricState_t` of [`FabricSpec::state`] (`None` for an unknown name).
    pub fn state_code(&self) -> Option<u8> {
        Some(match self.state.as_str() {
            "notSupported" => 0,
            "notStarted" => 1,
            "inProgress" => 2,
            "completed" => 3,
            _ => return None,
        })
    }

    /// The cluster UUID's 16 bytes (`None` when it is not 32 hex digits with dashes).
    pub fn cluster_uuid_bytes(&self) -> Option<[u8; 16]> {
        let hex: String = self.cluster_uuid.chars().filter(|c| *c != '-').collect();
        if hex.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(out)
    }
}

/// MIG mode and devices of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigSpec {
    /// Current MIG mode.
    pub enabled: bool,
    /// Pending MIG mode (after the next GPU reset); defaults to `enabled`.
    #[serde(default)]
    pub pending: Option<bool>,
    /// The MIG devices (GPU instance + compute instance pairs).
    #[serde(default)]
    pub devices: Vec<MigDeviceSpec>,
}

/// One MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigDeviceSpec {
    /// NVML MIG device slot (`nvmlDeviceGetMigDeviceHandleByIndex`); defaults to the position.
    #[serde(default)]
    pub slot: Option<u32>,
    /// MIG UUID, `MIG-xxxxxxxx-...`.
    pub uuid: String,
    /// Profile such as `1g.10gb`, `1g.10gb+me`, `3g.40gb`.
    pub profile: String,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id within the GPU instance.
    #[serde(default)]
    pub compute_instance_id: u32,
    /// Memory in MiB; defaults to the profile's share of the parent.
    #[serde(default, rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
}

/// A health event to inject into the sim backend or the fake NVML library.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventSpec {
    /// GPU index the event is reported on.
    pub gpu: u32,
    /// What happened.
    pub kind: EventKind,
    /// XID number for `xid` events.
    #[serde(default)]
    pub xid: Option<u64>,
    /// GPU instance the event is attributed to (MIG), if any.
    #[serde(default)]
    pub gpu_instance_id: Option<u32>,
    /// Compute instance the event is attributed to (MIG), if any.
    #[serde(default)]
    pub compute_instance_id: Option<u32>,
    /// Delay after the watcher starts, in milliseconds.
    #[serde(default)]
    pub after_ms: u64,
}

/// Kinds of injectable health events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EventKind {
    /// An XID critical error (`eventData` = XID).
    Xid,
    /// A double-bit ECC error.
    DoubleBitEcc,
    /// A single-bit ECC error.
    SingleBitEcc,
    /// The GPU fell off the bus.
    GpuLost,
}

/// One line of an event-injection file (the fake NVML library's `FAKE_NVML_EVENT_FILE`,
/// `gpu-slicer run --health-events-file`): an [`EventSpec`] as JSON, or the
/// injection-only `{"gpu":N,"kind":"recover"}` (the GPU answers again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventLine {
    /// A health event.
    Event(EventSpec),
    /// The GPU with this index answers again.
    Recover(u32),
}

impl EventLine {
    /// Parse one line; the error says what is wrong with it.
    pub fn parse(line: &str) -> Result<Self, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Recover {
            gpu: u32,
            #[allow(dead_code, reason = "only checked to be `recover`")]
            kind: RecoverKind,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        enum RecoverKind {
            Recover,
        }
        if let Ok(r) = serde_json::from_str::<Recover>(line) {
            return Ok(Self::Recover(r.gpu));
        }
        let ev: EventSpec = serde_json::from_str(line).map_err(|e| e.to_string())?;
        if ev.kind == EventKind::Xid && ev.xid.is_none() {
            return Err("`xid` is required for kind `xid`".into());
        }
        Ok(Self::Event(ev))
    }
}

/// Size of one `/dev/nvidia-caps` minor block per GPU: 15 GPU instances × (1 + 8 compute instances).
const CAPS_PER_GI: u32 = 9;
const GIS_PER_GPU: u32 = 15;
/// `config` is minor 1, `monitor` 2; GPU-instance blocks start at 3.
const CAPS_BASE: u32 = 3;

/// Minor of `/dev/nvidia-caps/nvidia-cap<m>` for GPU instance `gi` of the GPU with minor
/// `gpu_minor`, following the layout the driver prints in `/proc/driver/nvidia-caps/mig-minors`.
pub fn gi_cap_minor(gpu_minor: u32, gi: u32) -> u32 {
    CAPS_BASE + gpu_minor * GIS_PER_GPU * CAPS_PER_GI + gi * CAPS_PER_GI
}

/// Minor of the compute-instance capability node (see [`gi_cap_minor`]).
pub fn ci_cap_minor(gpu_minor: u32, gi: u32, ci: u32) -> u32 {
    gi_cap_minor(gpu_minor, gi) + 1 + ci
}

/// The text of `/proc/driver/nvidia-caps/mig-minors` the driver would print for `gpu_count`
/// GPU minors (every GPU instance and compute instance, as the driver lists all of them).
pub fn mig_minors_file(gpu_minors: &[u32]) -> String {
    let mut out = String::from("config 1\nmonitor 2\n");
    for &g in gpu_minors {
        for gi in 0..GIS_PER_GPU {
            out.push_str(&format!("gpu{g}/gi{gi}/access {}\n", gi_cap_minor(g, gi)));
            for ci in 0..8 {
                out.push_str(&format!(
                    "gpu{g}/gi{gi}/ci{ci}/access {}\n",
                    ci_cap_minor(g, gi, ci)
                ));
            }
        }
    }
    out
}

/// Normalise a PCI bus id to the sysfs form: lower case, 4-digit domain (`0000:07:00.0`).
pub fn normalize_bus_id(raw: &str) -> String {
    let lower = raw.trim().trim_end_matches('\0').to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            let trimmed = &domain[domain.len() - 4..];
            format!("{trimmed}:{rest}")
        }
        _ => lower,
    }
}

impl NodeSpec {
    /// Parse a node description from text. `origin` names the source in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, NodeSpecError> {
        let trimmed = text.trim_start();
        let parsed: Result<NodeSpec, String> = if trimmed.starts_with('{') {
            serde_json::from_str(text).map_err(|e| e.to_string())
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
        };
        let mut spec = parsed.map_err(|message| NodeSpecError::Parse {
            path: origin.to_string(),
            message,
        })?;
        spec.gpus.sort_by_key(|g| g.index);
        spec.validate(origin)?;
        Ok(spec)
    }

    /// Read and parse a node file.
    pub fn load(path: &Path) -> Result<Self, NodeSpecError> {
        let text = std::fs::read_to_string(path).map_err(|source| NodeSpecError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Check the node is physically possible. Called by [`NodeSpec::parse`].
    pub fn validate(&self, origin: &str) -> Result<(), NodeSpecError> {
        let invalid = |field: String, message: String| NodeSpecError::Invalid {
            path: origin.to_string(),
            field,
            message,
        };
        if let Some(t) = &self.topology {
            t.check(self.gpus.len())
                .map_err(|(field, message)| invalid(field, message))?;
        }
        let mut uuids = BTreeSet::new();
        let mut indices = BTreeSet::new();
        let mut minors = BTreeSet::new();
        let mut buses = BTreeSet::new();
        for (pos, gpu) in self.gpus.iter().enumerate() {
            let f = |name: &str| format!("gpus[{pos}].{name}");
            if let Some(fab) = &gpu.fabric {
                if fab.cluster_uuid_bytes().is_none() {
                    return Err(invalid(
                        f("fabric.clusterUuid"),
                        format!("`{}` is not a UUID (32 hex digits)", fab.cluster_uuid),
                    ));
                }
                if fab.state_code().is_none() {
                    return Err(invalid(
                        f("fabric.state"),
                        format!(
                            "`{}`: expected notSupported, notStarted, inProgress or completed",
                            fab.state
                        ),
                    ));
                }
            }
            if !indices.insert(gpu.index) {
                return Err(invalid(
                    f("index"),
                    format!("duplicate GPU index {}", gpu.index),
                ));
            }
            check_uuid(&gpu.uuid, "GPU-").map_err(|m| invalid(f("uuid"), m))?;
            if !uuids.insert(gpu.uuid.clone()) {
                return Err(invalid(f("uuid"), format!("duplicate UUID {}", gpu.uuid)));
            }
            if !minors.insert(gpu.minor()) {
                return Err(invalid(
                    f("minor"),
                    format!("duplicate minor {}", gpu.minor()),
                ));
            }
            check_bus_id(&gpu.pci_bus_id).map_err(|m| invalid(f("pciBusId"), m))?;
            if !buses.insert(gpu.bus_id()) {
                return Err(invalid(
                    f("pciBusId"),
                    format!("duplicate PCI bus id {}", gpu.pci_bus_id),
                ));
            }
            if let Some(cc) = &gpu.compute_capability {
                parse_cc(cc).ok_or_else(|| {
                    invalid(
                        f("computeCapability"),
                        format!("`{cc}` is not of the form MAJOR.MINOR"),
                    )
                })?;
            }
            let product = lookup_product(&gpu.product);
            if gpu.memory_mib.is_none() && product.is_none() {
                return Err(invalid(
                    f("memoryMiB"),
                    format!(
                        "required: product `{}` is none of the built-in products ({}), so its size is not known",
                        gpu.product,
                        product_names().join(", ")
                    ),
                ));
            }
            if gpu.memory_mib == Some(0) {
                return Err(invalid(f("memoryMiB"), "must be greater than 0".into()));
            }
            let Some(mig) = &gpu.mig else { continue };
            if !mig.devices.is_empty() && !mig.enabled {
                return Err(invalid(
                    f("mig.devices"),
                    "MIG devices listed but MIG mode is disabled".into(),
                ));
            }
            if mig.devices.is_empty() {
                continue;
            }
            let Some(product) = product else {
                return Err(invalid(
                    f("product"),
                    format!(
                        "`{}` is not a MIG-capable product gpu-slicer knows (built-in: {})",
                        gpu.product,
                        product_names().join(", ")
                    ),
                ));
            };
            let mut compute = 0;
            let mut memory = 0;
            let mut slots = BTreeSet::new();
            let mut gi_ci = BTreeSet::new();
            let mut gi_profiles: BTreeMap<u32, &str> = BTreeMap::new();
            for (dpos, dev) in mig.devices.iter().enumerate() {
                let df = |name: &str| format!("gpus[{pos}].mig.devices[{dpos}].{name}");
                check_uuid(&dev.uuid, "MIG-").map_err(|m| invalid(df("uuid"), m))?;
                if !uuids.insert(dev.uuid.clone()) {
                    return Err(invalid(df("uuid"), format!("duplicate UUID {}", dev.uuid)));
                }
                let info = product.profile(&dev.profile).ok_or_else(|| {
                    invalid(
                        df("profile"),
                        format!(
                            "MIG profile `{}` does not exist on {} (valid: {})",
                            dev.profile,
                            product.name,
                            product.profile_names().join(", ")
                        ),
                    )
                })?;
                let slot = dev.slot.unwrap_or(dpos as u32);
                if slot >= product.max_mig_devices {
                    return Err(invalid(
                        df("slot"),
                        format!("slot {slot} exceeds {} MIG slots", product.max_mig_devices),
                    ));
                }
                if !slots.insert(slot) {
                    return Err(invalid(df("slot"), format!("duplicate slot {slot}")));
                }
                if dev.gpu_instance_id >= GIS_PER_GPU {
                    return Err(invalid(
                        df("gpuInstanceId"),
                        format!("{} is out of range 0..{GIS_PER_GPU}", dev.gpu_instance_id),
                    ));
                }
                if dev.compute_instance_id >= 8 {
                    return Err(invalid(
                        df("computeInstanceId"),
                        format!("{} is out of range 0..8", dev.compute_instance_id),
                    ));
                }
                if !gi_ci.insert((dev.gpu_instance_id, dev.compute_instance_id)) {
                    return Err(invalid(
                        df("gpuInstanceId"),
                        format!(
                            "GPU instance {} / compute instance {} used twice",
                            dev.gpu_instance_id, dev.compute_instance_id
                        ),
                    ));
                }
                // One compute instance spanning the whole GPU instance per GI (C == G): a
                // second CI on the same GI would be a sub-slice, which the planner cannot
                // expose (the incumbent fails on those too).
                if let Some(prev) = gi_profiles.insert(dev.gpu_instance_id, &dev.profile) {
                    return Err(invalid(
                        df("gpuInstanceId"),
                        format!(
                            "GPU instance {} already holds a `{prev}` device; compute-instance sub-slices are not supported",
                            dev.gpu_instance_id
                        ),
                    ));
                }
                compute += info.compute_slices;
                memory += info.memory_slices;
            }
            if compute > product.compute_slices {
                return Err(invalid(
                    f("mig.devices"),
                    format!(
                        "MIG layout uses {compute} compute slices; {} ({}) has {}",
                        gpu.product, product.name, product.compute_slices
                    ),
                ));
            }
            if memory > product.memory_slices {
                return Err(invalid(
                    f("mig.devices"),
                    format!(
                        "MIG layout uses {memory} memory slices; {} ({}) has {}",
                        gpu.product, product.name, product.memory_slices
                    ),
                ));
            }
        }
        for (i, ev) in self.events.iter().enumerate() {
            if !indices.contains(&ev.gpu) {
                return Err(invalid(
                    format!("events[{i}].gpu"),
                    format!("no GPU with index {}", ev.gpu),
                ));
            }
            if ev.kind == EventKind::Xid && ev.xid.is_none() {
                return Err(invalid(
                    format!("events[{i}].xid"),
                    "required for kind `xid`".into(),
                ));
            }
        }
        usage::validate(self, origin)?;
        Ok(())
    }
}

impl GpuSpec {
    /// Minor number of `/dev/nvidia<minor>`.
    pub fn minor(&self) -> u32 {
        self.minor.unwrap_or(self.index)
    }

    /// Memory in MiB (declared, else the product's).
    pub fn memory_mib(&self) -> u64 {
        self.memory_mib
            .or_else(|| lookup_product(&self.product).map(|p| p.memory_mib))
            .unwrap_or(0)
    }

    /// PCI bus id in sysfs form.
    pub fn bus_id(&self) -> String {
        normalize_bus_id(&self.pci_bus_id)
    }

    /// Compute capability (major, minor): declared, else the product's, else 8.0.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.compute_capability
            .as_deref()
            .and_then(parse_cc)
            .or_else(|| lookup_product(&self.product).map(|p| p.compute_capability))
            .unwrap_or((8, 0))
    }

    /// Current MIG mode.
    pub fn mig_enabled(&self) -> bool {
        self.mig.as_ref().is_some_and(|m| m.enabled)
    }

    /// Pending MIG mode.
    pub fn mig_pending(&self) -> bool {
        self.mig
            .as_ref()
            .is_some_and(|m| m.pending.unwrap_or(m.enabled))
    }

    /// Whether the product supports MIG at all.
    pub fn mig_capable(&self) -> bool {
        lookup_product(&self.product).is_some()
    }

    /// MIG devices with their slot resolved, sorted by slot.
    pub fn mig_devices(&self) -> Vec<(u32, &MigDeviceSpec)> {
        let mut out: Vec<_> = self
            .mig
            .iter()
            .flat_map(|m| m.devices.iter().enumerate())
            .map(|(i, d)| (d.slot.unwrap_or(i as u32), d))
            .collect();
        out.sort_by_key(|(s, _)| *s);
        out
    }

    /// Memory of a MIG device of this GPU in MiB (declared, else the profile's share).
    pub fn mig_memory_mib(&self, dev: &MigDeviceSpec) -> u64 {
        if let Some(m) = dev.memory_mib {
            return m;
        }
        let total = self.memory_mib();
        match lookup_product(&self.product).and_then(|p| p.profile(&dev.profile).map(|i| (p, i))) {
            Some((p, info)) => total * u64::from(info.memory_slices) / u64::from(p.memory_slices),
            None => 0,
        }
    }
}

fn parse_cc(cc: &str) -> Option<(u32, u32)> {
    let (a, b) = cc.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn check_uuid(uuid: &str, prefix: &str) -> Result<(), String> {
    let Some(rest) = uuid.strip_prefix(prefix) else {
        return Err(format!("`{uuid}` must start with `{prefix}`"));
    };
    let groups: Vec<&str> = rest.split('-').collect();
    let lens = [8, 4, 4, 4, 12];
    let ok = groups.len() == 5
        && groups
            .iter()
            .zip(lens)
            .all(|(g, l)| g.len() == l && g.chars().all(|c| c.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{uuid}` is not a UUID of the form {prefix}xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
        ))
    }
}

fn check_bus_id(raw: &str) -> Result<(), String> {
    let n = normalize_bus_id(raw);
    let bad = || format!("`{raw}` is not a PCI bus id like 0000:07:00.0");
    let (domain, rest) = n.split_once(':').ok_or_else(bad)?;
    let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
    let (dev, func) = rest.split_once('.').ok_or_else(bad)?;
    let hex = |s: &str, len: usize| s.len() == len && s.chars().all(|c| c.is_ascii_hexdigit());
    if hex(domain, 4) && hex(bus, 2) && hex(dev, 2) && hex(func, 1) {
        Ok(())
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines() {
        assert_eq!(
            EventLine::parse(r#"{"gpu":2,"kind":"recover"}"#),
            Ok(EventLine::Recover(2))
        );
        let Ok(EventLine::Event(ev)) =
            EventLine::parse(r#"{"gpu":1,"kind":"xid","xid":79,"gpuInstanceId":3}"#)
        else {
            panic!("xid line");
        };
        assert_eq!((ev.gpu, ev.xid, ev.gpu_instance_id), (1, Some(79), Some(3)));
        assert_eq!(
            EventLine::parse(r#"{"gpu":1,"kind":"xid"}"#),
            Err("`xid` is required for kind `xid`".to_string())
        );
        let err = EventLine::parse(r#"{"gpu":1,"kind":"melted"}"#).unwrap_err();
        assert!(err.contains("melted"), "{err}");
    }

    const NODE: &str = r#"
gpus:
  - index: 0
    uuid: GPU-00000000-0000-0000-0000-000000000000
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "00000000:07:00.0"
    numaNode: 0
    mig:
      enabled: true
      devices:
        - {uuid: MIG-00000000-0000-0000-0000-000000000001, profile: 3g.40gb, gpuInstanceId: 2}
        - {uuid: MIG-00000000-0000-0000-0000-000000000002, profile: 2g.20gb, gpuInstanceId: 3}
        - {uuid: MIG-00000000-0000-0000-0000-000000000003, profile: 1g.10gb, gpuInstanceId: 9}
        - {uuid: MIG-00000000-0000-0000-0000-000000000004, profile: 1g.10gb, gpuInstanceId: 10}
"#;

    #[test]
    fn parses_and_derives() {
        let spec = NodeSpec::parse(NODE, "t.yaml").unwrap();
        let gpu = &spec.gpus[0];
        assert_eq!(gpu.bus_id(), "0000:07:00.0");
        assert_eq!(gpu.memory_mib(), 81920);
        assert_eq!(
            gpu.mig_memory_mib(&gpu.mig.as_ref().unwrap().devices[0]),
            40960
        );
    }

    #[test]
    fn rejects_overfull_layout() {
        let text = NODE.replace("profile: 2g.20gb", "profile: 3g.40gb");
        let err = NodeSpec::parse(&text, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("gpus[0].mig.devices"), "{err}");
        assert!(err.contains("slices"), "{err}");
    }

    #[test]
    fn rejects_unknown_profile_and_key() {
        let text = NODE.replace("profile: 2g.20gb", "profile: 2g.99gb");
        let err = NodeSpec::parse(&text, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("2g.99gb") && err.contains("profile"), "{err}");
        let text = NODE.replace("numaNode: 0", "numaNode: 0\n    colour: red");
        let err = NodeSpec::parse(&text, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("colour") && err.contains("t.yaml"), "{err}");
    }

    #[test]
    fn cap_minors_match_driver_layout() {
        assert_eq!(gi_cap_minor(0, 0), 3);
        assert_eq!(ci_cap_minor(0, 0, 0), 4);
        assert_eq!(gi_cap_minor(0, 1), 12);
        assert_eq!(gi_cap_minor(1, 0), 138);
        let file = mig_minors_file(&[0]);
        assert!(file.contains("gpu0/gi2/access 21\n"));
        assert!(file.contains("gpu0/gi2/ci0/access 22\n"));
    }

    #[test]
    fn bus_id_normalisation() {
        assert_eq!(normalize_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(normalize_bus_id("0000:3b:00.0"), "0000:3b:00.0");
    }
}
