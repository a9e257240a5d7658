//! `gpu-slicer demo` runs end to end and shows every kind of allocation.

#[tokio::test]
async fn demo_runs_and_reports_allocations() {
    let mut out = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        gpu_slicer::cli::demo::demo(&mut out),
    )
    .await
    .expect("demo within 30 s")
    .expect("demo succeeds");
    let text = String::from_utf8(out).unwrap();
    for needle in [
        "nvidia.com/gpu.shared",
        "Allocate nvidia.com/mig-1g.10gb x1",
        "Allocate nvidia.com/gpu x1",
        "Allocate nvidia.com/gpu.shared x2",
        "cdi device  gpu-slicer.io/gpu=MIG-",
        "GPU_SLICER_REPLICAS=2",
        "FailedPrecondition",
        "replicas Healthy again",
        "reloaded without a restart; changed [\"nvidia.com/gpu.shared\"]",
        "Allocate nvidia.com/gpu.shared x3",
        "-share-3",
        "CDI hook    createRuntime",
        "cdi-hook set-memory-limit --device GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03 --bytes 64424509440",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

/// The README's first command reads as a story: with `RUST_LOG` unset, the binary's demo
/// writes its narrative to stdout and no INFO lines beside it.
#[test]
fn the_demo_binary_keeps_info_logs_out_of_the_narrative() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .arg("demo")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .output()
        .expect("run gpu-slicer demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Allocate nvidia.com/gpu x1"), "{stdout}");
    let info: Vec<&str> = stderr.lines().filter(|l| l.contains(" INFO ")).collect();
    assert!(info.is_empty(), "INFO lines with the narrative: {info:?}");
}
