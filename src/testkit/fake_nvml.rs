//! The fake NVML driver in tests and benches: where cargo built the fake `libnvidia-ml`
//! (`crates/fake-nvml`, a dev-dependency), [`PrivateFake`] (a copy of it with state of its
//! own, configured through the fake's control symbols), the driver's `mig-minors` file, and
//! a host driver root as the NVIDIA installer leaves one.
//!
//! Every test that loads the fake into its own process takes a [`PrivateFake`]: unit tests
//! run as threads of one process, and two backends opening the same library path would share
//! one instance of the fake (nvml.md §7: a new inode is a new instance).

use std::ffi::{CString, c_char, c_int};
use std::path::{Path, PathBuf};

/// The fake `libnvidia-ml` cargo builds as a dev-dependency, found next to the running test
/// or bench binary (`target/<profile>/deps` or its parent).
///
/// # Panics
/// When it is not there (the fake is built only with the dev-dependencies).
pub fn fake_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current exe: {e}"));
    let deps = exe
        .parent()
        .unwrap_or_else(|| panic!("{} has no folder", exe.display()));
    for dir in [Some(deps), deps.parent()].into_iter().flatten() {
        let p = dir.join("libnvidia_ml.so");
        if p.exists() {
            return p;
        }
    }
    panic!("libnvidia_ml.so not found near {}", exe.display());
}

/// A private copy of the fake NVML library: its own state, configured through its control
/// symbols, and opened by [`path`](Self::path) by the backend under test (another copy's
/// state is not shared). Kept loaded for as long as this value lives, so the configuration
/// holds until the backend has opened the same copy.
#[derive(Debug)]
pub struct PrivateFake {
    /// Where the copy lies (`<dir>/libnvidia-ml.so.1`): give it to the backend.
    pub path: PathBuf,
    lib: libloading::Library,
}

impl PrivateFake {
    /// Copy the fake into `dir` and load the copy.
    ///
    /// # Panics
    /// When the copy or the load fails: fixtures are for tests.
    pub fn new(dir: &Path) -> Self {
        let path = dir.join("libnvidia-ml.so.1");
        std::fs::copy(fake_lib(), &path).unwrap_or_else(|e| panic!("copy fake: {e}"));
        // SAFETY: loading our own fake library; it runs no initialisers with side effects.
        let lib = unsafe { libloading::Library::new(&path) }
            .unwrap_or_else(|e| panic!("dlopen {}: {e}", path.display()));
        Self { path, lib }
    }

    /// Serve the node `text` (a node file, YAML or JSON).
    ///
    /// # Panics
    /// When the fake rejects the node.
    pub fn set_node(&self, text: &str) {
        self.control(b"fakeNvmlSetNodeJson", text);
    }

    #[cfg(test)]
    /// Set the MIG state (`{"failCreate": {...}}`, ...) the fake's MIG calls act on.
    ///
    /// # Panics
    /// When the fake rejects the state.
    pub(crate) fn set_mig_state(&self, json: &str) {
        self.control(b"fakeNvmlSetMigStateJson", json);
    }

    /// Queue one health event (an event line, `{"gpu":0,"kind":"xid","xid":79}`).
    ///
    /// # Panics
    /// When the fake rejects the event.
    pub fn inject(&self, json: &str) {
        self.control(b"fakeNvmlInjectEvent", json);
    }

    /// Topology calls this copy answered so far.
    ///
    /// # Panics
    /// When the copy lacks the control symbol.
    pub fn topology_calls(&self) -> u64 {
        // SAFETY: the control symbol's signature is `unsigned long long (void)`.
        unsafe {
            let calls: libloading::Symbol<unsafe extern "C" fn() -> u64> = self
                .lib
                .get(b"fakeNvmlTopologyCalls")
                .unwrap_or_else(|e| panic!("control symbol: {e}"));
            calls()
        }
    }

    #[cfg(test)]
    /// The loaded copy, for tests that call NVML symbols themselves.
    pub(crate) fn library(&self) -> &libloading::Library {
        &self.lib
    }

    /// Call a control symbol of signature `int (const char*)` with `text`.
    fn control(&self, symbol: &[u8], text: &str) {
        let name = String::from_utf8_lossy(symbol);
        let text = CString::new(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        // SAFETY: the fake's control symbols take one NUL-terminated string; `text` lives
        // across the call.
        let rc = unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn(*const c_char) -> c_int> = self
                .lib
                .get(symbol)
                .unwrap_or_else(|e| panic!("control symbol {name}: {e}"));
            f(text.as_ptr())
        };
        assert_eq!(rc, 0, "the fake rejected {name}");
    }
}

/// A host driver root as the NVIDIA installer leaves one, as far as discovery needs it: the
/// CUDA and NVML libraries at `version` in the standard library folder (no ld.so.cache, so
/// discovery scans the folder). Returns the root (`dir/driver-root`); pass it as
/// `--container-driver-root` (the agent reads the files there, the spec names them under the
/// host root `/`).
///
/// # Panics
/// When the files cannot be written.
pub fn fake_driver_root(dir: &Path, version: &str) -> PathBuf {
    let root = dir.join("driver-root");
    let libs = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&libs).unwrap_or_else(|e| panic!("driver root: {e}"));
    for lib in ["libcuda.so", "libnvidia-ml.so"] {
        std::fs::write(libs.join(format!("{lib}.{version}")), "")
            .unwrap_or_else(|e| panic!("driver library: {e}"));
    }
    root
}

/// The driver's `<proc_root>/driver/nvidia-caps/mig-minors` for GPUs of minor numbers
/// `gpu_minors` (NVML does not report the MIG capability minors; the backend reads them
/// there). Returns `proc_root`.
///
/// # Panics
/// When the file cannot be written.
pub fn write_mig_minors(proc_root: &Path, gpu_minors: &[u32]) -> PathBuf {
    let caps = proc_root.join("driver/nvidia-caps");
    std::fs::create_dir_all(&caps).unwrap_or_else(|e| panic!("{}: {e}", caps.display()));
    std::fs::write(
        caps.join("mig-minors"),
        node_spec::mig_minors_file(gpu_minors),
    )
    .unwrap_or_else(|e| panic!("mig-minors: {e}"));
    proc_root.to_path_buf()
}
