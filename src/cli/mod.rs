//! The command-line layer: clap types ([`args`], the only clap user) and one module per
//! subcommand, each turning arguments into settings and calling the library.

pub(crate) mod advise;
pub(crate) mod args;
pub(crate) mod backend;
pub(crate) mod cdi;
pub(crate) mod cdi_hook;
pub(crate) mod demo;
pub(crate) mod dra;
pub(crate) mod dra_args;
#[cfg(feature = "testkit")]
pub(crate) mod emulate;
pub(crate) mod env_errors;
pub(crate) mod error;
pub(crate) mod fleet_args;
pub(crate) mod given;
pub(crate) mod inventory;
pub(crate) mod kube_args;
pub(crate) mod labels;
pub(crate) mod logging;
pub(crate) mod mig;
pub(crate) mod nvidia;
pub(crate) mod run;
pub(crate) mod top;

use std::io::Write;

use clap::{Parser, Subcommand, ValueEnum};

use self::error::Error;

/// gpu-slicer: hand out exactly the GPU share a workload asks for.
#[derive(Debug, Parser)]
#[command(name = "gpu-slicer", version, about)]
pub(crate) struct Cli {
    /// Log output format.
    #[arg(long, global = true, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

impl Cli {
    /// The log filter when `RUST_LOG` is unset: `error` for the demo, whose narrative on
    /// stdout shares the terminal with the log (the warnings it provokes on purpose, such as
    /// a refused Allocate, are told in the story; a failure still shows), `info` for
    /// everything else.
    pub(crate) fn default_log_filter(&self) -> &'static str {
        match self.command {
            Command::Demo => "error",
            _ => "info",
        }
    }
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Show the node's GPUs, MIG slices and the resources the config turns them into.
    Inventory(Box<args::InventoryArgs>),
    /// Print the node labels (GPU Feature Discovery's names) once, as `key=value` lines.
    Labels(Box<labels::LabelsArgs>),
    /// Generate, check, list and remove CDI specs.
    #[command(subcommand)]
    Cdi(cdi::CdiCommand),
    /// Run the node daemon: serve every resource to the kubelet until SIGTERM/SIGINT.
    Run(Box<run::RunArgs>),
    /// Show the device plugin at work against an in-process kubelet emulator.
    Demo,
    /// MIG layouts as code: apply a layout of a mig-parted config file to idle GPUs.
    #[command(subcommand)]
    Mig(mig::MigCommand),
    /// Hooks the container runtime runs from CDI specs (on the host, OCI state on stdin).
    #[command(subcommand)]
    CdiHook(cdi_hook::CdiHookCommand),
    /// Dynamic Resource Allocation: the objects this node's DRA driver publishes.
    #[command(subcommand)]
    Dra(dra::DraCommand),
    /// A terminal view of the node's usage, read from the daemon's `/v1/state`.
    Top(top::TopArgs),
    /// Turn measured usage (Prometheus or an export) into a partitioning plan as code and a report.
    Advise(Box<advise::AdviseArgs>),
    /// Test support: the API-server and kubelet DRA emulators, driven from stdin.
    #[cfg(feature = "testkit")]
    #[command(hide = true)]
    Emulate(emulate::EmulateArgs),
}

/// Parse the process's command line, or exit as clap does (2 for a usage error, 0 for
/// `--help`), a bad value from an environment variable blamed on that variable and the
/// message in the one error style of every command ([`usage_error_text`]).
pub(crate) fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut cmd = Cli::command();
    let parsed = cmd
        .try_get_matches_from_mut(&argv)
        .and_then(|m| Cli::from_arg_matches(&m));
    match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let e = env_errors::blame_env(e.format(&mut cmd), &cmd, &argv, |v| std::env::var_os(v));
            match usage_error_text(&e) {
                Some(text) if e.use_stderr() => {
                    eprint!("{text}");
                    std::process::exit(e.exit_code())
                }
                // `--help`, `--version` (exit 0) and the help clap shows for a missing
                // subcommand (exit 2) are not error messages: clap prints them as they are.
                _ => e.exit(),
            }
        }
    }
}

/// How every error of the binary starts, a usage error found by clap or a failure of the
/// command ([`logging::report_fatal`]): one style, so scripts and people match one prefix.
pub(crate) const ERROR_PREFIX: &str = "gpu-slicer: error: ";

/// A usage error as the binary prints it: clap's text (plain, no colour) under
/// [`ERROR_PREFIX`] instead of clap's own `error: `; `None` for what clap prints that is not
/// an error message (help, version).
pub(crate) fn usage_error_text(err: &clap::Error) -> Option<String> {
    let text = err.render().to_string();
    let body = text.strip_prefix("error: ")?;
    Some(format!("{ERROR_PREFIX}{body}"))
}

/// Run the parsed command line to completion. `run` and `demo` get an async runtime; the
/// other commands are synchronous.
pub(crate) fn dispatch(cli: &Cli) -> Result<(), Error> {
    let mut stdout = std::io::stdout().lock();
    match &cli.command {
        Command::Inventory(args) => inventory::run(args, &mut stdout),
        Command::Labels(args) => labels::run(args, &mut stdout),
        Command::Cdi(cmd) => Ok(cdi::run(cmd, &mut stdout)?),
        Command::CdiHook(cmd) => Ok(cdi_hook::run(cmd)?),
        Command::Mig(cmd) => Ok(mig::run(cmd, &mut stdout).map_err(Box::new)?),
        Command::Run(args) => block_on(run::run(args)),
        Command::Demo => block_on(demo::demo(&mut stdout)),
        Command::Top(args) => Ok(top::run(args, &mut stdout)?),
        Command::Dra(cmd) => dra::run(cmd, &mut stdout),
        Command::Advise(args) => Ok(advise::run(args, &mut stdout)?),
        #[cfg(feature = "testkit")]
        Command::Emulate(args) => block_on(emulate::emulate(args, &mut stdout)),
    }?;
    stdout.flush()?;
    Ok(())
}

/// Drive one async command on a runtime sized for a node agent (see [`runtime`]).
fn block_on<E: Into<Error>>(
    f: impl std::future::Future<Output = Result<(), E>>,
) -> Result<(), Error> {
    let rt = runtime().map_err(Error::Runtime)?;
    let result = rt.block_on(f);
    // Dropping a runtime waits for every blocking task; one stuck in a driver call (NVML,
    // an MPS control command) must not hold the exit: the daemon has stopped already.
    rt.shutdown_timeout(std::time::Duration::from_millis(50));
    result.map_err(Into::into)
}

/// The async runtime of the daemon: one worker thread. The agent's work is a handful of
/// sockets and timers; blocking NVML and file I/O go to `spawn_blocking` threads that exit
/// when idle, so an idle daemon keeps its thread count (and RSS) small.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_keep_alive(std::time::Duration::from_secs(1))
        .enable_all()
        .build()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, ERROR_PREFIX, usage_error_text};

    #[test]
    fn usage_errors_take_the_prefix_of_every_other_error() {
        let err = Cli::try_parse_from(["gpu-slicer", "inventory", "--no-such-flag"]).unwrap_err();
        let text = usage_error_text(&err).expect("an error message");
        assert!(text.starts_with(ERROR_PREFIX), "{text}");
        assert!(text.contains("'--no-such-flag'"), "{text}");
        assert!(!text.contains("error: error:"), "{text}");
        assert!(!text.contains('\x1b'), "{text}");
        let help = Cli::try_parse_from(["gpu-slicer", "--help"]).unwrap_err();
        assert_eq!(usage_error_text(&help), None);
    }
}
