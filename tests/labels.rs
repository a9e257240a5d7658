//! Node labels end to end: the built daemon writes the NFD feature file named by
//! `LABELS_FILE`, rewrites it when a config reload or a re-scan (MIG change) changes the
//! labels, removes it on SIGTERM; `gpu-slicer labels` prints the same set (the sample in
//! docs/src/fleets.md).
//! (The `--labels-file` default: `cli::run` unit tests.)

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::{STEP, short_tempdir, wait_until, within};
use gpu_slicer::testkit::KubeletEmulator;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Replace a file the way editors and `kubectl cp` do: write aside, rename over.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// Poll `path` until `pred` holds for its content (or it is absent, as `None`).
async fn wait_file(what: &str, path: &Path, pred: impl Fn(Option<&str>) -> bool) -> Option<String> {
    wait_until(STEP, || async {
        let text = std::fs::read_to_string(path).ok();
        pred(text.as_deref()).then_some(text)
    })
    .await
    .unwrap_or_else(|| panic!("timed out: {what}"))
}

#[tokio::test]
async fn daemon_writes_rewrites_and_removes_the_labels_file() {
    let dir = short_tempdir();
    let emulator = KubeletEmulator::start(dir.path().join("dp"))
        .await
        .expect("emulator");
    let config = dir.path().join("config.yaml");
    std::fs::copy(root().join("hack/configs/mixed.yaml"), &config).unwrap();
    // run_command sets LABELS_FILE to <dir>/features.d/gpu-slicer; the directory does not
    // exist yet (a host without NFD): the daemon creates it.
    let labels = dir.path().join("features.d").join("gpu-slicer");
    assert!(!labels.parent().unwrap().exists());
    // A node file, so a re-scan (SIGHUP) sees an edited MIG layout.
    let node = dir.path().join("node.yaml");
    std::fs::copy(root().join("hack/nodes/mixed-a100.yaml"), &node).unwrap();
    let backend = format!("sim:{}", node.display());
    let mut child = common::run_command(dir.path(), &backend, &config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());

    let golden =
        std::fs::read_to_string(root().join("tests/golden/labels-mixed-a100.txt")).expect("golden");
    let text = wait_file("labels written", &labels, |t| t.is_some())
        .await
        .unwrap();
    assert_eq!(text, golden, "the daemon's file is the golden set");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&labels).unwrap().mode() & 0o777, 0o644);

    // Time-slice the whole GPUs 4 ways: a reload rewrites the file with GFD's shared labels.
    replace(
        &config,
        &std::fs::read_to_string(root().join("hack/configs/mixed-timeslicing.yaml")).unwrap(),
    );
    let text = wait_file("labels rewritten", &labels, |t| {
        t.is_some_and(|t| t.contains("nvidia.com/gpu.replicas=4"))
    })
    .await
    .unwrap();
    for line in [
        "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB-SHARED",
        "nvidia.com/gpu.sharing-strategy=time-slicing",
        "nvidia.com/gpu.count=4",
        "nvidia.com/mig-1g.10gb.replicas=1",
        "gpu-slicer.io/isolation=none",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
    // Memory-limited shares: the isolation label follows.
    replace(
        &config,
        "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2, isolation: memory}\n",
    );
    wait_file("isolation label", &labels, |t| {
        t.is_some_and(|t| t.contains("gpu-slicer.io/isolation=memory\n"))
    })
    .await;
    // A MIG change: GPU 1's last 1g.10gb slice destroyed; SIGHUP re-scans.
    let text = std::fs::read_to_string(&node).unwrap();
    let slice = "        - {uuid: MIG-2c3d4e5f-0000-4b00-8000-00000000000a, profile: 1g.10gb, gpuInstanceId: 10}\n";
    assert!(text.contains(slice));
    replace(&node, &text.replace(slice, ""));
    kill(pid, Signal::SIGHUP).unwrap();
    wait_file("MIG change relabelled", &labels, |t| {
        t.is_some_and(|t| t.contains("nvidia.com/mig-1g.10gb.count=8\n"))
    })
    .await;
    // Nothing but the file in the directory: no temp files left for NFD to read.
    let names: Vec<_> = std::fs::read_dir(labels.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("gpu-slicer")]);

    kill(pid, Signal::SIGTERM).unwrap();
    let status = within("exit", child.wait()).await.unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!labels.exists(), "labels removed on shutdown, as GFD does");
    emulator.shutdown().await;
}

#[test]
fn labels_command_prints_the_golden_set_and_writes_files() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["labels", "--backend", "sim:mixed-a100", "--config"])
        .arg(root().join("hack/configs/mixed.yaml"))
        .env_remove("MIG_STRATEGY")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let golden = std::fs::read(root().join("tests/golden/labels-mixed-a100.txt")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&golden)
    );

    // GFD's `--output-file` form: written atomically, same bytes.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpu-slicer");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args([
            "labels",
            "--backend",
            "sim:mixed-a100",
            "--mig-strategy",
            "mixed",
            "-o",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&file).unwrap(), golden);
    assert!(out.stdout.is_empty());
}

#[test]
fn labels_command_refuses_a_config_that_does_not_fit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args([
            "labels",
            "--backend",
            "sim:mixed-a100",
            "--mig-strategy",
            "single",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("migStrategy") && stderr.contains("single"),
        "{stderr}"
    );
}

#[test]
fn the_book_shows_the_golden_file_and_selects_pools_by_real_labels() {
    // The labels chapter of the book (docs/src/fleets.md, "Node labels"), once the README's.
    let chapter = std::fs::read_to_string(root().join("docs/src/fleets.md")).unwrap();
    let golden =
        std::fs::read_to_string(root().join("tests/golden/labels-mixed-a100.txt")).unwrap();
    assert!(
        chapter.contains(&format!("```\n{golden}```")),
        "docs/src/fleets.md's sample labels file differs from tests/golden/labels-mixed-a100.txt"
    );
    let keys: Vec<&str> = golden
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, _)| k)
        .collect();
    let start = chapter.find("# Training:").expect("pool example");
    let block = &chapter[start..start + chapter[start..].find("```").unwrap()];
    let mut used = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(block) {
        let pod = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(doc).expect("yaml");
        let spec = &pod["spec"];
        if let Some(sel) = spec["nodeSelector"].as_mapping() {
            used.extend(sel.keys().map(|k| k.as_str().unwrap().to_string()));
        }
        let terms = &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        for term in terms.as_sequence().into_iter().flatten() {
            for e in term["matchExpressions"].as_sequence().into_iter().flatten() {
                used.push(e["key"].as_str().unwrap().to_string());
            }
        }
    }
    assert!(used.len() >= 5, "{used:?}");
    for key in &used {
        assert!(
            keys.contains(&key.as_str()),
            "docs/src/fleets.md selects on {key}, which is no label"
        );
    }
}

/// Bad input: an output path that names no file, and a bad sampling interval for `run`, are
/// refused with exit code 2 and a message naming the path or the flag and the value.
#[test]
fn bad_labels_path_and_bad_usage_durations_are_input_errors() {
    let bin = env!("CARGO_BIN_EXE_gpu-slicer");
    let out = std::process::Command::new(bin)
        .args([
            "labels",
            "--backend",
            "sim:mixed-a100",
            "--output-file",
            "/",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("labels file /: not a file path"), "{err}");

    for flag in ["--usage-interval", "--idle-window"] {
        let out = std::process::Command::new(bin)
            .args(["run", "--backend=sim:mixed-a100", flag, "10 fortnights"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(
            err.contains(flag) && err.contains("`10 fortnights` is not a duration"),
            "{flag}: {err}"
        );
    }
}
