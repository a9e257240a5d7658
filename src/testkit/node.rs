//! One node for tests, benches and the demo: a short temporary directory, the kubelet
//! emulator serving in its `dp/` folder, and the daemon ([`supervisor::run`]) writing its
//! sockets there and its CDI spec to `cdi/`, all over real unix sockets.
//!
//! [`Node::run`] starts it from `gpu-slicer run` flags (written in `cli::run`, beside the
//! flags it parses); `Node::start` from a sim profile and a config (unit tests);
//! [`Node::launch`] takes a directory, an emulator and settings prepared by the caller (a
//! watched config file, a PodResources socket, a checkpoint). Each returns once the daemon
//! is ready and every planned resource has registered. [`within`] bounds a test's
//! wait on a channel or a future; [`wait_until`] is the one bounded poll for conditions no
//! channel reports.

use std::future::Future;
use std::path::Path;
#[cfg(test)]
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::domain::config::Config;
use crate::domain::inventory::{Backend, InventoryError};
#[cfg(test)]
use crate::platform::sim::SimBackend;
use crate::runtime::plugin::Backoff;
#[cfg(test)]
use crate::runtime::supervisor::ReloadStatus;
use crate::runtime::supervisor::{self, AppError, RunSettings, Running};
use crate::testkit::kubelet::{EmulatorError, KubeletEmulator};

/// How long a node may take to start or stop before the harness gives up.
pub const STEP: Duration = Duration::from_secs(30);

/// Registration retries fast enough that a test never waits on them.
pub(crate) const FAST_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(1),
    max: Duration::from_millis(50),
};

/// Errors starting or stopping a node: what failed is in the message (and its source).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct NodeError(#[from] pub(crate) NodeFailure);

/// What failed starting or stopping a node (the demo maps each to its own error).
#[derive(Debug, thiserror::Error)]
pub(crate) enum NodeFailure {
    /// The temporary directory could not be created.
    #[error("node directory: {0}")]
    Dir(#[from] std::io::Error),
    /// The sim profile did not load.
    #[error(transparent)]
    Profile(#[from] InventoryError),
    /// The kubelet emulator failed.
    #[error(transparent)]
    Emulator(#[from] EmulatorError),
    /// The daemon failed (before it was ready, or when it stopped).
    #[error(transparent)]
    App(#[from] AppError),
    /// `gpu-slicer run`'s flags were refused ([`Node::run`]).
    #[error("gpu-slicer run {args}: {message}")]
    Flags { args: String, message: String },
    /// The daemon task panicked or was aborted.
    #[error("daemon task ended abnormally: {0}")]
    Join(String),
    /// A step did not finish within [`STEP`].
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
}

impl From<std::io::Error> for NodeError {
    fn from(e: std::io::Error) -> Self {
        Self(e.into())
    }
}

impl From<InventoryError> for NodeError {
    fn from(e: InventoryError) -> Self {
        Self(e.into())
    }
}

impl From<EmulatorError> for NodeError {
    fn from(e: EmulatorError) -> Self {
        Self(e.into())
    }
}

impl From<AppError> for NodeError {
    fn from(e: AppError) -> Self {
        Self(e.into())
    }
}

/// A short temporary directory under `/tmp` (unix socket paths are limited to 108 bytes),
/// random and created 0700: a predictable name could be planted by another user.
pub(crate) fn short_tempdir(prefix: &str) -> Result<TempDir, NodeError> {
    Ok(tempfile::Builder::new().prefix(prefix).tempdir_in("/tmp")?)
}

/// [`short_tempdir`] for a test: a fresh directory, or a panic.
///
/// # Panics
/// When the directory cannot be created.
pub fn temp_dir() -> TempDir {
    short_tempdir("gs").unwrap_or_else(|e| panic!("{e}"))
}

/// A running node: the daemon and the kubelet emulator it registered with.
#[derive(Debug)]
pub struct Node {
    /// Everything the node writes: `dp/` sockets, `cdi/` spec, and what the caller put there.
    pub(crate) dir: TempDir,
    /// The kubelet the daemon registered with.
    pub emulator: KubeletEmulator,
    /// What the daemon exposes (store, reloads, metrics, ...).
    pub(crate) running: Running,
    /// Cancels the daemon.
    pub(crate) shutdown: CancellationToken,
    /// The daemon's task.
    pub(crate) app: JoinHandle<Result<(), AppError>>,
    /// From the daemon's start until every resource had registered.
    pub started: Duration,
}

impl Node {
    /// How long the daemon's config-file watcher lets writes settle before it reloads.
    pub const RELOAD_SETTLE: Duration = crate::runtime::triggers::SETTLE;

    /// Settings for a node in `dir`: sockets in `dir/dp`, the spec in `dir/cdi`.
    pub(crate) fn settings(dir: &Path, config: Config) -> RunSettings {
        RunSettings::new(config, dir.join("dp"), dir.join("cdi"))
    }

    #[cfg(test)]
    /// A node on the sim profile (or node file) `profile` with `config`, in a fresh
    /// directory; `configure` may change the settings before the daemon starts.
    pub(crate) async fn start(
        profile: &str,
        config: Config,
        configure: impl FnOnce(&Path, &mut RunSettings),
    ) -> Result<Self, NodeError> {
        let dir = short_tempdir("gs")?;
        let emulator = KubeletEmulator::start(dir.path().join("dp")).await?;
        let mut settings = Self::settings(dir.path(), config);
        configure(dir.path(), &mut settings);
        let backend = Arc::new(SimBackend::open(profile)?);
        Self::launch(dir, emulator, settings, backend).await
    }

    /// Run the daemon with `settings` (sockets where `emulator` serves) on `backend`, with
    /// [`FAST_BACKOFF`]; return once it is ready and every planned resource registered
    /// (in DRA mode: once it is ready).
    pub(crate) async fn launch(
        dir: TempDir,
        emulator: KubeletEmulator,
        mut settings: RunSettings,
        backend: Arc<dyn Backend>,
    ) -> Result<Self, NodeError> {
        settings.backoff = FAST_BACKOFF;
        // In DRA mode nothing registers with the device-plugin side.
        let dra = settings.dra.is_some();
        let (tx, rx) = oneshot::channel();
        settings.on_ready = Some(tx);
        let shutdown = CancellationToken::new();
        let t0 = Instant::now();
        let mut app = tokio::spawn(supervisor::run(settings, backend, shutdown.clone()));
        let running = tokio::select! {
            ready = rx => ready.ok(),
            () = tokio::time::sleep(STEP) => return Err(NodeFailure::Timeout("the daemon to be ready").into()),
            ended = &mut app => return Err(ended_early(ended)),
        };
        let Some(running) = running else {
            return Err(ended_early(app.await));
        };
        let node = Self {
            dir,
            emulator,
            running,
            shutdown,
            app,
            started: Duration::ZERO,
        };
        let names = if dra { Vec::new() } else { node.resources() };
        bounded("registration", node.emulator.wait_registered(&names, 1)).await?;
        Ok(Self {
            started: t0.elapsed(),
            ..node
        })
    }

    #[cfg(test)]
    /// The socket directory.
    pub(crate) fn plugin_dir(&self) -> PathBuf {
        self.dir.path().join("dp")
    }

    /// The resources of the plan served at start.
    pub(crate) fn resources(&self) -> Vec<String> {
        self.running
            .plan
            .resources
            .iter()
            .map(|r| r.name.clone())
            .collect()
    }

    #[cfg(test)]
    /// The CDI spec the daemon wrote (kind `gpu-slicer.io/gpu`).
    ///
    /// # Panics
    /// When there is none: the harness is for tests.
    pub(crate) fn cdi_spec(&self) -> String {
        let path = self.dir.path().join("cdi").join("gpu-slicer.io-gpu.yaml");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("spec written at {}: {e}", path.display()))
    }

    #[cfg(test)]
    /// Wait until the reload counters move past `before`; the status then.
    ///
    /// # Panics
    /// When no reload ends within [`STEP`] or the daemon stopped: the harness is for tests.
    pub(crate) async fn next_reload(&self, before: &ReloadStatus) -> ReloadStatus {
        let mut rx = self.running.reloads.clone();
        let total = before.applied + before.failed + before.unchanged;
        let moved = bounded(
            "a reload",
            rx.wait_for(|s| s.applied + s.failed + s.unchanged > total),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        moved
            .map(|s| s.clone())
            .unwrap_or_else(|_| panic!("the daemon stopped before a reload ended"))
    }

    /// Stop the daemon (within [`STEP`]) and the emulator, then remove the node's directory;
    /// the daemon's own result.
    pub async fn stop(self) -> Result<(), NodeError> {
        self.shutdown.cancel();
        let ended = bounded("the daemon to stop", self.app).await?;
        self.emulator.shutdown().await;
        drop(self.dir);
        ended
            .map_err(|e| NodeError(NodeFailure::Join(e.to_string())))?
            .map_err(NodeError::from)
    }
}

fn ended_early(ended: Result<Result<(), AppError>, tokio::task::JoinError>) -> NodeError {
    match ended {
        Ok(Err(e)) => NodeFailure::App(e).into(),
        Ok(Ok(())) => NodeFailure::Join("the daemon stopped before it was ready".into()).into(),
        Err(e) => NodeFailure::Join(e.to_string()).into(),
    }
}

/// Bound a wait by [`STEP`].
async fn bounded<T>(what: &'static str, f: impl Future<Output = T>) -> Result<T, NodeError> {
    tokio::time::timeout(STEP, f)
        .await
        .map_err(|_| NodeFailure::Timeout(what).into())
}

/// Bound a wait in a test by [`STEP`]: its output, or a panic naming `what`.
///
/// # Panics
/// When `f` does not finish within [`STEP`].
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(STEP, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out: {what}"),
    }
}

/// Poll `check` every few milliseconds until it yields `Some`, for at most `limit`: for
/// conditions no channel reports (a file another process writes, a metric or an HTTP
/// answer the daemon updates on its own schedule). Returns the value, or `None` when the
/// time ran out (the caller panics naming what it waited for).
pub async fn wait_until<T, F>(limit: Duration, mut check: impl FnMut() -> F) -> Option<T>
where
    F: Future<Output = Option<T>>,
{
    const EVERY: Duration = Duration::from_millis(10);
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(EVERY).await;
    }
}
