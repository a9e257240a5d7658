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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::domain::allocate::ResourceView;
use crate::domain::inventory::{Health, Inventory};

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

// ------------------------------------------------------------------------------- cgroups

/// The pod (and container) a cgroup path belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodCgroup {
    /// Pod UID with dashes (`5f1c…-…`), as the kubelet's checkpoint writes it.
    pub(crate) pod_uid: String,
    /// Container ID (runtime prefix stripped), when the path goes down to the container.
    pub(crate) container_id: Option<String>,
}

fn is_uid(s: &str) -> bool {
    (8..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

fn is_container_id(s: &str) -> bool {
    (12..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The pod UID a path segment names: systemd `kubepods[-<qos>]-pod<uid_with_underscores>.slice`
/// or cgroupfs `pod<uid>` (below a `kubepods` segment).
fn pod_segment(seg: &str, below_kubepods: bool) -> Option<String> {
    if let Some(slice) = seg.strip_suffix(".slice") {
        if !slice.starts_with("kubepods") {
            return None;
        }
        let (_, uid) = slice.rsplit_once("-pod")?;
        let uid = uid.replace('_', "-");
        return is_uid(&uid).then_some(uid);
    }
    let uid = seg.strip_prefix("pod")?;
    (below_kubepods && is_uid(uid)).then(|| uid.to_string())
}

/// The container ID a segment below the pod names: systemd `<runtime>-<id>.scope`
/// (`cri-containerd-`, `crio-`, `docker-`) or cgroupfs `<id>`. CRI-O's `crio-conmon-<id>`
/// is the monitor, not the container.
fn container_segment(seg: &str) -> Option<String> {
    let id = match seg.strip_suffix(".scope") {
        Some(scope) => {
            if scope.contains("conmon") {
                return None;
            }
            scope.rsplit_once('-').map_or(scope, |(_, id)| id)
        }
        None => seg,
    };
    is_container_id(id).then(|| id.to_string())
}

fn parse_cgroup_path(path: &str) -> Option<PodCgroup> {
    let mut below_kubepods = false;
    let mut segments = path.split('/').filter(|s| !s.is_empty());
    for seg in segments.by_ref() {
        if let Some(pod_uid) = pod_segment(seg, below_kubepods) {
            let container_id = segments.next().and_then(container_segment);
            return Some(PodCgroup {
                pod_uid,
                container_id,
            });
        }
        below_kubepods |= seg == "kubepods" || seg.starts_with("kubepods");
    }
    None
}

/// Parse `/proc/<pid>/cgroup` (v2 `0::<path>`, or v1's one line per hierarchy
/// `<id>:<controllers>:<path>`) into the pod it belongs to. The first line that names a pod
/// and a container wins, else the first that names a pod; `None`: not a pod's process.
pub(crate) fn parse_cgroup(text: &str) -> Option<PodCgroup> {
    let mut pod_only = None;
    for line in text.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        match parse_cgroup_path(path) {
            Some(p) if p.container_id.is_some() => return Some(p),
            Some(p) => {
                pod_only.get_or_insert(p);
            }
            None => {}
        }
    }
    pod_only
}

// ---------------------------------------------------------------------------- checkpoint

/// One device-manager checkpoint entry: devices of one resource held by one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckpointEntry {
    /// Pod UID.
    pub(crate) pod_uid: String,
    /// Container name.
    pub(crate) container: String,
    /// Extended resource name.
    pub(crate) resource: String,
    /// Device IDs (every NUMA node's, merged).
    pub(crate) device_ids: Vec<String>,
}

#[derive(Deserialize)]
struct CheckpointFile {
    #[serde(rename = "Data")]
    data: CheckpointData,
    // `Checksum` is not verified: the kubelet checks it on its own reads; this reader only
    // looks, and a torn or foreign file fails to parse anyway.
}

#[derive(Deserialize)]
struct CheckpointData {
    // Go writes a nil slice as `null`.
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Option<Vec<RawEntry>>,
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName")]
    container: String,
    #[serde(rename = "ResourceName")]
    resource: String,
    #[serde(rename = "DeviceIDs", default)]
    device_ids: Option<RawDeviceIds>,
}

/// Kubelet ≥ 1.20 keys device IDs by NUMA node (`{"0": [...], "-1": [...]}`); older kubelets
/// wrote a plain list.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawDeviceIds {
    PerNuma(BTreeMap<String, Option<Vec<String>>>),
    Flat(Vec<String>),
}

/// Parse the kubelet's `kubelet_internal_checkpoint` (device manager). Entries are sorted
/// and their device IDs deduplicated; `origin` names the file in errors.
pub(crate) fn parse_checkpoint(
    text: &str,
    origin: &str,
) -> Result<Vec<CheckpointEntry>, UsageError> {
    let file: CheckpointFile = serde_json::from_str(text).map_err(|e| UsageError::Checkpoint {
        path: origin.to_string(),
        message: e.to_string(),
    })?;
    let mut out: Vec<CheckpointEntry> = file
        .data
        .entries
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            let ids: BTreeSet<String> = match e.device_ids {
                None => BTreeSet::new(),
                Some(RawDeviceIds::Flat(v)) => v.into_iter().collect(),
                Some(RawDeviceIds::PerNuma(m)) => m.into_values().flatten().flatten().collect(),
            };
            CheckpointEntry {
                pod_uid: e.pod_uid,
                container: e.container,
                resource: e.resource,
                device_ids: ids.into_iter().collect(),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.pod_uid, &a.container, &a.resource).cmp(&(&b.pod_uid, &b.container, &b.resource))
    });
    Ok(out)
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

// -------------------------------------------------------------------------------- report

/// Memory figures of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MemoryReport {
    /// Bytes in use.
    pub(crate) used_bytes: u64,
    /// Bytes the device has.
    pub(crate) total_bytes: u64,
}

/// A share as `/v1/state` shows it under one physical device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ShareReport {
    /// Extended resource name.
    pub(crate) resource: String,
    /// Held device IDs on this device.
    pub(crate) devices: Vec<String>,
    /// Who holds it.
    pub(crate) holder: Holder,
    /// Memory its processes use here.
    pub(crate) memory_used_bytes: u64,
    /// Memory its devices grant here.
    pub(crate) memory_granted_bytes: u64,
    /// Held for the idle window without a process or compute.
    pub(crate) idle: bool,
    /// Its processes here.
    pub(crate) pids: Vec<u32>,
}

/// A MIG device in `/v1/state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MigReport {
    /// MIG UUID.
    pub(crate) uuid: String,
    /// Profile (`1g.10gb`).
    pub(crate) profile: String,
    /// Memory (absent until sampled).
    pub(crate) memory: Option<MemoryReport>,
    /// Shares on it.
    pub(crate) shares: Vec<ShareReport>,
}

/// A GPU in `/v1/state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GpuReport {
    /// NVML index.
    pub(crate) index: u32,
    /// GPU UUID.
    pub(crate) uuid: String,
    /// Product name.
    pub(crate) product: String,
    /// Utilisation 0–1; `null` in MIG mode (NVML reports none there) or before a sample.
    pub(crate) utilization: Option<f64>,
    /// Memory (absent until sampled).
    pub(crate) memory: Option<MemoryReport>,
    /// Its MIG devices.
    pub(crate) mig_devices: Vec<MigReport>,
    /// Shares of the whole GPU (time-sliced replicas, the GPU itself).
    pub(crate) shares: Vec<ShareReport>,
}

/// Requests of `size` that still fit on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PlaceableReport {
    /// Extended resource name.
    pub(crate) resource: String,
    /// Replicas per request.
    pub(crate) size: u32,
    /// How many such requests fit.
    pub(crate) count: u64,
}

/// The node's usage as one document: `GET /v1/state`, `gpu-slicer top`, the metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UsageReport {
    /// Generation of the state snapshot it was computed against.
    pub(crate) generation: u64,
    /// When the sample was taken, Unix milliseconds (0: never).
    pub(crate) sampled_at_ms: u64,
    /// The sampling interval, seconds.
    pub(crate) interval_seconds: f64,
    /// The idle window, seconds.
    pub(crate) idle_window_seconds: f64,
    /// Why the last sample failed, if it did (the figures are then the previous ones').
    pub(crate) error: Option<String>,
    /// GPUs by index.
    pub(crate) gpus: Vec<GpuReport>,
    /// Idle shares (held devices) per resource; every served resource is listed.
    pub(crate) idle_shares: BTreeMap<String, u64>,
    /// Placeable requests per resource and size.
    pub(crate) placeable: Vec<PlaceableReport>,
    /// Processes no share could be found for, by reason; every reason is listed.
    pub(crate) unattributed_processes: BTreeMap<String, u64>,
    /// The GPU-pair topology read at discovery, when the backend read one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) topology: Option<TopologyReport>,
}

/// The node's GPU-pair topology as `nvidia-smi topo -m` cells.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TopologyReport {
    /// The GPUs, in NVML index order: the matrix's rows and columns.
    pub(crate) gpus: Vec<TopologyGpuReport>,
    /// `X`, `NV#`, `PIX`, `PXB`, `PHB`, `NODE` or `SYS` per (row, column).
    pub(crate) matrix: Vec<Vec<String>>,
}

/// One GPU of a [`TopologyReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TopologyGpuReport {
    /// NVML index.
    pub(crate) index: u32,
    /// PCI bus ID.
    pub(crate) pci_bus_id: String,
    /// NUMA node, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) numa_node: Option<i64>,
}

impl TopologyReport {
    /// The report of a topology.
    pub(crate) fn new(t: &crate::domain::topology::Topology) -> Self {
        let mut gpus: Vec<TopologyGpuReport> = t
            .gpus
            .iter()
            .map(|g| TopologyGpuReport {
                index: g.index,
                pci_bus_id: g.pci_bus_id.clone(),
                numa_node: g.numa_node,
            })
            .collect();
        gpus.sort_by_key(|g| g.index);
        Self {
            gpus,
            matrix: t.matrix.clone(),
        }
    }
}

/// Everything [`report`] combines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReportInputs<'a> {
    /// Snapshot generation.
    pub(crate) generation: u64,
    /// Unix ms of the sample.
    pub(crate) sampled_at_ms: u64,
    /// Sampling interval.
    pub(crate) interval: Duration,
    /// Idle window.
    pub(crate) idle_window: Duration,
    /// The inventory of the snapshot.
    pub(crate) inventory: &'a Inventory,
    /// The served resources of the snapshot.
    pub(crate) views: &'a BTreeMap<String, Arc<ResourceView>>,
    /// The sample.
    pub(crate) sample: &'a Sample,
    /// Its attribution.
    pub(crate) attribution: &'a Attribution,
    /// Shares idle for the window.
    pub(crate) idle: &'a BTreeSet<ShareKey>,
    /// resource → allocated device IDs (ledger, else the devices Allocate handed out).
    pub(crate) allocated: &'a BTreeMap<String, BTreeSet<String>>,
}

/// Build the report.
pub(crate) fn report(i: &ReportInputs<'_>) -> UsageReport {
    let figures: HashMap<&str, &DeviceSample> = i
        .sample
        .devices
        .iter()
        .map(|d| (d.uuid.as_str(), d))
        .collect();
    let memory = |uuid: &str| {
        figures.get(uuid).map(|d| MemoryReport {
            used_bytes: d.memory_used,
            total_bytes: d.memory_total,
        })
    };
    let shares_on = |uuid: &str| -> Vec<ShareReport> {
        i.attribution
            .shares
            .iter()
            .filter_map(|(key, usage)| {
                let on = usage.on.get(uuid)?;
                Some(ShareReport {
                    resource: key.resource.clone(),
                    devices: on.device_ids.clone(),
                    holder: key.holder.clone(),
                    memory_used_bytes: on.memory_used,
                    memory_granted_bytes: on.memory_granted,
                    idle: i.idle.contains(key),
                    pids: on.pids.clone(),
                })
            })
            .collect()
    };
    let gpus = i
        .inventory
        .gpus
        .iter()
        .map(|g| GpuReport {
            index: g.index,
            uuid: g.uuid.clone(),
            product: g.product.clone(),
            utilization: figures.get(g.uuid.as_str()).and_then(|d| d.utilization),
            memory: memory(&g.uuid),
            mig_devices: g
                .mig_devices
                .iter()
                .map(|m| MigReport {
                    uuid: m.uuid.clone(),
                    profile: m.profile.clone(),
                    memory: memory(&m.uuid),
                    shares: shares_on(&m.uuid),
                })
                .collect(),
            shares: shares_on(&g.uuid),
        })
        .collect();
    let mut idle_shares: BTreeMap<String, u64> = i.views.keys().map(|r| (r.clone(), 0)).collect();
    for key in i.idle {
        if let (Some(n), Some(usage)) = (
            idle_shares.get_mut(&key.resource),
            i.attribution.shares.get(key),
        ) {
            *n += usage.device_count() as u64;
        }
    }
    let empty = BTreeSet::new();
    let placeable = i
        .views
        .iter()
        .flat_map(|(name, view)| {
            placeable(view, i.allocated.get(name).unwrap_or(&empty))
                .into_iter()
                .map(|(size, count)| PlaceableReport {
                    resource: name.clone(),
                    size,
                    count,
                })
        })
        .collect();
    let unattributed_processes = Unattributed::ALL
        .iter()
        .map(|r| {
            (
                r.as_str().to_string(),
                i.attribution.unattributed.get(r).copied().unwrap_or(0),
            )
        })
        .collect();
    UsageReport {
        generation: i.generation,
        sampled_at_ms: i.sampled_at_ms,
        interval_seconds: i.interval.as_secs_f64(),
        idle_window_seconds: i.idle_window.as_secs_f64(),
        error: None,
        gpus,
        idle_shares,
        placeable,
        unattributed_processes,
        topology: i.inventory.topology.as_ref().map(TopologyReport::new),
    }
}

#[cfg(test)]
mod tests;
