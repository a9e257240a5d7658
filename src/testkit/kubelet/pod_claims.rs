//! DRA claims in the kubelet emulator's PodResources: which container holds the devices of
//! which prepared claim, as the kubelet reports them in `dynamic_resources` once it has
//! prepared a claim for a pod. The emulator's DRA side ([`super::dra`]) prepares; a test
//! (or `gpu-slicer emulate`) then says which container the claim is for.

use super::{KubeletEmulator, PodRef};
use crate::proto::podresources as pb;

/// One device of a prepared claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimDevice {
    /// Driver.
    pub(crate) driver: String,
    /// Pool.
    pub(crate) pool: String,
    /// Device name in the pool.
    pub(crate) device: String,
    /// Its CDI device IDs.
    pub(crate) cdi_ids: Vec<String>,
}

/// A prepared claim a container holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldClaim {
    /// The container.
    pub(crate) pod: PodRef,
    /// The claim's namespace.
    pub(crate) namespace: String,
    /// The claim's name.
    pub(crate) name: String,
    /// Its devices.
    pub(crate) devices: Vec<ClaimDevice>,
}

impl HeldClaim {
    /// As PodResources v1 reports it.
    pub(super) fn to_pb(&self) -> pb::DynamicResource {
        pb::DynamicResource {
            claim_name: self.name.clone(),
            claim_namespace: self.namespace.clone(),
            claim_resources: self
                .devices
                .iter()
                .map(|d| pb::ClaimResource {
                    cdi_devices: d
                        .cdi_ids
                        .iter()
                        .map(|n| pb::CdiDevice { name: n.clone() })
                        .collect(),
                    driver_name: d.driver.clone(),
                    pool_name: d.pool.clone(),
                    device_name: d.device.clone(),
                })
                .collect(),
        }
    }
}

impl KubeletEmulator {
    #[cfg(test)]
    /// Report `claim`'s devices for its container in PodResources (until
    /// [`KubeletEmulator::release`] of its pod).
    pub(crate) fn hold_claim(&self, claim: HeldClaim) {
        self.inner.state().claims.push(claim);
    }
}
