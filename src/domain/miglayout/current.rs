//! The current instances of a GPU known only from an inventory (the sim backend), which
//! lists MIG devices with their GPU and compute instance ids but no placements.
//!
//! Placements are assumed: the first arrangement `node_spec::search_placements` finds for
//! the GPU instances in id order, the same rule the fake NVML uses for a node file's devices,
//! so a dry run over `sim:<node file>` and over the fake NVML on that file print the same steps.

use std::collections::BTreeMap;

use node_spec::GiProfile;

use super::select::GpuFacts;
use super::steps::{CiState, GiState};
use crate::domain::inventory::Gpu;

/// The planner's facts of an inventory GPU.
pub(crate) fn facts(gpu: &Gpu) -> GpuFacts {
    GpuFacts {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        product: gpu.product.clone(),
        mig_enabled: gpu.mig_mode.current,
    }
}

/// The GPU instances of an inventory GPU, with assumed placements.
pub(crate) fn instances(gpu: &Gpu) -> Vec<GiState> {
    let mut by_gi: BTreeMap<u32, (String, Vec<CiState>)> = BTreeMap::new();
    for m in &gpu.mig_devices {
        let e = by_gi
            .entry(m.gpu_instance_id)
            .or_insert_with(|| (m.profile.clone(), Vec::new()));
        e.1.push(CiState {
            id: m.compute_instance_id,
            full: true,
        });
    }
    let product = node_spec::lookup_product(&gpu.product);
    let table = product.map(node_spec::gi_profiles).unwrap_or(&[]);
    let profiles: Vec<&'static GiProfile> = by_gi
        .values()
        .filter_map(|(p, _)| table.iter().find(|t| t.name == p))
        .collect();
    let starts = product
        .filter(|_| profiles.len() == by_gi.len())
        .and_then(|p| node_spec::search_placements(p, &profiles, &[]));
    let mut next = 0;
    let mut out: Vec<GiState> = by_gi
        .into_iter()
        .enumerate()
        .map(|(i, (id, (profile, compute_instances)))| {
            let start = starts.as_ref().map_or(next, |s| s[i]);
            next += table
                .iter()
                .find(|t| t.name == profile)
                .map_or(1, |t| t.memory_slices);
            GiState {
                id,
                profile,
                start,
                compute_instances,
            }
        })
        .collect();
    out.sort_by_key(|g| (g.start, g.id));
    out
}
