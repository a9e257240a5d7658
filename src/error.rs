//! The crate-level error: every module's error in one enum, so `main` can print it and
//! choose an exit code in one place.

use std::process::ExitCode;

/// Any error a command can end with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Config file or flags.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Discovery.
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    /// Planning.
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    /// CDI spec generation, checks or writing.
    #[error(transparent)]
    Cdi(#[from] crate::cdi::CdiError),
    /// A CDI hook failed (the container must not start).
    #[error(transparent)]
    Enforce(#[from] crate::enforce::EnforceError),
    /// Driver discovery or a driver hook.
    #[error(transparent)]
    Driver(#[from] crate::driver::DriverError),
    /// Writing output.
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
    /// JSON encoding of output.
    #[error("cannot encode output: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Result alias for commands.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Exit code: 2 for bad input (config, node file, plan), 1 for runtime failures.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Error::Config(_) | Error::Plan(_) => ExitCode::from(2),
            Error::Cdi(e) => e.exit_code(),
            Error::Inventory(crate::inventory::InventoryError::NodeFile(_))
            | Error::Inventory(crate::inventory::InventoryError::UnknownProfile { .. })
            | Error::Inventory(crate::inventory::InventoryError::UnknownBackend(_)) => {
                ExitCode::from(2)
            }
            _ => ExitCode::from(1),
        }
    }
}
