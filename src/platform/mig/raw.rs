//! The raw NVML MIG calls the wrapper does not offer, each through the wrapper's loaded
//! symbol table (`Nvml::lib()`). Each takes handles from the same `Nvml` and uses the `Result`
//! symbol fields (the generated methods panic on a missing symbol), so an old driver gives
//! `FailedToLoadSymbol`. Every `unsafe` block says why it is sound.

use std::ffi::c_uint;

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t,
    nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_t,
};

/// `NVML_COMPUTE_INSTANCE_PROFILE_*` indices of the compute-slice counts MIG GPUs offer.
const CI_PROFILE_INDICES: [u32; 5] = [0, 1, 2, 3, 4];

pub(super) fn gi_profile_info(
    dev: &Device<'_>,
    index: u32,
) -> Result<nvmlGpuInstanceProfileInfo_t, NvmlError> {
    // The wrapper's `profile_info` is this call; it returns its own struct, the raw one is kept
    // for its `id`.
    let info = dev.profile_info(index)?;
    Ok(nvmlGpuInstanceProfileInfo_t {
        id: info.id,
        isP2pSupported: u32::from(info.is_p2p_supported),
        sliceCount: info.slice_count,
        instanceCount: info.instance_count,
        multiprocessorCount: info.multiprocessor_count,
        copyEngineCount: info.copy_engine_count,
        decoderCount: info.decoder_count,
        encoderCount: info.encoder_count,
        jpegCount: info.jpeg_count,
        ofaCount: info.ofa_count,
        memorySizeMB: info.memory_size_mb,
    })
}

pub(super) fn raw(dev: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: the handle stays owned by `dev` (borrowed from a live `Nvml`) and is only passed
    // back into the same library while `dev` is alive.
    unsafe { dev.handle() }
}

pub(super) fn placements(
    nvml: &Nvml,
    dev: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<(u32, u32)>, NvmlError> {
    let sym = nvml_sym(
        nvml.lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref(),
    )?;
    let mut count: c_uint = 0;
    // SAFETY: nvml.h signature; a null array with a count pointer asks for the count.
    nvml_try(unsafe { sym(raw(dev), profile_id, std::ptr::null_mut(), &mut count) })?;
    let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count.min(64) as usize];
    let mut n = buf.len() as c_uint;
    // SAFETY: `buf` holds `n` entries and outlives the call; the driver writes at most `n`.
    nvml_try(unsafe { sym(raw(dev), profile_id, buf.as_mut_ptr(), &mut n) })?;
    buf.truncate(n as usize);
    Ok(buf.iter().map(|p| (p.start, p.size)).collect())
}

pub(super) fn gpu_instances(
    nvml: &Nvml,
    dev: &Device<'_>,
    profile_id: u32,
    capacity: u32,
) -> Result<Vec<nvmlGpuInstance_t>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstances.as_ref())?;
    // nvml.h: the buffer must hold the profile's `instanceCount`; one spare for safety.
    let mut buf: Vec<nvmlGpuInstance_t> = vec![std::ptr::null_mut(); capacity as usize + 1];
    let mut n: c_uint = 0;
    // SAFETY: `buf` holds more than `instanceCount` handles and outlives the call.
    nvml_try(unsafe { sym(raw(dev), profile_id, buf.as_mut_ptr(), &mut n) })?;
    buf.truncate((n as usize).min(capacity as usize + 1));
    Ok(buf)
}

pub(super) fn gi_info(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
) -> Result<nvmlGpuInstanceInfo_t, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    // SAFETY: plain-data struct; all-zero is a valid bit pattern (null pointers, zero ints).
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `gi` came from this library; `info` is a valid out-pointer for the call.
    nvml_try(unsafe { sym(gi, &mut info) })?;
    Ok(info)
}

/// The compute-instance profile spanning a GPU instance of `slices` compute slices.
pub(super) fn full_ci_profile(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    slices: u32,
) -> Result<Option<nvmlComputeInstanceProfileInfo_t>, NvmlError> {
    Ok(ci_profiles(nvml, gi)?
        .into_iter()
        .find(|p| p.sliceCount == slices))
}

fn ci_profiles(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
) -> Result<Vec<nvmlComputeInstanceProfileInfo_t>, NvmlError> {
    let sym = nvml_sym(
        nvml.lib()
            .nvmlGpuInstanceGetComputeInstanceProfileInfo
            .as_ref(),
    )?;
    let mut out = Vec::new();
    for idx in CI_PROFILE_INDICES {
        // SAFETY: plain-data struct; zero is valid.
        let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `gi` came from this library; engine profile 0 is SHARED; `info` is valid.
        match nvml_try(unsafe { sym(gi, idx, 0, &mut info) }) {
            Ok(()) => out.push(info),
            // Profiles larger than the GPU instance do not exist for it.
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Compute instances of a GPU instance: (id, spans the GPU instance, handle).
pub(super) fn compute_instances(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    gi_slices: u32,
) -> Result<Vec<(u32, bool, nvmlComputeInstance_t)>, NvmlError> {
    let list = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstances.as_ref())?;
    let info_sym = nvml_sym(nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
    let mut out = Vec::new();
    for p in ci_profiles(nvml, gi)? {
        let mut buf: Vec<nvmlComputeInstance_t> =
            vec![std::ptr::null_mut(); p.instanceCount as usize + 1];
        let mut n: c_uint = 0;
        // SAFETY: `buf` holds more than the profile's `instanceCount` handles.
        nvml_try(unsafe { list(gi, p.id, buf.as_mut_ptr(), &mut n) })?;
        buf.truncate((n as usize).min(buf.len()));
        for ci in buf {
            // SAFETY: plain-data struct; zero is valid.
            let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `ci` came from this library; `info` is a valid out-pointer.
            nvml_try(unsafe { info_sym(ci, &mut info) })?;
            out.push((info.id, p.sliceCount == gi_slices, ci));
        }
    }
    out.sort_by_key(|(id, _, _)| *id);
    Ok(out)
}

pub(super) fn gi_create(
    nvml: &Nvml,
    dev: &Device<'_>,
    profile_id: u32,
    start: u32,
    size: u32,
) -> Result<(), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: nvml.h signature; `placement` and `gi` outlive the call.
    nvml_try(unsafe { sym(raw(dev), profile_id, &placement, &mut gi) })
}

pub(super) fn gi_destroy(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<(), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
    // SAFETY: `gi` came from this library and is not used after a successful destroy.
    nvml_try(unsafe { sym(gi) })
}

pub(super) fn ci_create(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    profile_id: u32,
) -> Result<(), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceCreateComputeInstance.as_ref())?;
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: `gi` came from this library; `ci` is a valid out-pointer.
    nvml_try(unsafe { sym(gi, profile_id, &mut ci) })
}

pub(super) fn ci_destroy(nvml: &Nvml, ci: nvmlComputeInstance_t) -> Result<(), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlComputeInstanceDestroy.as_ref())?;
    // SAFETY: `ci` came from this library and is not used after a successful destroy.
    nvml_try(unsafe { sym(ci) })
}
