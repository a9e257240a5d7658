//! Device-name strategies of `cdi generate --device-name-strategy`, as `nvidia-ctk` names
//! them: `index` (`0`, `1:3`), `uuid` (`GPU-…`, `MIG-…`) and `type-index` (`gpu0`,
//! `mig1:3`). The generator always emits index and UUID names (what the device plugin and
//! people use); [`apply`] keeps or renames them afterwards, shares (`<name>-share-<k>`)
//! following their device, `all` always kept. Pure.

use super::{CdiError, Result, Spec};

/// How devices are named in the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum DeviceNameStrategy {
    /// `0`, `1:3`.
    Index,
    /// `GPU-…`, `MIG-…`.
    Uuid,
    /// `gpu0`, `mig1:3`.
    TypeIndex,
}

impl std::str::FromStr for DeviceNameStrategy {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "index" => Ok(Self::Index),
            "uuid" => Ok(Self::Uuid),
            "type-index" => Ok(Self::TypeIndex),
            other => Err(format!(
                "unknown device name strategy `{other}`: expected index, uuid or type-index"
            )),
        }
    }
}

/// The default: index and UUID names, as the generator makes them.
pub(crate) const DEFAULT_STRATEGIES: &[DeviceNameStrategy] =
    &[DeviceNameStrategy::Index, DeviceNameStrategy::Uuid];

enum Class {
    All,
    Uuid,
    GpuIndex,
    MigIndex,
}

fn classify(name: &str) -> (Class, &str, &str) {
    let (base, share) = match name.rfind("-share-") {
        Some(i) => name.split_at(i),
        None => (name, ""),
    };
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let class = if name == "all" {
        Class::All
    } else if digits(base) {
        Class::GpuIndex
    } else if base
        .split_once(':')
        .is_some_and(|(a, b)| digits(a) && digits(b))
    {
        Class::MigIndex
    } else {
        Class::Uuid
    };
    (class, base, share)
}

/// Keep (and for `type-index`, rename) the devices `strategies` ask for; `cdiVersion`
/// is recomputed and the spec checked again. An empty list means the default.
pub(crate) fn apply(spec: &mut Spec, strategies: &[DeviceNameStrategy]) -> Result<()> {
    let want = if strategies.is_empty() {
        DEFAULT_STRATEGIES
    } else {
        strategies
    };
    let has = |s: DeviceNameStrategy| want.contains(&s);
    let mut out = Vec::with_capacity(spec.devices.len());
    for d in spec.devices.drain(..) {
        let (class, base, share) = classify(&d.name);
        match class {
            Class::All => out.push(d),
            Class::Uuid => {
                if has(DeviceNameStrategy::Uuid) {
                    out.push(d);
                }
            }
            Class::GpuIndex | Class::MigIndex => {
                if has(DeviceNameStrategy::TypeIndex) {
                    let prefix = if matches!(class, Class::GpuIndex) {
                        "gpu"
                    } else {
                        "mig"
                    };
                    let mut renamed = d.clone();
                    renamed.name = format!("{prefix}{base}{share}");
                    out.push(renamed);
                }
                if has(DeviceNameStrategy::Index) {
                    out.push(d);
                }
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if out.iter().all(|d| d.name == "all") {
        return Err(CdiError::NoDevices);
    }
    spec.devices = out;
    spec.cdi_version = super::minimum_version(spec).to_string();
    super::validate(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::cdi::{GenerateOptions, NoProbe, generate};
    use crate::domain::inventory::Backend;
    use crate::platform::sim::SimBackend;

    fn spec() -> Spec {
        let inv = SimBackend::open("mixed-a100")
            .and_then(|b| b.discover())
            .expect("profile");
        generate(&inv, &GenerateOptions::new("gpu-slicer.io/gpu"), &NoProbe).expect("spec")
    }

    fn names(s: &Spec) -> Vec<&str> {
        s.devices.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn strategies_keep_or_rename() -> Result<()> {
        let full = spec();
        let mut s = full.clone();
        apply(&mut s, &[])?;
        assert_eq!(s, full, "default = what the generator makes");

        let mut s = full.clone();
        apply(&mut s, &[DeviceNameStrategy::Uuid])?;
        assert!(
            names(&s)
                .iter()
                .all(|n| n.starts_with("GPU-") || n.starts_with("MIG-") || *n == "all")
        );
        assert_eq!(s.devices.len(), 4 + 11 + 1);
        // No digit-first name left: 0.3.0 expresses it.
        assert_eq!(s.cdi_version, "0.3.0");

        let mut s = full.clone();
        apply(&mut s, &[DeviceNameStrategy::TypeIndex])?;
        let n = names(&s);
        for want in ["gpu0", "gpu3", "mig0:0", "mig1:3", "all"] {
            assert!(n.contains(&want), "{want} in {n:?}");
        }
        let gpu0 = s.devices.iter().find(|d| d.name == "gpu0").expect("gpu0");
        let zero = full.devices.iter().find(|d| d.name == "0").expect("0");
        assert_eq!(gpu0.container_edits, zero.container_edits);
        Ok(())
    }

    #[test]
    fn unknown_strategy_is_named() {
        let e = "serial".parse::<DeviceNameStrategy>().expect_err("bad");
        assert!(e.contains("`serial`"), "{e}");
    }
}
