//! Files an attacker or another writer controls, met by the writers themselves: planted
//! symlinks at the spec writer's and the hook installer's temp names and targets, a planted
//! FIFO, and nvidia-ctk's file name. Real files in temp dirs. (The same through the built
//! binary: tests/hostile_files.rs.)

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::platform::cdi_writer::{self as cdi, WriteOutcome};
use crate::testkit::STEP;
use crate::testkit::fixtures::file_names as names;

/// A root-owned-style secret: 0600, known content. Returns its path.
fn victim(dir: &Path) -> PathBuf {
    let p = dir.join("victim");
    std::fs::write(&p, "secret\n").expect("victim");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    p
}

fn assert_untouched(victim: &Path) {
    assert_eq!(std::fs::read_to_string(victim).expect("read"), "secret\n");
    let mode = std::fs::metadata(victim).expect("stat").mode() & 0o777;
    assert_eq!(mode, 0o600, "victim was chmodded to {mode:o}");
}

// ---- item 12: temp files -------------------------------------------------------------

#[test]
fn spec_writer_follows_no_planted_symlink() {
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = victim(dir.path());
    let cdi_dir = dir.path().join("cdi");
    std::fs::create_dir(&cdi_dir).expect("cdi dir");
    let name = "gpu-slicer.io-gpu.yaml";
    // Every name the writer could pick predictably: the old `.<file>.<pid>.tmp` for this
    // process (the writer runs in it) and for pid 1 (the agent in a DaemonSet), and pids
    // nearby.
    let me = std::process::id();
    for pid in [1, me, me.saturating_sub(1), me + 1] {
        let planted = cdi_dir.join(format!(".{name}.{pid}.tmp"));
        std::os::unix::fs::symlink(&victim, planted).expect("plant");
    }
    // The target itself as a symlink: replaced, not written through.
    std::os::unix::fs::symlink(&victim, cdi_dir.join(name)).expect("plant target");

    assert_eq!(
        cdi::write_spec(&cdi_dir, name, b"kind: x\n").expect("write"),
        WriteOutcome::Written
    );
    assert_untouched(&victim);
    let target = cdi_dir.join(name);
    let meta = std::fs::symlink_metadata(&target).expect("stat");
    assert!(meta.is_file(), "target is now our regular file");
    assert_eq!(meta.mode() & 0o777, 0o644);
    assert_eq!(std::fs::read(&target).expect("read"), b"kind: x\n");
    // Only the planted links and our file: no temp file left behind.
    assert_eq!(names(&cdi_dir).len(), 5, "{:?}", names(&cdi_dir));
}

#[test]
fn spec_writer_does_not_read_a_planted_fifo() {
    let dir = tempfile::tempdir().expect("tempdir");
    let name = "gpu-slicer.io-gpu.json";
    nix::unistd::mkfifo(&dir.path().join(name), nix::sys::stat::Mode::S_IRWXU).expect("fifo");
    // Reading a FIFO with no writer would block forever; the writer must replace it. It
    // runs on its own thread so a blocked writer fails this test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let at = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(cdi::write_spec(&at, name, b"{}\n").map_err(|e| e.to_string()));
    });
    let outcome = rx
        .recv_timeout(STEP)
        .expect("the writer blocked on a planted FIFO");
    assert_eq!(outcome.expect("write"), WriteOutcome::Written);
    assert_eq!(std::fs::read(dir.path().join(name)).expect("read"), b"{}\n");
}

#[test]
fn hook_install_follows_no_planted_symlink() {
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = victim(dir.path());
    let to = dir.path().join("bin");
    std::fs::create_dir(&to).expect("bin dir");
    let me = std::process::id();
    for pid in [1, me, me.saturating_sub(1), me + 1] {
        let planted = to.join(format!(".gpu-slicer.{pid}.tmp"));
        std::os::unix::fs::symlink(&victim, planted).expect("plant");
    }
    std::os::unix::fs::symlink(&victim, to.join("gpu-slicer")).expect("plant target");
    // Any executable file stands in for the binary (a unit test has none built).
    let exe = std::env::current_exe().expect("test binary");
    let exe = exe.as_path();
    let installed = crate::cli::cdi_hook::install(exe, &to).expect("install");
    assert_untouched(&victim);
    let meta = std::fs::symlink_metadata(&installed).expect("stat");
    assert!(meta.is_file());
    assert_eq!(meta.mode() & 0o777, 0o755);
    assert_eq!(meta.len(), std::fs::metadata(exe).expect("exe").len());
    assert_eq!(names(&to).len(), 5, "{:?}", names(&to));
}

#[test]
fn nvidia_ctk_file_name_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    // nvidia-ctk's default file name is refused whatever asks for it.
    let err = cdi::write_spec(dir.path(), "nvidia.yaml", b"x").expect_err("nvidia.yaml");
    assert!(err.to_string().contains("nvidia.yaml"), "{err}");
}
