//! Usage metrics: device utilisation and memory, per-share memory, idle shares, placeable
//! requests and unattributed processes, published from each [`UsageReport`] by the usage
//! sampler (`crate::runtime::usage`).
//!
//! Label sets are bounded: devices by UUID (the node's), shares by holder (only holders the
//! ledger reports now: a released holder's series are removed), sizes up to the replica
//! count, reasons from a fixed list.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::domain::usage::{Holder, Unattributed, UsageReport};

use super::ResourceLabels;

/// A ratio gauge.
type Ratio = Gauge<f64, AtomicU64>;

/// Labels naming a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct UuidLabels {
    /// GPU UUID.
    pub(crate) uuid: String,
}

/// Labels naming a device and its kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct DeviceKindLabels {
    /// GPU or MIG UUID.
    pub(crate) uuid: String,
    /// `gpu` or `mig`.
    pub(crate) kind: String,
}

/// Labels naming a share.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, EncodeLabelSet)]
pub(crate) struct ShareLabels {
    /// Pod namespace.
    pub(crate) namespace: String,
    /// Pod name.
    pub(crate) pod: String,
    /// Container name.
    pub(crate) container: String,
    /// Extended resource name.
    pub(crate) resource: String,
}

/// Labels of `placeable_requests`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct PlaceLabels {
    /// Extended resource name.
    pub(crate) resource: String,
    /// Replicas per request.
    pub(crate) size: String,
}

/// Labels of `unattributed_processes`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    /// Why (`no-cgroup`, `not-a-pod`, `no-checkpoint-entry`, `ambiguous`, `no-holder`).
    pub(crate) reason: String,
}

/// The usage families.
#[derive(Debug, Default)]
pub(crate) struct UsageMetrics {
    /// `gpu_slicer_device_utilization_ratio{uuid}`.
    pub(crate) utilization: Family<UuidLabels, Ratio>,
    /// `gpu_slicer_device_memory_used_bytes{uuid,kind}`.
    pub(crate) memory_used: Family<DeviceKindLabels, Gauge>,
    /// `gpu_slicer_device_memory_total_bytes{uuid,kind}`.
    pub(crate) memory_total: Family<DeviceKindLabels, Gauge>,
    /// `gpu_slicer_share_memory_used_bytes{namespace,pod,container,resource}`.
    pub(crate) share_used: Family<ShareLabels, Gauge>,
    /// `gpu_slicer_share_memory_granted_bytes{namespace,pod,container,resource}`.
    pub(crate) share_granted: Family<ShareLabels, Gauge>,
    /// `gpu_slicer_idle_shares{resource}`.
    pub(crate) idle_shares: Family<ResourceLabels, Gauge>,
    /// `gpu_slicer_placeable_requests{resource,size}`.
    pub(crate) placeable: Family<PlaceLabels, Gauge>,
    /// `gpu_slicer_unattributed_processes{reason}`.
    pub(crate) unattributed: Family<ReasonLabels, Gauge>,
    published: Mutex<Published>,
}

#[derive(Debug, Default)]
struct Published {
    utilization: HashSet<UuidLabels>,
    memory: HashSet<DeviceKindLabels>,
    shares: HashSet<ShareLabels>,
    resources: HashSet<ResourceLabels>,
    placeable: HashSet<PlaceLabels>,
}

fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Remove the series of `old` that `new` no longer has.
fn drop_gone<L, M>(family: &Family<L, M>, old: &HashSet<L>, new: &HashSet<L>)
where
    L: Clone + Eq + std::hash::Hash,
    M: prometheus_client::metrics::TypedMetric + Default,
{
    for gone in old.difference(new) {
        family.remove(gone);
    }
}

impl UsageMetrics {
    /// Declare every family (prefix `gpu_slicer`); reasons start at 0.
    pub(crate) fn register(&self, r: &mut super::Declare<'_>) {
        r.add(
            "device_utilization_ratio",
            "GPU utilisation 0-1 over the driver's last sample period (not reported for GPUs in MIG mode)",
            self.utilization.clone(),
        );
        r.add(
            "device_memory_used_bytes",
            "Memory in use on a GPU (kind=gpu) or MIG device (kind=mig)",
            self.memory_used.clone(),
        );
        r.add(
            "device_memory_total_bytes",
            "Memory of a GPU (kind=gpu) or MIG device (kind=mig)",
            self.memory_total.clone(),
        );
        r.add(
            "share_memory_used_bytes",
            "GPU memory used by the processes of the container holding a share",
            self.share_used.clone(),
        );
        r.add(
            "share_memory_granted_bytes",
            "GPU memory a share grants: its memory limit when enforced, its 1/N split otherwise",
            self.share_granted.clone(),
        );
        r.add(
            "idle_shares",
            "Allocated shares (devices) whose holder used no GPU memory and no compute over the idle window",
            self.idle_shares.clone(),
        );
        r.add(
            "placeable_requests",
            "Requests of `size` replicas that can still be placed on one GPU",
            self.placeable.clone(),
        );
        r.add(
            "unattributed_processes",
            "GPU processes of the last sample that could not be attributed to a share, by reason",
            self.unattributed.clone(),
        );
        for r in Unattributed::ALL {
            drop(self.unattributed.get_or_create(&ReasonLabels {
                reason: r.as_str().into(),
            }));
        }
    }

    /// Publish a report: set every series it has, remove the ones it no longer has.
    pub(crate) fn publish(&self, report: &UsageReport) {
        let mut now = Published::default();
        for g in &report.gpus {
            if let Some(u) = g.utilization {
                let l = UuidLabels {
                    uuid: g.uuid.clone(),
                };
                self.utilization.get_or_create(&l).set(u);
                now.utilization.insert(l);
            }
            let devices = std::iter::once((&g.uuid, "gpu", &g.memory))
                .chain(g.mig_devices.iter().map(|m| (&m.uuid, "mig", &m.memory)));
            for (uuid, kind, memory) in devices {
                let Some(memory) = memory else { continue };
                let l = DeviceKindLabels {
                    uuid: uuid.clone(),
                    kind: kind.into(),
                };
                self.memory_used
                    .get_or_create(&l)
                    .set(gauge_value(memory.used_bytes));
                self.memory_total
                    .get_or_create(&l)
                    .set(gauge_value(memory.total_bytes));
                now.memory.insert(l);
            }
        }
        let mut shares: BTreeMap<ShareLabels, (u64, u64)> = BTreeMap::new();
        let all_shares = report.gpus.iter().flat_map(|g| {
            g.shares
                .iter()
                .chain(g.mig_devices.iter().flat_map(|m| m.shares.iter()))
        });
        for s in all_shares {
            let Holder {
                namespace,
                pod,
                container,
            } = &s.holder;
            let e = shares
                .entry(ShareLabels {
                    namespace: namespace.clone(),
                    pod: pod.clone(),
                    container: container.clone(),
                    resource: s.resource.clone(),
                })
                .or_default();
            e.0 += s.memory_used_bytes;
            e.1 += s.memory_granted_bytes;
        }
        for (l, (used, granted)) in shares {
            self.share_used.get_or_create(&l).set(gauge_value(used));
            self.share_granted
                .get_or_create(&l)
                .set(gauge_value(granted));
            now.shares.insert(l);
        }
        for (resource, n) in &report.idle_shares {
            let l = ResourceLabels {
                resource: resource.clone(),
            };
            self.idle_shares.get_or_create(&l).set(gauge_value(*n));
            now.resources.insert(l);
        }
        for p in &report.placeable {
            let l = PlaceLabels {
                resource: p.resource.clone(),
                size: p.size.to_string(),
            };
            self.placeable.get_or_create(&l).set(gauge_value(p.count));
            now.placeable.insert(l);
        }
        for (reason, n) in &report.unattributed_processes {
            self.unattributed
                .get_or_create(&ReasonLabels {
                    reason: reason.clone(),
                })
                .set(gauge_value(*n));
        }
        let mut old = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        drop_gone(&self.utilization, &old.utilization, &now.utilization);
        drop_gone(&self.memory_used, &old.memory, &now.memory);
        drop_gone(&self.memory_total, &old.memory, &now.memory);
        drop_gone(&self.share_used, &old.shares, &now.shares);
        drop_gone(&self.share_granted, &old.shares, &now.shares);
        drop_gone(&self.idle_shares, &old.resources, &now.resources);
        drop_gone(&self.placeable, &old.placeable, &now.placeable);
        *old = now;
    }
}
