//! What the integration tests share beyond the library's test kit: `gpu-slicer run` as a
//! child process ([`run_command`]; only these tests have the built binary), and the kit's
//! fixtures under short names. Every wait is bounded (`within`, `wait_until`) and waits on
//! channels where one exists.

#![allow(dead_code, unused_imports)]

use std::sync::Arc;

use gpu_slicer::domain::config::{self, Overrides};
use gpu_slicer::runtime::supervisor::RunSettings;
use gpu_slicer::testkit::Node;
use gpu_slicer::testkit::kubelet::KubeletEmulator;
use tempfile::TempDir;

pub(crate) use gpu_slicer::testkit::fixtures::SHARED_CONFIG;
pub(crate) use gpu_slicer::testkit::{
    PrivateFake, STEP, fake_driver_root, fake_lib, http, temp_dir as short_tempdir, wait_until,
    within,
};

/// A daemon and its kubelet emulator (see `gpu_slicer::testkit::Node`).
pub(crate) type Harness = Node;

/// Start the emulator and the daemon on `profile` with `config_text`; wait until every
/// resource has registered.
pub(crate) async fn start(profile: &str, config_text: &str) -> Harness {
    let config = config::parse(config_text, "test.yaml", &Overrides::default()).expect("config");
    Node::start(profile, config, |_, _| {})
        .await
        .unwrap_or_else(|e| panic!("daemon did not start: {e}"))
}

/// Run the daemon with `settings` (sockets in `dir/dp`, where `emulator` serves) on
/// `backend`, with fast registration retries; wait until it is ready and every planned
/// resource has registered.
pub(crate) async fn launch(
    dir: TempDir,
    emulator: KubeletEmulator,
    settings: RunSettings,
    backend: Arc<dyn gpu_slicer::domain::inventory::Backend>,
) -> Harness {
    Node::launch(dir, emulator, settings, backend)
        .await
        .unwrap_or_else(|e| panic!("daemon did not start: {e}"))
}

/// `gpu-slicer run` on `backend` with `config`, everything it writes in `dir` (`dp/`
/// sockets, `cdi/` spec, `state/` checkpoint, `features.d/gpu-slicer` labels), HTTP on an ephemeral loopback port (never
/// the default :9400: tests run in parallel) and no ledger. Callers add flags and spawn.
pub(crate) fn run_command(
    dir: &std::path::Path,
    backend: &str,
    config: &std::path::Path,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"));
    cmd.arg("run")
        .arg("--backend")
        .arg(backend)
        .arg("--config")
        .arg(config)
        .arg("--device-plugin-dir")
        .arg(dir.join("dp"))
        .arg("--cdi-dir")
        .arg(dir.join("cdi"))
        .env("STATE_DIR", dir.join("state"))
        .env("HTTP_LISTEN", "127.0.0.1:0")
        .env("POD_RESOURCES_SOCKET", "")
        .env("LABELS_FILE", dir.join("features.d").join("gpu-slicer"))
        .kill_on_drop(true);
    cmd
}
