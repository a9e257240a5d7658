//! Why the DRA driver refused to prepare or unprepare a claim: one [`ClaimError`] variant per
//! rule, each with a [`ClaimErrorClass`] and a stable rule name.
//!
//! The domain ([`super::claim::resolve`], [`super::cdi`], [`super::capacity`]) and the
//! runtime (`crate::runtime::dra::driver`) build these; the gRPC service
//! (`crate::runtime::dra::service`) is the one place that turns one into the text the kubelet
//! shows, and the metrics count refusals by [`ClaimError::rule`]. The words are the ones the
//! driver always answered with. Pure.
//!
//! Variants for failures outside the domain (reading the claim, making MIG instances,
//! writing files) carry the platform error's text: the domain cannot name platform types,
//! and the rule, not the text, is what callers branch on.

use super::capacity::CapacityError;
use super::cdi::EditsError;
use super::opaque::ConfigError;

/// What kind of refusal: whose move it is to fix it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimErrorClass {
    /// The claim (its allocation or config) is wrong for this node: retrying will not help.
    Input,
    /// The claim collides with what is prepared, or the API changed under it.
    Conflict,
    /// Something the claim needs is not there yet (API unreachable, spec not written).
    Unavailable,
    /// The node failed (MIG, files, a task): the operator's problem.
    Internal,
}

impl ClaimErrorClass {
    /// The class as a label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Input => "input",
            Self::Conflict => "conflict",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }
}

/// A claim the driver did not prepare (or unprepare), naming the claim as
/// `namespace/name (uid)` and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClaimError {
    /// The API object under this name has another UID.
    #[error(
        "claim {claim}: the API has UID {api_uid} for this name: the claim was deleted and re-created"
    )]
    UidChanged { claim: String, api_uid: String },
    /// The claim has no `status.allocation`.
    #[error("claim {claim}: is not allocated (no status.allocation)")]
    NotAllocated { claim: String },
    /// None of the allocation's results is this driver's.
    #[error("claim {claim}: has no device of driver {driver}")]
    OtherDriver { claim: String, driver: String },
    /// A result of ours comes from another node's pool.
    #[error(
        "claim {claim}: request {request}: device {device} is allocated from pool {pool}, not this node's pool {node_pool}"
    )]
    NotThisNode {
        claim: String,
        request: String,
        device: String,
        pool: String,
        node_pool: String,
    },
    /// The device is not published by this node.
    #[error("claim {claim}: request {request}: device {device} does not exist on this node")]
    DeviceUnknown {
        claim: String,
        request: String,
        device: String,
    },
    /// The device is unhealthy.
    #[error("claim {claim}: request {request}: device {device} is unhealthy ({reason})")]
    DeviceUnhealthy {
        claim: String,
        request: String,
        device: String,
        reason: String,
    },
    /// The allocation gives a share of a device the config does not share.
    #[error(
        "claim {claim}: request {request}: device {device} is not shared on this node (no sharing rule of the config covers it), but the allocation gives it share {share_id}"
    )]
    DeviceNotShared {
        claim: String,
        request: String,
        device: String,
        share_id: String,
    },
    /// An exclusive device another claim holds.
    #[error(
        "claim {claim}: request {request}: device {device} is already prepared for claim {holder}"
    )]
    DeviceHeld {
        claim: String,
        request: String,
        device: String,
        /// UID of the claim holding it.
        holder: String,
    },
    /// A share ID unusable in a CDI name or a file (cut to 80 characters).
    #[error(
        "claim {claim}: request {request}: device {device}: shareID `{share_id}` is not 1-64 of a-z, 0-9 and '-'"
    )]
    ShareIdInvalid {
        claim: String,
        request: String,
        device: String,
        share_id: String,
    },
    /// A result's `consumedCapacity` that cannot be a share of the device.
    #[error("claim {claim}: request {request}: device {device}: {error}")]
    ConsumedCapacity {
        claim: String,
        request: String,
        device: String,
        error: Box<CapacityError>,
    },
    /// The share does not fit beside the ones prepared (the error has the free figure).
    #[error("claim {claim}: request {request}: {error}")]
    OverCapacity {
        claim: String,
        request: String,
        error: Box<CapacityError>,
    },
    /// A field of our opaque config (or its kind against the device).
    #[error("claim {claim}: {error}")]
    OpaqueConfig {
        claim: String,
        error: Box<ConfigError>,
    },
    /// The device's container edits cannot be made as the claim asks.
    #[error("claim {claim}: CDI spec: request {request}: {error}")]
    Edits {
        claim: String,
        request: String,
        error: Box<EditsError>,
    },
    /// The claim's CDI spec failed validation.
    #[error("claim {claim}: CDI spec: {message}")]
    SpecInvalid { claim: String, message: String },
    /// The node's CDI spec is not written yet (start-up).
    #[error("claim {claim}: the node's CDI spec is not written yet")]
    SpecNotWritten { claim: String },
    /// The API has no claim of this name (the message names it).
    #[error("{message}")]
    ClaimNotFound { claim: String, message: String },
    /// The claim could not be read from the API (the message names it).
    #[error("{message}")]
    ClaimUnreadable { claim: String, message: String },
    /// A device made on demand, on a run without NVML.
    #[error(
        "claim {claim}: request {request}: device {device} is made on demand (flags.dra.dynamicMig), which needs the NVML backend"
    )]
    MigNeedsNvml {
        claim: String,
        request: String,
        device: String,
    },
    /// A MIG instance for the claim could not be made.
    #[error("claim {claim}: {message}")]
    MigCreate { claim: String, message: String },
    /// A MIG instance of the claim could not be destroyed (it stays prepared).
    #[error("claim {claim}: {message}")]
    MigDestroy { claim: String, message: String },
    /// A record, spec or the checkpoint could not be written or removed.
    #[error("claim {claim}: {message}")]
    Persistence { claim: String, message: String },
    /// The task doing the work failed (panicked or was cut).
    #[error("claim {claim}: {what} task failed: {message}")]
    Task {
        claim: String,
        what: &'static str,
        message: String,
    },
}

impl ClaimError {
    /// Every [`Self::rule`], for metrics present before the first refusal.
    pub(crate) const RULES: [&'static str; 25] = [
        "uid_changed",
        "not_allocated",
        "other_driver",
        "not_this_node",
        "device_unknown",
        "device_unhealthy",
        "device_not_shared",
        "device_held",
        "share_id_invalid",
        "consumed_capacity_invalid",
        "share_over_capacity",
        "opaque_config",
        "isolation_conflict",
        "device_not_in_spec",
        "hook_missing",
        "mps_daemon_missing",
        "spec_invalid",
        "spec_not_written",
        "claim_not_found",
        "claim_unreadable",
        "mig_create_failed",
        "mig_destroy_failed",
        "persistence_failed",
        "task_failed",
        "mig_needs_nvml",
    ];

    /// The rule broken, as a stable snake_case name (a metric label).
    pub(crate) fn rule(&self) -> &'static str {
        match self {
            Self::UidChanged { .. } => "uid_changed",
            Self::NotAllocated { .. } => "not_allocated",
            Self::OtherDriver { .. } => "other_driver",
            Self::NotThisNode { .. } => "not_this_node",
            Self::DeviceUnknown { .. } => "device_unknown",
            Self::DeviceUnhealthy { .. } => "device_unhealthy",
            Self::DeviceNotShared { .. } => "device_not_shared",
            Self::DeviceHeld { .. } => "device_held",
            Self::ShareIdInvalid { .. } => "share_id_invalid",
            Self::ConsumedCapacity { .. } => "consumed_capacity_invalid",
            Self::OverCapacity { .. } => "share_over_capacity",
            Self::OpaqueConfig { .. } => "opaque_config",
            Self::Edits { error, .. } => error.rule(),
            Self::SpecInvalid { .. } => "spec_invalid",
            Self::SpecNotWritten { .. } => "spec_not_written",
            Self::ClaimNotFound { .. } => "claim_not_found",
            Self::ClaimUnreadable { .. } => "claim_unreadable",
            Self::MigNeedsNvml { .. } => "mig_needs_nvml",
            Self::MigCreate { .. } => "mig_create_failed",
            Self::MigDestroy { .. } => "mig_destroy_failed",
            Self::Persistence { .. } => "persistence_failed",
            Self::Task { .. } => "task_failed",
        }
    }

    /// Whose move it is.
    pub(crate) fn class(&self) -> ClaimErrorClass {
        use ClaimErrorClass::{Conflict, Input, Internal, Unavailable};
        match self {
            Self::NotAllocated { .. }
            | Self::OtherDriver { .. }
            | Self::NotThisNode { .. }
            | Self::DeviceUnknown { .. }
            | Self::DeviceNotShared { .. }
            | Self::ShareIdInvalid { .. }
            | Self::ConsumedCapacity { .. }
            | Self::OpaqueConfig { .. }
            | Self::MigNeedsNvml { .. }
            | Self::ClaimNotFound { .. } => Input,
            Self::Edits { error, .. } if error.is_input() => Input,
            Self::UidChanged { .. }
            | Self::DeviceUnhealthy { .. }
            | Self::DeviceHeld { .. }
            | Self::OverCapacity { .. } => Conflict,
            Self::SpecNotWritten { .. } | Self::ClaimUnreadable { .. } => Unavailable,
            Self::Edits { .. }
            | Self::SpecInvalid { .. }
            | Self::MigCreate { .. }
            | Self::MigDestroy { .. }
            | Self::Persistence { .. }
            | Self::Task { .. } => Internal,
        }
    }
}

#[cfg(test)]
#[path = "claim_error_tests.rs"]
mod tests;
