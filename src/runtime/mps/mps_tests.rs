//! MPS supervisor end to end with `hack/fake-mps-control`: one daemon per shared device on
//! the mixed-a100 sim node (a MIG profile and whole GPUs), the right environment and
//! default limits, restart after a crash, and `quit` on cancellation; each daemon on a
//! size-bounded `/dev/shm` of its own, removed when it stops (needs root, as CI runs).
//! (`gpu-slicer run` without `CAP_SYS_ADMIN`: tests/cli_mps.rs.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::domain::config::{self, Overrides};
use crate::domain::inventory::Backend;
use crate::domain::mps::{self, DaemonSpec};
use crate::domain::plan;
use crate::platform::mps_shm;
use crate::platform::sim::SimBackend;
use crate::runtime::mps::daemon::{DaemonState, DaemonStates, Supervisor, SupervisorConfig};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const WAIT: Duration = Duration::from_secs(20);

/// Size bound of the daemons' /dev/shm in these tests.
const SHM: u64 = 8 << 20;

fn daemons(root: &Path) -> Vec<DaemonSpec> {
    let text = format!(
        "flags: {{migStrategy: mixed, mpsRoot: {}}}
sharing:
  timeSlicing:
    resources:
    - {{name: nvidia.com/mig-1g.10gb, replicas: 2}}
  mps:
    resources:
    - {{name: nvidia.com/mig-3g.40gb, replicas: 2}}
    - {{name: nvidia.com/gpu, replicas: 4}}
",
        root.display()
    );
    let cfg = config::parse(&text, "mps.yaml", &Overrides::default()).unwrap();
    let inv = SimBackend::open("mixed-a100").unwrap().discover().unwrap();
    let plan = plan::build(&inv, &cfg).unwrap();
    mps::daemons_for(&plan, &cfg).unwrap()
}

fn fake() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("hack/fake-mps-control")
}

async fn wait_for(
    rx: &mut watch::Receiver<DaemonStates>,
    what: &str,
    f: impl FnMut(&DaemonStates) -> bool,
) {
    let ok = matches!(tokio::time::timeout(WAIT, rx.wait_for(f)).await, Ok(Ok(_)));
    assert!(ok, "timed out waiting for {what}: {:?}", *rx.borrow());
}

fn pid_of(spec: &DaemonSpec) -> i32 {
    let text = std::fs::read_to_string(spec.pipe_dir.join("nvidia-cuda-mps-control.pid")).unwrap();
    text.trim().parse().unwrap()
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// Every daemon's `/dev/shm` is its own tmpfs of `size` bytes: the fake daemon's marker
/// (`<pid> <uuid>`) is in its daemon's directory, and nowhere else.
fn assert_own_shm(specs: &[DaemonSpec], size: u64) {
    for spec in specs {
        assert_eq!(
            mps_shm::mounted_size(&spec.shm_dir).unwrap(),
            Some(size),
            "{}: no tmpfs of ours at {}",
            spec.uuid,
            spec.shm_dir.display()
        );
        assert_eq!(
            read(spec.shm_dir.join("fake-mps-daemon")),
            format!("{} {}\n", pid_of(spec), spec.uuid),
            "the daemon's /dev/shm is {}",
            spec.shm_dir.display()
        );
    }
    // The host's /dev/shm never saw a daemon (each ran in its own mount namespace).
    assert!(!Path::new("/dev/shm/fake-mps-daemon").exists());
}

/// The shm directories are gone: unmounted and removed.
fn assert_shm_removed(specs: &[DaemonSpec]) {
    for spec in specs {
        assert_eq!(mps_shm::mounted_size(&spec.shm_dir).unwrap(), None);
        assert!(!spec.shm_dir.exists(), "{} left", spec.shm_dir.display());
    }
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_start_configure_restart_and_quit() {
    let dir = tempfile::tempdir().unwrap();
    let specs = daemons(dir.path());
    let uuids: Vec<&str> = specs.iter().map(|d| d.uuid.as_str()).collect();
    assert_eq!(
        uuids,
        vec![
            "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02",
            "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03",
            "MIG-2c3d4e5f-0000-4b00-8000-000000000002",
        ]
    );

    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let config = SupervisorConfig {
        control_bin: fake(),
        backoff_base: Duration::from_millis(50),
        backoff_max: Duration::from_millis(400),
        shm_size_bytes: SHM,
        ..SupervisorConfig::default()
    };
    let sup = Supervisor::start(specs.clone(), config, &tracker, cancel.clone());
    sup.wait_up(WAIT).await.unwrap();
    assert_own_shm(&specs, SHM);
    // The bound holds: a tenant cannot write more than SHM bytes into its /dev/shm.
    let big = specs[0].shm_dir.join("big");
    let err = std::fs::write(&big, vec![1u8; SHM as usize + 4096]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(nix::libc::ENOSPC), "{err}");
    std::fs::remove_file(&big).unwrap();

    for spec in &specs {
        let env = read(spec.log_dir.join("daemon.env"));
        assert!(
            env.contains(&format!("CUDA_VISIBLE_DEVICES={}\n", spec.uuid)),
            "{env}"
        );
        assert!(env.contains(&format!(
            "CUDA_MPS_PIPE_DIRECTORY={}\n",
            spec.pipe_dir.display()
        )));
        let log = read(spec.log_dir.join("commands.log"));
        for command in spec.default_limit_commands() {
            assert!(log.lines().any(|l| l == command), "{command} not in {log}");
        }
    }
    let mig = &specs[2];
    let log = read(mig.log_dir.join("commands.log"));
    assert!(
        log.contains("set_default_active_thread_percentage 50\n"),
        "{log}"
    );
    assert!(
        log.contains("set_default_device_pinned_mem_limit 0 20480M\n"),
        "{log}"
    );
    let gpu_log = read(specs[0].log_dir.join("commands.log"));
    assert!(
        gpu_log.contains("set_default_active_thread_percentage 25\n"),
        "{gpu_log}"
    );

    // Crash the MIG daemon: Down, then Up again with a new process and the limits resent.
    let mut rx = sup.states();
    let old = pid_of(mig);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let uuid = mig.uuid.clone();
    wait_for(&mut rx, "Down after the crash", |s| {
        matches!(s.get(&uuid), Some(DaemonState::Down { .. }))
    })
    .await;
    if let Some(DaemonState::Down { reason }) = rx.borrow().get(&uuid) {
        assert!(reason.contains("signal 9"), "{reason}");
    }
    // The other daemons are unaffected.
    assert!(rx.borrow().get(&specs[0].uuid).is_some_and(|s| s.is_up()));
    wait_for(&mut rx, "Up after the restart", |s| {
        s.get(&uuid).is_some_and(|d| d.is_up())
    })
    .await;
    let new = pid_of(mig);
    assert_ne!(old, new);
    assert!(alive(new));
    // The restarted daemon is back on the same tmpfs.
    assert_own_shm(std::slice::from_ref(mig), SHM);
    let log = read(mig.log_dir.join("commands.log"));
    assert_eq!(
        log.matches("set_default_active_thread_percentage 50\n")
            .count(),
        2,
        "{log}"
    );

    // Cancellation: quit recorded, processes gone, every state Down.
    let pids: BTreeMap<String, i32> = specs.iter().map(|s| (s.uuid.clone(), pid_of(s))).collect();
    cancel.cancel();
    tracker.close();
    tokio::time::timeout(WAIT, tracker.wait()).await.unwrap();
    for spec in &specs {
        let log = read(spec.log_dir.join("commands.log"));
        assert!(log.lines().any(|l| l == "quit"), "{log}");
        assert!(!alive(pids[&spec.uuid]), "{} still running", spec.uuid);
    }
    assert!(sup.states().borrow().values().all(|s| !s.is_up()));
    assert_shm_removed(&specs);
}

/// A supervisor replacing another for the same devices (what a reload with new settings
/// does) starts only after the old one stopped: the old task's clean-up must not take
/// the new daemon's /dev/shm away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_daemon_keeps_its_shm_when_the_old_one_stops() {
    let dir = tempfile::tempdir().unwrap();
    let specs = daemons(dir.path());
    let tracker = TaskTracker::new();
    let config = SupervisorConfig {
        control_bin: fake(),
        backoff_base: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        shm_size_bytes: SHM,
        ..SupervisorConfig::default()
    };
    let old_token = CancellationToken::new();
    let old = Supervisor::start(specs.clone(), config.clone(), &tracker, old_token.clone());
    old.wait_up(WAIT).await.unwrap();
    let old_pids: Vec<i32> = specs.iter().map(pid_of).collect();
    old_token.cancel();
    let token = CancellationToken::new();
    let new = Supervisor::start(specs.clone(), config, &tracker, token.clone());
    new.wait_up(WAIT).await.unwrap();
    let mut rx = old.states();
    wait_for(&mut rx, "the old daemons stopped", |s| {
        s.values()
            .all(|d| matches!(d, DaemonState::Down { reason } if reason == "stopped"))
    })
    .await;
    for (spec, old_pid) in specs.iter().zip(old_pids) {
        assert!(!alive(old_pid), "{}: old daemon running", spec.uuid);
    }
    assert_own_shm(&specs, SHM);
    token.cancel();
    tracker.close();
    tokio::time::timeout(WAIT, tracker.wait()).await.unwrap();
    assert_shm_removed(&specs);
}

#[tokio::test]
async fn missing_binary_reports_down_and_wait_up_fails() {
    let dir = tempfile::tempdir().unwrap();
    let specs = daemons(dir.path());
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let config = SupervisorConfig {
        control_bin: dir.path().join("no-such-binary"),
        backoff_base: Duration::from_millis(50),
        backoff_max: Duration::from_millis(100),
        ..SupervisorConfig::default()
    };
    let sup = Supervisor::start(specs, config, &tracker, cancel.clone());
    let mut rx = sup.states();
    wait_for(&mut rx, "all Down", |s| {
        s.values().all(|d| matches!(d, DaemonState::Down { .. }))
    })
    .await;
    assert!(sup.wait_up(Duration::from_millis(200)).await.is_err());
    cancel.cancel();
    tracker.close();
    tokio::time::timeout(WAIT, tracker.wait()).await.unwrap();
}

#[tokio::test]
async fn compute_mode_is_set_for_whole_gpus_only_and_restored() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let specs = daemons(dir.path());
    let smi = dir.path().join("nvidia-smi");
    let calls = dir.path().join("smi.log");
    std::fs::write(
        &smi,
        format!("#!/bin/sh\necho \"$*\" >> '{}'\n", calls.display()),
    )
    .unwrap();
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let config = SupervisorConfig {
        control_bin: fake(),
        nvidia_smi: Some(smi),
        ..SupervisorConfig::default()
    };
    let sup = Supervisor::start(specs, config, &tracker, cancel.clone());
    sup.wait_up(WAIT).await.unwrap();
    cancel.cancel();
    tracker.close();
    tokio::time::timeout(WAIT, tracker.wait()).await.unwrap();
    let mut lines: Vec<String> = read(calls).lines().map(String::from).collect();
    lines.sort();
    assert_eq!(
        lines,
        vec![
            "-i GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02 -c DEFAULT",
            "-i GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02 -c EXCLUSIVE_PROCESS",
            "-i GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03 -c DEFAULT",
            "-i GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03 -c EXCLUSIVE_PROCESS",
        ]
    );
}
