//! What a plan is made of: resources, their allocatable devices, the physical device and
//! the share behind each. Built by the parent module, read by the device plugin, the CDI
//! generator and the allocator.

use std::sync::Arc;

use serde::Serialize;

use crate::domain::config::{Isolation, SharingKind};
use crate::domain::inventory::Health;

/// The physical device behind an allocatable device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Physical {
    /// `GPU-…` or `MIG-…`: the UUID the CDI spec names a device by.
    pub uuid: String,
    /// UUID of the GPU (the parent for MIG devices).
    pub gpu_uuid: String,
    /// Index of the GPU.
    pub gpu_index: u32,
    /// MIG position `j` of `i:j`, for MIG devices.
    pub mig_index: Option<u32>,
    /// MIG profile, for MIG devices.
    pub mig_profile: Option<String>,
}

impl Physical {
    /// Whether this is a MIG device.
    pub fn is_mig(&self) -> bool {
        self.mig_index.is_some()
    }

    /// NVIDIA's index form: `i` or `i:j`.
    pub fn index_name(&self) -> String {
        match self.mig_index {
            Some(j) => format!("{}:{j}", self.gpu_index),
            None => self.gpu_index.to_string(),
        }
    }
}

/// The share of its physical device an allocatable device grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Share {
    /// GPU memory in bytes.
    pub memory_bytes: u64,
    /// Compute as a percentage of the whole GPU (integer, rounded down as NVIDIA's MPS
    /// daemon setting is).
    pub compute_percent: u32,
}

/// Replica information of a shared device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replica {
    /// `n` of `<uuid>::<n>`.
    pub index: u32,
    /// Replicas of this physical device.
    pub of: u32,
}

/// One allocatable device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Kubelet device ID.
    pub id: String,
    /// Physical device behind it.
    pub physical: Physical,
    /// Set for replicas.
    pub replica: Option<Replica>,
    /// What it grants.
    pub share: Share,
    /// Health at planning time (the inventory's).
    pub health: Health,
    /// NUMA node of the GPU.
    pub numa_node: Option<i64>,
}

/// How a resource's devices are shared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sharing {
    /// Section the rule came from.
    pub kind: SharingKind,
    /// Isolation level.
    pub isolation: Isolation,
    /// Reject requests for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// Allow one request to take replicas on several GPUs.
    pub allow_multi_gpu: bool,
}

/// What kind of devices a resource holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ResourceKind {
    /// Whole GPUs (or their replicas).
    Gpu,
    /// MIG devices (or their replicas).
    Mig,
}

/// One advertised extended resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Resource {
    /// e.g. `nvidia.com/mig-1g.10gb`.
    pub name: String,
    /// Devices are whole GPUs or MIG devices.
    pub kind: ResourceKind,
    /// Set when the devices are replicas.
    pub sharing: Option<Sharing>,
    /// Devices sorted by ID.
    pub devices: Vec<Device>,
    /// Whole-GPU resources on a node with a topology: each device's GPU in it, for
    /// link-aware preferred allocation.
    #[serde(skip)]
    pub links: Option<Arc<crate::domain::topology::ResourceLinks>>,
}

impl Resource {
    /// Look up a device by kubelet ID.
    pub fn device(&self, id: &str) -> Option<&Device> {
        self.devices
            .binary_search_by(|d| d.id.as_str().cmp(id))
            .ok()
            .map(|i| &self.devices[i])
    }
}

/// The whole plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Resources sorted by name.
    pub resources: Vec<Resource>,
}

impl Plan {
    /// Look up a resource by name.
    pub fn resource(&self, name: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.name == name)
    }

    /// Every device of every resource.
    pub fn devices(&self) -> impl Iterator<Item = (&Resource, &Device)> {
        self.resources
            .iter()
            .flat_map(|r| r.devices.iter().map(move |d| (r, d)))
    }
}
