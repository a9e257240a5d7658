//! `gpu-slicer demo` runs end to end and shows every kind of allocation (the binary's
//! output: tests/cli_demo.rs).

#[tokio::test]
async fn demo_runs_and_reports_allocations() {
    let mut out = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        crate::cli::demo::demo(&mut out),
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
