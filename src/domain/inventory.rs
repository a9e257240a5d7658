//! Inventory: the GPUs and MIG devices a node has, as owned domain values.
//!
//! Backends ([`sim`](crate::platform::sim), and the NVML backend) produce an [`Inventory`]; the planner
//! (`crate::domain::plan`) turns it plus a config into resources; the CDI generator reads device
//! node minors from it. Nothing here talks to the kubelet or a container runtime.

use std::fmt;

use serde::Serialize;

/// Errors discovering the inventory.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InventoryError {
    /// A node file or built-in profile could not be read or is invalid.
    #[error(transparent)]
    NodeFile(#[from] node_spec::NodeSpecError),
    /// `--backend sim:<name>` named neither a built-in profile nor an existing file.
    #[error("unknown sim profile `{name}` (built-in: {builtin}); pass a node file path instead")]
    UnknownProfile { name: String, builtin: String },
    /// `--backend sim:<path>` named a node file (it looks like a path) that does not exist.
    #[error(
        "node file {path} (backend `sim:{path}`) does not exist (built-in profiles: {builtin})"
    )]
    NodeFileMissing { path: String, builtin: String },
    /// `--backend` was not understood.
    #[error("unknown backend `{0}`: expected `nvml`, `sim:<profile>` or `sim:<path>`")]
    UnknownBackend(String),
    /// The NVML library could not be loaded or initialised.
    #[error("NVML: {message}")]
    Nvml { message: String },
    /// An NVML call about one device failed.
    #[error("NVML: {call} on {device}: {message}")]
    NvmlDevice {
        call: &'static str,
        device: String,
        message: String,
    },
    /// A file the backend reads (e.g. `/proc/driver/nvidia-caps/mig-minors`) was unreadable.
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Result alias for this module.
pub(crate) type Result<T, E = InventoryError> = std::result::Result<T, E>;

/// Health of a physical device or of an allocatable device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Default)]
pub(crate) enum Health {
    /// Usable.
    #[default]
    Healthy,
    /// Not usable: leaves the allocatable count.
    Unhealthy,
}

impl Health {
    /// The kubelet's spelling (`Healthy` / `Unhealthy`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "Healthy",
            Health::Unhealthy => "Unhealthy",
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// MIG mode of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MigMode {
    /// MIG is on now.
    pub(crate) current: bool,
    /// MIG will be on after the next reset.
    pub(crate) pending: bool,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Gpu {
    /// NVML index.
    pub(crate) index: u32,
    /// `GPU-…` UUID: the kubelet ID of the whole GPU.
    pub(crate) uuid: String,
    /// Product name, e.g. `NVIDIA A100-SXM4-80GB`.
    pub(crate) product: String,
    /// Framebuffer memory in bytes.
    pub(crate) memory_bytes: u64,
    /// Minor number of `/dev/nvidia<minor>`.
    pub(crate) minor: u32,
    /// PCI bus id in sysfs form (`0000:07:00.0`).
    pub(crate) pci_bus_id: String,
    /// NUMA node, if the platform reports one.
    pub(crate) numa_node: Option<i64>,
    /// CUDA compute capability `major.minor`.
    pub(crate) compute_capability: String,
    /// MIG mode.
    pub(crate) mig_mode: MigMode,
    /// Compute slices the GPU has for MIG (7 on A100/H100), 0 when MIG is unsupported.
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) mig_compute_slices: u32,
    /// MIG devices on this GPU, sorted by GPU instance then compute instance.
    pub(crate) mig_devices: Vec<MigDevice>,
    /// `<cluster UUID>.<clique ID>` when the GPU is attached to a multi-node NVLink fabric
    /// ([`crate::domain::topology::fabric_clique`]); the `nvidia.com/gpu.clique` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fabric_clique: Option<String>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// One MIG device (a GPU instance with one full compute instance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MigDevice {
    /// `MIG-…` UUID: the kubelet ID of the slice.
    pub(crate) uuid: String,
    /// UUID of the parent GPU.
    pub(crate) parent_uuid: String,
    /// Index of the parent GPU.
    pub(crate) parent_index: u32,
    /// Position among the parent's MIG devices (the `j` of NVIDIA's `i:j` index).
    pub(crate) index: u32,
    /// Profile, e.g. `1g.10gb` or `1g.10gb+me`.
    pub(crate) profile: String,
    /// GPU instance id.
    pub(crate) gpu_instance_id: u32,
    /// Compute instance id.
    pub(crate) compute_instance_id: u32,
    /// Memory in bytes.
    pub(crate) memory_bytes: u64,
    /// Compute slices (the `G` of the profile).
    pub(crate) compute_slices: u32,
    /// Minor of `/dev/nvidia-caps/nvidia-cap<m>` for the GPU instance.
    pub(crate) gi_cap_minor: Option<u32>,
    /// Minor of `/dev/nvidia-caps/nvidia-cap<m>` for the compute instance.
    pub(crate) ci_cap_minor: Option<u32>,
}

/// [`Inventory::source`] of an inventory read from the real driver through NVML.
pub(crate) const NVML_SOURCE: &str = "nvml";

/// Everything a node has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Inventory {
    /// Where this inventory came from (`sim:mixed-a100`, `nvml`).
    pub(crate) source: String,
    /// Driver version, when known.
    pub(crate) driver_version: Option<String>,
    /// CUDA version the driver supports, as NVML encodes it (12080 = 12.8), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cuda_driver_version: Option<u32>,
    /// GPUs sorted by index.
    pub(crate) gpus: Vec<Gpu>,
    /// GPU-pair links (PCIe, NVLink, NUMA), read once at discovery; absent when the backend
    /// read none (left out of JSON then, so older outputs stay byte-identical).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) topology: Option<crate::domain::topology::Topology>,
}

impl Inventory {
    /// Find a GPU by UUID.
    pub(crate) fn gpu(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// Find a MIG device by UUID, with its parent.
    pub(crate) fn mig(&self, uuid: &str) -> Option<(&Gpu, &MigDevice)> {
        self.gpus
            .iter()
            .flat_map(|g| g.mig_devices.iter().map(move |m| (g, m)))
            .find(|(_, m)| m.uuid == uuid)
    }

    /// All MIG devices with their parents.
    pub(crate) fn migs(&self) -> impl Iterator<Item = (&Gpu, &MigDevice)> {
        self.gpus
            .iter()
            .flat_map(|g| g.mig_devices.iter().map(move |m| (g, m)))
    }
}

/// A source of inventory: the sim backend or NVML.
///
/// `discover` may block (NVML calls are blocking FFI): async callers run it on a blocking
/// thread.
pub(crate) trait Backend: Send + Sync + fmt::Debug {
    /// Enumerate the node's GPUs and MIG devices.
    fn discover(&self) -> Result<Inventory>;
}
