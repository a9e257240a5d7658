//! A fake `libcuda.so` (the CUDA driver API) for CI: it answers the device queries a CUDA
//! program makes first, from a `node-spec` file, showing only the devices this process's
//! device nodes reach. With the fake `libnvidia-ml.so` it makes up the fake driver that
//! `hack/fake-driver-root.sh` lays out and the Podman e2e mounts into containers through
//! gpu-slicer's CDI spec; the `nvidia-smi` stand-in (`crates/fake-smi`) loads it by soname.
//!
//! # Configuration (shared with the fake NVML through `crates/fake-view`)
//!
//! * `FAKE_NVML_NODE`: the node file, read by `cuInit`.
//! * `FAKE_GPU_DEV_ROOT`: when set (`/` in a container), only GPUs with `dev/nvidia<minor>`
//!   and MIG devices with both their `dev/nvidia-caps` nodes exist.
//! * `FAKE_NVML_LIMITS_FILE`: per-cgroup memory limits; a GPU whose limit names this
//!   process's cgroup reports the limit as its total memory.
//!
//! # Behaviour
//!
//! * CUDA devices, in order: for each visible GPU (NVML order), its visible MIG devices by slot
//!   when MIG is enabled, else the GPU itself. A MIG device's name is `<product> MIG <profile>`,
//!   its UUID (`cuDeviceGetUuid_v2`) the MIG UUID's 16 bytes.
//! * `cuInit(0)` fails with `CUDA_ERROR_NO_DEVICE` (100) when there is no node file, no
//!   `nvidiactl` or no visible device (the reason goes to stderr); other flags give
//!   `CUDA_ERROR_INVALID_VALUE` (1). Device calls before a successful `cuInit` give
//!   `CUDA_ERROR_NOT_INITIALIZED` (3); a bad ordinal `CUDA_ERROR_INVALID_DEVICE` (101).
//! * `cuDriverGetVersion` answers the node's `cudaDriverVersion` without `cuInit` (as the
//!   real one does); `NOT_INITIALIZED` when no node file can be read.
//! * Contexts: `cuCtxCreate_v2` makes a context current on the calling thread (a tagged
//!   integer, never dereferenced), `cuCtxDestroy_v2` ends it; `cuMemGetInfo_v2` needs one
//!   (`CUDA_ERROR_INVALID_CONTEXT`, 201) and reports free = total = the device's memory.
//!
//! Every export is `extern "C"` with CUDA's signature, catches panics (→ `CUDA_ERROR_UNKNOWN`,
//! 999) and starts no threads; the `# Safety` of each export is the pointer contract of
//! `cuda.h`.
#![allow(clippy::missing_safety_doc)]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard};

use node_spec::NodeSpec;

/// `CUresult` values used here (cuda.h).
pub mod code {
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: u32 = 0;
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: u32 = 1;
    /// `CUDA_ERROR_NOT_INITIALIZED`.
    pub const NOT_INITIALIZED: u32 = 3;
    /// `CUDA_ERROR_NO_DEVICE`.
    pub const NO_DEVICE: u32 = 100;
    /// `CUDA_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: u32 = 101;
    /// `CUDA_ERROR_INVALID_CONTEXT`.
    pub const INVALID_CONTEXT: u32 = 201;
    /// `CUDA_ERROR_UNKNOWN`.
    pub const UNKNOWN: u32 = 999;
}

/// `CUresult`.
#[allow(non_camel_case_types, reason = "name mirrors cuda.h")]
pub type CUresult = c_uint;
/// `CUdevice` (an ordinal).
#[allow(non_camel_case_types, reason = "name mirrors cuda.h")]
pub type CUdevice = c_int;
/// `CUcontext` (opaque).
#[allow(non_camel_case_types, reason = "name mirrors cuda.h")]
pub type CUcontext = *mut std::ffi::c_void;

/// `CUuuid`: 16 raw bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types, reason = "name mirrors cuda.h")]
pub struct CUuuid {
    /// The UUID's bytes.
    pub bytes: [c_char; 16],
}

const _: () = assert!(size_of::<CUuuid>() == 16);

/// One CUDA device as the driver API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDevice {
    /// `cuDeviceGetName`.
    pub name: String,
    /// NVML UUID of the device (`GPU-…` or `MIG-…`).
    pub uuid: String,
    /// NVML UUID of the GPU it is on (the key of memory limits).
    pub gpu_uuid: String,
    /// Memory in bytes before any cgroup limit.
    pub memory: u64,
    /// Whether it is a MIG device (never memory-partitioned).
    pub mig: bool,
}

/// The CUDA devices of a (visible) node, in enumeration order (see the crate docs).
pub fn cuda_devices(node: &NodeSpec) -> Vec<CudaDevice> {
    let mut out = Vec::new();
    for gpu in &node.gpus {
        if gpu.mig_enabled() {
            for (_, d) in gpu.mig_devices() {
                out.push(CudaDevice {
                    name: format!("{} MIG {}", gpu.product, d.profile),
                    uuid: d.uuid.clone(),
                    gpu_uuid: gpu.uuid.clone(),
                    memory: gpu.mig_memory_mib(d) << 20,
                    mig: true,
                });
            }
        } else {
            out.push(CudaDevice {
                name: gpu.product.clone(),
                uuid: gpu.uuid.clone(),
                gpu_uuid: gpu.uuid.clone(),
                memory: gpu.memory_mib() << 20,
                mig: false,
            });
        }
    }
    out
}

/// The 16 bytes of a `GPU-…`/`MIG-…` UUID (node files validate the hex form).
pub fn uuid_bytes(uuid: &str) -> Option<[u8; 16]> {
    let hex: String = uuid
        .split_once('-')?
        .1
        .chars()
        .filter(|c| *c != '-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[derive(Debug)]
struct Driver {
    devices: Vec<CudaDevice>,
}

static STATE: Mutex<Option<Driver>> = Mutex::new(None);

thread_local! {
    /// Ordinal of the calling thread's current context. `Cell<Option<i32>>` has no
    /// destructor, so no TLS destructor outlives a `dlclose`.
    static CURRENT: Cell<Option<CUdevice>> = const { Cell::new(None) };
}

const CTX_BASE: usize = 0xC7C0_0000;

fn state() -> MutexGuard<'static, Option<Driver>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn entry(f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => code::SUCCESS,
        Ok(Err(c)) => c,
        Err(_) => code::UNKNOWN,
    }
}

/// # Safety
/// `p` must be null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: non-null and valid for writes per this function's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Run `f` on device `dev` of the initialised driver.
fn with_device<T>(dev: CUdevice, f: impl FnOnce(&CudaDevice) -> T) -> Result<T, CUresult> {
    let st = state();
    let drv = st.as_ref().ok_or(code::NOT_INITIALIZED)?;
    let d = usize::try_from(dev)
        .ok()
        .and_then(|i| drv.devices.get(i))
        .ok_or(code::INVALID_DEVICE)?;
    Ok(f(d))
}

fn total_memory(d: &CudaDevice) -> u64 {
    if d.mig {
        d.memory
    } else {
        fake_view::limited_total(&d.gpu_uuid, d.memory, &fake_view::LimitStore::new())
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    entry(|| {
        if flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        let mut st = state();
        if st.is_some() {
            return Ok(());
        }
        let node = fake_view::node_from_env().map_err(|e| {
            eprintln!("fake-cuda: {e}");
            code::NO_DEVICE
        })?;
        let devices = cuda_devices(&node);
        if devices.is_empty() {
            eprintln!("fake-cuda: no visible GPU or MIG device");
            return Err(code::NO_DEVICE);
        }
        *st = Some(Driver { devices });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    entry(|| {
        let path = std::env::var_os(fake_view::NODE_ENV).ok_or(code::NOT_INITIALIZED)?;
        let node = NodeSpec::load(std::path::Path::new(&path)).map_err(|e| {
            eprintln!("fake-cuda: {e}");
            code::NOT_INITIALIZED
        })?;
        // SAFETY: out-pointer per cuda.h.
        unsafe { put(version, node.cuda_driver_version) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    entry(|| {
        let n = state().as_ref().ok_or(code::NOT_INITIALIZED)?.devices.len();
        // SAFETY: out-pointer per cuda.h.
        unsafe { put(count, n as c_int) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    entry(|| {
        with_device(ordinal, |_| ())?;
        // SAFETY: out-pointer per cuda.h.
        unsafe { put(device, ordinal) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    entry(|| {
        let text = with_device(dev, |d| d.name.clone())?;
        let Ok(len) = usize::try_from(len) else {
            return Err(code::INVALID_VALUE);
        };
        if name.is_null() || len == 0 {
            return Err(code::INVALID_VALUE);
        }
        // Like the real driver: truncate to fit, always NUL-terminate.
        let n = text.len().min(len - 1);
        // SAFETY: `name` holds `len` bytes (cuda.h) and we write `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    entry(|| {
        let bytes = with_device(dev, |d| uuid_bytes(&d.uuid))?.ok_or(code::UNKNOWN)?;
        let v = CUuuid {
            bytes: bytes.map(|b| b as c_char),
        };
        // SAFETY: out-pointer per cuda.h.
        unsafe { put(uuid, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: same contract as the v2 symbol.
    unsafe { cuDeviceGetUuid_v2(uuid, dev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    entry(|| {
        let total = with_device(dev, total_memory)?;
        // SAFETY: out-pointer per cuda.h.
        unsafe { put(bytes, total as usize) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        with_device(dev, |_| ())?;
        let handle = (CTX_BASE + ((dev as usize) << 4)) as CUcontext;
        // SAFETY: out-pointer per cuda.h.
        unsafe { put(ctx, handle) }?;
        CURRENT.with(|c| c.set(Some(dev)));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    entry(|| {
        let raw = (ctx as usize)
            .checked_sub(CTX_BASE)
            .filter(|r| r & 0xf == 0)
            .ok_or(code::INVALID_CONTEXT)?;
        let dev = CUdevice::try_from(raw >> 4).map_err(|_| code::INVALID_CONTEXT)?;
        CURRENT.with(|c| {
            if c.get() == Some(dev) {
                c.set(None);
            }
        });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry(|| {
        if state().is_none() {
            return Err(code::NOT_INITIALIZED);
        }
        let dev = CURRENT.with(Cell::get).ok_or(code::INVALID_CONTEXT)?;
        let bytes = with_device(dev, total_memory)? as usize;
        // SAFETY: out-pointers per cuda.h.
        unsafe {
            put(free, bytes)?;
            put(total, bytes)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_of_a_mixed_node() {
        let node = NodeSpec::parse(
            r#"
gpus:
  - index: 0
    uuid: GPU-00000000-0000-0000-0000-0000000000a0
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "0000:07:00.0"
    mig:
      enabled: true
      devices:
        - {uuid: MIG-00000000-0000-0000-0000-000000000008, profile: 1g.10gb, gpuInstanceId: 8, slot: 3}
        - {uuid: MIG-00000000-0000-0000-0000-000000000002, profile: 3g.40gb, gpuInstanceId: 2, slot: 0}
  - index: 1
    uuid: GPU-00000000-0000-0000-0000-0000000000a1
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "0000:0f:00.0"
"#,
            "t",
        )
        .unwrap();
        let devs = cuda_devices(&node);
        let got: Vec<(&str, &str, u64, bool)> = devs
            .iter()
            .map(|d| (d.name.as_str(), d.uuid.as_str(), d.memory >> 20, d.mig))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                    "MIG-00000000-0000-0000-0000-000000000002",
                    40960,
                    true
                ),
                (
                    "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
                    "MIG-00000000-0000-0000-0000-000000000008",
                    10240,
                    true
                ),
                (
                    "NVIDIA A100-SXM4-80GB",
                    "GPU-00000000-0000-0000-0000-0000000000a1",
                    81920,
                    false
                ),
            ]
        );
        assert_eq!(devs[0].gpu_uuid, "GPU-00000000-0000-0000-0000-0000000000a0");
    }

    #[test]
    fn uuid_bytes_from_nvml_form() {
        let b = uuid_bytes("GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03").unwrap();
        assert_eq!(b[0], 0x9d);
        assert_eq!(b[15], 0x03);
        assert_eq!(uuid_bytes("GPU-9d3e"), None);
        assert_eq!(uuid_bytes("nodash"), None);
    }
}

/// The exports called as a C program would, in one test: it is the only one in this binary
/// that touches the environment or the library's global state.
#[cfg(test)]
mod abi {
    use super::*;

    #[test]
    fn calls_before_and_after_init() {
        let node = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../hack/nodes/mixed-a100.yaml"
        );
        let mut n = -1;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers throughout.
        unsafe {
            assert_eq!(cuDeviceGetCount(&mut n), code::NOT_INITIALIZED);
            assert_eq!(cuInit(1), code::INVALID_VALUE);
            // SAFETY (env): no other test in this binary reads or writes the environment.
            std::env::remove_var(fake_view::NODE_ENV);
            std::env::remove_var(fake_view::DEV_ROOT_ENV);
            assert_eq!(cuInit(0), code::NO_DEVICE);
            assert_eq!(cuDriverGetVersion(&mut n), code::NOT_INITIALIZED);
            std::env::set_var(fake_view::NODE_ENV, node);
            assert_eq!(cuDriverGetVersion(&mut n), code::SUCCESS);
            assert_eq!(n, 12080);
            assert_eq!(cuInit(0), code::SUCCESS);
            assert_eq!(cuDeviceGetCount(&mut n), code::SUCCESS);
            assert_eq!(n, 13);
            let mut dev = -1;
            assert_eq!(cuDeviceGet(&mut dev, 13), code::INVALID_DEVICE);
            assert_eq!(cuDeviceGet(&mut dev, 11), code::SUCCESS);
            assert_eq!(dev, 11);
            // A short buffer truncates and stays NUL-terminated.
            let mut name = [1 as c_char; 8];
            assert_eq!(cuDeviceGetName(name.as_mut_ptr(), 8, dev), code::SUCCESS);
            assert_eq!(
                std::ffi::CStr::from_ptr(name.as_ptr()).to_str(),
                Ok("NVIDIA ")
            );
            assert_eq!(
                cuDeviceGetName(name.as_mut_ptr(), 0, dev),
                code::INVALID_VALUE
            );
            let mut uuid = CUuuid { bytes: [0; 16] };
            assert_eq!(cuDeviceGetUuid_v2(&mut uuid, dev), code::SUCCESS);
            assert_eq!(
                uuid.bytes.map(|b| b as u8),
                uuid_bytes("GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02").unwrap()
            );
            assert_eq!(
                cuMemGetInfo_v2(&mut free, &mut total),
                code::INVALID_CONTEXT
            );
            let mut ctx = std::ptr::null_mut();
            assert_eq!(cuCtxCreate_v2(&mut ctx, 0, 0), code::SUCCESS);
            assert_eq!(cuMemGetInfo_v2(&mut free, &mut total), code::SUCCESS);
            assert_eq!((free, total), (10 << 30, 10 << 30));
            assert_eq!(cuCtxDestroy_v2(ctx), code::SUCCESS);
            assert_eq!(
                cuMemGetInfo_v2(&mut free, &mut total),
                code::INVALID_CONTEXT
            );
            assert_eq!(cuCtxDestroy_v2(std::ptr::null_mut()), code::INVALID_CONTEXT);
            assert_eq!(
                cuDeviceTotalMem_v2(std::ptr::null_mut(), 0),
                code::INVALID_VALUE
            );
        }
    }
}
