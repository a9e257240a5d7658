//! `gpu-slicer inventory` end to end: the built binary, real files, golden JSON, and the
//! bad-input contract (clear message naming file/field/value, exit code 2, no panic).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> Output {
    bin()
        .args(args)
        .env_remove("MIG_STRATEGY")
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn counts(v: &serde_json::Value) -> Vec<(String, usize)> {
    v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["devices"].as_array().unwrap().len(),
            )
        })
        .collect()
}

#[test]
fn done_when_mixed_strategy_counts() {
    let cfg = root().join("hack/configs/mixed.yaml");
    let v = json(&[
        "inventory",
        "--backend",
        "sim:mixed-a100",
        "--config",
        cfg.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(
        counts(&v),
        vec![
            ("nvidia.com/gpu".to_string(), 2),
            ("nvidia.com/mig-1g.10gb".to_string(), 9),
            ("nvidia.com/mig-2g.20gb".to_string(), 1),
            ("nvidia.com/mig-3g.40gb".to_string(), 1),
        ]
    );
    let dev = &v["resources"][1]["devices"][0];
    assert_eq!(dev["health"], "Healthy");
    assert_eq!(dev["gpu"], "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e00");
}

#[test]
fn done_when_time_slicing_replicas() {
    let cfg = root().join("hack/configs/mixed-timeslicing.yaml");
    let v = json(&[
        "inventory",
        "--backend",
        "sim:mixed-a100",
        "--config",
        cfg.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let gpu = &v["resources"][0];
    assert_eq!(gpu["name"], "nvidia.com/gpu");
    let ids: Vec<&str> = gpu["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 8);
    for uuid in [
        "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02",
        "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03",
    ] {
        for n in 0..4 {
            assert!(ids.contains(&format!("{uuid}::{n}").as_str()), "{ids:?}");
        }
    }
}

/// Golden JSON for every built-in profile and example config. `UPDATE_GOLDEN=1` rewrites.
#[test]
fn golden_inventory_json() {
    let cases: &[(&str, Option<&str>)] = &[
        ("dgx-h100", None),
        ("mixed-a100", None),
        ("mixed-a100", Some("mixed.yaml")),
        ("mixed-a100", Some("mixed-timeslicing.yaml")),
        ("mixed-a100", Some("per-gpu.yaml")),
    ];
    for (profile, config) in cases {
        let backend = format!("sim:{profile}");
        let mut args = vec!["inventory", "--backend", &backend, "--format", "json"];
        let cfg_path;
        if let Some(c) = config {
            cfg_path = root().join("hack/configs").join(c);
            args.extend(["--config", cfg_path.to_str().unwrap()]);
        }
        let out = run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Stable between runs.
        assert_eq!(out.stdout, run(&args).stdout);
        let name = match config {
            None => format!("inventory-{profile}.json"),
            Some(c) => format!("inventory-{profile}-{}.json", c.trim_end_matches(".yaml")),
        };
        let golden = root().join("tests/golden").join(name);
        check_golden(&golden, &out.stdout);
    }
}

fn check_golden(path: &Path, actual: &[u8]) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let expected = std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    assert!(
        expected == actual,
        "{} drifted; run `UPDATE_GOLDEN=1 cargo test --test cli_inventory` and review the diff",
        path.display()
    );
}

#[test]
fn table_shows_gpu_mig_resources() {
    let cfg = root().join("hack/configs/per-gpu.yaml");
    let out = run(&[
        "inventory",
        "--backend",
        "sim:mixed-a100",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("1g.10gb"), "{text}");
    assert!(text.contains("nvidia.com/gpu.shared"), "{text}");
    assert!(text.contains("timeSlicing x4"), "{text}");
}

fn expect_bad(args: &[&str], needles: &[&str]) {
    let out = run(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    for n in needles {
        assert!(err.contains(n), "missing `{n}` in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_config_files_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &[&str])] = &[
        ("flags:\n  migStratgy: mixed\n", &["migStratgy", "flags"]),
        (
            "flags:\n  failOnInitError: maybe\n",
            &["flags.failOnInitError"],
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 1}\n",
            &["sharing.timeSlicing.resources[0].replicas", ">= 2"],
        ),
        // A device this node lacks is skipped (one ConfigMap serves a mixed cluster);
        // a reference that is no device name at all stays an error.
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, rename: g.shared, devices: [\"1:x\"], replicas: 2}\n",
            &[
                "sharing.timeSlicing.resources[0].devices[0]",
                "`1:x`",
                "expected a GPU index",
            ],
        ),
        (
            "flags:\n  migStrategy: single\n",
            &["flags.migStrategy", "single", "GPU 2"],
        ),
        ("version: v9\n", &["version", "v9"]),
    ];
    for (i, (text, needles)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("c{i}.yaml"));
        std::fs::write(&path, text).unwrap();
        let p = path.to_str().unwrap();
        let mut n: Vec<&str> = needles.to_vec();
        n.push(p);
        expect_bad(
            &["inventory", "--backend", "sim:mixed-a100", "--config", p],
            &n,
        );
    }
}

#[test]
fn bad_node_files_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(root().join("hack/nodes/mixed-a100.yaml")).unwrap();
    let cases: &[(String, &[&str])] = &[
        (
            base.replace("profile: 2g.20gb", "profile: 4g.40gb"),
            &["gpus[1].mig.devices", "compute slices"],
        ),
        (
            base.replace("profile: 2g.20gb", "profile: 2g.99gb"),
            &["gpus[1].mig.devices[1].profile", "2g.99gb"],
        ),
        (base.replace("numaNode: 1", "numaNod: 1"), &["numaNod"]),
        (
            base.replace(
                "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03",
                "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02",
            ),
            &["gpus[3].uuid", "duplicate"],
        ),
        ("gpus: 7".to_string(), &["invalid node file"]),
    ];
    for (i, (text, needles)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("n{i}.yaml"));
        std::fs::write(&path, text).unwrap();
        let backend = format!("sim:{}", path.display());
        let mut n: Vec<&str> = needles.to_vec();
        let p = path.display().to_string();
        n.push(&p);
        expect_bad(&["inventory", "--backend", &backend], &n);
    }
    expect_bad(
        &["inventory", "--backend", "sim:nope"],
        &["unknown sim profile", "dgx-h100"],
    );
    expect_bad(&["inventory", "--backend", "cuda"], &["unknown backend"]);
}

#[test]
fn topology_flag_prints_the_matrix_and_its_json() {
    let node = root().join("hack/nodes/topo-pcie-dual-socket.yaml");
    let backend = format!("sim:{}", node.display());
    let out = run(&["inventory", "--backend", &backend, "--topology"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNUMA Affinity"
    );
    assert_eq!(lines[1], "GPU0\t X \tPIX\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\t0");
    assert!(text.contains("PIX  = Connection traversing at most a single PCIe bridge"));
    let v = json(&[
        "inventory",
        "--backend",
        &backend,
        "--topology",
        "--format",
        "json",
    ]);
    assert_eq!(v["gpus"][7]["pciBusId"], "0000:48:00.0");
    assert_eq!(v["matrix"][7][6], "PIX");
    let none = json(&[
        "inventory",
        "--backend",
        "sim:dgx-h100",
        "--topology",
        "--format",
        "json",
    ]);
    assert!(none.is_null(), "{none}");
}
