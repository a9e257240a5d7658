//! Signals to the built binary: SIGTERM stops it cleanly (every plugin socket removed);
//! SIGHUP reloads the config without a restart.

mod common;

use std::path::Path;
use std::process::Stdio;

use common::{short_tempdir, within};
use gpu_slicer::testkit::KubeletEmulator;
use gpu_slicer::testkit::socket_name;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// `gpu-slicer run` on the `mixed-a100` sim node with `config` and the sockets and spec in
/// `dir`, plus `extra` flags.
fn spawn_run(dir: &Path, config: &Path, extra: &[&str]) -> tokio::process::Child {
    common::run_command(dir, "sim:mixed-a100", config)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn sigterm_removes_sockets() {
    let dir = short_tempdir();
    let plugin_dir = dir.path().join("dp");
    let emulator = KubeletEmulator::start(&plugin_dir).await.unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "flags: {migStrategy: mixed}\n").unwrap();
    let ledger_socket = dir.path().join("pod-resources.sock");
    let mut child = spawn_run(
        dir.path(),
        &config,
        // Real flags of the ops surface: an ephemeral HTTP port, and a PodResources socket
        // that does not exist (the ledger degrades; the daemon still runs and stops).
        &[
            "--http-listen=127.0.0.1:0",
            "--pod-resources-socket",
            ledger_socket.to_str().unwrap(),
            "--ledger-interval=50ms",
        ],
    );
    let names: Vec<String> = [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
    ]
    .map(String::from)
    .to_vec();
    within("registration", emulator.wait_registered(&names, 1)).await;
    for name in &names {
        assert!(plugin_dir.join(socket_name(name)).exists());
    }
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    let status = within("exit", child.wait()).await.unwrap();
    assert!(status.success(), "{status}");
    for name in &names {
        assert!(!plugin_dir.join(socket_name(name)).exists(), "{name}");
    }
    emulator.shutdown().await;
}

#[tokio::test]
async fn sighup_reloads_the_config() {
    let dir = short_tempdir();
    let plugin_dir = dir.path().join("dp");
    let emulator = KubeletEmulator::start(&plugin_dir).await.unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "flags: {migStrategy: mixed}\n").unwrap();
    let mut child = spawn_run(
        dir.path(),
        &config,
        // Only the signal may trigger this reload; never the default :9400 in tests
        // (parallel runs); no ledger.
        &[
            "--no-config-watch",
            "--http-listen=127.0.0.1:0",
            "--pod-resources-socket=",
        ],
    );
    let gpu = vec!["nvidia.com/gpu".to_string()];
    within("registration", emulator.wait_registered(&gpu, 1)).await;
    let mut devices = emulator.devices("nvidia.com/gpu").unwrap();
    assert_eq!(devices.borrow_and_update().len(), 2);
    std::fs::write(
        &config,
        "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 3}\n",
    )
    .unwrap();
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(pid, Signal::SIGHUP).unwrap();
    within(
        "6 replicas after SIGHUP",
        devices.wait_for(|d| d.len() == 6),
    )
    .await
    .unwrap();
    assert!(child.try_wait().unwrap().is_none(), "still running");
    kill(pid, Signal::SIGTERM).unwrap();
    let status = within("exit", child.wait()).await.unwrap();
    assert!(status.success(), "{status}");
    emulator.shutdown().await;
}
