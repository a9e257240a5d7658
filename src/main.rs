//! The `gpu-slicer` binary: parse the command line, set up logging, run the library, map
//! the error to an exit code (the one map, [`gpu_slicer::error::Error::exit_code`]).

use std::process::ExitCode;

use clap::Parser;
use gpu_slicer::cli::args::{Cli, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    match gpu_slicer::cli::dispatch(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-slicer: error: {e}");
            e.exit_code()
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
