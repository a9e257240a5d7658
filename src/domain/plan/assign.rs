//! Which devices each sharing entry takes. An entry's resource and `devices` are matched
//! against the node's candidates: what this node has nothing for is skipped (one ConfigMap
//! serves a mixed cluster, as with NVIDIA's plugin), what breaks a rule (a device shared
//! twice, a resource half shared, MPS client limits, memory over-subscribed) is an error
//! naming the entry.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::domain::config::{Config, DeviceSelector, SharedResource, SharingKind};

use super::candidate::Candidate;
use super::{PlanError, Result};

/// Why part of the config was left out of this node's plan. One ConfigMap serves a mixed
/// cluster, so, as NVIDIA's plugin does, an entry this node has nothing for is skipped
/// with a warning rather than failing the node; malformed entries stay errors (the config
/// module refuses them before planning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum SkipReason {
    /// The entry's `name` is a resource this node does not have (e.g. a MIG profile on a
    /// node without MIG): the whole entry is skipped.
    ResourceNotOnNode,
    /// The entry's `devices` select none of this node's devices: the whole entry is
    /// skipped.
    NoMatchingDevices,
    /// One reference in `devices` names no device here; the entry keeps the others.
    DeviceNotOnNode,
}

impl SkipReason {
    /// Every reason, for zero-valued metric series.
    pub(crate) const ALL: [SkipReason; 3] = [
        SkipReason::ResourceNotOnNode,
        SkipReason::NoMatchingDevices,
        SkipReason::DeviceNotOnNode,
    ];

    /// Short code, as metric labels and logs use it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SkipReason::ResourceNotOnNode => "resource-not-on-node",
            SkipReason::NoMatchingDevices => "no-matching-devices",
            SkipReason::DeviceNotOnNode => "device-not-on-node",
        }
    }
}

impl SkipReason {
    /// What the reason means for the entry, in words (`inventory` prints it).
    pub(crate) fn explain(self) -> &'static str {
        match self {
            SkipReason::ResourceNotOnNode => "this node has no such resource; the entry is skipped",
            SkipReason::NoMatchingDevices => {
                "none of the devices it names is on this node; the entry is skipped"
            }
            SkipReason::DeviceNotOnNode => "no such device on this node; the reference is skipped",
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A config entry (or one device reference of it) this node has nothing for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Skipped {
    /// Config path, e.g. `sharing.timeSlicing.resources[0].name`.
    pub(crate) field: String,
    /// The value as the config wrote it.
    pub(crate) value: String,
    /// Why.
    pub(crate) reason: SkipReason,
    /// What the node has instead, for the log line (`nvidia.com/gpu`, `8 devices of …`).
    #[serde(skip)]
    pub(crate) node_has: String,
}

/// Candidate index → index of the sharing entry that takes it.
pub(super) type Taken = BTreeMap<usize, usize>;

/// Which candidate each sharing entry takes, checking every reference resolves; and the
/// entries and references skipped on this node, in config order.
pub(super) fn assign(candidates: &[Candidate<'_>], cfg: &Config) -> Result<(Taken, Vec<Skipped>)> {
    let mut taken = Taken::new();
    let mut skipped = Vec::new();
    for (si, s) in cfg.sharing.iter().enumerate() {
        let Some(selection) = select(candidates, s, &mut skipped) else {
            continue;
        };
        if s.advertised_name == s.name && selection.selected.len() != selection.of_resource {
            return Err(PlanError::MixedResource {
                path: cfg.source.clone(),
                field: s.field(),
                resource: s.name.clone(),
            });
        }
        for ci in selection.selected {
            if let Some(&other) = taken.get(&ci) {
                return Err(PlanError::SharedTwice {
                    path: cfg.source.clone(),
                    field: s.field(),
                    device: candidates[ci].physical().uuid,
                    other: cfg.sharing[other].field(),
                });
            }
            check_sharing_rules(s, &candidates[ci], cfg)?;
            taken.insert(ci, si);
        }
    }
    Ok((taken, skipped))
}

/// The candidates an entry's `devices` select among those of its resource.
struct Selection {
    /// How many candidates the entry's resource has.
    of_resource: usize,
    /// Those selected, by candidate index.
    selected: Vec<usize>,
}

/// What `s` selects here; `None`, with the reason added to `skipped`, when it takes
/// nothing on this node. A reference that names no device here is skipped on its own.
fn select(
    candidates: &[Candidate<'_>],
    s: &SharedResource,
    skipped: &mut Vec<Skipped>,
) -> Option<Selection> {
    let mut skip = |field: String, value: String, reason: SkipReason, has: &str| {
        skipped.push(Skipped {
            field,
            value,
            reason,
            node_has: has.to_string(),
        });
    };
    let of_resource: Vec<usize> = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.resource == s.name)
        .map(|(i, _)| i)
        .collect();
    if of_resource.is_empty() {
        let available: BTreeSet<&str> = candidates.iter().map(|c| c.resource.as_str()).collect();
        let available = if available.is_empty() {
            "none".to_string()
        } else {
            available.into_iter().collect::<Vec<_>>().join(", ")
        };
        let field = format!("{}.name", s.field());
        skip(
            field,
            s.name.clone(),
            SkipReason::ResourceNotOnNode,
            &available,
        );
        return None;
    }
    let node_has = format!("{} devices of {}", of_resource.len(), s.name);
    if let DeviceSelector::List(refs) = &s.devices {
        for (ri, r) in refs.iter().enumerate() {
            if !of_resource.iter().any(|&i| candidates[i].matches(r)) {
                let field = format!("{}.devices[{ri}]", s.field());
                skip(field, r.to_string(), SkipReason::DeviceNotOnNode, &node_has);
            }
        }
    }
    let selected: Vec<usize> = of_resource
        .iter()
        .copied()
        .filter(|&i| candidates[i].matches_selector(&s.devices))
        .collect();
    if selected.is_empty() {
        // The per-reference entries above already name each reference; this one says the
        // whole entry is out.
        let field = format!("{}.devices", s.field());
        skip(
            field,
            s.devices.to_string(),
            SkipReason::NoMatchingDevices,
            &node_has,
        );
        return None;
    }
    Some(Selection {
        of_resource: of_resource.len(),
        selected,
    })
}

/// The rules of the sharing mode on one device: MPS client limits, driver memory limits
/// not on MIG, per-replica memory within the device.
fn check_sharing_rules(s: &SharedResource, c: &Candidate<'_>, cfg: &Config) -> Result<()> {
    let path = cfg.source.clone();
    if s.kind == SharingKind::Mps || s.isolation.uses_mps() {
        // MPS supports at most 48 clients per device on Volta+ (16 before), as NVIDIA's
        // plugin enforces.
        let (major, minor) = c
            .gpu
            .compute_capability
            .split_once('.')
            .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
            .unwrap_or((8, 0));
        let max = if (major, minor) >= (7, 5) { 48 } else { 16 };
        if s.replicas > max {
            return Err(PlanError::Sharing {
                path,
                field: format!("{}.replicas", s.field()),
                message: format!(
                    "MPS allows at most {max} clients on {} (compute capability {major}.{minor}); asked for {}",
                    c.gpu.uuid, s.replicas
                ),
            });
        }
    }
    if s.isolation.uses_memory_limit() && c.mig.is_some() {
        // nvmlDeviceSetMemoryLimits_v1 rejects MIG handles: the share could not bind.
        return Err(PlanError::Sharing {
            path,
            field: format!("{}.isolation", s.field()),
            message: format!(
                "`{}` needs driver memory limits, which NVIDIA does not support on MIG devices ({}); use `mps` (pinned-memory limit per client) or `none`",
                s.isolation.as_str(),
                c.physical().uuid
            ),
        });
    }
    if let Some(per) = s.memory_per_replica {
        let total = per.saturating_mul(u64::from(s.replicas));
        if total > c.memory() {
            return Err(PlanError::OverSubscribed {
                path,
                field: s.field(),
                replicas: s.replicas,
                per_replica: per,
                total,
                available: c.memory(),
                device: c.physical().uuid,
            });
        }
    }
    Ok(())
}
