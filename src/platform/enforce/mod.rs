//! Enforce: per-container GPU memory limits set by the driver (NVML memory partitioning).
//!
//! The `cdi-hook set-memory-limit` command (`crate::cli::cdi_hook`) runs on the host,
//! started by the container runtime before the container's process runs. It reads the OCI
//! state from stdin ([`parse_oci_state`]), the container process's `/proc/<pid>/cgroup`
//! ([`parse_proc_cgroup`]), resolves the container's cgroup directory
//! ([`resolve_cgroup_dir`]) and asks a [`MemoryLimiter`] (real one: [`nvml::NvmlLimiter`])
//! to set the hard limit. Parsing is pure; the filesystem is reached only through the
//! `exists` callback and the limiter.
//!
//! cgroup resolution: NVIDIA's memory partitioning needs cgroup v2 at `/sys/fs/cgroup`,
//! so the `0::<path>` line is preferred: `<root>/<path>` on a pure v2 host (detected by
//! `<root>/cgroup.controllers`), `<root>/unified/<path>` on a hybrid host. A process found
//! only in v1 hierarchies (a cgroup-v1-only host) fails the hook with a message saying
//! so: handing the driver a v1 directory would at best fail obscurely and at worst start
//! the container unlimited. `/proc/<pid>/cgroup` paths are relative to the reader's
//! cgroup namespace; the hook runs in the host's, so they are host paths. A path with `..`
//! components (what the kernel writes for a cgroup outside the reader's namespace) is
//! refused: joined under the root it would name some other directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub(crate) mod nvml;

/// Errors of the memory-limit hook.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EnforceError {
    /// The OCI state on stdin is not valid.
    #[error("invalid OCI state on stdin: {0}")]
    OciState(String),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `/proc/<pid>/cgroup` is malformed.
    #[error("invalid {path} line {line}: `{text}`")]
    ProcCgroup {
        path: String,
        line: usize,
        text: String,
    },
    /// No usable cgroup directory for the process.
    #[error("no cgroup directory for pid {pid} under {root} (tried {tried})")]
    NoCgroup {
        pid: i64,
        root: PathBuf,
        tried: String,
    },
    /// The process is in cgroup v1 hierarchies only; the driver limits v2 cgroups.
    #[error(
        "pid {pid} has no cgroup v2 directory under {root} (only the v1 memory cgroup {v1_path}): the driver's GPU memory limits need cgroup v2; boot the host with the unified hierarchy (systemd.unified_cgroup_hierarchy=1) or do not use enforced shares on it"
    )]
    CgroupV1Only {
        pid: i64,
        root: PathBuf,
        v1_path: PathBuf,
    },
    /// The cgroup path leaves the cgroup root (`..` components: the process is outside the
    /// reader's cgroup namespace, or the state names a process it should not).
    #[error(
        "pid {pid}: cgroup path `{path}` has `..` components and would leave {root}; refusing to limit a directory outside the cgroup root"
    )]
    CgroupEscapes {
        pid: i64,
        root: PathBuf,
        path: String,
    },
    /// A zero-byte limit was asked for.
    #[error("--bytes 0: a limit of 0 bytes would leave no GPU memory; the hook needs at least 1")]
    ZeroBytes,
    /// The limiter failed.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// A driver hook (`create-symlinks`, `update-ldcache`, …) failed.
    #[error(transparent)]
    Driver(#[from] crate::platform::driver::DriverError),
    /// Installing the hook binary on the host failed.
    #[error("cannot {action} {path}: {source}")]
    Install {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Result alias for this module.
pub(crate) type Result<T, E = EnforceError> = std::result::Result<T, E>;

/// Errors setting a limit through the driver.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LimitError {
    /// The NVML library cannot be loaded or lacks a required symbol.
    #[error("cannot load NVML from {lib}: {message}")]
    Load { lib: String, message: String },
    /// The driver does not offer per-cgroup memory limits.
    #[error("{0}")]
    Unsupported(String),
    /// An NVML call failed.
    #[error("NVML {call} failed for {device}: {message} (code {code})")]
    Nvml {
        call: &'static str,
        device: String,
        code: u32,
        message: String,
    },
}

/// Sets a hard GPU-memory limit for a cgroup on one device.
pub(crate) trait MemoryLimiter {
    /// Limit the processes of the cgroup directory `cgroup` to `bytes` of `device_uuid`.
    fn set_hard_limit(
        &mut self,
        device_uuid: &str,
        cgroup: &Path,
        bytes: u64,
    ) -> Result<(), LimitError>;
}

/// The fields of the OCI runtime state this hook uses.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OciState {
    /// OCI runtime spec version.
    pub(crate) oci_version: String,
    /// Container ID.
    pub(crate) id: String,
    /// `creating`, `created`, `running` or `stopped`.
    pub(crate) status: String,
    /// Container process on the host; required for the hooks that run before start.
    #[serde(default)]
    pub(crate) pid: Option<i64>,
    /// Bundle directory.
    pub(crate) bundle: String,
    /// Container annotations.
    #[serde(default)]
    pub(crate) annotations: BTreeMap<String, String>,
}

/// Parse the OCI state JSON and check it names a process.
pub(crate) fn parse_oci_state(text: &str) -> Result<OciState> {
    let state: OciState =
        serde_json::from_str(text).map_err(|e| EnforceError::OciState(e.to_string()))?;
    match state.pid {
        Some(p) if p > 0 => Ok(state),
        _ => Err(EnforceError::OciState(format!(
            "container {} (status {}) has no process id",
            state.id, state.status
        ))),
    }
}

/// The cgroup memberships of a process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ProcCgroup {
    /// Path in the v2 (unified) hierarchy: the `0::<path>` line.
    pub(crate) unified: Option<String>,
    /// v1 controller (or `name=…`) → path.
    pub(crate) v1: BTreeMap<String, String>,
}

/// Parse `/proc/<pid>/cgroup` (`hierarchy-ID:controller-list:path` per line).
pub(crate) fn parse_proc_cgroup(text: &str, origin: &str) -> Result<ProcCgroup> {
    let mut out = ProcCgroup::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || EnforceError::ProcCgroup {
            path: origin.to_string(),
            line: i + 1,
            text: line.to_string(),
        };
        // The path itself may contain ':'.
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        if !path.starts_with('/') || id.parse::<u32>().is_err() {
            return Err(bad());
        }
        if id == "0" && controllers.is_empty() {
            out.unified = Some(path.to_string());
        } else {
            for c in controllers.split(',').filter(|c| !c.is_empty()) {
                out.v1.insert(c.to_string(), path.to_string());
            }
        }
    }
    Ok(out)
}

/// The cgroup directory to limit, under `root` (see the module header for the order).
pub(crate) fn resolve_cgroup_dir(
    cg: &ProcCgroup,
    root: &Path,
    pid: i64,
    exists: impl Fn(&Path) -> bool,
) -> Result<PathBuf> {
    // The kernel writes `/../..` for a cgroup outside the reader's cgroup namespace; joined
    // under the root that would name (and limit) some other directory.
    for p in cg.unified.iter().chain(cg.v1.get("memory")) {
        if Path::new(p)
            .components()
            .any(|c| c == std::path::Component::ParentDir)
        {
            return Err(EnforceError::CgroupEscapes {
                pid,
                root: root.to_path_buf(),
                path: p.clone(),
            });
        }
    }
    let join = |base: PathBuf, p: &str| base.join(p.trim_start_matches('/'));
    let mut candidates = Vec::new();
    if let Some(p) = &cg.unified {
        if exists(&root.join("cgroup.controllers")) {
            candidates.push(join(root.to_path_buf(), p));
        }
        candidates.push(join(root.join("unified"), p));
    }
    for c in &candidates {
        if exists(c) {
            return Ok(c.clone());
        }
    }
    // Fail closed on v1: name the v1 directory so the operator sees why.
    if let Some(p) = cg.v1.get("memory") {
        return Err(EnforceError::CgroupV1Only {
            pid,
            root: root.to_path_buf(),
            v1_path: join(root.join("memory"), p),
        });
    }
    Err(EnforceError::NoCgroup {
        pid,
        root: root.to_path_buf(),
        tried: if candidates.is_empty() {
            "no cgroup v2 entry".into()
        } else {
            candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        },
    })
}

/// The whole hook: state → cgroup → limit. Returns the cgroup directory limited.
pub(crate) fn set_memory_limit(
    state_json: &str,
    proc_root: &Path,
    cgroup_root: &Path,
    device_uuid: &str,
    bytes: u64,
    limiter: &mut dyn MemoryLimiter,
) -> Result<PathBuf> {
    if device_uuid.starts_with("MIG-") {
        return Err(LimitError::Unsupported(format!(
            "{device_uuid}: the driver does not support memory limits on MIG devices"
        ))
        .into());
    }
    if bytes == 0 {
        return Err(EnforceError::ZeroBytes);
    }
    let state = parse_oci_state(state_json)?;
    let pid = state.pid.unwrap_or_default();
    let path = proc_root.join(pid.to_string()).join("cgroup");
    let text = std::fs::read_to_string(&path).map_err(|source| EnforceError::Read {
        path: path.clone(),
        source,
    })?;
    let cg = parse_proc_cgroup(&text, &path.display().to_string())?;
    let dir = resolve_cgroup_dir(&cg, cgroup_root, pid, |p| p.exists())?;
    limiter.set_hard_limit(device_uuid, &dir, bytes)?;
    tracing::info!(container = %state.id, cgroup = %dir.display(), device = device_uuid, bytes, "GPU memory limit set");
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    const STATE: &str = r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":4242,
        "bundle":"/run/containers/c1","annotations":{"a":"b"}}"#;

    #[test]
    fn oci_state() {
        let s = parse_oci_state(STATE).unwrap();
        assert_eq!(s.pid, Some(4242));
        assert_eq!(s.id, "c1");
        assert_eq!(s.annotations["a"], "b");
        let no_pid = r#"{"ociVersion":"1.0.2","id":"c1","status":"stopped","bundle":"/b"}"#;
        assert!(parse_oci_state(no_pid).is_err());
        assert!(parse_oci_state("{").is_err());
    }

    #[test]
    fn proc_cgroup_v2_and_hybrid() {
        let v2 = parse_proc_cgroup("0::/kubepods/pod1/c1\n", "x").unwrap();
        assert_eq!(v2.unified.as_deref(), Some("/kubepods/pod1/c1"));
        let hybrid = "12:memory:/libpod_parent/libpod-c1\n11:cpu,cpuacct:/libpod_parent/libpod-c1\n1:name=systemd:/x\n0::/libpod_parent/libpod-c1\n";
        let h = parse_proc_cgroup(hybrid, "x").unwrap();
        assert_eq!(h.v1["memory"], "/libpod_parent/libpod-c1");
        assert_eq!(h.v1["cpuacct"], "/libpod_parent/libpod-c1");
        assert_eq!(h.v1["name=systemd"], "/x");
        assert!(parse_proc_cgroup("garbage\n", "x").is_err());
        assert!(parse_proc_cgroup("0::relative\n", "x").is_err());
        // A path may contain ':'.
        let odd = parse_proc_cgroup("0::/a:b\n", "x").unwrap();
        assert_eq!(odd.unified.as_deref(), Some("/a:b"));
    }

    #[test]
    fn cgroup_paths_that_leave_the_root_are_refused() {
        let root = Path::new("/sys/fs/cgroup");
        let everything = |_: &Path| true;
        for text in [
            "0::/../../etc\n",
            "0::/kubepods/../../../var/lib\n",
            "5:memory:/../x\n0::/u/c1/..\n",
            "5:memory:/../x\n",
        ] {
            let cg = parse_proc_cgroup(text, "x").unwrap();
            let err = resolve_cgroup_dir(&cg, root, 7, everything).unwrap_err();
            assert!(
                matches!(err, EnforceError::CgroupEscapes { .. }),
                "{text}: {err}"
            );
            assert!(err.to_string().contains(".."), "{err}");
        }
        // `..` inside a name is just a name.
        let cg = parse_proc_cgroup("0::/a..b/c1\n", "x").unwrap();
        assert_eq!(
            resolve_cgroup_dir(&cg, root, 7, |p: &Path| p
                == Path::new("/sys/fs/cgroup/a..b/c1")
                || p == Path::new("/sys/fs/cgroup/cgroup.controllers"))
            .unwrap(),
            Path::new("/sys/fs/cgroup/a..b/c1")
        );
    }

    #[test]
    fn resolution_order() {
        let root = Path::new("/sys/fs/cgroup");
        let cg = parse_proc_cgroup("5:memory:/m/c1\n0::/u/c1\n", "x").unwrap();
        let have = |set: &[&str]| {
            let set: BTreeSet<PathBuf> = set.iter().map(PathBuf::from).collect();
            move |p: &Path| set.contains(p)
        };
        let pure = have(&["/sys/fs/cgroup/cgroup.controllers", "/sys/fs/cgroup/u/c1"]);
        assert_eq!(
            resolve_cgroup_dir(&cg, root, 1, pure).unwrap(),
            Path::new("/sys/fs/cgroup/u/c1")
        );
        let hybrid = have(&["/sys/fs/cgroup/unified/u/c1", "/sys/fs/cgroup/memory/m/c1"]);
        assert_eq!(
            resolve_cgroup_dir(&cg, root, 1, hybrid).unwrap(),
            Path::new("/sys/fs/cgroup/unified/u/c1")
        );
        // Only the v1 memory cgroup exists: refused, naming it and cgroup v2.
        let v1 = have(&["/sys/fs/cgroup/memory/m/c1"]);
        let err = resolve_cgroup_dir(&cg, root, 1, v1).unwrap_err();
        assert!(matches!(err, EnforceError::CgroupV1Only { .. }), "{err}");
        let shown = err.to_string();
        assert!(
            shown.contains("/sys/fs/cgroup/memory/m/c1") && shown.contains("cgroup v2"),
            "{shown}"
        );
        // A v1-only host: no `0::` line at all.
        let legacy = parse_proc_cgroup("5:memory:/m/c1\n1:name=systemd:/m/c1\n", "x").unwrap();
        let err = resolve_cgroup_dir(&legacy, root, 1, have(&["/sys/fs/cgroup/memory/m/c1"]))
            .unwrap_err();
        assert!(matches!(err, EnforceError::CgroupV1Only { .. }), "{err}");
        let err = resolve_cgroup_dir(&cg, root, 1, have(&[])).unwrap_err();
        assert!(matches!(err, EnforceError::CgroupV1Only { .. }), "{err}");
    }

    #[derive(Debug, Default)]
    struct Recorder(Vec<(String, PathBuf, u64)>, bool);

    impl MemoryLimiter for Recorder {
        fn set_hard_limit(&mut self, d: &str, c: &Path, b: u64) -> Result<(), LimitError> {
            if self.1 {
                return Err(LimitError::Unsupported("no".into()));
            }
            self.0.push((d.to_string(), c.to_path_buf(), b));
            Ok(())
        }
    }

    #[test]
    fn whole_hook_on_temp_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        let cg_root = dir.path().join("cgroup");
        std::fs::create_dir_all(proc_root.join("4242")).unwrap();
        std::fs::write(proc_root.join("4242/cgroup"), "0::/pods/c1\n").unwrap();
        std::fs::create_dir_all(cg_root.join("pods/c1")).unwrap();
        std::fs::write(cg_root.join("cgroup.controllers"), "memory\n").unwrap();
        let mut rec = Recorder::default();
        let got =
            set_memory_limit(STATE, &proc_root, &cg_root, "GPU-1", 1 << 30, &mut rec).unwrap();
        assert_eq!(got, cg_root.join("pods/c1"));
        assert_eq!(
            rec.0,
            vec![("GPU-1".into(), cg_root.join("pods/c1"), 1 << 30)]
        );

        // Any failure is an error: the runtime then refuses to start the container.
        let mut failing = Recorder(Vec::new(), true);
        assert!(set_memory_limit(STATE, &proc_root, &cg_root, "GPU-1", 1, &mut failing).is_err());
        assert!(set_memory_limit(STATE, &proc_root, &cg_root, "MIG-1", 1, &mut rec).is_err());
        // Zero bytes is refused before anything is read or limited.
        let before = rec.0.len();
        let err = set_memory_limit(STATE, &proc_root, &cg_root, "GPU-1", 0, &mut rec).unwrap_err();
        assert!(matches!(err, EnforceError::ZeroBytes), "{err}");
        assert_eq!(rec.0.len(), before);
        let other = STATE.replace("4242", "7");
        assert!(set_memory_limit(&other, &proc_root, &cg_root, "GPU-1", 1, &mut rec).is_err());
    }
}
