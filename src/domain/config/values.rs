//! The values settings take: the config file's fixed words (`mixed`, `cdi-cri`,
//! `memory+mps`), each spelled once in a `spelled!` table that gives the parser (with the
//! words it expects), the spelling and the serde form; and the checks of the other
//! settings' values, as [`Refusal`]s the resolver ([`super::settings`]) blames on the flag,
//! variable or file field that set them.

use std::path::PathBuf;

use super::file::StringOrList;
use super::origin::Refusal;

/// An enum of words: variants with the word each is written as. Gives `as_str`,
/// `FromStr` (refusing with `expected a, b or c`), `Display` and `Serialize` (the word), so
/// the config file, flags, environment variables and JSON output spell it the same.
macro_rules! spelled {
    (
        $(#[$meta:meta])*
        pub(crate) enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $word:literal, )+
        }
    ) => {
        $(#[$meta])*
        pub(crate) enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// The word the config file and the command line use.
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => $word, )+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = ValueError;

            /// The variant `text` spells, exactly (no case folding, as NVIDIA's plugin).
            fn from_str(text: &str) -> Result<Self, ValueError> {
                match text {
                    $( $word => Ok(Self::$variant), )+
                    _ => Err(ValueError::Word(&[$($word),+])),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

/// Why a value is refused before the resolver names where it was set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ValueError {
    /// A word the setting does not take: `expected a, b or c`.
    #[error("{}", expected(.0))]
    Word(&'static [&'static str]),
}

impl From<ValueError> for Refusal {
    fn from(e: ValueError) -> Self {
        Self::from(e.to_string())
    }
}

/// `expected a, b or c`.
fn expected(words: &[&str]) -> String {
    match words.split_last() {
        Some((last, [])) => format!("expected {last}"),
        Some((last, rest)) => format!("expected {} or {last}", rest.join(", ")),
        None => "expected nothing".to_string(),
    }
}

spelled! {
    /// How MIG devices are exposed.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub(crate) enum MigStrategy {
        /// MIG-enabled GPUs are exposed as whole GPUs.
        #[default]
        None = "none",
        /// All MIG devices identical and exposed as `nvidia.com/gpu`.
        Single = "single",
        /// One `nvidia.com/mig-<profile>` resource per profile.
        Mixed = "mixed",
    }
}

spelled! {
    /// What Allocate puts in the container response besides the checks.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    pub(crate) enum DeviceListStrategy {
        /// `NVIDIA_VISIBLE_DEVICES=<ids>`.
        Envvar = "envvar",
        /// Per-device mounts under `/var/run/nvidia-container-devices`.
        VolumeMounts = "volume-mounts",
        /// `cdi.k8s.io/…` container annotations.
        CdiAnnotations = "cdi-annotations",
        /// `cdi_devices` in the response (CRI field).
        CdiCri = "cdi-cri",
    }
}

spelled! {
    /// How devices are named to the runtime in envvar / volume-mounts responses.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub(crate) enum DeviceIdStrategy {
        /// UUIDs.
        #[default]
        Uuid = "uuid",
        /// Indices (`i` or `i:j`).
        Index = "index",
    }
}

spelled! {
    /// Preferred-allocation policy for replicas and MIG devices.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub(crate) enum AllocationPolicy {
        /// One replica per GPU where possible.
        #[default]
        Distributed = "distributed",
        /// Fill one GPU before the next.
        Packed = "packed",
    }
}

spelled! {
    /// Isolation level of a shared resource.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord, Hash)]
    pub(crate) enum Isolation {
        /// Plain time-slicing: nothing enforced.
        #[default]
        None = "none",
        /// Driver-enforced memory limit per container.
        Memory = "memory",
        /// MPS compute share and pinned-memory limit.
        Mps = "mps",
        /// Both.
        MemoryMps = "memory+mps",
    }
}

impl Isolation {
    /// Parse the config spelling (`None` for anything else).
    pub(crate) fn parse(s: &str) -> Option<Self> {
        s.parse().ok()
    }

    /// Whether MPS control daemons are involved.
    pub(crate) fn uses_mps(self) -> bool {
        matches!(self, Self::Mps | Self::MemoryMps)
    }

    /// Whether the driver memory limit is set per container.
    pub(crate) fn uses_memory_limit(self) -> bool {
        matches!(self, Self::Memory | Self::MemoryMps)
    }
}

/// A word of a `spelled!` enum.
pub(super) fn word<T: std::str::FromStr<Err = ValueError>>(text: &str) -> Result<T, Refusal> {
    text.parse().map_err(Refusal::from)
}

/// A flag as written (the file and the command line have already read the boolean).
pub(super) fn boolean(value: &bool) -> Result<bool, Refusal> {
    Ok(*value)
}

/// A path taken as written.
pub(super) fn path(text: &str) -> Result<PathBuf, Refusal> {
    Ok(PathBuf::from(text))
}

/// An absolute path; empty means unset (the default applies).
pub(super) fn absolute_or_unset(text: &str) -> Result<Option<PathBuf>, Refusal> {
    if text.is_empty() {
        return Ok(None);
    }
    if !text.starts_with('/') {
        return Err("must be an absolute path".into());
    }
    Ok(Some(PathBuf::from(text)))
}

/// `deviceListStrategy`: one word, a list, or comma-separated words; duplicates dropped,
/// in the enum's order, at least one.
pub(super) fn strategies(value: &StringOrList) -> Result<Vec<DeviceListStrategy>, Refusal> {
    let items: &[String] = match value {
        StringOrList::One(s) => std::slice::from_ref(s),
        StringOrList::Many(v) => v,
    };
    let mut out = Vec::new();
    for s in items.iter().flat_map(|s| s.split(',')).map(str::trim) {
        let strategy = s
            .parse::<DeviceListStrategy>()
            .map_err(|e| Refusal::of_part(s, e.to_string()))?;
        if !out.contains(&strategy) {
            out.push(strategy);
        }
    }
    if out.is_empty() {
        return Err(Refusal::of_part("[]", "at least one strategy is required"));
    }
    out.sort();
    Ok(out)
}

/// `cdiAnnotationPrefix`: a DNS prefix ending in `/`.
pub(super) fn annotation_prefix(text: &str) -> Result<String, Refusal> {
    if !text.ends_with('/') || text.len() < 2 {
        return Err("must be a DNS prefix ending in `/`, e.g. cdi.k8s.io/".into());
    }
    Ok(text.to_string())
}

/// `cdiKind`: `vendor/class`, not under NVIDIA's vendor names.
pub(super) fn cdi_kind(text: &str) -> Result<String, Refusal> {
    crate::domain::cdi_kind::check_syntax(text)
        .and_then(|()| crate::domain::cdi_kind::check_not_foreign(text))
        .map_err(|rule| Refusal::from(rule.to_string()))?;
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_parse_and_print_as_the_config_writes_them() {
        for s in [Isolation::None, Isolation::Memory, Isolation::Mps] {
            assert_eq!(s.as_str().parse::<Isolation>(), Ok(s));
        }
        assert_eq!(Isolation::MemoryMps.to_string(), "memory+mps");
        assert_eq!(
            serde_json::to_value(DeviceListStrategy::VolumeMounts).unwrap(),
            "volume-mounts"
        );
        assert_eq!(
            "half".parse::<MigStrategy>().map_err(|e| e.to_string()),
            Err("expected none, single or mixed".to_string())
        );
        assert_eq!(
            "x".parse::<DeviceIdStrategy>().map_err(|e| e.to_string()),
            Err("expected uuid or index".to_string())
        );
        assert_eq!(
            "Mixed".parse::<MigStrategy>().unwrap_err().to_string(),
            "expected none, single or mixed"
        );
    }

    #[test]
    fn strategies_name_the_bad_item() {
        let r = strategies(&StringOrList::One("envvar,bogus".into())).unwrap_err();
        assert_eq!(r.part.as_deref(), Some("bogus"));
        assert_eq!(
            r.message,
            "expected envvar, volume-mounts, cdi-annotations or cdi-cri"
        );
        assert_eq!(
            strategies(&StringOrList::Many(vec![
                "cdi-cri".into(),
                " envvar".into()
            ])),
            Ok(vec![DeviceListStrategy::Envvar, DeviceListStrategy::CdiCri])
        );
    }
}
