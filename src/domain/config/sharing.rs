//! `sharing.timeSlicing` and `sharing.mps`: their entries checked into
//! [`SharedResource`]s, one function per part of an entry (name, replicas, devices,
//! isolation), with the resource-name and device-reference rules they share with the
//! planner. Errors name the file and the entry's field.

use serde::Serialize;

use super::file::{DeviceRefValue, FileDevices, FileReplicas, FileReplicatedResource};
use super::quantity::parse_quantity;
use super::values::Isolation;
use super::{ConfigError, Result};

/// Which sharing section an entry came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum SharingKind {
    /// `sharing.timeSlicing`.
    TimeSlicing,
    /// `sharing.mps`.
    Mps,
}

impl SharingKind {
    /// Config path of the section.
    pub(crate) fn field(self) -> &'static str {
        match self {
            Self::TimeSlicing => "sharing.timeSlicing",
            Self::Mps => "sharing.mps",
        }
    }
}

/// A reference to a device in `devices:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "by", content = "value")]
pub(crate) enum DeviceRef {
    /// GPU index `i`.
    Index(u32),
    /// MIG device `i:j`.
    MigIndex(u32, u32),
    /// `GPU-…` or `MIG-…` UUID, or legacy `MIG-GPU-…/gi/ci`.
    Uuid(String),
}

impl std::fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceRef::Index(i) => write!(f, "{i}"),
            DeviceRef::MigIndex(i, j) => write!(f, "{i}:{j}"),
            DeviceRef::Uuid(u) => f.write_str(u),
        }
    }
}

/// Which devices of a resource a sharing entry applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum DeviceSelector {
    /// Every device of the resource.
    All,
    /// Devices whose GPU index is below N.
    Count(u32),
    /// Explicit references.
    List(Vec<DeviceRef>),
}

impl std::fmt::Display for DeviceSelector {
    /// As a config would write it: `all`, a count, or `[0, 1:2, GPU-…]`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSelector::All => f.write_str("all"),
            DeviceSelector::Count(n) => write!(f, "{n}"),
            DeviceSelector::List(refs) => {
                let refs: Vec<String> = refs.iter().map(ToString::to_string).collect();
                write!(f, "[{}]", refs.join(", "))
            }
        }
    }
}

impl DeviceSelector {
    /// Whether the GPU with this index and UUID is selected (a MIG reference selects no GPU).
    pub(crate) fn selects_gpu(&self, index: u32, uuid: &str) -> bool {
        match self {
            DeviceSelector::All => true,
            DeviceSelector::Count(n) => index < *n,
            DeviceSelector::List(refs) => refs.iter().any(|r| match r {
                DeviceRef::Index(i) => index == *i,
                DeviceRef::Uuid(u) => uuid == u,
                DeviceRef::MigIndex(..) => false,
            }),
        }
    }
}

/// One validated `sharing.*.resources[]` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SharedResource {
    /// Section it came from.
    pub(crate) kind: SharingKind,
    /// Position in that section's list (for error messages).
    pub(crate) position: usize,
    /// Resource whose devices are replicated, with `nvidia.com/` added.
    pub(crate) name: String,
    /// Name of the replicated resource (rename, `.shared` by default rules, or `name`).
    pub(crate) advertised_name: String,
    /// Devices replicated.
    pub(crate) devices: DeviceSelector,
    /// Replicas per device (≥ 2).
    pub(crate) replicas: u32,
    /// Isolation level.
    pub(crate) isolation: Isolation,
    /// Memory per replica in bytes (default: an even split).
    pub(crate) memory_per_replica: Option<u64>,
    /// Reject requests for more than one replica.
    pub(crate) fail_requests_greater_than_one: bool,
    /// Let one request take replicas on several GPUs.
    pub(crate) allow_multi_gpu: bool,
}

impl SharedResource {
    /// Config path of this entry, e.g. `sharing.timeSlicing.resources[0]`.
    pub(crate) fn field(&self) -> String {
        format!("{}.resources[{}]", self.kind.field(), self.position)
    }
}

/// One section's entries: checked, in file order.
pub(super) fn shared_resources(
    section: &FileReplicas,
    kind: SharingKind,
    origin: &str,
) -> Result<Vec<SharedResource>> {
    let Some(resources) = section.resources.as_ref().filter(|r| !r.is_empty()) else {
        return Err(invalid(
            origin,
            format!("{}.resources", kind.field()),
            "`[]`".into(),
            "no resources specified (drop the section to turn sharing off)".into(),
        ));
    };
    let defaults = SectionDefaults {
        rename_by_default: section.rename_by_default.unwrap_or(false),
        // The incumbent: nil means false for time-slicing and true for MPS.
        fail_requests_greater_than_one: section
            .fail_requests_greater_than_one
            .unwrap_or(kind == SharingKind::Mps),
    };
    resources
        .iter()
        .enumerate()
        .map(|(position, r)| {
            let entry = Entry {
                kind,
                position,
                origin,
            };
            entry.resource(r, &defaults)
        })
        .collect()
}

/// What a section says for all of its entries.
struct SectionDefaults {
    rename_by_default: bool,
    fail_requests_greater_than_one: bool,
}

/// One entry being checked: where it is, for its errors.
struct Entry<'a> {
    kind: SharingKind,
    position: usize,
    origin: &'a str,
}

fn invalid(origin: &str, field: String, value: String, message: String) -> ConfigError {
    ConfigError::Invalid {
        path: origin.to_string(),
        field,
        value,
        message,
    }
}

impl Entry<'_> {
    /// The path of one of the entry's fields, e.g. `sharing.mps.resources[0].replicas`.
    fn field(&self, name: &str) -> String {
        format!("{}.resources[{}].{name}", self.kind.field(), self.position)
    }

    /// `value` of the entry's field `name` breaks `message`.
    fn invalid(&self, name: &str, value: String, message: impl Into<String>) -> ConfigError {
        invalid(self.origin, self.field(name), value, message.into())
    }

    /// One entry, its fields checked in file order.
    fn resource(&self, r: &FileReplicatedResource, d: &SectionDefaults) -> Result<SharedResource> {
        let (name, advertised_name) = self.names(r, d.rename_by_default)?;
        let replicas = self.replicas(r.replicas)?;
        let devices = self.devices(r.devices.as_ref())?;
        let isolation = self.isolation(r.isolation.as_deref())?;
        let memory_per_replica = match &r.memory {
            None => None,
            Some(q) => Some(
                parse_quantity(q)
                    .map_err(|m| self.invalid("memory", format!("`{q}`"), m.to_string()))?,
            ),
        };
        Ok(SharedResource {
            kind: self.kind,
            position: self.position,
            name,
            advertised_name,
            devices,
            replicas,
            isolation,
            memory_per_replica,
            fail_requests_greater_than_one: d.fail_requests_greater_than_one,
            allow_multi_gpu: r.allow_multi_gpu.unwrap_or(false),
        })
    }

    /// The resource's name and the name it is advertised under (`rename`, `<name>.shared`
    /// by `renameByDefault`, or the name).
    fn names(
        &self,
        r: &FileReplicatedResource,
        rename_by_default: bool,
    ) -> Result<(String, String)> {
        let name = qualify(&r.name);
        check_resource_name(&name)
            .map_err(|m| self.invalid("name", format!("`{}`", r.name), m.to_string()))?;
        let advertised_name = match &r.rename {
            Some(rn) if !rn.is_empty() => {
                let rn = qualify(rn);
                check_resource_name(&rn)
                    .map_err(|m| self.invalid("rename", format!("`{rn}`"), m.to_string()))?;
                rn
            }
            _ if rename_by_default => format!("{name}.shared"),
            _ => name.clone(),
        };
        check_resource_name(&advertised_name)
            .map_err(|m| self.invalid("name", format!("`{advertised_name}`"), m.to_string()))?;
        Ok((name, advertised_name))
    }

    /// Replicas per device: 2 to 1024.
    fn replicas(&self, replicas: i64) -> Result<u32> {
        if replicas < 2 {
            return Err(self.invalid(
                "replicas",
                replicas.to_string(),
                "number of replicas must be >= 2 (drop the entry to turn sharing off)",
            ));
        }
        u32::try_from(replicas)
            .ok()
            .filter(|n| *n <= 1024)
            .ok_or_else(|| {
                self.invalid(
                    "replicas",
                    replicas.to_string(),
                    "at most 1024 replicas per device",
                )
            })
    }

    /// `devices`: all (absent or `all`), a count, one reference or a list of them.
    fn devices(&self, devices: Option<&FileDevices>) -> Result<DeviceSelector> {
        device_selector(devices, self.origin, &self.field("devices"))
    }

    /// `isolation`: as written, else `mps` under `sharing.mps` and `none` under
    /// `sharing.timeSlicing`; entries under `sharing.mps` always use MPS.
    fn isolation(&self, written: Option<&str>) -> Result<Isolation> {
        let isolation = match (written, self.kind) {
            (Some(s), _) => s
                .parse::<Isolation>()
                .map_err(|m| self.invalid("isolation", format!("`{s}`"), m.to_string()))?,
            (None, SharingKind::Mps) => Isolation::Mps,
            (None, SharingKind::TimeSlicing) => Isolation::None,
        };
        if self.kind == SharingKind::Mps && !isolation.uses_mps() {
            return Err(self.invalid(
                "isolation",
                format!("`{}`", isolation.as_str()),
                "entries under sharing.mps always use MPS (mps or memory+mps)",
            ));
        }
        Ok(isolation)
    }
}

/// Add `nvidia.com/` when the name has no domain, as the incumbent does.
pub(crate) fn qualify(name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("nvidia.com/{name}")
    }
}

/// The rule a resource name or a device reference breaks; the caller names the field and
/// the value as written ([`ConfigError::Invalid`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SharingRuleError {
    /// No `/` between domain and name.
    #[error("must be <domain>/<name>")]
    NoDomain,
    /// Longer than the 63 characters allowed.
    #[error("{0} characters; at most 63 allowed")]
    TooLong(usize),
    /// The domain is not a lower-case DNS name.
    #[error("domain `{0}` is not a lower-case DNS name")]
    Domain(String),
    /// The name part has characters outside the allowed set.
    #[error("name `{0}` must be alphanumeric with `-`, `_` or `.` inside")]
    Name(String),
    /// A negative GPU index.
    #[error("index must be >= 0")]
    NegativeIndex,
    /// Not a GPU index, MIG index or UUID.
    #[error("expected a GPU index `i`, a MIG index `i:j`, a `GPU-…` or a `MIG-…` UUID")]
    DeviceRef,
}

/// Kubernetes extended resource name rules: `<dns-domain>/<name>`, ≤ 63 characters in all
/// (the incumbent's limit), name part alphanumeric with `-`, `_`, `.` inside.
pub(crate) fn check_resource_name(name: &str) -> std::result::Result<(), SharingRuleError> {
    let Some((domain, rest)) = name.split_once('/') else {
        return Err(SharingRuleError::NoDomain);
    };
    if name.len() > 63 {
        return Err(SharingRuleError::TooLong(name.len()));
    }
    let dns_ok = !domain.is_empty()
        && domain.split('.').all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if !dns_ok {
        return Err(SharingRuleError::Domain(domain.to_string()));
    }
    let name_ok = !rest.is_empty()
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && rest
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && rest
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if !name_ok {
        return Err(SharingRuleError::Name(rest.to_string()));
    }
    Ok(())
}

/// Parse one `devices` entry given as a string.
pub(crate) fn parse_device_ref(s: &str) -> std::result::Result<DeviceRef, SharingRuleError> {
    let s = s.trim();
    if s.starts_with("GPU-") || s.starts_with("MIG-") {
        return Ok(DeviceRef::Uuid(s.to_string()));
    }
    if let Some((i, j)) = s.split_once(':') {
        if let (Ok(i), Ok(j)) = (i.parse(), j.parse()) {
            return Ok(DeviceRef::MigIndex(i, j));
        }
    } else if let Ok(i) = s.parse() {
        return Ok(DeviceRef::Index(i));
    }
    Err(SharingRuleError::DeviceRef)
}

/// A `devices`-style value (`all` or absent, a count, one reference or a list of them) as a
/// selector; `field` names it in errors (a list item as `field[i]`). Sharing entries and
/// `flags.dra.dynamicMig` take the same form.
pub(super) fn device_selector(
    devices: Option<&FileDevices>,
    origin: &str,
    field: &str,
) -> Result<DeviceSelector> {
    let bad = |field: String, value: String, message: &str| {
        invalid(origin, field, value, message.to_string())
    };
    Ok(match devices {
        None => DeviceSelector::All,
        Some(FileDevices::Word(w)) if w == "all" => DeviceSelector::All,
        Some(FileDevices::Word(w)) => DeviceSelector::List(vec![
            parse_device_ref(w).map_err(|m| bad(field.into(), format!("`{w}`"), &m.to_string()))?,
        ]),
        Some(FileDevices::Count(n)) => DeviceSelector::Count(
            u32::try_from(*n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad(field.into(), n.to_string(), "must be positive"))?,
        ),
        Some(FileDevices::List(list)) if list.is_empty() => {
            return Err(bad(
                field.into(),
                "`[]`".into(),
                "empty list selects nothing; omit `devices` for all",
            ));
        }
        Some(FileDevices::List(list)) => {
            let mut refs = Vec::new();
            for (i, v) in list.iter().enumerate() {
                let item = format!("{field}[{i}]");
                let dr = match v {
                    DeviceRefValue::Index(n) => u32::try_from(*n)
                        .map(DeviceRef::Index)
                        .map_err(|_| SharingRuleError::NegativeIndex),
                    DeviceRefValue::Text(t) => parse_device_ref(t),
                }
                .map_err(|m| bad(item.clone(), format!("`{v}`"), &m.to_string()))?;
                if refs.contains(&dr) {
                    return Err(bad(item, format!("`{dr}`"), "listed twice"));
                }
                refs.push(dr);
            }
            DeviceSelector::List(refs)
        }
    })
}
