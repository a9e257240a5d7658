//! The per-claim transient CDI spec: kind `k8s.<driver>/claim`, one device
//! `<claimUID>-<device>` per allocated device, file `<vendor>-<class>_<claimUID>.json`.
//!
//! Cut from the node's spec that `crate::domain::cdi::generate` builds for the device-plugin
//! path: each claim device takes the container edits of the node-spec device of the same
//! UUID (device nodes, MIG capability nodes), and the spec-level edits (control nodes,
//! driver libraries and binaries, hooks, `NVIDIA_VISIBLE_DEVICES=void`) come along whole, so
//! both front-ends hand containers exactly the same edits. Enforced sharing (MPS, `isolation`
//! other than `none`) is refused for now, naming the request. Validated before it is returned.

use crate::domain::cdi::{Device, Spec, minimum_version, validate};
use crate::domain::config::Isolation;

use super::DraError;
use super::claim::Resolved;
use super::opaque::Strategy;

/// The CDI class of per-claim specs.
pub const CLAIM_CLASS: &str = "claim";

/// `k8s.<driver>/claim`.
pub fn claim_kind(driver: &str) -> String {
    format!("{}/{CLAIM_CLASS}", super::cdi_vendor(driver))
}

/// File name of a claim's spec: `<vendor>-<class>_<claimUID>.json` (the CDI library's
/// transient-spec convention, `/` in the id as `_`).
pub fn spec_file_name(driver: &str, claim_uid: &str) -> String {
    format!(
        "{}-{CLAIM_CLASS}_{}.json",
        super::cdi_vendor(driver),
        claim_uid.replace('/', "_")
    )
}

/// CDI device name of a claim's device: `<claimUID>-<device>`.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// Fully qualified CDI ID handed to the kubelet: `k8s.<driver>/claim=<claimUID>-<device>`.
pub fn qualified(driver: &str, claim_uid: &str, device: &str) -> String {
    format!("{}={}", claim_kind(driver), device_name(claim_uid, device))
}

/// The spec of `claim`, from the node's spec `node` (generated with the same options the
/// device plugin's spec is).
pub fn claim_spec(driver: &str, node: &Spec, claim: &Resolved) -> Result<Spec, DraError> {
    let fail = |message: String| DraError::Cdi {
        claim: claim.claim.to_string(),
        message,
    };
    let mut devices = Vec::with_capacity(claim.devices.len());
    for d in &claim.devices {
        let base = node
            .devices
            .iter()
            .find(|n| n.name == d.uuid)
            .ok_or_else(|| {
                fail(format!(
                    "device {} ({}) is not in the node's spec",
                    d.device, d.uuid
                ))
            })?;
        let edits = base.container_edits.clone();
        if let Some(c) = &d.config {
            // Enforced sharing (MPS daemons, the memory-limit hook) needs per-claim daemon
            // and limit plumbing that is not built yet: refuse rather than hand out an
            // unenforced device the claim asked to be limited.
            if c.sharing
                .as_ref()
                .is_some_and(|s| s.strategy == Strategy::Mps)
                || c.isolation != Isolation::None
            {
                return Err(fail(format!(
                    "request {}: MPS sharing and isolation other than none are not served through DRA yet",
                    d.request
                )));
            }
        }
        devices.push(Device {
            name: device_name(&claim.claim.uid, &d.device),
            container_edits: edits,
        });
    }
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    devices.dedup_by(|a, b| a.name == b.name);
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: claim_kind(driver),
        devices,
        container_edits: node.container_edits.clone(),
    };
    spec.cdi_version = minimum_version(&spec).to_string();
    validate(&spec).map_err(|e| fail(e.to_string()))?;
    Ok(spec)
}
