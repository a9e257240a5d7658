//! The answer to one Allocate call, as policy: every container request of the call is
//! checked against one snapshot before any is answered (all or nothing), each valid one gets
//! its [`ContainerAllocation`] with the generation annotation, and the answer says what it
//! hands out (device IDs, and the CDI device names they use, without `<kind>=`) so the
//! caller can record and persist it before replying. Any front-end calls this: the kubelet's
//! gRPC handler (`crate::runtime::plugin::service`) only translates messages and codes.

use std::collections::BTreeSet;

use super::{AllocateError, ContainerAllocation, add_device_specs, response, validate};
use crate::domain::snapshot::Snapshot;

/// Annotation naming the state generation an Allocate answer was built from.
pub(crate) const GENERATION_ANNOTATION: &str = "gpu-slicer.io/generation";

/// What an answer hands out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Holding {
    /// Kubelet device IDs of every container request, in request order.
    pub(crate) ids: Vec<String>,
    /// CDI device names (without `<kind>=`) the answer names.
    pub(crate) cdi: BTreeSet<String>,
}

/// The answer to every container request of one call, in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    /// One allocation per container request.
    pub(crate) containers: Vec<ContainerAllocation>,
    /// What the answer hands out (to record before replying).
    pub(crate) held: Holding,
}

/// Answer `requests` (the device IDs of each container request) for `resource` from one
/// snapshot. Refused as a whole when any request breaks a rule, or when the snapshot no
/// longer serves `resource`.
pub(crate) fn answer<S: AsRef<str>>(
    snapshot: &Snapshot,
    resource: &str,
    requests: &[Vec<S>],
) -> Result<Answer, AllocateError> {
    let view = snapshot
        .view(resource)
        .ok_or_else(|| AllocateError::NotServed {
            resource: resource.to_string(),
        })?;
    // Every request is checked before any is answered.
    let validated = requests
        .iter()
        .map(|ids| validate(view, ids))
        .collect::<Result<Vec<_>, _>>()?;
    let generation = snapshot.generation.to_string();
    let mut held = Holding {
        ids: Vec::with_capacity(validated.iter().map(Vec::len).sum()),
        cdi: BTreeSet::new(),
    };
    let containers = validated
        .iter()
        .map(|devices| {
            let (mut out, names) = response::build(&snapshot.config, &view.resource, devices);
            add_device_specs(&mut out, &snapshot.config, &snapshot.nodes, devices);
            out.annotations
                .insert(GENERATION_ANNOTATION.to_string(), generation.clone());
            held.ids.extend(devices.iter().map(|d| d.id.clone()));
            held.cdi.extend(names);
            out
        })
        .collect();
    Ok(Answer { containers, held })
}
