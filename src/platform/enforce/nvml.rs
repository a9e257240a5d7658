//! The real [`MemoryLimiter`]: NVML's per-cgroup memory limits through `libloading`.
//!
//! Loads `libnvidia-ml.so.1` (or a given path), `nvmlInit_v2`, `nvmlDeviceGetHandleByUUID`,
//! `nvmlDeviceSetMemoryLimits_v1`, `nvmlShutdown`. The setter is looked up as an optional
//! symbol: drivers before memory partitioning lack it, which gives
//! [`LimitError::Unsupported`]. Used by the short-lived hook process only, so blocking is
//! fine here.
//!
//! Struct layout, from `nvml.h` (CUDA 13.4, `nvmlSetMemoryLimits_v1_t`, also the NVML API
//! reference page of that struct): `const char *nameSpace` (full path of the cgroup
//! directory, a pointer, not an inline buffer), `unsigned long long softLimit`,
//! `unsigned long long hardLimit`; no version field (the `_v1` is in the function name),
//! 24 bytes on LP64. Clearing is soft 0 / hard `NVML_DEVICE_MEMORY_LIMIT_MAX` (all ones).

use std::ffi::{CStr, CString, c_char, c_uint, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{LimitError, MemoryLimiter};

/// `nvmlSetMemoryLimits_v1_t`.
#[repr(C)]
#[derive(Debug)]
struct SetMemoryLimitsV1 {
    name_space: *const c_char,
    soft_limit: u64,
    hard_limit: u64,
}

const _: () = assert!(std::mem::size_of::<SetMemoryLimitsV1>() == 24);
const _: () = assert!(std::mem::offset_of!(SetMemoryLimitsV1, soft_limit) == 8);
const _: () = assert!(std::mem::offset_of!(SetMemoryLimitsV1, hard_limit) == 16);

/// `nvmlDevice_t`: an opaque pointer.
type Device = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_uint;
type HandleByUuidFn = unsafe extern "C" fn(*const c_char, *mut Device) -> c_uint;
type SetLimitsFn = unsafe extern "C" fn(Device, *mut SetMemoryLimitsV1) -> c_uint;
type ErrorStringFn = unsafe extern "C" fn(c_uint) -> *const c_char;

/// NVML-backed limiter.
#[derive(Debug)]
pub(crate) struct NvmlLimiter {
    lib: PathBuf,
}

impl NvmlLimiter {
    /// Use `lib` (default: `libnvidia-ml.so.1` through the loader's search path).
    pub(crate) fn new(lib: Option<PathBuf>) -> Self {
        Self {
            lib: lib.unwrap_or_else(|| PathBuf::from("libnvidia-ml.so.1")),
        }
    }
}

impl MemoryLimiter for NvmlLimiter {
    fn set_hard_limit(
        &mut self,
        device_uuid: &str,
        cgroup: &Path,
        bytes: u64,
    ) -> Result<(), LimitError> {
        let lib_name = self.lib.display().to_string();
        let load = |message: String| LimitError::Load {
            lib: lib_name.clone(),
            message,
        };
        // SAFETY: loading NVML runs its initialisers; it is the library this program is
        // configured to use, and nothing else in this process uses it concurrently.
        let lib =
            unsafe { libloading::Library::new(&self.lib) }.map_err(|e| load(e.to_string()))?;
        // SAFETY: the symbol types match nvml.h's prototypes of these functions.
        let (init, shutdown, by_uuid, error_string, set_limits) = unsafe {
            (
                lib.get::<InitFn>(b"nvmlInit_v2\0")
                    .map_err(|e| load(e.to_string()))?,
                lib.get::<InitFn>(b"nvmlShutdown\0")
                    .map_err(|e| load(e.to_string()))?,
                lib.get::<HandleByUuidFn>(b"nvmlDeviceGetHandleByUUID\0")
                    .map_err(|e| load(e.to_string()))?,
                lib.get::<ErrorStringFn>(b"nvmlErrorString\0").ok(),
                lib.get::<SetLimitsFn>(b"nvmlDeviceSetMemoryLimits_v1\0")
                    .ok(),
            )
        };
        let Some(set_limits) = set_limits else {
            return Err(LimitError::Unsupported(format!(
                "{lib_name} has no nvmlDeviceSetMemoryLimits_v1: per-cgroup GPU memory limits need an NVIDIA driver with NVML memory partitioning (CUDA 13.4 / nvml.h 13.x or newer)"
            )));
        };
        let message = |code: c_uint| match &error_string {
            // SAFETY: nvmlErrorString returns a static NUL-terminated string or NULL.
            Some(f) => unsafe {
                let p = f(code);
                if p.is_null() {
                    "unknown error".to_string()
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            },
            None => "unknown error".to_string(),
        };
        let fail = |call: &'static str, code: c_uint| LimitError::Nvml {
            call,
            device: device_uuid.to_string(),
            code,
            message: message(code),
        };
        let uuid = CString::new(device_uuid).map_err(|e| fail_arg(device_uuid, e))?;
        let ns =
            CString::new(cgroup.as_os_str().as_bytes()).map_err(|e| fail_arg(device_uuid, e))?;

        // SAFETY: nvmlInit_v2 takes no arguments.
        let rc = unsafe { init() };
        if rc != 0 {
            return Err(fail("nvmlInit_v2", rc));
        }
        let result = (|| {
            let mut dev: Device = std::ptr::null_mut();
            // SAFETY: `uuid` is NUL-terminated and outlives the call; `dev` is a valid out pointer.
            let rc = unsafe { by_uuid(uuid.as_ptr(), &mut dev) };
            if rc != 0 {
                return Err(fail("nvmlDeviceGetHandleByUUID", rc));
            }
            // Soft 0: no reservation, so nothing propagates to ancestor cgroups and leaks
            // when the container's cgroup is removed; the planner keeps the hard limits of a
            // device's shares within its memory, so hard limits alone partition it.
            let mut limits = SetMemoryLimitsV1 {
                name_space: ns.as_ptr(),
                soft_limit: 0,
                hard_limit: bytes,
            };
            // SAFETY: `dev` came from NVML; `limits` matches nvmlSetMemoryLimits_v1_t and its
            // string outlives the call.
            let rc = unsafe { set_limits(dev, &mut limits) };
            if rc != 0 {
                return Err(fail("nvmlDeviceSetMemoryLimits_v1", rc));
            }
            Ok(())
        })();
        // SAFETY: balanced with the successful nvmlInit_v2 above.
        let rc = unsafe { shutdown() };
        if rc != 0 {
            tracing::warn!(code = rc, "nvmlShutdown failed");
        }
        result
    }
}

fn fail_arg(device: &str, e: std::ffi::NulError) -> LimitError {
    LimitError::Nvml {
        call: "argument",
        device: device.to_string(),
        code: 2,
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_a_load_error() {
        let mut l = NvmlLimiter::new(Some(PathBuf::from("/nonexistent/libnvidia-ml.so.1")));
        let err = l
            .set_hard_limit("GPU-1", Path::new("/sys/fs/cgroup/x"), 1)
            .unwrap_err();
        assert!(matches!(err, LimitError::Load { .. }), "{err}");
    }
}
