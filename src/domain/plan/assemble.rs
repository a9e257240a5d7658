//! The resources a plan advertises: each candidate becomes one device (or its replicas)
//! under its resource's name; candidates that come out under one name must agree on kind
//! and sharing rules. Sorted by name and device ID, with topology links for whole-GPU
//! resources.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::domain::config::{Config, SharedResource};
use crate::domain::inventory::{Health, Inventory};

use super::assign::Taken;
use super::candidate::Candidate;
use super::{Device, PlanError, Replica, Resource, ResourceKind, Result, Share, Sharing};

/// The plan's resources: the candidates, shared as `taken` says.
pub(super) fn assemble(
    inv: &Inventory,
    cfg: &Config,
    candidates: &[Candidate<'_>],
    taken: &Taken,
) -> Result<Vec<Resource>> {
    let mut resources: BTreeMap<String, Resource> = BTreeMap::new();
    for (ci, c) in candidates.iter().enumerate() {
        let (name, sharing, devices) = match taken.get(&ci).map(|&si| &cfg.sharing[si]) {
            None => (c.resource.clone(), None, vec![whole(c)]),
            Some(s) => (
                s.advertised_name.clone(),
                Some(Sharing {
                    kind: s.kind,
                    isolation: s.isolation,
                    fail_requests_greater_than_one: s.fail_requests_greater_than_one,
                    allow_multi_gpu: s.allow_multi_gpu,
                }),
                replicas(c, s),
            ),
        };
        add(&mut resources, cfg, name, c.kind, sharing, devices)?;
    }
    let mut resources: Vec<Resource> = resources.into_values().collect();
    for r in &mut resources {
        r.devices.sort_by(|a, b| a.id.cmp(&b.id));
        r.links = links_for(inv, r);
    }
    Ok(resources)
}

/// An unshared candidate: one device, the whole of it.
fn whole(c: &Candidate<'_>) -> Device {
    let physical = c.physical();
    Device {
        id: physical.uuid.clone(),
        physical,
        replica: None,
        share: Share {
            memory_bytes: c.memory(),
            compute_percent: c.compute_percent(),
        },
        health: Health::Healthy,
        numa_node: c.gpu.numa_node,
    }
}

/// A shared candidate: `<uuid>::<n>` replicas, each with its part (the entry's `memory`, or
/// an even split).
fn replicas(c: &Candidate<'_>, s: &SharedResource) -> Vec<Device> {
    let physical = c.physical();
    let memory = s
        .memory_per_replica
        .unwrap_or(c.memory() / u64::from(s.replicas));
    let compute = c.compute_percent() / s.replicas;
    (0..s.replicas)
        .map(|n| Device {
            id: format!("{}::{n}", physical.uuid),
            physical: physical.clone(),
            replica: Some(Replica {
                index: n,
                of: s.replicas,
            }),
            share: Share {
                memory_bytes: memory,
                compute_percent: compute,
            },
            health: Health::Healthy,
            numa_node: c.gpu.numa_node,
        })
        .collect()
}

/// Add a candidate's devices to the resource `name`, which must hold the same kind of
/// devices shared by the same rules.
fn add(
    resources: &mut BTreeMap<String, Resource>,
    cfg: &Config,
    name: String,
    kind: ResourceKind,
    sharing: Option<Sharing>,
    devices: Vec<Device>,
) -> Result<()> {
    let entry = resources.entry(name.clone()).or_insert_with(|| Resource {
        name: name.clone(),
        kind,
        sharing: sharing.clone(),
        devices: Vec::new(),
        links: None,
    });
    if entry.kind != kind || entry.sharing.is_some() != sharing.is_some() {
        return Err(PlanError::NameClash {
            name,
            first: describe(entry.kind, entry.sharing.is_some()),
            second: describe(kind, sharing.is_some()),
        });
    }
    if let (Some(a), Some(b)) = (&entry.sharing, &sharing)
        && a != b
    {
        return Err(PlanError::Sharing {
            path: cfg.source.clone(),
            field: "sharing".into(),
            message: format!(
                "resource {name} is produced by entries with different sharing rules ({} vs {}); give them different names",
                describe_sharing(a),
                describe_sharing(b)
            ),
        });
    }
    entry.devices.extend(devices);
    Ok(())
}

/// A sharing rule in config words, for messages.
fn describe_sharing(s: &Sharing) -> String {
    format!(
        "{} with isolation `{}`, failRequestsGreaterThanOne: {}, allowMultiGpu: {}",
        s.kind.field(),
        s.isolation.as_str(),
        s.fail_requests_greater_than_one,
        s.allow_multi_gpu
    )
}

/// What a resource holds, for messages.
fn describe(kind: ResourceKind, shared: bool) -> String {
    let k = match kind {
        ResourceKind::Gpu => "whole GPUs",
        ResourceKind::Mig => "MIG devices",
    };
    if shared {
        format!("replicas of {k}")
    } else {
        k.to_string()
    }
}

/// Each whole-GPU device's position in the node's topology (MIG resources keep their
/// topology-free placement).
fn links_for(inv: &Inventory, r: &Resource) -> Option<Arc<crate::domain::topology::ResourceLinks>> {
    let topology = inv.topology.as_ref()?;
    if r.kind != ResourceKind::Gpu || topology.len() < 2 {
        return None;
    }
    let slot = r
        .devices
        .iter()
        .map(|d| {
            inv.gpu(&d.physical.gpu_uuid)
                .and_then(|g| topology.position(&g.pci_bus_id))
        })
        .collect();
    Some(Arc::new(crate::domain::topology::ResourceLinks {
        topology: Arc::new(topology.clone()),
        slot,
    }))
}
