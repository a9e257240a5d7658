//! GPU instances and compute instances: create, list, destroy, with each product's real
//! profile and placement tables (`node_spec::placements`), so `gpu-slicer mig apply` and the
//! daemon's live repartitioning run against the same rules a driver enforces.
//!
//! # State
//!
//! The instances of a GPU start as the node file's MIG devices (one GPU instance per
//! `gpuInstanceId`, placed by `node_spec::search_placements`). Once a GPU's instances change
//! they live in a [`StateFile`]: in memory, and in the JSON file named by `FAKE_NVML_STATE`
//! when set (rewritten through a temp file and a rename after every change, re-read at every
//! `nvmlInit` and instance call when its text changed), so separate processes see one GPU as
//! they would with a driver. The node the device calls serve is rebuilt from the node file
//! plus this state, then cut down by `FAKE_GPU_DEV_ROOT` as before: a new MIG device is only
//! visible where its capability device nodes exist.
//!
//! The state file also drives failures a test needs: `processes` (a compute process on a
//! GPU or compute instance: destroying it answers `NVML_ERROR_IN_USE`, and
//! `nvmlDeviceGetComputeRunningProcesses_v3` lists it) and `failCreate`
//! (GPU UUID → profiles whose GPU-instance create answers `NVML_ERROR_UNKNOWN`).
//!
//! # Handles and rules
//!
//! A GPU instance handle is `0x0100_0000 | (gpu position + 1) << 8 | gi id`, a compute
//! instance handle `0x0200_0000 | (gpu position + 1) << 12 | gi id << 4 | ci id`. Creating
//! needs MIG mode on (`NOT_SUPPORTED` otherwise); a placement that is not one of the
//! profile's is `INVALID_ARGUMENT`; one that overlaps another instance, or a profile whose
//! instance count or the GPU's compute slices are used up, is `INSUFFICIENT_RESOURCES`.
//! Destroying a GPU instance that still has compute instances, or an instance a process
//! runs on, is `IN_USE`. Compute instances are the full-size kind only (one per GPU
//! instance, the profile whose slice count is the GPU instance's); sub-slices are
//! `NOT_SUPPORTED` because the node format cannot describe them.

use std::collections::BTreeMap;
use std::ffi::c_uint;
use std::path::PathBuf;

use node_spec::{GiProfile, GpuSpec, MigDeviceSpec, NodeSpec, PlaceError, Placed, Product};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t,
    nvmlComputeInstanceProfileInfo_t, nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t, nvmlReturn_t,
};
use serde::{Deserialize, Serialize};

use crate::{Dev, Ret, State, code, entry, put, state};

/// Env var naming the shared state file.
pub(crate) const STATE_ENV: &str = "FAKE_NVML_STATE";

const IN_USE: u32 = nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_IN_USE;
const INSUFFICIENT_RESOURCES: u32 =
    nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
/// GPU instance ids the driver hands out (node-spec allows 0..15).
const MAX_GI: u32 = 15;
const GI_TAG: usize = 0x0100_0000;
const CI_TAG: usize = 0x0200_0000;

const _: () = assert!(size_of::<nvmlGpuInstancePlacement_t>() == 8);
const _: () = assert!(size_of::<nvmlGpuInstanceProfileInfo_t>() == 48);
const _: () = assert!(size_of::<nvmlGpuInstanceInfo_t>() == 24);
const _: () = assert!(size_of::<nvmlComputeInstanceProfileInfo_t>() == 36);
const _: () = assert!(size_of::<nvmlComputeInstanceInfo_t>() == 32);

/// What persists: every GPU whose instances were touched, plus the test controls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct StateFile {
    /// GPU UUID → its instances.
    #[serde(default)]
    pub(crate) gpus: BTreeMap<String, GpuInstances>,
    /// Compute processes running on instances.
    #[serde(default)]
    pub(crate) processes: Vec<Process>,
    /// GPU UUID → profiles whose create fails.
    #[serde(default)]
    pub(crate) fail_create: BTreeMap<String, Vec<String>>,
}

/// The instances of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct GpuInstances {
    pub(crate) instances: Vec<Gi>,
    /// Creates so far: seeds new MIG UUIDs so each create gets a fresh one, as on a driver.
    #[serde(default)]
    pub(crate) serial: u64,
}

/// One GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Gi {
    pub(crate) id: u32,
    pub(crate) profile: String,
    pub(crate) start: u32,
    #[serde(default)]
    pub(crate) compute_instances: Vec<Ci>,
}

/// One (full-size) compute instance: a MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Ci {
    pub(crate) id: u32,
    /// MIG device slot (`nvmlDeviceGetMigDeviceHandleByIndex`).
    pub(crate) slot: u32,
    pub(crate) uuid: String,
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub(crate) memory_mib: Option<u64>,
}

/// A compute process on a GPU (and, for MIG, on one instance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Process {
    pub(crate) gpu: String,
    pub(crate) pid: u32,
    #[serde(default)]
    pub(crate) gpu_instance_id: Option<u32>,
    #[serde(default)]
    pub(crate) compute_instance_id: Option<u32>,
}

/// The MIG part of the library's state.
#[derive(Debug)]
pub(crate) struct Mig {
    pub(crate) file: StateFile,
    /// Text of the state file last read or written (None: not read yet).
    seen: Option<String>,
}

impl Mig {
    pub(crate) const fn new() -> Self {
        Self {
            file: StateFile {
                gpus: BTreeMap::new(),
                processes: Vec::new(),
                fail_create: BTreeMap::new(),
            },
            seen: None,
        }
    }

    /// Forget everything (a new node was set through the control symbol).
    pub(crate) fn reset(&mut self) {
        *self = Self::new();
    }
}

fn state_path() -> Option<PathBuf> {
    std::env::var_os(STATE_ENV).map(PathBuf::from)
}

/// Re-read the state file when its text changed. `Ok(true)`: the state changed.
pub(crate) fn sync(mig: &mut Mig) -> Result<bool, String> {
    let Some(path) = state_path() else {
        return Ok(false);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            return Err(format!(
                "cannot read {STATE_ENV} file {}: {e}",
                path.display()
            ));
        }
    };
    if mig.seen.as_deref() == Some(text.as_str()) {
        return Ok(false);
    }
    mig.file = if text.trim().is_empty() {
        StateFile::default()
    } else {
        serde_json::from_str(&text)
            .map_err(|e| format!("invalid {STATE_ENV} file {}: {e}", path.display()))?
    };
    mig.seen = Some(text);
    Ok(true)
}

fn persist(mig: &mut Mig) -> Ret {
    let Some(path) = state_path() else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(&mig.file).map_err(|_| code::UNKNOWN)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::write(&tmp, &text).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        eprintln!(
            "fake-nvml: cannot write {STATE_ENV} file {}: {e}",
            path.display()
        );
        return Err(code::UNKNOWN);
    }
    mig.seen = Some(text);
    Ok(())
}

/// The instances a GPU of the node file has before anything changed them.
fn from_node(gpu: &GpuSpec) -> GpuInstances {
    let mut by_gi: BTreeMap<u32, (String, Vec<Ci>)> = BTreeMap::new();
    for (slot, dev) in gpu.mig_devices() {
        let e = by_gi
            .entry(dev.gpu_instance_id)
            .or_insert_with(|| (dev.profile.clone(), Vec::new()));
        e.1.push(Ci {
            id: dev.compute_instance_id,
            slot,
            uuid: dev.uuid.clone(),
            memory_mib: dev.memory_mib,
        });
    }
    let table = node_spec::lookup_product(&gpu.product)
        .map(node_spec::gi_profiles)
        .unwrap_or(&[]);
    let profiles: Vec<&'static GiProfile> = by_gi
        .values()
        .filter_map(|(p, _)| table.iter().find(|t| t.name == p))
        .collect();
    let starts = node_spec::lookup_product(&gpu.product)
        .filter(|_| profiles.len() == by_gi.len())
        .and_then(|product| node_spec::search_placements(product, &profiles, &[]));
    let mut next = 0;
    let instances = by_gi
        .into_iter()
        .enumerate()
        .map(|(i, (id, (profile, cis)))| {
            // A node file whose layout no placement holds still gets distinct starts.
            let start = starts.as_ref().map_or(next, |s| s[i]);
            next += table
                .iter()
                .find(|t| t.name == profile)
                .map_or(1, |t| t.memory_slices);
            Gi {
                id,
                profile,
                start,
                compute_instances: cis,
            }
        })
        .collect();
    GpuInstances {
        instances,
        serial: 0,
    }
}

/// Replace the MIG devices of every GPU in the state with what the state says.
pub(crate) fn overlay(node: &mut NodeSpec, mig: &StateFile) {
    for gpu in &mut node.gpus {
        let Some(st) = mig.gpus.get(&gpu.uuid) else {
            continue;
        };
        let Some(m) = gpu.mig.as_mut() else { continue };
        m.devices = devices_of(st);
    }
}

fn devices_of(st: &GpuInstances) -> Vec<MigDeviceSpec> {
    let mut out: Vec<MigDeviceSpec> = st
        .instances
        .iter()
        .flat_map(|gi| {
            gi.compute_instances.iter().map(move |ci| MigDeviceSpec {
                slot: Some(ci.slot),
                uuid: ci.uuid.clone(),
                profile: gi.profile.clone(),
                gpu_instance_id: gi.id,
                compute_instance_id: ci.id,
                memory_mib: ci.memory_mib,
            })
        })
        .collect();
    out.sort_by_key(|d| d.slot);
    out
}

fn mig_uuid(gpu: &str, serial: u64) -> String {
    // FNV-1a: a stable, fresh-per-create id without a random source.
    let h = |seed: u64| {
        let mut x: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
        for b in gpu.bytes().chain(serial.to_le_bytes()) {
            x ^= u64::from(b);
            x = x.wrapping_mul(0x0100_0000_01b3);
        }
        x
    };
    let (a, b) = (h(1), h(2));
    format!(
        "MIG-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

// ---------------------------------------------------------------- resolution

/// The GPU a device handle names, with its product (MIG-capable GPU handles only).
fn gpu_of(
    st: &State,
    h: nvmlDevice_t,
    sym: &str,
) -> Result<(usize, GpuSpec, &'static Product), nvmlReturn_t> {
    let (dev, gpu) = st.dev(h, sym)?;
    let Dev::Gpu(pos) = dev else {
        return Err(code::NOT_SUPPORTED);
    };
    let product = node_spec::lookup_product(&gpu.product).ok_or(code::NOT_SUPPORTED)?;
    Ok((pos, gpu.clone(), product))
}

fn gi_handle(pos: usize, gi: u32) -> nvmlGpuInstance_t {
    (GI_TAG | ((pos + 1) << 8) | gi as usize) as nvmlGpuInstance_t
}

fn ci_handle(pos: usize, gi: u32, ci: u32) -> nvmlComputeInstance_t {
    (CI_TAG | ((pos + 1) << 12) | ((gi as usize) << 4) | ci as usize) as nvmlComputeInstance_t
}

fn decode_gi(h: nvmlGpuInstance_t) -> Option<(usize, u32)> {
    let raw = h as usize;
    if raw & !0xffff != GI_TAG {
        return None;
    }
    Some((((raw >> 8) & 0xff).checked_sub(1)?, (raw & 0xff) as u32))
}

fn decode_ci(h: nvmlComputeInstance_t) -> Option<(usize, u32, u32)> {
    let raw = h as usize;
    if raw & !0xf_ffff != CI_TAG {
        return None;
    }
    Some((
        ((raw >> 12) & 0xff).checked_sub(1)?,
        ((raw >> 4) & 0xff) as u32,
        (raw & 0xf) as u32,
    ))
}

/// Sync with the state file (rebuilding the node when it changed) and make sure the GPU at
/// `pos` has an entry; returns its UUID.
fn touch(st: &mut State, pos: usize) -> Result<String, nvmlReturn_t> {
    refresh(st)?;
    let gpu = st.node()?.gpus.get(pos).ok_or(code::INVALID_ARGUMENT)?;
    let uuid = gpu.uuid.clone();
    if !st.mig.file.gpus.contains_key(&uuid) {
        // From the node file as written (not the device view, which may hide devices).
        let raw = crate::raw_node(st)?;
        let raw_gpu = raw
            .gpus
            .iter()
            .find(|g| g.uuid == uuid)
            .ok_or(code::UNKNOWN)?;
        let inst = from_node(raw_gpu);
        st.mig.file.gpus.insert(uuid.clone(), inst);
    }
    Ok(uuid)
}

/// Re-read the state file; rebuild the served node when it changed.
pub(crate) fn refresh(st: &mut State) -> Ret {
    match sync(&mut st.mig) {
        Ok(false) => Ok(()),
        Ok(true) => {
            if st.init_count > 0 {
                st.node = Some(crate::load_node(st)?);
            }
            Ok(())
        }
        Err(e) => {
            eprintln!("fake-nvml: {e}");
            Err(code::UNKNOWN)
        }
    }
}

/// Persist and rebuild the served node after a change.
fn commit(st: &mut State) -> Ret {
    persist(&mut st.mig)?;
    st.node = Some(crate::load_node(st)?);
    Ok(())
}

fn gi_profile_by_id(product: &Product, id: u32) -> Option<&'static GiProfile> {
    node_spec::gi_profiles(product).iter().find(|p| p.id == id)
}

fn busy(file: &StateFile, uuid: &str, gi: u32, ci: Option<u32>) -> bool {
    file.processes.iter().any(|p| {
        p.gpu == uuid
            && p.gpu_instance_id == Some(gi)
            && (ci.is_none() || p.compute_instance_id.is_none() || p.compute_instance_id == ci)
    })
}

// ---------------------------------------------------------------- GPU instances

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    h: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let (_, gpu, product) = gpu_of(&st, h, "nvmlDeviceGetGpuInstanceProfileInfo")?;
        let p = node_spec::gi_profiles(product)
            .iter()
            .find(|p| p.index == profile)
            .ok_or(code::NOT_SUPPORTED)?;
        // The figures the DRA slices publish (node-spec's table); a rough rule where the
        // table has none (H100 PCIe).
        let media = p.name.contains("+me") || p.memory_slices == product.memory_slices;
        let e = node_spec::mig_engines(&gpu.product, p.name).unwrap_or(node_spec::MigEngines {
            multiprocessors: p.compute_slices * 16,
            copy_engines: p.compute_slices,
            decoders: p.compute_slices.div_ceil(2),
            encoders: 0,
            jpeg_engines: u32::from(media),
            ofa_engines: u32::from(media),
        });
        let v = nvmlGpuInstanceProfileInfo_t {
            id: p.id,
            isP2pSupported: 0,
            sliceCount: p.compute_slices,
            instanceCount: p.instance_count,
            multiprocessorCount: e.multiprocessors,
            copyEngineCount: e.copy_engines,
            decoderCount: e.decoders,
            encoderCount: e.encoders,
            jpegCount: e.jpeg_engines,
            ofaCount: e.ofa_engines,
            memorySizeMB: gpu.memory_mib() * u64::from(p.memory_slices)
                / u64::from(product.memory_slices),
        };
        // SAFETY: out-pointer per nvml.h.
        unsafe { put(info, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    h: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let (_, _, product) = gpu_of(&st, h, "nvmlDeviceGetGpuInstancePossiblePlacements_v2")?;
        let p = gi_profile_by_id(product, profile_id).ok_or(code::INVALID_ARGUMENT)?;
        if count.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let n = p.starts.len() as c_uint;
        // SAFETY: `count` is non-null and valid per nvml.h.
        let room = unsafe { count.read() };
        // SAFETY: as above.
        unsafe { count.write(n) };
        if placements.is_null() {
            // The size query: every placement of the profile, free or not (nvml.h).
            return Ok(());
        }
        if room < n {
            return Err(code::INSUFFICIENT_SIZE);
        }
        for (i, &start) in p.starts.iter().enumerate() {
            // SAFETY: the caller's array holds `room >= n` entries.
            unsafe {
                placements.add(i).write(nvmlGpuInstancePlacement_t {
                    start,
                    size: p.memory_slices,
                })
            };
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    h: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    out: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let (pos, gpu, product) = gpu_of(&st, h, "nvmlDeviceCreateGpuInstanceWithPlacement")?;
        if !gpu.mig_enabled() {
            return Err(code::NOT_SUPPORTED);
        }
        let p = gi_profile_by_id(product, profile_id).ok_or(code::INVALID_ARGUMENT)?;
        if placement.is_null() || out.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-null, valid per nvml.h.
        let want = unsafe { placement.read() };
        if want.size != p.memory_slices {
            return Err(code::INVALID_ARGUMENT);
        }
        let uuid = touch(&mut st, pos)?;
        if st
            .mig
            .file
            .fail_create
            .get(&uuid)
            .is_some_and(|l| l.iter().any(|f| f == p.name))
        {
            return Err(code::UNKNOWN);
        }
        let gpus = &mut st.mig.file.gpus;
        let inst = gpus.get_mut(&uuid).ok_or(code::UNKNOWN)?;
        let table = node_spec::gi_profiles(product);
        let placed: Vec<Placed<'_>> = inst
            .instances
            .iter()
            .filter_map(|g| {
                Some(Placed {
                    profile: table.iter().find(|t| t.name == g.profile)?,
                    start: g.start,
                })
            })
            .collect();
        match node_spec::check_place(
            product,
            &placed,
            Placed {
                profile: p,
                start: want.start,
            },
        ) {
            Ok(()) => {}
            Err(PlaceError::BadStart) => return Err(code::INVALID_ARGUMENT),
            Err(PlaceError::Collides(_) | PlaceError::Exhausted) => {
                return Err(INSUFFICIENT_RESOURCES);
            }
        }
        let id = (1..MAX_GI)
            .find(|i| inst.instances.iter().all(|g| g.id != *i))
            .ok_or(INSUFFICIENT_RESOURCES)?;
        inst.instances.push(Gi {
            id,
            profile: p.name.to_string(),
            start: want.start,
            compute_instances: Vec::new(),
        });
        inst.instances.sort_by_key(|g| g.id);
        commit(&mut st)?;
        // SAFETY: checked non-null above.
        unsafe { put(out, gi_handle(pos, id)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    h: nvmlDevice_t,
    profile_id: c_uint,
    out: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let (pos, gpu, product) = gpu_of(&st, h, "nvmlDeviceGetGpuInstances")?;
        if !gpu.mig_enabled() {
            return Err(code::NOT_SUPPORTED);
        }
        let p = gi_profile_by_id(product, profile_id).ok_or(code::INVALID_ARGUMENT)?;
        if out.is_null() || count.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let uuid = touch(&mut st, pos)?;
        let ids: Vec<u32> = st.mig.file.gpus[&uuid]
            .instances
            .iter()
            .filter(|g| g.profile == p.name)
            .map(|g| g.id)
            .collect();
        for (i, id) in ids.iter().enumerate() {
            // SAFETY: nvml.h: the buffer holds the profile's `instanceCount` entries, which
            // bounds `ids` (creates enforce it).
            unsafe { out.add(i).write(gi_handle(pos, *id)) };
        }
        // SAFETY: checked non-null above.
        unsafe { put(count, ids.len() as c_uint) }
    })
}

/// Resolve a GPU-instance handle: (position, uuid, product, the instance).
fn gi_of(
    st: &mut State,
    h: nvmlGpuInstance_t,
) -> Result<(usize, String, &'static Product, Gi), nvmlReturn_t> {
    let (pos, id) = decode_gi(h).ok_or(code::INVALID_ARGUMENT)?;
    let dev = Dev::Gpu(pos).handle();
    let (_, _, product) = gpu_of(st, dev, "nvmlGpuInstanceGetInfo")?;
    let uuid = touch(st, pos)?;
    let gi = st.mig.file.gpus[&uuid]
        .instances
        .iter()
        .find(|g| g.id == id)
        .cloned()
        .ok_or(code::INVALID_ARGUMENT)?;
    Ok((pos, uuid, product, gi))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    h: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let (pos, _, product, gi) = gi_of(&mut st, h)?;
        let p = node_spec::gi_profiles(product)
            .iter()
            .find(|t| t.name == gi.profile)
            .ok_or(code::UNKNOWN)?;
        let v = nvmlGpuInstanceInfo_t {
            device: Dev::Gpu(pos).handle(),
            id: gi.id,
            profileId: p.id,
            placement: nvmlGpuInstancePlacement_t {
                start: gi.start,
                size: p.memory_slices,
            },
        };
        // SAFETY: out-pointer per nvml.h.
        unsafe { put(info, v) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceDestroy(h: nvmlGpuInstance_t) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let (_, uuid, _, gi) = gi_of(&mut st, h)?;
        if !gi.compute_instances.is_empty() || busy(&st.mig.file, &uuid, gi.id, None) {
            return Err(IN_USE);
        }
        let inst = st.mig.file.gpus.get_mut(&uuid).ok_or(code::UNKNOWN)?;
        inst.instances.retain(|g| g.id != gi.id);
        commit(&mut st)
    })
}

// ---------------------------------------------------------------- compute instances

/// `NVML_COMPUTE_INSTANCE_PROFILE_*` index → compute slices (the ones MIG GPUs offer).
fn ci_slices(index: u32) -> Option<u32> {
    match index {
        0 => Some(1),
        1 => Some(2),
        2 => Some(3),
        3 => Some(4),
        4 => Some(7),
        _ => None,
    }
}

/// CI profile ids equal their index on MIG GPUs.
fn ci_profile_for(gi: &GiProfile) -> u32 {
    (0..5)
        .find(|&i| ci_slices(i) == Some(gi.compute_slices))
        .unwrap_or(0)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    h: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let (_, _, product, gi) = gi_of(&mut st, h)?;
        let p = node_spec::gi_profiles(product)
            .iter()
            .find(|t| t.name == gi.profile)
            .ok_or(code::UNKNOWN)?;
        let slices = ci_slices(profile).ok_or(code::NOT_SUPPORTED)?;
        // Shared engines only; a 4-slice instance has no 3-slice compute profile.
        if eng_profile != 0 || slices > p.compute_slices || (p.compute_slices == 4 && slices == 3) {
            return Err(code::NOT_SUPPORTED);
        }
        let v = nvmlComputeInstanceProfileInfo_t {
            id: profile,
            sliceCount: slices,
            instanceCount: p.compute_slices / slices,
            multiprocessorCount: slices * 16,
            sharedCopyEngineCount: p.compute_slices,
            sharedDecoderCount: p.compute_slices.div_ceil(2),
            sharedEncoderCount: 0,
            sharedJpegCount: 0,
            sharedOfaCount: 0,
        };
        // SAFETY: out-pointer per nvml.h.
        unsafe { put(info, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    h: nvmlGpuInstance_t,
    profile_id: c_uint,
    out: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let (pos, uuid, product, gi) = gi_of(&mut st, h)?;
        let p = node_spec::gi_profiles(product)
            .iter()
            .find(|t| t.name == gi.profile)
            .ok_or(code::UNKNOWN)?;
        if out.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        if ci_slices(profile_id) != Some(p.compute_slices) {
            return Err(code::NOT_SUPPORTED);
        }
        if !gi.compute_instances.is_empty() {
            return Err(INSUFFICIENT_RESOURCES);
        }
        let inst = st.mig.file.gpus.get_mut(&uuid).ok_or(code::UNKNOWN)?;
        let used: Vec<u32> = inst
            .instances
            .iter()
            .flat_map(|g| g.compute_instances.iter().map(|c| c.slot))
            .collect();
        let slot = (0..product.max_mig_devices)
            .find(|s| !used.contains(s))
            .ok_or(INSUFFICIENT_RESOURCES)?;
        inst.serial += 1;
        let ci = Ci {
            id: 0,
            slot,
            uuid: mig_uuid(&uuid, inst.serial),
            memory_mib: None,
        };
        inst.instances
            .iter_mut()
            .find(|g| g.id == gi.id)
            .ok_or(code::UNKNOWN)?
            .compute_instances
            .push(ci);
        commit(&mut st)?;
        // SAFETY: checked non-null above.
        unsafe { put(out, ci_handle(pos, gi.id, 0)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    h: nvmlGpuInstance_t,
    profile_id: c_uint,
    out: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let (pos, _, product, gi) = gi_of(&mut st, h)?;
        let p = node_spec::gi_profiles(product)
            .iter()
            .find(|t| t.name == gi.profile)
            .ok_or(code::UNKNOWN)?;
        if out.is_null() || count.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let ids: Vec<u32> = if profile_id == ci_profile_for(p) {
            gi.compute_instances.iter().map(|c| c.id).collect()
        } else {
            Vec::new()
        };
        for (i, id) in ids.iter().enumerate() {
            // SAFETY: nvml.h: the buffer holds the profile's `instanceCount` entries (>= 1,
            // and a GPU instance holds at most one full-size compute instance here).
            unsafe { out.add(i).write(ci_handle(pos, gi.id, *id)) };
        }
        // SAFETY: checked non-null above.
        unsafe { put(count, ids.len() as c_uint) }
    })
}

/// Resolve a compute-instance handle: (position, uuid, the GPU instance, ci id).
fn ci_of(
    st: &mut State,
    h: nvmlComputeInstance_t,
) -> Result<(usize, String, &'static Product, Gi, u32), nvmlReturn_t> {
    let (pos, gi_id, ci) = decode_ci(h).ok_or(code::INVALID_ARGUMENT)?;
    let (pos, uuid, product, gi) = gi_of(st, gi_handle(pos, gi_id))?;
    if !gi.compute_instances.iter().any(|c| c.id == ci) {
        return Err(code::INVALID_ARGUMENT);
    }
    Ok((pos, uuid, product, gi, ci))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    h: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let (pos, _, product, gi, ci) = ci_of(&mut st, h)?;
        let p = node_spec::gi_profiles(product)
            .iter()
            .find(|t| t.name == gi.profile)
            .ok_or(code::UNKNOWN)?;
        let v = nvmlComputeInstanceInfo_t {
            device: Dev::Gpu(pos).handle(),
            gpuInstance: gi_handle(pos, gi.id),
            id: ci,
            profileId: ci_profile_for(p),
            placement: nvmlComputeInstancePlacement_t {
                start: 0,
                size: p.compute_slices,
            },
        };
        // SAFETY: out-pointer per nvml.h.
        unsafe { put(info, v) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceDestroy(h: nvmlComputeInstance_t) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let (_, uuid, _, gi, ci) = ci_of(&mut st, h)?;
        if busy(&st.mig.file, &uuid, gi.id, Some(ci)) {
            return Err(IN_USE);
        }
        let inst = st.mig.file.gpus.get_mut(&uuid).ok_or(code::UNKNOWN)?;
        let g = inst
            .instances
            .iter_mut()
            .find(|g| g.id == gi.id)
            .ok_or(code::UNKNOWN)?;
        g.compute_instances.retain(|c| c.id != ci);
        commit(&mut st)
    })
}

// ---------------------------------------------------------------- control

/// Replace the MIG state (the `FAKE_NVML_STATE` format) in memory, for in-process tests that
/// cannot set environment variables: 0 on success, 1 on a parse error, 999 on a panic. With
/// `FAKE_NVML_STATE` set, the file is rewritten too.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakeNvmlSetMigStateJson(text: *const std::ffi::c_char) -> std::ffi::c_int {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: NUL-terminated per the control symbol's contract.
        let Ok(text) = (unsafe { crate::get_str(text) }) else {
            return 1;
        };
        let mut st = state();
        let Ok(file) = serde_json::from_str::<StateFile>(text) else {
            eprintln!("fake-nvml: fakeNvmlSetMigStateJson: invalid state");
            return 1;
        };
        // Keep the instances already changed unless the new state names them.
        let mut merged = st.mig.file.clone();
        merged.processes = file.processes;
        merged.fail_create = file.fail_create;
        merged.gpus.extend(file.gpus);
        st.mig.file = merged;
        if persist(&mut st.mig).is_err() {
            return 1;
        }
        if st.init_count > 0 {
            match crate::load_node(&st) {
                Ok(node) => st.node = Some(node),
                Err(_) => return 1,
            }
        }
        0
    }));
    r.unwrap_or(999)
}

// ---------------------------------------------------------------- processes

/// Compute processes of the state file's `processes` (this module's, for instance
/// idleness; a GPU handle lists all of its GPU's, a MIG handle those on its instances).
/// `nvmlDeviceGetComputeRunningProcesses_v3` (in `usage`) lists them after the node file's.
pub(crate) fn state_processes(
    st: &mut State,
    h: nvmlDevice_t,
) -> Result<Vec<nvml_wrapper_sys::bindings::nvmlProcessInfo_t>, nvmlReturn_t> {
    refresh(st)?;
    let (dev, gpu) = st.dev(h, "nvmlDeviceGetComputeRunningProcesses_v3")?;
    let mig = crate::mig_of(gpu, dev).map(|m| (m.gpu_instance_id, m.compute_instance_id));
    let uuid = gpu.uuid.clone();
    Ok(st
        .mig
        .file
        .processes
        .iter()
        .filter(|p| p.gpu == uuid)
        .filter(|p| {
            mig.is_none_or(|(gi, ci)| {
                p.gpu_instance_id == Some(gi) && p.compute_instance_id.is_none_or(|c| c == ci)
            })
        })
        .map(|p| nvml_wrapper_sys::bindings::nvmlProcessInfo_t {
            pid: p.pid,
            usedGpuMemory: 0,
            gpuInstanceId: p.gpu_instance_id.unwrap_or(u32::MAX),
            computeInstanceId: p.compute_instance_id.unwrap_or(u32::MAX),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip() {
        assert_eq!(decode_gi(gi_handle(3, 14)), Some((3, 14)));
        assert_eq!(decode_ci(ci_handle(2, 13, 7)), Some((2, 13, 7)));
        assert_eq!(decode_gi(ci_handle(0, 1, 0) as nvmlGpuInstance_t), None);
        assert_eq!(decode_ci(gi_handle(0, 1) as nvmlComputeInstance_t), None);
    }

    #[test]
    fn fresh_uuids_are_well_formed_and_distinct() {
        let a = mig_uuid("GPU-1", 1);
        assert_ne!(a, mig_uuid("GPU-1", 2));
        assert_eq!(
            a.len(),
            "MIG-00000000-0000-0000-0000-000000000000".len(),
            "{a}"
        );
    }

    #[test]
    fn node_devices_get_placements() {
        let node = NodeSpec::parse(
            r#"
gpus:
  - index: 0
    uuid: GPU-00000000-0000-0000-0000-000000000000
    product: NVIDIA A100-SXM4-40GB
    pciBusId: "0000:07:00.0"
    mig:
      enabled: true
      devices:
        - {uuid: MIG-00000000-0000-0000-0000-000000000001, profile: 1g.5gb, gpuInstanceId: 7}
        - {uuid: MIG-00000000-0000-0000-0000-000000000002, profile: 3g.20gb, gpuInstanceId: 2}
        - {uuid: MIG-00000000-0000-0000-0000-000000000003, profile: 1g.5gb, gpuInstanceId: 8}
        - {uuid: MIG-00000000-0000-0000-0000-000000000004, profile: 2g.10gb, gpuInstanceId: 3}
"#,
            "t",
        )
        .unwrap();
        let st = from_node(&node.gpus[0]);
        let starts: Vec<(u32, u32)> = st.instances.iter().map(|g| (g.id, g.start)).collect();
        assert_eq!(starts, [(2, 4), (3, 0), (7, 2), (8, 3)]);
        let mut again = node.clone();
        let mut file = StateFile::default();
        file.gpus.insert(node.gpus[0].uuid.clone(), st);
        overlay(&mut again, &file);
        let mut a: Vec<_> = again.gpus[0]
            .mig
            .as_ref()
            .unwrap()
            .devices
            .iter()
            .map(|d| (&d.uuid, d.gpu_instance_id))
            .collect();
        let mut b: Vec<_> = node.gpus[0]
            .mig
            .as_ref()
            .unwrap()
            .devices
            .iter()
            .map(|d| (&d.uuid, d.gpu_instance_id))
            .collect();
        a.sort();
        b.sort();
        assert_eq!(a, b);
    }
}
