//! Command-line surface (clap). TEMPORARY on branch `plugin`: the lead's `cli.rs` on main
//! replaces this at merge; only `run` and `demo` are wired here.

use clap::{Parser, Subcommand, ValueEnum};

use crate::commands::run::RunArgs;

/// gpu-slicer: hand out exactly the GPU share a workload asks for.
#[derive(Debug, Parser)]
#[command(name = "gpu-slicer", version, about)]
pub struct Cli {
    /// Log output format.
    #[arg(long, global = true, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node daemon: serve every resource to the kubelet.
    Run(RunArgs),
    /// Show the device plugin at work against an in-process kubelet emulator.
    Demo,
}
