//! Pods grouped into workloads, each measured and classified.
//!
//! A workload is a namespace and an owner: the controller's name where the export carries it,
//! else the pod name without the hashes Kubernetes appends (a ReplicaSet's
//! `-<pod-template-hash>-<5>`, a Job's `-<5>`, a StatefulSet's ordinal). Its figures are the
//! worst of its pods (peak and p99 memory, p95 compute), the mean of their means, and the
//! longest history. The class says what the plan may do with it; the reason says why, in
//! words that name the figure and the threshold.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::input::{Export, PodRecord};
use super::{AdviseError, Settings};

/// What the plan may do with a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Class {
    /// Keeps whole GPUs: busy most of the time, or several GPUs per pod.
    Training,
    /// Gets the smallest share that holds its peak.
    Shared,
    /// Kept at its current size (too little history, bursty memory, or an override).
    Kept,
}

impl Class {
    /// The name in the summary and overrides.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Class::Training => "training",
            Class::Shared => "shared",
            Class::Kept => "kept",
        }
    }
}

/// One workload with its measured figures.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Workload {
    /// Namespace.
    pub(crate) namespace: String,
    /// Owner (controller) name.
    pub(crate) name: String,
    /// GPU product name of the GPUs it ran on (the most common one).
    pub(crate) model: String,
    /// Memory of one such GPU, bytes.
    pub(crate) gpu_memory_bytes: u64,
    /// Pods seen.
    pub(crate) pods: usize,
    /// GPUs per pod (the most any pod held).
    pub(crate) gpus_per_pod: usize,
    /// Highest memory any pod used, bytes (per GPU for multi-GPU pods).
    pub(crate) peak_bytes: u64,
    /// Highest 99th percentile of memory of any pod, bytes.
    pub(crate) p99_bytes: u64,
    /// Highest 95th percentile of compute of any pod, 0–1 of a GPU.
    pub(crate) compute_p95: f64,
    /// Mean of the pods' mean compute, 0–1 of a GPU.
    pub(crate) compute_mean: f64,
    /// Longest history of any pod, seconds.
    pub(crate) history_seconds: f64,
    /// GPUs its pods held (UUIDs), for the before picture.
    pub(crate) gpus: BTreeSet<String>,
    /// Its class.
    pub(crate) class: Class,
    /// Why.
    pub(crate) reason: String,
}

/// Overrides of the classification, from `--overrides FILE` (YAML or JSON).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Overrides {
    /// First match wins.
    pub(crate) overrides: Vec<Override>,
}

/// One override: which workloads (every field given must match) and the class they get.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Override {
    /// Namespace.
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    /// Workload name.
    #[serde(default)]
    pub(crate) name: Option<String>,
    /// Pod labels that must all be present with these values (a label selector); a
    /// workload matches when any of its pods does.
    #[serde(default)]
    pub(crate) selector: BTreeMap<String, String>,
    /// The class to give.
    pub(crate) class: Class,
    /// Said in the workload's reason.
    #[serde(default)]
    pub(crate) reason: Option<String>,
}

impl Overrides {
    /// Parse an overrides file; `origin` names it in errors.
    pub(crate) fn parse(text: &str, origin: &str) -> Result<Self, AdviseError> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| AdviseError::Input {
            origin: origin.to_string(),
            field: e.path().to_string(),
            message: e.inner().to_string(),
        })
    }
}

/// Characters of the random suffixes Kubernetes generates (`k8s.io/apimachinery`'s
/// `rand.String`: consonants and digits without look-alikes).
const SUFFIX_ALPHABET: &str = "bcdfghjklmnpqrstvwxz2456789";

fn is_generated(segment: &str, lens: std::ops::RangeInclusive<usize>) -> bool {
    lens.contains(&segment.len()) && segment.chars().all(|c| SUFFIX_ALPHABET.contains(c))
}

/// The workload name of a pod without an exported owner: the pod name less a ReplicaSet's
/// `-<hash>-<5>`, a Job's or bare ReplicaSet's `-<5>`, or a StatefulSet's `-<ordinal>`.
pub(crate) fn owner_of(pod: &str) -> String {
    let parts: Vec<&str> = pod.split('-').collect();
    if parts.len() >= 3
        && is_generated(parts[parts.len() - 1], 5..=5)
        && is_generated(parts[parts.len() - 2], 6..=10)
    {
        return parts[..parts.len() - 2].join("-");
    }
    if parts.len() >= 2 {
        let last = parts[parts.len() - 1];
        if is_generated(last, 5..=5)
            || (!last.is_empty() && last.chars().all(|c| c.is_ascii_digit()))
        {
            return parts[..parts.len() - 1].join("-");
        }
    }
    pod.to_string()
}

const GIB: f64 = (1u64 << 30) as f64;

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / GIB)
}

fn hours(s: f64) -> String {
    format!("{:.0}h", s / 3600.0)
}

/// Group the export's pods into workloads and classify each. Sorted by namespace, name.
pub(crate) fn workloads(export: &Export, settings: &Settings) -> Vec<Workload> {
    let gpus: BTreeMap<&str, _> = export.gpus.iter().map(|g| (g.uuid.as_str(), g)).collect();
    let mut groups: BTreeMap<(String, String), Vec<&PodRecord>> = BTreeMap::new();
    for p in &export.pods {
        let owner = p.owner.clone().unwrap_or_else(|| owner_of(&p.pod));
        groups
            .entry((p.namespace.clone(), owner))
            .or_default()
            .push(p);
    }
    groups
        .into_iter()
        .map(|((namespace, name), pods)| {
            let mut models: BTreeMap<(&str, u64), usize> = BTreeMap::new();
            let mut held = BTreeSet::new();
            let mut pod_names = BTreeSet::new();
            for p in &pods {
                pod_names.insert(p.pod.as_str());
                for u in &p.gpus {
                    held.insert(u.clone());
                    if let Some(g) = gpus.get(u.as_str()) {
                        *models
                            .entry((g.model.as_str(), g.memory_total_bytes))
                            .or_default() += 1;
                    }
                }
            }
            // The most common model; ties to the first in name order (deterministic).
            let ((model, gpu_memory_bytes), _) = models
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                .map(|(k, v)| (*k, *v))
                .unwrap_or((("unknown", 0), 0));
            let n = pods.len() as f64;
            let mut w = Workload {
                namespace,
                name,
                model: model.to_string(),
                gpu_memory_bytes,
                pods: pod_names.len(),
                gpus_per_pod: pods.iter().map(|p| p.gpus.len()).max().unwrap_or(1),
                peak_bytes: pods.iter().map(|p| p.memory.peak_bytes).max().unwrap_or(0),
                p99_bytes: pods.iter().map(|p| p.memory.p99_bytes).max().unwrap_or(0),
                compute_p95: pods.iter().map(|p| p.compute.p95).fold(0.0, f64::max),
                compute_mean: pods.iter().map(|p| p.compute.mean).sum::<f64>() / n,
                history_seconds: pods.iter().map(|p| p.history_seconds).fold(0.0, f64::max),
                gpus: held,
                class: Class::Shared,
                reason: String::new(),
            };
            let (class, reason) = classify(&w, &pods, settings);
            w.class = class;
            w.reason = reason;
            w
        })
        .collect()
}

fn matches(o: &Override, w: &Workload, pods: &[&PodRecord]) -> bool {
    o.namespace.as_ref().is_none_or(|n| *n == w.namespace)
        && o.name.as_ref().is_none_or(|n| *n == w.name)
        && (o.selector.is_empty()
            || pods.iter().any(|p| {
                o.selector
                    .iter()
                    .all(|(k, v)| p.labels.get(k).is_some_and(|pv| pv == v))
            }))
}

/// The class of a workload and the reason, first rule that applies.
fn classify(w: &Workload, pods: &[&PodRecord], s: &Settings) -> (Class, String) {
    if let Some(o) = s.overrides.overrides.iter().find(|o| matches(o, w, pods)) {
        let why = o.reason.as_deref().unwrap_or("no reason given");
        return (o.class, format!("override ({why})"));
    }
    if w.gpus_per_pod > 1 {
        return (
            Class::Training,
            format!("multi-GPU: {} GPUs per pod keep whole GPUs", w.gpus_per_pod),
        );
    }
    if w.compute_p95 >= s.busy_p95 && w.compute_mean >= s.busy_mean {
        return (
            Class::Training,
            format!(
                "busy: compute p95 {:.0} %, mean {:.0} % of a GPU (p95 >= {:.0} % and mean >= {:.0} %: long busy stretches) keeps a whole GPU",
                w.compute_p95 * 100.0,
                w.compute_mean * 100.0,
                s.busy_p95 * 100.0,
                s.busy_mean * 100.0
            ),
        );
    }
    if w.history_seconds < s.min_history_seconds {
        return (
            Class::Kept,
            format!(
                "short history: {} measured, less than --min-history {}: kept at its current size",
                hours(w.history_seconds),
                hours(s.min_history_seconds)
            ),
        );
    }
    if (w.p99_bytes as f64) < s.bursty_ratio * w.peak_bytes as f64 {
        return (
            Class::Kept,
            format!(
                "bursty memory: p99 {} is below {:.0} % of its peak {}: kept at its current size",
                gib(w.p99_bytes),
                s.bursty_ratio * 100.0,
                gib(w.peak_bytes)
            ),
        );
    }
    (
        Class::Shared,
        format!(
            "peak {} and compute p95 {:.0} % of a GPU fit a share",
            gib(w.peak_bytes),
            w.compute_p95 * 100.0
        ),
    )
}
