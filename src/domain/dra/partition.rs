//! MIG on demand (partitionable devices, KEP-4815): the devices and counters of a GPU that
//! `flags.dra.dynamicMig` names, whose MIG instances are created per claim.
//!
//! Per such GPU one counter set, `gpu-<index>-counter-set`, from the product tables in
//! `node_spec` (the same ones `mig apply` plans with and the driver's placements are checked
//! against):
//!
//! - `memory-slice-<k>` = 1 for every memory slice `k`: a placement takes the slices it
//!   covers, so two placements that overlap can never both be allocated (an aggregate
//!   "memory slices" count would let `1g@3` and `2g@2` through);
//! - `compute-slices` = the GPU's compute slices (7 on A100/H100);
//! - `<profile>-instances` for a profile the driver allows fewer instances of than it has
//!   placements (`1g10gb-me-instances` = 1: one media-extension instance per GPU).
//!
//! Devices: one per placement of every profile, named as static MIG devices are
//! (`gpu-<index>-mig-<profile>-<giProfileId>-<start>`), taking its slices, its compute slices
//! and one instance; and the whole GPU `gpu-<index>`, taking everything. MIG mode stays on
//! (gpu-slicer never changes it), so the whole GPU is served as the full-size instance
//! (`7g.80gb` at 0). A GPU whose MIG mode is off, or whose product has no placement table,
//! is not dynamic: a warning says why and it is published as the plan has it. Pure.

use std::collections::BTreeMap;

use node_spec::{GiProfile, Product};

use super::model::{Counter, CounterConsumption, CounterSet};
use crate::domain::config::DeviceSelector;
use crate::domain::inventory::Gpu;

/// Attribute of every published device: `true` when Prepare makes it (a dynamic MIG
/// placement, or the whole GPU of a dynamic GPU), `false` for devices that exist already.
pub(crate) const ATTR_ON_DEMAND: &str = "onDemand";

/// Counter of the GPU's compute slices.
pub(crate) const COMPUTE_SLICES: &str = "compute-slices";

/// The counter set of GPU `index`: `gpu-<index>-counter-set`.
pub(crate) fn counter_set_name(index: u32) -> String {
    format!("gpu-{index}-counter-set")
}

/// Counter of memory slice `k`.
pub(crate) fn memory_slice_counter(k: u32) -> String {
    format!("memory-slice-{k}")
}

/// Counter limiting a profile's instances, when the driver allows fewer than it has
/// placements.
fn instances_counter(p: &GiProfile) -> Option<String> {
    (p.instance_count < p.starts.len() as u32)
        .then(|| format!("{}-instances", super::slices::profile_label(p.name)))
}

/// Where a dynamic device is made: a GPU instance of `profile` at `start` on GPU
/// `gpu_index`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Index of the GPU.
    pub(crate) gpu_index: u32,
    /// UUID of the GPU.
    pub(crate) gpu_uuid: String,
    /// GPU-instance profile (`1g.10gb`).
    pub(crate) profile: String,
    /// Placement start, in memory slices.
    pub(crate) start: u32,
    /// Memory of an instance of the profile, in bytes.
    pub(crate) memory_bytes: u64,
}

/// A GPU instance (with its one compute instance) made for a claim, as the checkpoint
/// records it: what Unprepare destroys, and what a restart keeps.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MadeInstance {
    /// UUID of the GPU.
    pub(crate) gpu_uuid: String,
    /// Index of the GPU.
    pub(crate) gpu_index: u32,
    /// GPU-instance profile.
    pub(crate) profile: String,
    /// Placement start.
    pub(crate) start: u32,
    /// GPU instance id.
    pub(crate) gpu_instance_id: u32,
    /// Compute instance id.
    pub(crate) compute_instance_id: u32,
    /// `MIG-…` UUID of the MIG device.
    pub(crate) uuid: String,
}

/// Whether `selector` (`flags.dra.dynamicMig`) names `gpu`.
pub(crate) fn selects(selector: &DeviceSelector, gpu: &Gpu) -> bool {
    selector.selects_gpu(gpu.index, &gpu.uuid)
}

/// Why a GPU `flags.dra.dynamicMig` names is not made dynamic (a warning: the GPU is
/// published as the plan has it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotDynamic {
    /// Its MIG mode is off.
    #[error(
        "GPU {index} ({uuid}): flags.dra.dynamicMig names it but its MIG mode is off (gpu-slicer never changes MIG mode); published as a whole GPU"
    )]
    MigModeOff { index: u32, uuid: String },
    /// No placement table for its product.
    #[error(
        "GPU {index} ({uuid}): flags.dra.dynamicMig names it but gpu-slicer has no MIG placement table for `{product}`; published as the plan has it"
    )]
    UnknownProduct {
        index: u32,
        uuid: String,
        product: String,
    },
    /// A table without GPU-instance profiles.
    #[error("GPU {index} ({uuid}): no MIG placement table for `{product}`")]
    NoProfiles {
        index: u32,
        uuid: String,
        product: String,
    },
}

/// Why a GPU the selector names is not dynamic; `Ok`: its product and profiles.
pub(crate) fn dynamic_product(
    gpu: &Gpu,
) -> Result<(&'static Product, &'static [GiProfile]), NotDynamic> {
    if !gpu.mig_mode.current {
        return Err(NotDynamic::MigModeOff {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
        });
    }
    let product =
        node_spec::lookup_product(&gpu.product).ok_or_else(|| NotDynamic::UnknownProduct {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            product: gpu.product.clone(),
        })?;
    let profiles = node_spec::gi_profiles(product);
    if profiles.is_empty() {
        return Err(NotDynamic::NoProfiles {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            product: gpu.product.clone(),
        });
    }
    Ok((product, profiles))
}

/// The counter set of a dynamic GPU.
pub(crate) fn counter_set(gpu: &Gpu, product: &Product, profiles: &[GiProfile]) -> CounterSet {
    let mut counters = BTreeMap::new();
    for k in 0..product.memory_slices {
        counters.insert(memory_slice_counter(k), one(1));
    }
    counters.insert(COMPUTE_SLICES.into(), one(product.compute_slices));
    for p in profiles {
        if let Some(name) = instances_counter(p) {
            counters.insert(name, one(p.instance_count));
        }
    }
    CounterSet {
        name: counter_set_name(gpu.index),
        counters,
    }
}

/// What a placement of `p` at `start` takes from its GPU's set.
pub(crate) fn consumption(gpu: &Gpu, p: &GiProfile, start: u32) -> CounterConsumption {
    let mut counters: BTreeMap<String, Counter> = p
        .span(start)
        .map(|k| (memory_slice_counter(k), one(1)))
        .collect();
    counters.insert(COMPUTE_SLICES.into(), one(p.compute_slices));
    if let Some(name) = instances_counter(p) {
        counters.insert(name, one(1));
    }
    CounterConsumption {
        counter_set: counter_set_name(gpu.index),
        counters,
    }
}

/// What the whole GPU takes: every counter of its set, in full.
pub(crate) fn whole_consumption(set: &CounterSet) -> CounterConsumption {
    CounterConsumption {
        counter_set: set.name.clone(),
        counters: set.counters.clone(),
    }
}

/// The full-size profile (all memory slices): what the whole GPU is served as.
pub(crate) fn full_profile(
    product: &Product,
    profiles: &'static [GiProfile],
) -> Option<&'static GiProfile> {
    profiles.iter().find(|p| {
        p.memory_slices == product.memory_slices && p.compute_slices == product.compute_slices
    })
}

/// Memory of one instance of `p`: the GPU's memory in whole MiB, split by memory slices
/// (what the driver and the fake report for the profile).
pub(crate) fn profile_memory(gpu: &Gpu, product: &Product, p: &GiProfile) -> u64 {
    let mib = gpu.memory_bytes >> 20;
    (mib * u64::from(p.memory_slices) / u64::from(product.memory_slices.max(1))) << 20
}

/// The placement of `p` at `start` on `gpu`.
pub(crate) fn placement(gpu: &Gpu, product: &Product, p: &GiProfile, start: u32) -> Placement {
    Placement {
        gpu_index: gpu.index,
        gpu_uuid: gpu.uuid.clone(),
        profile: p.name.to_string(),
        start,
        memory_bytes: profile_memory(gpu, product, p),
    }
}

fn one(n: u32) -> Counter {
    Counter {
        value: n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::config::DeviceRef;

    fn a100() -> Gpu {
        Gpu {
            index: 3,
            uuid: "GPU-3".into(),
            product: "NVIDIA A100-SXM4-80GB".into(),
            memory_bytes: 81920 << 20,
            minor: 3,
            pci_bus_id: "0000:13:00.0".into(),
            numa_node: None,
            compute_capability: "8.0".into(),
            mig_mode: crate::domain::inventory::MigMode {
                current: true,
                pending: true,
            },
            mig_compute_slices: 7,
            mig_devices: Vec::new(),
            fabric_clique: None,
        }
    }

    #[test]
    fn counters_keep_overlapping_placements_apart() {
        let gpu = a100();
        let (product, profiles) = dynamic_product(&gpu).unwrap();
        let set = counter_set(&gpu, product, profiles);
        assert_eq!(set.name, "gpu-3-counter-set");
        // 8 memory slices, compute slices, one media extension.
        assert_eq!(set.counters.len(), 10, "{:?}", set.counters.keys());
        assert_eq!(set.counters["compute-slices"].value, "7");
        assert_eq!(set.counters["1g10gb-me-instances"].value, "1");
        let p = |n: &str| profiles.iter().find(|p| p.name == n).unwrap();
        // 1g@3 and 2g@2 both take memory slice 3: together they need 2 of a counter of 1.
        let a = consumption(&gpu, p("1g.10gb"), 3);
        let b = consumption(&gpu, p("2g.20gb"), 2);
        assert!(
            a.counters.contains_key("memory-slice-3") && b.counters.contains_key("memory-slice-3")
        );
        assert_eq!(b.counters["compute-slices"].value, "2");
        assert_eq!(full_profile(product, profiles).unwrap().name, "7g.80gb");
        assert_eq!(profile_memory(&gpu, product, p("1g.10gb")), 10240 << 20);
    }

    #[test]
    fn a_gpu_without_mig_mode_is_not_dynamic() {
        let mut gpu = a100();
        gpu.mig_mode.current = false;
        let e = dynamic_product(&gpu).unwrap_err().to_string();
        assert!(e.contains("GPU 3") && e.contains("MIG mode is off"), "{e}");
        assert!(selects(
            &DeviceSelector::List(vec![DeviceRef::Uuid("GPU-3".into())]),
            &gpu
        ));
        assert!(!selects(&DeviceSelector::Count(3), &gpu));
    }
}
