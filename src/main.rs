//! The `gpu-slicer` binary: parse the command line, set up logging, run the library, map
//! the error to an exit code (the one map, [`gpu_slicer::cli::error::Error::exit_code`]).
//! Everything else lives in the library (`gpu_slicer::cli::logging` holds the output
//! policy).

use std::process::ExitCode;

use clap::Parser;
use gpu_slicer::cli::Cli;
use gpu_slicer::cli::logging::{init_tracing, is_broken_pipe, report_fatal};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format, cli.default_log_filter());
    match gpu_slicer::cli::dispatch(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        // `gpu-slicer inventory | head`: the reader left, nothing went wrong.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            report_fatal(cli.log_format, &e);
            e.exit_code()
        }
    }
}
