//! The steps that take one GPU from the GPU and compute instances it has to its target.
//!
//! Deterministic and minimal: the target's placements are chosen by
//! [`node_spec::search_placements`], which keeps as many existing instances (same profile,
//! same placement, at most one compute instance spanning it) as any valid arrangement can.
//! Everything else is destroyed first (compute instances, then their GPU instance, in
//! placement order), then the missing GPU instances are created at their placements, each
//! followed by its compute instance. A GPU already in its target gets no steps, so applying
//! twice does nothing the second time.

use serde::Serialize;

use node_spec::{GiProfile, Product};

use super::select::{GpuFacts, Target};

/// What a step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Action {
    /// Remove an instance.
    Destroy,
    /// Make an instance.
    Create,
}

/// What a step acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Kind {
    /// A GPU instance (memory slices at a placement).
    GpuInstance,
    /// A compute instance inside a GPU instance.
    ComputeInstance,
}

/// One step. The JSON form (`action`, `kind`, `profile`, `placement`) is a contract; the ids
/// say which existing instance a destroy removes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Step {
    /// Destroy or create.
    pub(crate) action: Action,
    /// GPU or compute instance.
    pub(crate) kind: Kind,
    /// The GPU instance profile (for a compute instance: its GPU instance's).
    pub(crate) profile: String,
    /// Start of the GPU instance's placement, in memory slices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) placement: Option<u32>,
    /// The existing GPU instance a destroy removes.
    #[serde(skip)]
    pub(crate) gpu_instance_id: Option<u32>,
    /// The existing compute instance a destroy removes.
    #[serde(skip)]
    pub(crate) compute_instance_id: Option<u32>,
}

/// An existing compute instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CiState {
    /// Compute instance id.
    pub(crate) id: u32,
    /// Whether it spans its whole GPU instance (the only kind gpu-slicer creates).
    pub(crate) full: bool,
}

/// An existing GPU instance, as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GiState {
    /// GPU instance id.
    pub(crate) id: u32,
    /// Profile name (`3g.40gb`).
    pub(crate) profile: String,
    /// Placement start.
    pub(crate) start: u32,
    /// Its compute instances, sorted by id.
    pub(crate) compute_instances: Vec<CiState>,
}

/// Whether a GPU is in its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PlanStatus {
    /// Already there (or left alone): no steps.
    Unchanged,
    /// Steps take it there.
    Changed,
    /// It cannot get there now (MIG mode differs, or it is busy): see the reason.
    Pending,
}

/// The plan for one GPU. Serialises to the `mig apply --format json` contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct GpuPlan {
    /// NVML index.
    pub(crate) index: u32,
    /// `GPU-…` UUID.
    pub(crate) uuid: String,
    /// Where it stands.
    pub(crate) status: PlanStatus,
    /// Why it is unchanged or pending, when that is not obvious.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// The steps, in the order they run.
    pub(crate) steps: Vec<Step>,
}

impl GpuPlan {
    /// The same GPU held back for `reason` (its steps are kept so the log can show them).
    pub(crate) fn pending(mut self, reason: String) -> Self {
        self.status = PlanStatus::Pending;
        self.reason = Some(reason);
        self
    }
}

/// Plan one GPU: `product` is its product (None when it cannot do MIG), `current` its GPU
/// instances now.
pub(crate) fn plan_gpu(
    gpu: &GpuFacts,
    product: Option<&Product>,
    target: &Target,
    current: &[GiState],
) -> GpuPlan {
    let plan = |status, reason: Option<String>, steps| GpuPlan {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        status,
        reason,
        steps,
    };
    let wanted = match (target, product) {
        (Target::Untouched(why), _) => {
            return plan(PlanStatus::Unchanged, Some((*why).to_string()), Vec::new());
        }
        (Target::Disabled, _) if !gpu.mig_enabled => {
            return plan(PlanStatus::Unchanged, None, Vec::new());
        }
        (Target::Disabled, _) => {
            return plan(
                PlanStatus::Pending,
                Some("MIG mode is enabled but the layout disables it; changing MIG mode needs a GPU reset, which gpu-slicer never does".into()),
                Vec::new(),
            );
        }
        (Target::Enabled(_), _) if !gpu.mig_enabled => {
            return plan(
                PlanStatus::Pending,
                Some("MIG mode is disabled but the layout enables it; changing MIG mode needs a GPU reset, which gpu-slicer never does".into()),
                Vec::new(),
            );
        }
        (Target::Enabled(_), None) => {
            return plan(
                PlanStatus::Unchanged,
                Some("the GPU does not support MIG".into()),
                Vec::new(),
            );
        }
        (Target::Enabled(w), Some(p)) => (w, p),
    };
    let (wanted, product) = wanted;
    let steps = diff(product, wanted, current);
    match steps {
        Some(s) if s.is_empty() => plan(PlanStatus::Unchanged, None, s),
        Some(s) => plan(PlanStatus::Changed, None, s),
        // The target was checked to fit an empty GPU, and every existing instance may be
        // destroyed, so this only happens with a table that disagrees with `select`.
        None => plan(
            PlanStatus::Pending,
            Some("no placement holds the layout".into()),
            Vec::new(),
        ),
    }
}

/// The steps from `current` to `wanted`; `None` when `wanted` fits nowhere.
fn diff(
    product: &Product,
    wanted: &[&'static GiProfile],
    current: &[GiState],
) -> Option<Vec<Step>> {
    // Only instances gpu-slicer would have made are worth keeping: at most one compute
    // instance, spanning the GPU instance.
    let reusable =
        |g: &GiState| g.compute_instances.len() <= 1 && g.compute_instances.iter().all(|c| c.full);
    let keep: Vec<(&str, u32)> = current
        .iter()
        .filter(|g| reusable(g))
        .map(|g| (g.profile.as_str(), g.start))
        .collect();
    let starts = node_spec::search_placements(product, wanted, &keep)?;
    let mut targets: Vec<(&GiProfile, u32)> = wanted.iter().copied().zip(starts).collect();
    targets.sort_by_key(|(p, s)| (*s, p.name));
    let mut sorted: Vec<&GiState> = current.iter().collect();
    sorted.sort_by_key(|g| (g.start, g.id));
    let kept = |g: &GiState| {
        reusable(g)
            && targets
                .iter()
                .any(|(p, s)| p.name == g.profile && *s == g.start)
    };
    let mut steps = Vec::new();
    for g in sorted.iter().filter(|g| !kept(g)) {
        for ci in &g.compute_instances {
            steps.push(Step {
                action: Action::Destroy,
                kind: Kind::ComputeInstance,
                profile: g.profile.clone(),
                placement: Some(g.start),
                gpu_instance_id: Some(g.id),
                compute_instance_id: Some(ci.id),
            });
        }
        steps.push(Step {
            action: Action::Destroy,
            kind: Kind::GpuInstance,
            profile: g.profile.clone(),
            placement: Some(g.start),
            gpu_instance_id: Some(g.id),
            compute_instance_id: None,
        });
    }
    for &(p, start) in &targets {
        let existing = sorted
            .iter()
            .find(|g| kept(g) && g.profile == p.name && g.start == start);
        if existing.is_none() {
            steps.push(Step {
                action: Action::Create,
                kind: Kind::GpuInstance,
                profile: p.name.to_string(),
                placement: Some(start),
                gpu_instance_id: None,
                compute_instance_id: None,
            });
        }
        if existing.is_none_or(|g| g.compute_instances.is_empty()) {
            steps.push(Step {
                action: Action::Create,
                kind: Kind::ComputeInstance,
                profile: p.name.to_string(),
                placement: Some(start),
                gpu_instance_id: existing.map(|g| g.id),
                compute_instance_id: None,
            });
        }
    }
    Some(steps)
}

#[cfg(test)]
mod tests;
