//! Allocate: the enforcement rules, preferred-allocation policies and response contents of
//! the device plugin, as pure functions over the plan.
//!
//! - [`crate::domain::view`]: live health of every planned device (plan health + health events), and the
//!   fan-out from a GPU/MIG event to the resources it touches.
//! - [`validate`]: checks one container request (known, unique, healthy, share rules).
//! - [`preferred`](mod@preferred): `packed` / `distributed` / NUMA-aware picking for GetPreferredAllocation.
//! - [`response`]: what a valid request is answered with (CDI names, annotation, env, mounts).
//! - [`answer`](mod@answer): one Allocate call from one snapshot, all or nothing, and what it holds.
//!
//! The gRPC edge (`crate::runtime::plugin`) converts to and from prost types and maps
//! [`AllocateError::class`] to a gRPC code. Nothing here does IO or imports tonic.

pub(crate) mod answer;
pub(crate) mod preferred;
pub(crate) mod response;

#[cfg(test)]
mod tests;

use std::collections::HashSet;

use crate::domain::plan::Device;

#[cfg(test)]
pub(crate) use crate::domain::devnodes::DeviceNodes;
pub(crate) use crate::domain::view::{HealthUpdate, ResourceView};
#[cfg(test)]
pub(crate) use crate::domain::view::{Overlay, StateError};
#[cfg(test)]
pub(crate) use answer::GENERATION_ANNOTATION;
pub(crate) use answer::answer;
pub(crate) use preferred::preferred;
#[cfg(test)]
pub(crate) use response::build_response;
pub(crate) use response::{ContainerAllocation, DeviceSpecEntry, MountEntry, add_device_specs};

/// Why a container request was refused. Every variant names the device and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AllocateError {
    /// The container request names no device at all.
    #[error("container request names no device (rule: a request takes at least one device)")]
    Empty,
    /// An ID this resource does not advertise.
    #[error("unknown device {id}: resource {resource} has no such device (rule: IDs must exist)")]
    Unknown { resource: String, id: String },
    /// The same ID twice in one container request.
    #[error("device {id} requested more than once (rule: IDs must be unique in a request)")]
    Duplicate { id: String },
    /// An ID whose device is currently unhealthy.
    #[error("device {id} is unhealthy: {reason} (rule: only healthy devices are allocated)")]
    Unhealthy { id: String, reason: String },
    /// More than one replica while `failRequestsGreaterThanOne` is set.
    #[error(
        "device {id}: resource {resource} allows one replica per request, found {count} (rule: failRequestsGreaterThanOne)"
    )]
    TooManyReplicas {
        resource: String,
        id: String,
        count: usize,
    },
    /// Replicas of several physical devices without `allowMultiGpu`.
    #[error(
        "device {id} is a replica of {physical} but the request also takes replicas of {other} (rule: all replicas of a request on one GPU unless allowMultiGpu)"
    )]
    MultiGpu {
        id: String,
        physical: String,
        other: String,
    },
    /// A whole GPU and a MIG slice of it in the same request.
    #[error(
        "device {id} is a MIG slice of {gpu}, which the request also takes whole (rule: no whole GPU together with its own MIG slices)"
    )]
    WholeAndMig { id: String, gpu: String },
    /// The snapshot no longer plans the resource (a reload removed it).
    #[error("resource {resource} is no longer served")]
    NotServed { resource: String },
}

/// How the edge should classify a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    /// The request itself is wrong (gRPC `InvalidArgument`).
    Invalid,
    /// The request is well formed but a device is unusable now (gRPC `FailedPrecondition`).
    Unhealthy,
}

impl AllocateError {
    /// Classification for the gRPC edge.
    pub(crate) fn class(&self) -> ErrorClass {
        match self {
            AllocateError::Unhealthy { .. } | AllocateError::NotServed { .. } => {
                ErrorClass::Unhealthy
            }
            _ => ErrorClass::Invalid,
        }
    }

    /// Every code [`AllocateError::rule`] returns for a resource that is served, for
    /// zero-valued metric series (`not-served` is no rule of the request: not counted).
    pub(crate) const RULES: [&'static str; 7] = [
        "empty",
        "unknown-device",
        "duplicate",
        "unhealthy",
        "fail-requests-greater-than-one",
        "multi-gpu",
        "whole-and-mig",
    ];

    /// Short name of the broken rule, for metrics labels.
    pub(crate) fn rule(&self) -> &'static str {
        match self {
            AllocateError::Empty => "empty",
            AllocateError::Unknown { .. } => "unknown-device",
            AllocateError::Duplicate { .. } => "duplicate",
            AllocateError::Unhealthy { .. } => "unhealthy",
            AllocateError::TooManyReplicas { .. } => "fail-requests-greater-than-one",
            AllocateError::MultiGpu { .. } => "multi-gpu",
            AllocateError::WholeAndMig { .. } => "whole-and-mig",
            AllocateError::NotServed { .. } => "not-served",
        }
    }

    /// The device ID concerned, when there is one.
    pub(crate) fn device_id(&self) -> Option<&str> {
        match self {
            AllocateError::Empty | AllocateError::NotServed { .. } => None,
            AllocateError::Unknown { id, .. }
            | AllocateError::Duplicate { id }
            | AllocateError::Unhealthy { id, .. }
            | AllocateError::TooManyReplicas { id, .. }
            | AllocateError::MultiGpu { id, .. }
            | AllocateError::WholeAndMig { id, .. } => Some(id),
        }
    }
}

/// Check one container request against the live view of its resource and return the
/// devices it names, in request order. Nothing is reserved: the kubelet owns allocation
/// bookkeeping, so a refusal leaves no partial state behind.
pub(crate) fn validate<'a, S: AsRef<str>>(
    view: &'a ResourceView,
    ids: &[S],
) -> Result<Vec<&'a Device>, AllocateError> {
    if ids.is_empty() {
        return Err(AllocateError::Empty);
    }
    let resource = &view.resource;
    let mut seen = HashSet::new();
    let mut devices: Vec<&Device> = Vec::with_capacity(ids.len());
    for id in ids {
        let id = id.as_ref();
        let Some(index) = view.index_of(id) else {
            return Err(AllocateError::Unknown {
                resource: resource.name.clone(),
                id: id.to_string(),
            });
        };
        // IDs are unique per device, so a repeated index is a repeated ID; requests name a
        // handful of devices, so a scan beats hashing (large ones take the set).
        let repeated = if ids.len() <= 16 {
            devices
                .iter()
                .any(|d| std::ptr::eq(*d, &resource.devices[index]))
        } else {
            !seen.insert(index)
        };
        if repeated {
            return Err(AllocateError::Duplicate { id: id.to_string() });
        }
        if let Some(reason) = view.unhealthy_reason(index) {
            return Err(AllocateError::Unhealthy {
                id: id.to_string(),
                reason: reason.to_string(),
            });
        }
        devices.push(&resource.devices[index]);
    }
    if let Some(sharing) = &resource.sharing {
        if sharing.fail_requests_greater_than_one && devices.len() > 1 {
            return Err(AllocateError::TooManyReplicas {
                resource: resource.name.clone(),
                id: devices[1].id.clone(),
                count: devices.len(),
            });
        }
        if !sharing.allow_multi_gpu {
            let first = &devices[0].physical.uuid;
            if let Some(d) = devices.iter().find(|d| d.physical.uuid != *first) {
                return Err(AllocateError::MultiGpu {
                    id: d.id.clone(),
                    physical: d.physical.uuid.clone(),
                    other: first.clone(),
                });
            }
        }
    }
    // A plan never puts whole GPUs and MIG slices under one name, but the rule is cheap
    // and keeps a future mixed resource from handing out a GPU twice. Only a request with
    // a MIG slice can break it.
    let whole: HashSet<&str> = if devices.iter().any(|d| d.physical.is_mig()) {
        devices
            .iter()
            .filter(|d| !d.physical.is_mig())
            .map(|d| d.physical.gpu_uuid.as_str())
            .collect()
    } else {
        HashSet::new()
    };
    if !whole.is_empty()
        && let Some(d) = devices
            .iter()
            .find(|d| d.physical.is_mig() && whole.contains(d.physical.gpu_uuid.as_str()))
    {
        return Err(AllocateError::WholeAndMig {
            id: d.id.clone(),
            gpu: d.physical.gpu_uuid.clone(),
        });
    }
    Ok(devices)
}
