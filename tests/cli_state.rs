//! Held devices and shutdown seen through the built binary: `gpu-slicer run` processes
//! killed and restarted as an operator would (SIGKILL or SIGTERM, a changed config while the
//! agent is down), shut down while MPS daemons never come up, and started on a checkpoint that
//! is corrupt or names devices the node lacks. (The store in-process: `state` unit tests.)

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use common::{run_command as run, within};
use gpu_slicer::testkit::KubeletEmulator;
use gpu_slicer::testkit::{SHUTDOWN_DEADLINE, spec_device_names, temp_dir};

const SPEC: &str = "gpu-slicer.io-gpu.yaml";

/// GPU 3 split four ways with enforced memory: 3 replicas are the `-share-3` CDI device.
const SHARES: &str = "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.shared, devices: [3], replicas: 4, isolation: memory}\n";

fn read_spec(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("cdi").join(SPEC)).expect("spec written")
}

/// A stand-in MPS control binary that never comes up: it neither writes a pid file nor
/// answers, it just sleeps.
fn never_up_mps(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("never-up-mps");
    std::fs::write(&path, "#!/bin/sh\nexec sleep 600\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn sigterm_while_mps_daemons_never_come_up_exits_promptly() {
    let dir = temp_dir();
    let emulator = KubeletEmulator::start(dir.path().join("dp")).await.unwrap();
    let config = dir.path().join("config.yaml");
    let mps_root = dir.path().join("mps");
    std::fs::write(&config, "version: v1\nflags: {migStrategy: mixed}\n").unwrap();
    let log = dir.path().join("run.log");
    let mut child = run(dir.path(), "sim:mixed-a100", &config)
        .arg("--mps-control-bin")
        .arg(never_up_mps(dir.path()))
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let names: Vec<String> = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]
        .map(String::from)
        .to_vec();
    within("registration", emulator.wait_registered(&names, 1)).await;
    // A reload that adds an MPS share whose daemon never comes up.
    std::fs::write(
        &config,
        format!(
            "version: v1\nflags: {{migStrategy: mixed, mpsRoot: {}}}\nsharing:\n  mps:\n    resources:\n    - {{name: nvidia.com/mig-1g.10gb, replicas: 2}}\n",
            mps_root.display()
        ),
    )
    .unwrap();
    let mut devices = emulator.devices("nvidia.com/mig-1g.10gb").unwrap();
    within(
        "MPS replicas advertised (Unhealthy: starting)",
        devices.wait_for(|d| d.len() == 18 && d.iter().all(|d| !d.healthy)),
    )
    .await
    .unwrap();
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = within("exit after SIGTERM", child.wait()).await.unwrap();
    let took = t.elapsed();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status:?}\n{log}");
    assert!(took < SHUTDOWN_DEADLINE, "{took:?}\n{log}");
    emulator.shutdown().await;
}

/// Spawn `run` on the SHARES-style config at `config` in `dir` (sockets, spec, checkpoint).
fn spawn_run(dir: &Path, config: &Path) -> tokio::process::Child {
    run(dir, "sim:mixed-a100", config)
        .env("CDI_HOOK_PATH", "/opt/gpu-slicer/bin/gpu-slicer")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

async fn restart_keeps_held_devices(signal: nix::sys::signal::Signal) {
    let dir = temp_dir();
    let emulator = KubeletEmulator::start(dir.path().join("dp")).await.unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, SHARES).unwrap();
    let mut child = spawn_run(dir.path(), &config);
    let names: Vec<String> = [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.10gb",
    ]
    .map(String::from)
    .to_vec();
    within("registration", emulator.wait_registered(&names, 1)).await;
    let mut held = BTreeSet::new();
    for (resource, n) in [
        ("nvidia.com/gpu.shared", 3),
        ("nvidia.com/mig-1g.10gb", 1),
        ("nvidia.com/gpu", 1),
    ] {
        let a = emulator.allocate(resource, n).await.unwrap();
        held.extend(
            a.response
                .cdi_devices
                .iter()
                .map(|q| q.trim_start_matches("gpu-slicer.io/gpu=").to_string()),
        );
    }
    assert_eq!(held.len(), 3, "{held:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()),
        signal,
    )
    .unwrap();
    within("old daemon gone", child.wait()).await.unwrap();
    // The operator changes the config while the agent is down: none of the held devices is
    // in the new plan.
    std::fs::write(&config, "version: v1\nflags: {migStrategy: none}\n").unwrap();
    let mut child = spawn_run(dir.path(), &config);
    within(
        "re-registration",
        emulator.wait_registered(&["nvidia.com/gpu".to_string()], 2),
    )
    .await;
    let have = spec_device_names(&read_spec(dir.path()));
    // The reduced config serves only nvidia.com/gpu: the old sockets of the other
    // resources are gone (a SIGKILLed run could not remove them itself).
    let mut sockets: Vec<String> = std::fs::read_dir(dir.path().join("dp"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("gpu-slicer-"))
        .collect();
    sockets.sort();
    assert_eq!(sockets, vec!["gpu-slicer-nvidia.com-gpu.sock".to_string()]);
    let lost: Vec<&String> = held.difference(&have).collect();
    assert!(
        lost.is_empty(),
        "lost after {signal:?} and restart: {lost:?} (spec has {have:?})"
    );
    child.kill().await.unwrap();
    emulator.shutdown().await;
}

#[tokio::test]
async fn sigkill_and_a_changed_config_lose_no_held_device() {
    restart_keeps_held_devices(nix::sys::signal::Signal::SIGKILL).await;
}

#[tokio::test]
async fn sigterm_and_a_changed_config_lose_no_held_device() {
    restart_keeps_held_devices(nix::sys::signal::Signal::SIGTERM).await;
}

/// A checkpoint that is not one (a truncated write from another tool, a planted file) stops
/// the agent before it writes any spec: exit 1 (the machine's state, not the user's input),
/// naming the file; nothing held is silently forgotten.
#[tokio::test]
async fn a_corrupt_checkpoint_is_refused_naming_the_file() {
    let dir = temp_dir();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, SHARES).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("held.json"), "{\"resources\": [").unwrap();
    let out = run(dir.path(), "sim:mixed-a100", &config)
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("held-device checkpoint")
            && err.contains(&*state.join("held.json").to_string_lossy()),
        "{err}"
    );
    assert!(
        !dir.path().join("cdi").join(SPEC).exists(),
        "a spec was written anyway"
    );
}

/// A checkpoint naming devices this node does not have (left by a run on another node
/// file under the same `--state-dir`): the start-up reload writes the spec once, says in
/// one line which held devices it cannot keep, and does not claim a device was handed out.
#[tokio::test]
async fn a_checkpoint_naming_devices_the_node_lacks_is_reported_once_and_not_retried() {
    const GONE: &str = "GPU-00000000-dead-beef-0000-000000000099";
    let dir = temp_dir();
    let emulator = KubeletEmulator::start(dir.path().join("dp")).await.unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "version: v1\nflags: {migStrategy: mixed}\n").unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(
        state.join("held.json"),
        format!(r#"{{"resources": {{"nvidia.com/gpu": {{"{GONE}": {{"cdi": ["{GONE}"]}}}}}}}}"#),
    )
    .unwrap();
    let log = dir.path().join("run.log");
    let mut child = run(dir.path(), "sim:mixed-a100", &config)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let names: Vec<String> = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]
        .map(String::from)
        .to_vec();
    within("registration", emulator.wait_registered(&names, 1)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = within("exit after SIGTERM", child.wait()).await.unwrap();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status:?}\n{log}");
    let lines = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(
        lines("a device was handed out during the reload"),
        0,
        "nothing was handed out:\n{log}"
    );
    assert_eq!(lines("CDI spec dir="), 1, "one spec write:\n{log}");
    let reported: Vec<&str> = log.lines().filter(|l| l.contains(GONE)).collect();
    assert_eq!(reported.len(), 1, "one line names the device:\n{log}");
    assert!(
        reported[0].contains("neither on this node nor in the previous CDI spec"),
        "{log}"
    );
    assert!(!read_spec(dir.path()).contains(GONE));
    emulator.shutdown().await;
}
