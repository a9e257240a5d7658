//! `--backend`, parsed once: the [`BackendKind`] every command matches on, and
//! [`open_backend`], which turns it into the inventory source (NVML in `platform::nvml`, a
//! node file or built-in profile in `platform::sim`).

use std::fmt;
use std::sync::Arc;

use crate::cli::args::BackendArgs;
use crate::domain::inventory::{Backend, InventoryError};
use crate::platform::sim::SimBackend;

/// What `--backend` names: the real driver, or a sim node (built-in profile or file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BackendKind {
    /// The GPUs the NVML library reports.
    Nvml,
    /// `sim:<profile or node file>`: the part after `sim:`.
    Sim(String),
}

impl BackendKind {
    /// Clap's value parser for `--backend` / `GPU_SLICER_BACKEND`: `nvml`, `sim:<profile>` or
    /// `sim:<node file>`; anything else is refused while the command line is read.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        match text.strip_prefix("sim:") {
            Some(profile) if !profile.is_empty() => Ok(Self::Sim(profile.to_string())),
            None if text == "nvml" => Ok(Self::Nvml),
            _ => Err(InventoryError::UnknownBackend(text.to_string()).to_string()),
        }
    }

    /// The sim profile or node file, for the sim backend.
    pub(crate) fn sim(&self) -> Option<&str> {
        match self {
            Self::Sim(profile) => Some(profile),
            Self::Nvml => None,
        }
    }

    /// Whether this is the real driver (NVML), the only backend that can change MIG
    /// instances and equips specs with the host's driver.
    pub(crate) fn is_nvml(&self) -> bool {
        matches!(self, Self::Nvml)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Nvml => f.write_str("nvml"),
            Self::Sim(profile) => write!(f, "sim:{profile}"),
        }
    }
}

/// Open the backend named by `--backend`.
pub(crate) fn open_backend(args: &BackendArgs) -> Result<Arc<dyn Backend>, InventoryError> {
    Ok(match &args.backend {
        BackendKind::Sim(profile) => Arc::new(SimBackend::open(profile)?),
        BackendKind::Nvml => Arc::new(crate::platform::nvml::NvmlBackend::new(
            args.nvml_lib.clone(),
            args.proc_root.clone(),
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::BackendKind;

    #[test]
    fn backends_parse_once_and_print_as_written() {
        assert_eq!(BackendKind::parse("nvml"), Ok(BackendKind::Nvml));
        let sim = BackendKind::parse("sim:tests/fixtures/x.yaml").unwrap();
        assert_eq!(sim.sim(), Some("tests/fixtures/x.yaml"));
        assert_eq!(sim.to_string(), "sim:tests/fixtures/x.yaml");
        assert!(!sim.is_nvml());
        for bad in ["", "NVML", "sim:", "cuda", "sim"] {
            let e = BackendKind::parse(bad).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{e}");
        }
    }
}
