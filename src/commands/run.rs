//! `gpu-slicer run`: the node daemon. Parses its flags (each also an environment
//! variable), loads the config, opens the backend and hands over to [`crate::app::run`];
//! SIGTERM / SIGINT cancel it (a second signal is not needed: shutdown has a deadline).

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::app::{self, AppError, RunSettings};
use crate::config::{self, ConfigError, Overrides};
use crate::inventory::{Backend, InventoryError, sim::SimBackend};

/// Errors of `gpu-slicer run` before or while the daemon runs.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Config file or flags.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `--backend` could not be opened.
    #[error(transparent)]
    Backend(#[from] InventoryError),
    /// Signal handlers could not be installed.
    #[error("cannot install signal handler: {0}")]
    Signal(#[source] std::io::Error),
    /// The daemon failed.
    #[error(transparent)]
    App(#[from] AppError),
}

/// Flags of `gpu-slicer run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// `nvml`, `sim:<built-in profile>` (dgx-h100, mixed-a100) or `sim:<node file>`.
    #[arg(long, env = "GPU_SLICER_BACKEND", default_value = "nvml")]
    pub backend: String,
    /// Config file (NVIDIA k8s-device-plugin `version: v1` format, YAML or JSON).
    #[arg(long, env = "CONFIG_FILE")]
    pub config: Option<PathBuf>,
    /// Directory of device-plugin sockets.
    #[arg(long, env = "DEVICE_PLUGIN_DIR", default_value = crate::proto::DEFAULT_DEVICE_PLUGIN_DIR)]
    pub device_plugin_dir: PathBuf,
    /// The kubelet's registration socket (default: `<device-plugin-dir>/kubelet.sock`).
    #[arg(long, env = "KUBELET_SOCKET")]
    pub kubelet_socket: Option<PathBuf>,
    /// Directory the CDI spec is written to.
    #[arg(long, env = "CDI_DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
}

impl RunArgs {
    /// The daemon settings these flags describe (config loaded and validated).
    pub fn settings(&self) -> Result<RunSettings, RunError> {
        let config = config::load(self.config.as_deref(), &Overrides::default())?;
        let mut settings = RunSettings::new(config, &self.device_plugin_dir, &self.cdi_dir);
        if let Some(socket) = &self.kubelet_socket {
            settings.kubelet_socket.clone_from(socket);
        }
        Ok(settings)
    }
}

/// Open the backend named by `--backend`.
pub fn open_backend(spec: &str) -> Result<Arc<dyn Backend>, InventoryError> {
    if let Some(profile) = spec.strip_prefix("sim:") {
        return Ok(Arc::new(SimBackend::open(profile)?));
    }
    match spec {
        "nvml" => Err(InventoryError::Nvml {
            message: "the NVML backend is not available in this build".into(),
        }),
        other => Err(InventoryError::UnknownBackend(other.to_string())),
    }
}

/// Run the daemon until SIGTERM or SIGINT.
pub async fn run(args: &RunArgs) -> Result<(), RunError> {
    let settings = args.settings()?;
    let backend = open_backend(&args.backend)?;
    let shutdown = CancellationToken::new();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(RunError::Signal)?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(RunError::Signal)?;
    let daemon = app::run(settings, backend, shutdown.clone());
    tokio::pin!(daemon);
    tokio::select! {
        result = &mut daemon => return Ok(result?),
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "stopping"),
        _ = int.recv() => tracing::info!(signal = "SIGINT", "stopping"),
    }
    shutdown.cancel();
    Ok(daemon.await?)
}
