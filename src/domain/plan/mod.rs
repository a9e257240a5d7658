//! Plan: the pure function `Inventory × Config → Plan`.
//!
//! A plan lists the Kubernetes extended resources this node advertises and, for each, the
//! allocatable devices the kubelet sees: whole GPUs (ID = GPU UUID), MIG devices (ID = MIG
//! UUID) and replicas (ID = `<uuid>::<n>`, NVIDIA's format). Every device records the
//! physical device behind it, the share it grants, its health and NUMA node. The device
//! plugin serves a plan, the CDI generator describes it, the allocator enforces it. No IO.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

use crate::domain::config::{
    Config, DeviceRef, DeviceSelector, Isolation, MigStrategy, SharedResource, SharingKind,
};
use crate::domain::inventory::{Gpu, Health, Inventory, MigDevice};

#[cfg(test)]
mod tests;

/// Resource name of whole GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Errors planning resources: the config asks for something this node cannot give.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
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
        "invalid config {path}: field `{field}.memory`: {replicas} replicas × {per_replica} bytes = {total} bytes exceeds the {available} bytes of {device}"
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
    /// Two resources end up with the same advertised name but different kinds.
    #[error("resource name {name} is produced twice ({first} and {second})")]
    NameClash {
        name: String,
        first: String,
        second: String,
    },
}

/// Result alias for this module.
pub type Result<T, E = PlanError> = std::result::Result<T, E>;

/// The physical device behind an allocatable device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Physical {
    /// `GPU-…` or `MIG-…`: the UUID the CDI spec names a device by.
    pub uuid: String,
    /// UUID of the GPU (the parent for MIG devices).
    pub gpu_uuid: String,
    /// Index of the GPU.
    pub gpu_index: u32,
    /// MIG position `j` of `i:j`, for MIG devices.
    pub mig_index: Option<u32>,
    /// MIG profile, for MIG devices.
    pub mig_profile: Option<String>,
}

impl Physical {
    /// Whether this is a MIG device.
    pub fn is_mig(&self) -> bool {
        self.mig_index.is_some()
    }

    /// NVIDIA's index form: `i` or `i:j`.
    pub fn index_name(&self) -> String {
        match self.mig_index {
            Some(j) => format!("{}:{j}", self.gpu_index),
            None => self.gpu_index.to_string(),
        }
    }
}

/// The share of its physical device an allocatable device grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Share {
    /// GPU memory in bytes.
    pub memory_bytes: u64,
    /// Compute as a percentage of the whole GPU (integer, rounded down as NVIDIA's MPS
    /// daemon setting is).
    pub compute_percent: u32,
}

/// Replica information of a shared device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replica {
    /// `n` of `<uuid>::<n>`.
    pub index: u32,
    /// Replicas of this physical device.
    pub of: u32,
}

/// One allocatable device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Kubelet device ID.
    pub id: String,
    /// Physical device behind it.
    pub physical: Physical,
    /// Set for replicas.
    pub replica: Option<Replica>,
    /// What it grants.
    pub share: Share,
    /// Health at planning time (the inventory's).
    pub health: Health,
    /// NUMA node of the GPU.
    pub numa_node: Option<i64>,
}

/// How a resource's devices are shared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sharing {
    /// Section the rule came from.
    pub kind: SharingKind,
    /// Isolation level.
    pub isolation: Isolation,
    /// Reject requests for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// Allow one request to take replicas on several GPUs.
    pub allow_multi_gpu: bool,
}

/// What kind of devices a resource holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ResourceKind {
    /// Whole GPUs (or their replicas).
    Gpu,
    /// MIG devices (or their replicas).
    Mig,
}

/// One advertised extended resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Resource {
    /// e.g. `nvidia.com/mig-1g.10gb`.
    pub name: String,
    /// Devices are whole GPUs or MIG devices.
    pub kind: ResourceKind,
    /// Set when the devices are replicas.
    pub sharing: Option<Sharing>,
    /// Devices sorted by ID.
    pub devices: Vec<Device>,
    /// Whole-GPU resources on a node with a topology: each device's GPU in it, for
    /// link-aware preferred allocation.
    #[serde(skip)]
    pub links: Option<Arc<crate::domain::topology::ResourceLinks>>,
}

impl Resource {
    /// Look up a device by kubelet ID.
    pub fn device(&self, id: &str) -> Option<&Device> {
        self.devices
            .binary_search_by(|d| d.id.as_str().cmp(id))
            .ok()
            .map(|i| &self.devices[i])
    }
}

/// The whole plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Resources sorted by name.
    pub resources: Vec<Resource>,
}

impl Plan {
    /// Look up a resource by name.
    pub fn resource(&self, name: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.name == name)
    }

    /// Every device of every resource.
    pub fn devices(&self) -> impl Iterator<Item = (&Resource, &Device)> {
        self.resources
            .iter()
            .flat_map(|r| r.devices.iter().map(move |d| (r, d)))
    }
}

/// A physical device that could be advertised, before sharing.
#[derive(Debug, Clone)]
struct Candidate<'a> {
    resource: String,
    kind: ResourceKind,
    gpu: &'a Gpu,
    mig: Option<&'a MigDevice>,
}

impl Candidate<'_> {
    fn physical(&self) -> Physical {
        Physical {
            uuid: self.mig.map_or(self.gpu.uuid.clone(), |m| m.uuid.clone()),
            gpu_uuid: self.gpu.uuid.clone(),
            gpu_index: self.gpu.index,
            mig_index: self.mig.map(|m| m.index),
            mig_profile: self.mig.map(|m| m.profile.clone()),
        }
    }

    fn memory(&self) -> u64 {
        self.mig.map_or(self.gpu.memory_bytes, |m| m.memory_bytes)
    }

    fn compute_percent(&self) -> u32 {
        match self.mig {
            None => 100,
            Some(m) if self.gpu.mig_compute_slices > 0 => {
                m.compute_slices * 100 / self.gpu.mig_compute_slices
            }
            Some(_) => 100,
        }
    }

    fn matches(&self, r: &DeviceRef) -> bool {
        match r {
            // A GPU index selects the GPU, or all of its MIG devices for a MIG resource.
            DeviceRef::Index(i) => self.gpu.index == *i,
            DeviceRef::MigIndex(i, j) => {
                self.gpu.index == *i && self.mig.is_some_and(|m| m.index == *j)
            }
            DeviceRef::Uuid(u) => match self.mig {
                None => self.gpu.uuid == *u,
                Some(m) => {
                    m.uuid == *u
                        || legacy_mig_uuid(self.gpu, m) == *u
                        // A GPU UUID selects all of that GPU's MIG devices too.
                        || self.gpu.uuid == *u
                }
            },
        }
    }

    fn matches_selector(&self, sel: &DeviceSelector) -> bool {
        match sel {
            DeviceSelector::All => true,
            DeviceSelector::Count(n) => self.gpu.index < *n,
            DeviceSelector::List(refs) => refs.iter().any(|r| self.matches(r)),
        }
    }
}

/// Old drivers' MIG id form, `MIG-GPU-<uuid>/<gi>/<ci>`.
fn legacy_mig_uuid(gpu: &Gpu, m: &MigDevice) -> String {
    format!(
        "MIG-{}/{}/{}",
        gpu.uuid, m.gpu_instance_id, m.compute_instance_id
    )
}

/// NVIDIA's MIG resource name: `nvidia.com/mig-<profile>` with `+` turned into `.`.
pub fn mig_resource_name(profile: &str) -> String {
    format!("nvidia.com/mig-{}", profile.replace('+', "."))
}

/// Why part of the config was left out of this node's plan. One ConfigMap serves a mixed
/// cluster, so, as NVIDIA's plugin does, an entry this node has nothing for is skipped
/// with a warning rather than failing the node; malformed entries stay errors (the config
/// module refuses them before planning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipReason {
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
    pub const ALL: [SkipReason; 3] = [
        SkipReason::ResourceNotOnNode,
        SkipReason::NoMatchingDevices,
        SkipReason::DeviceNotOnNode,
    ];

    /// Short code, as metric labels and logs use it.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::ResourceNotOnNode => "resource-not-on-node",
            SkipReason::NoMatchingDevices => "no-matching-devices",
            SkipReason::DeviceNotOnNode => "device-not-on-node",
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
pub struct Skipped {
    /// Config path, e.g. `sharing.timeSlicing.resources[0].name`.
    pub field: String,
    /// The value as the config wrote it.
    pub value: String,
    /// Why.
    pub reason: SkipReason,
    /// What the node has instead, for the log line (`nvidia.com/gpu`, `8 devices of …`).
    #[serde(skip)]
    pub node_has: String,
}

/// A plan and what of the config it left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Planned {
    /// The plan to serve.
    pub plan: Plan,
    /// Entries and references skipped on this node, in config order, for the caller to
    /// log. The daemon records them as
    /// `gpu_slicer_config_entries_skipped{reason}` ([`crate::runtime::metrics::Metrics::record_skipped`]).
    pub skipped: Vec<Skipped>,
}

/// Build the plan. Pure: the same inputs always give the same plan. Entries this node
/// has nothing for are skipped (see [`build_reporting`] for the list).
pub fn build(inv: &Inventory, cfg: &Config) -> Result<Plan> {
    build_reporting(inv, cfg).map(|p| p.plan)
}

/// Build the plan and say which config entries were skipped on this node (the caller logs
/// them: [`Skipped::node_has`] says what the node has instead).
pub fn build_reporting(inv: &Inventory, cfg: &Config) -> Result<Planned> {
    let candidates = candidates(inv, cfg)?;
    let path = || cfg.source.clone();
    let mut skipped: Vec<Skipped> = Vec::new();
    let mut skip = |field: String, value: String, reason: SkipReason, has: &str| {
        skipped.push(Skipped {
            field,
            value,
            reason,
            node_has: has.to_string(),
        });
    };

    // Which candidate each sharing entry takes, checking every reference resolves.
    let mut taken: BTreeMap<usize, usize> = BTreeMap::new(); // candidate -> sharing entry
    for (si, s) in cfg.sharing.iter().enumerate() {
        let of_resource: Vec<usize> = candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.resource == s.name)
            .map(|(i, _)| i)
            .collect();
        if of_resource.is_empty() {
            let available: BTreeSet<&str> =
                candidates.iter().map(|c| c.resource.as_str()).collect();
            let available = if available.is_empty() {
                "none".to_string()
            } else {
                available.into_iter().collect::<Vec<_>>().join(", ")
            };
            skip(
                format!("{}.name", s.field()),
                s.name.clone(),
                SkipReason::ResourceNotOnNode,
                &available,
            );
            continue;
        }
        if let DeviceSelector::List(refs) = &s.devices {
            for (ri, r) in refs.iter().enumerate() {
                if !of_resource.iter().any(|&i| candidates[i].matches(r)) {
                    skip(
                        format!("{}.devices[{ri}]", s.field()),
                        r.to_string(),
                        SkipReason::DeviceNotOnNode,
                        &format!("{} devices of {}", of_resource.len(), s.name),
                    );
                }
            }
        }
        let selected: Vec<usize> = of_resource
            .iter()
            .copied()
            .filter(|&i| candidates[i].matches_selector(&s.devices))
            .collect();
        if selected.is_empty() {
            // The per-reference entries above already name each reference; this one
            // says the whole entry is out.
            skip(
                format!("{}.devices", s.field()),
                s.devices.to_string(),
                SkipReason::NoMatchingDevices,
                &format!("{} devices of {}", of_resource.len(), s.name),
            );
            continue;
        }
        if s.advertised_name == s.name && selected.len() != of_resource.len() {
            return Err(PlanError::MixedResource {
                path: path(),
                field: s.field(),
                resource: s.name.clone(),
            });
        }
        for &ci in &selected {
            if let Some(&other) = taken.get(&ci) {
                return Err(PlanError::SharedTwice {
                    path: path(),
                    field: s.field(),
                    device: candidates[ci].physical().uuid,
                    other: cfg.sharing[other].field(),
                });
            }
            check_sharing_rules(s, &candidates[ci], cfg)?;
            taken.insert(ci, si);
        }
    }

    let mut resources: BTreeMap<String, Resource> = BTreeMap::new();
    for (ci, c) in candidates.iter().enumerate() {
        let physical = c.physical();
        let numa_node = c.gpu.numa_node;
        let (name, sharing, devices) = match taken.get(&ci).map(|&si| &cfg.sharing[si]) {
            None => (
                c.resource.clone(),
                None,
                vec![Device {
                    id: physical.uuid.clone(),
                    physical,
                    replica: None,
                    share: Share {
                        memory_bytes: c.memory(),
                        compute_percent: c.compute_percent(),
                    },
                    health: Health::Healthy,
                    numa_node,
                }],
            ),
            Some(s) => {
                let memory = s
                    .memory_per_replica
                    .unwrap_or(c.memory() / u64::from(s.replicas));
                let compute = c.compute_percent() / s.replicas;
                let devices = (0..s.replicas)
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
                        numa_node,
                    })
                    .collect();
                (
                    s.advertised_name.clone(),
                    Some(Sharing {
                        kind: s.kind,
                        isolation: s.isolation,
                        fail_requests_greater_than_one: s.fail_requests_greater_than_one,
                        allow_multi_gpu: s.allow_multi_gpu,
                    }),
                    devices,
                )
            }
        };
        let entry = resources.entry(name.clone()).or_insert_with(|| Resource {
            name: name.clone(),
            kind: c.kind,
            sharing: sharing.clone(),
            devices: Vec::new(),
            links: None,
        });
        if entry.kind != c.kind || entry.sharing.is_some() != sharing.is_some() {
            return Err(PlanError::NameClash {
                name,
                first: describe(entry.kind, entry.sharing.is_some()),
                second: describe(c.kind, sharing.is_some()),
            });
        }
        if let (Some(a), Some(b)) = (&entry.sharing, &sharing)
            && a != b
        {
            return Err(PlanError::Sharing {
                path: path(),
                field: "sharing".into(),
                message: format!(
                    "resource {name} is produced by entries with different sharing rules ({} vs {}); give them different names",
                    describe_sharing(a),
                    describe_sharing(b)
                ),
            });
        }
        entry.devices.extend(devices);
    }
    let mut resources: Vec<Resource> = resources.into_values().collect();
    for r in &mut resources {
        r.devices.sort_by(|a, b| a.id.cmp(&b.id));
        r.links = links_for(inv, r);
    }
    Ok(Planned {
        plan: Plan { resources },
        skipped,
    })
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

fn candidates<'a>(inv: &'a Inventory, cfg: &Config) -> Result<Vec<Candidate<'a>>> {
    let mut out = Vec::new();
    let whole = |gpu: &'a Gpu| Candidate {
        resource: GPU_RESOURCE.to_string(),
        kind: ResourceKind::Gpu,
        gpu,
        mig: None,
    };
    match cfg.mig_strategy {
        MigStrategy::None => out.extend(inv.gpus.iter().map(whole)),
        MigStrategy::Mixed => {
            for gpu in &inv.gpus {
                if gpu.mig_mode.current {
                    out.extend(gpu.mig_devices.iter().map(|m| Candidate {
                        resource: mig_resource_name(&m.profile),
                        kind: ResourceKind::Mig,
                        gpu,
                        mig: Some(m),
                    }));
                } else {
                    out.push(whole(gpu));
                }
            }
        }
        MigStrategy::Single => {
            let enabled: Vec<&Gpu> = inv.gpus.iter().filter(|g| g.mig_mode.current).collect();
            if enabled.is_empty() {
                out.extend(inv.gpus.iter().map(whole));
            } else {
                if let Some(g) = inv.gpus.iter().find(|g| !g.mig_mode.current) {
                    return Err(PlanError::SingleMixedModes {
                        path: cfg.source.clone(),
                        index: g.index,
                        uuid: g.uuid.clone(),
                    });
                }
                let profiles: BTreeSet<&str> =
                    inv.migs().map(|(_, m)| m.profile.as_str()).collect();
                if profiles.len() > 1 {
                    return Err(PlanError::SingleMixedProfiles {
                        path: cfg.source.clone(),
                        profiles: profiles.into_iter().collect::<Vec<_>>().join(", "),
                    });
                }
                out.extend(inv.migs().map(|(gpu, m)| Candidate {
                    resource: GPU_RESOURCE.to_string(),
                    kind: ResourceKind::Mig,
                    gpu,
                    mig: Some(m),
                }));
            }
        }
    }
    Ok(out)
}

/// How a new plan differs from the one being served, by resource name. A resource is
/// `changed` when anything the kubelet or Allocate sees differs (devices, their health at
/// discovery, sharing, kind); the daemon re-advertises only those and leaves `unchanged`
/// resources' sockets and streams alone.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct PlanDiff {
    /// In the new plan only: start serving.
    pub added: Vec<String>,
    /// In the old plan only: stop serving.
    pub removed: Vec<String>,
    /// In both, different: publish the new device list.
    pub changed: Vec<String>,
    /// In both, identical.
    pub unchanged: Vec<String>,
}

impl PlanDiff {
    /// Whether serving has to change at all.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// Compare two plans resource by resource (both are sorted by name, but this does not rely
/// on it).
pub fn diff(old: &Plan, new: &Plan) -> PlanDiff {
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
