//! The PromQL `advise --prometheus` sends and how the answers become an [`Export`].
//!
//! Aggregation happens in Prometheus: every query is an instant query over the window
//! (`max_over_time`, `quantile_over_time`, `avg_over_time`, and a timestamp subquery for the
//! history), so the answer is one number per GPU or per pod × GPU however many samples the
//! window holds. Two metric families: gpu-slicer's own (`gpu_slicer_*`) and dcgm-exporter's
//! (`DCGM_FI_*`, names and labels of its default counters file). Pure: `platform::prometheus`
//! sends the queries and hands back the samples.

use std::collections::{BTreeMap, BTreeSet};

use super::input::{EXPORT_VERSION, Export, GpuRecord, PodRecord, Stat};

/// Which metrics to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// gpu-slicer's `/metrics`.
    GpuSlicer,
    /// dcgm-exporter's.
    Dcgm,
}

impl Family {
    /// Its name in the export's `source`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Family::GpuSlicer => "gpu-slicer",
            Family::Dcgm => "dcgm",
        }
    }
}

/// What each query is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Key {
    /// Memory of each GPU.
    GpuMemory,
    /// Mean utilisation per GPU.
    GpuUtilMean,
    /// p95 utilisation per GPU.
    GpuUtilP95,
    /// Peak memory per pod (× GPU).
    PodPeak,
    /// p99 memory per pod (× GPU).
    PodP99,
    /// First and last time a pod was seen.
    PodFirst,
    /// …
    PodLast,
    /// Which GPUs a pod held (gpu-slicer: the allocation series).
    PodDevices,
    /// p95 compute per pod × GPU (dcgm).
    PodComputeP95,
    /// Mean compute per pod × GPU (dcgm).
    PodComputeMean,
}

/// One series of an instant-query answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Sample {
    /// Its labels.
    pub(crate) labels: BTreeMap<String, String>,
    /// Its value.
    pub(crate) value: f64,
}

/// A Prometheus duration in seconds (`604800s`).
fn dur(seconds: u64) -> String {
    format!("{seconds}s")
}

/// The queries for `family` over `window_seconds`; `step_seconds` is the resolution of the
/// history subquery. dcgm's utilisation is `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (0–1) where it is
/// exported, else `DCGM_FI_DEV_GPU_UTIL` (percent), chosen in the query with `or`.
pub(crate) fn queries(
    family: Family,
    window_seconds: u64,
    step_seconds: u64,
) -> Vec<(Key, String)> {
    let w = dur(window_seconds);
    let s = dur(step_seconds.max(1));
    match family {
        Family::GpuSlicer => {
            let used = "gpu_slicer_share_memory_used_bytes";
            let util = "gpu_slicer_device_utilization_ratio";
            vec![
                (
                    Key::GpuMemory,
                    format!(
                        "max by (uuid, instance, node) (max_over_time(gpu_slicer_device_memory_total_bytes{{kind=\"gpu\"}}[{w}]))"
                    ),
                ),
                (
                    Key::GpuUtilMean,
                    format!("max by (uuid) (avg_over_time({util}[{w}]))"),
                ),
                (
                    Key::GpuUtilP95,
                    format!("max by (uuid) (quantile_over_time(0.95, {util}[{w}]))"),
                ),
                (
                    Key::PodPeak,
                    format!("max by (namespace, pod, container) (max_over_time({used}[{w}]))"),
                ),
                (
                    Key::PodP99,
                    format!(
                        "max by (namespace, pod, container) (quantile_over_time(0.99, {used}[{w}]))"
                    ),
                ),
                (
                    Key::PodFirst,
                    format!(
                        "min by (namespace, pod, container) (min_over_time(timestamp({used})[{w}:{s}]))"
                    ),
                ),
                (
                    Key::PodLast,
                    format!(
                        "max by (namespace, pod, container) (max_over_time(timestamp({used})[{w}:{s}]))"
                    ),
                ),
                (
                    Key::PodDevices,
                    format!(
                        "max by (namespace, pod, container, device) (max_over_time(gpu_slicer_pod_device_allocation[{w}]))"
                    ),
                ),
            ]
        }
        Family::Dcgm => {
            // `f` over the raw samples of the engine-activity series where a GPU exports
            // it, else of GPU_UTIL: a subquery (`(a or b)[w:s]`) would see one point per
            // step and miss bursts shorter than the step (found by hack/advise-fleet.sh).
            let over = |f: &str, selector: &str| {
                format!(
                    "{f}DCGM_FI_PROF_GR_ENGINE_ACTIVE{selector}[{w}]) or {f}DCGM_FI_DEV_GPU_UTIL{selector}[{w}]) / 100"
                )
            };
            let pod = "{pod!=\"\"}";
            let fb = "DCGM_FI_DEV_FB_USED{pod!=\"\"}";
            let by_pod = "namespace, pod, container, UUID";
            vec![
                (
                    Key::GpuMemory,
                    format!(
                        "max by (UUID, modelName, Hostname) (max_over_time((DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)[{w}:{s}]))"
                    ),
                ),
                (
                    Key::GpuUtilMean,
                    format!("max by (UUID) ({})", over("avg_over_time(", "")),
                ),
                (
                    Key::GpuUtilP95,
                    format!("max by (UUID) ({})", over("quantile_over_time(0.95, ", "")),
                ),
                (
                    Key::PodPeak,
                    format!("max by ({by_pod}) (max_over_time({fb}[{w}]))"),
                ),
                (
                    Key::PodP99,
                    format!("max by ({by_pod}) (quantile_over_time(0.99, {fb}[{w}]))"),
                ),
                (
                    Key::PodFirst,
                    format!("min by ({by_pod}) (min_over_time(timestamp({fb})[{w}:{s}]))"),
                ),
                (
                    Key::PodLast,
                    format!("max by ({by_pod}) (max_over_time(timestamp({fb})[{w}:{s}]))"),
                ),
                (
                    Key::PodComputeP95,
                    format!(
                        "max by ({by_pod}) ({})",
                        over("quantile_over_time(0.95, ", pod)
                    ),
                ),
                (
                    Key::PodComputeMean,
                    format!("max by ({by_pod}) ({})", over("avg_over_time(", pod)),
                ),
            ]
        }
    }
}

/// The product of a GPU known only by its memory (gpu-slicer's metrics carry no product
/// name): the MIG product closest to it within 2 % (H100 80GB reports 81559 MiB, A100 80GB
/// 81920), else `GPU <n> GiB`.
pub(crate) fn model_from_memory(bytes: u64) -> String {
    let mib = bytes as f64 / (1u64 << 20) as f64;
    node_spec::PRODUCTS
        .iter()
        .filter(|p| (p.memory_mib as f64 - mib).abs() <= p.memory_mib as f64 * 0.02)
        .min_by(|a, b| {
            (a.memory_mib as f64 - mib)
                .abs()
                .total_cmp(&(b.memory_mib as f64 - mib).abs())
        })
        .map(|p| match p.name {
            "A100-80GB" => "NVIDIA A100-SXM4-80GB".to_string(),
            "A100-40GB" => "NVIDIA A100-SXM4-40GB".to_string(),
            "H100-80GB" => "NVIDIA H100 80GB HBM3".to_string(),
            "H200-141GB" => "NVIDIA H200".to_string(),
            other => format!("NVIDIA {other}"),
        })
        .unwrap_or_else(|| format!("GPU {:.0} GiB", mib / 1024.0))
}

fn label<'a>(s: &'a Sample, name: &str) -> &'a str {
    s.labels.get(name).map(String::as_str).unwrap_or("")
}

/// The node of a gpu-slicer series: its `node` label, else `instance` without the port.
fn node_of(s: &Sample) -> String {
    let node = label(s, "node");
    if !node.is_empty() {
        return node.to_string();
    }
    let inst = label(s, "instance");
    inst.rsplit_once(':')
        .map_or(inst, |(host, _)| host)
        .to_string()
}

type PodKey = (String, String, String);

/// Build the export from the answers (missing keys count as empty answers).
pub(crate) fn assemble(
    family: Family,
    window_seconds: u64,
    answers: &BTreeMap<Key, Vec<Sample>>,
) -> Export {
    let empty = Vec::new();
    let get = |k: Key| answers.get(&k).unwrap_or(&empty);
    let (uuid_l, mib) = match family {
        Family::GpuSlicer => ("uuid", 1.0),
        Family::Dcgm => ("UUID", (1u64 << 20) as f64),
    };
    let mut util: BTreeMap<&str, Stat> = BTreeMap::new();
    for s in get(Key::GpuUtilMean) {
        util.entry(label(s, uuid_l)).or_default().mean = s.value.clamp(0.0, 1.0);
    }
    for s in get(Key::GpuUtilP95) {
        util.entry(label(s, uuid_l)).or_default().p95 = s.value.clamp(0.0, 1.0);
    }
    let mut gpus: BTreeMap<String, GpuRecord> = BTreeMap::new();
    for s in get(Key::GpuMemory) {
        let uuid = label(s, uuid_l).to_string();
        let bytes = (s.value * mib) as u64;
        let (node, model) = match family {
            Family::GpuSlicer => (node_of(s), model_from_memory(bytes)),
            Family::Dcgm => (
                label(s, "Hostname").to_string(),
                label(s, "modelName").to_string(),
            ),
        };
        if uuid.is_empty() || bytes == 0 {
            continue;
        }
        let utilization = util.get(uuid.as_str()).copied().unwrap_or_default();
        gpus.insert(
            uuid.clone(),
            GpuRecord {
                node,
                uuid,
                model,
                memory_total_bytes: bytes,
                utilization,
            },
        );
    }
    let pod_key = |s: &Sample| -> PodKey {
        (
            label(s, "namespace").to_string(),
            label(s, "pod").to_string(),
            label(s, "container").to_string(),
        )
    };
    let mut pods: BTreeMap<PodKey, PodRecord> = BTreeMap::new();
    let mut held: BTreeMap<PodKey, BTreeSet<String>> = BTreeMap::new();
    let mut first: BTreeMap<PodKey, f64> = BTreeMap::new();
    let mut last: BTreeMap<PodKey, f64> = BTreeMap::new();
    let mut compute: BTreeMap<PodKey, Stat> = BTreeMap::new();
    for s in get(Key::PodPeak) {
        let k = pod_key(s);
        let p = pods.entry(k.clone()).or_insert_with(|| PodRecord {
            namespace: k.0.clone(),
            pod: k.1.clone(),
            container: k.2.clone(),
            ..PodRecord::default()
        });
        // dcgm answers per pod × GPU: the pod's peak per GPU is the largest.
        p.memory.peak_bytes = p.memory.peak_bytes.max((s.value * mib) as u64);
        if family == Family::Dcgm {
            held.entry(k)
                .or_default()
                .insert(label(s, "UUID").to_string());
        }
    }
    for s in get(Key::PodP99) {
        if let Some(p) = pods.get_mut(&pod_key(s)) {
            p.memory.p99_bytes = p.memory.p99_bytes.max((s.value * mib) as u64);
        }
    }
    for s in get(Key::PodFirst) {
        let e = first.entry(pod_key(s)).or_insert(f64::MAX);
        *e = e.min(s.value);
    }
    for s in get(Key::PodLast) {
        let e = last.entry(pod_key(s)).or_insert(f64::MIN);
        *e = e.max(s.value);
    }
    for s in get(Key::PodDevices) {
        // A replica `GPU-…::3` is on GPU `GPU-…`; a MIG device's parent is not in the
        // metrics, so MIG holders are left out of the before picture.
        let device = label(s, "device");
        let uuid = device.split("::").next().unwrap_or(device);
        if gpus.contains_key(uuid) && s.value > 0.0 {
            held.entry(pod_key(s)).or_default().insert(uuid.to_string());
        }
    }
    for s in get(Key::PodComputeP95) {
        let e = compute.entry(pod_key(s)).or_default();
        e.p95 = e.p95.max(s.value.clamp(0.0, 1.0));
    }
    for s in get(Key::PodComputeMean) {
        let e = compute.entry(pod_key(s)).or_default();
        e.mean = e.mean.max(s.value.clamp(0.0, 1.0));
    }
    let mut out_pods = Vec::new();
    for (k, mut p) in pods {
        let Some(uuids) = held.get(&k).filter(|u| !u.is_empty()) else {
            continue;
        };
        p.gpus = uuids
            .iter()
            .filter(|u| gpus.contains_key(*u))
            .cloned()
            .collect();
        if p.gpus.is_empty() {
            continue;
        }
        p.memory.p99_bytes = p.memory.p99_bytes.min(p.memory.peak_bytes);
        p.history_seconds = match (first.get(&k), last.get(&k)) {
            (Some(f), Some(l)) if l >= f => l - f,
            _ => 0.0,
        };
        p.compute = match family {
            Family::Dcgm => compute.get(&k).copied().unwrap_or_default(),
            // gpu-slicer measures utilisation per GPU: a holder is charged its GPUs' busiest.
            Family::GpuSlicer => p.gpus.iter().fold(Stat::default(), |acc, u| {
                let g = gpus.get(u).map(|g| g.utilization).unwrap_or_default();
                Stat {
                    mean: acc.mean.max(g.mean),
                    p95: acc.p95.max(g.p95),
                }
            }),
        };
        out_pods.push(p);
    }
    Export {
        version: EXPORT_VERSION.to_string(),
        source: family.as_str().to_string(),
        window_seconds: window_seconds as f64,
        gpus: gpus.into_values().collect(),
        pods: out_pods,
    }
}
