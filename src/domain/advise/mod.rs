//! `advise`: from measured usage to a partitioning plan, pure.
//!
//! [`advise`] takes an [`input::Export`] (from `--from-file`, or built by
//! `platform::prometheus` from PromQL aggregates) and [`Settings`] and returns an [`Advice`]:
//! the workloads with their class and reason ([`workload`]), the share each sharing
//! candidate gets and the GPUs they are packed onto ([`pack`]), which node takes which packed
//! GPU and the pools that follow ([`fleet`]), and the before/after figures. [`emit`] writes
//! the plan as code (configs, MIG layouts, node labels, claim templates, kustomization);
//! [`report`] renders the summary (text, JSON) and the HTML report. `cli::advise` does the
//! I/O around them. Never shrinks a workload below its measured peak plus headroom.

use std::collections::BTreeMap;

pub(crate) mod emit;
pub(crate) mod fleet;
pub(crate) mod input;
pub(crate) mod pack;
pub(crate) mod promql;
pub(crate) mod report;
pub(crate) mod workload;

#[cfg(test)]
mod tests;

use input::Export;
use pack::{Bin, Item, Model, ShareKind};

use workload::{Class, Workload};

/// Errors of `advise`'s inputs.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdviseError {
    /// The export or overrides file does not parse.
    #[error("invalid {origin}: field `{field}`: {message}")]
    Input {
        origin: String,
        field: String,
        message: String,
    },
    /// A value is out of range.
    #[error("invalid {origin}: field `{field}` = {value}: {message}")]
    Invalid {
        origin: String,
        field: String,
        value: String,
        message: String,
    },
    /// A setting (flag) has a bad value.
    #[error("invalid {flag} = {value}: {message}")]
    Setting {
        flag: &'static str,
        value: String,
        message: String,
    },
}

/// How `advise` decides.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    /// Memory added to each peak, as a fraction (`--memory-headroom`, default 0.15).
    pub(crate) memory_headroom: f64,
    /// Less history than this keeps a workload as it is (`--min-history`, default 24h).
    pub(crate) min_history_seconds: f64,
    /// p99 memory below this fraction of the peak is bursty (kept).
    pub(crate) bursty_ratio: f64,
    /// p95 compute at or above this …
    pub(crate) busy_p95: f64,
    /// … with a mean at or above this is training-like (whole GPU).
    pub(crate) busy_mean: f64,
    /// Classification overrides (`--overrides FILE`).
    pub(crate) overrides: workload::Overrides,
    /// Models with at most this many items of one share are packed exactly.
    pub(crate) exact_limit: usize,
    /// Price of one GPU-hour (`--gpu-hour-price`), for money per month in the report.
    pub(crate) gpu_hour_price: Option<f64>,
    /// Write a ResourceClaimTemplate per sharing candidate (`--dra`).
    pub(crate) dra: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            memory_headroom: 0.15,
            min_history_seconds: 24.0 * 3600.0,
            bursty_ratio: 0.5,
            busy_p95: 0.8,
            busy_mean: 0.5,
            overrides: workload::Overrides::default(),
            exact_limit: 10,
            gpu_hour_price: None,
            dra: false,
        }
    }
}

/// The share a workload's pods get.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Share {
    /// `n` whole GPUs per pod.
    Whole(usize),
    /// A MIG instance or a replica.
    Shared(ShareKind),
}

/// What one workload gets.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Grant {
    /// The share.
    pub(crate) share: Share,
    /// Memory the share holds, bytes (per GPU for whole GPUs).
    pub(crate) memory_bytes: u64,
    /// Extended resource requested per pod, with its count.
    pub(crate) resource: (String, usize),
}

/// Packing of one GPU model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelPlan {
    /// NVML product name.
    pub(crate) model: String,
    /// Short name used in pool and resource names (`h100-80gb`).
    pub(crate) slug: String,
    /// Memory of one GPU, bytes.
    pub(crate) memory_bytes: u64,
    /// GPUs of this model in the export.
    pub(crate) gpus_total: usize,
    /// GPUs held by some pod in the window.
    pub(crate) gpus_before: usize,
    /// GPUs the plan uses.
    pub(crate) gpus_after: usize,
    /// Lower bound on `gpus_after` with these workloads.
    pub(crate) lower_bound: usize,
    /// Whether every share's packing was solved exactly.
    pub(crate) exact: bool,
    /// The packed GPUs.
    pub(crate) bins: Vec<PackedGpu>,
}

/// One packed GPU: its shape and the workloads on it (index into [`Advice::workloads`],
/// one entry per pod).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PackedGpu {
    /// Configuration.
    pub(crate) shape: pack::GpuShape,
    /// Workloads (one entry per pod placed).
    pub(crate) workloads: Vec<usize>,
    /// Projected mean utilisation (sum of the pods' mean compute, at most 1).
    pub(crate) utilization: f64,
}

/// The whole answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Advice {
    /// Where the figures came from (`gpu-slicer`, `dcgm`).
    pub(crate) source: String,
    /// Window length, seconds.
    pub(crate) window_seconds: f64,
    /// Workloads, sorted by namespace and name.
    pub(crate) workloads: Vec<Workload>,
    /// What each gets (same order).
    pub(crate) grants: Vec<Grant>,
    /// Per model, sorted by model name.
    pub(crate) models: Vec<ModelPlan>,
    /// Nodes and pools.
    pub(crate) fleet: fleet::Fleet,
    /// Per-GPU utilisation before (uuid, node, model, mean, held), sorted by node, uuid.
    pub(crate) gpus_before: Vec<(String, String, String, f64, bool)>,
    /// Warnings, in workload order.
    pub(crate) warnings: Vec<String>,
    /// The settings it was made with.
    pub(crate) settings: Settings,
}

impl Advice {
    /// GPUs held before, all models.
    pub(crate) fn gpus_before(&self) -> usize {
        self.models.iter().map(|m| m.gpus_before).sum()
    }
    /// GPUs the plan uses.
    pub(crate) fn gpus_after(&self) -> usize {
        self.models.iter().map(|m| m.gpus_after).sum()
    }
    /// Lower bound on GPUs.
    pub(crate) fn lower_bound(&self) -> usize {
        self.models.iter().map(|m| m.lower_bound).sum()
    }
}

/// A short lower-case name for a model: the MIG product's name, else the NVML name's
/// alphanumerics (`NVIDIA L4` → `l4`).
pub(crate) fn slug(model: &str) -> String {
    if let Some(p) = node_spec::lookup_product(model) {
        return p.name.to_ascii_lowercase();
    }
    let name = model.strip_prefix("NVIDIA ").unwrap_or(model);
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    let out = out.trim_end_matches('-').to_string();
    if out.is_empty() { "gpu".into() } else { out }
}

/// Memory a workload must get: its peak plus headroom, at most one GPU.
pub(crate) fn grant_bytes(w: &Workload, headroom: f64) -> u64 {
    let want = (w.peak_bytes as f64 * (1.0 + headroom)).ceil() as u64;
    want.max(w.peak_bytes)
        .min(w.gpu_memory_bytes.max(w.peak_bytes))
}

/// Check the settings a user can set.
pub(crate) fn check_settings(s: &Settings) -> Result<(), AdviseError> {
    if !(0.0..=4.0).contains(&s.memory_headroom) {
        return Err(AdviseError::Setting {
            flag: "--memory-headroom",
            value: s.memory_headroom.to_string(),
            message: "must be a fraction between 0 and 4 (0.15 is 15 %)".into(),
        });
    }
    if let Some(p) = s.gpu_hour_price
        && !(p.is_finite() && p >= 0.0)
    {
        return Err(AdviseError::Setting {
            flag: "--gpu-hour-price",
            value: p.to_string(),
            message: "must be a non-negative number".into(),
        });
    }
    Ok(())
}

/// The packing group of a share: MIG instances of a model pack together, replicas by count.
fn group_of(kind: ShareKind) -> ShareKind {
    match kind {
        ShareKind::Mig(_) => ShareKind::Mig(""),
        k => k,
    }
}

/// The share options of one sharing candidate on its model.
#[derive(Debug, Clone, Copy)]
struct Options {
    mig: Option<ShareKind>,
    replicas: Option<u64>,
}

/// Packs a model's sharing candidates for a choice of shares, remembering group results.
struct Packer<'a> {
    model: Model,
    workloads: &'a [Workload],
    grants: &'a [u64],
    memo: BTreeMap<(ShareKind, Vec<usize>), usize>,
}

impl Packer<'_> {
    fn items(&self, kind: ShareKind, members: &[usize]) -> Vec<Item> {
        let mut items = Vec::new();
        for &wi in members {
            let w = &self.workloads[wi];
            let profile = match self.kind_of_member(wi, kind) {
                ShareKind::Mig(name) => self
                    .model
                    .product
                    .and_then(|p| node_spec::gi_profiles(p).iter().find(|g| g.name == name)),
                ShareKind::Replicas(_) => None,
            };
            for _ in 0..w.pods {
                items.push(Item {
                    workload: wi,
                    grant_bytes: self.grants[wi],
                    compute_p95: w.compute_p95,
                    compute_mean: w.compute_mean,
                    profile,
                });
            }
        }
        items
    }

    /// The MIG profile a member of the MIG group gets (its smallest).
    fn kind_of_member(&self, wi: usize, group: ShareKind) -> ShareKind {
        match group {
            ShareKind::Mig(_) => self
                .model
                .smallest_profile(self.grants[wi], self.workloads[wi].compute_p95)
                .map_or(group, |g| ShareKind::Mig(g.name)),
            k => k,
        }
    }

    /// Groups of a choice: group -> its workloads.
    fn groups(choice: &BTreeMap<usize, ShareKind>) -> BTreeMap<ShareKind, Vec<usize>> {
        let mut g: BTreeMap<ShareKind, Vec<usize>> = BTreeMap::new();
        for (&wi, &k) in choice {
            g.entry(group_of(k)).or_default().push(wi);
        }
        g
    }

    /// (GPUs by first-fit decreasing, groups) of a choice.
    fn cost(&mut self, choice: &BTreeMap<usize, ShareKind>) -> (usize, usize) {
        let groups = Self::groups(choice);
        let mut total = 0;
        for (kind, members) in &groups {
            let key = (*kind, members.clone());
            let n = match self.memo.get(&key) {
                Some(&n) => n,
                None => {
                    let items = self.items(*kind, members);
                    let n = pack::first_fit_decreasing(&self.model, *kind, &items).len();
                    self.memo.insert(key, n);
                    n
                }
            };
            total += n;
        }
        (total, groups.len())
    }
}

/// Choose each sharing candidate's share on `model`: start from the smallest share of each,
/// then, while it saves GPUs (or, at equal GPUs, a distinct config), move a whole group to a
/// larger share that still holds every member: a replica count to the next smaller one
/// present, MIG members to replicas, or a replica group to MIG.
fn choose(
    packer: &mut Packer<'_>,
    options: &BTreeMap<usize, Options>,
    start: BTreeMap<usize, ShareKind>,
) -> BTreeMap<usize, ShareKind> {
    let mut choice = start;
    let mut cost = packer.cost(&choice);
    loop {
        let levels: Vec<u64> = choice
            .values()
            .filter_map(|k| match k {
                ShareKind::Replicas(k) => Some(*k),
                ShareKind::Mig(_) => None,
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut candidates: Vec<BTreeMap<usize, ShareKind>> = Vec::new();
        // A replica level into the next smaller count present (bigger replicas).
        for pair in levels.windows(2) {
            let (lo, hi) = (pair[0], pair[1]);
            let mut c = choice.clone();
            for k in c.values_mut() {
                if *k == ShareKind::Replicas(hi) {
                    *k = ShareKind::Replicas(lo);
                }
            }
            candidates.push(c);
        }
        // MIG members to replicas: the largest count present they fit, else their own.
        let mut c = choice.clone();
        for (wi, k) in c.iter_mut() {
            if let (ShareKind::Mig(_), Some(step)) = (*k, options[wi].replicas) {
                let level = levels.iter().rev().find(|&&l| l <= step).copied();
                *k = ShareKind::Replicas(level.unwrap_or(step));
            }
        }
        candidates.push(c);
        // A replica level to MIG (members without a profile stay).
        for &l in &levels {
            let mut c = choice.clone();
            for (wi, k) in c.iter_mut() {
                if *k == ShareKind::Replicas(l)
                    && let Some(m) = options[wi].mig
                {
                    *k = m;
                }
            }
            candidates.push(c);
        }
        let mut best: Option<((usize, usize), BTreeMap<usize, ShareKind>)> = None;
        for c in candidates {
            if c == choice {
                continue;
            }
            let k = packer.cost(&c);
            if k < cost && best.as_ref().is_none_or(|(b, _)| k < *b) {
                best = Some((k, c));
            }
        }
        match best {
            Some((k, c)) => {
                cost = k;
                choice = c;
            }
            None => return choice,
        }
    }
}

/// Measure, classify, size, pack and place.
pub(crate) fn advise(export: &Export, settings: &Settings) -> Advice {
    let workloads = workload::workloads(export, settings);
    let mut warnings = Vec::new();
    let grant_of: Vec<u64> = workloads
        .iter()
        .map(|w| grant_bytes(w, settings.memory_headroom))
        .collect();
    // (model, memory) -> its workloads.
    let mut per_model: BTreeMap<(String, u64), Vec<usize>> = BTreeMap::new();
    for (wi, w) in workloads.iter().enumerate() {
        per_model
            .entry((w.model.clone(), w.gpu_memory_bytes))
            .or_default()
            .push(wi);
        if w.class == Class::Kept {
            warnings.push(format!("{}/{}: {}", w.namespace, w.name, w.reason));
        }
    }
    let held_uuids: std::collections::BTreeSet<&str> = workloads
        .iter()
        .flat_map(|w| w.gpus.iter().map(String::as_str))
        .collect();
    let mut held: BTreeMap<&str, usize> = BTreeMap::new();
    for g in &export.gpus {
        if held_uuids.contains(g.uuid.as_str()) {
            *held.entry(g.model.as_str()).or_default() += 1;
        }
    }
    let mut grants: Vec<Option<Grant>> = vec![None; workloads.len()];
    let mut models = Vec::new();
    for ((name, memory), members) in per_model {
        let model = Model::new(&name, memory);
        let model_slug = slug(&name);
        let mut options = BTreeMap::new();
        let mut start = BTreeMap::new();
        let mut wholes: Vec<(usize, f64)> = Vec::new();
        for &wi in &members {
            let w = &workloads[wi];
            let first = match w.class {
                Class::Shared => model.share_for(grant_of[wi], w.compute_p95),
                _ => None,
            };
            match first {
                Some(kind) => {
                    let mig = model
                        .smallest_profile(grant_of[wi], w.compute_p95)
                        .filter(|g| {
                            model
                                .product
                                .is_some_and(|p| g.compute_slices < p.compute_slices)
                        })
                        .map(|g| ShareKind::Mig(g.name));
                    let replicas = model
                        .replica_step(grant_of[wi])
                        .filter(|_| w.compute_p95 < 1.0);
                    options.insert(wi, Options { mig, replicas });
                    start.insert(wi, kind);
                }
                None => {
                    if w.class == Class::Shared {
                        warnings.push(format!(
                            "{}/{}: no share smaller than a GPU holds {:.1} GiB and {:.0} % compute: whole GPU",
                            w.namespace,
                            w.name,
                            grant_of[wi] as f64 / (1u64 << 30) as f64,
                            w.compute_p95 * 100.0
                        ));
                    }
                    for _ in 0..w.pods * w.gpus_per_pod {
                        wholes.push((wi, w.compute_mean));
                    }
                    grants[wi] = Some(Grant {
                        share: Share::Whole(w.gpus_per_pod),
                        memory_bytes: w.gpu_memory_bytes,
                        resource: ("nvidia.com/gpu".to_string(), w.gpus_per_pod),
                    });
                }
            }
        }
        let mut packer = Packer {
            model,
            workloads: &workloads,
            grants: &grant_of,
            memo: BTreeMap::new(),
        };
        let choice = choose(&mut packer, &options, start);
        let mut bins = Vec::new();
        let mut exact = true;
        let mut all_items = Vec::new();
        for (group, group_members) in Packer::groups(&choice) {
            let its = packer.items(group, &group_members);
            for &wi in &group_members {
                let kind = packer.kind_of_member(wi, group);
                let (memory_bytes, resource) = match kind {
                    ShareKind::Mig(p) => (
                        its.iter()
                            .find(|i| i.workload == wi)
                            .and_then(|i| i.profile)
                            .map_or(0, |g| model.profile_bytes(g)),
                        format!("nvidia.com/mig-{p}"),
                    ),
                    ShareKind::Replicas(k) => (
                        model.replica_bytes(k),
                        fleet::replica_resource(&model_slug, k),
                    ),
                };
                grants[wi] = Some(Grant {
                    share: Share::Shared(kind),
                    memory_bytes,
                    resource: (resource, 1),
                });
            }
            let packed: Vec<Bin> = match pack::exact(&model, group, &its, settings.exact_limit) {
                Some(b) => b,
                None => {
                    exact = false;
                    pack::first_fit_decreasing(&model, group, &its)
                }
            };
            for b in packed {
                let utilization = b
                    .items
                    .iter()
                    .map(|&i| its[i].compute_mean)
                    .sum::<f64>()
                    .min(1.0);
                bins.push(PackedGpu {
                    shape: b.shape,
                    workloads: b.items.iter().map(|&i| its[i].workload).collect(),
                    utilization,
                });
            }
            all_items.extend(its);
        }
        for (wi, mean) in &wholes {
            bins.push(PackedGpu {
                shape: pack::GpuShape::Whole,
                workloads: vec![*wi],
                utilization: *mean,
            });
        }
        let lower_bound = wholes.len() + pack::lower_bound(&model, &all_items);
        let gpus_total = export
            .gpus
            .iter()
            .filter(|g| g.model == name && g.memory_total_bytes == memory)
            .count();
        models.push(ModelPlan {
            slug: model_slug,
            gpus_before: held.get(name.as_str()).copied().unwrap_or(0),
            gpus_after: bins.len(),
            lower_bound,
            exact,
            bins,
            model: name,
            memory_bytes: memory,
            gpus_total,
        });
    }
    let grants: Vec<Grant> = grants
        .into_iter()
        .zip(&workloads)
        .map(|(g, w)| {
            g.unwrap_or(Grant {
                share: Share::Whole(w.gpus_per_pod),
                memory_bytes: w.gpu_memory_bytes,
                resource: ("nvidia.com/gpu".to_string(), w.gpus_per_pod),
            })
        })
        .collect();
    let fleet = fleet::place(export, &models);
    let mut gpus_before: Vec<(String, String, String, f64, bool)> = export
        .gpus
        .iter()
        .map(|g| {
            let is_held = held_uuids.contains(g.uuid.as_str());
            (
                g.uuid.clone(),
                g.node.clone(),
                g.model.clone(),
                g.utilization.mean,
                is_held,
            )
        })
        .collect();
    gpus_before.sort_by(|a, b| (&a.1, &a.0).cmp(&(&b.1, &b.0)));
    Advice {
        source: export.source.clone(),
        window_seconds: export.window_seconds,
        workloads,
        grants,
        models,
        fleet,
        gpus_before,
        warnings,
        settings: settings.clone(),
    }
}
