//! The `gpu-slicer` binary: parse the command line, set up logging, run the library, map
//! the error to an exit code. (Temporary on branch `plugin`; main's version wins at merge.)

use std::process::ExitCode;

use clap::Parser;
use gpu_slicer::cli::{Cli, Command, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpu-slicer: error: cannot start runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result: Result<(), Box<dyn std::error::Error>> = runtime.block_on(async {
        match &cli.command {
            Command::Run(args) => gpu_slicer::commands::run::run(args)
                .await
                .map_err(Into::into),
            Command::Demo => {
                let mut out = std::io::stdout();
                gpu_slicer::commands::demo::demo(&mut out)
                    .await
                    .map_err(Into::into)
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-slicer: error: {e}");
            ExitCode::from(1)
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
