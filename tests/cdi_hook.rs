//! `gpu-slicer cdi-hook set-memory-limit` as the runtime runs it: any failure is a non-zero
//! exit with one line on stderr, so the container never starts unlimited.

use std::io::Write;
use std::process::{Command, Stdio};

fn hook(args: &[&str], stdin: &str) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["cdi-hook", "set-memory-limit"])
        .args(args)
        .env("RUST_LOG", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A hook that refuses its arguments exits before reading stdin: a broken pipe here is
    // that refusal, which the caller checks through the exit code.
    if let Err(e) = child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "stdin: {e}");
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn failures_exit_non_zero_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    let cg = dir.path().join("cgroup");
    std::fs::create_dir_all(proc_root.join("77")).unwrap();
    std::fs::write(proc_root.join("77/cgroup"), "0::/c1\n").unwrap();
    std::fs::create_dir_all(cg.join("c1")).unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "").unwrap();
    let state = r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":77,"bundle":"/b"}"#;
    let p = proc_root.to_str().unwrap();
    let c = cg.to_str().unwrap();
    let lib = dir.path().join("libnvidia-ml.so.1");
    let l = lib.to_str().unwrap();
    let base = [
        "--device",
        "GPU-1",
        "--bytes",
        "1024",
        "--proc-root",
        p,
        "--cgroup-root",
        c,
    ];

    // Everything resolves; the NVML library is missing.
    let (code, err) = hook(&[&base[..], &["--nvml-lib", l]].concat(), state);
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("cannot load NVML"), "{err}");

    let (code, err) = hook(&[&base[..], &["--nvml-lib", l]].concat(), "not json");
    assert_ne!(code, 0);
    assert!(err.contains("invalid OCI state"), "{err}");

    let mig = [
        "--device",
        "MIG-1",
        "--bytes",
        "1",
        "--proc-root",
        p,
        "--cgroup-root",
        c,
    ];
    let (code, err) = hook(&mig, state);
    assert_ne!(code, 0);
    assert!(err.contains("MIG"), "{err}");
}

#[test]
fn install_puts_a_runnable_copy_in_the_host_directory() {
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("opt/gpu-slicer/bin");
    for round in 0..2 {
        // The second round replaces the first install in place.
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
            .args(["cdi-hook", "install", "--to"])
            .arg(&to)
            .output()
            .unwrap();
        assert!(out.status.success(), "round {round}: {out:?}");
        let installed = to.join("gpu-slicer");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            installed.display().to_string()
        );
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(&installed).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o755);
        assert_eq!(
            std::fs::read(&installed).unwrap(),
            std::fs::read(env!("CARGO_BIN_EXE_gpu-slicer")).unwrap()
        );
        let help = Command::new(&installed)
            .args(["cdi-hook", "set-memory-limit", "--help"])
            .output()
            .unwrap();
        assert!(help.status.success());
        // Only the binary: no temp file left behind.
        assert_eq!(std::fs::read_dir(&to).unwrap().count(), 1);
    }
    // A target that cannot be a directory is refused, naming it.
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["cdi-hook", "install", "--to"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot create") && stderr.contains("plain-file"),
        "{out:?}"
    );
}
