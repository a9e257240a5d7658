//! Who may change the config file: it decides host paths mounted into tenants' containers
//! (`flags.mpsRoot`) and which devices they get, so a config any local user can rewrite is
//! a privilege escalation waiting to happen. We warn rather than refuse: a ConfigMap volume
//! or an operator's odd umask is worth a loud line, not a node without GPUs.
//!
//! Metadata reads (`std::fs`); called by [`super::load`], which logs what is found.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A path that lets any user change the config: the file (its final target, since the
/// daemon reads through symlinks) or the directory holding it (without the sticky bit,
/// anyone may replace the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorldWritable {
    /// The file or directory.
    pub(crate) path: PathBuf,
    /// Its permission bits.
    pub(crate) mode: u32,
}

/// Everything that makes `config` world-writable; empty when nothing does (or nothing can
/// be read: the load itself reports that).
pub(crate) fn world_writable(config: &Path) -> Vec<WorldWritable> {
    let mut found = Vec::new();
    let file = std::fs::canonicalize(config).unwrap_or_else(|_| config.to_path_buf());
    if let Ok(m) = std::fs::metadata(&file)
        && m.mode() & 0o002 != 0
    {
        found.push(WorldWritable {
            path: file.clone(),
            mode: m.mode() & 0o7777,
        });
    }
    // The directory named in the path, and the one the file really lives in.
    let mut dirs: Vec<PathBuf> = [config.parent(), file.parent()]
        .into_iter()
        .flatten()
        .map(|d| {
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            }
        })
        .map(Path::to_path_buf)
        .collect();
    dirs.dedup();
    for dir in dirs {
        if let Ok(m) = std::fs::metadata(&dir)
            && m.mode() & 0o002 != 0
            && m.mode() & 0o1000 == 0
        {
            found.push(WorldWritable {
                path: dir,
                mode: m.mode() & 0o7777,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn finds_a_world_writable_file_and_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "version: v1\n").expect("write");
        chmod(dir.path(), 0o755);
        chmod(&file, 0o644);
        assert!(world_writable(&file).is_empty());
        chmod(&file, 0o666);
        let found = world_writable(&file);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].mode, 0o666);
        chmod(&file, 0o644);
        chmod(dir.path(), 0o777);
        assert_eq!(world_writable(&file).len(), 1);
        // /tmp-like: sticky, so others cannot replace our file.
        chmod(dir.path(), 0o1777);
        assert!(world_writable(&file).is_empty());
        chmod(dir.path(), 0o755);
    }

    #[test]
    fn follows_a_configmap_symlink_to_the_real_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("..2026_01");
        std::fs::create_dir(&data).expect("data");
        chmod(dir.path(), 0o755);
        chmod(&data, 0o755);
        let real = data.join("config.yaml");
        std::fs::write(&real, "version: v1\n").expect("write");
        chmod(&real, 0o666);
        let link = dir.path().join("config.yaml");
        std::os::unix::fs::symlink("..2026_01/config.yaml", &link).expect("link");
        let found = world_writable(&link);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].path.ends_with("..2026_01/config.yaml"),
            "{found:?}"
        );
    }
}
