//! The mistakes a new user makes first, through the built binary: each gets a message that
//! names the real mistake (the file, flag or variable, the field and the value as written)
//! and the exit code of its class (2: the input is wrong; 1: the machine failed us).
//! Issue 33's table, one test per row, plus what the node skips from a config.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary with `args`, none of the settings' variables inherited from the caller.
fn run_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"));
    for var in [
        "MIG_STRATEGY",
        "CONFIG_FILE",
        "GPU_SLICER_BACKEND",
        "NVML_LIB",
        "LOG_FORMAT",
        "HEALTH_QUIET_PERIOD",
        "PASS_DEVICE_SPECS",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .output()
        .expect("run gpu-slicer")
}

fn run(args: &[&str]) -> Output {
    run_with(args, &[])
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Exit code 2 and every needle in stderr.
fn input_error(out: &Output, needles: &[&str]) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "missing {n:?} in: {err}");
    }
    err
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_missing_node_file_is_named_as_a_missing_file() {
    let dir = common::short_tempdir();
    let missing = dir.path().join("missing.yaml");
    let backend = format!("sim:{}", missing.display());
    let out = run(&["inventory", "--backend", &backend]);
    let err = input_error(
        &out,
        &[
            &format!("node file {}", missing.display()),
            "does not exist",
        ],
    );
    assert!(!err.contains("unknown sim profile"), "{err}");
}

#[test]
fn a_missing_spec_directory_or_file_is_named_as_missing() {
    let dir = common::short_tempdir();
    for missing in [dir.path().join("cdi"), dir.path().join("missing.yaml")] {
        let out = run(&["cdi", "validate", s(&missing)]);
        let err = input_error(
            &out,
            &[
                &missing.display().to_string(),
                "no such spec file or directory",
            ],
        );
        assert!(!err.contains("runtimes only load"), "{err}");
    }
}

#[test]
fn a_mistyped_product_is_blamed_not_another_products_mig_table() {
    let dir = common::short_tempdir();
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/nodes/mixed-a100.yaml"),
    )
    .unwrap()
    .replacen("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-800GB", 1);
    let node = write(dir.path(), "node.yaml", &text);
    let backend = format!("sim:{}", node.display());
    let out = run(&["inventory", "--backend", &backend]);
    let err = input_error(&out, &["gpus[0]", "NVIDIA A100-SXM4-800GB", "A100-80GB"]);
    assert!(!err.contains("memory slices"), "{err}");
}

#[test]
fn oversubscribed_replica_memory_is_told_in_the_configs_units() {
    let dir = common::short_tempdir();
    let cfg = write(
        dir.path(),
        "cfg.yaml",
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4, isolation: memory, memory: 30Gi}\n",
    );
    let out = run(&[
        "inventory",
        "--backend",
        "sim:mixed-a100",
        "--config",
        s(&cfg),
    ]);
    input_error(
        &out,
        &[
            s(&cfg),
            "sharing.timeSlicing.resources[0].memory",
            "`30Gi`",
            "4 replicas × 30Gi = 120Gi exceeds the 80Gi",
            "at most 20Gi per replica",
        ],
    );
}

#[test]
fn devices_the_node_lacks_are_shown_by_inventory_and_refused_by_strict() {
    let dir = common::short_tempdir();
    let cfg = write(
        dir.path(),
        "cfg.yaml",
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, devices: [9], replicas: 2}\n",
    );
    let args = [
        "inventory",
        "--backend",
        "sim:mixed-a100",
        "--config",
        s(&cfg),
    ];
    // A mixed cluster's one ConfigMap: skipped, exit 0, and said in the output itself.
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    for needle in [
        "SKIPPED CONFIG ENTRIES",
        "sharing.timeSlicing.resources[0].devices[0] = 9",
        "no such device on this node",
        "sharing.timeSlicing.resources[0].devices = [9]",
        "the entry is skipped",
        "node has 4 devices of nvidia.com/gpu",
    ] {
        assert!(table.contains(needle), "missing {needle:?} in:\n{table}");
    }
    let json = run(&[&args[..], &["--format", "json"]].concat());
    assert!(json.status.success(), "{}", stderr(&json));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let skipped = v["skipped"].as_array().expect("a skipped list");
    assert_eq!(skipped.len(), 2, "{v}");
    assert_eq!(skipped[0]["reason"], "device-not-on-node");
    assert_eq!(skipped[0]["value"], "9");
    assert_eq!(skipped[1]["reason"], "no-matching-devices");
    // The CI check of a ConfigMap: every skip is an input error.
    let strict = run(&[&args[..], &["--strict"]].concat());
    input_error(
        &strict,
        &[
            s(&cfg),
            "--strict",
            "field `sharing.timeSlicing.resources[0].devices[0]` = `9`",
            "no such device on this node",
        ],
    );
    // A config that fits the node passes --strict.
    let fits = write(
        dir.path(),
        "fits.yaml",
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.shared, devices: [2], replicas: 2}\n",
    );
    let out = run(&[
        "inventory",
        "--backend",
        "sim:mixed-a100",
        "--config",
        s(&fits),
        "--strict",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stdout(&out).contains("SKIPPED"), "{}", stdout(&out));
}

#[test]
fn an_empty_config_file_warns() {
    let dir = common::short_tempdir();
    let cfg = write(dir.path(), "empty.yaml", "# to be filled in\n");
    let out = run(&[
        "inventory",
        "--backend",
        "sim:mixed-a100",
        "--config",
        s(&cfg),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("WARN") && err.contains("holds no settings") && err.contains(s(&cfg)),
        "{err}"
    );
}

#[test]
fn a_server_without_dra_v1_is_refused() {
    for version in ["1.20", "v1.33.4", "0.9"] {
        let out = run(&[
            "dra",
            "slices",
            "--backend",
            "sim:mixed-a100",
            "--node-name",
            "n1",
            "--server-version",
            version,
        ]);
        input_error(
            &out,
            &[
                &format!("--server-version `{version}`"),
                "resource.k8s.io/v1",
                "from 1.34",
            ],
        );
    }
    let out = run(&[
        "dra",
        "slices",
        "--backend",
        "sim:mixed-a100",
        "--node-name",
        "n1",
        "--server-version",
        "1.34",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_host_without_a_gpu_is_pointed_at_the_sim_backend() {
    // The default backend on a host whose NVML library is missing.
    let dir = common::short_tempdir();
    let lib = dir.path().join("libnvidia-ml.so.1");
    let out = run(&["inventory", "--nvml-lib", s(&lib)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(s(&lib))
            && err.contains("--backend sim:<profile>` (built-in: dgx-h100, mixed-a100)"),
        "{err}"
    );
}

#[test]
fn a_bad_value_in_a_variable_names_the_variable_for_every_value_type() {
    let base = ["run", "--backend", "sim:mixed-a100"];
    for (var, value) in [
        ("HEALTH_QUIET_PERIOD", "xyz"),
        ("PASS_DEVICE_SPECS", "maybe"),
        ("LOG_FORMAT", "xml"),
    ] {
        let out = run_with(&base, &[(var, value)]);
        let err = input_error(
            &out,
            &[&format!(
                "invalid value '{value}' for environment variable {var}"
            )],
        );
        assert!(!err.contains("for '--"), "{var}: {err}");
    }
    // The same value typed as a flag still names the flag.
    let out = run(&[&base[..], &["--health-quiet-period", "xyz"]].concat());
    input_error(&out, &["'--health-quiet-period"]);
}
