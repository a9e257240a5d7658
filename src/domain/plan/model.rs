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
pub(crate) struct Physical {
    /// `GPU-…` or `MIG-…`: the UUID the CDI spec names a device by.
    pub(crate) uuid: String,
    /// UUID of the GPU (the parent for MIG devices).
    pub(crate) gpu_uuid: String,
    /// Index of the GPU.
    pub(crate) gpu_index: u32,
    /// MIG position `j` of `i:j`, for MIG devices.
    pub(crate) mig_index: Option<u32>,
    /// MIG profile, for MIG devices.
    pub(crate) mig_profile: Option<String>,
}

impl Physical {
    /// Whether this is a MIG device.
    pub(crate) fn is_mig(&self) -> bool {
        self.mig_index.is_some()
    }

    /// NVIDIA's index form: `i` or `i:j`.
    pub(crate) fn index_name(&self) -> String {
        match self.mig_index {
            Some(j) => format!("{}:{j}", self.gpu_index),
            None => self.gpu_index.to_string(),
        }
    }
}

/// The share of its physical device an allocatable device grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Share {
    /// GPU memory in bytes.
    pub(crate) memory_bytes: u64,
    /// Compute as a percentage of the whole GPU (integer, rounded down as NVIDIA's MPS
    /// daemon setting is).
    pub(crate) compute_percent: u32,
}

/// Replica information of a shared device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Replica {
    /// `n` of `<uuid>::<n>`.
    pub(crate) index: u32,
    /// Replicas of this physical device.
    pub(crate) of: u32,
}

/// One allocatable device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Device {
    /// Kubelet device ID.
    pub(crate) id: String,
    /// Physical device behind it.
    pub(crate) physical: Physical,
    /// Set for replicas.
    pub(crate) replica: Option<Replica>,
    /// What it grants.
    pub(crate) share: Share,
    /// Health at planning time (the inventory's).
    pub(crate) health: Health,
    /// NUMA node of the GPU.
    pub(crate) numa_node: Option<i64>,
}

/// How a resource's devices are shared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Sharing {
    /// Section the rule came from.
    pub(crate) kind: SharingKind,
    /// Isolation level.
    pub(crate) isolation: Isolation,
    /// Reject requests for more than one replica.
    pub(crate) fail_requests_greater_than_one: bool,
    /// Allow one request to take replicas on several GPUs.
    pub(crate) allow_multi_gpu: bool,
}

/// What kind of devices a resource holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum ResourceKind {
    /// Whole GPUs (or their replicas).
    Gpu,
    /// MIG devices (or their replicas).
    Mig,
}

/// One advertised extended resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Resource {
    /// e.g. `nvidia.com/mig-1g.10gb`.
    pub(crate) name: String,
    /// Devices are whole GPUs or MIG devices.
    pub(crate) kind: ResourceKind,
    /// Set when the devices are replicas.
    pub(crate) sharing: Option<Sharing>,
    /// Devices sorted by ID.
    pub(crate) devices: Vec<Device>,
    /// Whole-GPU resources on a node with a topology: each device's GPU in it, for
    /// link-aware preferred allocation.
    #[serde(skip)]
    pub(crate) links: Option<Arc<crate::domain::topology::ResourceLinks>>,
}

impl Resource {
    /// Look up a device by kubelet ID.
    pub(crate) fn device(&self, id: &str) -> Option<&Device> {
        self.devices
            .binary_search_by(|d| d.id.as_str().cmp(id))
            .ok()
            .map(|i| &self.devices[i])
    }
}

/// The whole plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Plan {
    /// Resources sorted by name.
    pub(crate) resources: Vec<Resource>,
}

impl Plan {
    /// Look up a resource by name.
    pub(crate) fn resource(&self, name: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.name == name)
    }

    /// Every device of every resource.
    pub(crate) fn devices(&self) -> impl Iterator<Item = (&Resource, &Device)> {
        self.resources
            .iter()
            .flat_map(|r| r.devices.iter().map(move |d| (r, d)))
    }
}
