//! The `gpu-slicer` binary: parse the command line, set up logging, run the library, map
//! the error to an exit code. Everything else lives in the library.

use std::process::ExitCode;

use clap::Parser;
use gpu_slicer::cli::{Cli, Command, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let mut stdout = std::io::stdout().lock();
    let result = match &cli.command {
        Command::Inventory(args) => gpu_slicer::commands::inventory::run(args, &mut stdout),
        Command::Cdi(cmd) => gpu_slicer::commands::cdi::run(cmd, &mut stdout).map_err(Into::into),
        Command::Run(args) => {
            return run_async(|| gpu_slicer::commands::run::run(args), |e| e.exit_code());
        }
        Command::Demo => {
            return run_async(
                || gpu_slicer::commands::demo::demo(&mut stdout),
                |_| ExitCode::from(1),
            );
        }
        Command::CdiHook(cmd) => gpu_slicer::commands::cdi_hook::run(cmd).map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-slicer: error: {e}");
            e.exit_code()
        }
    }
}

/// Run an async command on a multi-threaded runtime and map its error to an exit code.
fn run_async<F, E>(command: impl FnOnce() -> F, exit_code: impl FnOnce(&E) -> ExitCode) -> ExitCode
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpu-slicer: error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(command()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-slicer: error: {e}");
            exit_code(&e)
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
