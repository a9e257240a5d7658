//! Usage queries of the fake: utilisation, memory in use and compute processes, served from
//! the node file's `usage` section (`node_spec::UsageSpec`).
//!
//! Behaviour, as the real driver documents it:
//! * `nvmlDeviceGetUtilizationRates`: GPUs not in MIG mode; `NOT_SUPPORTED` on MIG handles and
//!   on a GPU in MIG mode. `memory` (the memory-controller busy percent) is answered as 0.
//! * `nvmlDeviceGetComputeRunningProcesses_v3`: on a GPU not in MIG mode its processes with GI
//!   and CI ids `0xFFFFFFFF`; on a MIG handle the MIG device's processes with its GI/CI ids;
//!   on a GPU in MIG mode the processes of all its MIG devices. A `count` smaller than the
//!   list gives `INSUFFICIENT_SIZE` with the needed count (a null array is allowed then).
//! * Used memory (`nvmlDeviceGetMemoryInfo(_v2)`, see [`used_bytes`]) is the device's
//!   `memoryUsedMiB`, capped at the total the caller sees.

use std::ffi::c_uint;

use node_spec::{GpuSpec, ProcessSpec};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlProcessInfo_t, nvmlReturn_t, nvmlUtilization_t,
};

use crate::{Dev, NO_INSTANCE, State, code, entry, mig_at, mig_of, put, state};

// The layout nvml-wrapper reads (`nvmlProcessInfo_v2_t`, 24 bytes).
const _: () = assert!(std::mem::size_of::<nvmlProcessInfo_t>() == 24);

/// Bytes in use on a device whose total (as this caller sees it) is `total`.
pub(crate) fn used_bytes(st: &State, dev: Dev, gpu: &GpuSpec, total: u64) -> u64 {
    let Ok(node) = st.node() else { return 0 };
    let uuid = match mig_of(gpu, dev) {
        Some(m) => m.uuid.as_str(),
        None => gpu.uuid.as_str(),
    };
    node.usage
        .device(uuid)
        .map_or(0, |u| u.memory_used_mib() << 20)
        .min(total)
}

fn process_info(p: &ProcessSpec, gi: u32, ci: u32) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid: p.pid,
        usedGpuMemory: p.memory_mib << 20,
        gpuInstanceId: gi,
        computeInstanceId: ci,
    }
}

/// The processes a handle reports.
fn processes(st: &State, dev: Dev, gpu: &GpuSpec) -> Vec<nvmlProcessInfo_t> {
    let Ok(node) = st.node() else {
        return Vec::new();
    };
    let of = |uuid: &str, gi: u32, ci: u32| -> Vec<nvmlProcessInfo_t> {
        node.usage.device(uuid).map_or_else(Vec::new, |u| {
            u.processes
                .iter()
                .map(|p| process_info(p, gi, ci))
                .collect()
        })
    };
    match dev {
        Dev::Mig(_, slot) => mig_at(gpu, slot).map_or_else(Vec::new, |m| {
            of(&m.uuid, m.gpu_instance_id, m.compute_instance_id)
        }),
        Dev::Gpu(_) if gpu.mig_enabled() => gpu
            .mig_devices()
            .into_iter()
            .flat_map(|(_, m)| of(&m.uuid, m.gpu_instance_id, m.compute_instance_id))
            .collect(),
        Dev::Gpu(_) => of(&gpu.uuid, NO_INSTANCE, NO_INSTANCE),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    h: nvmlDevice_t,
    out: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let (dev, gpu) = st.dev(h, "nvmlDeviceGetUtilizationRates")?;
        if matches!(dev, Dev::Mig(..)) || gpu.mig_enabled() {
            return Err(code::NOT_SUPPORTED);
        }
        let percent = st
            .node()?
            .usage
            .device(&gpu.uuid)
            .and_then(|u| u.utilization_percent)
            .unwrap_or(0);
        // SAFETY: out-pointer per nvml.h.
        unsafe {
            put(
                out,
                nvmlUtilization_t {
                    gpu: percent,
                    memory: 0,
                },
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    h: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    entry(|| {
        if count.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let mut st = state();
        // The MIG state file's processes (instance idleness) come after the node file's.
        let extra = crate::mig::state_processes(&mut st, h)?;
        let (dev, gpu) = st.dev(h, "nvmlDeviceGetComputeRunningProcesses_v3")?;
        let mut list = processes(&st, dev, gpu);
        list.extend(extra);
        // SAFETY: `count` is non-null and points to the caller's capacity (nvml.h).
        let capacity = unsafe { count.read() } as usize;
        let n = c_uint::try_from(list.len()).map_err(|_| code::UNKNOWN)?;
        // SAFETY: as above.
        unsafe { count.write(n) };
        if list.len() > capacity {
            return Err(code::INSUFFICIENT_SIZE);
        }
        if list.is_empty() {
            return Ok(());
        }
        if infos.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: `infos` holds `capacity >= list.len()` elements (nvml.h contract).
        unsafe { std::ptr::copy_nonoverlapping(list.as_ptr(), infos, list.len()) };
        Ok(())
    })
}
