//! The crate-level error and the one exit-code map, in the command layer: it names the
//! errors of every layer below, and none of them names it, so no module cycle runs through it.
//!
//! Every command ends in an [`Error`]; [`Error::exit_code`] is the only place that turns an
//! error into a process exit status. The rule is one table, applied the same way however
//! deep an error is nested (a CDI I/O error exits 1 whether `cdi generate` or `run` hit it):
//!
//! | code | meaning | errors |
//! |---|---|---|
//! | 0 | success | |
//! | 1 | the machine failed us | NVML, disk and socket I/O, a failed hook, the daemon at run time, signals, output |
//! | 2 | bad input | config file / flags / env vars, MIG layout files and layouts that do not fit, node files, unknown backend or profile, a plan that does not fit the node, CDI names and specs given by the user, health flags |

use std::process::ExitCode;

use crate::cli::args::MonitorError;
use crate::cli::demo::DemoError;
use crate::cli::run::RunError;
use crate::domain::cdi::CdiError;
use crate::domain::inventory::InventoryError;
use crate::runtime::supervisor::AppError;

/// Any error a command can end with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// Config file or flags.
    #[error(transparent)]
    Config(#[from] crate::domain::config::ConfigError),
    /// Discovery.
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    /// Planning.
    #[error(transparent)]
    Plan(#[from] crate::domain::plan::PlanError),
    /// CDI spec generation, checks or writing.
    #[error(transparent)]
    Cdi(#[from] CdiError),
    /// A CDI hook failed (the container must not start).
    #[error(transparent)]
    Enforce(#[from] crate::platform::enforce::EnforceError),
    /// Writing the node-labels file.
    #[error(transparent)]
    Labels(#[from] crate::platform::labels_file::LabelsFileError),
    /// Driver discovery or a driver hook.
    #[error(transparent)]
    Driver(#[from] crate::platform::driver::DriverError),
    /// `gpu-slicer run`.
    #[error(transparent)]
    Run(#[from] RunError),
    /// `gpu-slicer mig`.
    #[error(transparent)]
    Mig(#[from] Box<crate::cli::mig::MigError>),
    /// `gpu-slicer demo`.
    #[error(transparent)]
    Demo(#[from] DemoError),
    /// `gpu-slicer emulate` (test support).
    #[cfg(feature = "testkit")]
    #[error(transparent)]
    Emulate(#[from] crate::cli::emulate::EmulateError),
    /// `gpu-slicer top`.
    #[error(transparent)]
    Top(#[from] crate::cli::top::TopError),
    /// DRA driver name, node name or claim handling.
    #[error(transparent)]
    Dra(#[from] crate::domain::dra::DraError),
    /// `gpu-slicer advise`.
    #[error(transparent)]
    Advise(#[from] crate::cli::advise::AdviseCliError),
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// Writing output.
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
    /// JSON encoding of output.
    #[error("cannot encode output: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Result alias for commands.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// What an error says about whose fault it is; each maps to one exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The machine, the driver or the environment failed (exit 1).
    Runtime,
    /// The user's input is wrong (exit 2).
    Input,
}

impl Class {
    /// The process exit code of this class.
    pub(crate) fn exit_code(self) -> ExitCode {
        match self {
            Class::Runtime => ExitCode::from(1),
            Class::Input => ExitCode::from(2),
        }
    }
}

fn inventory(e: &InventoryError) -> Class {
    match e {
        InventoryError::NodeFile(_)
        | InventoryError::UnknownProfile { .. }
        | InventoryError::NodeFileMissing { .. }
        | InventoryError::UnknownBackend(_) => Class::Input,
        _ => Class::Runtime,
    }
}

fn cdi(e: &CdiError) -> Class {
    match e {
        CdiError::Io { .. } | CdiError::Serialize(_) => Class::Runtime,
        CdiError::Inventory(e) => inventory(e),
        _ => Class::Input,
    }
}

fn app(e: &AppError) -> Class {
    match e {
        AppError::Config(_) | AppError::Plan(_) => Class::Input,
        AppError::Inventory(e) => inventory(e),
        _ => Class::Runtime,
    }
}

fn mig(e: &crate::cli::mig::MigError) -> Class {
    use crate::cli::mig::MigError;
    match e {
        MigError::Layout(_) | MigError::SimReadOnly(_) | MigError::Missing { .. } => Class::Input,
        MigError::Backend(e) => inventory(e),
        MigError::Op(_) | MigError::Failed(_) | MigError::Output(_) => Class::Runtime,
    }
}

fn monitor(e: &MonitorError) -> Class {
    match e {
        MonitorError::Backend(e) => inventory(e),
        MonitorError::EventsFileNeedsSim { .. } => Class::Input,
    }
}

impl Error {
    /// Whose fault this error is.
    pub(crate) fn class(&self) -> Class {
        match self {
            Error::Config(_) | Error::Plan(_) | Error::Dra(_) => Class::Input,
            Error::Inventory(e) => inventory(e),
            Error::Cdi(e) => cdi(e),
            Error::Run(e) => match e {
                // Kube: the client setup only (no kubeconfig, no node name: the operator's to
                // fix); no API call is made before the daemon runs.
                RunError::Config(_)
                | RunError::Dra(_)
                | RunError::Kube(_)
                | RunError::DraStateDir => Class::Input,
                RunError::Backend(e) => inventory(e),
                RunError::Hook(e) => cdi(e),
                RunError::Health(e) => monitor(e),
                RunError::App(e) => app(e),
                RunError::Signal(_) => Class::Runtime,
            },
            Error::Demo(DemoError::App(e)) => app(e),
            Error::Top(crate::cli::top::TopError::Endpoint { .. }) => Class::Input,
            Error::Top(_) => Class::Runtime,
            Error::Mig(e) => mig(e),
            Error::Advise(e) if e.is_input() => Class::Input,
            Error::Advise(_) => Class::Runtime,
            Error::Driver(crate::platform::driver::DriverError::Io { .. }) => Class::Runtime,
            Error::Driver(_) => Class::Input,
            Error::Labels(crate::platform::labels_file::LabelsFileError::NotAFilePath {
                ..
            }) => Class::Input,
            #[cfg(feature = "testkit")]
            Error::Emulate(_) => Class::Runtime,
            Error::Enforce(_)
            | Error::Labels(_)
            | Error::Demo(_)
            | Error::Runtime(_)
            | Error::Output(_)
            | Error::Encode(_) => Class::Runtime,
        }
    }

    /// The process exit code (see the table in the module header).
    pub(crate) fn exit_code(&self) -> ExitCode {
        self.class().exit_code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cdi_io_error_has_one_exit_code_wherever_it_surfaces() {
        let io = || CdiError::Io {
            path: "/var/run/cdi".into(),
            source: std::io::Error::other("disk full"),
        };
        let alone = Error::Cdi(io()).class();
        let in_run = Error::Run(RunError::Hook(io())).class();
        assert_eq!(alone, Class::Runtime);
        assert_eq!(in_run, alone);
    }
}
