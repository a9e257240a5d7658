//! Plan: the pure function `Inventory × Config → Plan`.
//!
//! A plan lists the Kubernetes extended resources this node advertises and, for each, the
//! allocatable devices the kubelet sees: whole GPUs (ID = GPU UUID), MIG devices (ID = MIG
//! UUID) and replicas (ID = `<uuid>::<n>`, NVIDIA's format). Every device records the
//! physical device behind it, the share it grants, its health and NUMA node. The device
//! plugin serves a plan, the CDI generator describes it, the allocator enforces it. No IO.
//!
//! [`build_reporting`] runs three steps: the [`candidate`]s the MIG strategy makes of the
//! inventory, which of them each sharing entry takes ([`assign`], with what is skipped on
//! this node), and the resources they come out as ([`assemble`]). [`model`] holds the
//! plan's types, [`diff`](mod@diff) compares two plans.

use serde::Serialize;

use crate::domain::config::{Config, format_quantity};
use crate::domain::inventory::Inventory;

mod assemble;
mod assign;
mod candidate;
mod diff;
mod model;
#[cfg(test)]
mod tests;

pub(crate) use assign::{SkipReason, Skipped};
pub(crate) use candidate::mig_resource_name;
pub(crate) use diff::{PlanDiff, diff};
pub(crate) use model::{Device, Physical, Plan, Replica, Resource, ResourceKind, Share, Sharing};

/// Resource name of whole GPUs.
pub(crate) const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Errors planning resources: the config asks for something this node cannot give.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum PlanError {
    /// `migStrategy: single` on a node whose MIG devices are not all alike.
    #[error(
        "invalid config {path}: field `flags.migStrategy` = `single`: all MIG devices must have the same profile, found {profiles}; use `mixed`"
    )]
    SingleMixedProfiles { path: String, profiles: String },
    /// `migStrategy: single` with some GPUs in MIG mode and others not.
    #[error(
        "invalid config {path}: field `flags.migStrategy` = `single`: GPU {index} ({uuid}) has MIG disabled while others have it enabled; use `mixed`"
    )]
    SingleMixedModes {
        path: String,
        index: u32,
        uuid: String,
    },
    /// Two sharing entries replicate the same device.
    #[error("invalid config {path}: field `{field}`: device {device} is already shared by {other}")]
    SharedTwice {
        path: String,
        field: String,
        device: String,
        other: String,
    },
    /// A resource would mix whole devices and replicas under one name.
    #[error(
        "invalid config {path}: field `{field}`: shares only some devices of {resource} under the same name; a resource cannot mix whole devices and replicas (set `rename` or `renameByDefault`)"
    )]
    MixedResource {
        path: String,
        field: String,
        resource: String,
    },
    /// Per-replica memory over-subscribes the device.
    #[error(
        "invalid config {path}: field `{field}.memory` = `{}`: {replicas} replicas × {} = {} exceeds the {} of {device}; at most {} per replica fits",
        format_quantity(*per_replica),
        format_quantity(*per_replica),
        format_quantity(*total),
        format_quantity(*available),
        format_quantity((available / u64::from((*replicas).max(1))) >> 20 << 20)
    )]
    OverSubscribed {
        path: String,
        field: String,
        replicas: u32,
        per_replica: u64,
        total: u64,
        available: u64,
        device: String,
    },
    /// A rule of the sharing mode is broken (e.g. MPS with more than 48 replicas).
    #[error("invalid config {path}: field `{field}`: {message}")]
    Sharing {
        path: String,
        field: String,
        message: String,
    },
    /// `--strict`: the config names something this node lacks (one line per skip).
    #[error("invalid config {path} (--strict refuses what this node lacks): {entries}")]
    Strict { path: String, entries: String },
    /// Two resources end up with the same advertised name but different kinds.
    #[error("resource name {name} is produced twice ({first} and {second})")]
    NameClash {
        name: String,
        first: String,
        second: String,
    },
}

/// Result alias for this module.
pub(crate) type Result<T, E = PlanError> = std::result::Result<T, E>;

/// A plan and what of the config it left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Planned {
    /// The plan to serve.
    pub(crate) plan: Plan,
    /// Entries and references skipped on this node, in config order, for the caller to
    /// log. The daemon records them as
    /// `gpu_slicer_config_entries_skipped{reason}` ([`crate::runtime::metrics::Metrics::record_skipped`]).
    pub(crate) skipped: Vec<Skipped>,
}

impl Planned {
    /// The plan, or, when anything was skipped, the error `--strict` turns the skips into
    /// (for checking a ConfigMap in CI against the nodes it is meant for).
    pub(crate) fn strict(self, source: &str) -> Result<Plan> {
        if self.skipped.is_empty() {
            return Ok(self.plan);
        }
        let entries: Vec<String> = self
            .skipped
            .iter()
            .map(|s| {
                format!(
                    "field `{}` = `{}`: {} (node has {})",
                    s.field,
                    s.value,
                    s.reason.explain(),
                    s.node_has
                )
            })
            .collect();
        Err(PlanError::Strict {
            path: source.to_string(),
            entries: entries.join("; "),
        })
    }
}

/// Build the plan. Pure: the same inputs always give the same plan. Entries this node
/// has nothing for are skipped (see [`build_reporting`] for the list).
pub(crate) fn build(inv: &Inventory, cfg: &Config) -> Result<Plan> {
    build_reporting(inv, cfg).map(|p| p.plan)
}

/// Build the plan and say which config entries were skipped on this node (the caller logs
/// them: [`Skipped::node_has`] says what the node has instead).
pub(crate) fn build_reporting(inv: &Inventory, cfg: &Config) -> Result<Planned> {
    let candidates = candidate::candidates(inv, cfg)?;
    let (taken, skipped) = assign::assign(&candidates, cfg)?;
    let resources = assemble::assemble(inv, cfg, &candidates, &taken)?;
    Ok(Planned {
        plan: Plan { resources },
        skipped,
    })
}
