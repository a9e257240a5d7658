//! Usage attribution: who uses what on the node, as pure functions over one sample.
//!
//! Fed by the platform readers (`crate::platform::usage`: an NVML or sim [`Sample`], the
//! `<proc-root>/<pid>/cgroup` texts, the kubelet's device-manager checkpoint text) and by one
//! state snapshot and one ledger snapshot; used by the usage sampler (`crate::runtime::usage`),
//! which publishes the [`UsageReport`] to the metrics and to `GET /v1/state`.
//!
//! The join, per process: pid → cgroup path → pod UID ([`parse_cgroup`], systemd and cgroupfs
//! drivers, cgroup v1 and v2) → the checkpoint entries of that pod whose device IDs sit on
//! the process's device ([`parse_checkpoint`]: pod UID, container name, resource, device IDs)
//! → the PodResources holder of those device IDs (namespace, pod, container). A process that
//! falls out of any step is counted by reason ([`Unattributed`]), never dropped.
//!
//! Here: samples, attribution, idleness, what is placeable. The two parsers live in
//! `cgroup` and `checkpoint`, the report of a round in `report`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::domain::allocate::ResourceView;
use crate::domain::inventory::Health;

mod cgroup;
mod checkpoint;
mod report;

#[cfg(test)]
pub(crate) use cgroup::PodCgroup;
pub(crate) use cgroup::parse_cgroup;
pub(crate) use checkpoint::{CheckpointEntry, parse_checkpoint};
pub(crate) use report::{
    DraReport, PreparedClaimReport, PreparedDeviceReport, ReportInputs, ShareReport,
    TopologyReport, UsageReport, report,
};

/// Errors of the usage domain.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UsageError {
    /// The device-manager checkpoint is not the kubelet's format.
    #[error("invalid kubelet checkpoint {path}: {message}")]
    Checkpoint { path: String, message: String },
}

// ------------------------------------------------------------------------------ samples

/// What kind of device a figure is for (`kind` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DeviceKind {
    /// A whole GPU.
    Gpu,
    /// A MIG device.
    Mig,
}

/// One device's figures in a sample.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeviceSample {
    /// GPU or MIG UUID.
    pub(crate) uuid: String,
    /// GPU or MIG device.
    pub(crate) kind: DeviceKind,
    /// Utilisation 0–1; `None` where NVML reports none (MIG devices, GPUs in MIG mode).
    pub(crate) utilization: Option<f64>,
    /// Memory in use, bytes.
    pub(crate) memory_used: u64,
    /// Memory the device has, bytes.
    pub(crate) memory_total: u64,
}

/// One process with a compute context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcessSample {
    /// Host pid.
    pub(crate) pid: u32,
    /// UUID of the device it runs on: the MIG device on a GPU in MIG mode, else the GPU.
    pub(crate) device: String,
    /// GPU memory it uses, bytes (`None`: the driver does not say).
    pub(crate) memory_used: Option<u64>,
}

/// Everything one sampling round read from the GPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Sample {
    /// GPUs and MIG devices.
    pub(crate) devices: Vec<DeviceSample>,
    /// Compute processes on any of them.
    pub(crate) processes: Vec<ProcessSample>,
}

// ---------------------------------------------------------------------------- attribution

/// Who holds a share, from the PodResources ledger.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct Holder {
    /// Pod namespace.
    pub(crate) namespace: String,
    /// Pod name.
    pub(crate) pod: String,
    /// Container name.
    pub(crate) container: String,
}

/// A share: the devices of one resource one container holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ShareKey {
    /// Extended resource name.
    pub(crate) resource: String,
    /// The container holding it.
    pub(crate) holder: Holder,
}

/// Why a process could not be given to a share (`reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Unattributed {
    /// `<proc-root>/<pid>/cgroup` could not be read (the process ended, or the proc root is
    /// not the host's).
    NoCgroup,
    /// The cgroup is not a Kubernetes pod's (a host process, a Podman container).
    NotAPod,
    /// The pod has no checkpoint entry with a device on the process's device.
    NoCheckpointEntry,
    /// Several containers of the pod hold devices there; the cgroup cannot tell which.
    Ambiguous,
    /// PodResources does not (yet) report the holder of those devices.
    NoHolder,
}

impl Unattributed {
    /// Every reason, for zero-valued series.
    pub(crate) const ALL: [Self; 5] = [
        Self::NoCgroup,
        Self::NotAPod,
        Self::NoCheckpointEntry,
        Self::Ambiguous,
        Self::NoHolder,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::NoCgroup => "no-cgroup",
            Self::NotAPod => "not-a-pod",
            Self::NoCheckpointEntry => "no-checkpoint-entry",
            Self::Ambiguous => "ambiguous",
            Self::NoHolder => "no-holder",
        }
    }
}

/// A share's figures on one physical device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ShareOnDevice {
    /// The held device IDs on this physical device.
    pub(crate) device_ids: Vec<String>,
    /// Memory its processes use here, bytes.
    pub(crate) memory_used: u64,
    /// Memory the held devices grant here, bytes.
    pub(crate) memory_granted: u64,
    /// Its processes here.
    pub(crate) pids: Vec<u32>,
}

/// One share's figures in a sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ShareUsage {
    /// Physical UUID → the share there.
    pub(crate) on: BTreeMap<String, ShareOnDevice>,
    /// The holder had a compute process, or a whole GPU it holds alone was busy.
    pub(crate) busy: bool,
}

impl ShareUsage {
    #[cfg(test)]
    /// Memory used over every device, bytes.
    pub(crate) fn memory_used(&self) -> u64 {
        self.on.values().map(|d| d.memory_used).sum()
    }

    #[cfg(test)]
    /// Memory granted over every device, bytes.
    pub(crate) fn memory_granted(&self) -> u64 {
        self.on.values().map(|d| d.memory_granted).sum()
    }

    /// Held device IDs.
    pub(crate) fn device_count(&self) -> usize {
        self.on.values().map(|d| d.device_ids.len()).sum()
    }
}

/// What attribution needs besides the sample.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inputs<'a> {
    /// The GPU figures.
    pub(crate) sample: &'a Sample,
    /// pid → the text of its cgroup file (`None`: unreadable).
    pub(crate) cgroups: &'a BTreeMap<u32, Option<String>>,
    /// The device manager's checkpoint.
    pub(crate) checkpoint: &'a [CheckpointEntry],
    /// resource → device ID → holder (PodResources).
    pub(crate) holders: &'a BTreeMap<String, BTreeMap<String, Holder>>,
    /// The served resources (plan × health).
    pub(crate) views: &'a BTreeMap<String, Arc<ResourceView>>,
}

/// The outcome of one attribution.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Attribution {
    /// Every share the ledger reports for a served resource, with or without processes.
    pub(crate) shares: BTreeMap<ShareKey, ShareUsage>,
    /// Processes no share could be found for, by reason.
    pub(crate) unattributed: BTreeMap<Unattributed, u64>,
}

/// Give every process of the sample to the share it runs on.
pub(crate) fn attribute(inputs: &Inputs<'_>) -> Attribution {
    let mut shares: BTreeMap<ShareKey, ShareUsage> = BTreeMap::new();
    // Every held device of a served resource makes (or extends) its holder's share.
    for (resource, devices) in inputs.holders {
        let Some(view) = inputs.views.get(resource) else {
            continue;
        };
        for (id, holder) in devices {
            let Some(device) = view.resource.device(id) else {
                continue;
            };
            let share = shares
                .entry(ShareKey {
                    resource: resource.clone(),
                    holder: holder.clone(),
                })
                .or_default();
            let on = share.on.entry(device.physical.uuid.clone()).or_default();
            on.device_ids.push(id.clone());
            on.memory_granted += device.share.memory_bytes;
        }
    }
    let mut unattributed = BTreeMap::new();
    for p in &inputs.sample.processes {
        match share_of(inputs, p) {
            Ok(key) => {
                let share = shares.entry(key).or_default();
                share.busy = true;
                let on = share.on.entry(p.device.clone()).or_default();
                on.memory_used += p.memory_used.unwrap_or(0);
                on.pids.push(p.pid);
            }
            Err(reason) => *unattributed.entry(reason).or_insert(0) += 1,
        }
    }
    // A whole GPU held by one container: its utilisation is that container's compute.
    let busy_devices: BTreeSet<&str> = inputs
        .sample
        .devices
        .iter()
        .filter(|d| d.utilization.is_some_and(|u| u > 0.0))
        .map(|d| d.uuid.as_str())
        .collect();
    for (key, share) in &mut shares {
        let whole = inputs.views.get(&key.resource).is_some_and(|v| {
            share.on.values().flat_map(|d| &d.device_ids).all(|id| {
                v.resource
                    .device(id)
                    .is_some_and(|d| d.replica.is_none() && !d.physical.is_mig())
            })
        });
        if whole && share.on.keys().any(|u| busy_devices.contains(u.as_str())) {
            share.busy = true;
        }
    }
    Attribution {
        shares,
        unattributed,
    }
}

fn share_of(inputs: &Inputs<'_>, p: &ProcessSample) -> Result<ShareKey, Unattributed> {
    let text = inputs
        .cgroups
        .get(&p.pid)
        .and_then(Option::as_deref)
        .ok_or(Unattributed::NoCgroup)?;
    let pod = parse_cgroup(text).ok_or(Unattributed::NotAPod)?;
    // Entries of this pod with a device on the process's device.
    let on_device = |e: &&CheckpointEntry| {
        inputs.views.get(&e.resource).is_some_and(|v| {
            e.device_ids.iter().any(|id| {
                v.resource
                    .device(id)
                    .is_some_and(|d| d.physical.uuid == p.device)
            })
        })
    };
    let entries: Vec<&CheckpointEntry> = inputs
        .checkpoint
        .iter()
        .filter(|e| e.pod_uid == pod.pod_uid)
        .filter(on_device)
        .collect();
    let first = entries.first().ok_or(Unattributed::NoCheckpointEntry)?;
    if entries
        .iter()
        .any(|e| e.container != first.container || e.resource != first.resource)
    {
        return Err(Unattributed::Ambiguous);
    }
    let holder = first
        .device_ids
        .iter()
        .find_map(|id| inputs.holders.get(&first.resource)?.get(id))
        .filter(|h| h.container == first.container)
        .ok_or(Unattributed::NoHolder)?;
    Ok(ShareKey {
        resource: first.resource.clone(),
        holder: holder.clone(),
    })
}

// ------------------------------------------------------------------------------ idleness

/// Remembers, per share, since when it is held and when it was last busy.
#[derive(Debug, Default)]
pub(crate) struct IdleTracker {
    seen: HashMap<ShareKey, (Instant, Option<Instant>)>,
}

impl IdleTracker {
    /// Record one attribution taken at `now`; return the shares idle for at least `window`
    /// (held that long, and no process or compute seen in it). Shares no longer held are
    /// forgotten.
    pub(crate) fn observe(
        &mut self,
        shares: &BTreeMap<ShareKey, ShareUsage>,
        now: Instant,
        window: Duration,
    ) -> BTreeSet<ShareKey> {
        self.seen.retain(|k, _| shares.contains_key(k));
        let mut idle = BTreeSet::new();
        for (key, usage) in shares {
            let entry = self.seen.entry(key.clone()).or_insert((now, None));
            if usage.busy {
                entry.1 = Some(now);
            }
            let since = entry.1.unwrap_or(entry.0);
            if now.saturating_duration_since(since) >= window && !usage.busy {
                idle.insert(key.clone());
            }
        }
        idle
    }
}

// ------------------------------------------------------------------------------ capacity

/// How many requests of each size (1 … the replica count) can still be placed on one
/// physical device: each device's free healthy units, divided by the size, rounded down,
/// summed. Two GPUs with 2 free replicas each place two requests of 2 and none of 4.
pub(crate) fn placeable(view: &ResourceView, allocated: &BTreeSet<String>) -> Vec<(u32, u64)> {
    let mut free: BTreeMap<&str, u64> = BTreeMap::new();
    let mut max = 1u32;
    for (d, h) in view.devices() {
        max = max.max(d.replica.map_or(1, |r| r.of));
        let slot = free.entry(d.physical.uuid.as_str()).or_insert(0);
        if h.health == Health::Healthy && !allocated.contains(&d.id) {
            *slot += 1;
        }
    }
    (1..=max)
        .map(|size| {
            let n = free.values().map(|f| f / u64::from(size)).sum();
            (size, n)
        })
        .collect()
}

#[cfg(test)]
mod tests;
