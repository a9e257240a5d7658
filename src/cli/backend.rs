//! Subcommand implementations: each takes parsed arguments and a writer, calls the
//! library, and returns the crate error. `main` maps that error to an exit code.

use std::sync::Arc;

use crate::cli::args::BackendArgs;
use crate::domain::inventory::{Backend, InventoryError};
use crate::platform::sim::SimBackend;

/// Open the backend named by `--backend`.
pub(crate) fn open_backend(args: &BackendArgs) -> Result<Arc<dyn Backend>, InventoryError> {
    if let Some(profile) = args.backend.strip_prefix("sim:") {
        return Ok(Arc::new(SimBackend::open(profile)?));
    }
    match args.backend.as_str() {
        "nvml" => Ok(Arc::new(crate::platform::nvml::NvmlBackend::new(
            args.nvml_lib.clone(),
            args.proc_root.clone(),
        ))),
        other => Err(InventoryError::UnknownBackend(other.to_string())),
    }
}
