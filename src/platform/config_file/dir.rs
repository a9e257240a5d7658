//! `--config-dir`: a directory of named configs, one per file (a ConfigMap mounted as a
//! volume: one file per key). Its keys are read through the `..data` link when there is one,
//! and the chosen key's path is resolved under the same target, so a ConfigMap update that
//! renames `..data` between the listing and the read cannot mix two versions.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::domain::config::ConfigError;

/// The ConfigMap volume's link to its current data directory.
const CONFIGMAP_DATA: &str = "..data";

/// One consistent view of the directory: where the keys were read and which there are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfigDir {
    /// The directory the keys were listed in (the `..data` target, resolved once).
    pub(crate) root: PathBuf,
    /// The keys: regular files (or links to them) whose names do not start with `.`.
    pub(crate) keys: BTreeSet<String>,
}

impl ConfigDir {
    /// The file of `key`, in the same version of the directory as the listing.
    pub(crate) fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }
}

/// Whether the volume moved on since `listing` was read: `..data` now points at another
/// version (the old one may already be gone, so a read that failed is worth repeating).
pub(crate) fn swapped(dir: &Path, listing: &ConfigDir) -> bool {
    std::fs::canonicalize(dir.join(CONFIGMAP_DATA)).is_ok_and(|now| now != listing.root)
}

/// List the keys of `dir` (through `..data` when it is a ConfigMap volume).
pub(crate) fn read(dir: &Path) -> Result<ConfigDir, ConfigError> {
    let err = |path: &Path| {
        let path = path.display().to_string();
        move |source| ConfigError::Read { path, source }
    };
    let data = dir.join(CONFIGMAP_DATA);
    let root = match std::fs::canonicalize(&data) {
        Ok(target) if target.is_dir() => target,
        _ => dir.to_path_buf(),
    };
    let mut keys = BTreeSet::new();
    for entry in std::fs::read_dir(&root).map_err(err(&root))? {
        let entry = entry.map_err(err(&root))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        // Hidden entries are the volume's own (`..data`, `..2026_...`) or editors' swap files.
        if name.starts_with('.') {
            continue;
        }
        if std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file()) {
            keys.insert(name);
        }
    }
    Ok(ConfigDir { root, keys })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_a_plain_directory_and_of_a_configmap_volume() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("default"), "version: v1\n").unwrap();
        std::fs::write(dir.path().join(".swp"), "").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let plain = read(dir.path()).unwrap();
        assert_eq!(plain.keys, BTreeSet::from(["default".to_owned()]));
        assert_eq!(plain.root, dir.path());

        let vol = tempfile::tempdir().unwrap();
        let v1 = vol.path().join("..2026_v1");
        std::fs::create_dir(&v1).unwrap();
        std::fs::write(v1.join("training"), "version: v1\n").unwrap();
        std::fs::write(v1.join("inference"), "version: v1\n").unwrap();
        std::os::unix::fs::symlink("..2026_v1", vol.path().join("..data")).unwrap();
        for k in ["training", "inference"] {
            std::os::unix::fs::symlink(format!("..data/{k}"), vol.path().join(k)).unwrap();
        }
        let cm = read(vol.path()).unwrap();
        assert_eq!(cm.keys.len(), 2);
        // Reads resolve under the version listed, not the link that may move meanwhile.
        assert!(
            cm.path("training")
                .starts_with(std::fs::canonicalize(&v1).unwrap())
        );
        let e = read(&vol.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn a_swap_of_data_is_seen_and_a_plain_directory_never_swaps() {
        let vol = tempfile::tempdir().unwrap();
        for v in ["..v1", "..v2"] {
            std::fs::create_dir(vol.path().join(v)).unwrap();
            std::fs::write(vol.path().join(v).join("default"), "version: v1\n").unwrap();
        }
        std::os::unix::fs::symlink("..v1", vol.path().join("..data")).unwrap();
        let listing = read(vol.path()).unwrap();
        assert!(!swapped(vol.path(), &listing));
        std::os::unix::fs::symlink("..v2", vol.path().join("..data_tmp")).unwrap();
        std::fs::rename(vol.path().join("..data_tmp"), vol.path().join("..data")).unwrap();
        assert!(swapped(vol.path(), &listing));

        let plain = tempfile::tempdir().unwrap();
        std::fs::write(plain.path().join("default"), "version: v1\n").unwrap();
        assert!(!swapped(plain.path(), &read(plain.path()).unwrap()));
    }
}
