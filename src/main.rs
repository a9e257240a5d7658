//! The `gpu-slicer` binary: parse the command line, set up logging, run the library, map
//! the error to an exit code. Everything else lives in the library
//! (`gpu_slicer::cli::logging` holds the output policy).

use std::process::ExitCode;

use clap::Parser;
use gpu_slicer::cli::logging::{init_tracing, is_broken_pipe, report_fatal};
use gpu_slicer::cli::{Cli, Command, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let format = cli.log_format;
    let mut stdout = std::io::stdout().lock();
    let result = match &cli.command {
        Command::Inventory(args) => gpu_slicer::commands::inventory::run(args, &mut stdout),
        Command::Cdi(cmd) => gpu_slicer::commands::cdi::run(cmd, &mut stdout).map_err(Into::into),
        Command::Run(args) => {
            return run_async(
                format,
                || gpu_slicer::commands::run::run(args),
                |e| e.exit_code(),
            );
        }
        Command::Demo => {
            return run_async(
                format,
                || gpu_slicer::commands::demo::demo(&mut stdout),
                |_| ExitCode::from(1),
            );
        }
        Command::CdiHook(cmd) => gpu_slicer::commands::cdi_hook::run(cmd).map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => fail(format, &e, e.exit_code()),
    }
}

/// Report a fatal error and pass its exit code on.
fn fail(format: LogFormat, error: &dyn std::fmt::Display, code: ExitCode) -> ExitCode {
    report_fatal(format, error);
    code
}

/// Run an async command on a multi-threaded runtime and map its error to an exit code.
fn run_async<F, E>(
    format: LogFormat,
    command: impl FnOnce() -> F,
    exit_code: impl FnOnce(&E) -> ExitCode,
) -> ExitCode
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let e = format!("cannot start the async runtime: {e}");
            return fail(format, &e, ExitCode::from(1));
        }
    };
    match runtime.block_on(command()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let code = exit_code(&e);
            fail(format, &e, code)
        }
    }
}
