//! MIG layouts as code: NVIDIA mig-parted config files (`version: v1`, `mig-configs`), which
//! GPU each entry selects, and the destroy/create steps that take a GPU from its current GPU
//! and compute instances to the named layout.
//!
//! Pure: [`parse`] reads text, [`select`](mod@select) matches entries to GPU facts, [`steps`] diffs a
//! GPU's instances against its target. The platform (`crate::platform::mig`) reads the
//! current instances through NVML and runs the steps; `gpu-slicer mig apply` (`crate::cli::mig`)
//! prints them. Placement rules (profiles, starts, collisions) are the product facts in
//! `node_spec::placements`, shared with the fake NVML library so both agree.

pub(crate) mod current;
pub(crate) mod parse;
pub(crate) mod select;
pub(crate) mod steps;

pub(crate) use parse::MigPartedFile;
pub(crate) use select::{GpuFacts, Target, select};
pub(crate) use steps::{Action, GiState, GpuPlan, Kind, PlanStatus, Step, plan_gpu};

/// UUIDs of the GPUs a device of `snapshot`'s held set lives on (the GPU itself, or the
/// parent of a MIG device, replicas included). Devices no longer planned are looked up by
/// the UUID their ID starts with.
pub(crate) fn held_gpus(
    snapshot: &crate::domain::snapshot::Snapshot,
) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for (resource, ids) in snapshot.held.ids() {
        for id in ids {
            let planned = snapshot
                .plan
                .resource(&resource)
                .and_then(|r| r.devices.iter().find(|d| d.id == id))
                .map(|d| d.physical.gpu_uuid.clone());
            let uuid = id.split("::").next().unwrap_or(&id);
            let found = planned
                .or_else(|| snapshot.inventory.gpu(uuid).map(|g| g.uuid.clone()))
                .or_else(|| snapshot.inventory.mig(uuid).map(|(g, _)| g.uuid.clone()));
            // Unknown to the inventory too: keep the raw id, it may name a GPU a later
            // discovery brings back; it blocks nothing that is not its own.
            out.insert(found.unwrap_or_else(|| uuid.to_string()));
        }
    }
    out
}

/// Errors reading a mig-parted file or fitting a layout to the node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MigLayoutError {
    /// The file could not be read.
    #[error("cannot read MIG layout file {file}: {message}")]
    Read { file: String, message: String },
    /// The file is not YAML, or a field has the wrong shape, an unknown key or a bad value.
    #[error("invalid MIG layout file {file}: field `{field}`: {message}")]
    Parse {
        file: String,
        field: String,
        message: String,
    },
    /// `--layout` names no entry of `mig-configs`.
    #[error("MIG layout file {file} has no layout `{layout}` (layouts: {known})")]
    UnknownLayout {
        file: String,
        layout: String,
        known: String,
    },
    /// A layout does not fit one GPU: unknown profile, too many instances, no placement.
    #[error("MIG layout file {file}, layout `{layout}`, GPU {gpu} ({product}){}: {message}", profile.as_ref().map(|p| format!(", profile `{p}`")).unwrap_or_default())]
    Fit {
        file: String,
        layout: String,
        gpu: u32,
        product: String,
        profile: Option<String>,
        message: String,
    },
}

/// Result alias for this module.
pub(crate) type Result<T, E = MigLayoutError> = std::result::Result<T, E>;
