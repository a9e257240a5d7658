//! The runtime's error: what stops the daemon or refuses a reload, translated to an exit
//! code once in `crate::cli::error`. Also the one helper that runs blocking work (NVML,
//! filesystem) off the async workers.

use std::time::Duration;

use crate::domain::config::ConfigError;
use crate::domain::inventory::InventoryError;
use crate::domain::plan::PlanError;
use crate::runtime::plugin::{PluginError, WatchError};
use crate::runtime::triggers::ReloadError;

/// Errors of the daemon.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppError {
    /// The config could not be loaded again (reload).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Discovery failed.
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    /// The config does not fit this node.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Writing the CDI spec failed.
    #[error(transparent)]
    Spec(#[from] SpecWriteError),
    /// The new state could not be computed (the config does not fit, a spec rule).
    #[error(transparent)]
    Transition(#[from] crate::domain::transition::TransitionError),
    /// The driver could not be found under the driver root (`failOnInitError: true`).
    #[error(transparent)]
    Driver(#[from] crate::platform::driver::DriverError),
    /// The held-device checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] crate::platform::checkpoint::CheckpointError),
    /// The kubelet directory could not be watched.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// A resource could not be served.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The DRA driver could not start (its sockets, its checkpoint).
    #[error(transparent)]
    Dra(#[from] crate::runtime::dra::DraRuntimeError),
    /// Reload triggers could not be set up.
    #[error(transparent)]
    Reload(#[from] ReloadError),
    /// The HTTP endpoint could not listen.
    #[error(transparent)]
    Http(#[from] crate::runtime::http::HttpError),
    /// The usage sampler's thread could not be started.
    #[error("cannot start the usage sampler thread: {0}")]
    UsageThread(#[source] std::io::Error),
    /// A blocking task (discovery, spec writing) panicked or was cancelled.
    #[error("{task} did not complete: {message}")]
    Blocking { task: &'static str, message: String },
    /// Tasks were still running when the shutdown deadline passed.
    #[error("shutdown did not complete within {0:?}")]
    ShutdownTimeout(Duration),
}

/// Run a blocking closure off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    task: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, AppError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AppError::Blocking {
            task,
            message: e.to_string(),
        })
}

/// Writing the CDI spec failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot write CDI spec in {dir}: {source}")]
pub(crate) struct SpecWriteError {
    /// CDI directory.
    pub(crate) dir: String,
    /// What went wrong.
    #[source]
    pub(crate) source: Box<crate::domain::cdi::CdiError>,
}
