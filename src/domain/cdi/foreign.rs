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
//! Pure: used by `crate::platform::cdi_writer` (refuse the file name, whatever produced it);
//! the kinds themselves are refused by `crate::domain::cdi_kind`, which owns every kind rule.

use std::path::Path;

use super::{CdiError, Result};
use crate::domain::cdi_kind::owner_of_vendor;

/// Refuse to write or remove a spec file whose name another writer uses: `nvidia.*` and
/// `<vendor>-<class>.*` for a vendor [`crate::domain::cdi_kind::owner_of_kind`] knows.
pub(crate) fn check_file_name(path: &Path) -> Result<()> {
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
