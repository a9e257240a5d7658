//! `gpu-slicer labels`: the node labels once, as GPU Feature Discovery's `--oneshot` prints
//! them: `key=value` lines on stdout, or written atomically to `--output-file`.
//!
//! Discovers the inventory, plans it under the config and calls
//! [`crate::domain::labels::build`]; warnings about the node go to the log (stderr).

use std::io::Write;
use std::path::PathBuf;

use crate::cli::args::{BackendArgs, PlanConfigArgs};
use crate::cli::error::Result;
use crate::domain::labels;
use crate::platform::labels_file;

/// Arguments of `gpu-slicer labels`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LabelsArgs {
    /// `--backend` and NVML settings.
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// `--config` and the flags that override it here (those that change the plan).
    #[command(flatten)]
    pub(crate) config: PlanConfigArgs,
    /// Write the NFD feature file here (atomically) instead of printing; GFD's
    /// `--output-file`.
    #[arg(long, short = 'o', alias = "output")]
    pub(crate) output_file: Option<PathBuf>,
}

/// Run `labels`.
pub(crate) fn run(args: &LabelsArgs, out: &mut dyn Write) -> Result<()> {
    let config = args.config.load()?;
    let backend = super::backend::open_backend(&args.backend)?;
    let inventory = backend.discover()?;
    let plan = crate::runtime::report::plan_logged(&inventory, &config)?;
    let node = labels::build(&inventory, &config, &plan);
    for warning in &node.warnings {
        tracing::warn!(warning = %warning, "node labels");
    }
    let text = node.to_feature_file();
    match &args.output_file {
        Some(path) => {
            labels_file::write(path, text.as_bytes())?;
        }
        None => out.write_all(text.as_bytes())?,
    }
    Ok(())
}
