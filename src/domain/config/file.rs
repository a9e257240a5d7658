//! The config file as written: NVIDIA k8s-device-plugin `version: v1` plus gpu-slicer's
//! additive extensions. Every struct denies unknown keys so a typo is an error, not a
//! silently ignored setting. The `flags` and `flags.plugin` sections are generated from
//! the settings table ([`super::settings`]); validation and defaults live in the parent
//! module and that table.

use serde::{Deserialize, Serialize};

pub(crate) use super::settings::FileFlags;

/// Top level of a config file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FileConfig {
    /// `v1` (empty means `v1`).
    #[serde(default)]
    pub(crate) version: Option<String>,
    /// Flags shared with NVIDIA's plugin and GFD.
    #[serde(default)]
    pub(crate) flags: FileFlags,
    /// NVIDIA's pattern-based resource naming; the incumbent parses and clears it.
    #[serde(default)]
    pub(crate) resources: Option<FileResources>,
    /// Time-slicing and MPS sharing.
    #[serde(default)]
    pub(crate) sharing: FileSharing,
    /// IMEX channels (accepted for compatibility; only `[]` or `[0]` are valid upstream).
    #[serde(default)]
    pub(crate) imex: Option<FileImex>,
}

/// `flags.migLayouts:`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FileMigLayouts {
    #[serde(default)]
    pub(crate) file: Option<String>,
    #[serde(default)]
    pub(crate) layout: Option<String>,
}

/// `flags.dra:`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FileDra {
    #[serde(default)]
    pub(crate) enabled: Option<bool>,
    #[serde(default)]
    pub(crate) driver_name: Option<String>,
    /// `all` or a list of GPUs whose MIG instances are created per claim.
    #[serde(default)]
    pub(crate) dynamic_mig: Option<FileDevices>,
}

/// A YAML value that is either one string or a list of strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum StringOrList {
    One(String),
    Many(Vec<String>),
}

/// `resources:` (pattern-based naming).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FileResources {
    #[serde(default)]
    pub(crate) gpus: Vec<FileResourcePattern>,
    #[serde(default)]
    pub(crate) mig: Vec<FileResourcePattern>,
}

/// One `{pattern, name}` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FileResourcePattern {
    pub(crate) pattern: String,
    pub(crate) name: String,
}

/// `imex:`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FileImex {
    #[serde(default, rename = "channelIDs")]
    pub(crate) channel_ids: Vec<u32>,
    #[serde(default)]
    pub(crate) required: bool,
}

/// `sharing:`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FileSharing {
    #[serde(default)]
    pub(crate) time_slicing: Option<FileReplicas>,
    #[serde(default)]
    pub(crate) mps: Option<FileReplicas>,
}

/// `sharing.timeSlicing` / `sharing.mps`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FileReplicas {
    #[serde(default)]
    pub(crate) rename_by_default: Option<bool>,
    #[serde(default)]
    pub(crate) fail_requests_greater_than_one: Option<bool>,
    #[serde(default)]
    pub(crate) resources: Option<Vec<FileReplicatedResource>>,
}

/// One entry of `sharing.*.resources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FileReplicatedResource {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) rename: Option<String>,
    #[serde(default)]
    pub(crate) devices: Option<FileDevices>,
    pub(crate) replicas: i64,
    /// gpu-slicer extension: `none`, `memory`, `mps`, `memory+mps`.
    #[serde(default)]
    pub(crate) isolation: Option<String>,
    /// gpu-slicer extension: memory per replica (`10Gi`, `512Mi`, bytes) instead of an even split.
    #[serde(default)]
    pub(crate) memory: Option<Quantity>,
    /// gpu-slicer extension: let one request take replicas on several GPUs.
    #[serde(default)]
    pub(crate) allow_multi_gpu: Option<bool>,
}

/// `devices:` — `all`, a count, or a list of references.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum FileDevices {
    Count(i64),
    Word(String),
    List(Vec<DeviceRefValue>),
}

/// A list entry: an index as a number, or a string (`"1"`, `"0:3"`, `GPU-…`, `MIG-…`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum DeviceRefValue {
    Index(i64),
    Text(String),
}

/// A memory quantity: bytes as a number, or a Kubernetes-style string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum Quantity {
    Bytes(u64),
    Text(String),
}

impl std::fmt::Display for DeviceRefValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceRefValue::Index(n) => write!(f, "{n}"),
            DeviceRefValue::Text(t) => f.write_str(t),
        }
    }
}

impl std::fmt::Display for Quantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Quantity::Bytes(n) => write!(f, "{n}"),
            Quantity::Text(t) => f.write_str(t),
        }
    }
}

impl std::fmt::Display for StringOrList {
    /// As a flag writes a list: comma-separated.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StringOrList::One(s) => f.write_str(s),
            StringOrList::Many(v) => f.write_str(&v.join(",")),
        }
    }
}
