//! `gpu-slicer demo` as the README's first command: the narrative on stdout, told in order
//! (the node's GPUs and MIG slices first), with no log line beside it (the demo itself:
//! `cli::demo` unit tests).

/// The README's first command reads as a story: with `RUST_LOG` unset, the binary's demo
/// writes its narrative to stdout and no log lines beside it; the story starts with the
/// node, counts in correct English, shows what a container receives and explains the
/// generation stamp instead of printing it bare.
#[test]
fn the_demo_binary_tells_a_story_without_log_lines() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .arg("demo")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .output()
        .expect("run gpu-slicer demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The refused Allocate makes the daemon warn; the story tells it instead.
    let logs: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" INFO ") || l.contains(" WARN "))
        .collect();
    assert!(logs.is_empty(), "log lines with the narrative: {logs:?}");
    assert!(
        stdout.starts_with("node sim:mixed-a100: 4 GPUs"),
        "the node comes first:\n{stdout}"
    );
    // The steps, in the order the story tells them.
    let steps = [
        "  GPU  MIG  SLICES",
        "registered with the (emulated) kubelet",
        "  nvidia.com/mig-1g.10gb      9 devices  (7 on GPU 0, 2 on GPU 1)",
        "Allocate nvidia.com/mig-1g.10gb x1",
        "what a container started with gpu-slicer.io/gpu=MIG-",
        "  device nodes  /dev/nvidia0 /dev/nvidia-caps/",
        "Allocate nvidia.com/gpu x1",
        "Allocate refused as it must be",
        "the daemon logs each refusal as a warning",
        "Allocate nvidia.com/gpu.shared x3",
        "every answer is stamped gpu-slicer.io/generation",
        "daemon stopped",
    ];
    let mut from = 0;
    for step in steps {
        let at = stdout[from..]
            .find(step)
            .unwrap_or_else(|| panic!("missing {step:?} after byte {from} in:\n{stdout}"));
        from += at + step.len();
    }
    assert!(stdout.contains(" 1 device "), "{stdout}");
    assert!(!stdout.contains(" 1 devices"), "{stdout}");
    // The stamp is explained once, not printed bare with each answer.
    assert!(
        !stdout.contains("annotation  gpu-slicer.io/generation="),
        "{stdout}"
    );
}
