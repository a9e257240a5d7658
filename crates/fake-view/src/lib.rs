//! What a process sees of a fake GPU node, shared by the fake `libnvidia-ml.so`
//! (`crates/fake-nvml`) and the fake `libcuda.so` (`crates/fake-cuda`) so both answer alike.
//!
//! * **Node**: the `node-spec` file named by `FAKE_NVML_NODE` (one variable for both fakes:
//!   a container gets one node file and both libraries read it).
//! * **Device nodes**: like the real user-space driver, a process only reaches the GPUs whose
//!   device nodes it can open. When `FAKE_GPU_DEV_ROOT` is set (`/` in a container), the node
//!   is cut down by [`device_view`]: no `<root>/dev/nvidiactl` means no driver at all; a GPU is
//!   visible only with `<root>/dev/nvidia<minor>`; a MIG device only with its GPU's node and
//!   both its capability nodes (`<root>/dev/nvidia-caps/nvidia-cap<N>`, the GPU-instance and
//!   compute-instance `access` minors). Visible GPUs are renumbered from 0, as NVML does in a
//!   container. Unset: everything is visible (the host-side tests, which have no nodes).
//! * **Memory limits**: the per-GPU, per-cgroup hard limits that the fake NVML's
//!   `nvmlDeviceSetMemoryLimits_v1` records (file `FAKE_NVML_LIMITS_FILE`). A process whose
//!   own cgroup (`/proc/self/cgroup`) carries a limit on a GPU sees that limit as the GPU's
//!   total memory ([`limited_total`]), as the real driver reports under memory partitioning.
//!
//! Plain files only: no threads, no global state (each fake keeps its own).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use node_spec::{GpuSpec, NodeSpec, ci_cap_minor, gi_cap_minor};
use serde::{Deserialize, Serialize};

/// Env var naming the node file both fakes read.
pub const NODE_ENV: &str = "FAKE_NVML_NODE";
/// Env var naming the root under which `dev/nvidia*` decide what is visible.
pub const DEV_ROOT_ENV: &str = "FAKE_GPU_DEV_ROOT";
/// Env var naming the JSON file of memory limits.
pub const LIMITS_FILE_ENV: &str = "FAKE_NVML_LIMITS_FILE";

/// Errors building a view.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// No node file configured.
    #[error("no node description (set {NODE_ENV})")]
    NoNode,
    /// The node file is unreadable or invalid.
    #[error(transparent)]
    Node(#[from] node_spec::NodeSpecError),
    /// The control node is missing: the driver cannot be reached at all.
    #[error("{path} is missing ({DEV_ROOT_ENV}={root}): no NVIDIA driver reachable")]
    NoControlNode { path: PathBuf, root: PathBuf },
    /// The limits file is unreadable or invalid.
    #[error("bad limits file {path} ({LIMITS_FILE_ENV}): {message}")]
    Limits { path: PathBuf, message: String },
}

/// Load the node named by `FAKE_NVML_NODE` and cut it down to what the device nodes under
/// `FAKE_GPU_DEV_ROOT` allow (when set).
pub fn node_from_env() -> Result<NodeSpec, ViewError> {
    let path = std::env::var_os(NODE_ENV).ok_or(ViewError::NoNode)?;
    let node = NodeSpec::load(Path::new(&path))?;
    view_from_env(node)
}

/// Apply `FAKE_GPU_DEV_ROOT` (when set) to `node`.
pub fn view_from_env(node: NodeSpec) -> Result<NodeSpec, ViewError> {
    match std::env::var_os(DEV_ROOT_ENV) {
        Some(root) => device_view(node, Path::new(&root), is_device_node),
        None => Ok(node),
    }
}

/// Whether `path` is an openable device entry: present and neither a directory nor a
/// symlink (a symlink in `/dev` is not what the runtime creates; never follow it). Plain
/// files count too, so unprivileged tests can stand in for `mknod`.
pub fn is_device_node(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_dir() && !m.file_type().is_symlink())
}

/// Path of a GPU's device node under `root`.
pub fn gpu_node(root: &Path, gpu: &GpuSpec) -> PathBuf {
    root.join(format!("dev/nvidia{}", gpu.minor()))
}

/// Paths of a MIG device's two capability nodes under `root`.
pub fn mig_cap_nodes(root: &Path, gpu: &GpuSpec, gi: u32, ci: u32) -> [PathBuf; 2] {
    let cap = |m: u32| root.join(format!("dev/nvidia-caps/nvidia-cap{m}"));
    [
        cap(gi_cap_minor(gpu.minor(), gi)),
        cap(ci_cap_minor(gpu.minor(), gi, ci)),
    ]
}

/// The part of `node` reachable through the device nodes under `root` (see the module
/// header); `present` decides whether one node path exists.
pub fn device_view(
    mut node: NodeSpec,
    root: &Path,
    present: impl Fn(&Path) -> bool,
) -> Result<NodeSpec, ViewError> {
    let ctl = root.join("dev/nvidiactl");
    if !present(&ctl) {
        return Err(ViewError::NoControlNode {
            path: ctl,
            root: root.to_path_buf(),
        });
    }
    let mut renumber = BTreeMap::new();
    let mut kept = Vec::new();
    // Matrix positions of the kept GPUs: the topology is cut down with them.
    let mut kept_rows = Vec::new();
    for (row, mut gpu) in std::mem::take(&mut node.gpus).into_iter().enumerate() {
        if !present(&gpu_node(root, &gpu)) {
            continue;
        }
        kept_rows.push(row);
        let new_index = kept.len() as u32;
        renumber.insert(gpu.index, new_index);
        let slots: Vec<(u32, String)> = gpu
            .mig_devices()
            .into_iter()
            .map(|(s, d)| (s, d.uuid.clone()))
            .collect();
        let gpu_ref = gpu.clone();
        if let Some(mig) = &mut gpu.mig {
            // Fix every slot before dropping devices: a default slot is the position.
            for d in &mut mig.devices {
                d.slot = slots.iter().find(|(_, u)| *u == d.uuid).map(|(s, _)| *s);
            }
            mig.devices.retain(|d| {
                mig_cap_nodes(root, &gpu_ref, d.gpu_instance_id, d.compute_instance_id)
                    .iter()
                    .all(|p| present(p))
            });
        }
        gpu.index = new_index;
        kept.push(gpu);
    }
    node.gpus = kept;
    if let Some(t) = &mut node.topology {
        t.matrix = kept_rows
            .iter()
            .filter_map(|&r| {
                let cells: Vec<&str> = t.matrix.get(r)?.split_whitespace().collect();
                let row: Vec<&str> = kept_rows
                    .iter()
                    .filter_map(|&c| cells.get(c).copied())
                    .collect();
                Some(row.join(" "))
            })
            .collect();
    }
    node.events.retain_mut(|ev| match renumber.get(&ev.gpu) {
        Some(&i) => {
            ev.gpu = i;
            true
        }
        None => false,
    });
    Ok(node)
}

// ---------------------------------------------------------------- memory limits

/// Limits of one cgroup on one GPU, as stored in `FAKE_NVML_LIMITS_FILE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Soft limit in bytes.
    pub soft_limit: u64,
    /// Hard limit in bytes.
    pub hard_limit: u64,
}

/// GPU UUID → cgroup path → limits.
pub type LimitStore = BTreeMap<String, BTreeMap<String, Limits>>;

/// The limits file named by `FAKE_NVML_LIMITS_FILE`, if set.
pub fn limits_file() -> Option<PathBuf> {
    std::env::var_os(LIMITS_FILE_ENV).map(PathBuf::from)
}

/// Read a limits file; a missing or empty file is an empty store.
pub fn read_limits_file(path: &Path) -> Result<LimitStore, ViewError> {
    let bad = |message: String| ViewError::Limits {
        path: path.to_path_buf(),
        message,
    };
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => Ok(LimitStore::new()),
        Ok(text) => serde_json::from_str(&text).map_err(|e| bad(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LimitStore::new()),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// Record limits in `file` (read-modify-write, atomic rename so readers in other processes
/// never see half a file) or in `mem`.
pub fn store_limit(
    file: Option<&Path>,
    mem: &mut LimitStore,
    gpu: &str,
    cgroup: &str,
    limits: Limits,
) -> Result<(), ViewError> {
    let Some(path) = file else {
        mem.entry(gpu.to_string())
            .or_default()
            .insert(cgroup.to_string(), limits);
        return Ok(());
    };
    let mut all = read_limits_file(path)?;
    all.entry(gpu.to_string())
        .or_default()
        .insert(cgroup.to_string(), limits);
    let bad = |message: String| ViewError::Limits {
        path: path.to_path_buf(),
        message,
    };
    let text = serde_json::to_string_pretty(&all).map_err(|e| bad(e.to_string()))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| bad(e.to_string()))?;
    std::fs::rename(&tmp, path).map_err(|e| bad(e.to_string()))
}

/// The limits recorded for exactly `cgroup` on `gpu`.
pub fn load_limit(
    file: Option<&Path>,
    mem: &LimitStore,
    gpu: &str,
    cgroup: &str,
) -> Result<Option<Limits>, ViewError> {
    Ok(match file {
        Some(path) => read_limits_file(path)?
            .get(gpu)
            .and_then(|m| m.get(cgroup).copied()),
        None => mem.get(gpu).and_then(|m| m.get(cgroup).copied()),
    })
}

/// The cgroup paths of this process that a limit can name: the v2 (`0::`) path and the v1
/// `memory` controller's, each relative to the reader's cgroup namespace. The root (`/`,
/// what a private cgroup namespace shows) is left out: it cannot name a container.
pub fn own_cgroups(proc_self_cgroup: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let unified = id == "0" && ctrl.is_empty();
        if (unified || ctrl.split(',').any(|c| c == "memory")) && path.starts_with('/') {
            let path = path.trim_end_matches('/');
            if !path.is_empty() && !out.iter().any(|p| p == path) {
                out.push(path.to_string());
            }
        }
    }
    out
}

/// Whether a recorded cgroup directory (a host path such as
/// `/sys/fs/cgroup/unified/libpod_parent/libpod-…`) is the cgroup `path` of `/proc/self/cgroup`:
/// the directory is a cgroup mount point (`…/sys/fs/cgroup`, its `unified` or `memory`
/// hierarchy) followed by exactly `path`.
pub fn names_cgroup(recorded: &str, path: &str) -> bool {
    recorded
        .trim_end_matches('/')
        .strip_suffix(path)
        .is_some_and(|mount| {
            [
                "/sys/fs/cgroup",
                "/sys/fs/cgroup/unified",
                "/sys/fs/cgroup/memory",
            ]
            .iter()
            .any(|m| mount.ends_with(m))
        })
}

/// The hard limit on `gpu` for any of `cgroups`, if one is recorded.
pub fn limit_for(store: &LimitStore, gpu: &str, cgroups: &[String]) -> Option<u64> {
    let per_gpu = store.get(gpu)?;
    per_gpu
        .iter()
        .filter(|(dir, _)| cgroups.iter().any(|c| names_cgroup(dir, c)))
        .map(|(_, l)| l.hard_limit)
        .min()
}

/// `total` bytes of `gpu`, capped at this process's cgroup limit on it (file store when
/// `FAKE_NVML_LIMITS_FILE` is set, else `mem`). An unreadable limits file is reported on
/// stderr and ignored: memory reporting must not fail because of it.
pub fn limited_total(gpu: &str, total: u64, mem: &LimitStore) -> u64 {
    let file_store;
    let store = match limits_file() {
        Some(path) => match read_limits_file(&path) {
            Ok(s) => {
                file_store = s;
                &file_store
            }
            Err(e) => {
                eprintln!("fake driver: {e}");
                return total;
            }
        },
        None => mem,
    };
    if store.get(gpu).is_none_or(BTreeMap::is_empty) {
        return total;
    }
    let cgroups = std::fs::read_to_string("/proc/self/cgroup")
        .map(|t| own_cgroups(&t))
        .unwrap_or_default();
    limit_for(store, gpu, &cgroups).map_or(total, |l| l.min(total))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    const NODE: &str = r#"
gpus:
  - index: 0
    uuid: GPU-00000000-0000-0000-0000-000000000000
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "0000:07:00.0"
    mig:
      enabled: true
      devices:
        - {uuid: MIG-00000000-0000-0000-0000-000000000007, profile: 1g.10gb, gpuInstanceId: 7}
        - {uuid: MIG-00000000-0000-0000-0000-000000000008, profile: 1g.10gb, gpuInstanceId: 8}
  - index: 1
    uuid: GPU-00000000-0000-0000-0000-000000000001
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "0000:0f:00.0"
    minor: 5
  - index: 2
    uuid: GPU-00000000-0000-0000-0000-000000000002
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "0000:10:00.0"
events:
  - {gpu: 2, kind: xid, xid: 79}
  - {gpu: 0, kind: xid, xid: 48}
"#;

    fn view(nodes: &[&str]) -> Result<NodeSpec, ViewError> {
        let set: BTreeSet<PathBuf> = nodes.iter().map(|n| Path::new("/r/dev").join(n)).collect();
        let node = NodeSpec::parse(NODE, "test").unwrap();
        device_view(node, Path::new("/r"), |p| set.contains(p))
    }

    fn uuids(n: &NodeSpec) -> Vec<String> {
        let mut out = Vec::new();
        for g in &n.gpus {
            out.push(format!("{}={}", g.index, g.uuid));
            for (slot, d) in g.mig_devices() {
                out.push(format!("  {slot}={}", d.uuid));
            }
        }
        out
    }

    #[test]
    fn no_control_node_is_no_driver() {
        let err = view(&["nvidia0", "nvidia5"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/r/dev/nvidiactl is missing (FAKE_GPU_DEV_ROOT=/r): no NVIDIA driver reachable"
        );
    }

    #[test]
    fn mig_device_needs_both_caps_and_keeps_its_slot() {
        // GPU 0, GI 8 (slot 1): caps 3 + 8*9 = 75 and 76.
        let n = view(&[
            "nvidiactl",
            "nvidia0",
            "nvidia-caps/nvidia-cap75",
            "nvidia-caps/nvidia-cap76",
        ])
        .unwrap();
        assert_eq!(
            uuids(&n),
            [
                "0=GPU-00000000-0000-0000-0000-000000000000",
                "  1=MIG-00000000-0000-0000-0000-000000000008"
            ]
        );
        // One cap node of the pair is not enough.
        let n = view(&["nvidiactl", "nvidia0", "nvidia-caps/nvidia-cap75"]).unwrap();
        assert_eq!(uuids(&n), ["0=GPU-00000000-0000-0000-0000-000000000000"]);
        // Caps without the GPU's node give nothing.
        let n = view(&[
            "nvidiactl",
            "nvidia-caps/nvidia-cap75",
            "nvidia-caps/nvidia-cap76",
        ])
        .unwrap();
        assert!(n.gpus.is_empty());
    }

    #[test]
    fn gpus_follow_their_minor_and_are_renumbered() {
        // GPU 1 has minor 5; nvidia1 names nothing.
        let n = view(&["nvidiactl", "nvidia1", "nvidia5", "nvidia2"]).unwrap();
        assert_eq!(
            uuids(&n),
            [
                "0=GPU-00000000-0000-0000-0000-000000000001",
                "1=GPU-00000000-0000-0000-0000-000000000002"
            ]
        );
        // Events follow the renumbering; events of hidden GPUs are gone.
        assert_eq!(n.events.len(), 1);
        assert_eq!((n.events[0].gpu, n.events[0].xid), (1, Some(79)));
    }

    #[test]
    fn real_files_symlinks_and_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev");
        std::fs::create_dir_all(dev.join("nvidia-caps")).unwrap();
        std::fs::write(dev.join("nvidiactl"), "").unwrap();
        std::fs::write(dev.join("nvidia2"), "").unwrap();
        std::os::unix::fs::symlink("/dev/null", dev.join("nvidia5")).unwrap();
        std::fs::create_dir(dev.join("nvidia0")).unwrap();
        let node = NodeSpec::parse(NODE, "test").unwrap();
        let n = device_view(node, dir.path(), is_device_node).unwrap();
        assert_eq!(uuids(&n), ["0=GPU-00000000-0000-0000-0000-000000000002"]);
    }

    #[test]
    fn own_cgroups_v1_v2_and_private_namespace() {
        let hybrid = "12:memory:/libpod_parent/libpod-abc\n3:cpu,cpuacct:/libpod_parent/libpod-abc\n0::/libpod_parent/libpod-abc\n";
        assert_eq!(own_cgroups(hybrid), ["/libpod_parent/libpod-abc"]);
        assert_eq!(
            own_cgroups("0::/machine.slice/libpod-x.scope/container\n"),
            ["/machine.slice/libpod-x.scope/container"]
        );
        assert!(own_cgroups("0::/\n").is_empty());
    }

    #[test]
    fn limit_matches_only_this_cgroup_under_a_cgroup_mount() {
        let mut store = LimitStore::new();
        let l = |hard| Limits {
            soft_limit: 0,
            hard_limit: hard,
        };
        let gpu = "GPU-a";
        for (dir, hard) in [
            ("/sys/fs/cgroup/unified/libpod_parent/libpod-abc", 30),
            ("/sys/fs/cgroup/unified/libpod_parent/libpod-abcd", 10),
            ("/sys/fs/cgroup/other/libpod_parent/libpod-abc", 5),
        ] {
            store_limit(None, &mut store, gpu, dir, l(hard)).unwrap();
        }
        let me = vec!["/libpod_parent/libpod-abc".to_string()];
        assert_eq!(limit_for(&store, gpu, &me), Some(30));
        assert_eq!(limit_for(&store, "GPU-b", &me), None);
        assert_eq!(
            limit_for(&store, gpu, &["/libpod_parent".to_string()]),
            None
        );
        assert!(names_cgroup("/tmp/t/sys/fs/cgroup/a/b", "/a/b"));
        assert!(!names_cgroup("/sys/fs/cgroup/a/b", "/b"));
    }

    #[test]
    fn limits_round_trip_through_file_and_memory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("limits.json");
        let mut mem = LimitStore::new();
        let l = Limits {
            soft_limit: 1 << 30,
            hard_limit: 2 << 30,
        };
        for f in [Some(file.as_path()), None] {
            assert_eq!(load_limit(f, &mem, "GPU-a", "/cg/x").unwrap(), None);
            store_limit(f, &mut mem, "GPU-a", "/cg/x", l).unwrap();
            assert_eq!(load_limit(f, &mem, "GPU-a", "/cg/x").unwrap(), Some(l));
            assert_eq!(load_limit(f, &mem, "GPU-b", "/cg/x").unwrap(), None);
        }
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("\"softLimit\": 1073741824"), "{text}");
        std::fs::write(&file, "{nope").unwrap();
        let err = read_limits_file(&file).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "bad limits file {} (FAKE_NVML_LIMITS_FILE): ",
                file.display()
            )),
            "{err}"
        );
    }
}
