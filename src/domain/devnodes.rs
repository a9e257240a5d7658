//! The device-node layout: which `/dev` nodes each GPU and MIG device needs. The one owner
//! of that table, used by the CDI generator (spec edits), Allocate (`passDeviceSpecs`) and
//! the platform probe (which nodes to stat).
//!
//! A GPU is `/dev/nvidia<minor>`; a MIG device is its parent's node plus its GPU-instance and
//! compute-instance capability nodes `/dev/nvidia-caps/nvidia-cap<N>`; every CUDA container
//! also needs the control nodes.

use std::collections::BTreeMap;

use crate::domain::inventory::{Gpu, Inventory, MigDevice};

/// Control nodes every CUDA container needs alongside its GPU nodes.
pub(crate) const CONTROL_NODES: &[&str] =
    &["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// A MIG device without one of its capability minors: it cannot be isolated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "MIG device `{device}` has no {which} capability minor: without its /dev/nvidia-caps node the slice cannot be isolated"
)]
pub(crate) struct MissingCapMinor {
    /// MIG UUID.
    pub(crate) device: String,
    /// `GPU instance` or `compute instance`.
    pub(crate) which: &'static str,
}

/// Container path of a GPU's device node.
pub(crate) fn gpu_node_path(gpu: &Gpu) -> String {
    format!("/dev/nvidia{}", gpu.minor)
}

/// Container path of a MIG capability node.
pub(crate) fn cap_node_path(cap_minor: u32) -> String {
    format!("/dev/nvidia-caps/nvidia-cap{cap_minor}")
}

/// The GPU-instance and compute-instance capability minors of a MIG device.
pub(crate) fn cap_minors(mig: &MigDevice) -> Result<[u32; 2], MissingCapMinor> {
    let missing = |which| MissingCapMinor {
        device: mig.uuid.clone(),
        which,
    };
    let gi = mig.gi_cap_minor.ok_or_else(|| missing("GPU instance"))?;
    let ci = mig
        .ci_cap_minor
        .ok_or_else(|| missing("compute instance"))?;
    Ok([gi, ci])
}

/// Device nodes of each physical device (GPU or MIG UUID) of an inventory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DeviceNodes {
    by_uuid: BTreeMap<String, Vec<String>>,
}

impl DeviceNodes {
    /// Collect the nodes of every GPU and MIG device; a MIG device without its capability
    /// minors is an error, as it is for the CDI spec.
    pub(crate) fn new(inventory: &Inventory) -> Result<Self, MissingCapMinor> {
        let mut by_uuid = BTreeMap::new();
        for gpu in &inventory.gpus {
            let gpu_node = gpu_node_path(gpu);
            by_uuid.insert(gpu.uuid.clone(), vec![gpu_node.clone()]);
            for mig in &gpu.mig_devices {
                let mut nodes = vec![gpu_node.clone()];
                nodes.extend(cap_minors(mig)?.into_iter().map(cap_node_path));
                by_uuid.insert(mig.uuid.clone(), nodes);
            }
        }
        Ok(Self { by_uuid })
    }

    /// The nodes of one physical device.
    pub(crate) fn of(&self, uuid: &str) -> Option<&[String]> {
        self.by_uuid.get(uuid).map(Vec::as_slice)
    }

    /// Every node path of the inventory plus the control nodes, sorted and deduplicated:
    /// what the platform stats for the spec.
    pub(crate) fn all_paths(&self) -> Vec<String> {
        let mut paths: Vec<String> = self
            .by_uuid
            .values()
            .flatten()
            .cloned()
            .chain(CONTROL_NODES.iter().map(|p| (*p).to_string()))
            .collect();
        paths.sort();
        paths.dedup();
        paths
    }
}
