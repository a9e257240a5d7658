//! CDI kinds and spec file names that belong to other writers on the same host.
//!
//! The spec directories are shared: NVIDIA's Container Toolkit (`nvidia-ctk cdi generate`,
//! the toolkit container of the GPU Operator), NVIDIA's k8s-device-plugin and its DRA driver
//! all write there. A config `cdiKind` of theirs would make gpu-slicer overwrite (or remove,
//! as the other-format twin) their spec file, or offer the same qualified device names from
//! a second file, which makes runtimes refuse those devices. CDI vendors are DNS names owned
//! by whoever owns the domain, so the whole `nvidia.com` namespace is refused, not just the
//! classes known today (`gpu`, `mig`, `imex-channel`, …).
//!
//! Pure: used by `crate::domain::config` (refuse the kind, naming the field and value) and by
//! `crate::platform::cdi_writer` (refuse the file name, whatever produced it).

use std::path::Path;

use super::{CdiError, Result};

/// Who writes specs of `vendor`, when it is not us.
fn owner_of_vendor(vendor: &str) -> Option<&'static str> {
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
pub fn owner_of_kind(kind: &str) -> Option<&'static str> {
    let vendor = kind.split_once('/').map_or(kind, |(v, _)| v);
    owner_of_vendor(&vendor.to_ascii_lowercase())
}

/// Refuse a `cdiKind` another writer owns; the message says whose it is.
pub fn check_kind(kind: &str) -> std::result::Result<(), String> {
    match owner_of_kind(kind) {
        None => Ok(()),
        Some(owner) => Err(format!(
            "kind `{kind}` belongs to {owner}; gpu-slicer would overwrite or shadow that spec. Use a vendor of your own, e.g. gpu-slicer.io/gpu"
        )),
    }
}

/// Refuse to write or remove a spec file whose name another writer uses: `nvidia.*` and
/// `<vendor>-<class>.*` for a vendor [`owner_of_kind`] knows.
pub fn check_file_name(path: &Path) -> Result<()> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let owner = if stem == "nvidia" {
        owner_of_vendor("nvidia.com")
    } else {
        // Our names are `<vendor>-<class>`; a vendor may contain `-` itself, so try every
        // split point.
        stem.match_indices('-')
            .find_map(|(i, _)| owner_of_vendor(&stem[..i]))
    };
    match owner {
        None => Ok(()),
        Some(owner) => Err(CdiError::FileName {
            path: path.to_path_buf(),
            rule: format!("this file name belongs to {owner}"),
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
            let err = check_kind(kind).expect_err(kind);
            assert!(err.contains(kind) && err.contains("NVIDIA"), "{err}");
        }
        assert!(check_kind("gpu-slicer.io/gpu").is_ok());
        assert!(check_kind("example.com/gpu").is_ok());
        // Only the domain and its subdomains, not look-alikes.
        assert!(check_kind("notnvidia.com/gpu").is_ok());
    }

    #[test]
    fn nvidia_file_names_are_refused() {
        for name in [
            "nvidia.yaml",
            "nvidia.json",
            "nvidia.com-gpu.yaml",
            "k8s.device-plugin.nvidia.com-gpu.json",
            "management.nvidia.com-gpu.yaml",
        ] {
            let err = check_file_name(Path::new(name)).expect_err(name);
            assert!(err.to_string().contains(name), "{err}");
        }
        assert!(check_file_name(Path::new("gpu-slicer.io-gpu.yaml")).is_ok());
        assert!(check_file_name(Path::new("nvidia-extra.yaml")).is_ok());
    }
}
