//! The nvidia-smi stand-in over the two fakes, loaded by soname from `LD_LIBRARY_PATH`: what it
//! prints is what the device nodes under `FAKE_GPU_DEV_ROOT` allow, and NVML and CUDA agree.

use std::path::{Path, PathBuf};
use std::process::Command;

const NODE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../hack/nodes/mixed-a100.yaml"
);

/// A built cdylib of the workspace (cargo puts dev-dependency cdylibs beside the test binary).
fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("exe dir");
    for dir in [deps, deps.parent().expect("target dir")] {
        let p = dir.join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} not found near {}", exe.display());
}

/// A library dir holding the fakes under their sonames, and a dev root with `nodes`.
fn setup(nodes: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    std::os::unix::fs::symlink(built("libnvidia_ml.so"), lib.join("libnvidia-ml.so.1")).unwrap();
    std::os::unix::fs::symlink(built("libcuda.so"), lib.join("libcuda.so.1")).unwrap();
    for n in nodes {
        let p = dir.path().join("root/dev").join(n);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "").unwrap();
    }
    dir
}

fn smi(dir: &Path, args: &[&str]) -> (i32, String, String) {
    smi_on(NODE, dir, args)
}

fn smi_on(node: &str, dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fake-nvidia-smi"))
        .args(args)
        .env("LD_LIBRARY_PATH", dir.join("lib"))
        .env("FAKE_NVML_NODE", node)
        .env("FAKE_GPU_DEV_ROOT", dir.join("root"))
        .env_remove("FAKE_NVML_LIMITS_FILE")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn mig_slice_and_whole_gpu_are_all_that_nvml_and_cuda_see() {
    // GPU 0's MIG device in slot 1 (GI 8: caps 75, 76) and GPU 2 whole; GPU 0's other
    // slices, GPU 1 and GPU 3 have no nodes here.
    let dir = setup(&[
        "nvidiactl",
        "nvidia0",
        "nvidia-caps/nvidia-cap75",
        "nvidia-caps/nvidia-cap76",
        "nvidia2",
    ]);
    let lib = dir.path().join("lib");
    let (rc, out, err) = smi(dir.path(), &[]);
    assert_eq!(rc, 0, "{err}");
    let want = format!(
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e00)
  MIG 1g.10gb Device 0: (UUID: MIG-1b2c3d4e-0000-4a00-8000-000000000008)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02)
NVML GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e00: total 85899345920 free 85899345920
NVML GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02: total 85899345920 free 85899345920
NVML: libnvidia-ml.so.1 => {lib}/libnvidia-ml.so.1, driver 570.124.06
CUDA: libcuda.so.1 => {lib}/libcuda.so.1, version 12080
CUDA devices: 2
CUDA 0: NVIDIA A100-SXM4-80GB MIG 1g.10gb (UUID: MIG-1b2c3d4e-0000-4a00-8000-000000000008) free 10737418240 total 10737418240
CUDA 1: NVIDIA A100-SXM4-80GB (UUID: GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02) free 85899345920 total 85899345920
",
        lib = lib.display()
    );
    assert_eq!(out, want);

    let (rc, out, _) = smi(dir.path(), &["-L"]);
    assert_eq!(rc, 0);
    assert_eq!(out.lines().count(), 3, "{out}");
}

#[test]
fn mig_gpu_without_caps_has_no_cuda_device() {
    // The GPU node alone: NVML lists the MIG-mode GPU, but no MIG device is reachable, so
    // CUDA has nothing to initialise (as with the real driver).
    let dir = setup(&["nvidiactl", "nvidia1"]);
    let (rc, out, err) = smi(dir.path(), &[]);
    assert_eq!(rc, 13, "{out}{err}");
    assert!(
        out.starts_with(
            "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e01)\nNVML "
        ),
        "{out}"
    );
    assert!(err.contains("cuInit failed: CUresult 100"), "{err}");
}

#[test]
fn no_control_node_is_no_driver() {
    let dir = setup(&["nvidia0", "nvidia2"]);
    let (rc, out, err) = smi(dir.path(), &["-L"]);
    assert_eq!((rc, out.as_str()), (9, ""));
    assert!(err.contains("dev/nvidiactl is missing"), "{err}");
    assert!(
        err.contains("nvidia-smi: nvmlInit_v2 failed: Driver Not Loaded (code 9)"),
        "{err}"
    );
}

#[test]
fn bad_arguments_are_refused() {
    let dir = setup(&["nvidiactl"]);
    let (rc, _, err) = smi(dir.path(), &["-q"]);
    assert_eq!(rc, 2);
    assert!(err.starts_with("usage: nvidia-smi [-L | topo -m]"), "{err}");
}

#[test]
fn topo_m_prints_the_visible_gpus_matrix() {
    let node = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../hack/nodes/topo-bridged-pairs.yaml"
    );
    // GPUs 0 and 2 (an NVLink pair) and GPU 4 (the other socket) are visible.
    let dir = setup(&["nvidiactl", "nvidia0", "nvidia2", "nvidia4"]);
    let (rc, out, err) = smi_on(node, dir.path(), &["topo", "-m"]);
    assert_eq!(rc, 0, "{err}");
    let head: Vec<&str> = out.lines().take(4).collect();
    assert_eq!(
        head,
        [
            "\tGPU0\tGPU1\tGPU2\tNUMA Affinity",
            "GPU0\t X \tNV12\tSYS\t0",
            "GPU1\tNV12\t X \tSYS\t0",
            "GPU2\tSYS\tSYS\t X \t1",
        ]
    );
    assert!(
        out.contains("NV#  = Connection traversing a bonded set of # NVLinks"),
        "{out}"
    );
    let (rc, _, err) = smi(dir.path(), &["topo", "-m"]);
    assert_eq!(rc, 9, "mixed-a100 has no topology section");
    assert!(err.contains("no `topology` section"), "{err}");
}
