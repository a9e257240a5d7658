//! The kubelet's device-manager checkpoint (`kubelet_internal_checkpoint`) as entries: pod
//! UID, container, resource, device IDs. Pure; the usage sampler reads the file.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use super::UsageError;

/// One device-manager checkpoint entry: devices of one resource held by one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckpointEntry {
    /// Pod UID.
    pub(crate) pod_uid: String,
    /// Container name.
    pub(crate) container: String,
    /// Extended resource name.
    pub(crate) resource: String,
    /// Device IDs (every NUMA node's, merged).
    pub(crate) device_ids: Vec<String>,
}

#[derive(Deserialize)]
struct CheckpointFile {
    #[serde(rename = "Data")]
    data: CheckpointData,
    // `Checksum` is not verified: the kubelet checks it on its own reads; this reader only
    // looks, and a torn or foreign file fails to parse anyway.
}

#[derive(Deserialize)]
struct CheckpointData {
    // Go writes a nil slice as `null`.
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Option<Vec<RawEntry>>,
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName")]
    container: String,
    #[serde(rename = "ResourceName")]
    resource: String,
    #[serde(rename = "DeviceIDs", default)]
    device_ids: Option<RawDeviceIds>,
}

/// Kubelet ≥ 1.20 keys device IDs by NUMA node (`{"0": [...], "-1": [...]}`); older kubelets
/// wrote a plain list.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawDeviceIds {
    PerNuma(BTreeMap<String, Option<Vec<String>>>),
    Flat(Vec<String>),
}

/// Parse the kubelet's `kubelet_internal_checkpoint` (device manager). Entries are sorted
/// and their device IDs deduplicated; `origin` names the file in errors.
pub(crate) fn parse_checkpoint(
    text: &str,
    origin: &str,
) -> Result<Vec<CheckpointEntry>, UsageError> {
    let file: CheckpointFile = serde_json::from_str(text).map_err(|e| UsageError::Checkpoint {
        path: origin.to_string(),
        message: e.to_string(),
    })?;
    let mut out: Vec<CheckpointEntry> = file
        .data
        .entries
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            let ids: BTreeSet<String> = match e.device_ids {
                None => BTreeSet::new(),
                Some(RawDeviceIds::Flat(v)) => v.into_iter().collect(),
                Some(RawDeviceIds::PerNuma(m)) => m.into_values().flatten().flatten().collect(),
            };
            CheckpointEntry {
                pod_uid: e.pod_uid,
                container: e.container,
                resource: e.resource,
                device_ids: ids.into_iter().collect(),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.pod_uid, &a.container, &a.resource).cmp(&(&b.pod_uid, &b.container, &b.resource))
    });
    Ok(out)
}
