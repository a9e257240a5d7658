//! `fake-nvidia-smi`: an `nvidia-smi` stand-in for CI, installed as `usr/bin/nvidia-smi` in the
//! fake driver root (`hack/fake-driver-root.sh`) that gpu-slicer's CDI spec mounts into
//! containers.
//!
//! It opens `libnvidia-ml.so.1` and `libcuda.so.1` **by soname** through the dynamic loader
//! (`dlopen`, no path), so it only works when the container's `.so.1` symlinks and ld cache
//! are right, and prints what the driver's own view holds:
//!
//! ```text
//! GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-…)
//!   MIG 1g.10gb Device 0: (UUID: MIG-…)
//! NVML GPU-…: total 85899345920 free 85899345920
//! NVML: libnvidia-ml.so.1 => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1, driver 570.124.06
//! CUDA: libcuda.so.1 => /usr/lib/x86_64-linux-gnu/libcuda.so.1, version 12080
//! CUDA devices: 1
//! CUDA 0: NVIDIA A100-SXM4-80GB MIG 1g.10gb (UUID: MIG-…) free 10737418240 total 10737418240
//! ```
//!
//! `-L` prints only the `GPU`/`MIG` lines (as `nvidia-smi -L`). `topo -m` prints the GPU×GPU
//! matrix of the node file's `topology` section (`FAKE_NVML_NODE`, cut to the GPUs whose
//! device nodes exist under `FAKE_GPU_DEV_ROOT`, as the fake NVML serves them) in
//! `nvidia-smi topo -m`'s layout: tab-separated `GPU<i>` columns, `NUMA Affinity`, the legend
//! (NIC columns and CPU affinity are left out). Exit codes: 0 success, 2 bad
//! arguments, 9 NVML failed (as `nvidia-smi` when it cannot reach the driver), 12 a library
//! cannot be loaded, 13 a CUDA call failed. The CUDA UUID is printed with the prefix of the
//! NVML device whose bytes it equals (`CUDA-` when it matches none).
//!
//! Hand-written loader calls rather than `nvml-wrapper`: the point is to exercise the soname
//! lookup with as little between the loader and the fakes as possible.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::process::ExitCode;

use libloading::{Library, Symbol};

type NvmlDevice = *mut c_void;

/// A failure with the exit code it maps to.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

fn fail(code: u8, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
    }
}

/// Where the loader found the library that defines `sym` (`dladdr`).
fn loaded_from(sym: *const c_void) -> String {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `dladdr` only reads `sym` as an address and fills `info`.
    let ok = unsafe { libc::dladdr(sym, info.as_mut_ptr()) };
    if ok == 0 {
        return "?".into();
    }
    // SAFETY: dladdr returned non-zero, so `info` is filled in.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return "?".into();
    }
    // SAFETY: `dli_fname` is a NUL-terminated string owned by the loader.
    unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned()
}

fn open(soname: &str) -> Result<Library, Failure> {
    // SAFETY: loading a driver library runs its initialisers; the fakes have none that
    // matter, and the real ones are what nvidia-smi loads too.
    unsafe { Library::new(soname) }.map_err(|e| fail(12, format!("cannot load {soname}: {e}")))
}

/// Look up `name` in `lib` as a function of type `T`.
fn sym<'l, T>(lib: &'l Library, soname: &str, name: &str) -> Result<Symbol<'l, T>, Failure> {
    // SAFETY: every `T` used below is the symbol's C signature from nvml.h / cuda.h.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map_err(|e| fail(12, format!("{soname} lacks {name}: {e}")))
}

fn buf_string(buf: &[c_char]) -> String {
    // SAFETY: the buffers below are zeroed and the libraries NUL-terminate within them.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

struct Nvml<'l> {
    lib: &'l Library,
}

const NVML: &str = "libnvidia-ml.so.1";
const CUDA: &str = "libcuda.so.1";

impl Nvml<'_> {
    fn check(&self, call: &str, ret: c_uint) -> Result<(), Failure> {
        if ret == 0 {
            return Ok(());
        }
        let text =
            sym::<unsafe extern "C" fn(c_uint) -> *const c_char>(self.lib, NVML, "nvmlErrorString")
                .ok()
                .map(|f| {
                    // SAFETY: nvmlErrorString returns a static NUL-terminated string.
                    unsafe { CStr::from_ptr(f(ret)) }
                        .to_string_lossy()
                        .into_owned()
                })
                .unwrap_or_default();
        Err(fail(9, format!("{call} failed: {text} (code {ret})")))
    }

    fn string(&self, name: &str, dev: NvmlDevice) -> Result<String, Failure> {
        let f = sym::<unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> c_uint>(
            self.lib, NVML, name,
        )?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: buffer of the given length (nvml.h).
        self.check(name, unsafe {
            f(dev, buf.as_mut_ptr(), buf.len() as c_uint)
        })?;
        Ok(buf_string(&buf))
    }
}

/// List the GPUs and MIG devices into `out` (the `-L` lines) and each GPU's memory into
/// `memory`; returns every UUID listed.
fn nvml_list(
    lib: &Library,
    out: &mut Vec<String>,
    memory: &mut Vec<String>,
) -> Result<Vec<String>, Failure> {
    let n = Nvml { lib };
    let init = sym::<unsafe extern "C" fn() -> c_uint>(lib, NVML, "nvmlInit_v2")?;
    // SAFETY: no arguments.
    n.check("nvmlInit_v2", unsafe { init() })?;
    let count_f =
        sym::<unsafe extern "C" fn(*mut c_uint) -> c_uint>(lib, NVML, "nvmlDeviceGetCount_v2")?;
    let by_index = sym::<unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> c_uint>(
        lib,
        NVML,
        "nvmlDeviceGetHandleByIndex_v2",
    )?;
    let mig_mode = sym::<unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut c_uint) -> c_uint>(
        lib,
        NVML,
        "nvmlDeviceGetMigMode",
    )?;
    let max_mig = sym::<unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> c_uint>(
        lib,
        NVML,
        "nvmlDeviceGetMaxMigDeviceCount",
    )?;
    let mig_by_index = sym::<unsafe extern "C" fn(NvmlDevice, c_uint, *mut NvmlDevice) -> c_uint>(
        lib,
        NVML,
        "nvmlDeviceGetMigDeviceHandleByIndex",
    )?;
    let mem_info = sym::<unsafe extern "C" fn(NvmlDevice, *mut [u64; 3]) -> c_uint>(
        lib,
        NVML,
        "nvmlDeviceGetMemoryInfo",
    )?;
    let mut count = 0;
    // SAFETY: out-pointer.
    n.check("nvmlDeviceGetCount_v2", unsafe { count_f(&mut count) })?;
    let mut uuids = Vec::new();
    for i in 0..count {
        let mut dev = std::ptr::null_mut();
        // SAFETY: out-pointer.
        n.check("nvmlDeviceGetHandleByIndex_v2", unsafe {
            by_index(i, &mut dev)
        })?;
        let (name, uuid) = (
            n.string("nvmlDeviceGetName", dev)?,
            n.string("nvmlDeviceGetUUID", dev)?,
        );
        out.push(format!("GPU {i}: {name} (UUID: {uuid})"));
        let mut mem = [0u64; 3];
        // SAFETY: nvmlMemory_t is three unsigned long longs (total, free, used).
        n.check("nvmlDeviceGetMemoryInfo", unsafe {
            mem_info(dev, &mut mem)
        })?;
        memory.push(format!("NVML {uuid}: total {} free {}", mem[0], mem[1]));
        uuids.push(uuid);
        let (mut cur, mut pending) = (0, 0);
        // SAFETY: out-pointers. NOT_SUPPORTED (no MIG) leaves `cur` at 0.
        let _ = unsafe { mig_mode(dev, &mut cur, &mut pending) };
        if cur != 1 {
            continue;
        }
        let mut slots = 0;
        // SAFETY: out-pointer.
        n.check("nvmlDeviceGetMaxMigDeviceCount", unsafe {
            max_mig(dev, &mut slots)
        })?;
        let mut shown = 0;
        for s in 0..slots {
            let mut mig = std::ptr::null_mut();
            // SAFETY: out-pointer; an empty slot answers NOT_FOUND and is skipped.
            if unsafe { mig_by_index(dev, s, &mut mig) } != 0 {
                continue;
            }
            let mname = n.string("nvmlDeviceGetName", mig)?;
            let muuid = n.string("nvmlDeviceGetUUID", mig)?;
            let profile = mname
                .rsplit_once(" MIG ")
                .map_or(mname.as_str(), |(_, p)| p);
            out.push(format!("  MIG {profile} Device {shown}: (UUID: {muuid})"));
            uuids.push(muuid);
            shown += 1;
        }
    }
    Ok(uuids)
}

fn cuda_check(call: &str, ret: c_uint) -> Result<(), Failure> {
    if ret == 0 {
        Ok(())
    } else {
        Err(fail(13, format!("{call} failed: CUresult {ret}")))
    }
}

fn hex_uuid(bytes: &[u8; 16]) -> String {
    let h: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn cuda_report(lib: &Library, nvml_uuids: &[String], out: &mut Vec<String>) -> Result<(), Failure> {
    let init = sym::<unsafe extern "C" fn(c_uint) -> c_uint>(lib, CUDA, "cuInit")?;
    let version =
        sym::<unsafe extern "C" fn(*mut c_int) -> c_uint>(lib, CUDA, "cuDriverGetVersion")?;
    let count_f = sym::<unsafe extern "C" fn(*mut c_int) -> c_uint>(lib, CUDA, "cuDeviceGetCount")?;
    let get = sym::<unsafe extern "C" fn(*mut c_int, c_int) -> c_uint>(lib, CUDA, "cuDeviceGet")?;
    let name_f = sym::<unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_uint>(
        lib,
        CUDA,
        "cuDeviceGetName",
    )?;
    let uuid_f = sym::<unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_uint>(
        lib,
        CUDA,
        "cuDeviceGetUuid_v2",
    )?;
    let total_f =
        sym::<unsafe extern "C" fn(*mut usize, c_int) -> c_uint>(lib, CUDA, "cuDeviceTotalMem_v2")?;
    let ctx_create = sym::<unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> c_uint>(
        lib,
        CUDA,
        "cuCtxCreate_v2",
    )?;
    let ctx_destroy =
        sym::<unsafe extern "C" fn(*mut c_void) -> c_uint>(lib, CUDA, "cuCtxDestroy_v2")?;
    let mem_info = sym::<unsafe extern "C" fn(*mut usize, *mut usize) -> c_uint>(
        lib,
        CUDA,
        "cuMemGetInfo_v2",
    )?;

    let mut v = 0;
    // SAFETY: out-pointer (cuda.h).
    cuda_check("cuDriverGetVersion", unsafe { version(&mut v) })?;
    out.push(format!(
        "CUDA: {CUDA} => {}, version {v}",
        loaded_from(*init as *const c_void)
    ));
    // SAFETY: flags must be 0.
    cuda_check("cuInit", unsafe { init(0) })?;
    let mut count = 0;
    // SAFETY: out-pointer.
    cuda_check("cuDeviceGetCount", unsafe { count_f(&mut count) })?;
    out.push(format!("CUDA devices: {count}"));
    for i in 0..count {
        let mut dev = 0;
        // SAFETY: out-pointer.
        cuda_check("cuDeviceGet", unsafe { get(&mut dev, i) })?;
        let mut name = [0 as c_char; 256];
        // SAFETY: buffer of the given length.
        cuda_check("cuDeviceGetName", unsafe {
            name_f(name.as_mut_ptr(), name.len() as c_int, dev)
        })?;
        let mut uuid = [0u8; 16];
        // SAFETY: CUuuid is 16 bytes.
        cuda_check("cuDeviceGetUuid_v2", unsafe { uuid_f(&mut uuid, dev) })?;
        let mut total_dev = 0;
        // SAFETY: out-pointer.
        cuda_check("cuDeviceTotalMem_v2", unsafe {
            total_f(&mut total_dev, dev)
        })?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: out-pointer.
        cuda_check("cuCtxCreate_v2", unsafe { ctx_create(&mut ctx, 0, dev) })?;
        let (mut free, mut total) = (0, 0);
        // SAFETY: out-pointers; a context is current.
        cuda_check("cuMemGetInfo_v2", unsafe {
            mem_info(&mut free, &mut total)
        })?;
        // SAFETY: the context created above.
        cuda_check("cuCtxDestroy_v2", unsafe { ctx_destroy(ctx) })?;
        if total != total_dev {
            return Err(fail(
                13,
                format!("CUDA {i}: cuMemGetInfo total {total} != cuDeviceTotalMem {total_dev}"),
            ));
        }
        let hex = hex_uuid(&uuid);
        let shown = nvml_uuids
            .iter()
            .find(|u| {
                u.split_once('-')
                    .is_some_and(|(_, rest)| rest.eq_ignore_ascii_case(&hex))
            })
            .cloned()
            .unwrap_or_else(|| format!("CUDA-{hex}"));
        out.push(format!(
            "CUDA {i}: {} (UUID: {shown}) free {free} total {total}",
            buf_string(&name)
        ));
    }
    Ok(())
}

fn run(list_only: bool) -> Result<(), Failure> {
    let nvml = open(NVML)?;
    let (mut lines, mut memory) = (Vec::new(), Vec::new());
    let result = nvml_list(&nvml, &mut lines, &mut memory);
    for l in &lines {
        println!("{l}");
    }
    let uuids = result?;
    if list_only {
        return Ok(());
    }
    for l in &memory {
        println!("{l}");
    }
    let drv = Nvml { lib: &nvml }.string_sys()?;
    let init = sym::<unsafe extern "C" fn() -> c_uint>(&nvml, NVML, "nvmlInit_v2")?;
    println!(
        "NVML: {NVML} => {}, driver {drv}",
        loaded_from(*init as *const c_void)
    );
    let cuda = open(CUDA)?;
    let mut lines = Vec::new();
    let result = cuda_report(&cuda, &uuids, &mut lines);
    for l in &lines {
        println!("{l}");
    }
    result
}

impl Nvml<'_> {
    fn string_sys(&self) -> Result<String, Failure> {
        let f = sym::<unsafe extern "C" fn(*mut c_char, c_uint) -> c_uint>(
            self.lib,
            NVML,
            "nvmlSystemGetDriverVersion",
        )?;
        let mut buf = [0 as c_char; 80];
        // SAFETY: buffer of the given length.
        self.check("nvmlSystemGetDriverVersion", unsafe {
            f(buf.as_mut_ptr(), buf.len() as c_uint)
        })?;
        Ok(buf_string(&buf))
    }
}

/// `topo -m`: the node file's matrix.
fn topo() -> Result<(), Failure> {
    let node = fake_view::node_from_env().map_err(|e| fail(9, e.to_string()))?;
    let Some(t) = &node.topology else {
        return Err(fail(
            9,
            "the node file has no `topology` section (topology not available)",
        ));
    };
    let cells: Vec<Vec<&str>> = t
        .matrix
        .iter()
        .map(|row| row.split_whitespace().collect())
        .collect();
    let rows: Vec<node_spec::TopoRow<'_>> = node
        .gpus
        .iter()
        .zip(&cells)
        .map(|(g, cells)| node_spec::TopoRow {
            index: g.index,
            cells,
            numa_node: g.numa_node,
        })
        .collect();
    print!("{}", node_spec::render_topo_matrix(&rows));
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [] => run(false),
        [a] if a == "-L" || a == "--list-gpus" => run(true),
        [a, b] if a == "topo" && b == "-m" => topo(),
        _ => {
            eprintln!("usage: nvidia-smi [-L | topo -m]   (gpu-slicer's fake nvidia-smi)");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("nvidia-smi: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
