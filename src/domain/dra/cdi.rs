//! The per-claim transient CDI spec: kind `k8s.<driver>/claim`, one device
//! `<claimUID>-<device>` per allocated device (`<claimUID>-<device>-<shareID>` for a share
//! of a shared device), file `<vendor>-<class>_<claimUID>.json`.
//!
//! Cut from the node's spec that `crate::domain::cdi::generate` builds for the device-plugin
//! path: each claim device takes the container edits of the node-spec device of the same
//! UUID (device nodes, MIG capability nodes), and the spec-level edits (control nodes,
//! driver libraries and binaries, hooks, `NVIDIA_VISIBLE_DEVICES=void`) come along whole, so
//! both front-ends hand containers exactly the same edits. On top of them, what binds a
//! share:
//!
//! - memory enforced (the device's isolation, or the claim's, includes `memory`): the
//!   `createRuntime` memory-limit hook of [`crate::domain::cdi::shares`] with exactly the
//!   share's consumed bytes (the whole device's for an exclusive one);
//! - the device shared through MPS: its daemon's pipe and `/dev/shm`,
//!   `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` = the share's `compute` (or, when it reserves none,
//!   the claim's `mpsConfig.defaultActiveThreadPercentage`), and
//!   `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` = the share's memory (lowered by the claim's
//!   pinned-memory defaults when those are smaller): capacity requests win over defaults.
//!
//! A claim asking for what the device cannot give is its error, naming both sides: MPS on a
//! device no MPS daemon serves, time-slicing on a device shared through MPS, a memory limit
//! on a MIG device (NVML has none). A dynamic MIG device takes the edits of the instance
//! made for it (`made`). Validated before it is returned.

use std::collections::BTreeMap;

use crate::domain::cdi::shares::{HookSettings, memory_hook, mps_client};
use crate::domain::cdi::{ContainerEdits, Device, Spec, minimum_version, validate};
use crate::domain::config::Isolation;
use crate::domain::mps::DaemonSpec;

use super::claim::{Resolved, ResolvedDevice};
use super::claim_error::ClaimError;
use super::opaque::Strategy;
use super::slices::DeviceType;

/// Why a claim device's container edits cannot be made: the claim's config against the
/// device's isolation, or something the node lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EditsError {
    /// A dynamic MIG device with no instance made for it.
    #[error("no MIG instance was made for device {device}")]
    NoMadeInstance { device: String },
    /// A device the node's spec does not have.
    #[error("device {device} ({uuid}) is not in the node's spec")]
    NotInNodeSpec { device: String, uuid: String },
    /// Memory is enforced but no hook is configured.
    #[error("device {device} needs the memory-limit hook and none is configured")]
    NoHook { device: String },
    /// The device is shared through MPS but its daemon is not there.
    #[error("device {device} is shared through MPS but has no MPS daemon")]
    NoMpsDaemon { device: String },
    /// `sharing.strategy: MPS` on a device no MPS daemon serves.
    #[error(
        "the claim's config sets sharing.strategy MPS but device {device}'s isolation is `{isolation}` ({rule}): no MPS daemon serves it"
    )]
    MpsStrategyWithoutDaemon {
        device: String,
        isolation: &'static str,
        rule: String,
    },
    /// An MPS isolation on a device no MPS daemon serves.
    #[error(
        "the claim's config sets isolation `{claim_isolation}` but device {device}'s isolation is `{isolation}` ({rule}): no MPS daemon serves it"
    )]
    MpsIsolationWithoutDaemon {
        claim_isolation: &'static str,
        device: String,
        isolation: &'static str,
        rule: String,
    },
    /// `sharing.strategy: TimeSlicing` on a device shared through MPS.
    #[error(
        "the claim's config sets sharing.strategy TimeSlicing but device {device}'s isolation is `{isolation}` ({rule}): its tenants share it through its MPS daemon"
    )]
    TimeSlicingOnMps {
        device: String,
        isolation: &'static str,
        rule: String,
    },
    /// A memory limit on a MIG device.
    #[error(
        "the claim's config sets isolation `{claim_isolation}` but device {device} is a MIG device, which has no driver memory limit"
    )]
    MemoryLimitOnMig {
        claim_isolation: &'static str,
        device: String,
    },
}

impl EditsError {
    /// The rule broken (see [`ClaimError::rule`]).
    pub(crate) fn rule(&self) -> &'static str {
        match self {
            Self::NoMadeInstance { .. } | Self::NotInNodeSpec { .. } => "device_not_in_spec",
            Self::NoHook { .. } => "hook_missing",
            Self::NoMpsDaemon { .. } => "mps_daemon_missing",
            Self::MpsStrategyWithoutDaemon { .. }
            | Self::MpsIsolationWithoutDaemon { .. }
            | Self::TimeSlicingOnMps { .. }
            | Self::MemoryLimitOnMig { .. } => "isolation_conflict",
        }
    }

    /// Whether the claim's config is at fault (the other cases are the node's).
    pub(crate) fn is_input(&self) -> bool {
        self.rule() == "isolation_conflict"
    }
}

/// The CDI class of per-claim specs.
pub(crate) const CLAIM_CLASS: &str = "claim";

/// `k8s.<driver>/claim`.
pub(crate) fn claim_kind(driver: &str) -> String {
    format!("{}/{CLAIM_CLASS}", super::cdi_vendor(driver))
}

/// File name of a claim's spec: `<vendor>-<class>_<claimUID>.json` (the CDI library's
/// transient-spec convention, `/` in the id as `_`).
pub(crate) fn spec_file_name(driver: &str, claim_uid: &str) -> String {
    format!(
        "{}-{CLAIM_CLASS}_{}.json",
        super::cdi_vendor(driver),
        claim_uid.replace('/', "_")
    )
}

/// CDI device name of a claim's device: `<claimUID>-<device>`.
pub(crate) fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// CDI device name of a resolved device: `<claimUID>-<device>`, with `-<shareID>` for a
/// share (a claim may hold two shares of one device; names are never reused).
pub(crate) fn resolved_name(claim_uid: &str, d: &ResolvedDevice) -> String {
    match d.share.as_ref().and_then(|s| s.share_id.as_deref()) {
        Some(id) => format!("{}-{id}", device_name(claim_uid, &d.device)),
        None => device_name(claim_uid, &d.device),
    }
}

#[cfg(test)]
/// Fully qualified CDI ID handed to the kubelet: `k8s.<driver>/claim=<claimUID>-<device>`.
pub(crate) fn qualified(driver: &str, claim_uid: &str, device: &str) -> String {
    format!("{}={}", claim_kind(driver), device_name(claim_uid, device))
}

/// Fully qualified CDI ID of a resolved device ([`resolved_name`]).
pub(crate) fn qualified_resolved(driver: &str, claim_uid: &str, d: &ResolvedDevice) -> String {
    format!("{}={}", claim_kind(driver), resolved_name(claim_uid, d))
}

/// What a claim's spec is cut from besides the claim.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpecInputs<'a> {
    /// The node's spec (generated with the same options the device plugin's spec is).
    pub(crate) node: &'a Spec,
    /// The memory-limit hook (`None`: a claim that needs it fails, never runs unlimited).
    pub(crate) hook: Option<&'a HookSettings>,
    /// The node's MPS daemons.
    pub(crate) mps: &'a [DaemonSpec],
    /// Container edits of the MIG instances made for this claim, by published device name.
    pub(crate) made: &'a BTreeMap<String, ContainerEdits>,
}

#[cfg(test)]
/// The spec of `claim`, from the node's spec `node` only (no hook, daemons or made MIG).
pub(crate) fn claim_spec(driver: &str, node: &Spec, claim: &Resolved) -> Result<Spec, ClaimError> {
    let made = BTreeMap::new();
    let inputs = SpecInputs {
        node,
        hook: None,
        mps: &[],
        made: &made,
    };
    claim_spec_with(driver, &inputs, claim)
}

/// The spec of `claim` from `inputs`.
pub(crate) fn claim_spec_with(
    driver: &str,
    inputs: &SpecInputs<'_>,
    claim: &Resolved,
) -> Result<Spec, ClaimError> {
    let mut devices = Vec::with_capacity(claim.devices.len());
    for d in &claim.devices {
        let edits = device_edits(inputs, d).map_err(|error| ClaimError::Edits {
            claim: claim.claim.to_string(),
            request: d.request.clone(),
            error: Box::new(error),
        })?;
        devices.push(Device {
            name: resolved_name(&claim.claim.uid, d),
            container_edits: edits,
        });
    }
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    devices.dedup_by(|a, b| a.name == b.name);
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: claim_kind(driver),
        devices,
        container_edits: inputs.node.container_edits.clone(),
    };
    spec.cdi_version = minimum_version(&spec).to_string();
    validate(&spec).map_err(|e| ClaimError::SpecInvalid {
        claim: claim.claim.to_string(),
        message: e.to_string(),
    })?;
    Ok(spec)
}

/// The edits of one device: its nodes (from the node spec, or the instance made for it)
/// and what binds its share.
fn device_edits(inputs: &SpecInputs<'_>, d: &ResolvedDevice) -> Result<ContainerEdits, EditsError> {
    let bind = binding(d)?;
    let mut edits = if d.placement.is_some() {
        inputs
            .made
            .get(&d.device)
            .cloned()
            .ok_or_else(|| EditsError::NoMadeInstance {
                device: d.device.clone(),
            })?
    } else {
        inputs
            .node
            .devices
            .iter()
            .find(|n| n.name == d.uuid)
            .map(|n| n.container_edits.clone())
            .ok_or_else(|| EditsError::NotInNodeSpec {
                device: d.device.clone(),
                uuid: d.uuid.clone(),
            })?
    };
    let memory = d
        .share
        .as_ref()
        .map_or(d.memory_bytes, |s| s.consumed.memory_bytes);
    if bind.memory_limit {
        let hook = inputs.hook.ok_or_else(|| EditsError::NoHook {
            device: d.device.clone(),
        })?;
        edits.hooks.push(memory_hook(hook, &d.gpu_uuid, memory));
    }
    if bind.mps {
        let daemon = inputs
            .mps
            .iter()
            .find(|m| m.uuid == d.uuid)
            .ok_or_else(|| EditsError::NoMpsDaemon {
                device: d.device.clone(),
            })?;
        let mps = d
            .config
            .as_ref()
            .and_then(|c| c.sharing.as_ref())
            .and_then(|s| s.mps_config.as_ref());
        let compute = d.share.as_ref().map_or(0, |s| s.consumed.compute_percent);
        let threads = (compute > 0)
            .then_some(compute)
            .or_else(|| mps.and_then(|m| m.default_active_thread_percentage));
        let pinned = mps
            .and_then(|m| {
                let per_device = m
                    .default_per_device_pinned_memory_limit
                    .as_ref()
                    .and_then(|p| p.get(&d.uuid).or_else(|| p.get(&d.gpu_uuid)));
                per_device.or(m.default_pinned_device_memory_limit.as_ref())
            })
            .and_then(|q| q.bytes().ok())
            .map_or(memory, |b| b.min(memory));
        mps_client(&mut edits, daemon, threads, pinned);
    }
    Ok(edits)
}

/// What binds a device's share.
struct Binding {
    /// The memory-limit hook.
    memory_limit: bool,
    /// The device's MPS daemon.
    mps: bool,
}

/// What the device's isolation and the claim's config ask for together, or the conflict
/// between them, naming both.
fn binding(d: &ResolvedDevice) -> Result<Binding, EditsError> {
    let (device_isolation, rule) = match &d.share {
        Some(s) => (s.device.isolation, s.device.rule.as_str()),
        None => (Isolation::None, "no sharing rule of the config covers it"),
    };
    let claim_isolation = d.config.as_ref().map_or(Isolation::None, |c| c.isolation);
    let strategy = d
        .config
        .as_ref()
        .and_then(|c| c.sharing.as_ref())
        .map(|s| s.strategy);
    let (device, isolation, rule) = (
        d.device.clone(),
        device_isolation.as_str(),
        rule.to_string(),
    );
    if strategy == Some(Strategy::Mps) && !device_isolation.uses_mps() {
        return Err(EditsError::MpsStrategyWithoutDaemon {
            device,
            isolation,
            rule,
        });
    }
    if claim_isolation.uses_mps() && !device_isolation.uses_mps() {
        return Err(EditsError::MpsIsolationWithoutDaemon {
            claim_isolation: claim_isolation.as_str(),
            device,
            isolation,
            rule,
        });
    }
    if strategy == Some(Strategy::TimeSlicing) && device_isolation.uses_mps() {
        return Err(EditsError::TimeSlicingOnMps {
            device,
            isolation,
            rule,
        });
    }
    // A tenant may add enforcement, never remove what the operator set.
    let memory_limit = device_isolation.uses_memory_limit() || claim_isolation.uses_memory_limit();
    if memory_limit && d.kind == DeviceType::Mig {
        return Err(EditsError::MemoryLimitOnMig {
            claim_isolation: claim_isolation.as_str(),
            device,
        });
    }
    Ok(Binding {
        memory_limit,
        mps: device_isolation.uses_mps(),
    })
}
