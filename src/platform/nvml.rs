//! NVML backend: the node's GPUs and MIG devices read through `nvml-wrapper` 0.13.
//!
//! Talks to `libnvidia-ml.so.1` (the driver's, or the fake in `crates/fake-nvml` in CI) and to
//! `<proc root>/driver/nvidia-caps/mig-minors` for the MIG capability device minors, which NVML
//! does not report. Produces the same owned [`Inventory`] as the sim backend: a golden test
//! (`nvml_fake_tests`) checks that both agree on every node file in `hack/nodes/`.
//!
//! Every call blocks (FFI into the driver), so [`NvmlBackend::discover`] belongs on a blocking
//! thread. NVML is opened per discovery and closed afterwards; the health watcher owns its own
//! handle (`crate::platform::nvml_events`). The GPU-pair topology is read in the same pass
//! (`crate::platform::nvml_topology`). The two raw symbol calls NVML's wrapper lacks (GPU and
//! compute instance ids) live here, each with its safety argument.
//!
//! MIG profile names come from the device attributes: `<G>g.<GB>gb` via
//! [`node_spec::profile_name_from_memory`]. NVIDIA's go-nvlib derives the name from the GPU
//! instance *profile id* (`GetGpuInstanceById` + `GetInfo`), which nvml-wrapper does not wrap;
//! here `+me` is inferred from the attributes instead: a GPU instance smaller than the whole GPU
//! that owns an OFA engine is a media-extension profile (on A100/H100/A30 only `+me` profiles
//! and the full-GPU profile carry the OFA). `+me.all`, `-me` and `+gfx` are not recognised.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};

use super::sim::sort_migs;
use crate::domain::inventory::{
    Backend, Gpu, Inventory, InventoryError, MigDevice, MigMode, Result,
};

/// The NVML-backed inventory source.
#[derive(Debug, Clone)]
pub(crate) struct NvmlBackend {
    lib_path: Option<PathBuf>,
    proc_root: PathBuf,
    sys_root: PathBuf,
}

impl NvmlBackend {
    /// `lib_path`: the NVML library to open (`None`: `libnvidia-ml.so.1` from the loader path).
    /// `proc_root`: where `driver/nvidia-caps/mig-minors` lives (normally `/proc`).
    pub(crate) fn new(lib_path: Option<PathBuf>, proc_root: PathBuf) -> Self {
        Self {
            lib_path,
            proc_root,
            sys_root: PathBuf::from("/sys"),
        }
    }

    /// Where to read `bus/pci/devices/<busid>/numa_node` when NVML reports no NUMA node
    /// (normally `/sys`; tests point it at an empty directory).
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) fn with_sys_root(mut self, sys_root: PathBuf) -> Self {
        self.sys_root = sys_root;
        self
    }

    /// Open NVML (the configured library or the default one).
    pub(crate) fn open(&self) -> Result<Nvml> {
        open_nvml(self.lib_path.as_deref())
    }

    /// GPU `index` as discovery sees it (its MIG devices with their capability minors),
    /// through an NVML session the caller holds: what a MIG instance just made looks like.
    pub(crate) fn discover_gpu(&self, nvml: &Nvml, index: u32) -> Result<Gpu> {
        let minors = self.mig_minors()?;
        self.gpu(nvml, index, minors.as_ref())
    }

    fn mig_minors(&self) -> Result<Option<MigMinors>> {
        let path = self.proc_root.join("driver/nvidia-caps/mig-minors");
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(parse_mig_minors(&text))),
            // No MIG-capable driver loaded (or no MIG support at all): minors stay unknown.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(InventoryError::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    fn numa_from_sysfs(&self, bus_id: &str) -> Option<i64> {
        let path = self
            .sys_root
            .join("bus/pci/devices")
            .join(bus_id)
            .join("numa_node");
        let n: i64 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
        // The kernel prints -1 when the platform has no NUMA information.
        (n >= 0).then_some(n)
    }

    fn gpu(&self, nvml: &Nvml, index: u32, minors: Option<&MigMinors>) -> Result<Gpu> {
        let at_index = format!("GPU {index}");
        let dev = nvml
            .device_by_index(index)
            .map_err(dev_err("nvmlDeviceGetHandleByIndex_v2", &at_index))?;
        let uuid = dev
            .uuid()
            .map_err(dev_err("nvmlDeviceGetUUID", &at_index))?;
        let who = format!("GPU {index} ({uuid})");
        let product = dev.name().map_err(dev_err("nvmlDeviceGetName", &who))?;
        let memory_bytes = dev
            .memory_info()
            .map_err(dev_err("nvmlDeviceGetMemoryInfo_v2", &who))?
            .total;
        let minor = dev
            .minor_number()
            .map_err(dev_err("nvmlDeviceGetMinorNumber", &who))?;
        let pci = dev
            .pci_info()
            .map_err(dev_err("nvmlDeviceGetPciInfo_v3", &who))?;
        let pci_bus_id = node_spec::normalize_bus_id(&pci.bus_id);
        let numa_node = match dev.numa_node_id() {
            Ok(n) => Some(i64::from(n)),
            Err(_) => self.numa_from_sysfs(&pci_bus_id),
        };
        let cc = dev
            .cuda_compute_capability()
            .map_err(dev_err("nvmlDeviceGetCudaComputeCapability", &who))?;
        let mig_mode = match dev.mig_mode() {
            Ok(m) => MigMode {
                current: m.current == 1,
                pending: m.pending == 1,
            },
            // Boards without MIG say NOT_SUPPORTED: MIG is simply off.
            Err(NvmlError::NotSupported) => MigMode::default(),
            Err(e) => return Err(dev_err("nvmlDeviceGetMigMode", &who)(e)),
        };
        let product_info = node_spec::lookup_product(&product);
        let mig_compute_slices = product_info.map_or(0, |p| p.compute_slices);
        let mut mig_devices = Vec::new();
        if mig_mode.current {
            let max = match dev.mig_device_count() {
                Ok(n) => n,
                Err(NvmlError::NotSupported) => 0,
                Err(e) => return Err(dev_err("nvmlDeviceGetMaxMigDeviceCount", &who)(e)),
            };
            for slot in 0..max {
                let mig = match dev.mig_device_by_index(slot) {
                    Ok(m) => m,
                    // Slots are sparse: an empty slot is a hole, not an error.
                    Err(NvmlError::NotFound) => continue,
                    Err(e) => {
                        return Err(dev_err("nvmlDeviceGetMigDeviceHandleByIndex", &who)(e));
                    }
                };
                let parent = ParentInfo {
                    index,
                    uuid: &uuid,
                    minor,
                    memory_bytes,
                    full_slices: product_info.map(|p| p.compute_slices),
                };
                mig_devices.push(mig_device(nvml, &mig, slot, &parent, minors)?);
            }
        }
        sort_migs(&mut mig_devices);
        Ok(Gpu {
            index,
            uuid,
            product,
            memory_bytes,
            minor,
            pci_bus_id,
            numa_node,
            compute_capability: format!("{}.{}", cc.major, cc.minor),
            mig_mode,
            mig_compute_slices,
            mig_devices,
            fabric_clique: super::nvml_topology::fabric_clique(nvml, &dev),
        })
    }
}

impl Backend for NvmlBackend {
    fn discover(&self) -> Result<Inventory> {
        let minors = self.mig_minors()?;
        let nvml = self.open()?;
        let count = nvml
            .device_count()
            .map_err(nvml_err("nvmlDeviceGetCount_v2"))?;
        let driver_version = nvml.sys_driver_version().ok();
        let cuda_driver_version = nvml
            .sys_cuda_driver_version()
            .ok()
            .and_then(|v| u32::try_from(v).ok())
            .filter(|v| *v > 0);
        let mut gpus = (0..count)
            .map(|i| self.gpu(&nvml, i, minors.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        gpus.sort_by_key(|g| g.index);
        let topology = super::nvml_topology::read(&nvml, &gpus);
        tracing::debug!(gpus = gpus.len(), "NVML inventory discovered");
        Ok(Inventory {
            source: crate::domain::inventory::NVML_SOURCE.to_string(),
            driver_version,
            cuda_driver_version,
            gpus,
            topology,
        })
    }
}

/// Open NVML from `lib_path`, or `libnvidia-ml.so.1` from the loader path.
pub(crate) fn open_nvml(lib_path: Option<&Path>) -> Result<Nvml> {
    let mut builder = Nvml::builder();
    if let Some(path) = lib_path {
        builder.lib_path(path.as_os_str());
    }
    builder.init().map_err(|e| {
        let lib = lib_path.map_or(OsStr::new("libnvidia-ml.so.1"), Path::as_os_str);
        InventoryError::Nvml {
            message: format!(
                "cannot initialise {}: {e}; on a host without an NVIDIA GPU or driver, use `--backend sim:<profile>` (built-in: {}) or `--backend sim:<node file>`",
                lib.to_string_lossy(),
                crate::platform::sim::builtin_names().join(", ")
            ),
        }
    })
}

/// What a MIG device needs to know about its parent.
struct ParentInfo<'a> {
    index: u32,
    uuid: &'a str,
    minor: u32,
    memory_bytes: u64,
    full_slices: Option<u32>,
}

fn mig_device(
    nvml: &Nvml,
    mig: &Device<'_>,
    slot: u32,
    parent: &ParentInfo<'_>,
    minors: Option<&MigMinors>,
) -> Result<MigDevice> {
    let at_slot = format!("MIG slot {slot} of GPU {} ({})", parent.index, parent.uuid);
    let uuid = mig.uuid().map_err(dev_err("nvmlDeviceGetUUID", &at_slot))?;
    let who = format!("MIG device {uuid}");
    let gi = instance_id(nvml, mig, InstanceKind::Gpu)
        .map_err(dev_err("nvmlDeviceGetGpuInstanceId", &who))?;
    let ci = instance_id(nvml, mig, InstanceKind::Compute)
        .map_err(dev_err("nvmlDeviceGetComputeInstanceId", &who))?;
    let memory_bytes = mig
        .memory_info()
        .map_err(dev_err("nvmlDeviceGetMemoryInfo_v2", &who))?
        .total;
    let attrs = mig
        .attributes()
        .map_err(dev_err("nvmlDeviceGetAttributes_v2", &who))?;
    let media = attrs.shared_ofa_count > 0
        && parent
            .full_slices
            .is_some_and(|full| attrs.gpu_instance_slice_count < full);
    let profile = node_spec::profile_name_from_memory(
        attrs.compute_instance_slice_count,
        attrs.gpu_instance_slice_count,
        attrs.memory_size_mb,
        parent.memory_bytes,
        if media { "+me" } else { "" },
    );
    Ok(MigDevice {
        uuid,
        parent_uuid: parent.uuid.to_string(),
        parent_index: parent.index,
        index: 0,
        profile,
        gpu_instance_id: gi,
        compute_instance_id: ci,
        memory_bytes,
        compute_slices: attrs.gpu_instance_slice_count,
        gi_cap_minor: minors.and_then(|m| m.gi(parent.minor, gi)),
        ci_cap_minor: minors.and_then(|m| m.ci(parent.minor, gi, ci)),
    })
}

#[derive(Debug, Clone, Copy)]
enum InstanceKind {
    Gpu,
    Compute,
}

/// GPU or compute instance id of a MIG device: not wrapped by nvml-wrapper 0.13.
fn instance_id(nvml: &Nvml, mig: &Device<'_>, kind: InstanceKind) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    // Use the `Result` fields, not the generated methods: those panic on a missing symbol.
    let sym = match kind {
        InstanceKind::Gpu => nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?,
        InstanceKind::Compute => nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?,
    };
    let mut id = 0;
    // SAFETY: `mig.handle()` is a live handle from the same `Nvml` (borrowed for the call), the
    // symbol has the nvml.h signature `(nvmlDevice_t, unsigned int*)`, and `id` outlives it.
    nvml_try(unsafe { sym(mig.handle(), &mut id) })?;
    Ok(id)
}

fn nvml_err(call: &'static str) -> impl FnOnce(NvmlError) -> InventoryError {
    move |e| InventoryError::Nvml {
        message: format!("{call}: {e}"),
    }
}

fn dev_err(call: &'static str, device: &str) -> impl FnOnce(NvmlError) -> InventoryError {
    let device = device.to_string();
    move |e| InventoryError::NvmlDevice {
        call,
        device,
        message: e.to_string(),
    }
}

/// Minors of the `/dev/nvidia-caps/nvidia-cap<m>` nodes, from
/// `/proc/driver/nvidia-caps/mig-minors`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MigMinors {
    /// (GPU minor, GI id) → minor of `gpu<g>/gi<i>/access`.
    gi: BTreeMap<(u32, u32), u32>,
    /// (GPU minor, GI id, CI id) → minor of `gpu<g>/gi<i>/ci<c>/access`.
    ci: BTreeMap<(u32, u32, u32), u32>,
}

impl MigMinors {
    /// Minor of the GPU instance's access node.
    pub(crate) fn gi(&self, gpu_minor: u32, gi: u32) -> Option<u32> {
        self.gi.get(&(gpu_minor, gi)).copied()
    }

    /// Minor of the compute instance's access node.
    pub(crate) fn ci(&self, gpu_minor: u32, gi: u32, ci: u32) -> Option<u32> {
        self.ci.get(&(gpu_minor, gi, ci)).copied()
    }
}

/// Parse the driver's `mig-minors` file (`gpu0/gi2/access 21`, `gpu0/gi2/ci0/access 22`).
/// Other lines (`config 1`, `monitor 2`) and malformed lines are skipped: the file only
/// adds minors, and a missing entry leaves that device's minor unknown.
pub(crate) fn parse_mig_minors(text: &str) -> MigMinors {
    let mut out = MigMinors::default();
    for line in text.lines() {
        let Some((path, minor)) = line.trim().split_once(char::is_whitespace) else {
            continue;
        };
        let Ok(minor) = minor.trim().parse::<u32>() else {
            continue;
        };
        let parts: Vec<&str> = path.split('/').collect();
        let num = |s: &str, prefix: &str| s.strip_prefix(prefix)?.parse::<u32>().ok();
        match parts.as_slice() {
            [g, i, "access"] => {
                if let (Some(g), Some(i)) = (num(g, "gpu"), num(i, "gi")) {
                    out.gi.insert((g, i), minor);
                }
            }
            [g, i, c, "access"] => {
                if let (Some(g), Some(i), Some(c)) = (num(g, "gpu"), num(i, "gi"), num(c, "ci")) {
                    out.ci.insert((g, i, c), minor);
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_driver_mig_minors() {
        let m = parse_mig_minors(
            "config 1\nmonitor 2\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n\
             gpu1/gi13/ci7/access 266\ngarbage\ngpuX/gi1/access 3\ngpu0/gi1/access x\n",
        );
        assert_eq!(m.gi(0, 2), Some(21));
        assert_eq!(m.ci(0, 2, 0), Some(22));
        assert_eq!(m.ci(1, 13, 7), Some(266));
        assert_eq!(m.gi(0, 1), None);
        assert_eq!(m.gi(1, 2), None);
    }

    #[test]
    fn parses_generated_file_like_the_layout_helpers() {
        let m = parse_mig_minors(&node_spec::mig_minors_file(&[0, 3]));
        for (g, i, c) in [(0, 0, 0), (0, 14, 7), (3, 9, 0)] {
            assert_eq!(m.gi(g, i), Some(node_spec::gi_cap_minor(g, i)));
            assert_eq!(m.ci(g, i, c), Some(node_spec::ci_cap_minor(g, i, c)));
        }
    }

    #[test]
    fn missing_library_is_a_clear_error() {
        let err = NvmlBackend::new(
            Some(PathBuf::from("/nonexistent/libnvidia-ml.so.1")),
            PathBuf::from("/nonexistent"),
        )
        .discover()
        .unwrap_err();
        assert!(matches!(err, InventoryError::Nvml { .. }), "{err}");
        assert!(
            err.to_string().contains("/nonexistent/libnvidia-ml.so.1"),
            "{err}"
        );
        // A host without a GPU is told the sim backend exists.
        assert!(err.to_string().contains("--backend sim:"), "{err}");
    }
}

#[cfg(test)]
mod nvml_fake_tests;
