//! `gpu-slicer demo` as the README's first command: the narrative on stdout, no INFO log
//! lines beside it (the demo itself: `cli::demo` unit tests).

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
