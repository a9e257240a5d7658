//! The usage report of one round: per GPU and MIG device, per share, what is placeable, the
//! topology; what `/v1/state`, the metrics and `gpu-slicer top` show. Pure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Attribution, DeviceSample, Holder, Sample, ShareKey, Unattributed, placeable};
use crate::domain::allocate::ResourceView;
use crate::domain::inventory::Inventory;

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
    /// The DRA driver's prepared claims, when the node serves DRA (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) dra: Option<DraReport>,
}

/// What the DRA driver has prepared, as its ledger held it when the round began.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DraReport {
    /// The prepared (checkpointed) claims, by UID.
    pub(crate) prepared_claims: Vec<PreparedClaimReport>,
}

/// One prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PreparedClaimReport {
    /// Claim UID.
    pub(crate) uid: String,
    /// Claim namespace.
    pub(crate) namespace: String,
    /// Claim name.
    pub(crate) name: String,
    /// Its devices, in allocation order.
    pub(crate) devices: Vec<PreparedDeviceReport>,
    /// When this run committed it, Unix milliseconds; `None`: prepared before this start
    /// (recovered from the checkpoint, which does not record the time).
    pub(crate) prepared_at_ms: Option<u64>,
}

/// One device of a prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PreparedDeviceReport {
    /// The claim's request it answers.
    pub(crate) request: String,
    /// Published device name.
    pub(crate) device: String,
    /// The share of a shared device (`None`: whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) share_id: Option<String>,
    /// The CDI device IDs handed to the kubelet.
    pub(crate) cdi_ids: Vec<String>,
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
        dra: None,
    }
}
