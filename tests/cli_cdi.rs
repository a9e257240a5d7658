//! The CDI commands through the built binary: `cdi validate` rejects every invalid example
//! naming each file, `cdi generate / list / remove` write, list and remove the spec, bad
//! input writes nothing and keeps a good spec, `--dev-root` fills device nodes from the host,
//! and hook settings are checked. (The specs themselves, goldens, schema and Podman rules:
//! `domain::cdi` unit tests.)

use std::fs;
use std::process::{Command, Output};

use gpu_slicer::testkit::cdi_must_reject as must_reject;
use gpu_slicer::testkit::read_cdi_spec;

fn bin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(args)
        .output()
        .expect("run gpu-slicer")
}

#[test]
fn validate_rejects_every_invalid_example() {
    let files = must_reject();
    // Through the binary: non-zero exit, one reason per file.
    let args: Vec<&str> = files.iter().map(|p| p.to_str().expect("utf8")).collect();
    let mut argv = vec!["cdi", "validate"];
    argv.extend(args);
    let out = bin(&argv);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("invalid:")).count(),
        files.len()
    );
}

#[test]
fn generate_writes_lists_and_removes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf8");
    let out = bin(&[
        "cdi",
        "generate",
        "--backend",
        "sim:mixed-a100",
        "--output",
        d,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = dir.path().join("gpu-slicer.io-gpu.yaml");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("wrote "));
    let again = bin(&[
        "cdi",
        "generate",
        "--backend",
        "sim:mixed-a100",
        "--output",
        d,
    ]);
    assert!(String::from_utf8_lossy(&again.stdout).starts_with("unchanged "));
    let list = bin(&["cdi", "list", file.to_str().expect("utf8")]);
    assert!(list.status.success());
    let text = String::from_utf8_lossy(&list.stdout);
    assert_eq!(text.lines().count(), 31);
    assert!(text.contains("gpu-slicer.io/gpu=0:6\n") && text.contains("gpu-slicer.io/gpu=all\n"));
    let rm = bin(&["cdi", "remove", "--output", d]);
    assert!(rm.status.success());
    assert!(!file.exists());
}

/// Bad input: a clear error naming the culprit, nothing written, a good spec left alone.
#[test]
fn bad_input_writes_nothing_and_keeps_the_good_spec() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf8");
    let ok = bin(&[
        "cdi",
        "generate",
        "--backend",
        "sim:mixed-a100",
        "--output",
        d,
    ]);
    assert!(ok.status.success());
    let good = dir.path().join("gpu-slicer.io-gpu.yaml");
    let before = fs::read(&good).expect("good spec");

    let node = dir.path().join("node.yaml");
    let dup = "driverVersion: \"570.124.06\"\ncudaDriverVersion: 12080\ngpus:\n  - {index: 0, uuid: GPU-bad name, product: NVIDIA A100-SXM4-80GB, pciBusId: \"00000000:07:00.0\"}\n";
    fs::write(&node, dup).expect("node file");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--kind".into(), "x/gpu".into()], "x/gpu"),
        (
            vec!["--kind".into(), "gpu-slicer.io/gpu.v2".into()],
            "gpu.v2",
        ),
        (
            vec!["--dev-root".into(), "/does/not/exist".into()],
            "/does/not/exist",
        ),
        (
            vec!["--backend".into(), format!("sim:{}", node.display())],
            "GPU-bad name",
        ),
    ];
    for (extra, culprit) in cases {
        let mut argv: Vec<String> = ["cdi", "generate", "--output", d]
            .iter()
            .map(|s| s.to_string())
            .collect();
        if !extra.contains(&"--backend".to_string()) {
            argv.extend(["--backend".into(), "sim:mixed-a100".into()]);
        }
        argv.extend(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
            .args(&argv)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{argv:?}: {stderr}");
        assert!(stderr.contains(culprit), "{argv:?}: {stderr}");
        assert_eq!(fs::read(&good).expect("still there"), before, "{argv:?}");
        let files: Vec<_> = fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            files.len(),
            2,
            "only the good spec and node.yaml: {files:?}"
        );
    }
}

/// `--dev-root`: hostPath under the root, type/major/minor from the host node (a symlink to
/// /dev/null stands in for a GPU, no root needed), absent control nodes left out.
#[test]
fn dev_root_fills_nodes_from_the_host_and_omits_missing_control_nodes() {
    let root = tempfile::tempdir().expect("tempdir");
    let dev = root.path().join("dev");
    fs::create_dir_all(&dev).expect("mkdir");
    for n in ["nvidia0", "nvidiactl"] {
        std::os::unix::fs::symlink("/dev/null", dev.join(n)).expect("symlink");
    }
    let r = root.path().to_str().expect("utf8");
    let out = bin(&[
        "cdi",
        "generate",
        "--backend",
        "sim:mixed-a100",
        "--dev-root",
        r,
        "--output",
        "-",
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The spec as a runtime loads it (strict parse and checks), in its JSON field names.
    let file = root.path().join("gpu-slicer.io-gpu.json");
    fs::write(&file, &out.stdout).expect("write spec");
    let spec = read_cdi_spec(&file);
    assert_eq!(spec["cdiVersion"], "0.5.0");
    let ctl: Vec<_> = spec["containerEdits"]["deviceNodes"]
        .as_array()
        .expect("control nodes")
        .iter()
        .map(|n| n["path"].as_str().expect("path"))
        .collect();
    assert_eq!(ctl, ["/dev/nvidiactl"]);
    let device = |name: &str| {
        spec["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("{name}"))
            .clone()
    };
    let gpu0 = &device("0")["containerEdits"];
    let n = &gpu0["deviceNodes"][0];
    assert_eq!(
        n["hostPath"].as_str(),
        Some(format!("{r}/dev/nvidia0").as_str())
    );
    assert_eq!(
        (n["type"].as_str(), n["major"].as_i64(), n["minor"].as_i64()),
        (Some("c"), Some(1), Some(3))
    );
    let gpu1 = &device("1")["containerEdits"];
    assert_eq!(
        gpu1["deviceNodes"][0]["type"].as_str(),
        None,
        "absent node: path only"
    );
}

#[test]
fn relative_or_bad_hook_settings_are_refused_naming_them() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/hack/configs/shares.yaml");
    let base = [
        "cdi",
        "generate",
        "--backend",
        "sim:mixed-a100",
        "--config",
        config,
        "--output",
        "-",
    ];
    let out = bin(&[&base[..], &["--cdi-hook-path", "bin/gpu-slicer"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("bin/gpu-slicer") && err.contains("absolute"),
        "{err}"
    );
    let out = bin(&[&base[..], &["--cdi-hook-env", "=x"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("KEY=VALUE"), "{err}");
    // The default is this executable, written as an absolute path into every share device.
    let out = bin(&base);
    assert!(out.status.success());
    let spec = String::from_utf8_lossy(&out.stdout);
    assert!(
        spec.contains(&format!("path: {}", env!("CARGO_BIN_EXE_gpu-slicer"))),
        "{spec}"
    );
}
