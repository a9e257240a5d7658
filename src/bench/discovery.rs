//! Discovery as start-up runs it: the GPUs through NVML (on the fake library in the
//! benches) and the host's user-space driver.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::domain::inventory::Backend;
use crate::platform::driver::{DiscoverOptions, DriverRoot, discover};
use crate::platform::nvml::NvmlBackend;

/// NVML discovery through the library `lib` (a private copy of the fake, see
/// [`crate::testkit::PrivateFake`]) with `/proc` at `proc_root` and, when given, `/sys` at
/// `sys_root`. One call of the closure discovers the node once and returns the time that
/// took (the inventory is freed after the clock is read) and what it found: GPUs, MIG
/// devices, and whether the GPU-pair topology was read.
///
/// # Panics
/// In the closure, when discovery fails.
pub fn nvml_discovery(
    lib: &Path,
    proc_root: &Path,
    sys_root: Option<&Path>,
) -> impl FnMut() -> (Duration, (usize, usize, bool)) + use<> {
    let mut backend = NvmlBackend::new(Some(lib.to_path_buf()), proc_root.to_path_buf());
    if let Some(sys) = sys_root {
        backend = backend.with_sys_root(sys.to_path_buf());
    }
    move || {
        let start = Instant::now();
        let inv = backend
            .discover()
            .unwrap_or_else(|e| panic!("discover: {e}"));
        let took = start.elapsed();
        (
            took,
            (inv.gpus.len(), inv.migs().count(), inv.topology.is_some()),
        )
    }
}

/// Driver discovery of version `version` in the root `root` (host and visible path the same;
/// its whole `ld.so.cache`), as start-up runs it when the driver lives there. One call of the
/// closure discovers once and says whether the driver was found.
pub fn driver_discovery(root: &Path, version: &str) -> impl FnMut() -> bool + use<> {
    let root = PathBuf::from(root);
    let opts = DiscoverOptions {
        root: DriverRoot {
            host: root.clone(),
            visible: root,
        },
        version: version.to_string(),
        library_search_paths: Vec::new(),
        kernel_release: None,
    };
    move || discover(&opts).is_ok()
}
