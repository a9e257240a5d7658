//! `gpu-slicer cdi-hook set-memory-limit`: the CDI hook that binds a container's GPU memory.
//!
//! Run by the container runtime on the host (a CDI `createRuntime` hook) with the OCI state
//! on stdin; sets the hard limit of the container's cgroup on one GPU through NVML
//! (`crate::enforce`). Any failure exits non-zero with a one-line reason on stderr, so the
//! runtime refuses to start the container instead of starting it unlimited.

use std::io::Read;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::enforce::{self, EnforceError, MemoryLimiter, nvml::NvmlLimiter};

/// `cdi-hook` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum CdiHookCommand {
    /// Set the container's hard GPU-memory limit on one GPU.
    SetMemoryLimit(SetMemoryLimitArgs),
}

/// `cdi-hook set-memory-limit` arguments.
#[derive(Debug, Clone, Args)]
pub struct SetMemoryLimitArgs {
    /// GPU UUID (`GPU-…`; MIG devices are not supported by the driver).
    #[arg(long)]
    pub device: String,
    /// Hard limit in bytes (k × device memory / N for k of N shares).
    #[arg(long)]
    pub bytes: u64,
    /// NVML library (default: libnvidia-ml.so.1).
    #[arg(long)]
    pub nvml_lib: Option<PathBuf>,
    /// Root of /proc.
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Root of the cgroup filesystem.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
}

/// Run a `cdi-hook` subcommand with the real NVML limiter, reading the state from stdin.
pub fn run(cmd: &CdiHookCommand) -> Result<(), EnforceError> {
    match cmd {
        CdiHookCommand::SetMemoryLimit(args) => {
            let mut limiter = NvmlLimiter::new(args.nvml_lib.clone());
            let mut state = String::new();
            std::io::stdin()
                .read_to_string(&mut state)
                .map_err(|source| EnforceError::Read {
                    path: PathBuf::from("<stdin>"),
                    source,
                })?;
            run_with(args, &state, &mut limiter)
        }
    }
}

/// `set-memory-limit` with an injected limiter and state (tests).
pub fn run_with(
    args: &SetMemoryLimitArgs,
    state: &str,
    limiter: &mut dyn MemoryLimiter,
) -> Result<(), EnforceError> {
    enforce::set_memory_limit(
        state,
        &args.proc_root,
        &args.cgroup_root,
        &args.device,
        args.bytes,
        limiter,
    )
    .map(|_| ())
}
