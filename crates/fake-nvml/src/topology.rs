//! The topology calls, answered from the node file's `topology` section (`node_spec::TopologySpec`).
//!
//! * `nvmlDeviceGetTopologyCommonAncestor(a, b)`: row a, column b of the matrix as NVML's
//!   `nvmlGpuTopologyLevel_t` (PIX 10 … SYS 50); an `NV#` cell says nothing about PCIe and
//!   answers SYSTEM, as the sim backend reads it. The same handle twice is INTERNAL (0).
//! * NVLink, per link `0..NVML_NVLINK_MAX_LINKS` (18, nvml-wrapper-sys's header):
//!   `nvmlDeviceGetNvLinkState`, `nvmlDeviceGetNvLinkRemotePciInfo_v2`,
//!   `nvmlDeviceGetNvLinkRemoteDeviceType`. GPU i's enabled links are, in column order,
//!   `k` links to GPU j for every `NV<k>` in row i (capped at 18 in all); with `nvswitch:
//!   true` they are instead [`TopologySpec::switch_links`] links to an NVSwitch (remote type
//!   SWITCH, a remote PCI bus ID that is no GPU's), as on HGX boards. The other links of a
//!   GPU with NVLink are DISABLED; a GPU without any answers NOT_SUPPORTED on every link, as
//!   a PCIe board does. A link number past 18 is INVALID_ARGUMENT.
//! * `unsupported: [commonAncestor]` / `[nvlink]` make those calls NOT_SUPPORTED; a node
//!   file without a `topology` section makes all of them NOT_SUPPORTED. An asymmetric matrix
//!   is answered as written (each GPU reports its own row).
//!
//! * `nvmlDeviceGetGpuFabricInfoV` (version 2 or 3 of the struct) from the GPU's `fabric`
//!   entry; NOT_SUPPORTED without one. Not counted or delayed: it is not a pair query.
//!
//! Every topology call first counts itself and sleeps `FAKE_NVML_TOPOLOGY_DELAY` (a humantime
//! duration such as `600ms`; real drivers take about that per NVLink pair query), without
//! holding the library's lock. The count is read with `fakeNvmlTopologyCalls()` in-process,
//! or from the file named by `FAKE_NVML_TOPOLOGY_COUNTER` (the decimal count, rewritten
//! through a temp file and a rename after each call) by another process, so a test can prove
//! that no topology call happens on the allocation path without timing anything.

use std::ffi::{c_char, c_uint, c_ulonglong};
use std::sync::atomic::{AtomicU64, Ordering};

use node_spec::{NodeSpec, TopoCell, TopologySpec};
use nvml_wrapper_sys::bindings::{
    NVML_NVLINK_MAX_LINKS, nvmlDevice_t, nvmlEnableState_t, nvmlGpuFabricInfo_v2_t,
    nvmlGpuFabricInfo_v3_t, nvmlGpuTopologyLevel_t, nvmlIntNvLinkDeviceType_t, nvmlPciInfo_t,
    nvmlReturn_t,
};

use crate::{Dev, code, entry, gpu_only, pci_info, put, state};

/// Environment variable: delay before every topology call.
pub const DELAY_ENV: &str = "FAKE_NVML_TOPOLOGY_DELAY";
/// Environment variable: file the call count is written to.
pub const COUNTER_ENV: &str = "FAKE_NVML_TOPOLOGY_COUNTER";

/// `nvmlEnableState_t` values.
const FEATURE_DISABLED: nvmlEnableState_t = 0;
const FEATURE_ENABLED: nvmlEnableState_t = 1;
/// `nvmlIntNvLinkDeviceType_t` values.
const REMOTE_GPU: nvmlIntNvLinkDeviceType_t = 0;
const REMOTE_SWITCH: nvmlIntNvLinkDeviceType_t = 2;
/// `nvmlGpuTopologyLevel_t` INTERNAL and SYSTEM.
const LEVEL_INTERNAL: nvmlGpuTopologyLevel_t = 0;
const LEVEL_SYSTEM: nvmlGpuTopologyLevel_t = 50;
/// Remote bus ID of a switch link: domain 0xFFFF holds no GPU of any node file.
const SWITCH_BUS_ID: &str = "0000ffff:00:00.0";

static CALLS: AtomicU64 = AtomicU64::new(0);

/// Count one topology call, publish the count and sleep the configured delay.
fn before_call() {
    let n = CALLS.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(path) = std::env::var_os(COUNTER_ENV) {
        let path = std::path::PathBuf::from(path);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written =
            std::fs::write(&tmp, n.to_string()).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            eprintln!("fake-nvml: {COUNTER_ENV}={}: {e}", path.display());
        }
    }
    if let Some(text) = std::env::var_os(DELAY_ENV) {
        match humantime::parse_duration(&text.to_string_lossy()) {
            Ok(d) => std::thread::sleep(d),
            Err(e) => eprintln!("fake-nvml: {DELAY_ENV}={text:?}: {e} (no delay)"),
        }
    }
}

/// The remote end of one enabled link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Remote {
    /// The GPU at this position.
    Gpu(usize),
    Switch,
}

/// The enabled links of GPU position `i`, link 0 first.
fn links(t: &TopologySpec, n: usize, i: usize) -> Vec<Remote> {
    let max = NVML_NVLINK_MAX_LINKS as usize;
    if t.nvswitch {
        return vec![Remote::Switch; (t.switch_links(i) as usize).min(max)];
    }
    let mut out = Vec::new();
    for j in (0..n).filter(|&j| j != i) {
        if let Some(TopoCell::NvLink(k)) = t.cell(i, j) {
            out.extend(std::iter::repeat_n(Remote::Gpu(j), k as usize));
        }
    }
    out.truncate(max);
    out
}

fn topology<'a>(node: &'a NodeSpec, call: &str) -> Result<&'a TopologySpec, nvmlReturn_t> {
    match &node.topology {
        Some(t) if !t.is_unsupported(call) => Ok(t),
        _ => Err(code::NOT_SUPPORTED),
    }
}

/// The remote end of `link` of GPU `dev`; `Ok(None)` for a disabled link.
fn remote(node: &NodeSpec, dev: Dev, link: c_uint) -> Result<Option<Remote>, nvmlReturn_t> {
    gpu_only(dev)?;
    let t = topology(node, "nvlink")?;
    if link >= NVML_NVLINK_MAX_LINKS {
        return Err(code::INVALID_ARGUMENT);
    }
    let all = links(t, node.gpus.len(), dev.gpu());
    if all.is_empty() {
        return Err(code::NOT_SUPPORTED);
    }
    Ok(all.get(link as usize).copied())
}

/// Body of the per-link calls: count, delay, resolve, compute, write.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn link_call<T>(
    h: nvmlDevice_t,
    sym: &str,
    link: c_uint,
    out: *mut T,
    f: impl FnOnce(Option<Remote>, &NodeSpec) -> Result<T, nvmlReturn_t>,
) -> nvmlReturn_t {
    before_call();
    entry(|| {
        let st = state();
        let (dev, _) = st.dev(h, sym)?;
        let node = st.node()?;
        let v = f(remote(node, dev, link)?, node)?;
        // SAFETY: forwarded contract.
        unsafe { put(out, v) }
    })
}

/// Topology calls made by this library instance so far.
#[unsafe(no_mangle)]
pub extern "C" fn fakeNvmlTopologyCalls() -> c_ulonglong {
    CALLS.load(Ordering::SeqCst)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    a: nvmlDevice_t,
    b: nvmlDevice_t,
    out: *mut nvmlGpuTopologyLevel_t,
) -> nvmlReturn_t {
    before_call();
    entry(|| {
        let st = state();
        let sym = "nvmlDeviceGetTopologyCommonAncestor";
        let (da, _) = st.dev(a, sym)?;
        let (db, _) = st.dev(b, sym)?;
        gpu_only(da)?;
        gpu_only(db)?;
        let t = topology(st.node()?, "commonAncestor")?;
        let level = if da == db {
            LEVEL_INTERNAL
        } else {
            match t.cell(da.gpu(), db.gpu()) {
                Some(TopoCell::Pcie(level)) => level,
                _ => LEVEL_SYSTEM,
            }
        };
        // SAFETY: out-pointer per nvml.h.
        unsafe { put(out, level) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    h: nvmlDevice_t,
    link: c_uint,
    out: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        link_call(h, "nvmlDeviceGetNvLinkState", link, out, |r, _| {
            Ok(if r.is_some() {
                FEATURE_ENABLED
            } else {
                FEATURE_DISABLED
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    h: nvmlDevice_t,
    link: c_uint,
    out: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        link_call(
            h,
            "nvmlDeviceGetNvLinkRemotePciInfo_v2",
            link,
            out,
            |r, node| {
                let mut info = match r.ok_or(code::NOT_SUPPORTED)? {
                    Remote::Gpu(j) => pci_info(&node.gpus[j]),
                    Remote::Switch => switch_pci_info(),
                };
                // The driver leaves it unfilled for remote ends (nvml.h).
                info.pciSubSystemId = 0;
                Ok(info)
            },
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo(
    h: nvmlDevice_t,
    link: c_uint,
    out: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: same contract as the v2 symbol (nvml.h #defines the name to it).
    unsafe { nvmlDeviceGetNvLinkRemotePciInfo_v2(h, link, out) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    h: nvmlDevice_t,
    link: c_uint,
    out: *mut nvmlIntNvLinkDeviceType_t,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        link_call(
            h,
            "nvmlDeviceGetNvLinkRemoteDeviceType",
            link,
            out,
            |r, _| match r.ok_or(code::NOT_SUPPORTED)? {
                Remote::Gpu(_) => Ok(REMOTE_GPU),
                Remote::Switch => Ok(REMOTE_SWITCH),
            },
        )
    }
}

/// `NVML_STRUCT_VERSION(GpuFabricInfo, v)`.
const FABRIC_V2: c_uint = (std::mem::size_of::<nvmlGpuFabricInfo_v2_t>() as c_uint) | (2 << 24);
const FABRIC_V3: c_uint = (std::mem::size_of::<nvmlGpuFabricInfo_v3_t>() as c_uint) | (3 << 24);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    h: nvmlDevice_t,
    out: *mut nvmlGpuFabricInfo_v3_t,
) -> nvmlReturn_t {
    entry(|| {
        if out.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller presets `version` in its struct (nvml.h).
        let version = unsafe { (*out).version };
        if version != FABRIC_V2 && version != FABRIC_V3 {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        let st = state();
        let (dev, gpu) = st.dev(h, "nvmlDeviceGetGpuFabricInfoV")?;
        gpu_only(dev)?;
        let fabric = gpu.fabric.as_ref().ok_or(code::NOT_SUPPORTED)?;
        let cluster = fabric.cluster_uuid_bytes().unwrap_or_default();
        let state = fabric.state_code().unwrap_or(0);
        // SAFETY: non-null; the fields of v2 are a prefix of v3, and a v2 caller's struct
        // holds them (its version says so); `healthSummary` is only written for v3.
        unsafe {
            (*out).clusterUuid = cluster;
            (*out).status = fabric.status;
            (*out).cliqueId = fabric.clique_id;
            (*out).state = state;
            (*out).healthMask = 0;
            if version == FABRIC_V3 {
                (*out).healthSummary = 0;
            }
        }
        Ok(())
    })
}

fn switch_pci_info() -> nvmlPciInfo_t {
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: 0xffff,
        bus: 0,
        device: 0,
        pciDeviceId: 0x22A3_10DE,
        pciSubSystemId: 0,
        busId: [0; 32],
    };
    let long = SWITCH_BUS_ID.to_ascii_uppercase();
    for (dst, src) in info.busId.iter_mut().zip(long.bytes()) {
        *dst = src as c_char;
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rows: &[&str], nvswitch: bool) -> TopologySpec {
        TopologySpec {
            matrix: rows.iter().map(|r| r.to_string()).collect(),
            nvswitch,
            unsupported: Vec::new(),
        }
    }

    #[test]
    fn links_follow_the_row_or_the_switch() {
        let t = spec(&["X NV2 SYS", "NV2 X NV1", "SYS NV1 X"], false);
        assert_eq!(links(&t, 3, 0), vec![Remote::Gpu(1); 2]);
        assert_eq!(
            links(&t, 3, 1),
            vec![Remote::Gpu(0), Remote::Gpu(0), Remote::Gpu(2)]
        );
        let t = spec(&["X NV18", "NV18 X"], true);
        assert_eq!(links(&t, 2, 0), vec![Remote::Switch; 18]);
        let t = spec(&["X NV12 NV12", "NV12 X SYS", "NV12 SYS X"], false);
        assert_eq!(links(&t, 3, 0).len(), 18, "capped at NVML_NVLINK_MAX_LINKS");
    }
}
