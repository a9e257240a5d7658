//! The `resource.k8s.io/v1` objects this driver writes (ResourceSlice, DeviceClass), as serde
//! values that serialise to exactly the API's JSON field names. Only the fields the driver
//! sets are modelled; empty optional fields are left out, so the output validates with
//! `kubernetes-validate --strict` and a server without a feature gate drops nothing we need.
//! Built by [`super::slices`] and [`super::classes`]; published by the runtime, printed by
//! `gpu-slicer dra slices`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Object metadata: the fields this driver sets.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ObjectMeta {
    /// Object name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) name: String,
    /// Name prefix the server completes (slices created through the API).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) generate_name: String,
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) labels: BTreeMap<String, String>,
    /// Owner references (the Node, so a deleted Node takes its slices along).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) owner_references: Vec<OwnerReference>,
}

/// A reference to an owning object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OwnerReference {
    /// `v1`.
    pub(crate) api_version: String,
    /// `Node`.
    pub(crate) kind: String,
    /// Owner name.
    pub(crate) name: String,
    /// Owner UID.
    pub(crate) uid: String,
    /// Whether the owner controls this object.
    #[serde(default)]
    pub(crate) controller: bool,
}

/// `resource.k8s.io/v1` ResourceSlice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ResourceSlice {
    /// `resource.k8s.io/v1`.
    pub(crate) api_version: String,
    /// `ResourceSlice`.
    pub(crate) kind: String,
    /// Metadata.
    pub(crate) metadata: ObjectMeta,
    /// Spec.
    pub(crate) spec: ResourceSliceSpec,
}

/// ResourceSlice spec (node-local slices only: `nodeName` is always set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ResourceSliceSpec {
    /// Driver name.
    pub(crate) driver: String,
    /// The pool (named after the node).
    pub(crate) pool: ResourcePool,
    /// The node whose devices these are.
    pub(crate) node_name: String,
    /// Devices, at most 128 (64 when any carries taints or consumes counters). Left out of a
    /// slice that carries counter sets on 1.35+ servers (a slice holds one or the other).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) devices: Vec<Device>,
    /// Counter sets the pool's partitionable devices draw from (dynamic MIG): at most 8
    /// per slice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) shared_counters: Vec<CounterSet>,
}

/// A named set of counters devices consume from (KEP-4815, partitionable devices).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CounterSet {
    /// DNS label, unique in the pool.
    pub(crate) name: String,
    /// Counters by DNS-label name, at most 32.
    pub(crate) counters: BTreeMap<String, Counter>,
}

/// A counter's quantity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Counter {
    /// Quantity (`1`, `7`).
    pub(crate) value: String,
}

/// What one device takes from one counter set when it is allocated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CounterConsumption {
    /// The counter set's name.
    pub(crate) counter_set: String,
    /// Counters by name and the amount taken.
    pub(crate) counters: BTreeMap<String, Counter>,
}

/// Pool of a slice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ResourcePool {
    /// Pool name.
    pub(crate) name: String,
    /// Bumped on every change; consumers only use the highest generation.
    pub(crate) generation: i64,
    /// How many slices the pool has at this generation.
    pub(crate) resource_slice_count: i64,
}

/// One device of a slice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Device {
    /// DNS label, unique in the pool, stable across restarts.
    pub(crate) name: String,
    /// Attributes by qualified name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) attributes: BTreeMap<String, Attribute>,
    /// Capacity by qualified name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) capacity: BTreeMap<String, Capacity>,
    /// Taints of an unhealthy device (needs `DRADeviceTaints` on 1.34/1.35 servers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) taints: Vec<Taint>,
    /// Whether several claims may hold shares of it (consumable capacity; needs
    /// `DRAConsumableCapacity`, beta and on from 1.36).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) allow_multiple_allocations: Option<bool>,
    /// The counters it takes from its GPU's counter set (a dynamic MIG placement or the
    /// whole GPU it partitions; needs `DRAPartitionableDevices`, beta and on from 1.36).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) consumes_counters: Vec<CounterConsumption>,
}

/// A device attribute: exactly one of its four value kinds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum Attribute {
    /// Integer.
    Int(i64),
    /// Boolean.
    Bool(bool),
    /// String, at most 64 characters.
    String(String),
    /// Semantic version.
    Version(String),
}

/// A capacity: a quantity, and how claims consume it on a shared device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Capacity {
    /// Quantity in Kubernetes form (`80Gi`, `14`).
    pub(crate) value: String,
    /// How much a request takes (devices with `allowMultipleAllocations` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) request_policy: Option<RequestPolicy>,
}

impl Capacity {
    /// A plain quantity.
    pub(crate) fn of(value: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            request_policy: None,
        }
    }
}

/// `requestPolicy` of a consumable capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RequestPolicy {
    /// Taken by a request that does not name this capacity.
    pub(crate) default: String,
    /// The amounts a request may take.
    pub(crate) valid_range: ValidRange,
}

/// `validRange`: a request below `min` is raised to it, one between steps is rounded up to
/// the next `min + n × step`, one above `max` makes the device ineligible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ValidRange {
    /// Smallest amount.
    pub(crate) min: String,
    /// Largest amount (a multiple of `step`).
    pub(crate) max: String,
    /// Granularity.
    pub(crate) step: String,
}

/// A device taint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Taint {
    /// Qualified key (`gpu-slicer.io/xid`).
    pub(crate) key: String,
    /// Label-value-shaped value (`79`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) value: String,
    /// `NoSchedule`.
    pub(crate) effect: String,
}

/// `resource.k8s.io/v1` DeviceClass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeviceClass {
    /// `resource.k8s.io/v1`.
    pub(crate) api_version: String,
    /// `DeviceClass`.
    pub(crate) kind: String,
    /// Metadata.
    pub(crate) metadata: ObjectMeta,
    /// Spec.
    pub(crate) spec: DeviceClassSpec,
}

/// DeviceClass spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeviceClassSpec {
    /// CEL selectors, all of which must hold.
    pub(crate) selectors: Vec<DeviceSelector>,
    /// Extended resource served by this class (KEP-5004), e.g. `nvidia.com/gpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) extended_resource_name: Option<String>,
}

/// A device selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeviceSelector {
    /// The CEL selector.
    pub(crate) cel: CelSelector,
}

/// A CEL expression over `device`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CelSelector {
    /// The expression.
    pub(crate) expression: String,
}

/// Whether `s` is a DNS label (RFC 1123): 1–63 of `a-z0-9-`, alphanumeric at both ends.
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a DNS subdomain (RFC 1123): labels joined by `.`, at most 253 characters.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A byte count as a Kubernetes quantity: `Gi` or `Mi` when exact, else plain bytes.
pub(crate) fn bytes_quantity(bytes: u64) -> String {
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;
    if bytes > 0 && bytes.is_multiple_of(GI) {
        format!("{}Gi", bytes / GI)
    } else if bytes > 0 && bytes.is_multiple_of(MI) {
        format!("{}Mi", bytes / MI)
    } else {
        bytes.to_string()
    }
}

/// A dotted version as semver: up to three numeric parts, leading zeros dropped, missing
/// parts zero (`570.124.06` → `570.124.6`, `9.0` → `9.0.0`). `None` for anything else, so a
/// version the API would reject is left out rather than published.
pub(crate) fn semver(version: &str) -> Option<String> {
    let parts: Vec<&str> = version.trim().split('.').collect();
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let mut nums = Vec::with_capacity(3);
    for p in &parts {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        nums.push(p.parse::<u64>().ok()?);
    }
    nums.resize(3, 0);
    Some(format!("{}.{}.{}", nums[0], nums[1], nums[2]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semver_drops_leading_zeros_and_fills_parts() {
        assert_eq!(semver("570.124.06").as_deref(), Some("570.124.6"));
        assert_eq!(semver("550.54").as_deref(), Some("550.54.0"));
        assert_eq!(semver("9.0").as_deref(), Some("9.0.0"));
        assert_eq!(semver("12").as_deref(), Some("12.0.0"));
        assert_eq!(semver("1.2.3.4"), None);
        assert_eq!(semver("570.x"), None);
        assert_eq!(semver(""), None);
    }

    #[test]
    fn quantities_and_dns_names() {
        assert_eq!(bytes_quantity(80 << 30), "80Gi");
        assert_eq!(bytes_quantity(81559 << 20), "81559Mi");
        assert_eq!(bytes_quantity(1000), "1000");
        assert!(is_dns_label("gpu-0-mig-1g10gb-19-3"));
        assert!(!is_dns_label("gpu-0-mig-1g.10gb"));
        assert!(!is_dns_label("-gpu"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("gpu-slicer.io"));
        assert!(!is_dns_subdomain("Gpu-slicer.io"));
    }

    #[test]
    fn attributes_serialise_as_one_keyed_value() {
        let json = serde_json::to_string(&Attribute::Version("9.0.0".into())).unwrap();
        assert_eq!(json, r#"{"version":"9.0.0"}"#);
        let json = serde_json::to_string(&Attribute::Int(3)).unwrap();
        assert_eq!(json, r#"{"int":3}"#);
    }
}
