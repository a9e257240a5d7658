//! One ConfigMap for a mixed cluster: entries that name nothing on this node are skipped
//! with a warning (as NVIDIA's plugin does) instead of stopping the agent; malformed
//! entries still fail. Through the built binary, as an operator runs it.

use std::process::{Command, Output};

fn inventory(node: &str, config: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args([
            "inventory",
            "--backend",
            node,
            "--format",
            "json",
            "--config",
        ])
        .arg(config)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run gpu-slicer")
}

#[test]
fn a_mig_sharing_entry_on_a_node_without_mig_is_skipped_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("cluster.yaml");
    std::fs::write(
        &config,
        "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.shared, replicas: 2, devices: [0, 1, 7, 12]}\n",
    )
    .expect("config");
    // dgx-h100: 8 whole GPUs, no MIG, indices 0-7.
    let out = inventory("sim:dgx-h100", &config);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sharing.timeSlicing.resources[0].name")
            && stderr.contains("nvidia.com/mig-1g.10gb")
            && stderr.contains("no-such-resource"),
        "{stderr}"
    );
    assert!(
        stderr.contains("sharing.timeSlicing.resources[1].devices[3]")
            && stderr.contains("no-such-device"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // GPUs 0, 1 and 7 are split two ways; the rest stay whole.
    assert!(
        stdout.contains("nvidia.com/gpu.shared") && stdout.contains("::1"),
        "replicas advertised: {stdout}"
    );

    // The same ConfigMap on the MIG node applies the MIG entry, with no skip warning for it.
    let out = inventory("sim:mixed-a100", &config);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("resources[0].name"), "{stderr}");
}

#[test]
fn malformed_entries_are_still_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("bad.yaml");
    std::fs::write(
        &config,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/mig-1g.10gb, replicas: 1}\n",
    )
    .expect("config");
    let out = inventory("sim:dgx-h100", &config);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("replicas"),
        "{out:?}"
    );
}
