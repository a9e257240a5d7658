//! The host side of CDI: reading spec files, stating device nodes under a dev root, and
//! finding our own executable for the memory-limit hook. The pure model, generator and
//! checks are in `crate::domain::cdi`; the CLI (`cdi generate`, `cdi validate`, `cdi list`)
//! and the reloader call these.

use std::path::{Path, PathBuf};

use crate::domain::cdi::generate::{NodeInfo, NodeProbe};
use crate::domain::cdi::shares::HookSettings;
use crate::domain::cdi::validate::{check_file_name, validate};
use crate::domain::cdi::{CdiError, Result, Spec};

/// Read, parse and check one spec file; errors name the file.
pub(crate) fn validate_file(path: &Path) -> Result<Spec> {
    let in_file = |e: CdiError| CdiError::InFile {
        path: path.to_path_buf(),
        source: Box::new(e),
    };
    check_file_name(path)?;
    let text = std::fs::read_to_string(path).map_err(|source| CdiError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let spec = Spec::parse(&text, path)?;
    validate(&spec).map_err(in_file)?;
    Ok(spec)
}

/// Stats host paths with `lstat`-free `stat` (a symlinked node counts as its target).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HostProbe;

impl HostProbe {
    /// Check that `dev_root` is an existing directory, so a typo is an error rather than a
    /// spec whose nodes are all silently missing.
    pub(crate) fn check_root(dev_root: &Path) -> Result<()> {
        match std::fs::metadata(dev_root) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(CdiError::DevRoot {
                path: dev_root.to_path_buf(),
                rule: "not a directory".into(),
            }),
            Err(e) => Err(CdiError::DevRoot {
                path: dev_root.to_path_buf(),
                rule: format!("does not exist or is unreadable ({e})"),
            }),
        }
    }
}

impl NodeProbe for HostProbe {
    fn probe(&self, host_path: &Path) -> Option<NodeInfo> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = std::fs::metadata(host_path).ok()?;
        let ft = meta.file_type();
        let node_type = if ft.is_char_device() {
            'c'
        } else if ft.is_block_device() {
            'b'
        } else {
            return None;
        };
        let (major, minor) = split_dev(meta.rdev());
        Some(NodeInfo {
            node_type,
            major,
            minor,
        })
    }
}

/// Linux `dev_t` encoding (glibc `gnu_dev_major`/`gnu_dev_minor`).
fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// The running executable as the hook, with no extra environment. Right when the runtime
/// sees the same filesystem (a host install); a containerised daemon must pass the
/// binary's host path instead.
pub(crate) fn current_exe_hook(nvml_lib: Option<PathBuf>) -> Result<HookSettings> {
    let path = std::env::current_exe().map_err(|e| CdiError::HookPath {
        path: PathBuf::from("<current executable>"),
        rule: format!("cannot resolve ({e}); pass --cdi-hook-path"),
    })?;
    Ok(HookSettings {
        path,
        nvml_lib,
        env: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_dev_matches_glibc() {
        // makedev(195, 255), and makedev(0x1ff, 0xfffff) whose high bits use the wide fields.
        assert_eq!(split_dev((195 << 8) | 255), (195, 255));
        let (major, minor) = (0x1ffu64, 0xf_ffffu64);
        let dev = (major << 8) | (minor & 0xff) | ((minor & !0xff) << 12);
        assert_eq!(split_dev(dev), (511, 1_048_575));
    }
}
