//! The measured usage `advise` works from, in the export format `--from-file` reads (docs/src/advise.md,
//! "How many GPUs would I get back?"): one record per GPU and one per pod, each holding the
//! window's aggregates (peak, percentiles, means), not raw samples. The Prometheus reader
//! (`platform::prometheus`) builds the same [`Export`] from its PromQL answers, so both inputs
//! meet the model ([`super::workload`]) in one shape.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::AdviseError;

/// The format version this build reads and writes.
pub(crate) const EXPORT_VERSION: &str = "v1";

/// A window of measured usage: the GPUs and the pods that held them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Export {
    /// Always `v1`.
    pub(crate) version: String,
    /// Which metric family the figures came from (`gpu-slicer`, `dcgm`), for the report.
    #[serde(default)]
    pub(crate) source: String,
    /// Length of the window in seconds.
    pub(crate) window_seconds: f64,
    /// Every GPU seen in the window.
    pub(crate) gpus: Vec<GpuRecord>,
    /// Every pod (container) seen holding a GPU in the window.
    pub(crate) pods: Vec<PodRecord>,
}

/// One GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct GpuRecord {
    /// Node (dcgm-exporter's `Hostname`).
    pub(crate) node: String,
    /// `GPU-…` UUID.
    pub(crate) uuid: String,
    /// Product name as NVML reports it (`modelName`), e.g. `NVIDIA H100 80GB HBM3`.
    pub(crate) model: String,
    /// Total memory in bytes.
    pub(crate) memory_total_bytes: u64,
    /// Utilisation over the window, 0–1.
    #[serde(default)]
    pub(crate) utilization: Stat,
}

/// Mean and 95th percentile of a 0–1 ratio over the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Stat {
    /// Mean over the window.
    pub(crate) mean: f64,
    /// 95th percentile over the window.
    pub(crate) p95: f64,
}

/// One container holding GPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct PodRecord {
    /// Namespace.
    pub(crate) namespace: String,
    /// Pod name.
    pub(crate) pod: String,
    /// Container name.
    #[serde(default)]
    pub(crate) container: String,
    /// The controller's name where it was exported; otherwise the pod name without its
    /// ReplicaSet/Job hash names the workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) owner: Option<String>,
    /// Pod labels where exported (matched by `--override` selectors).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) labels: BTreeMap<String, String>,
    /// UUIDs of the GPUs it held.
    pub(crate) gpus: Vec<String>,
    /// Memory it used.
    pub(crate) memory: MemoryStat,
    /// Compute it used, 0–1 of one GPU (the GPU's utilisation while it held it).
    #[serde(default)]
    pub(crate) compute: Stat,
    /// How long it was seen, in seconds.
    pub(crate) history_seconds: f64,
}

/// Peak and 99th percentile of memory used, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MemoryStat {
    /// Highest value seen.
    pub(crate) peak_bytes: u64,
    /// 99th percentile.
    pub(crate) p99_bytes: u64,
}

impl Export {
    /// Parse an export (JSON); `origin` names the file in errors, with the field's path.
    pub(crate) fn parse(text: &str, origin: &str) -> Result<Self, AdviseError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let export: Export =
            serde_path_to_error::deserialize(de).map_err(|e| AdviseError::Input {
                origin: origin.to_string(),
                field: e.path().to_string(),
                message: e.inner().to_string(),
            })?;
        export.check(origin)?;
        Ok(export)
    }

    /// The checks serde cannot make: version, ratios in range, GPUs a pod names exist.
    pub(crate) fn check(&self, origin: &str) -> Result<(), AdviseError> {
        let bad = |field: String, value: String, message: &str| AdviseError::Invalid {
            origin: origin.to_string(),
            field,
            value,
            message: message.to_string(),
        };
        if self.version != EXPORT_VERSION {
            return Err(bad(
                "version".into(),
                self.version.clone(),
                "only v1 is read",
            ));
        }
        let ratio_ok = |r: f64| (0.0..=1.0).contains(&r);
        let mut uuids = std::collections::BTreeSet::new();
        for (i, g) in self.gpus.iter().enumerate() {
            if g.memory_total_bytes == 0 {
                return Err(bad(
                    format!("gpus[{i}].memoryTotalBytes"),
                    "0".into(),
                    "must be greater than 0",
                ));
            }
            for (name, v) in [("mean", g.utilization.mean), ("p95", g.utilization.p95)] {
                if !ratio_ok(v) {
                    return Err(bad(
                        format!("gpus[{i}].utilization.{name}"),
                        v.to_string(),
                        "must be a ratio between 0 and 1",
                    ));
                }
            }
            if !uuids.insert(g.uuid.as_str()) {
                return Err(bad(
                    format!("gpus[{i}].uuid"),
                    g.uuid.clone(),
                    "listed twice",
                ));
            }
        }
        for (i, p) in self.pods.iter().enumerate() {
            for (name, v) in [("mean", p.compute.mean), ("p95", p.compute.p95)] {
                if !ratio_ok(v) {
                    return Err(bad(
                        format!("pods[{i}].compute.{name}"),
                        v.to_string(),
                        "must be a ratio between 0 and 1",
                    ));
                }
            }
            if p.gpus.is_empty() {
                return Err(bad(
                    format!("pods[{i}].gpus"),
                    "[]".into(),
                    "a pod record names the GPUs it held",
                ));
            }
            for (j, u) in p.gpus.iter().enumerate() {
                if !uuids.contains(u.as_str()) {
                    return Err(bad(
                        format!("pods[{i}].gpus[{j}]"),
                        u.clone(),
                        "no GPU of `gpus` has this UUID",
                    ));
                }
            }
            if p.memory.p99_bytes > p.memory.peak_bytes {
                return Err(bad(
                    format!("pods[{i}].memory.p99Bytes"),
                    p.memory.p99_bytes.to_string(),
                    "above peakBytes",
                ));
            }
        }
        Ok(())
    }
}
