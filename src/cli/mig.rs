//! `gpu-slicer mig apply`: take every GPU to a named layout of a mig-parted config file.
//!
//! Reads the file ([`crate::domain::miglayout::parse`]), the GPUs and their instances (NVML
//! through [`crate::platform::mig`], or a sim inventory with assumed placements), plans each
//! GPU ([`crate::domain::miglayout::plan_gpu`]), prints the plan and, unless `--dry-run`,
//! runs it. `--format json` is a contract:
//! `{"gpus": [{"index", "uuid", "status", "reason"?, "steps": [{"action", "kind", "profile",
//! "placement"?}]}]}` with `status` one of `unchanged`, `changed`, `pending`. A GPU whose step
//! failed is rolled back and reported `pending` with the reason; the command then exits 1.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde::Serialize;

use crate::cli::args::{BackendArgs, OutputFormat};
use crate::domain::inventory::{Backend, InventoryError};
use crate::domain::miglayout::{GpuPlan, MigLayoutError, MigPartedFile, PlanStatus};
use crate::platform::mig::{self as ops, MigOpError};

/// `gpu-slicer mig …`.
#[derive(Debug, Subcommand)]
pub(crate) enum MigCommand {
    /// Compute, print and apply the steps that take each GPU to a layout of a mig-parted file.
    Apply(MigApplyArgs),
}

/// mig-parted's variable for its config file.
const PARTED_FILE_VAR: &str = "MIG_PARTED_CONFIG_FILE";
/// mig-parted's variable for the layout to apply.
const PARTED_LAYOUT_VAR: &str = "MIG_PARTED_SELECTED_CONFIG";

/// Arguments of `mig apply`.
#[derive(Debug, Args)]
pub(crate) struct MigApplyArgs {
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// mig-parted config file (`version: v1`, `mig-configs`): the daemon's
    /// `--mig-layout-file`, under the same name and variable. `--config-file`, its first
    /// name, still works but is not shown: everywhere else it means `--config`.
    /// mig-parted's own `MIG_PARTED_CONFIG_FILE` is read when neither is given.
    #[arg(long, alias = "config-file", env = "MIG_LAYOUT_FILE")]
    pub(crate) mig_layout_file: Option<PathBuf>,
    /// The layout (a key of `mig-configs`) to apply: the daemon's `--mig-layout`
    /// (`--layout` still works; mig-parted's `MIG_PARTED_SELECTED_CONFIG` when neither is given).
    #[arg(long, alias = "layout", env = "MIG_LAYOUT")]
    pub(crate) mig_layout: Option<String>,
    /// Print the steps without running them.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) format: OutputFormat,
}

/// Errors of `mig`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MigError {
    /// The layout file or the layout does not fit.
    #[error(transparent)]
    Layout(Box<MigLayoutError>),
    /// The backend could not be opened or read.
    #[error(transparent)]
    Backend(#[from] InventoryError),
    /// NVML failed reading the instances.
    #[error(transparent)]
    Op(#[from] MigOpError),
    /// No layout file or no layout, by flag or variable.
    #[error("mig apply needs {flag} (or {var}, or mig-parted's {parted})")]
    Missing {
        flag: &'static str,
        var: &'static str,
        parted: &'static str,
    },
    /// `--backend sim:…` without `--dry-run`.
    #[error(
        "the sim backend `{0}` cannot change MIG instances: add --dry-run, or use --backend nvml"
    )]
    SimReadOnly(String),
    /// Some GPUs failed (the output says which and why).
    #[error("{0} GPU(s) could not be repartitioned (see the output)")]
    Failed(usize),
    /// Writing output.
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

impl From<MigLayoutError> for MigError {
    fn from(e: MigLayoutError) -> Self {
        Self::Layout(Box::new(e))
    }
}

/// The JSON document.
#[derive(Debug, Serialize)]
struct Report<'a> {
    gpus: &'a [GpuPlan],
}

/// Run `mig`.
pub(crate) fn run(cmd: &MigCommand, out: &mut dyn Write) -> Result<(), MigError> {
    let MigCommand::Apply(args) = cmd;
    // mig-parted's variables, for scripts written against it: read after ours, so one
    // setting never has two meanings.
    let layout_file = args
        .mig_layout_file
        .clone()
        .or_else(|| std::env::var_os(PARTED_FILE_VAR).map(PathBuf::from))
        .ok_or(MigError::Missing {
            flag: "--mig-layout-file",
            var: "MIG_LAYOUT_FILE",
            parted: PARTED_FILE_VAR,
        })?;
    let layout = args
        .mig_layout
        .clone()
        .or_else(|| std::env::var(PARTED_LAYOUT_VAR).ok())
        .ok_or(MigError::Missing {
            flag: "--mig-layout",
            var: "MIG_LAYOUT",
            parted: PARTED_LAYOUT_VAR,
        })?;
    let file = ops::load_file(&layout_file)?;
    file.layout(&layout)?;
    let (plans, failed) = if let Some(profile) = args.backend.backend.sim() {
        if !args.dry_run {
            return Err(MigError::SimReadOnly(profile.to_string()));
        }
        let inventory = crate::platform::sim::SimBackend::open(profile)?.discover()?;
        let gpus = ops::from_inventory(&inventory);
        (ops::plan_all(&file, &layout, &gpus)?, 0)
    } else {
        let nvml = crate::platform::nvml::open_nvml(args.backend.nvml_lib.as_deref())?;
        let gpus = ops::read(&nvml)?;
        let mut plans = ops::plan_all(&file, &layout, &gpus)?;
        let mut failed = 0;
        if !args.dry_run {
            for (plan, gpu) in plans.iter_mut().zip(&gpus) {
                if plan.status != PlanStatus::Changed {
                    continue;
                }
                if let Err(f) = ops::apply(&nvml, gpu, &plan.steps) {
                    failed += 1;
                    *plan = plan.clone().pending(f.to_string());
                }
            }
        }
        (plans, failed)
    };
    match args.format {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &Report { gpus: &plans })
                .map_err(std::io::Error::other)?;
            writeln!(out)?;
        }
        OutputFormat::Table => write_table(out, &file, &layout, &plans, args.dry_run)?,
    }
    if failed > 0 {
        return Err(MigError::Failed(failed));
    }
    Ok(())
}

fn write_table(
    out: &mut dyn Write,
    file: &MigPartedFile,
    layout: &str,
    plans: &[GpuPlan],
    dry_run: bool,
) -> std::io::Result<()> {
    writeln!(
        out,
        "layout {layout} from {}{}",
        file.origin,
        if dry_run {
            " (dry run: nothing applied)"
        } else {
            ""
        }
    )?;
    for p in plans {
        let status = match p.status {
            PlanStatus::Unchanged => "unchanged",
            PlanStatus::Changed => "changed",
            PlanStatus::Pending => "pending",
        };
        write!(out, "GPU {} {}: {status}", p.index, p.uuid)?;
        match &p.reason {
            Some(r) => writeln!(out, " ({r})")?,
            None => writeln!(out)?,
        }
        for (i, s) in p.steps.iter().enumerate() {
            writeln!(out, "  {}. {}", i + 1, ops::describe(s))?;
        }
    }
    Ok(())
}
