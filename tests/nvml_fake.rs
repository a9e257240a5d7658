//! The NVML backend over the fake `libnvidia-ml.so` (crates/fake-nvml) must see exactly what
//! the sim backend sees on the same node file; plus the backend's failure paths.
//!
//! Each test copies the fake library to its own path (a new inode is a new instance with its
//! own state, nvml.md §7) and configures it through `fakeNvmlSetNodeJson` before NVML opens it.

use std::ffi::{CString, c_char, c_int};
use std::path::{Path, PathBuf};

use gpu_slicer::inventory::nvml::NvmlBackend;
use gpu_slicer::inventory::sim::SimBackend;
use gpu_slicer::inventory::{Backend, InventoryError};

/// The fake library built by cargo as a dev-dependency, next to this test binary.
fn fake_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("exe dir");
    for dir in [deps, deps.parent().expect("target dir")] {
        let p = dir.join("libnvidia_ml.so");
        if p.exists() {
            return p;
        }
    }
    panic!("libnvidia_ml.so not found near {}", exe.display());
}

/// A private copy of the fake, configured with `node` (None: no driver).
struct Fake {
    dir: tempfile::TempDir,
    path: PathBuf,
    // Keeps the instance (and its configuration) loaded until NVML has opened it too.
    _lib: libloading::Library,
}

impl Fake {
    fn new(node: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("libnvidia-ml.so.1");
        std::fs::copy(fake_lib(), &path).expect("copy fake");
        // SAFETY: loading our own fake library; it runs no initialisers with side effects.
        let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen fake");
        if let Some(node) = node {
            let text = CString::new(node).expect("no NUL");
            // SAFETY: the control symbol's signature is `int (const char*)`; `text` lives
            // across the call.
            let rc = unsafe {
                let set: libloading::Symbol<unsafe extern "C" fn(*const c_char) -> c_int> =
                    lib.get(b"fakeNvmlSetNodeJson").expect("control symbol");
                set(text.as_ptr())
            };
            assert_eq!(rc, 0, "fake rejected the node");
        }
        Self {
            dir,
            path,
            _lib: lib,
        }
    }

    /// A backend over this fake, with a generated mig-minors file and an empty sysfs.
    fn backend(&self, gpu_minors: &[u32]) -> NvmlBackend {
        let proc_root = self.dir.path().join("proc");
        let caps = proc_root.join("driver/nvidia-caps");
        std::fs::create_dir_all(&caps).expect("mkdir");
        std::fs::write(
            caps.join("mig-minors"),
            node_spec::mig_minors_file(gpu_minors),
        )
        .expect("write mig-minors");
        NvmlBackend::new(Some(self.path.clone()), proc_root)
            .with_sys_root(self.dir.path().join("sys"))
    }
}

fn node_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/nodes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("hack/nodes")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    files
}

#[test]
fn nvml_over_fake_matches_sim_for_every_node_file() {
    for file in node_files() {
        let text = std::fs::read_to_string(&file).expect("read node file");
        let sim = SimBackend::from_file(&file)
            .expect("sim")
            .discover()
            .expect("sim");
        let minors: Vec<u32> = sim.gpus.iter().map(|g| g.minor).collect();
        let fake = Fake::new(Some(&text));
        let mut nvml = fake.backend(&minors).discover().expect("nvml discover");
        assert_eq!(nvml.source, "nvml");
        nvml.source = sim.source.clone();
        assert_eq!(nvml, sim, "{}", file.display());
    }
}

#[test]
fn missing_mig_minors_file_leaves_minors_unknown() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/nodes/mixed-a100.yaml"),
    )
    .expect("read");
    let fake = Fake::new(Some(&text));
    let inv = NvmlBackend::new(Some(fake.path.clone()), fake.dir.path().join("no-proc"))
        .discover()
        .expect("discover");
    let (_, mig) = inv.migs().next().expect("a MIG device");
    assert_eq!((mig.gi_cap_minor, mig.ci_cap_minor), (None, None));
}

#[test]
fn no_driver_is_a_clear_nvml_error() {
    let fake = Fake::new(None);
    let err = fake.backend(&[]).discover().unwrap_err();
    assert!(matches!(err, InventoryError::Nvml { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("libnvidia-ml.so.1"), "{msg}");
    assert!(msg.to_lowercase().contains("driver"), "{msg}");
}

#[test]
fn device_error_names_the_device_and_call() {
    let node = r#"
gpus:
  - index: 0
    uuid: GPU-00000000-0000-0000-0000-000000000000
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "0000:07:00.0"
  - index: 1
    uuid: GPU-00000000-0000-0000-0000-000000000001
    product: NVIDIA A100-SXM4-80GB
    pciBusId: "0000:08:00.0"
    nvmlErrors: {nvmlDeviceGetMinorNumber: 15}
"#;
    let fake = Fake::new(Some(node));
    let err = fake.backend(&[0, 1]).discover().unwrap_err();
    let InventoryError::NvmlDevice {
        call,
        device,
        message,
    } = &err
    else {
        panic!("expected NvmlDevice, got {err:?}");
    };
    assert_eq!(*call, "nvmlDeviceGetMinorNumber");
    assert!(
        device.contains("GPU 1") && device.contains("GPU-00000000-0000-0000-0000-000000000001"),
        "{device}"
    );
    assert!(message.contains("fell off the bus"), "{message}");
}
