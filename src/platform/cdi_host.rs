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

/// The other spec files in `dir` that runtimes load (`.yaml`/`.json` directly inside, not
/// `own_name`) whose kind is `kind`, each with its qualified device names, sorted by path.
/// Files that cannot be read or parsed are passed over: this is evidence for a warning
/// (two specs of one kind in one directory), and `cdi validate` is the judge of each file.
pub(crate) fn same_kind_specs(
    dir: &Path,
    kind: &str,
    own_name: &str,
) -> Vec<(PathBuf, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, Vec<String>)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && check_file_name(p).is_ok())
        .filter(|p| p.file_name().and_then(|n| n.to_str()) != Some(own_name))
        .filter_map(|p| {
            let text = std::fs::read_to_string(&p).ok()?;
            let spec = Spec::parse(&text, &p).ok()?;
            (spec.kind == kind).then(|| (p, spec.qualified_names()))
        })
        .collect();
    found.sort();
    found
}

/// Log one warning per other spec of `kind` in `dir` (see [`same_kind_specs`]): runtimes drop
/// every device two files of one directory define, so a second spec of our kind there (a
/// `cdi generate --output` beside the daemon's, a stale file of an older name) silently
/// takes devices away. `ours` are our spec's device names when known, to count the overlap.
pub(crate) fn warn_same_kind_specs(
    dir: &Path,
    kind: &str,
    own_name: &str,
    ours: Option<&[String]>,
) {
    for (path, names) in same_kind_specs(dir, kind, own_name) {
        match ours {
            Some(ours) => {
                let shared = names.iter().filter(|n| ours.contains(n)).count();
                if shared > 0 {
                    tracing::warn!(
                        spec = %dir.join(own_name).display(),
                        other = %path.display(),
                        kind,
                        devices = shared,
                        "another spec in the same CDI directory defines the same devices: runtimes drop a device two files of one directory define; keep one spec per kind here"
                    );
                }
            }
            None => tracing::warn!(
                spec = %dir.join(own_name).display(),
                other = %path.display(),
                kind,
                "another spec of the same kind in the same CDI directory: runtimes drop a device two files of one directory define; keep one spec per kind here"
            ),
        }
    }
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

/// [`HostProbe`] for a daemon in a container: host paths under the driver root are stat'ed
/// where this process sees that root (`containerDriverRoot`). Without it a containerised
/// agent with a driver root other than `/` (the GPU Operator's `/run/nvidia/driver`, or a
/// fake driver root) finds none of the control nodes (`/dev/nvidiactl`, `/dev/nvidia-uvm`),
/// and the spec it writes leaves them out: CUDA in the workload then finds no driver.
/// Found on a real kubelet + containerd with the agent deployed from `deploy/`.
#[derive(Debug, Clone)]
pub(crate) struct VisibleProbe {
    host_root: PathBuf,
    visible_root: Option<PathBuf>,
}

impl VisibleProbe {
    /// Host root `driver_root`, seen at `container_driver_root` when set.
    pub(crate) fn new(driver_root: &Path, container_driver_root: Option<&Path>) -> Self {
        Self {
            host_root: driver_root.to_path_buf(),
            visible_root: container_driver_root.map(Path::to_path_buf),
        }
    }

    /// Where this process reads `host_path`.
    pub(crate) fn visible(&self, host_path: &Path) -> PathBuf {
        match (&self.visible_root, host_path.strip_prefix(&self.host_root)) {
            (Some(visible), Ok(rest)) => visible.join(rest),
            _ => host_path.to_path_buf(),
        }
    }
}

impl NodeProbe for VisibleProbe {
    fn probe(&self, host_path: &Path) -> Option<NodeInfo> {
        HostProbe.probe(&self.visible(host_path))
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
    fn a_containerised_probe_stats_the_driver_root_where_it_is_mounted() {
        // Host root /run/nvidia/driver, mounted at / here: its /dev/null is this /dev/null.
        let probe = VisibleProbe::new(Path::new("/run/nvidia/driver"), Some(Path::new("/")));
        assert_eq!(
            probe.visible(Path::new("/run/nvidia/driver/dev/nvidiactl")),
            Path::new("/dev/nvidiactl")
        );
        // Outside the driver root, and without a container root: the path as given.
        assert_eq!(probe.visible(Path::new("/opt/x")), Path::new("/opt/x"));
        let plain = VisibleProbe::new(Path::new("/run/nvidia/driver"), None);
        assert_eq!(
            plain.visible(Path::new("/run/nvidia/driver/dev/nvidiactl")),
            Path::new("/run/nvidia/driver/dev/nvidiactl")
        );
        let null = probe.probe(Path::new("/run/nvidia/driver/dev/null"));
        assert_eq!(
            null,
            Some(NodeInfo {
                node_type: 'c',
                major: 1,
                minor: 3
            })
        );
        assert_eq!(plain.probe(Path::new("/run/nvidia/driver/dev/null")), None);
    }

    #[test]
    fn split_dev_matches_glibc() {
        // makedev(195, 255), and makedev(0x1ff, 0xfffff) whose high bits use the wide fields.
        assert_eq!(split_dev((195 << 8) | 255), (195, 255));
        let (major, minor) = (0x1ffu64, 0xf_ffffu64);
        let dev = (major << 8) | (minor & 0xff) | ((minor & !0xff) << 12);
        assert_eq!(split_dev(dev), (511, 1_048_575));
    }
}
