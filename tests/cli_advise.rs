//! `gpu-slicer advise` as a user runs it: on the committed 64-GPU export
//! (`tests/fixtures/advise/fleet-64.json`, made by `gpu_slicer::bench::advise_fleet`), the
//! plan, report and summary it writes; the same bytes twice; the plan accepted by the
//! binary's own `inventory --config` (each pool config on a node of its model) and
//! `mig apply --dry-run` (each layout); bad input exits 2 naming the file and field.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_slicer::testkit::temp_dir;

const FIXTURE: &str = "tests/fixtures/advise/fleet-64.json";

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"));
    c.env_remove("RUST_LOG");
    c
}

fn run_advise(out: &Path, extra: &[&str]) -> std::process::Output {
    let o = bin()
        .args(["advise", "--from-file", FIXTURE, "--output"])
        .arg(out.join("plan"))
        .arg("--report")
        .arg(out.join("report.html"))
        .arg("--summary-json")
        .arg(out.join("summary.json"))
        .args(extra)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "advise failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    out
}

#[test]
fn the_fixture_is_the_generators_output() {
    let generated = gpu_slicer::bench::advise_fleet(64, 4, 7);
    if std::env::var_os("ADVISE_WRITE_FIXTURE").is_some() {
        std::fs::write(FIXTURE, &generated).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(FIXTURE).unwrap(),
        generated,
        "regenerate with ADVISE_WRITE_FIXTURE=1 cargo test --test cli_advise"
    );
}

#[test]
fn advise_frees_gpus_without_starving_anyone_and_says_so() {
    let dir = temp_dir();
    let o = run_advise(dir.path(), &["--gpu-hour-price", "2.5"]);
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(stdout.starts_with("GPUs: "), "{stdout}");
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).unwrap()).unwrap();
    let (before, after, bound) = (
        s["gpusBefore"].as_u64().unwrap(),
        s["gpusAfter"].as_u64().unwrap(),
        s["lowerBound"].as_u64().unwrap(),
    );
    assert_eq!(before, 60, "64 GPUs, one in 16 idle");
    assert!(after * 2 < before, "{after} of {before}");
    assert!(bound <= after);
    // Within 10 % of the lower bound (the issue's fleet check), give or take the one GPU a
    // bound of 15 rounds to.
    assert!(
        after as f64 <= bound as f64 * 1.1 + 1.0,
        "{after} vs bound {bound}"
    );
    assert!(s["savingsPerMonth"].as_f64().unwrap() > 0.0);
    let workloads = s["workloads"].as_array().unwrap();
    assert!(!workloads.is_empty());
    let mut classes = BTreeMap::new();
    for w in workloads {
        for key in ["namespace", "name", "class", "gpuModel", "share", "reason"] {
            assert!(w[key].is_string(), "{key} in {w}");
        }
        let peak = w["peakMemoryBytes"].as_u64().unwrap();
        let grant = w["grantMemoryBytes"].as_u64().unwrap();
        assert!(grant >= peak, "{w}");
        *classes
            .entry(w["class"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    // Mostly shared, some training, some kept (bursty or short history) with a warning each.
    assert!(classes["shared"] > classes["training"], "{classes:?}");
    assert!(classes.contains_key("kept"), "{classes:?}");
    assert_eq!(s["warnings"].as_array().unwrap().len(), classes["kept"]);
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(html.contains("<svg") && !html.contains("<script"));
}

#[test]
fn the_same_data_gives_the_same_bytes() {
    let (a, b) = (temp_dir(), temp_dir());
    run_advise(a.path(), &["--dra"]);
    run_advise(b.path(), &["--dra"]);
    let (fa, fb) = (files(a.path()), files(b.path()));
    assert!(fa.keys().any(|k| k.ends_with("claim-templates.yaml")));
    assert!(fa.keys().any(|k| k.ends_with("kustomization.yaml")));
    assert_eq!(fa, fb);
}

fn node_file(dir: &Path, product: &str, mig: bool) -> PathBuf {
    let mut s = format!(
        "name: advise-{}\ngpus:\n",
        if mig { "mig" } else { "plain" }
    );
    for i in 0..8 {
        s.push_str(&format!(
            "  - index: {i}\n    uuid: GPU-a0a00000-0000-4000-8000-00000000000{i}\n    product: {product}\n    pciBusId: \"0000:1{i}:00.0\"\n"
        ));
        if mig {
            s.push_str("    mig:\n      enabled: true\n");
        }
    }
    let p = dir.join(format!(
        "{}-{}.yaml",
        product.replace(' ', "_"),
        if mig { "mig" } else { "plain" }
    ));
    std::fs::write(&p, s).unwrap();
    p
}

#[test]
fn the_plan_loads_in_the_binarys_own_parsers() {
    let dir = temp_dir();
    run_advise(dir.path(), &[]);
    let plan = dir.path().join("plan");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).unwrap()).unwrap();
    let labels = std::fs::read_to_string(plan.join("node-labels.yaml")).unwrap();
    assert!(labels.contains("nvidia.com/device-plugin.config"));
    let models = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"];
    let mut checked = 0;
    for pool in summary["pools"].as_array().unwrap() {
        let name = pool["name"].as_str().unwrap();
        let product = if name.starts_with("h100") {
            models[0]
        } else {
            models[1]
        };
        let config = plan.join("configs").join(format!("{name}.yaml"));
        // The config serves on a node of its model (MIG GPUs of the pool stay whole here:
        // the sim node has MIG off, which the config must also accept).
        let o = bin()
            .args(["inventory", "--backend"])
            .arg(format!(
                "sim:{}",
                node_file(dir.path(), product, false).display()
            ))
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{name}: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            std::fs::read_to_string(&config).unwrap()
        );
        let text = std::fs::read_to_string(&config).unwrap();
        if text.contains("migLayouts") {
            let o = bin()
                .args(["mig", "apply", "--backend"])
                .arg(format!(
                    "sim:{}",
                    node_file(dir.path(), product, true).display()
                ))
                .arg("--config-file")
                .arg(plan.join("mig-parted.yaml"))
                .args(["--layout", name, "--dry-run"])
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "{name}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        checked += 1;
    }
    assert!(checked > 0);
}

#[test]
fn bad_input_exits_2_naming_the_file_and_field() {
    let dir = temp_dir();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"version":"v1","windowSeconds":1,"gpus":[],"pods":[{"namespace":"a"}]}"#,
    )
    .unwrap();
    let o = bin()
        .args(["advise", "--from-file"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.json") && err.contains("pods[0]"), "{err}");
    let o = bin()
        .args([
            "advise",
            "--from-file",
            FIXTURE,
            "--memory-headroom",
            "lots",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--memory-headroom"));
    let o = bin().args(["advise"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
}
