//! Files an attacker or another writer controls, through the built binary: a spec of the
//! same kind in the other format, other vendors' kinds and file names, a world-writable
//! config, and the memory hook's bad inputs (`--bytes 0`, a cgroup-v1-only host). Real files
//! in temp dirs. (Planted symlinks and FIFOs at the writers' temp names and targets: the
//! `platform::cdi_writer` unit tests.)

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use gpu_slicer::testkit::file_names as names;
use gpu_slicer::testkit::read_cdi_spec;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"));
    c.env("RUST_LOG", "warn").env_remove("CONFIG_FILE");
    c
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run gpu-slicer")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

// ---- item 8: one spec file per kind ---------------------------------------------------

fn generate(out_dir: &Path, format: &str) -> Output {
    run(bin()
        .args([
            "cdi",
            "generate",
            "--backend",
            "sim:mixed-a100",
            "--format",
            format,
        ])
        .arg("--output")
        .arg(out_dir))
}

#[test]
fn generating_one_format_removes_the_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cdi_dir = dir.path().join("cdi");
    // Someone else's spec in the same directory stays.
    std::fs::create_dir(&cdi_dir).expect("cdi dir");
    std::fs::write(cdi_dir.join("example.com-net.yaml"), "other\n").expect("other");

    for (format, other) in [("yaml", "json"), ("json", "yaml"), ("yaml", "json")] {
        let out = generate(&cdi_dir, format);
        assert!(out.status.success(), "{format}: {out:?}");
        assert_eq!(
            names(&cdi_dir),
            vec![
                "example.com-net.yaml".to_string(),
                format!("gpu-slicer.io-gpu.{format}")
            ],
            "after writing {format} the {other} file must be gone"
        );
        // A valid spec.
        read_cdi_spec(&cdi_dir.join(format!("gpu-slicer.io-gpu.{format}")));
    }
    // Unchanged content, but a stale twin planted since: the twin still goes.
    std::fs::copy(
        cdi_dir.join("gpu-slicer.io-gpu.yaml"),
        cdi_dir.join("gpu-slicer.io-gpu.json"),
    )
    .expect("plant twin");
    let out = generate(&cdi_dir, "yaml");
    assert!(text(&out.stdout).starts_with("unchanged"), "{out:?}");
    assert!(!cdi_dir.join("gpu-slicer.io-gpu.json").exists());
    assert_eq!(
        std::fs::read_to_string(cdi_dir.join("example.com-net.yaml")).expect("other"),
        "other\n"
    );
}

#[test]
fn cdi_remove_removes_both_formats() {
    let dir = tempfile::tempdir().expect("tempdir");
    for format in ["yaml", "json"] {
        std::fs::write(dir.path().join(format!("gpu-slicer.io-gpu.{format}")), "x").expect("w");
    }
    std::fs::write(dir.path().join("example.com-net.json"), "other").expect("other");
    let out = run(bin().args(["cdi", "remove", "--output"]).arg(dir.path()));
    assert!(out.status.success(), "{out:?}");
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("removed") && stdout.contains("gpu-slicer.io-gpu.yaml"),
        "{stdout}"
    );
    assert!(stdout.contains("gpu-slicer.io-gpu.json"), "{stdout}");
    assert_eq!(names(dir.path()), vec!["example.com-net.json".to_string()]);
    // `--format json` with only the YAML file there removes it too.
    std::fs::write(dir.path().join("gpu-slicer.io-gpu.yaml"), "x").expect("w");
    let out = run(bin()
        .args(["cdi", "remove", "--format", "json", "--output"])
        .arg(dir.path()));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(names(dir.path()), vec!["example.com-net.json".to_string()]);
    let out = run(bin().args(["cdi", "remove", "--output"]).arg(dir.path()));
    assert!(text(&out.stdout).starts_with("absent"), "{out:?}");
}

// ---- item 13: other writers' kinds and names, world-writable config -------------------

#[test]
fn other_vendors_kinds_are_refused_naming_field_and_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    // nvidia-ctk's and NVIDIA's plugin's files, as they would be on a node.
    let theirs = [
        ("nvidia.com/gpu", "nvidia.com-gpu.yaml"),
        (
            "k8s.device-plugin.nvidia.com/gpu",
            "k8s.device-plugin.nvidia.com-gpu.yaml",
        ),
        (
            "management.nvidia.com/gpu",
            "management.nvidia.com-gpu.yaml",
        ),
    ];
    for (kind, file) in theirs {
        std::fs::write(dir.path().join(file), "theirs\n").expect("theirs");
        // From the config file.
        let cfg = dir.path().join("config.yaml");
        std::fs::write(
            &cfg,
            format!("version: v1\nflags:\n  plugin:\n    cdiKind: {kind}\n"),
        )
        .expect("config");
        let out = generate_with(&["--config", cfg.to_str().expect("utf-8")], dir.path());
        assert_eq!(out.status.code(), Some(2), "{kind}: {out:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains("cdiKind") && err.contains(kind) && err.contains("NVIDIA"),
            "{err}"
        );
        // From the command line.
        let out = generate_with(&["--kind", kind], dir.path());
        assert_ne!(out.status.code(), Some(0), "{kind}: {out:?}");
        assert!(text(&out.stderr).contains(kind), "{out:?}");
        // `cdi remove` does not touch their file either.
        let out = run(bin()
            .args(["cdi", "remove", "--kind", kind, "--output"])
            .arg(dir.path()));
        assert_ne!(out.status.code(), Some(0), "{kind}: {out:?}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(file)).expect("theirs"),
            "theirs\n",
            "{file} was overwritten"
        );
    }
    // nvidia-ctk's default file name is refused by the spec writer itself: the
    // `platform::cdi_writer` unit tests.
}

fn generate_with(args: &[&str], out_dir: &Path) -> Output {
    run(bin()
        .args(["cdi", "generate", "--backend", "sim:mixed-a100"])
        .args(args)
        .arg("--output")
        .arg(out_dir))
}

#[test]
fn a_world_writable_config_is_warned_about() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "version: v1\n").expect("config");
    let args = ["--config", cfg.to_str().expect("utf-8")];
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = run(bin()
        .args([
            "cdi",
            "generate",
            "--backend",
            "sim:mixed-a100",
            "--output",
            "-",
        ])
        .args(args));
    assert!(out.status.success(), "{out:?}");
    assert!(!text(&out.stderr).contains("world-writable"), "{out:?}");
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let out = run(bin()
        .args([
            "cdi",
            "generate",
            "--backend",
            "sim:mixed-a100",
            "--output",
            "-",
        ])
        .args(args));
    assert!(out.status.success(), "a warning, not a refusal: {out:?}");
    let err = text(&out.stderr);
    assert!(
        err.contains("world-writable") && err.contains("config.yaml") && err.contains("0666"),
        "{err}"
    );
}

// ---- item 14: the memory hook ---------------------------------------------------------

const UUID: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e00";

struct HookHost {
    dir: tempfile::TempDir,
}

impl HookHost {
    /// A proc root with pid 77 in `cgroup_line`, and a cgroup root with `dirs`.
    fn new(cgroup_line: &str, dirs: &[&str], files: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc_pid = dir.path().join("proc/77");
        std::fs::create_dir_all(&proc_pid).expect("proc");
        std::fs::write(proc_pid.join("cgroup"), cgroup_line).expect("cgroup");
        for d in dirs {
            std::fs::create_dir_all(dir.path().join("cg").join(d)).expect("cg dir");
        }
        for f in files {
            std::fs::write(dir.path().join("cg").join(f), "").expect("cg file");
        }
        Self { dir }
    }

    fn limits(&self) -> PathBuf {
        self.dir.path().join("limits.json")
    }

    fn hook(&self, bytes: &str) -> Output {
        let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/nodes/mixed-a100.yaml");
        let state =
            r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":77,"bundle":"/b"}"#;
        let mut child = bin()
            .args([
                "cdi-hook",
                "set-memory-limit",
                "--device",
                UUID,
                "--bytes",
                bytes,
            ])
            .arg("--nvml-lib")
            .arg(common::fake_lib())
            .arg("--proc-root")
            .arg(self.dir.path().join("proc"))
            .arg("--cgroup-root")
            .arg(self.dir.path().join("cg"))
            .env("FAKE_NVML_NODE", node)
            .env("FAKE_NVML_LIMITS_FILE", self.limits())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hook");
        use std::io::Write;
        // A hook that refuses its arguments exits before reading its stdin: a broken pipe
        // here is that refusal, which the caller checks.
        if let Err(e) = child
            .stdin
            .take()
            .expect("stdin")
            .write_all(state.as_bytes())
        {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "state: {e}");
        }
        child.wait_with_output().expect("hook")
    }
}

#[test]
fn memory_hook_refuses_zero_bytes() {
    let host = HookHost::new("0::/pods/c1\n", &["pods/c1"], &["cgroup.controllers"]);
    // Control: the same host and fake driver accept a real limit.
    let ok = host.hook("1073741824");
    assert!(ok.status.success(), "{ok:?}");
    std::fs::remove_file(host.limits()).expect("limits recorded");
    let out = host.hook("0");
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    let err = text(&out.stderr);
    assert!(err.contains("--bytes") && err.contains('0'), "{err}");
    assert!(!host.limits().exists(), "nothing was limited");
}

#[test]
fn memory_hook_fails_closed_on_a_cgroup_v1_only_host() {
    // A legacy (v1-only) host: no `0::` line, a memory controller hierarchy.
    let host = HookHost::new(
        "7:memory:/kubepods/pod1/c1\n1:name=systemd:/kubepods/pod1/c1\n",
        &["memory/kubepods/pod1/c1"],
        &[],
    );
    let out = host.hook("1073741824");
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    let err = text(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("cgroup v2") && err.contains("memory/kubepods/pod1/c1"),
        "{err}"
    );
    assert!(!host.limits().exists(), "the v1 path reached the driver");
}
