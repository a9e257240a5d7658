//! MIG instances made per DRA claim (dynamic MIG): create the GPU and compute instance of an
//! allocated placement, describe the MIG device that appeared, destroy it again, and list a
//! GPU's instances so a restart can remove what no recorded claim owns.
//!
//! [`InstanceOps`] is what the DRA driver (`crate::runtime::dra`) holds; [`NvmlInstances`]
//! does it through the same NVML calls, placement checks and rollback as `mig apply`
//! ([`super::mig`]), and reads the new device back through NVML discovery
//! ([`super::nvml::NvmlBackend::discover_gpu`]) so its UUID and capability minors are the
//! ones every other path sees. Each call opens its own NVML session and blocks: callers run
//! it on a blocking thread.

use std::path::PathBuf;

use crate::domain::dra::partition::{MadeInstance, Placement};
use crate::domain::inventory::Gpu;

/// Errors of the instance operations, naming the GPU and placement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InstanceError(pub String);

/// A GPU instance made for a claim, and the GPU as discovery now sees it (its `mig_devices`
/// holding only the new device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Made {
    /// What the checkpoint records.
    pub(crate) record: MadeInstance,
    /// The GPU with the new MIG device only, for the CDI generator.
    pub(crate) gpu: Gpu,
}

/// One GPU instance found on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// GPU instance id.
    pub(crate) gpu_instance_id: u32,
    /// Profile.
    pub(crate) profile: String,
    /// Placement start.
    pub(crate) start: u32,
}

/// Making and removing MIG instances for claims.
pub(crate) trait InstanceOps: Send + Sync + std::fmt::Debug {
    /// Create the instance of `at` (GPU instance and a full compute instance).
    fn create(&self, at: &Placement) -> Result<Made, InstanceError>;
    /// Destroy the instance `made` records (gone already: success).
    fn destroy(&self, made: &MadeInstance) -> Result<(), InstanceError>;
    /// The GPU instances of GPU `index`, which must still be `uuid`.
    fn instances(&self, index: u32, uuid: &str) -> Result<Vec<Found>, InstanceError>;
}

/// [`InstanceOps`] through NVML.
#[derive(Debug, Clone)]
pub(crate) struct NvmlInstances {
    /// The NVML library (`--nvml-lib`; `None`: the system's).
    pub(crate) lib: Option<PathBuf>,
    /// Where `driver/nvidia-caps/mig-minors` is (normally `/proc`).
    pub(crate) proc_root: PathBuf,
}

fn err(e: impl std::fmt::Display) -> InstanceError {
    InstanceError(e.to_string())
}

impl InstanceOps for NvmlInstances {
    fn create(&self, at: &Placement) -> Result<Made, InstanceError> {
        let nvml = super::nvml::open_nvml(self.lib.as_deref()).map_err(err)?;
        let (gi, ci) =
            super::mig::create_at(&nvml, at.gpu_index, &at.gpu_uuid, &at.profile, at.start)
                .map_err(err)?;
        let backend = super::nvml::NvmlBackend::new(self.lib.clone(), self.proc_root.clone());
        let described = backend.discover_gpu(&nvml, at.gpu_index).map_err(err);
        let made = described.and_then(|mut gpu| {
            gpu.mig_devices
                .retain(|m| m.gpu_instance_id == gi && m.compute_instance_id == ci);
            let mig = gpu.mig_devices.first().ok_or_else(|| {
                InstanceError(format!(
                    "GPU {} ({}): the {}@{} instance made (GPU instance {gi}) has no MIG device",
                    at.gpu_index, at.gpu_uuid, at.profile, at.start
                ))
            })?;
            let record = MadeInstance {
                gpu_uuid: at.gpu_uuid.clone(),
                gpu_index: at.gpu_index,
                profile: at.profile.clone(),
                start: at.start,
                gpu_instance_id: gi,
                compute_instance_id: ci,
                uuid: mig.uuid.clone(),
            };
            Ok(Made { record, gpu })
        });
        if made.is_err() {
            // Not describable, not handed out: do not leave it behind.
            let _ = super::mig::destroy_at(&nvml, at.gpu_index, gi, &at.profile, at.start);
        }
        made
    }

    fn destroy(&self, made: &MadeInstance) -> Result<(), InstanceError> {
        let nvml = super::nvml::open_nvml(self.lib.as_deref()).map_err(err)?;
        let now = super::mig::read_gpu(&nvml, made.gpu_index).map_err(err)?;
        if now.facts.uuid != made.gpu_uuid {
            return Err(InstanceError(format!(
                "GPU {} is {} now, not {}: not destroying GPU instance {} there",
                made.gpu_index, now.facts.uuid, made.gpu_uuid, made.gpu_instance_id
            )));
        }
        super::mig::destroy_at(
            &nvml,
            made.gpu_index,
            made.gpu_instance_id,
            &made.profile,
            made.start,
        )
        .map_err(err)
    }

    fn instances(&self, index: u32, uuid: &str) -> Result<Vec<Found>, InstanceError> {
        let nvml = super::nvml::open_nvml(self.lib.as_deref()).map_err(err)?;
        let gpu = super::mig::read_gpu(&nvml, index).map_err(err)?;
        if gpu.facts.uuid != uuid {
            return Err(InstanceError(format!(
                "GPU {index} is {} now, not {uuid}",
                gpu.facts.uuid
            )));
        }
        Ok(gpu
            .instances
            .into_iter()
            .map(|g| Found {
                gpu_instance_id: g.id,
                profile: g.profile,
                start: g.start,
            })
            .collect())
    }
}
