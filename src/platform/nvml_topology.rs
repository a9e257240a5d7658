//! GPU-pair topology read through NVML, once per discovery (start-up and re-scan), never on
//! the allocation path: upstream's per-call re-reading costs about 600 ms per NVLink pair on
//! real hardware (notes/topology.md).
//!
//! Per GPU it walks links `0..NVML_NVLINK_MAX_LINKS`: link state, then the remote device
//! type (an NVSwitch link counts towards the GPU's switch links: on HGX boards the remote
//! PCI end is the switch, never the peer), else the remote PCI bus ID, counted towards the
//! GPU that has it. Per ordered pair it asks `nvmlDeviceGetTopologyCommonAncestor`. The raw
//! answers go to [`Topology::from_raw`], which resolves asymmetric or missing answers into
//! warnings and a usable (PCIe-only where need be) topology.
//!
//! All four calls go through the raw symbols of the loaded library (nvml-wrapper-sys
//! signatures): nvml-wrapper 0.13's `remote_device_type` writes its answer into a temporary
//! and always returns UNKNOWN, and its common-ancestor wrapper errors on levels it does not
//! know. A call the driver does not support, or a symbol it lacks, means "no link": never an
//! error, never a panic.

use nvml_wrapper::Nvml;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{
    NVML_NVLINK_MAX_LINKS, nvmlDevice_t, nvmlGpuFabricInfoV_t, nvmlPciInfo_t,
};

use crate::domain::inventory::Gpu;
use crate::domain::topology::{RawGpu, RawPair, Topology, TopologyWarning};

/// `nvmlEnableState_t` ENABLED.
const FEATURE_ENABLED: u32 = 1;
/// `nvmlIntNvLinkDeviceType_t` SWITCH.
const REMOTE_SWITCH: u32 = 2;

/// What one GPU's links reached.
#[derive(Debug, Default)]
struct GpuLinks {
    /// Enabled links whose remote end is an NVSwitch.
    switch_links: u32,
    /// Remote PCI bus IDs (normalised) of the other enabled links, one entry per link.
    peers: Vec<String>,
    /// Whether the driver answered any link-state call.
    answered: bool,
}

/// Read the topology of `gpus` (sorted by index, as discovered). `None` when the driver
/// answers no topology call at all (no PCIe level for any pair, no link state for any GPU):
/// the inventory then carries no topology, as a node file without one.
pub(crate) fn read(nvml: &Nvml, gpus: &[Gpu]) -> Option<Topology> {
    let mut handles = Vec::with_capacity(gpus.len());
    for g in gpus {
        match nvml.device_by_index(g.index) {
            // SAFETY: the handle stays valid while `nvml` is initialised; it is only passed
            // back to the same library below, within this borrow of `nvml`.
            Ok(d) => handles.push(unsafe { d.handle() }),
            Err(error) => {
                tracing::warn!(gpu = g.index, %error, "NVML topology not read: no handle");
                return None;
            }
        }
    }
    let links: Vec<GpuLinks> = handles
        .iter()
        .zip(gpus)
        .map(|(&h, g)| gpu_links(nvml, h, g))
        .collect();
    let n = gpus.len();
    let mut pairs = vec![RawPair::default(); n * n];
    let mut any_ancestor = false;
    for a in 0..n {
        for b in (0..n).filter(|&b| b != a) {
            let ancestor = common_ancestor(nvml, handles[a], handles[b]);
            any_ancestor |= ancestor.is_some();
            let direct_nvlinks = links[a]
                .peers
                .iter()
                .filter(|p| **p == gpus[b].pci_bus_id)
                .count();
            pairs[a * n + b] = RawPair {
                ancestor,
                direct_nvlinks: u32::try_from(direct_nvlinks).unwrap_or(u32::MAX),
            };
        }
    }
    if !any_ancestor && !links.iter().any(|l| l.answered) {
        tracing::info!(gpus = n, "the driver answers no topology call: no topology");
        return None;
    }
    let raw: Vec<RawGpu> = gpus
        .iter()
        .zip(&links)
        .map(|(g, l)| RawGpu {
            pci_bus_id: g.pci_bus_id.clone(),
            index: g.index,
            numa_node: g.numa_node,
            switch_links: l.switch_links,
        })
        .collect();
    let (topology, warnings) = Topology::from_raw(&raw, |a, b| pairs[a * n + b]);
    log_warnings(&warnings);
    tracing::debug!(gpus = n, "NVML topology read");
    Some(topology)
}

/// Log what [`Topology::from_raw`] resolved: each asymmetric pair, and the unanswered PCIe
/// levels as one line (a driver without the call would otherwise log n·(n−1) of them).
fn log_warnings(warnings: &[TopologyWarning]) {
    let mut unanswered = 0usize;
    for w in warnings {
        match w {
            TopologyWarning::Asymmetric {
                a,
                b,
                forward,
                backward,
            } => tracing::warn!(
                a = %a, b = %b, forward = %forward, backward = %backward,
                "NVML topology: the two GPUs disagree about their link; the worse answer is used"
            ),
            TopologyWarning::NoPcieAnswer { .. } => unanswered += 1,
        }
    }
    if unanswered > 0 {
        tracing::warn!(
            answers = unanswered,
            "NVML topology: no common PCIe ancestor for some GPU pairs; SYS assumed"
        );
    }
}

/// `nvmlDeviceGetTopologyCommonAncestor(a, b)`; `None` when unsupported or failing.
fn common_ancestor(nvml: &Nvml, a: nvmlDevice_t, b: nvmlDevice_t) -> Option<u32> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetTopologyCommonAncestor.as_ref()).ok()?;
    let mut level = 0;
    // SAFETY: `a` and `b` are live handles of this `nvml` (see `read`); the symbol has the
    // nvml.h signature `(nvmlDevice_t, nvmlDevice_t, nvmlGpuTopologyLevel_t*)` and `level`
    // outlives the call.
    nvml_try(unsafe { sym(a, b, &mut level) }).ok()?;
    Some(level)
}

/// Walk the links of one GPU.
fn gpu_links(nvml: &Nvml, h: nvmlDevice_t, gpu: &Gpu) -> GpuLinks {
    let mut out = GpuLinks::default();
    for link in 0..NVML_NVLINK_MAX_LINKS {
        match link_state(nvml, h, link) {
            Ok(state) => {
                out.answered = true;
                if state != FEATURE_ENABLED {
                    continue;
                }
            }
            // A board without NVLink answers NOT_SUPPORTED from link 0 on, a link number past
            // the GPU's count is INVALID_ARGUMENT, an old driver lacks the symbol: the walk
            // ends, the links read so far stand.
            Err(
                NvmlError::NotSupported | NvmlError::InvalidArg | NvmlError::FailedToLoadSymbol(_),
            ) => {
                break;
            }
            Err(error) => {
                tracing::warn!(gpu = gpu.index, link, %error, "NVLink state unreadable: no link");
                break;
            }
        }
        if remote_type(nvml, h, link) == Some(REMOTE_SWITCH) {
            out.switch_links += 1;
            continue;
        }
        match remote_pci_bus_id(nvml, h, link) {
            Ok(bus) => out.peers.push(bus),
            Err(error) => {
                tracing::warn!(gpu = gpu.index, link, %error, "NVLink remote end unreadable: no link");
            }
        }
    }
    out
}

fn link_state(nvml: &Nvml, h: nvmlDevice_t, link: u32) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetNvLinkState.as_ref())?;
    let mut state = 0;
    // SAFETY: live handle of this `nvml`; nvml.h signature `(nvmlDevice_t, unsigned int,
    // nvmlEnableState_t*)`; `state` outlives the call.
    nvml_try(unsafe { sym(h, link, &mut state) })?;
    Ok(state)
}

/// The remote device type, `None` when the driver does not say (older drivers lack it).
fn remote_type(nvml: &Nvml, h: nvmlDevice_t, link: u32) -> Option<u32> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref()).ok()?;
    let mut ty = 0xFF;
    // SAFETY: live handle of this `nvml`; nvml.h signature `(nvmlDevice_t, unsigned int,
    // nvmlIntNvLinkDeviceType_t*)`; `ty` outlives the call.
    nvml_try(unsafe { sym(h, link, &mut ty) }).ok()?;
    Some(ty)
}

fn remote_pci_bus_id(nvml: &Nvml, h: nvmlDevice_t, link: u32) -> Result<String, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetNvLinkRemotePciInfo_v2.as_ref())?;
    // SAFETY: `nvmlPciInfo_t` is plain C data (integers and char arrays): all zero is valid.
    let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: live handle of this `nvml`; nvml.h signature `(nvmlDevice_t, unsigned int,
    // nvmlPciInfo_t*)`; `info` outlives the call.
    nvml_try(unsafe { sym(h, link, &mut info) })?;
    let bytes: Vec<u8> = info
        .busId
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(node_spec::normalize_bus_id(&String::from_utf8_lossy(
        &bytes,
    )))
}

/// The GPU's multi-node NVLink clique (`nvmlDeviceGetGpuFabricInfoV`, struct version 3, as
/// go-nvlib asks); `None` when not fabric-attached or when the driver lacks the call.
pub(crate) fn fabric_clique(nvml: &Nvml, dev: &nvml_wrapper::Device<'_>) -> Option<String> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref()).ok()?;
    // SAFETY: plain C data (integers and byte arrays): all zero is valid.
    let mut info: nvmlGpuFabricInfoV_t = unsafe { std::mem::zeroed() };
    // `NVML_STRUCT_VERSION(GpuFabricInfo, 3)`.
    info.version = (std::mem::size_of::<nvmlGpuFabricInfoV_t>() as u32) | (3 << 24);
    // SAFETY: `dev` is a live handle of this `nvml` (borrowed for the call); nvml.h
    // signature `(nvmlDevice_t, nvmlGpuFabricInfoV_t*)` with `version` set; `info` outlives
    // the call.
    nvml_try(unsafe { sym(dev.handle(), &mut info) }).ok()?;
    crate::domain::topology::fabric_clique(info.clusterUuid, info.cliqueId, info.state, info.status)
}

#[cfg(test)]
mod topology_tests;
