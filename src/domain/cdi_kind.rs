//! CDI kinds (`vendor/class`): every rule about them in one place — the default kind, the
//! syntax every consumer accepts, and the kinds other writers on the host own.
//!
//! Pure and a leaf: used by `crate::domain::config` (refuse a configured kind, naming the
//! field and value), `crate::domain::cdi` (generate and validate a spec's kind) and
//! `crate::domain::cdi::foreign` (spec file names of other writers).

/// Default CDI kind of the generated spec. Chosen not to collide with the kinds
/// `nvidia-ctk` writes (`nvidia.com/gpu`) or NVIDIA's plugin writes
/// (`k8s.device-plugin.nvidia.com/gpu`), so both can coexist on one host.
pub(crate) const DEFAULT_CDI_KIND: &str = "gpu-slicer.io/gpu";

/// Why a CDI kind is refused; the caller names the kind and where it was set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CdiKindError {
    /// No `/` between vendor and class.
    #[error("must be <vendor>/<class>")]
    Shape,
    /// The vendor part breaks the rules.
    #[error(
        "vendor `{0}` must be at least 2 characters, letter first, alphanumeric last, [A-Za-z0-9_.-] inside"
    )]
    Vendor(String),
    /// The class part breaks the rules.
    #[error(
        "class `{0}` must be at least 2 characters, letter first, alphanumeric last, [A-Za-z0-9_-] inside (no dots: Podman < 4.7 cannot parse them)"
    )]
    Class(String),
    /// Another writer on the host owns the kind.
    #[error(
        "kind `{kind}` belongs to {owner}; gpu-slicer would overwrite or shadow that spec. Use a vendor of your own, e.g. gpu-slicer.io/gpu"
    )]
    Foreign { kind: String, owner: &'static str },
}

/// Check a CDI kind `vendor/class` against the rules every consumer accepts: vendor a
/// DNS-like name, class without dots, both at least 2 characters (a 1-character vendor or
/// class makes Podman's CDI library panic host-wide).
pub(crate) fn check_syntax(kind: &str) -> Result<(), CdiKindError> {
    let Some((vendor, class)) = kind.split_once('/') else {
        return Err(CdiKindError::Shape);
    };
    let ok_chars = |s: &str, dot: bool| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || (dot && c == '.'))
    };
    if vendor.len() < 2 || !ok_chars(vendor, true) {
        return Err(CdiKindError::Vendor(vendor.to_string()));
    }
    if class.len() < 2 || !ok_chars(class, false) {
        return Err(CdiKindError::Class(class.to_string()));
    }
    Ok(())
}

/// Who writes specs of `vendor`, when it is not us.
pub(crate) fn owner_of_vendor(vendor: &str) -> Option<&'static str> {
    let owner = match vendor {
        "nvidia.com" => {
            "the NVIDIA Container Toolkit (`nvidia-ctk cdi generate`, spec nvidia.yaml in /etc/cdi or /var/run/cdi)"
        }
        "management.nvidia.com" => {
            "the NVIDIA Container Toolkit's management spec (management.nvidia.com-gpu.yaml in /var/run/cdi)"
        }
        "k8s.device-plugin.nvidia.com" => {
            "NVIDIA's k8s-device-plugin (its spec k8s.device-plugin.nvidia.com-gpu in /var/run/cdi)"
        }
        "runtime.nvidia.com" => "the NVIDIA Container Runtime (its just-in-time CDI mode)",
        "k8s.gpu.nvidia.com" | "compute-domain.nvidia.com" | "k8s.compute-domain.nvidia.com" => {
            "NVIDIA's DRA driver for GPUs"
        }
        v if v.ends_with(".nvidia.com") => "NVIDIA (the vendor is a name under NVIDIA's domain)",
        _ => return None,
    };
    Some(owner)
}

/// Who else writes specs of `kind` (`vendor/class`), if anyone.
pub(crate) fn owner_of_kind(kind: &str) -> Option<&'static str> {
    let vendor = kind.split_once('/').map_or(kind, |(v, _)| v);
    owner_of_vendor(&vendor.to_ascii_lowercase())
}

/// Refuse a `cdiKind` another writer owns; the message says whose it is.
pub(crate) fn check_not_foreign(kind: &str) -> Result<(), CdiKindError> {
    match owner_of_kind(kind) {
        None => Ok(()),
        Some(owner) => Err(CdiKindError::Foreign {
            kind: kind.to_string(),
            owner,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_kinds_are_refused_ours_are_not() {
        for kind in [
            "nvidia.com/gpu",
            "nvidia.com/mig",
            "k8s.device-plugin.nvidia.com/gpu",
            "management.nvidia.com/gpu",
            "runtime.nvidia.com/gpu",
            "k8s.gpu.nvidia.com/device",
            "NVIDIA.com/gpu",
        ] {
            let err = check_not_foreign(kind).expect_err(kind).to_string();
            assert!(err.contains(kind) && err.contains("NVIDIA"), "{err}");
        }
        assert!(check_not_foreign("gpu-slicer.io/gpu").is_ok());
        assert!(check_not_foreign("example.com/gpu").is_ok());
        // Only the domain and its subdomains, not look-alikes.
        assert!(check_not_foreign("notnvidia.com/gpu").is_ok());
    }
}
