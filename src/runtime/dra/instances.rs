//! Dynamic MIG in the DRA driver: make the MIG instances a claim's placements need (undoing
//! all of them when one fails), turn each into the container edits of its MIG device through
//! the CDI generator (the node spec does not have it yet), destroy them on Unprepare, and at
//! start remove the instances on dynamic GPUs that no recorded claim owns, so a crash
//! between a create and the checkpoint leaves nothing behind.
//!
//! The NVML work is [`crate::platform::dra_mig::InstanceOps`], run on blocking threads;
//! [`super::driver::Driver`] calls this with its prepared set locked.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::domain::cdi::{ContainerEdits, GenerateOptions, generate};
use crate::domain::config::Config;
use crate::domain::dra::claim::ResolvedDevice;
use crate::domain::dra::partition::MadeInstance;
use crate::domain::inventory::Inventory;
use crate::platform::dra_mig::{InstanceError, InstanceOps, Made};
use crate::platform::dra_state::Prepared;

/// Why a claim's MIG instance was not made or destroyed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MigError {
    /// A device made on demand, on a run without NVML.
    #[error(
        "request {request}: device {device} is made on demand (flags.dra.dynamicMig), which needs the NVML backend"
    )]
    NeedsNvml { request: String, device: String },
    /// Making the instance, or its container edits, failed (every one made is undone).
    #[error("request {request}: device {device}: {source}")]
    Make {
        request: String,
        device: String,
        #[source]
        source: Box<MakeError>,
    },
    /// An instance could not be destroyed.
    #[error("{0}")]
    Destroy(InstanceError),
    /// The blocking task running the NVML call failed.
    #[error("MIG {what} task failed: {message}")]
    Task { what: &'static str, message: String },
}

/// What went wrong making one instance.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MakeError {
    /// NVML refused the create.
    #[error("{0}")]
    Create(InstanceError),
    /// The CDI generator failed on the made device.
    #[error("MIG device {uuid}: {source}")]
    Generate {
        uuid: String,
        #[source]
        source: Box<crate::domain::cdi::CdiError>,
    },
    /// The generated spec does not have the made device.
    #[error("MIG device {uuid} is not in its generated spec")]
    NotGenerated { uuid: String },
    /// The blocking task failed.
    #[error("MIG create task failed: {0}")]
    Task(String),
}

/// What [`make`] made for one claim: the container edits and the record of each dynamic
/// device, by published device name.
#[derive(Debug, Default)]
pub(crate) struct MadeForClaim {
    /// Container edits of each made MIG device.
    pub(crate) edits: BTreeMap<String, ContainerEdits>,
    /// What the checkpoint records for each.
    pub(crate) records: BTreeMap<String, MadeInstance>,
}

/// Make the instance of every device of `devices` that has a placement, in order. When one
/// fails, the ones made before it are destroyed again and the error names the device.
pub(crate) async fn make(
    ops: Option<&Arc<dyn InstanceOps>>,
    devices: &[ResolvedDevice],
    config: &Config,
) -> Result<MadeForClaim, MigError> {
    let mut out = MadeForClaim::default();
    for d in devices {
        let Some(at) = d.placement.clone() else {
            continue;
        };
        let Some(ops) = ops else {
            return Err(MigError::NeedsNvml {
                request: d.request.clone(),
                device: d.device.clone(),
            });
        };
        let (ops2, config2) = (ops.clone(), config.clone());
        let made = tokio::task::spawn_blocking(move || {
            let made = ops2.create(&at).map_err(MakeError::Create)?;
            let edits = match edits_of(&made, &config2) {
                Ok(e) => e,
                Err(e) => {
                    let _ = ops2.destroy(&made.record);
                    return Err(e);
                }
            };
            Ok::<_, MakeError>((made.record, edits))
        })
        .await
        .map_err(|e| MakeError::Task(e.to_string()))
        .and_then(|r| r);
        match made {
            Ok((record, edits)) => {
                tracing::info!(device = %d.device, gpu = record.gpu_index, profile = %record.profile,
                    start = record.start, gpu_instance = record.gpu_instance_id, mig = %record.uuid,
                    "MIG instance made for a claim");
                out.edits.insert(d.device.clone(), edits);
                out.records.insert(d.device.clone(), record);
            }
            Err(source) => {
                undo(ops, out.records.values().cloned().collect()).await;
                return Err(MigError::Make {
                    request: d.request.clone(),
                    device: d.device.clone(),
                    source: Box::new(source),
                });
            }
        }
    }
    Ok(out)
}

/// The container edits of the MIG device `made` describes: its GPU's node and its two
/// capability nodes, by the same generator and host probe as the node's spec.
fn edits_of(made: &Made, config: &Config) -> Result<ContainerEdits, MakeError> {
    let inventory = Inventory {
        source: "dra".into(),
        gpus: vec![made.gpu.clone()],
        ..Inventory::default()
    };
    let dev_root = (config.dev_root != std::path::Path::new("/")).then(|| config.dev_root.clone());
    let opts = GenerateOptions {
        kind: config.cdi_kind.clone(),
        dev_root,
        shares: None,
        driver: None,
    };
    let probe = crate::platform::cdi_host::VisibleProbe::new(
        &config.driver_root,
        config.container_driver_root.as_deref(),
    );
    let spec = generate(&inventory, &opts, &probe).map_err(|source| MakeError::Generate {
        uuid: made.record.uuid.clone(),
        source: Box::new(source),
    })?;
    spec.devices
        .into_iter()
        .find(|d| d.name == made.record.uuid)
        .map(|d| d.container_edits)
        .ok_or_else(|| MakeError::NotGenerated {
            uuid: made.record.uuid.clone(),
        })
}

/// Destroy `made`, best effort (a claim that failed half-way): failures are logged.
pub(crate) async fn undo(ops: &Arc<dyn InstanceOps>, made: Vec<MadeInstance>) {
    for m in made {
        if let Err(e) = destroy(ops, &m).await {
            tracing::error!(gpu = m.gpu_index, gpu_instance = m.gpu_instance_id, error = %e,
                "MIG instance of a failed claim not destroyed");
        }
    }
}

/// Destroy one made instance (gone already: success).
pub(crate) async fn destroy(
    ops: &Arc<dyn InstanceOps>,
    made: &MadeInstance,
) -> Result<(), MigError> {
    let (ops, m) = (ops.clone(), made.clone());
    tokio::task::spawn_blocking(move || ops.destroy(&m).map_err(MigError::Destroy))
        .await
        .map_err(|e| MigError::Task {
            what: "destroy",
            message: e.to_string(),
        })?
}

/// At start: on every dynamic GPU (`dynamic`: index and UUID), destroy the GPU instances no
/// claim of `prepared` recorded. Returns what was destroyed, as `(gpu index, GPU instance
/// id)`; failures are logged and leave the instance (a process may still run on it).
pub(crate) async fn clean_orphans(
    ops: &Arc<dyn InstanceOps>,
    dynamic: &[(u32, String)],
    prepared: &Prepared,
) -> Vec<(u32, u32)> {
    let owned: BTreeSet<(String, u32)> = prepared
        .claims
        .values()
        .flat_map(|c| c.devices.iter())
        .filter_map(|d| d.made.as_ref())
        .map(|m| (m.gpu_uuid.clone(), m.gpu_instance_id))
        .collect();
    let mut destroyed = Vec::new();
    for (index, uuid) in dynamic {
        let (ops2, uuid2, index) = (ops.clone(), uuid.clone(), *index);
        let found = tokio::task::spawn_blocking(move || ops2.instances(index, &uuid2))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        let found = match found {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(gpu = index, error = %e, "cannot list the MIG instances of a dynamic GPU");
                continue;
            }
        };
        for f in found {
            if owned.contains(&(uuid.clone(), f.gpu_instance_id)) {
                continue;
            }
            let orphan = MadeInstance {
                gpu_uuid: uuid.clone(),
                gpu_index: index,
                profile: f.profile.clone(),
                start: f.start,
                gpu_instance_id: f.gpu_instance_id,
                compute_instance_id: 0,
                uuid: String::new(),
            };
            match destroy(ops, &orphan).await {
                Ok(()) => {
                    tracing::warn!(gpu = index, gpu_instance = f.gpu_instance_id, profile = %f.profile,
                        start = f.start, "MIG instance no prepared claim owns destroyed");
                    destroyed.push((index, f.gpu_instance_id));
                }
                Err(e) => {
                    tracing::error!(gpu = index, gpu_instance = f.gpu_instance_id, error = %e,
                    "MIG instance no prepared claim owns could not be destroyed")
                }
            }
        }
    }
    destroyed
}
