//! The physical devices a node could advertise before sharing, by MIG strategy: whole GPUs,
//! MIG devices, or both; and which of them a sharing entry's `devices` select.

use std::collections::BTreeSet;

use crate::domain::config::{Config, DeviceRef, DeviceSelector, MigStrategy};
use crate::domain::inventory::{Gpu, Inventory, MigDevice};

use super::{GPU_RESOURCE, Physical, PlanError, ResourceKind, Result};

/// A physical device that could be advertised, before sharing.
#[derive(Debug, Clone)]
pub(super) struct Candidate<'a> {
    pub(super) resource: String,
    pub(super) kind: ResourceKind,
    pub(super) gpu: &'a Gpu,
    pub(super) mig: Option<&'a MigDevice>,
}

impl Candidate<'_> {
    pub(super) fn physical(&self) -> Physical {
        Physical {
            uuid: self.mig.map_or(self.gpu.uuid.clone(), |m| m.uuid.clone()),
            gpu_uuid: self.gpu.uuid.clone(),
            gpu_index: self.gpu.index,
            mig_index: self.mig.map(|m| m.index),
            mig_profile: self.mig.map(|m| m.profile.clone()),
        }
    }

    pub(super) fn memory(&self) -> u64 {
        self.mig.map_or(self.gpu.memory_bytes, |m| m.memory_bytes)
    }

    pub(super) fn compute_percent(&self) -> u32 {
        match self.mig {
            None => 100,
            Some(m) if self.gpu.mig_compute_slices > 0 => {
                m.compute_slices * 100 / self.gpu.mig_compute_slices
            }
            Some(_) => 100,
        }
    }

    pub(super) fn matches(&self, r: &DeviceRef) -> bool {
        match r {
            // A GPU index selects the GPU, or all of its MIG devices for a MIG resource.
            DeviceRef::Index(i) => self.gpu.index == *i,
            DeviceRef::MigIndex(i, j) => {
                self.gpu.index == *i && self.mig.is_some_and(|m| m.index == *j)
            }
            DeviceRef::Uuid(u) => match self.mig {
                None => self.gpu.uuid == *u,
                Some(m) => {
                    m.uuid == *u
                        || legacy_mig_uuid(self.gpu, m) == *u
                        // A GPU UUID selects all of that GPU's MIG devices too.
                        || self.gpu.uuid == *u
                }
            },
        }
    }

    pub(super) fn matches_selector(&self, sel: &DeviceSelector) -> bool {
        match sel {
            DeviceSelector::All => true,
            DeviceSelector::Count(n) => self.gpu.index < *n,
            DeviceSelector::List(refs) => refs.iter().any(|r| self.matches(r)),
        }
    }
}

/// Old drivers' MIG id form, `MIG-GPU-<uuid>/<gi>/<ci>`.
fn legacy_mig_uuid(gpu: &Gpu, m: &MigDevice) -> String {
    format!(
        "MIG-{}/{}/{}",
        gpu.uuid, m.gpu_instance_id, m.compute_instance_id
    )
}

/// NVIDIA's MIG resource name: `nvidia.com/mig-<profile>` with `+` turned into `.`.
pub(crate) fn mig_resource_name(profile: &str) -> String {
    format!("nvidia.com/mig-{}", profile.replace('+', "."))
}

/// The candidates of `inv` under the config's MIG strategy, in inventory order.
pub(super) fn candidates<'a>(inv: &'a Inventory, cfg: &Config) -> Result<Vec<Candidate<'a>>> {
    let mut out = Vec::new();
    let whole = |gpu: &'a Gpu| Candidate {
        resource: GPU_RESOURCE.to_string(),
        kind: ResourceKind::Gpu,
        gpu,
        mig: None,
    };
    match cfg.mig_strategy {
        MigStrategy::None => out.extend(inv.gpus.iter().map(whole)),
        MigStrategy::Mixed => {
            for gpu in &inv.gpus {
                if gpu.mig_mode.current {
                    out.extend(gpu.mig_devices.iter().map(|m| Candidate {
                        resource: mig_resource_name(&m.profile),
                        kind: ResourceKind::Mig,
                        gpu,
                        mig: Some(m),
                    }));
                } else {
                    out.push(whole(gpu));
                }
            }
        }
        MigStrategy::Single => {
            let enabled: Vec<&Gpu> = inv.gpus.iter().filter(|g| g.mig_mode.current).collect();
            if enabled.is_empty() {
                out.extend(inv.gpus.iter().map(whole));
            } else {
                if let Some(g) = inv.gpus.iter().find(|g| !g.mig_mode.current) {
                    return Err(PlanError::SingleMixedModes {
                        path: cfg.source.clone(),
                        index: g.index,
                        uuid: g.uuid.clone(),
                    });
                }
                let profiles: BTreeSet<&str> =
                    inv.migs().map(|(_, m)| m.profile.as_str()).collect();
                if profiles.len() > 1 {
                    return Err(PlanError::SingleMixedProfiles {
                        path: cfg.source.clone(),
                        profiles: profiles.into_iter().collect::<Vec<_>>().join(", "),
                    });
                }
                out.extend(inv.migs().map(|(gpu, m)| Candidate {
                    resource: GPU_RESOURCE.to_string(),
                    kind: ResourceKind::Mig,
                    gpu,
                    mig: Some(m),
                }));
            }
        }
    }
    Ok(out)
}
