//! Usage readers: GPU figures from NVML or a sim node file, `<proc-root>/<pid>/cgroup` texts,
//! and the kubelet's device-manager checkpoint.
//!
//! Everything here blocks (NVML calls, file reads) and runs on the usage sampler's own
//! thread (`crate::runtime::usage`), which hands the results to the pure attribution in
//! `crate::domain::usage`. NVML is opened once by the source and kept open (re-opened after a
//! failure); per GPU it reads `nvmlDeviceGetUtilizationRates` (not in MIG mode: NVML reports no
//! utilisation for MIG devices, and GPM metrics are not read), `nvmlDeviceGetMemoryInfo_v2`
//! and `nvmlDeviceGetComputeRunningProcesses_v3`, per MIG device its memory and processes.
//!
//! Files are read with `O_NOFOLLOW` and a size cap: a symlink planted where the checkpoint
//! or a `cgroup` file should be is refused, and a huge file costs at most the cap.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use node_spec::NodeSpec;
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use crate::domain::inventory::InventoryError;
use crate::domain::usage::{
    CheckpointEntry, DeviceKind, DeviceSample, ProcessSample, Sample, UsageError,
};

/// File name of the device manager's checkpoint in the device-plugin directory.
pub(crate) const CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";
/// Largest checkpoint read (a node with hundreds of pods writes well under 1 MiB).
const CHECKPOINT_MAX: u64 = 8 << 20;
/// Largest `cgroup` file read (v1 lists one line per hierarchy: a few KiB).
const CGROUP_MAX: u64 = 64 << 10;

/// Errors of the usage readers.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UsageReadError {
    /// NVML could not be opened.
    #[error(transparent)]
    Open(#[from] InventoryError),
    /// An NVML call failed.
    #[error("NVML: {call} on {device}: {source}")]
    Nvml {
        call: &'static str,
        device: String,
        #[source]
        source: NvmlError,
    },
    /// The sim node file could not be read.
    #[error(transparent)]
    Node(#[from] node_spec::NodeSpecError),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint is not the kubelet's format.
    #[error(transparent)]
    Checkpoint(#[from] UsageError),
}

/// Where GPU figures come from.
pub(crate) trait UsageSource: Send + std::fmt::Debug {
    /// Read every GPU's and MIG device's figures and compute processes.
    fn sample(&mut self) -> Result<Sample, UsageReadError>;
}

/// Figures from NVML.
#[derive(Debug)]
pub(crate) struct NvmlUsage {
    lib_path: Option<PathBuf>,
    nvml: Option<Nvml>,
}

impl NvmlUsage {
    /// A source over the library at `lib_path` (`None`: the system's), opened on first use.
    pub(crate) fn new(lib_path: Option<PathBuf>) -> Self {
        Self {
            lib_path,
            nvml: None,
        }
    }
}

fn nvml_err(call: &'static str, device: &str) -> impl FnOnce(NvmlError) -> UsageReadError {
    let device = device.to_string();
    move |source| UsageReadError::Nvml {
        call,
        device,
        source,
    }
}

fn used(m: &UsedGpuMemory) -> Option<u64> {
    match m {
        UsedGpuMemory::Used(b) => Some(*b),
        UsedGpuMemory::Unavailable => None,
    }
}

fn sample_nvml(nvml: &Nvml) -> Result<Sample, UsageReadError> {
    let mut sample = Sample::default();
    let count = nvml
        .device_count()
        .map_err(nvml_err("nvmlDeviceGetCount_v2", "node"))?;
    for index in 0..count {
        let at = format!("GPU {index}");
        let dev = nvml
            .device_by_index(index)
            .map_err(nvml_err("nvmlDeviceGetHandleByIndex_v2", &at))?;
        let uuid = dev.uuid().map_err(nvml_err("nvmlDeviceGetUUID", &at))?;
        let mem = dev
            .memory_info()
            .map_err(nvml_err("nvmlDeviceGetMemoryInfo_v2", &uuid))?;
        let mig = matches!(dev.mig_mode(), Ok(m) if m.current == 1);
        let utilization = if mig {
            None
        } else {
            match dev.utilization_rates() {
                Ok(u) => Some(f64::from(u.gpu.min(100)) / 100.0),
                Err(NvmlError::NotSupported) => None,
                Err(e) => return Err(nvml_err("nvmlDeviceGetUtilizationRates", &uuid)(e)),
            }
        };
        sample.devices.push(DeviceSample {
            uuid: uuid.clone(),
            kind: DeviceKind::Gpu,
            utilization,
            memory_used: mem.used,
            memory_total: mem.total,
        });
        if !mig {
            let procs = match dev.running_compute_processes() {
                Ok(p) => p,
                // Boards that do not list processes: figures without attribution.
                Err(NvmlError::NotSupported) => Vec::new(),
                Err(e) => {
                    return Err(nvml_err("nvmlDeviceGetComputeRunningProcesses_v3", &uuid)(
                        e,
                    ));
                }
            };
            sample.processes.extend(procs.iter().map(|p| ProcessSample {
                pid: p.pid,
                device: uuid.clone(),
                memory_used: used(&p.used_gpu_memory),
            }));
            continue;
        }
        let max = dev.mig_device_count().unwrap_or(0);
        for slot in 0..max {
            let m = match dev.mig_device_by_index(slot) {
                Ok(m) => m,
                // Slots are sparse.
                Err(NvmlError::NotFound) => continue,
                Err(e) => return Err(nvml_err("nvmlDeviceGetMigDeviceHandleByIndex", &uuid)(e)),
            };
            let mig_uuid = m.uuid().map_err(nvml_err(
                "nvmlDeviceGetUUID",
                &format!("{uuid} MIG slot {slot}"),
            ))?;
            let mem = m
                .memory_info()
                .map_err(nvml_err("nvmlDeviceGetMemoryInfo_v2", &mig_uuid))?;
            sample.devices.push(DeviceSample {
                uuid: mig_uuid.clone(),
                kind: DeviceKind::Mig,
                utilization: None,
                memory_used: mem.used,
                memory_total: mem.total,
            });
            let procs = match m.running_compute_processes() {
                Ok(p) => p,
                Err(NvmlError::NotSupported) => Vec::new(),
                Err(e) => {
                    return Err(nvml_err(
                        "nvmlDeviceGetComputeRunningProcesses_v3",
                        &mig_uuid,
                    )(e));
                }
            };
            sample.processes.extend(procs.iter().map(|p| ProcessSample {
                pid: p.pid,
                device: mig_uuid.clone(),
                memory_used: used(&p.used_gpu_memory),
            }));
        }
    }
    Ok(sample)
}

impl UsageSource for NvmlUsage {
    fn sample(&mut self) -> Result<Sample, UsageReadError> {
        if self.nvml.is_none() {
            self.nvml = Some(crate::platform::nvml::open_nvml(self.lib_path.as_deref())?);
        }
        let Some(nvml) = &self.nvml else {
            unreachable!("opened above")
        };
        let result = sample_nvml(nvml);
        if result.is_err() {
            // A lost GPU or a driver reload: start from a fresh handle next time.
            self.nvml = None;
        }
        result
    }
}

/// Figures from a sim node's `usage` section.
#[derive(Debug)]
pub(crate) struct SimUsage {
    spec: NodeSpec,
    /// Read again on every sample when set, so editing the file changes the figures.
    path: Option<PathBuf>,
}

impl SimUsage {
    /// A source over `spec`, re-reading `path` on every sample when given.
    pub(crate) fn new(spec: NodeSpec, path: Option<PathBuf>) -> Self {
        Self { spec, path }
    }
}

/// The sample a node description stands for.
pub(crate) fn sample_from_spec(spec: &NodeSpec) -> Sample {
    let mut sample = Sample::default();
    for g in &spec.gpus {
        let mig = g.mig_enabled();
        let figures = spec.usage.device(&g.uuid);
        sample.devices.push(DeviceSample {
            uuid: g.uuid.clone(),
            kind: DeviceKind::Gpu,
            utilization: if mig {
                None
            } else {
                Some(f64::from(figures.and_then(|u| u.utilization_percent).unwrap_or(0)) / 100.0)
            },
            memory_used: figures.map_or(0, |u| u.memory_used_mib() << 20),
            memory_total: g.memory_mib() << 20,
        });
        let mut devices = vec![(g.uuid.clone(), figures)];
        if mig {
            devices.clear();
            for (_, m) in g.mig_devices() {
                let f = spec.usage.device(&m.uuid);
                sample.devices.push(DeviceSample {
                    uuid: m.uuid.clone(),
                    kind: DeviceKind::Mig,
                    utilization: None,
                    memory_used: f.map_or(0, |u| u.memory_used_mib() << 20),
                    memory_total: g.mig_memory_mib(m) << 20,
                });
                devices.push((m.uuid.clone(), f));
            }
        }
        for (uuid, f) in devices {
            for p in f.map(|u| u.processes.as_slice()).unwrap_or_default() {
                sample.processes.push(ProcessSample {
                    pid: p.pid,
                    device: uuid.clone(),
                    memory_used: Some(p.memory_mib << 20),
                });
            }
        }
    }
    sample
}

impl UsageSource for SimUsage {
    fn sample(&mut self) -> Result<Sample, UsageReadError> {
        if let Some(path) = &self.path {
            self.spec = NodeSpec::load(path)?;
        }
        Ok(sample_from_spec(&self.spec))
    }
}

/// Read at most `max` bytes of a regular file, refusing a symlink in the last component.
fn read_bounded(path: &Path, max: u64) -> std::io::Result<String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    let mut text = String::new();
    file.take(max).read_to_string(&mut text)?;
    Ok(text)
}

/// The cgroup file text of each pid (`None`: unreadable, e.g. the process ended). A
/// `<proc-root>/<pid>` that is not a directory (a symlink) is not followed.
pub(crate) fn read_cgroups(
    proc_root: &Path,
    pids: impl IntoIterator<Item = u32>,
) -> BTreeMap<u32, Option<String>> {
    pids.into_iter()
        .map(|pid| {
            let dir = proc_root.join(pid.to_string());
            let text = std::fs::symlink_metadata(&dir)
                .ok()
                .filter(std::fs::Metadata::is_dir)
                .and_then(|_| read_bounded(&dir.join("cgroup"), CGROUP_MAX).ok());
            (pid, text)
        })
        .collect()
}

/// The device manager's checkpoint entries; no file yet (a kubelet that never allocated)
/// reads as none.
pub(crate) fn read_checkpoint(path: &Path) -> Result<Vec<CheckpointEntry>, UsageReadError> {
    match read_bounded(path, CHECKPOINT_MAX) {
        Ok(text) => Ok(crate::domain::usage::parse_checkpoint(
            &text,
            &path.display().to_string(),
        )?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(UsageReadError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_reader_refuses_symlinks_and_bounds_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc_root = dir.path();
        std::fs::create_dir(proc_root.join("10")).expect("mkdir");
        std::fs::write(proc_root.join("10/cgroup"), "0::/x\n").expect("write");
        std::fs::create_dir(proc_root.join("11")).expect("mkdir");
        std::os::unix::fs::symlink(proc_root.join("10/cgroup"), proc_root.join("11/cgroup"))
            .expect("symlink");
        std::os::unix::fs::symlink(proc_root.join("10"), proc_root.join("12")).expect("symlink");
        std::fs::create_dir(proc_root.join("13")).expect("mkdir");
        std::fs::write(proc_root.join("13/cgroup"), "x".repeat(200_000)).expect("write");
        let read = read_cgroups(proc_root, [10, 11, 12, 13, 14]);
        assert_eq!(read[&10].as_deref(), Some("0::/x\n"));
        assert_eq!(read[&11], None, "symlinked file");
        assert_eq!(read[&12], None, "symlinked pid directory");
        assert_eq!(
            read[&13].as_ref().map(String::len),
            Some(CGROUP_MAX as usize)
        );
        assert_eq!(read[&14], None, "no such process");
    }

    #[test]
    fn missing_checkpoint_is_empty_and_a_bad_one_names_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CHECKPOINT_FILE);
        assert!(read_checkpoint(&path).expect("absent").is_empty());
        std::fs::write(&path, "not json").expect("write");
        let e = read_checkpoint(&path).expect_err("bad");
        assert!(e.to_string().contains(CHECKPOINT_FILE), "{e}");
    }
}
