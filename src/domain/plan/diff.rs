//! How a new plan differs from the one being served, resource by resource: the reloader
//! re-advertises only what changed.

use serde::Serialize;

use super::Plan;

/// How a new plan differs from the one being served, by resource name. A resource is
/// `changed` when anything the kubelet or Allocate sees differs (devices, their health at
/// discovery, sharing, kind); the daemon re-advertises only those and leaves `unchanged`
/// resources' sockets and streams alone.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub(crate) struct PlanDiff {
    /// In the new plan only: start serving.
    pub(crate) added: Vec<String>,
    /// In the old plan only: stop serving.
    pub(crate) removed: Vec<String>,
    /// In both, different: publish the new device list.
    pub(crate) changed: Vec<String>,
    /// In both, identical.
    pub(crate) unchanged: Vec<String>,
}

impl PlanDiff {
    #[cfg(test)]
    /// Whether serving has to change at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// Compare two plans resource by resource (both are sorted by name, but this does not rely
/// on it).
pub(crate) fn diff(old: &Plan, new: &Plan) -> PlanDiff {
    let mut out = PlanDiff::default();
    for r in &new.resources {
        match old.resource(&r.name) {
            None => out.added.push(r.name.clone()),
            Some(o) if o == r => out.unchanged.push(r.name.clone()),
            Some(_) => out.changed.push(r.name.clone()),
        }
    }
    out.removed = old
        .resources
        .iter()
        .filter(|r| new.resource(&r.name).is_none())
        .map(|r| r.name.clone())
        .collect();
    out
}
