//! A fake `libnvidia-ml.so` for CI: unmodified `nvml-wrapper` 0.13 loads it and sees the
//! node described by a `node-spec` file, so the agent's real NVML code path runs without a GPU.
//!
//! Who talks to it: `gpu-slicer`'s NVML backend (`src/inventory/nvml.rs`) and NVML event
//! watcher (`src/health/nvml_events.rs`) through `dlopen`, in-process tests through the control
//! symbols, and end-to-end tests through environment variables and the event file.
//!
//! # Configuration
//!
//! * `FAKE_NVML_NODE`: path of a node file (YAML or JSON, the `node-spec` format). Read when the
//!   init count goes from 0 to 1, unless a control symbol set a node first.
//! * `fakeNvmlSetNodeJson(const char *text) -> int`: parse `text` (YAML or JSON node file) and
//!   use it from now on, also while initialised. `NULL` forgets it (back to the env var).
//!   Returns 0 on success, 1 on a parse error (printed to stderr), 999 on a panic.
//! * No node at all: `nvmlInit_v2` returns `DRIVER_NOT_LOADED` (9), as on a host without the
//!   driver.
//! * `FAKE_GPU_DEV_ROOT`: when set (`/` inside a container), only the GPUs and MIG devices whose
//!   device nodes exist under it are served, renumbered from 0; no `dev/nvidiactl` gives
//!   `DRIVER_NOT_LOADED`. The rules live in `crates/fake-view`, shared with the fake
//!   `libcuda.so`, so NVML and CUDA see the same devices.
//!
//! # Behaviour
//!
//! * Handles are tagged integers, never dereferenced: GPU at position `i` (node GPUs sorted by
//!   index) is `(i + 1) << 8`, its MIG slot `j` is `((i + 1) << 8) | (j + 1)`, event set `n` is
//!   `0x10000 + (n << 4)`. Unknown handles give `INVALID_ARGUMENT`; calls before init give
//!   `UNINITIALIZED`.
//! * `GpuSpec.nvmlErrors` (symbol name → return code) answers that code for that symbol on the
//!   GPU's handle and on all its MIG handles.
//! * Deliberately strict (unverified against a driver): minor number, PCI info, NUMA node,
//!   MIG mode, supported events and event registration return `NOT_SUPPORTED` on MIG handles;
//!   attributes and GI/CI ids return `NOT_SUPPORTED` on GPU handles.
//! * MIG device attributes encode `+me` profiles (and the full-GPU profile) with one shared OFA
//!   engine and one JPEG engine; other profiles have none. The backend derives `+me` from that.
//!
//! # Events
//!
//! Sources, all one `EventSpec` per event (`{"gpu":0,"kind":"xid","xid":79,"afterMs":50}`,
//! `gpu` is the NVML index):
//! * the node file's `events`: each fires once per event set, `afterMs` after the set
//!   registered that GPU;
//! * the file named by `FAKE_NVML_EVENT_FILE`, one JSON event per line, read and **removed** on
//!   every poll of a wait (writers should write a temp file and rename it);
//! * `fakeNvmlInjectEvent(const char *json) -> int` (one event).
//!
//! `FAKE_NVML_WAIT_LOG=<file>`: each wait that hands out an event appends the wall-clock time
//! it returns (µs since the Unix epoch, one line), for benchmarks of the consumer's own path.
//!
//! An event reaches every event set that registered its GPU for its type (XID 0x8,
//! double-bit ECC 0x2, single-bit ECC 0x1). GI/CI ids are `0xFFFFFFFF` when not given.
//!
//! GPU loss: a `gpuLost` event marks the GPU lost. Each set that registered it returns
//! `GPU_IS_LOST` (15) from one wait, and every call on the GPU's handles (and lookups by index
//! or UUID) returns 15 while the mark persists. The injection-only line
//! `{"gpu":N,"kind":"recover"}` clears the mark.
//!
//! `nvmlEventSetWait_v2` blocks on the caller's thread until an event is queued for the set
//! (it wakes at once, as the kernel's signal wakes a real wait: [`wake`]), an event of the node
//! file falls due, or the timeout passes (`TIMEOUT`, 10). The library starts no threads: its
//! consumer `dlclose`s it.
//!
//! # Memory limits (cgroup partitions)
//!
//! `nvmlDeviceSetMemoryLimits_v1` / `nvmlDeviceGetMemoryLimits_v1` use the nvml.h 13.x structs
//! `{const char *nameSpace; unsigned long long softLimit, hardLimit}` (+ `currentUsed` for the
//! getter; no version field). GPU handles only (`NOT_SUPPORTED` on MIG handles). Limits are kept
//! per GPU UUID and cgroup path, in the JSON file named by `FAKE_NVML_LIMITS_FILE` when set
//! (`{"GPU-…": {"/sys/fs/cgroup/…": {"softLimit": n, "hardLimit": n}}}`, rewritten through a
//! temp file and a rename, so another process can check them), else in memory. The getter
//! answers `NOT_FOUND` for a path without limits. `FAKE_NVML_LIMITS_UNSUPPORTED=1` makes both
//! return `NOT_SUPPORTED`. A process whose own cgroup (`/proc/self/cgroup`) has a limit on a GPU
//! sees that limit as the GPU's total in `nvmlDeviceGetMemoryInfo(_v2)`, as under the real
//! driver's memory partitioning (store and matching: `crates/fake-view`).
//!
//! # Usage
//!
//! Utilisation, used memory and compute processes come from the node file's `usage` section
//! (see [`usage`]).
//!
//! # Topology
//!
//! Common PCIe ancestor and NVLink links (state, remote PCI info, remote device type) from the
//! node file's `topology` section, with an optional per-call delay and a call counter: see
//! [`topology`].
//!
//! # MIG instances
//!
//! GPU and compute instance create/list/destroy with the products' placement tables, the
//! shared `FAKE_NVML_STATE` file and `fakeNvmlSetMigStateJson`: see [`mig`].
//!
//! Every export is `extern "C"`, catches panics (→ `UNKNOWN`, 999) and follows the pointer
//! contract of `nvml.h`; the `# Safety` of each export is that contract.
#![allow(clippy::missing_safety_doc)]

pub mod topology;
pub mod usage;
mod wake;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};
use std::mem::{offset_of, size_of};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fake_view::{LimitStore, Limits};

pub mod mig;
use node_spec::{EventKind, EventLine, EventSpec, GpuSpec, MigDeviceSpec, NodeSpec};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlDeviceAttributes_t, nvmlEventData_t, nvmlEventSet_t, nvmlMemory_t,
    nvmlMemory_v2_t, nvmlPciInfo_t, nvmlReturn_t,
};

/// NVML return codes used here (values from `nvml_wrapper_sys::bindings`).
mod code {
    use nvml_wrapper_sys::bindings as b;
    pub(crate) const SUCCESS: u32 = b::nvmlReturn_enum_NVML_SUCCESS;
    pub(crate) const UNINITIALIZED: u32 = b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
    pub(crate) const INVALID_ARGUMENT: u32 = b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    pub(crate) const NOT_SUPPORTED: u32 = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    pub(crate) const NOT_FOUND: u32 = b::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
    pub(crate) const INSUFFICIENT_SIZE: u32 = b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
    pub(crate) const DRIVER_NOT_LOADED: u32 = b::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
    pub(crate) const TIMEOUT: u32 = b::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
    pub(crate) const GPU_IS_LOST: u32 = b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
    pub(crate) const ARGUMENT_VERSION_MISMATCH: u32 =
        b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    pub(crate) const UNKNOWN: u32 = b::nvmlReturn_enum_NVML_ERROR_UNKNOWN;
}

// The layouts nvml-wrapper and the header agree on (nvml.md §3); a bindings change that moved
// them would silently corrupt the consumer's memory.
const _: () = assert!(size_of::<nvmlPciInfo_t>() == 68);
const _: () = assert!(offset_of!(nvmlPciInfo_t, busId) == 36);
const _: () = assert!(size_of::<nvmlMemory_v2_t>() == 40);
const _: () = assert!(offset_of!(nvmlMemory_v2_t, total) == 8);
const _: () = assert!(size_of::<nvmlMemory_t>() == 24);
const _: () = assert!(size_of::<nvmlEventData_t>() == 32);
const _: () = assert!(offset_of!(nvmlEventData_t, gpuInstanceId) == 24);
const _: () = assert!(size_of::<nvmlDeviceAttributes_t>() == 40);
const _: () = assert!(offset_of!(nvmlDeviceAttributes_t, memorySizeMB) == 32);

/// `NVML_STRUCT_VERSION(Memory, 2)`: size | (2 << 24).
const MEMORY_V2_VERSION: u32 = (size_of::<nvmlMemory_v2_t>() as u32) | (2 << 24);
/// Event type bits (`nvmlEventType*`).
const EV_SINGLE_BIT: u64 = nvml_wrapper_sys::bindings::nvmlEventTypeSingleBitEccError as u64;
const EV_DOUBLE_BIT: u64 = nvml_wrapper_sys::bindings::nvmlEventTypeDoubleBitEccError as u64;
const EV_XID: u64 = nvml_wrapper_sys::bindings::nvmlEventTypeXidCriticalError as u64;
const SUPPORTED_EVENTS: u64 = EV_SINGLE_BIT | EV_DOUBLE_BIT | EV_XID;
/// GI/CI id meaning "no instance" in `nvmlEventData_t`.
const NO_INSTANCE: u32 = 0xFFFF_FFFF;
/// Poll step of `nvmlEventSetWait_v2`.
/// How often a wait looks at an event file whose folder cannot be watched.
const WAIT_STEP: Duration = Duration::from_millis(5);
const SET_BASE: usize = 0x10000;

type Ret = Result<(), nvmlReturn_t>;

/// A decoded device handle: GPU position, and MIG slot for MIG handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dev {
    Gpu(usize),
    Mig(usize, u32),
}

impl Dev {
    fn gpu(self) -> usize {
        match self {
            Dev::Gpu(g) | Dev::Mig(g, _) => g,
        }
    }

    fn handle(self) -> nvmlDevice_t {
        let raw = match self {
            Dev::Gpu(g) => (g + 1) << 8,
            Dev::Mig(g, s) => ((g + 1) << 8) | (s as usize + 1),
        };
        raw as nvmlDevice_t
    }

    fn decode(h: nvmlDevice_t) -> Option<Dev> {
        let raw = h as usize;
        let gpu = (raw >> 8).checked_sub(1)?;
        if raw >> 16 != 0 {
            return None;
        }
        match raw & 0xff {
            0 => Some(Dev::Gpu(gpu)),
            s => Some(Dev::Mig(gpu, s as u32 - 1)),
        }
    }
}

fn set_handle(id: usize) -> nvmlEventSet_t {
    (SET_BASE + (id << 4)) as nvmlEventSet_t
}

fn set_id(h: nvmlEventSet_t) -> Option<usize> {
    let raw = (h as usize).checked_sub(SET_BASE)?;
    (raw & 0xf == 0).then_some(raw >> 4)
}

/// What a wait will hand out next.
#[derive(Debug, Clone, Copy)]
enum Pending {
    Event {
        dev: Dev,
        ty: u64,
        data: u64,
        gi: u32,
        ci: u32,
    },
    Lost,
}

#[derive(Debug, Default)]
struct EventSet {
    /// GPU position → (mask, registration time).
    regs: BTreeMap<usize, (u64, Instant)>,
    /// Indices of node-file events already delivered to this set.
    fired: BTreeSet<usize>,
    pending: VecDeque<Pending>,
    /// Wakes this set's wait when an event is queued or the event file is written; `None`
    /// when no eventfd could be made (the wait then sleeps in [`WAIT_STEP`]s).
    waker: Option<std::sync::Arc<wake::Waker>>,
}

#[derive(Debug)]
struct State {
    /// Node set through `fakeNvmlSetNodeJson`; wins over `FAKE_NVML_NODE`.
    control_node: Option<NodeSpec>,
    /// Node in use while initialised.
    node: Option<NodeSpec>,
    init_count: u32,
    /// GPU positions marked lost.
    lost: BTreeSet<usize>,
    sets: BTreeMap<usize, EventSet>,
    next_set: usize,
    /// Memory limits when `FAKE_NVML_LIMITS_FILE` is unset.
    limits: LimitStore,
    /// GPU and compute instances changed since load (`mig`).
    mig: mig::Mig,
}

static STATE: Mutex<State> = Mutex::new(State {
    control_node: None,
    node: None,
    init_count: 0,
    lost: BTreeSet::new(),
    sets: BTreeMap::new(),
    next_set: 0,
    limits: BTreeMap::new(),
    mig: mig::Mig::new(),
});

fn state() -> MutexGuard<'static, State> {
    // A panic caught at an entry point may have poisoned the lock; the state stays usable.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run an entry point: map `Err` to its code and a panic to `UNKNOWN`.
fn entry(f: impl FnOnce() -> Ret) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => code::SUCCESS,
        Ok(Err(c)) => c,
        Err(_) => code::UNKNOWN,
    }
}

/// Write `v` through an out-pointer from the caller.
///
/// # Safety
/// `p` must be null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> Ret {
    if p.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    // SAFETY: non-null and valid for writes per this function's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Copy `s` NUL-terminated into the caller's buffer of `len` bytes.
///
/// # Safety
/// `buf` must be null or valid for `len` bytes of writes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Ret {
    if buf.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return Err(code::INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds `len` bytes (contract) and we write `bytes.len() + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Read a C string argument.
///
/// # Safety
/// `p` must be null or a valid NUL-terminated string.
unsafe fn get_str<'a>(p: *const c_char) -> Result<&'a str, nvmlReturn_t> {
    if p.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated per contract.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|_| code::INVALID_ARGUMENT)
}

impl State {
    fn node(&self) -> Result<&NodeSpec, nvmlReturn_t> {
        if self.init_count == 0 {
            return Err(code::UNINITIALIZED);
        }
        self.node.as_ref().ok_or(code::UNINITIALIZED)
    }

    /// Resolve a handle and apply the per-GPU error map and the lost mark for `sym`.
    fn dev(&self, h: nvmlDevice_t, sym: &str) -> Result<(Dev, &GpuSpec), nvmlReturn_t> {
        let node = self.node()?;
        let dev = Dev::decode(h).ok_or(code::INVALID_ARGUMENT)?;
        let gpu = node.gpus.get(dev.gpu()).ok_or(code::INVALID_ARGUMENT)?;
        if let Dev::Mig(_, slot) = dev
            && mig_at(gpu, slot).is_none()
        {
            return Err(code::INVALID_ARGUMENT);
        }
        self.check(dev.gpu(), gpu, sym)?;
        Ok((dev, gpu))
    }

    fn check(&self, pos: usize, gpu: &GpuSpec, sym: &str) -> Ret {
        if self.lost.contains(&pos) {
            return Err(code::GPU_IS_LOST);
        }
        match gpu.nvml_errors.get(sym) {
            Some(&c) if c != 0 => Err(c),
            _ => Ok(()),
        }
    }

    /// Route one event to every set (or only set `only`) that registered its GPU.
    fn deliver(&mut self, ev: &EventSpec, only: Option<usize>) {
        let Some(node) = &self.node else { return };
        let Some(pos) = node.gpus.iter().position(|g| g.index == ev.gpu) else {
            return;
        };
        let pending = match ev.kind {
            EventKind::GpuLost => {
                self.lost.insert(pos);
                Pending::Lost
            }
            kind => Pending::Event {
                dev: Dev::Gpu(pos),
                ty: match kind {
                    EventKind::SingleBitEcc => EV_SINGLE_BIT,
                    EventKind::DoubleBitEcc => EV_DOUBLE_BIT,
                    _ => EV_XID,
                },
                data: if kind == EventKind::Xid {
                    ev.xid.unwrap_or(999)
                } else {
                    0
                },
                gi: ev.gpu_instance_id.unwrap_or(NO_INSTANCE),
                ci: ev.compute_instance_id.unwrap_or(NO_INSTANCE),
            },
        };
        for (id, set) in &mut self.sets {
            if only.is_some_and(|o| o != *id) {
                continue;
            }
            let Some((mask, _)) = set.regs.get(&pos) else {
                continue;
            };
            let wanted = match pending {
                Pending::Lost => true,
                Pending::Event { ty, .. } => mask & ty != 0,
            };
            if wanted {
                set.pending.push_back(pending);
                if let Some(w) = &set.waker {
                    w.wake();
                }
            }
        }
    }

    /// Apply one injected line: an `EventSpec`, or `{"gpu":N,"kind":"recover"}`.
    fn inject(&mut self, line: &str) -> Result<(), String> {
        match EventLine::parse(line)? {
            EventLine::Recover(gpu) => {
                if let Some(node) = &self.node
                    && let Some(pos) = node.gpus.iter().position(|g| g.index == gpu)
                {
                    self.lost.remove(&pos);
                }
            }
            EventLine::Event(ev) => self.deliver(&ev, None),
        }
        Ok(())
    }

    /// When the next node-file event for set `id` falls due (none: never).
    fn next_due(&self, id: usize) -> Option<Instant> {
        let node = self.node.as_ref()?;
        let set = self.sets.get(&id)?;
        node.events
            .iter()
            .enumerate()
            .filter(|(i, _)| !set.fired.contains(i))
            .filter_map(|(_, ev)| {
                let pos = node.gpus.iter().position(|g| g.index == ev.gpu)?;
                let (_, at) = set.regs.get(&pos)?;
                Some(*at + Duration::from_millis(ev.after_ms))
            })
            .min()
    }

    /// Move due node-file events and event-file lines into the sets' queues.
    fn poll(&mut self) {
        let now = Instant::now();
        let scheduled: Vec<(usize, EventSpec)> = self
            .node
            .as_ref()
            .map(|n| n.events.iter().cloned().enumerate().collect())
            .unwrap_or_default();
        let gpus: Vec<u32> = self
            .node
            .as_ref()
            .map(|n| n.gpus.iter().map(|g| g.index).collect())
            .unwrap_or_default();
        let mut due = Vec::new();
        for (set_id, set) in &mut self.sets {
            for (i, ev) in &scheduled {
                let Some(pos) = gpus.iter().position(|&g| g == ev.gpu) else {
                    continue;
                };
                let Some((_, at)) = set.regs.get(&pos) else {
                    continue;
                };
                if !set.fired.contains(i) && now >= *at + Duration::from_millis(ev.after_ms) {
                    set.fired.insert(*i);
                    due.push((*set_id, ev.clone()));
                }
            }
        }
        for (set_id, ev) in due {
            // A scheduled event belongs to the set whose registration timed it.
            self.deliver(&ev, Some(set_id));
        }
        if let Some(path) = std::env::var_os("FAKE_NVML_EVENT_FILE").map(PathBuf::from)
            && let Ok(text) = std::fs::read_to_string(&path)
        {
            let _ = std::fs::remove_file(&path);
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                if let Err(e) = self.inject(line) {
                    eprintln!("fake-nvml: ignoring event line {line:?}: {e}");
                }
            }
        }
    }
}

fn mig_at(gpu: &GpuSpec, slot: u32) -> Option<&MigDeviceSpec> {
    if !gpu.mig_enabled() {
        return None;
    }
    gpu.mig_devices()
        .into_iter()
        .find(|(s, _)| *s == slot)
        .map(|(_, d)| d)
}

fn mig_of(gpu: &GpuSpec, dev: Dev) -> Option<&MigDeviceSpec> {
    match dev {
        Dev::Gpu(_) => None,
        Dev::Mig(_, s) => mig_at(gpu, s),
    }
}

/// `00000000:07:00.0`, the form NVML reports (8-digit domain, upper case).
fn nvml_bus_id(gpu: &GpuSpec) -> String {
    format!("0000{}", gpu.bus_id()).to_ascii_uppercase()
}

/// The node as configured (control symbol or `FAKE_NVML_NODE`), before the MIG state and the
/// device view are applied.
fn raw_node(st: &State) -> Result<NodeSpec, nvmlReturn_t> {
    let node = match &st.control_node {
        Some(n) => Ok(n.clone()),
        None => match std::env::var_os(fake_view::NODE_ENV) {
            None => {
                eprintln!(
                    "fake-nvml: no node description (set FAKE_NVML_NODE or call fakeNvmlSetNodeJson)"
                );
                return Err(code::DRIVER_NOT_LOADED);
            }
            Some(path) => NodeSpec::load(std::path::Path::new(&path)),
        },
    };
    node.map_err(|e| {
        eprintln!("fake-nvml: {e}");
        code::DRIVER_NOT_LOADED
    })
}

/// The node this process sees: the configured node, its GPUs' instances as the MIG state
/// says (`mig`), cut down by `FAKE_GPU_DEV_ROOT`.
fn load_node(st: &State) -> Result<NodeSpec, nvmlReturn_t> {
    let mut node = raw_node(st)?;
    mig::overlay(&mut node, &st.mig.file);
    fake_view::view_from_env(node).map_err(|e| {
        eprintln!("fake-nvml: {e}");
        code::DRIVER_NOT_LOADED
    })
}

fn init() -> Ret {
    let mut st = state();
    if st.init_count == 0 {
        if let Err(e) = mig::sync(&mut st.mig) {
            eprintln!("fake-nvml: {e}");
            return Err(code::DRIVER_NOT_LOADED);
        }
        let node = load_node(&st)?;
        st.node = Some(node);
        st.lost.clear();
    } else {
        // Another process may have repartitioned a GPU since (FAKE_NVML_STATE).
        mig::refresh(&mut st)?;
    }
    st.init_count += 1;
    Ok(())
}

// ---------------------------------------------------------------- control symbols

/// Use `text` (a node file, YAML or JSON) as the node; `NULL` forgets it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakeNvmlSetNodeJson(text: *const c_char) -> c_int {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut st = state();
        if text.is_null() {
            st.control_node = None;
            return 0;
        }
        // SAFETY: non-null, NUL-terminated per the control symbol's contract.
        let Ok(text) = (unsafe { get_str(text) }) else {
            return 1;
        };
        match NodeSpec::parse(text, "fakeNvmlSetNodeJson") {
            Ok(node) => {
                st.mig.reset();
                if st.init_count > 0 {
                    st.node = Some(node.clone());
                }
                st.control_node = Some(node);
                0
            }
            Err(e) => {
                eprintln!("fake-nvml: {e}");
                1
            }
        }
    }));
    r.unwrap_or(999)
}

/// Inject one event line (see the crate docs). Returns 0, 1 on a parse error, 2 when not
/// initialised.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakeNvmlInjectEvent(json: *const c_char) -> c_int {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: NUL-terminated per the control symbol's contract.
        let Ok(line) = (unsafe { get_str(json) }) else {
            return 1;
        };
        let mut st = state();
        if st.init_count == 0 {
            return 2;
        }
        match st.inject(line) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("fake-nvml: {e}");
                1
            }
        }
    }));
    r.unwrap_or(999)
}

// ---------------------------------------------------------------- init and system

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    entry(init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    entry(init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    entry(init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        if st.init_count == 0 {
            return Err(code::UNINITIALIZED);
        }
        st.init_count -= 1;
        if st.init_count == 0 {
            st.node = None;
            st.sets.clear();
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let v = st.node()?.driver_version.clone();
        // SAFETY: caller passes a buffer of `len` bytes (nvml.h).
        unsafe { put_str(buf, len, &v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let node = st.node()?;
        let v = format!(
            "{}.{}",
            node.cuda_driver_version / 1000,
            node.driver_version
        );
        // SAFETY: caller passes a buffer of `len` bytes (nvml.h).
        unsafe { put_str(buf, len, &v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let cuda = st.node()?.cuda_driver_version;
        // SAFETY: out-pointer per nvml.h.
        unsafe { put(v, cuda) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: same contract as the v2 symbol.
    unsafe { nvmlSystemGetCudaDriverVersion_v2(v) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let text: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        15 => c"GPU is lost",
        25 => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

// ---------------------------------------------------------------- device lookup

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let n = st.node()?.gpus.len() as c_uint;
        // SAFETY: out-pointer per nvml.h.
        unsafe { put(count, n) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: same contract as the v2 symbol.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let node = st.node()?;
        let pos = node
            .gpus
            .iter()
            .position(|g| g.index == index)
            .ok_or(code::INVALID_ARGUMENT)?;
        st.check(pos, &node.gpus[pos], "nvmlDeviceGetHandleByIndex_v2")?;
        // SAFETY: out-pointer per nvml.h.
        unsafe { put(out, Dev::Gpu(pos).handle()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: same contract as the v2 symbol.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, out) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(|| {
        // SAFETY: NUL-terminated string per nvml.h.
        let uuid = unsafe { get_str(uuid) }?;
        let st = state();
        let node = st.node()?;
        for (pos, gpu) in node.gpus.iter().enumerate() {
            let found = if gpu.uuid == uuid {
                Some(Dev::Gpu(pos))
            } else {
                gpu.mig_devices()
                    .into_iter()
                    .find(|(_, d)| d.uuid == uuid && gpu.mig_enabled())
                    .map(|(s, _)| Dev::Mig(pos, s))
            };
            if let Some(dev) = found {
                st.check(pos, gpu, "nvmlDeviceGetHandleByUUID")?;
                // SAFETY: out-pointer per nvml.h.
                return unsafe { put(out, dev.handle()) };
            }
        }
        Err(code::NOT_FOUND)
    })
}

// ---------------------------------------------------------------- device queries

/// Body shared by most device getters: resolve the handle, compute a value, write it.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn getter<T>(
    h: nvmlDevice_t,
    sym: &str,
    out: *mut T,
    f: impl FnOnce(Dev, &GpuSpec) -> Result<T, nvmlReturn_t>,
) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let (dev, gpu) = st.dev(h, sym)?;
        let v = f(dev, gpu)?;
        // SAFETY: forwarded contract.
        unsafe { put(out, v) }
    })
}

/// Like [`getter`] for string results.
///
/// # Safety
/// `buf` must be null or valid for `len` bytes of writes.
unsafe fn str_getter(
    h: nvmlDevice_t,
    sym: &str,
    buf: *mut c_char,
    len: c_uint,
    f: impl FnOnce(Dev, &GpuSpec) -> Result<String, nvmlReturn_t>,
) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let (dev, gpu) = st.dev(h, sym)?;
        let v = f(dev, gpu)?;
        // SAFETY: forwarded contract.
        unsafe { put_str(buf, len, &v) }
    })
}

fn gpu_only(dev: Dev) -> Ret {
    match dev {
        Dev::Gpu(_) => Ok(()),
        Dev::Mig(..) => Err(code::NOT_SUPPORTED),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    h: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    // SAFETY: buffer contract of nvml.h.
    unsafe {
        str_getter(h, "nvmlDeviceGetName", buf, len, |dev, gpu| {
            Ok(match mig_of(gpu, dev) {
                None => gpu.product.clone(),
                Some(m) => format!("{} MIG {}", gpu.product, m.profile),
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    h: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    // SAFETY: buffer contract of nvml.h.
    unsafe {
        str_getter(h, "nvmlDeviceGetUUID", buf, len, |dev, gpu| {
            Ok(mig_of(gpu, dev).map_or_else(|| gpu.uuid.clone(), |m| m.uuid.clone()))
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    h: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(h, "nvmlDeviceGetMinorNumber", out, |dev, gpu| {
            gpu_only(dev)?;
            Ok(gpu.minor())
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(h: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(h, "nvmlDeviceGetIndex", out, |dev, gpu| {
            Ok(match dev {
                Dev::Gpu(_) => gpu.index,
                Dev::Mig(_, slot) => slot,
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    h: nvmlDevice_t,
    out: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(h, "nvmlDeviceGetPciInfo_v3", out, |dev, gpu| {
            gpu_only(dev)?;
            Ok(pci_info(gpu))
        })
    }
}

fn pci_info(gpu: &GpuSpec) -> nvmlPciInfo_t {
    let long = nvml_bus_id(gpu);
    let short = gpu.bus_id().to_ascii_uppercase();
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: 0,
        bus: 0,
        device: 0,
        pciDeviceId: 0x20B5_10DE,
        pciSubSystemId: 0x1533_10DE,
        busId: [0; 32],
    };
    for (dst, src) in info.busId.iter_mut().zip(long.bytes()) {
        *dst = src as c_char;
    }
    for (dst, src) in info.busIdLegacy.iter_mut().zip(short.bytes().take(15)) {
        *dst = src as c_char;
    }
    // `dddd:bb:dd.f`, validated by node-spec.
    let b = gpu.bus_id();
    let hex = |r: std::ops::Range<usize>| {
        b.get(r)
            .and_then(|s| u32::from_str_radix(s, 16).ok())
            .unwrap_or(0)
    };
    info.domain = hex(0..4);
    info.bus = hex(5..7);
    info.device = hex(8..10);
    info
}

fn memory_mib(dev: Dev, gpu: &GpuSpec) -> u64 {
    match mig_of(gpu, dev) {
        None => gpu.memory_mib(),
        Some(m) => gpu.mig_memory_mib(m),
    }
}

/// Total memory of a device in bytes; a GPU's is capped at this process's cgroup limit on it
/// (memory partitioning), MIG devices are never partitioned.
fn total_bytes(st: &State, dev: Dev, gpu: &GpuSpec) -> u64 {
    let total = memory_mib(dev, gpu) << 20;
    match dev {
        Dev::Gpu(_) => fake_view::limited_total(&gpu.uuid, total, &st.limits),
        Dev::Mig(..) => total,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    h: nvmlDevice_t,
    out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    entry(|| {
        if out.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller presets `version` in its struct (nvml.h).
        let version = unsafe { (*out).version };
        if version != MEMORY_V2_VERSION {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        let st = state();
        let (dev, gpu) = st.dev(h, "nvmlDeviceGetMemoryInfo_v2")?;
        let total = total_bytes(&st, dev, gpu);
        let used = usage::used_bytes(&st, dev, gpu, total);
        let v = nvmlMemory_v2_t {
            version,
            total,
            reserved: 0,
            free: total - used,
            used,
        };
        // SAFETY: checked non-null above; valid per nvml.h.
        unsafe { put(out, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    h: nvmlDevice_t,
    out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let (dev, gpu) = st.dev(h, "nvmlDeviceGetMemoryInfo")?;
        let total = total_bytes(&st, dev, gpu);
        let used = usage::used_bytes(&st, dev, gpu, total);
        let v = nvmlMemory_t {
            total,
            free: total - used,
            used,
        };
        // SAFETY: out-pointer per nvml.h.
        unsafe { put(out, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    h: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let (_, gpu) = st.dev(h, "nvmlDeviceGetCudaComputeCapability")?;
        let (a, b) = gpu.compute_capability();
        if major.is_null() || minor.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: out-pointers per nvml.h, checked non-null.
        unsafe {
            put(major, a as c_int)?;
            put(minor, b as c_int)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    h: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let (dev, gpu) = st.dev(h, "nvmlDeviceGetMigMode")?;
        gpu_only(dev)?;
        if !gpu.mig_capable() {
            return Err(code::NOT_SUPPORTED);
        }
        if current.is_null() || pending.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: out-pointers per nvml.h, checked non-null.
        unsafe {
            put(current, c_uint::from(gpu.mig_enabled()))?;
            put(pending, c_uint::from(gpu.mig_pending()))
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    h: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(h, "nvmlDeviceGetMaxMigDeviceCount", out, |dev, gpu| {
            gpu_only(dev)?;
            let product = node_spec::lookup_product(&gpu.product).ok_or(code::NOT_SUPPORTED)?;
            Ok(if gpu.mig_enabled() {
                product.max_mig_devices
            } else {
                0
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    h: nvmlDevice_t,
    index: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(h, "nvmlDeviceGetMigDeviceHandleByIndex", out, |dev, gpu| {
            gpu_only(dev)?;
            let product = node_spec::lookup_product(&gpu.product).ok_or(code::NOT_SUPPORTED)?;
            if !gpu.mig_enabled() {
                return Err(code::NOT_SUPPORTED);
            }
            if index >= product.max_mig_devices {
                return Err(code::INVALID_ARGUMENT);
            }
            mig_at(gpu, index).ok_or(code::NOT_FOUND)?;
            Ok(Dev::Mig(dev.gpu(), index).handle())
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    h: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(h, "nvmlDeviceIsMigDeviceHandle", out, |dev, _| {
            Ok(c_uint::from(matches!(dev, Dev::Mig(..))))
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    h: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(h, "nvmlDeviceGetGpuInstanceId", out, |dev, gpu| {
            mig_of(gpu, dev)
                .map(|m| m.gpu_instance_id)
                .ok_or(code::NOT_SUPPORTED)
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    h: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(h, "nvmlDeviceGetComputeInstanceId", out, |dev, gpu| {
            mig_of(gpu, dev)
                .map(|m| m.compute_instance_id)
                .ok_or(code::NOT_SUPPORTED)
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    h: nvmlDevice_t,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(
            h,
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
            out,
            |dev, _| match dev {
                Dev::Mig(g, _) => Ok(Dev::Gpu(g).handle()),
                Dev::Gpu(_) => Err(code::NOT_SUPPORTED),
            },
        )
    }
}

/// Attributes of a MIG device. Engine counts are plausible, not measured; what the backend
/// relies on is `gpuInstanceSliceCount`, `memorySizeMB` and the OFA engine marking `+me`.
fn attributes(gpu: &GpuSpec, m: &MigDeviceSpec) -> nvmlDeviceAttributes_t {
    let product = node_spec::lookup_product(&gpu.product);
    let slices = product
        .and_then(|p| p.profile(&m.profile))
        .map_or(1, |i| i.compute_slices);
    let full = product.is_some_and(|p| p.compute_slices == slices);
    let media = full || m.profile.ends_with("+me");
    nvmlDeviceAttributes_t {
        multiprocessorCount: 14 * slices,
        sharedCopyEngineCount: slices,
        sharedDecoderCount: if media { slices.max(1) } else { slices / 2 },
        sharedEncoderCount: 0,
        sharedJpegCount: c_uint::from(media),
        sharedOfaCount: c_uint::from(media),
        gpuInstanceSliceCount: slices,
        computeInstanceSliceCount: slices,
        memorySizeMB: gpu.mig_memory_mib(m),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    h: nvmlDevice_t,
    out: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(h, "nvmlDeviceGetAttributes_v2", out, |dev, gpu| {
            mig_of(gpu, dev)
                .map(|m| attributes(gpu, m))
                .ok_or(code::NOT_SUPPORTED)
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    h: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(h, "nvmlDeviceGetNumaNodeId", out, |dev, gpu| {
            gpu_only(dev)?;
            gpu.numa_node
                .and_then(|n| c_uint::try_from(n).ok())
                .ok_or(code::NOT_SUPPORTED)
        })
    }
}

// ---------------------------------------------------------------- events

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(out: *mut nvmlEventSet_t) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        st.node()?;
        if out.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let id = st.next_set;
        st.next_set += 1;
        let file = std::env::var_os("FAKE_NVML_EVENT_FILE").map(PathBuf::from);
        let waker = wake::Waker::new(file.as_deref())
            .map_err(|e| eprintln!("fake-nvml: event waits poll every 5 ms (no eventfd: {e})"))
            .ok()
            .map(std::sync::Arc::new);
        st.sets.insert(
            id,
            EventSet {
                waker,
                ..EventSet::default()
            },
        );
        // SAFETY: checked non-null; out-pointer per nvml.h.
        unsafe { put(out, set_handle(id)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    h: nvmlDevice_t,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: out-pointer per nvml.h.
    unsafe {
        getter(h, "nvmlDeviceGetSupportedEventTypes", out, |dev, _| {
            gpu_only(dev)?;
            Ok(SUPPORTED_EVENTS)
        })
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    h: nvmlDevice_t,
    mask: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let (dev, _) = st.dev(h, "nvmlDeviceRegisterEvents")?;
        gpu_only(dev)?;
        if mask & !SUPPORTED_EVENTS != 0 {
            return Err(code::NOT_SUPPORTED);
        }
        let id = set_id(set).ok_or(code::INVALID_ARGUMENT)?;
        let set = st.sets.get_mut(&id).ok_or(code::INVALID_ARGUMENT)?;
        let entry = set.regs.entry(dev.gpu()).or_insert((0, Instant::now()));
        entry.0 |= mask;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        if data.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let id = set_id(set).ok_or(code::INVALID_ARGUMENT)?;
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            let (waker, timeout) = {
                let mut st = state();
                st.node()?;
                if !st.sets.contains_key(&id) {
                    return Err(code::INVALID_ARGUMENT);
                }
                st.poll();
                let next = st.sets.get_mut(&id).and_then(|s| s.pending.pop_front());
                match next {
                    Some(Pending::Lost) => return Err(code::GPU_IS_LOST),
                    Some(Pending::Event {
                        dev,
                        ty,
                        data: d,
                        gi,
                        ci,
                    }) => {
                        let ev = nvmlEventData_t {
                            device: dev.handle(),
                            eventType: ty,
                            eventData: d,
                            gpuInstanceId: gi,
                            computeInstanceId: ci,
                        };
                        // SAFETY: checked non-null; out-pointer per nvml.h.
                        let put = unsafe { put(data, ev) };
                        log_return();
                        return put;
                    }
                    None => {}
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(code::TIMEOUT);
                }
                let until = st.next_due(id).map_or(deadline, |due| due.min(deadline));
                let timeout = until.saturating_duration_since(now);
                (st.sets.get(&id).and_then(|s| s.waker.clone()), timeout)
            };
            // Lock released: other threads may inject or free while we wait.
            match waker {
                Some(w) => w.wait(timeout),
                None => std::thread::sleep(WAIT_STEP.min(timeout)),
            }
        }
    })
}

/// With `FAKE_NVML_WAIT_LOG` set, append the wall-clock time (µs since the Unix epoch) at
/// which a wait hands out an event: where the driver's part of an event's path ends, so a
/// benchmark can tell the agent's own latency from the fake's (file read, wake-up).
fn log_return() {
    use std::io::Write;
    let Some(path) = std::env::var_os("FAKE_NVML_WAIT_LOG") else {
        return;
    };
    // Best effort: a benchmark aid, never a reason to fail the wait. The time is taken once
    // the file is open, so only the one write lands in the consumer's share.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let _ = f.write_all(format!("{at}\n").as_bytes());
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    // SAFETY: same contract as the v2 symbol.
    unsafe { nvmlEventSetWait_v2(set, data, timeout_ms) }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let id = set_id(set).ok_or(code::INVALID_ARGUMENT)?;
        // Freeing after shutdown happens when an EventSet outlives its Nvml; it is harmless.
        if st.init_count == 0 {
            return Err(code::UNINITIALIZED);
        }
        st.sets
            .remove(&id)
            .map(|_| ())
            .ok_or(code::INVALID_ARGUMENT)
    })
}

// ---------------------------------------------------------------- memory limits

/// `nvmlSetMemoryLimits_v1_t` (nvml.h 13.x; not in nvml-wrapper-sys 0.10).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_snake_case, non_camel_case_types, reason = "names mirror nvml.h")]
pub struct nvmlSetMemoryLimits_v1_t {
    /// Full path of the cgroup directory.
    pub nameSpace: *const c_char,
    /// Soft limit in bytes.
    pub softLimit: c_ulonglong,
    /// Hard limit in bytes.
    pub hardLimit: c_ulonglong,
}

/// `nvmlGetMemoryLimits_v1_t` (nvml.h 13.x).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_snake_case, non_camel_case_types, reason = "names mirror nvml.h")]
pub struct nvmlGetMemoryLimits_v1_t {
    /// Full path of the cgroup directory (input).
    pub nameSpace: *const c_char,
    /// Soft limit in bytes (output).
    pub softLimit: c_ulonglong,
    /// Hard limit in bytes (output).
    pub hardLimit: c_ulonglong,
    /// Memory in use in bytes (output; always 0 here).
    pub currentUsed: c_ulonglong,
}

const _: () = assert!(size_of::<nvmlSetMemoryLimits_v1_t>() == 24);
const _: () = assert!(offset_of!(nvmlSetMemoryLimits_v1_t, softLimit) == 8);
const _: () = assert!(size_of::<nvmlGetMemoryLimits_v1_t>() == 32);
const _: () = assert!(offset_of!(nvmlGetMemoryLimits_v1_t, currentUsed) == 24);

fn limits_unsupported() -> bool {
    std::env::var_os("FAKE_NVML_LIMITS_UNSUPPORTED").is_some_and(|v| v == "1")
}

fn limits_error(e: fake_view::ViewError) -> nvmlReturn_t {
    eprintln!("fake-nvml: {e}");
    code::UNKNOWN
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLimits_v1(
    h: nvmlDevice_t,
    limits: *mut nvmlSetMemoryLimits_v1_t,
) -> nvmlReturn_t {
    entry(|| {
        let mut st = state();
        let (dev, gpu) = st.dev(h, "nvmlDeviceSetMemoryLimits_v1")?;
        gpu_only(dev)?;
        if limits_unsupported() {
            return Err(code::NOT_SUPPORTED);
        }
        if limits.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller passes a valid struct (nvml.h).
        let req = unsafe { *limits };
        // SAFETY: `nameSpace` is null or a NUL-terminated path (nvml.h).
        let cgroup = unsafe { get_str(req.nameSpace) }?.to_string();
        let uuid = gpu.uuid.clone();
        let file = fake_view::limits_file();
        let value = Limits {
            soft_limit: req.softLimit,
            hard_limit: req.hardLimit,
        };
        fake_view::store_limit(file.as_deref(), &mut st.limits, &uuid, &cgroup, value)
            .map_err(limits_error)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryLimits_v1(
    h: nvmlDevice_t,
    limits: *mut nvmlGetMemoryLimits_v1_t,
) -> nvmlReturn_t {
    entry(|| {
        let st = state();
        let (dev, gpu) = st.dev(h, "nvmlDeviceGetMemoryLimits_v1")?;
        gpu_only(dev)?;
        if limits_unsupported() {
            return Err(code::NOT_SUPPORTED);
        }
        if limits.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller passes a valid struct with `nameSpace` set (nvml.h).
        let mut out = unsafe { *limits };
        // SAFETY: `nameSpace` is null or a NUL-terminated path (nvml.h).
        let cgroup = unsafe { get_str(out.nameSpace) }?;
        let file = fake_view::limits_file();
        let found = fake_view::load_limit(file.as_deref(), &st.limits, &gpu.uuid, cgroup)
            .map_err(limits_error)?
            .ok_or(code::NOT_FOUND)?;
        out.softLimit = found.soft_limit;
        out.hardLimit = found.hard_limit;
        out.currentUsed = 0;
        // SAFETY: checked non-null above.
        unsafe { put(limits, out) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip() {
        for dev in [Dev::Gpu(0), Dev::Gpu(7), Dev::Mig(3, 0), Dev::Mig(1, 6)] {
            assert!(!dev.handle().is_null());
            assert_eq!(Dev::decode(dev.handle()), Some(dev));
        }
        assert_eq!(Dev::decode(std::ptr::null_mut()), None);
        assert_eq!(Dev::decode(set_handle(0) as nvmlDevice_t), None);
        assert_eq!(set_id(set_handle(5)), Some(5));
        assert_eq!(set_id(Dev::Gpu(0).handle() as nvmlEventSet_t), None);
    }

    #[test]
    fn pci_info_uses_nvml_forms() {
        let node = NodeSpec::parse(
            "gpus: [{index: 0, uuid: GPU-00000000-0000-0000-0000-000000000000, \
             product: NVIDIA A100-SXM4-80GB, pciBusId: '0000:3b:00.0'}]",
            "t",
        )
        .unwrap();
        let info = pci_info(&node.gpus[0]);
        // SAFETY: busId is NUL-terminated (32 bytes, 16 used).
        let bus = unsafe { CStr::from_ptr(info.busId.as_ptr()) };
        assert_eq!(bus.to_str().unwrap(), "00000000:3B:00.0");
        assert_eq!((info.domain, info.bus, info.device), (0, 0x3b, 0));
        assert_eq!(MEMORY_V2_VERSION, 0x0200_0028);
    }
}
