//! The reconciliation of one ledger round: what the kubelet's PodResources answers say
//! (containers holding devices, DRA claims' devices, what it can allocate), in domain terms,
//! against the plan's views, and the [`Drift`] between them. No I/O: the ledger actor
//! (the parent module) asks the kubelet and publishes the outcome.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::LedgerSnapshot;
use crate::domain::allocate::ResourceView;
use crate::domain::inventory::Health;
use crate::domain::usage::Holder;
use crate::proto::podresources as pb;

/// A mismatch between what the kubelet reports and what this agent serves.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Drift {
    /// The kubelet says a container holds a device the current plan does not have (a
    /// removed resource or device; it stays in the CDI spec until released).
    AllocatedNotPlanned {
        /// Resource name.
        resource: String,
        /// Device ID.
        device: String,
        /// Who holds it.
        holder: Holder,
    },
    /// A container holds a device that is unhealthy now.
    AllocatedUnhealthy {
        /// Resource name.
        resource: String,
        /// Device ID.
        device: String,
        /// Who holds it.
        holder: Holder,
    },
    /// The kubelet can allocate a device this agent does not advertise.
    KubeletExtra {
        /// Resource name.
        resource: String,
        /// Device ID.
        device: String,
    },
    /// This agent advertises a healthy device the kubelet cannot allocate (not yet seen,
    /// or the ListAndWatch stream is behind).
    KubeletMissing {
        /// Resource name.
        resource: String,
        /// Device ID.
        device: String,
    },
}

/// The answers of one round, in domain terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KubeletReport {
    /// (holder, resource, device IDs) per container and resource.
    pub(crate) assigned: Vec<(Holder, String, Vec<String>)>,
    /// (resource, device IDs) the kubelet can allocate.
    pub(crate) allocatable: Vec<(String, Vec<String>)>,
    /// Devices of DRA claims, per container (every driver's).
    pub(crate) claimed: Vec<ClaimedDevice>,
}

/// One device of a DRA claim a container holds, as PodResources reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimedDevice {
    /// The container.
    pub(crate) holder: Holder,
    /// Driver.
    pub(crate) driver: String,
    /// Pool.
    pub(crate) pool: String,
    /// Device name in the pool.
    pub(crate) device: String,
}

/// Which front-end serves the plan: what the kubelet's allocatable list can be compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Front {
    /// Device-plugin servers: the kubelet lists their devices as allocatable.
    DevicePlugin,
    /// The DRA driver: the kubelet's allocatable list does not cover its devices.
    Dra,
}

/// The driver and pool whose claimed devices are ours (DRA mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DraPool {
    /// Driver name.
    pub(crate) driver: String,
    /// Pool (the node name).
    pub(crate) pool: String,
}

/// (holder, resource, device IDs) for the devices of `pool`'s claims in `claimed`: each DRA
/// device maps to the plan's devices of the same physical device (the whole GPU or its
/// replicas, or the MIG device), in every resource that serves it. A device the node does
/// not have (any more) is kept under the driver's name, so its holder is still shown.
pub(crate) fn dra_assigned(
    claimed: &[ClaimedDevice],
    pool: &DraPool,
    snapshot: &crate::state::Snapshot,
) -> Vec<(Holder, String, Vec<String>)> {
    use crate::domain::dra::slices;
    let ours: Vec<&ClaimedDevice> = claimed
        .iter()
        .filter(|c| c.driver == pool.driver && c.pool == pool.pool)
        .collect();
    if ours.is_empty() {
        return Vec::new();
    }
    let health = slices::health_map(&snapshot.inventory, &snapshot.plan, &snapshot.overlay);
    let devices = slices::node_devices(&snapshot.inventory, &snapshot.plan, &health);
    let mut by_uuid: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for view in snapshot.views.values() {
        for (d, _) in view.devices() {
            by_uuid
                .entry(d.physical.uuid.as_str())
                .or_default()
                .push((view.resource.name.as_str(), d.id.as_str()));
        }
    }
    let mut out = Vec::new();
    for c in ours {
        let planned = devices
            .get(&c.device)
            .and_then(|d| by_uuid.get(d.uuid.as_str()));
        match planned {
            Some(ids) => out.extend(ids.iter().map(|(resource, id)| {
                (
                    c.holder.clone(),
                    (*resource).to_string(),
                    vec![(*id).to_string()],
                )
            })),
            None => out.push((
                c.holder.clone(),
                pool.driver.clone(),
                vec![c.device.clone()],
            )),
        }
    }
    out
}

impl KubeletReport {
    pub(super) fn from_pb(
        list: pb::ListPodResourcesResponse,
        alloc: pb::AllocatableResourcesResponse,
    ) -> Self {
        let mut assigned = Vec::new();
        let mut claimed = Vec::new();
        for pod in list.pod_resources {
            for c in pod.containers {
                let holder = Holder {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                };
                for d in c.devices {
                    assigned.push((holder.clone(), d.resource_name, d.device_ids));
                }
                let devices = c
                    .dynamic_resources
                    .into_iter()
                    .flat_map(|r| r.claim_resources);
                claimed.extend(devices.map(|d| ClaimedDevice {
                    holder: holder.clone(),
                    driver: d.driver_name,
                    pool: d.pool_name,
                    device: d.device_name,
                }));
            }
        }
        let allocatable = alloc
            .devices
            .into_iter()
            .map(|d| (d.resource_name, d.device_ids))
            .collect();
        Self {
            assigned,
            allocatable,
            claimed,
        }
    }
}

/// The domain part of a resource name (`nvidia.com` of `nvidia.com/gpu`).
pub(super) fn domain(resource: &str) -> &str {
    resource.split_once('/').map_or("", |(d, _)| d)
}

/// Pure reconciliation of a kubelet report against the served views.
///
/// Drift is judged only for resources that are "ours": in the plan, or in a domain the
/// plan serves (so `nvidia.com/mig-1g.10gb` still counts after a reload removed it, while
/// another vendor's resources are recorded but never called drift). Under [`Front::Dra`]
/// the kubelet's allocatable list is not compared with the plan.
pub(crate) fn reconcile(
    report: &KubeletReport,
    views: &[Arc<ResourceView>],
    rounds: u64,
    front: Front,
) -> LedgerSnapshot {
    let planned: BTreeMap<&str, &ResourceView> = views
        .iter()
        .map(|v| (v.resource.name.as_str(), v.as_ref()))
        .collect();
    let domains: BTreeSet<&str> = planned.keys().map(|r| domain(r)).collect();
    let ours = |r: &str| planned.contains_key(r) || domains.contains(domain(r));

    let mut allocations: BTreeMap<String, BTreeMap<String, Holder>> = BTreeMap::new();
    let mut drift = Vec::new();
    for (holder, resource, ids) in &report.assigned {
        for id in ids {
            allocations
                .entry(resource.clone())
                .or_default()
                .insert(id.clone(), holder.clone());
            if !ours(resource) {
                continue;
            }
            match planned.get(resource.as_str()).and_then(|v| v.get(id)) {
                None => drift.push(Drift::AllocatedNotPlanned {
                    resource: resource.clone(),
                    device: id.clone(),
                    holder: holder.clone(),
                }),
                Some((_, h)) if h.health == Health::Unhealthy => {
                    drift.push(Drift::AllocatedUnhealthy {
                        resource: resource.clone(),
                        device: id.clone(),
                        holder: holder.clone(),
                    });
                }
                Some(_) => {}
            }
        }
    }

    let kubelet_allocatable = match front {
        Front::DevicePlugin => allocatable_drift(&report.allocatable, &planned, &ours, &mut drift),
        Front::Dra => BTreeMap::new(),
    };
    drift.sort();
    LedgerSnapshot {
        up: true,
        rounds,
        failed_rounds: 0,
        allocations,
        kubelet_allocatable,
        drift,
        taken_at: None,
    }
}

/// The kubelet's allocatable devices of our resources, and the drift between them and the
/// plan (device-plugin mode).
fn allocatable_drift(
    allocatable: &[(String, Vec<String>)],
    planned: &BTreeMap<&str, &ResourceView>,
    ours: &dyn Fn(&str) -> bool,
    drift: &mut Vec<Drift>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut kubelet_allocatable: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (resource, ids) in allocatable {
        if ours(resource) {
            kubelet_allocatable
                .entry(resource.clone())
                .or_default()
                .extend(ids.iter().cloned());
        }
    }
    for (name, view) in planned {
        let empty = BTreeSet::new();
        let kubelet = kubelet_allocatable.get(*name).unwrap_or(&empty);
        // A kubelet may or may not list unhealthy devices as allocatable (the real one
        // does, the emulator does not): an extra ID is one we do not advertise at all, a
        // missing one is one we advertise as healthy.
        for id in kubelet {
            if view.get(id).is_none() {
                drift.push(Drift::KubeletExtra {
                    resource: (*name).to_string(),
                    device: id.clone(),
                });
            }
        }
        for (d, h) in view.devices() {
            if h.health == Health::Healthy && !kubelet.contains(&d.id) {
                drift.push(Drift::KubeletMissing {
                    resource: (*name).to_string(),
                    device: d.id.clone(),
                });
            }
        }
    }
    for (resource, ids) in &kubelet_allocatable {
        if !planned.contains_key(resource.as_str()) {
            drift.extend(ids.iter().map(|id| Drift::KubeletExtra {
                resource: resource.clone(),
                device: id.clone(),
            }));
        }
    }
    kubelet_allocatable
}
