//! Opaque device configuration of claims and classes for this driver:
//! `opaque: {driver: <ours>, parameters: {apiVersion: gpu-slicer.io/v1alpha1, kind: GpuConfig |
//! MigDeviceConfig, sharing: …, isolation: …}}`.
//!
//! Field names are NVIDIA's where they mean the same (`sharing.strategy: TimeSlicing | MPS`,
//! `timeSlicingConfig.interval`, `mpsConfig.defaultActiveThreadPercentage`,
//! `defaultPinnedDeviceMemoryLimit`, `defaultPerDevicePinnedMemoryLimit`), so a claim written
//! for `gpu.nvidia.com` ports with a driver-name and apiVersion change; `isolation` takes
//! gpu-slicer's values (`none`, `memory`, `mps`, `memory+mps`). Parsing is strict: an unknown
//! kind, field or value is an error naming the request and the field path. Pure; the claim
//! resolver ([`super::claim`]) applies it per request.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::domain::config::{Isolation, parse_quantity_text};

/// The `apiVersion` of our parameters.
pub(crate) const CONFIG_API_VERSION: &str = "gpu-slicer.io/v1alpha1";

/// An invalid opaque config, naming the request(s) it applies to and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("opaque config for {requests}: field `{field}`: {message}")]
pub(crate) struct ConfigError {
    /// The requests the config entry names (`all requests` when it names none).
    pub(crate) requests: String,
    /// The field path (`parameters.sharing.strategy`).
    pub(crate) field: String,
    /// What was wrong, with the value as written.
    pub(crate) message: String,
}

/// Which kind of device a config is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConfigKind {
    /// `GpuConfig`: whole GPUs.
    Gpu,
    /// `MigDeviceConfig`: MIG devices.
    Mig,
}

impl ConfigKind {
    /// The `kind` as written in `parameters`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ConfigKind::Gpu => "GpuConfig",
            ConfigKind::Mig => "MigDeviceConfig",
        }
    }

    /// What devices the kind configures, in words.
    pub(crate) fn devices(self) -> &'static str {
        match self {
            ConfigKind::Gpu => "whole GPUs",
            ConfigKind::Mig => "MIG devices",
        }
    }
}

/// A parsed config.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeviceConfig {
    /// Its kind.
    pub(crate) kind: ConfigKind,
    /// Sharing, when set.
    pub(crate) sharing: Option<Sharing>,
    /// gpu-slicer's isolation of the claim's containers on the device.
    pub(crate) isolation: Isolation,
}

/// How the claim's containers share the device.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Sharing {
    /// `TimeSlicing` or `MPS`.
    pub(crate) strategy: Strategy,
    /// Time-slice length (GPUs only).
    #[serde(default)]
    pub(crate) time_slicing_config: Option<TimeSlicingConfig>,
    /// MPS limits.
    #[serde(default)]
    pub(crate) mps_config: Option<MpsConfig>,
}

/// Sharing strategy (NVIDIA's spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(crate) enum Strategy {
    /// Time-slicing.
    TimeSlicing,
    /// MPS.
    #[serde(rename = "MPS")]
    Mps,
}

/// `timeSlicingConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TimeSlicingConfig {
    /// `Default`, `Short`, `Medium` or `Long`.
    #[serde(default)]
    pub(crate) interval: Option<Interval>,
}

/// Time-slice length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(crate) enum Interval {
    /// Driver default.
    Default,
    /// Short.
    Short,
    /// Medium.
    Medium,
    /// Long.
    Long,
}

/// `mpsConfig`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MpsConfig {
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, 1–100.
    #[serde(default)]
    pub(crate) default_active_thread_percentage: Option<u32>,
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` for every device.
    #[serde(default)]
    pub(crate) default_pinned_device_memory_limit: Option<Quantity>,
    /// Per device (index or UUID) limits.
    #[serde(default)]
    pub(crate) default_per_device_pinned_memory_limit: Option<BTreeMap<String, Quantity>>,
}

/// A Kubernetes quantity as written: a string (`10Gi`) or a bare number of bytes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub(crate) enum Quantity {
    /// A number of bytes.
    Bytes(u64),
    /// A quantity string.
    Text(String),
}

/// Why a [`Quantity`] stands for no usable number of bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QuantityError {
    /// A bare `0`.
    #[error("must be greater than 0")]
    Zero,
    /// A string the quantity parser refused (its words).
    #[error(transparent)]
    Text(crate::domain::config::QuantityError),
}

impl Quantity {
    /// The bytes it stands for.
    pub(crate) fn bytes(&self) -> Result<u64, QuantityError> {
        match self {
            Quantity::Bytes(0) => Err(QuantityError::Zero),
            Quantity::Bytes(b) => Ok(*b),
            Quantity::Text(t) => parse_quantity_text(t).map_err(QuantityError::Text),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Raw {
    api_version: String,
    kind: String,
    #[serde(default)]
    sharing: Option<Sharing>,
    #[serde(default)]
    isolation: Option<String>,
}

/// Parse `parameters` of an opaque entry for our driver. `requests` names what the entry
/// applies to, for the error.
pub(crate) fn parse(
    parameters: &serde_json::Value,
    requests: &[String],
) -> Result<DeviceConfig, ConfigError> {
    let who = if requests.is_empty() {
        "all requests".to_string()
    } else {
        format!("request {}", requests.join(", "))
    };
    let err = |field: &str, message: String| ConfigError {
        requests: who.clone(),
        field: format!(
            "parameters{}{field}",
            if field.is_empty() { "" } else { "." }
        ),
        message,
    };
    let raw: Raw = serde_path_to_error::deserialize(parameters).map_err(|e| {
        let path = e.path().to_string();
        err(
            if path == "." { "" } else { &path },
            e.into_inner().to_string(),
        )
    })?;
    if raw.api_version != CONFIG_API_VERSION {
        return Err(err(
            "apiVersion",
            format!("`{}` is not {CONFIG_API_VERSION}", raw.api_version),
        ));
    }
    let kind = match raw.kind.as_str() {
        "GpuConfig" => ConfigKind::Gpu,
        "MigDeviceConfig" => ConfigKind::Mig,
        other => {
            return Err(err(
                "kind",
                format!("unknown kind `{other}` (expected GpuConfig or MigDeviceConfig)"),
            ));
        }
    };
    let isolation = match raw.isolation.as_deref() {
        None => Isolation::None,
        Some(s) => Isolation::parse(s).ok_or_else(|| {
            err(
                "isolation",
                format!("`{s}` is not one of none, memory, mps, memory+mps"),
            )
        })?,
    };
    if let Some(s) = &raw.sharing {
        check_sharing(s, kind).map_err(|(f, m)| err(&f, m))?;
    }
    Ok(DeviceConfig {
        kind,
        sharing: raw.sharing,
        isolation,
    })
}

fn check_sharing(s: &Sharing, kind: ConfigKind) -> Result<(), (String, String)> {
    if s.time_slicing_config.is_some() && kind == ConfigKind::Mig {
        return Err((
            "sharing.timeSlicingConfig".into(),
            "MIG devices have no time-slice setting (MigDeviceConfig)".into(),
        ));
    }
    if s.time_slicing_config.is_some() && s.strategy != Strategy::TimeSlicing {
        return Err((
            "sharing.timeSlicingConfig".into(),
            "set only with strategy TimeSlicing".into(),
        ));
    }
    let Some(m) = &s.mps_config else {
        return Ok(());
    };
    if s.strategy != Strategy::Mps {
        return Err((
            "sharing.mpsConfig".into(),
            "set only with strategy MPS".into(),
        ));
    }
    if let Some(p) = m
        .default_active_thread_percentage
        .filter(|p| !(1..=100).contains(p))
    {
        return Err((
            "sharing.mpsConfig.defaultActiveThreadPercentage".into(),
            format!("{p} is not between 1 and 100"),
        ));
    }
    if let Some(q) = &m.default_pinned_device_memory_limit {
        q.bytes().map_err(|e| {
            (
                "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit".into(),
                format!("{}: {e}", quantity_text(q)),
            )
        })?;
    }
    for (dev, q) in m.default_per_device_pinned_memory_limit.iter().flatten() {
        q.bytes().map_err(|e| {
            (
                format!("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.{dev}"),
                format!("{}: {e}", quantity_text(q)),
            )
        })?;
    }
    Ok(())
}

fn quantity_text(q: &Quantity) -> String {
    match q {
        Quantity::Bytes(b) => b.to_string(),
        Quantity::Text(t) => format!("`{t}`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_one(v: serde_json::Value) -> Result<DeviceConfig, ConfigError> {
        parse(&v, &["gpu".to_string()])
    }

    #[test]
    fn nvidia_field_names_parse() {
        let c = parse_one(json!({
            "apiVersion": "gpu-slicer.io/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"}}},
            "isolation": "memory+mps"
        }))
        .unwrap();
        assert_eq!(c.kind, ConfigKind::Gpu);
        assert_eq!(c.isolation, Isolation::MemoryMps);
        assert_eq!(c.sharing.unwrap().strategy, Strategy::Mps);
        let c = parse_one(
            json!({"apiVersion": "gpu-slicer.io/v1alpha1", "kind": "MigDeviceConfig",
            "sharing": {"strategy": "TimeSlicing"}}),
        )
        .unwrap();
        assert_eq!(c.kind, ConfigKind::Mig);
    }

    #[test]
    fn unknown_kind_field_and_value_name_request_and_field() {
        let e =
            parse_one(json!({"apiVersion": "gpu-slicer.io/v1alpha1", "kind": "VfioDeviceConfig"}))
                .unwrap_err();
        assert_eq!(e.field, "parameters.kind");
        assert!(e.to_string().contains("request gpu"), "{e}");
        assert!(e.message.contains("VfioDeviceConfig"), "{e}");
        let e = parse_one(
            json!({"apiVersion": "gpu-slicer.io/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"threads": 3}}}),
        )
        .unwrap_err();
        assert_eq!(e.field, "parameters.sharing.mpsConfig.threads");
        assert!(e.message.contains("threads"), "{e}");
        let e = parse_one(
            json!({"apiVersion": "gpu-slicer.io/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "Spatial"}}),
        )
        .unwrap_err();
        assert_eq!(e.field, "parameters.sharing.strategy");
        assert!(e.message.contains("Spatial"), "{e}");
        let e = parse_one(
            json!({"apiVersion": "gpu-slicer.io/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}}),
        )
        .unwrap_err();
        assert_eq!(
            e.field,
            "parameters.sharing.mpsConfig.defaultActiveThreadPercentage"
        );
        let e =
            parse_one(json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}))
                .unwrap_err();
        assert_eq!(e.field, "parameters.apiVersion");
        let e = parse_one(
            json!({"apiVersion": "gpu-slicer.io/v1alpha1", "kind": "GpuConfig",
            "isolation": "full"}),
        )
        .unwrap_err();
        assert_eq!(e.field, "parameters.isolation");
        let e = parse_one(
            json!({"apiVersion": "gpu-slicer.io/v1alpha1", "kind": "MigDeviceConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}),
        )
        .unwrap_err();
        assert_eq!(e.field, "parameters.sharing.timeSlicingConfig");
        let e = parse_one(json!({"apiVersion": "gpu-slicer.io/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10Xi"}}}))
        .unwrap_err();
        assert!(e.message.contains("10Xi"), "{e}");
    }
}
