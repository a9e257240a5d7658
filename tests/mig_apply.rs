//! `gpu-slicer mig apply` end to end: the built binary against the fake NVML library
//! (crates/fake-nvml) on a node file, its instance state shared through `FAKE_NVML_STATE`
//! with later `mig apply` and `inventory` runs, and golden `--dry-run` output for every
//! layout of mig-parted's example config.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const NODE: &str = "tests/fixtures/mig/a100-40gb.yaml";
const EXAMPLE: &str = "tests/fixtures/mig-parted/config.yaml";
const LAYOUTS: &[&str] = &[
    "all-disabled",
    "all-enabled",
    "all-1g.5gb",
    "all-2g.10gb",
    "all-3g.20gb",
    "all-balanced",
    "custom-config",
];

/// A private copy of the fake driver with a state file of its own.
struct Fake {
    dir: tempfile::TempDir,
    lib: PathBuf,
}

impl Fake {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libnvidia-ml.so.1");
        std::fs::copy(common::fake_lib(), &lib).unwrap();
        Self { dir, lib }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("nvml-state.json")
    }

    fn cmd(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
            .args(args)
            .current_dir(root())
            .env("FAKE_NVML_NODE", root().join(NODE))
            .env("FAKE_NVML_STATE", self.state())
            .env("NVML_LIB", &self.lib)
            .env("PROC_ROOT", self.dir.path().join("proc"))
            .env_remove("FAKE_GPU_DEV_ROOT")
            .env_remove("MIG_LAYOUT_FILE")
            .env_remove("MIG_LAYOUT")
            .output()
            .unwrap()
    }

    fn apply(&self, layout: &str, extra: &[&str]) -> (Value, Output) {
        let mut args = vec![
            "mig",
            "apply",
            "--backend",
            "nvml",
            "--config-file",
            EXAMPLE,
            "--layout",
            layout,
            "--format",
            "json",
        ];
        args.extend_from_slice(extra);
        let out = self.cmd(&args);
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (v, out)
    }

    /// Profiles of each GPU's MIG devices, as `inventory --backend nvml` sees them.
    fn migs(&self) -> Vec<Vec<String>> {
        let out = self.cmd(&["inventory", "--backend", "nvml", "--format", "json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let mut p: Vec<String> = g["migDevices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["profile"].as_str().unwrap().to_string())
                    .collect();
                p.sort();
                p
            })
            .collect()
    }
}

fn statuses(v: &Value) -> Vec<String> {
    v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["status"].as_str().unwrap().to_string())
        .collect()
}

fn sim(layout: &str, format: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args([
            "mig",
            "apply",
            "--backend",
            &format!("sim:{NODE}"),
            "--config-file",
            EXAMPLE,
        ])
        .args(["--layout", layout, "--dry-run", "--format", format])
        .current_dir(root())
        .output()
        .unwrap()
}

fn check_golden(path: &Path, actual: &[u8]) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let want = std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    assert_eq!(
        String::from_utf8_lossy(actual),
        String::from_utf8_lossy(&want),
        "{}",
        path.display()
    );
}

/// Every layout of mig-parted's example, dry run: golden table and JSON, the same over the
/// sim backend and over NVML (fake driver), and the same twice.
#[test]
fn dry_run_golden_for_mig_parted_example() {
    let fake = Fake::new();
    for layout in LAYOUTS {
        for format in ["table", "json"] {
            let out = sim(layout, format);
            assert!(
                out.status.success(),
                "{layout}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let ext = if format == "json" { "json" } else { "txt" };
            check_golden(
                &root().join(format!("tests/golden/mig-apply-{layout}.{ext}")),
                &out.stdout,
            );
            assert_eq!(
                sim(layout, format).stdout,
                out.stdout,
                "{layout}: deterministic"
            );
            let nvml = fake.cmd(&[
                "mig",
                "apply",
                "--backend",
                "nvml",
                "--config-file",
                EXAMPLE,
                "--layout",
                layout,
                "--dry-run",
                "--format",
                format,
            ]);
            assert!(
                nvml.status.success(),
                "{layout}: {}",
                String::from_utf8_lossy(&nvml.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&nvml.stdout),
                String::from_utf8_lossy(&out.stdout),
                "{layout}: nvml = sim"
            );
        }
    }
    // A dry run changes nothing.
    assert!(!fake.state().exists() || fake.migs()[4].is_empty());
}

/// Apply, then apply again: the second run does nothing; another process (`inventory`) sees
/// the new MIG devices; a new layout from there converges too.
#[test]
fn apply_is_idempotent_and_shared_across_processes() {
    let fake = Fake::new();
    let (v, out) = fake.apply("all-balanced", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        statuses(&v),
        [
            "pending", "pending", "pending", "pending", "changed", "changed", "changed", "changed"
        ]
    );
    let balanced = ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"];
    let migs = fake.migs();
    for (gpu, migs) in migs.iter().enumerate().skip(4) {
        assert_eq!(migs, &balanced, "GPU {gpu}");
    }
    assert!(migs[0].is_empty());
    let (again, out) = fake.apply("all-balanced", &[]);
    assert!(out.status.success());
    assert_eq!(statuses(&again)[4..], ["unchanged"; 4]);
    assert!(
        again["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["steps"].as_array().unwrap().is_empty())
    );
    let (v, _) = fake.apply("all-1g.5gb", &[]);
    assert_eq!(statuses(&v)[4..], ["changed"; 4]);
    assert_eq!(fake.migs()[5], ["1g.5gb"; 7]);
    let (v, _) = fake.apply("all-1g.5gb", &["--dry-run"]);
    assert_eq!(statuses(&v)[4..], ["unchanged"; 4]);
}

/// A compute process on an instance: NVML answers IN_USE, the GPU is reported pending with
/// why, nothing of it changes, the other GPUs converge, and the command exits 1.
#[test]
fn busy_instance_keeps_its_gpu() {
    let fake = Fake::new();
    std::fs::write(
        fake.state(),
        r#"{"processes": [{"gpu": "GPU-40400000-0000-4000-8000-000000000007", "pid": 4242, "gpuInstanceId": 1, "computeInstanceId": 0}]}"#,
    )
    .unwrap();
    let before = fake.migs();
    let (v, out) = fake.apply("all-balanced", &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gpu7 = &v["gpus"][7];
    assert_eq!(gpu7["status"], "pending");
    let reason = gpu7["reason"].as_str().unwrap();
    assert!(
        reason.contains("nvmlComputeInstanceDestroy") && reason.contains("rolled back"),
        "{reason}"
    );
    let after = fake.migs();
    assert_eq!(after[7], before[7]);
    assert_eq!(after[6], ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]);
}

/// A create that fails half-way: the GPU goes back to the layout it had.
#[test]
fn failing_create_rolls_back() {
    let fake = Fake::new();
    std::fs::write(
        fake.state(),
        r#"{"failCreate": {"GPU-40400000-0000-4000-8000-000000000006": ["1g.5gb"]}}"#,
    )
    .unwrap();
    let (v, out) = fake.apply("all-balanced", &[]);
    assert_eq!(out.status.code(), Some(1));
    let gpu6 = &v["gpus"][6];
    assert_eq!(gpu6["status"], "pending");
    let reason = gpu6["reason"].as_str().unwrap();
    assert!(
        reason.contains("create gpu-instance 1g.5gb")
            && reason.contains("rolled back to the previous layout"),
        "{reason}"
    );
    assert_eq!(fake.migs()[6], ["3g.20gb", "3g.20gb"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not be repartitioned"));
}

#[test]
fn bad_layouts_are_input_errors_naming_file_layout_gpu_and_profile() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("l.yaml");
    std::fs::write(&f, "version: v1\nmig-configs:\n  big:\n    - devices: [4]\n      mig-enabled: true\n      mig-devices: {\"1g.10gb+me\": 1}\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args([
            "mig",
            "apply",
            "--backend",
            &format!("sim:{NODE}"),
            "--config-file",
        ])
        .arg(&f)
        .args(["--layout", "big", "--dry-run"])
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("l.yaml")
            && e.contains("`big`")
            && e.contains("GPU 4")
            && e.contains("`1g.10gb+me`"),
        "{e}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args([
            "mig",
            "apply",
            "--backend",
            &format!("sim:{NODE}"),
            "--config-file",
            EXAMPLE,
            "--layout",
            "all-balanced",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dry-run"));
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args([
            "mig",
            "apply",
            "--backend",
            &format!("sim:{NODE}"),
            "--config-file",
            EXAMPLE,
            "--layout",
            "nope",
            "--dry-run",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("all-balanced"));
}

/// Scripts written for mig-parted set its variables: `mig apply` reads them when neither
/// our flag nor our variable is given (ours win), and says what is missing otherwise.
#[test]
fn mig_parted_variables_are_read_after_ours() {
    let by_flags = sim("all-balanced", "json");
    assert!(by_flags.status.success(), "{by_flags:?}");
    let run = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"));
        cmd.args(["mig", "apply", "--backend", &format!("sim:{NODE}")])
            .args(["--dry-run", "--format", "json"])
            .env_remove("MIG_LAYOUT_FILE")
            .env_remove("MIG_LAYOUT")
            .env_remove("MIG_PARTED_CONFIG_FILE")
            .env_remove("MIG_PARTED_SELECTED_CONFIG")
            .current_dir(root());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let parted = run(&[
        ("MIG_PARTED_CONFIG_FILE", EXAMPLE),
        ("MIG_PARTED_SELECTED_CONFIG", "all-balanced"),
    ]);
    assert!(parted.status.success(), "{parted:?}");
    assert_eq!(parted.stdout, by_flags.stdout);
    // Ours first: a layout named by MIG_LAYOUT wins over mig-parted's variable.
    let ours = run(&[
        ("MIG_PARTED_CONFIG_FILE", EXAMPLE),
        ("MIG_PARTED_SELECTED_CONFIG", "no-such-layout"),
        ("MIG_LAYOUT", "all-balanced"),
    ]);
    assert!(ours.status.success(), "{ours:?}");
    assert_eq!(ours.stdout, by_flags.stdout);
    let missing = run(&[("MIG_PARTED_CONFIG_FILE", EXAMPLE)]);
    assert_eq!(missing.status.code(), Some(2));
    let e = String::from_utf8_lossy(&missing.stderr);
    assert!(
        e.contains("--mig-layout (or MIG_LAYOUT, or mig-parted's MIG_PARTED_SELECTED_CONFIG)"),
        "{e}"
    );
}
