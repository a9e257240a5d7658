//! `advise` on synthetic fleets: [`advise_fleet`] writes a usage export (the `--from-file`
//! format) of a fleet shaped as the issue describes it, and [`advise_pack`] times the pure
//! part (classify, size, choose shares, pack, place) on one (bench `advise`; the CLI tests
//! use the same generator).
//!
//! The fleet: nodes of 8 GPUs, alternately H100 80GB and A100-SXM4-80GB, every GPU held by one
//! pod (whole GPUs, as clusters run before sharing) but for one GPU in 16, left idle. Of the
//! workloads, about one in 16 is a training job (2 or 4 GPUs per pod at 85–95 %, or one GPU
//! busy), the rest inference deployments of 1–`max_pods` pods (peaks of 1–18 GiB, p95 compute
//! 8–45 %, means 55–80 % of it), one in 10 of them bursty (p99 a third of the peak) and one in 40 seen for only a
//! few hours. Mean utilisation comes out near 25 %. Deterministic for a seed.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::domain::advise::{self, Settings, input::Export};

/// SplitMix64: a small deterministic generator (no dependency for synthetic data).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const GIB: f64 = (1u64 << 30) as f64;
const WEEK: f64 = 7.0 * 86400.0;
const MODELS: [(&str, u64); 2] = [
    ("NVIDIA H100 80GB HBM3", 81559 << 20),
    ("NVIDIA A100-SXM4-80GB", 81920 << 20),
];
/// Generated-name alphabet of Kubernetes (no vowels, no look-alikes).
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn suffix(rng: &mut Rng, n: usize) -> String {
    (0..n)
        .map(|_| ALPHABET[rng.below(ALPHABET.len() as u64) as usize] as char)
        .collect()
}

/// A synthetic usage export of about `gpus` GPUs (whole nodes of 8), as JSON.
pub fn advise_fleet(gpus: usize, max_pods: usize, seed: u64) -> String {
    let mut rng = Rng(seed);
    let nodes = gpus.div_ceil(8).max(2);
    let mut gpu_json = String::new();
    let mut pod_json = String::new();
    // Free GPUs per node, taken in order.
    let mut free: Vec<Vec<String>> = Vec::new();
    for n in 0..nodes {
        free.push(
            (0..8)
                .map(|i| format!("GPU-{n:08x}-0000-4000-8000-{i:012x}"))
                .collect(),
        );
    }
    // (uuid, node, mean, p95)
    let mut records: Vec<(String, usize, f64, f64)> = Vec::new();
    let mut w = 0usize;
    // Fill each model's nodes with workloads until its GPUs (but one in 16) are held.
    for parity in 0..2 {
        let node_ix: Vec<usize> = (0..nodes).filter(|n| n % 2 == parity).collect();
        let mut slots: Vec<(usize, String)> = Vec::new();
        for &n in &node_ix {
            for (i, u) in free[n].iter().enumerate() {
                // One GPU in 16 stays idle.
                if (n * 8 + i) % 16 != 15 {
                    slots.push((n, u.clone()));
                } else {
                    records.push((u.clone(), n, 0.0, 0.0));
                }
            }
        }
        let mut next = 0usize;
        while next < slots.len() {
            w += 1;
            let left = slots.len() - next;
            let training = rng.below(16) == 0;
            if training {
                let per_pod = [1usize, 1, 2, 4][rng.below(4) as usize].min(left);
                let name = format!("train-{w}");
                let mean = rng.range(0.85, 0.95);
                let peak = rng.range(40.0, 70.0) * GIB;
                // Multi-GPU pods take GPUs of one node.
                let node = slots[next].0;
                let mut held = Vec::new();
                while held.len() < per_pod && next < slots.len() && slots[next].0 == node {
                    held.push(slots[next].1.clone());
                    next += 1;
                }
                for u in &held {
                    records.push((u.clone(), node, mean, (mean + 0.05).min(1.0)));
                }
                let uu: Vec<String> = held.iter().map(|u| format!("\"{u}\"")).collect();
                let _ = write!(
                    pod_json,
                    "{}{{\"namespace\":\"research\",\"pod\":\"{name}-{}\",\"container\":\"trainer\",\"gpus\":[{}],\"memory\":{{\"peakBytes\":{},\"p99Bytes\":{}}},\"compute\":{{\"mean\":{mean:.4},\"p95\":{:.4}}},\"historySeconds\":{WEEK}}}",
                    if pod_json.is_empty() { "" } else { "," },
                    suffix(&mut rng, 5),
                    uu.join(","),
                    peak as u64,
                    (peak * 0.97) as u64,
                    (mean + 0.05).min(1.0)
                );
                continue;
            }
            let pods = (1 + rng.below(max_pods.max(1) as u64) as usize).min(left);
            let name = format!("infer-{w}");
            let hash = suffix(&mut rng, 10);
            let peak_gib = if rng.below(5) == 0 {
                rng.range(10.0, 18.0)
            } else {
                rng.range(1.0, 9.0)
            };
            let p95 = rng.range(0.08, 0.45);
            let bursty = rng.below(10) == 0;
            let short = rng.below(40) == 0;
            for _ in 0..pods {
                let (node, uuid) = slots[next].clone();
                next += 1;
                let peak = peak_gib * rng.range(0.8, 1.0) * GIB;
                let p99 = if bursty {
                    peak / 3.0
                } else {
                    peak * rng.range(0.85, 0.98)
                };
                let pod_p95 = p95 * rng.range(0.8, 1.0);
                let mean = pod_p95 * rng.range(0.55, 0.8);
                records.push((uuid.clone(), node, mean, pod_p95));
                let _ = write!(
                    pod_json,
                    "{}{{\"namespace\":\"serving\",\"pod\":\"{name}-{hash}-{}\",\"container\":\"server\",\"gpus\":[\"{uuid}\"],\"memory\":{{\"peakBytes\":{},\"p99Bytes\":{}}},\"compute\":{{\"mean\":{mean:.4},\"p95\":{pod_p95:.4}}},\"historySeconds\":{}}}",
                    if pod_json.is_empty() { "" } else { "," },
                    suffix(&mut rng, 5),
                    peak as u64,
                    p99 as u64,
                    if short { 4.0 * 3600.0 } else { WEEK }
                );
            }
        }
    }
    records.sort_by(|a, b| a.0.cmp(&b.0));
    for (uuid, node, mean, p95) in &records {
        let (model, bytes) = MODELS[node % 2];
        let _ = write!(
            gpu_json,
            "{}{{\"node\":\"gpu-node-{node:05}\",\"uuid\":\"{uuid}\",\"model\":\"{model}\",\"memoryTotalBytes\":{bytes},\"utilization\":{{\"mean\":{mean:.4},\"p95\":{p95:.4}}}}}",
            if gpu_json.is_empty() { "" } else { "," },
        );
    }
    format!(
        "{{\"version\":\"v1\",\"source\":\"synthetic\",\"windowSeconds\":{WEEK},\"gpus\":[{gpu_json}],\"pods\":[{pod_json}]}}\n"
    )
}

/// What one [`advise_pack`] call measured.
#[derive(Debug, Clone, Copy)]
pub struct AdvisePacking {
    /// Time of the pure advice (classify, size, choose, pack, place), parsing excluded.
    pub took: Duration,
    /// Workloads.
    pub workloads: usize,
    /// GPUs held before.
    pub gpus_before: usize,
    /// GPUs the plan uses.
    pub gpus_after: usize,
    /// Lower bound.
    pub lower_bound: usize,
    /// Whether every group was packed exactly.
    pub exact: bool,
}

/// Parse an export and time the advice on it (default settings). Panics on a bad export.
pub fn advise_pack(export_json: &str) -> AdvisePacking {
    let export = match Export::parse(export_json, "synthetic") {
        Ok(e) => e,
        Err(e) => panic!("synthetic export: {e}"),
    };
    let t = Instant::now();
    let a = advise::advise(&export, &Settings::default());
    let took = t.elapsed();
    AdvisePacking {
        took,
        workloads: a.workloads.len(),
        gpus_before: a.gpus_before(),
        gpus_after: a.gpus_after(),
        lower_bound: a.lower_bound(),
        exact: a.models.iter().all(|m| m.exact),
    }
}
