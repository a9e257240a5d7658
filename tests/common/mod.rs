//! Shared harness: a kubelet emulator and the daemon in a short temp dir, over real unix
//! sockets. Every wait is bounded by `tokio::time::timeout` and waits on channels.

#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gpu_slicer::domain::config::{self, Overrides};
use gpu_slicer::platform::sim::SimBackend;
use gpu_slicer::runtime::plugin::Backoff;
use gpu_slicer::runtime::supervisor::{self as app, AppError, RunSettings, Running};
use gpu_slicer::testkit::kubelet::KubeletEmulator;
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub(crate) const STEP: Duration = Duration::from_secs(10);

pub(crate) const SHARED_CONFIG: &str = "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n";

/// Bound any wait.
pub(crate) async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(STEP, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out: {what}"),
    }
}

/// One HTTP/1.1 request on a fresh connection to the daemon's listener: status and body.
pub(crate) async fn http(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.expect("read");
    let status = buf
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {buf:?}"));
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Short temp dir under /tmp (unix socket paths are limited to 108 bytes).
pub(crate) fn short_tempdir() -> TempDir {
    tempfile::Builder::new()
        .prefix("gs")
        .tempdir_in("/tmp")
        .expect("tempdir")
}

pub(crate) struct Harness {
    pub(crate) dir: TempDir,
    pub(crate) emulator: KubeletEmulator,
    pub(crate) running: Running,
    pub(crate) shutdown: CancellationToken,
    pub(crate) app: JoinHandle<Result<(), AppError>>,
}

impl Harness {
    pub(crate) fn plugin_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("dp")
    }

    pub(crate) fn resources(&self) -> Vec<String> {
        self.running
            .plan
            .resources
            .iter()
            .map(|r| r.name.clone())
            .collect()
    }

    /// The CDI spec the daemon wrote.
    pub(crate) fn cdi_spec(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("cdi").join("gpu-slicer.io-gpu.yaml"))
            .expect("spec written")
    }

    /// Wait until the reload counters move past `before`.
    pub(crate) async fn next_reload(
        &self,
        before: &gpu_slicer::runtime::supervisor::ReloadStatus,
    ) -> gpu_slicer::runtime::supervisor::ReloadStatus {
        let mut rx = self.running.reloads.clone();
        let total = before.applied + before.failed + before.unchanged;
        within(
            "reload",
            rx.wait_for(|s| s.applied + s.failed + s.unchanged > total),
        )
        .await
        .expect("daemon alive")
        .clone()
    }

    pub(crate) async fn stop(self) -> Result<(), AppError> {
        self.shutdown.cancel();
        let result = within("daemon stop", self.app).await.expect("join");
        self.emulator.shutdown().await;
        result
    }
}

/// Start the emulator and the daemon on `profile` with `config_text`; wait until every
/// resource has registered.
pub(crate) async fn start(profile: &str, config_text: &str) -> Harness {
    let dir = short_tempdir();
    let emulator = KubeletEmulator::start(dir.path().join("dp"))
        .await
        .expect("emulator");
    let config = config::parse(config_text, "test.yaml", &Overrides::default()).expect("config");
    let settings = RunSettings::new(config, dir.path().join("dp"), dir.path().join("cdi"));
    launch(
        dir,
        emulator,
        settings,
        Arc::new(SimBackend::open(profile).expect("profile")),
    )
    .await
}

/// Run the daemon with `settings` (sockets in `dir/dp`, where `emulator` serves) on
/// `backend`, with fast registration retries; wait until it is ready and every planned
/// resource has registered.
pub(crate) async fn launch(
    dir: TempDir,
    emulator: KubeletEmulator,
    mut settings: RunSettings,
    backend: Arc<dyn gpu_slicer::domain::inventory::Backend>,
) -> Harness {
    settings.backoff = Backoff {
        initial: Duration::from_millis(2),
        max: Duration::from_millis(100),
    };
    let (tx, rx) = oneshot::channel();
    settings.on_ready = Some(tx);
    let shutdown = CancellationToken::new();
    let app = tokio::spawn(app::run(settings, backend, shutdown.clone()));
    let Ok(running) = within("daemon ready", rx).await else {
        panic!("daemon did not start: {:?}", app.await);
    };
    let h = Harness {
        dir,
        emulator,
        running,
        shutdown,
        app,
    };
    within(
        "registration",
        h.emulator.wait_registered(&h.resources(), 1),
    )
    .await;
    h
}

/// The fake `libnvidia-ml` cargo builds as a dev-dependency, found next to the running test
/// or bench binary (`target/<profile>/deps` or its parent).
pub(crate) fn fake_lib() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("exe dir");
    for dir in [deps, deps.parent().expect("target dir")] {
        let p = dir.join("libnvidia_ml.so");
        if p.exists() {
            return p;
        }
    }
    panic!("libnvidia_ml.so not found near {}", exe.display());
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

/// A host driver root as the NVIDIA installer leaves one, as far as discovery needs it: the
/// CUDA and NVML libraries at `version` in the standard library folder (no ld.so.cache, so
/// discovery scans the folder). Returns the root; pass it as `--container-driver-root` (the
/// agent reads the files there, the spec names them under the host root `/`).
pub(crate) fn fake_driver_root(dir: &std::path::Path, version: &str) -> std::path::PathBuf {
    let root = dir.join("driver-root");
    let libs = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&libs).expect("driver root");
    for lib in ["libcuda.so", "libnvidia-ml.so"] {
        std::fs::write(libs.join(format!("{lib}.{version}")), "").expect("driver library");
    }
    root
}
