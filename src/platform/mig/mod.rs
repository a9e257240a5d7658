//! MIG instances through NVML: read each GPU's GPU and compute instances, and run the
//! destroy/create steps of [`crate::domain::miglayout`], rolling a GPU back when a step fails.
//!
//! nvml-wrapper 0.13 wraps only `nvmlDeviceGetGpuInstanceProfileInfo` (and
//! `possible_placements`, which always returns an empty list: its Vec's length is never set).
//! Every other call (in `raw`: `nvmlDeviceGetGpuInstancePossiblePlacements_v2`,
//! `nvmlDeviceCreateGpuInstanceWithPlacement`, `nvmlDeviceGetGpuInstances`,
//! `nvmlGpuInstanceGetInfo`, `nvmlGpuInstanceDestroy`,
//! `nvmlGpuInstanceGetComputeInstanceProfileInfo`, `nvmlGpuInstanceCreateComputeInstance`,
//! `nvmlGpuInstanceGetComputeInstances`, `nvmlComputeInstanceGetInfo_v2`,
//! `nvmlComputeInstanceDestroy`) goes through the wrapper's own loaded symbol table
//! (`Nvml::lib()`), typed by nvml-wrapper-sys, so one library handle serves both. Each raw
//! call is in one small function with its safety argument.
//!
//! The planner's placements come from the product tables in `node_spec`; [`read`] checks them
//! against what the driver reports (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`) and
//! refuses a GPU where they differ, so a driver with other placements is never driven from a
//! stale table.
//!
//! Every call blocks: callers run this on a blocking thread.

use node_spec::{GiProfile, Product};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{nvmlGpuInstance_t, nvmlGpuInstanceProfileInfo_t};

use crate::domain::miglayout::steps::CiState;
use crate::domain::miglayout::{
    Action, GiState, GpuFacts, GpuPlan, Kind, MigLayoutError, MigPartedFile, Step,
};

mod raw;

use raw::{
    ci_create, ci_destroy, compute_instances, full_ci_profile, gi_create, gi_destroy, gi_info,
    gi_profile_info, gpu_instances, placements,
};

/// Errors reading or changing MIG instances.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MigOpError {
    /// An NVML call failed.
    #[error("NVML: {call} on GPU {gpu}: {}", nvml_words(.source))]
    Nvml {
        call: &'static str,
        gpu: u32,
        #[source]
        source: NvmlError,
    },
    /// The driver's placements for a profile are not the ones gpu-slicer's table has.
    #[error(
        "GPU {gpu} ({product}): the driver reports placements {driver:?} for `{profile}`, gpu-slicer's table has {table:?}; refusing to plan from a table that does not match"
    )]
    Placements {
        gpu: u32,
        product: String,
        profile: &'static str,
        driver: Vec<(u32, u32)>,
        table: Vec<(u32, u32)>,
    },
    /// A step names an instance that is not there (the GPU changed under us).
    #[error("GPU {gpu}: no {what} for step {step}")]
    Missing {
        gpu: u32,
        what: &'static str,
        step: String,
    },
    /// The GPU's product has no MIG profile table (a rollback cannot plan).
    #[error("not a MIG product")]
    NotMigProduct,
    /// A rollback step failed (`step` as [`describe`] writes it).
    #[error("`{step}`: {error}")]
    RollbackStep {
        step: String,
        error: Box<MigOpError>,
    },
    /// GPU `gpu` has another UUID than the one the caller holds.
    #[error("GPU {gpu} is {now} now, not {expected}: the GPUs were re-enumerated")]
    ReEnumerated {
        gpu: u32,
        now: String,
        expected: String,
    },
    /// MIG mode is off on the GPU (gpu-slicer never changes it).
    #[error("GPU {gpu} ({uuid}): MIG mode is off")]
    MigOff { gpu: u32, uuid: String },
    /// The steps failed on the GPU (and were rolled back as far as NVML allowed).
    #[error("GPU {gpu} ({uuid}): {failure}")]
    Apply {
        gpu: u32,
        uuid: String,
        failure: Box<ApplyFailure>,
    },
    /// The instance just made is not among the GPU's instances.
    #[error("GPU {gpu} ({uuid}): the {profile}@{start} instance made is not listed")]
    NotListed {
        gpu: u32,
        uuid: String,
        profile: String,
        start: u32,
    },
}

type Result<T, E = MigOpError> = std::result::Result<T, E>;

/// One GPU as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MigGpu {
    /// Index, UUID, product, MIG mode.
    pub(crate) facts: GpuFacts,
    /// Its GPU instances (empty when MIG is off or unsupported).
    pub(crate) instances: Vec<GiState>,
}

/// Read a mig-parted layout file, bounded (a path to a huge file must not fill memory).
pub(crate) fn load_file(path: &std::path::Path) -> Result<MigPartedFile, MigLayoutError> {
    use std::io::Read;
    let origin = path.display().to_string();
    let read_err = |message: String| MigLayoutError::Read {
        file: origin.clone(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| read_err(e.to_string()))?;
    let mut text = String::new();
    file.take(crate::domain::miglayout::parse::MAX_FILE_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| read_err(e.to_string()))?;
    MigPartedFile::parse(&text, &origin)
}

/// The GPUs of a discovered inventory with the instances its MIG devices imply (the sim
/// backend's view: placements assumed as the fake driver assigns them).
pub(crate) fn from_inventory(inventory: &crate::domain::inventory::Inventory) -> Vec<MigGpu> {
    inventory
        .gpus
        .iter()
        .map(|g| MigGpu {
            facts: crate::domain::miglayout::current::facts(g),
            instances: crate::domain::miglayout::current::instances(g),
        })
        .collect()
}

/// Plan every GPU for `layout` of `file` (same order as `gpus`).
pub(crate) fn plan_all(
    file: &MigPartedFile,
    layout: &str,
    gpus: &[MigGpu],
) -> Result<Vec<GpuPlan>, MigLayoutError> {
    let facts: Vec<_> = gpus.iter().map(|g| g.facts.clone()).collect();
    let targets = crate::domain::miglayout::select(file, layout, &facts)?;
    Ok(gpus
        .iter()
        .zip(&targets)
        .map(|(g, t)| {
            let product = node_spec::lookup_product(&g.facts.product);
            crate::domain::miglayout::plan_gpu(&g.facts, product, t, &g.instances)
        })
        .collect())
}

/// PIDs of the compute processes NVML reports on GPU `index` (MIG instances included).
pub(crate) fn compute_processes(nvml: &Nvml, index: u32) -> Result<Vec<u32>> {
    let dev = nvml
        .device_by_index(index)
        .map_err(err("nvmlDeviceGetHandleByIndex_v2", index))?;
    let procs = dev
        .running_compute_processes()
        .map_err(err("nvmlDeviceGetComputeRunningProcesses_v3", index))?;
    Ok(procs.iter().map(|p| p.pid).collect())
}

/// Text of a step for messages: `create gpu-instance 3g.40gb@4`.
pub(crate) fn describe(step: &Step) -> String {
    let action = match step.action {
        Action::Create => "create",
        Action::Destroy => "destroy",
    };
    let kind = match step.kind {
        Kind::GpuInstance => "gpu-instance",
        Kind::ComputeInstance => "compute-instance",
    };
    match step.placement {
        Some(p) => format!("{action} {kind} {}@{p}", step.profile),
        None => format!("{action} {kind} {}", step.profile),
    }
}

/// An NVML error in words, naming the return codes nvml-wrapper 0.13 has no variant for.
/// Creating an instance on a taken placement answers `NVML_ERROR_INSUFFICIENT_RESOURCES`
/// (23), which the wrapper would print as "unexpected enum variant value: 23" (seen on the
/// cluster tier, `hack/e2e-cluster.sh`).
fn nvml_words(e: &NvmlError) -> String {
    use nvml_wrapper_sys::bindings as b;
    let NvmlError::UnexpectedVariant(code) = e else {
        return e.to_string();
    };
    let words = match *code {
        b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => {
            "insufficient resources: the placement, or the GPU's slices or instance count, is taken"
        }
        b::nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED => "frequency not supported",
        b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => {
            "argument version mismatch (a driver older than the call)"
        }
        b::nvmlReturn_enum_NVML_ERROR_DEPRECATED => "deprecated call",
        b::nvmlReturn_enum_NVML_ERROR_NOT_READY => "not ready",
        b::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND => "GPU not found",
        b::nvmlReturn_enum_NVML_ERROR_INVALID_STATE => "invalid state",
        _ => return format!("NVML return code {code}"),
    };
    format!("{words} (NVML return code {code})")
}

fn err(call: &'static str, gpu: u32) -> impl FnOnce(NvmlError) -> MigOpError {
    move |source| MigOpError::Nvml { call, gpu, source }
}

/// Read every GPU's MIG facts and instances.
pub(crate) fn read(nvml: &Nvml) -> Result<Vec<MigGpu>> {
    let count = nvml
        .device_count()
        .map_err(err("nvmlDeviceGetCount_v2", 0))?;
    (0..count).map(|i| read_gpu(nvml, i)).collect()
}

/// Read one GPU by index.
pub(crate) fn read_gpu(nvml: &Nvml, index: u32) -> Result<MigGpu> {
    let dev = nvml
        .device_by_index(index)
        .map_err(err("nvmlDeviceGetHandleByIndex_v2", index))?;
    let uuid = dev.uuid().map_err(err("nvmlDeviceGetUUID", index))?;
    let product_name = dev.name().map_err(err("nvmlDeviceGetName", index))?;
    let mig_enabled = match dev.mig_mode() {
        Ok(m) => m.current == 1,
        Err(NvmlError::NotSupported) => false,
        Err(e) => return Err(err("nvmlDeviceGetMigMode", index)(e)),
    };
    let facts = GpuFacts {
        index,
        uuid,
        product: product_name.clone(),
        mig_enabled,
    };
    let Some(product) = node_spec::lookup_product(&product_name).filter(|_| mig_enabled) else {
        return Ok(MigGpu {
            facts,
            instances: Vec::new(),
        });
    };
    let mut instances: Vec<GiState> = list_gis(nvml, &dev, index, product)?
        .into_iter()
        .map(|(_, g)| g)
        .collect();
    instances.sort_by_key(|g| (g.start, g.id));
    Ok(MigGpu { facts, instances })
}

/// The profile's NVML id as the driver reports it, checked against the table.
fn profile_id(dev: &Device<'_>, index: u32, p: &GiProfile) -> Result<u32> {
    let info: nvmlGpuInstanceProfileInfo_t =
        gi_profile_info(dev, p.index).map_err(err("nvmlDeviceGetGpuInstanceProfileInfo", index))?;
    Ok(info.id)
}

/// Every GPU instance of `dev` with its handle, the placement tables checked on the way.
fn list_gis(
    nvml: &Nvml,
    dev: &Device<'_>,
    index: u32,
    product: &'static Product,
) -> Result<Vec<(nvmlGpuInstance_t, GiState)>> {
    let mut out = Vec::new();
    for p in node_spec::gi_profiles(product) {
        let id = match profile_id(dev, index, p) {
            Ok(id) => id,
            // A driver without this profile (older branches lack 1g.20gb): nothing of it exists.
            Err(MigOpError::Nvml {
                source: NvmlError::NotSupported | NvmlError::InvalidArg,
                ..
            }) => continue,
            Err(e) => return Err(e),
        };
        let driver = placements(nvml, dev, id)
            .map_err(err("nvmlDeviceGetGpuInstancePossiblePlacements_v2", index))?;
        let table: Vec<(u32, u32)> = p.starts.iter().map(|&s| (s, p.memory_slices)).collect();
        if driver != table {
            return Err(MigOpError::Placements {
                gpu: index,
                product: product.name.to_string(),
                profile: p.name,
                driver,
                table,
            });
        }
        for gi in gpu_instances(nvml, dev, id, p.instance_count)
            .map_err(err("nvmlDeviceGetGpuInstances", index))?
        {
            let info = gi_info(nvml, gi).map_err(err("nvmlGpuInstanceGetInfo", index))?;
            let cis = compute_instances(nvml, gi, p.compute_slices)
                .map_err(err("nvmlGpuInstanceGetComputeInstances", index))?;
            out.push((
                gi,
                GiState {
                    id: info.id,
                    profile: p.name.to_string(),
                    start: info.placement.start,
                    compute_instances: cis
                        .iter()
                        .map(|(id, full, _)| CiState {
                            id: *id,
                            full: *full,
                        })
                        .collect(),
                },
            ));
        }
    }
    Ok(out)
}

/// Why applying a plan to a GPU failed, and where the rollback left it.
#[derive(Debug)]
pub(crate) struct ApplyFailure {
    /// The step that failed (`create gpu-instance 2g.20gb@0`).
    pub(crate) step: String,
    /// What NVML said.
    pub(crate) error: MigOpError,
    /// `Ok`: the GPU holds its previous layout again; `Err`: why it could not be restored.
    pub(crate) rollback: Result<()>,
}

impl std::fmt::Display for ApplyFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step `{}` failed: {}; ", self.step, self.error)?;
        match &self.rollback {
            Ok(()) => write!(f, "rolled back to the previous layout"),
            Err(e) => write!(f, "rollback failed: {e}"),
        }
    }
}

/// Its message names the step's error and the rollback's: no separate source.
impl std::error::Error for ApplyFailure {}

/// Run `steps` on `gpu` (as read before planning). When a step fails, plan from where the GPU
/// stopped back to the profiles it had and run that, as far as NVML allows.
pub(crate) fn apply(nvml: &Nvml, gpu: &MigGpu, steps: &[Step]) -> Result<(), Box<ApplyFailure>> {
    let index = gpu.facts.index;
    for step in steps {
        if let Err(error) = run_step(nvml, index, step) {
            tracing::warn!(gpu = index, step = %describe(step), error = %error, "MIG step failed; rolling back");
            let rollback = roll_back(nvml, gpu);
            return Err(Box::new(ApplyFailure {
                step: describe(step),
                error,
                rollback,
            }));
        }
        tracing::info!(gpu = index, step = %describe(step), "MIG step done");
    }
    Ok(())
}

fn roll_back(nvml: &Nvml, before: &MigGpu) -> Result<()> {
    let product =
        node_spec::lookup_product(&before.facts.product).ok_or(MigOpError::NotMigProduct)?;
    let table = node_spec::gi_profiles(product);
    let previous: Vec<&'static GiProfile> = before
        .instances
        .iter()
        .filter_map(|g| table.iter().find(|t| t.name == g.profile))
        .collect();
    let now = read_gpu(nvml, before.facts.index)?;
    let plan = crate::domain::miglayout::plan_gpu(
        &now.facts,
        Some(product),
        &crate::domain::miglayout::Target::Enabled(previous),
        &now.instances,
    );
    for step in &plan.steps {
        run_step(nvml, before.facts.index, step).map_err(|e| MigOpError::RollbackStep {
            step: describe(step),
            error: Box::new(e),
        })?;
    }
    Ok(())
}

fn run_step(nvml: &Nvml, index: u32, step: &Step) -> Result<()> {
    let dev = nvml
        .device_by_index(index)
        .map_err(err("nvmlDeviceGetHandleByIndex_v2", index))?;
    let name = dev.name().map_err(err("nvmlDeviceGetName", index))?;
    let missing = |what| MigOpError::Missing {
        gpu: index,
        what,
        step: describe(step),
    };
    let product = node_spec::lookup_product(&name).ok_or_else(|| missing("MIG product"))?;
    let profile = node_spec::gi_profiles(product)
        .iter()
        .find(|p| p.name == step.profile)
        .ok_or_else(|| missing("profile"))?;
    let gis = list_gis(nvml, &dev, index, product)?;
    let by_id = |id: Option<u32>| gis.iter().find(|(_, g)| Some(g.id) == id);
    let at_placement = || {
        gis.iter()
            .find(|(_, g)| Some(g.start) == step.placement && g.profile == step.profile)
    };
    match (step.action, step.kind) {
        (Action::Destroy, Kind::ComputeInstance) => {
            let (gi, _) = by_id(step.gpu_instance_id).ok_or_else(|| missing("GPU instance"))?;
            let cis = compute_instances(nvml, *gi, profile.compute_slices)
                .map_err(err("nvmlGpuInstanceGetComputeInstances", index))?;
            let (_, _, ci) = cis
                .iter()
                .find(|(id, _, _)| Some(*id) == step.compute_instance_id)
                .ok_or_else(|| missing("compute instance"))?;
            ci_destroy(nvml, *ci).map_err(err("nvmlComputeInstanceDestroy", index))
        }
        (Action::Destroy, Kind::GpuInstance) => {
            let (gi, _) = by_id(step.gpu_instance_id).ok_or_else(|| missing("GPU instance"))?;
            gi_destroy(nvml, *gi).map_err(err("nvmlGpuInstanceDestroy", index))
        }
        (Action::Create, Kind::GpuInstance) => {
            let id = profile_id(&dev, index, profile)?;
            let start = step.placement.ok_or_else(|| missing("placement"))?;
            gi_create(nvml, &dev, id, start, profile.memory_slices)
                .map_err(err("nvmlDeviceCreateGpuInstanceWithPlacement", index))
        }
        (Action::Create, Kind::ComputeInstance) => {
            let (gi, _) = at_placement().ok_or_else(|| missing("GPU instance"))?;
            let ci_profile = full_ci_profile(nvml, *gi, profile.compute_slices)
                .map_err(err("nvmlGpuInstanceGetComputeInstanceProfileInfo", index))?
                .ok_or_else(|| missing("full-size compute-instance profile"))?;
            ci_create(nvml, *gi, ci_profile.id)
                .map_err(err("nvmlGpuInstanceCreateComputeInstance", index))
        }
    }
}

/// Create a GPU instance of `profile` at `start` with its full-size compute instance on GPU
/// `index` (whose UUID must still be `uuid`): the create steps of `mig apply`, rolled back the
/// same way when one fails. Returns the new GPU and compute instance ids.
pub(crate) fn create_at(
    nvml: &Nvml,
    index: u32,
    uuid: &str,
    profile: &str,
    start: u32,
) -> Result<(u32, u32)> {
    let gpu = read_gpu(nvml, index)?;
    if gpu.facts.uuid != uuid {
        return Err(MigOpError::ReEnumerated {
            gpu: index,
            now: gpu.facts.uuid,
            expected: uuid.to_string(),
        });
    }
    if !gpu.facts.mig_enabled {
        return Err(MigOpError::MigOff {
            gpu: index,
            uuid: uuid.to_string(),
        });
    }
    let step = |kind| Step {
        action: Action::Create,
        kind,
        profile: profile.to_string(),
        placement: Some(start),
        gpu_instance_id: None,
        compute_instance_id: None,
    };
    let steps = [step(Kind::GpuInstance), step(Kind::ComputeInstance)];
    apply(nvml, &gpu, &steps).map_err(|failure| MigOpError::Apply {
        gpu: index,
        uuid: uuid.to_string(),
        failure,
    })?;
    let now = read_gpu(nvml, index)?;
    now.instances
        .iter()
        .find(|g| g.profile == profile && g.start == start)
        .and_then(|g| g.compute_instances.first().map(|c| (g.id, c.id)))
        .ok_or_else(|| MigOpError::NotListed {
            gpu: index,
            uuid: uuid.to_string(),
            profile: profile.to_string(),
            start,
        })
}

/// Destroy GPU instance `gi` of GPU `index` (and its compute instances), when it is still
/// the `profile` instance at `start`; one that is gone already is success (an Unprepare the
/// kubelet repeats). A failed step rolls the GPU back as `mig apply` does.
pub(crate) fn destroy_at(
    nvml: &Nvml,
    index: u32,
    gi: u32,
    profile: &str,
    start: u32,
) -> Result<()> {
    let gpu = read_gpu(nvml, index)?;
    let Some(found) = gpu
        .instances
        .iter()
        .find(|g| g.id == gi && g.profile == profile && g.start == start)
    else {
        return Ok(());
    };
    let mut steps: Vec<Step> = found
        .compute_instances
        .iter()
        .map(|c| Step {
            action: Action::Destroy,
            kind: Kind::ComputeInstance,
            profile: profile.to_string(),
            placement: Some(start),
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(c.id),
        })
        .collect();
    steps.push(Step {
        action: Action::Destroy,
        kind: Kind::GpuInstance,
        profile: profile.to_string(),
        placement: Some(start),
        gpu_instance_id: Some(gi),
        compute_instance_id: None,
    });
    apply(nvml, &gpu, &steps).map_err(|failure| MigOpError::Apply {
        gpu: index,
        uuid: gpu.facts.uuid.clone(),
        failure,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_the_wrapper_does_not_know_are_named() {
        let taken = MigOpError::Nvml {
            call: "nvmlDeviceCreateGpuInstanceWithPlacement",
            gpu: 0,
            source: NvmlError::UnexpectedVariant(23),
        };
        assert_eq!(
            taken.to_string(),
            "NVML: nvmlDeviceCreateGpuInstanceWithPlacement on GPU 0: insufficient resources: \
             the placement, or the GPU's slices or instance count, is taken (NVML return code 23)"
        );
        assert_eq!(
            nvml_words(&NvmlError::UnexpectedVariant(999)),
            "NVML return code 999"
        );
        assert_eq!(nvml_words(&NvmlError::InUse), NvmlError::InUse.to_string());
    }
}
