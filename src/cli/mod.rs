//! The command-line layer: clap types ([`args`], the only clap user) and one module per
//! subcommand, each turning arguments into settings and calling the library.

pub mod args;
pub mod backend;
pub mod cdi;
pub mod cdi_hook;
pub mod demo;
pub mod inventory;
pub mod run;

use std::io::Write;

use args::{Cli, Command};

use crate::error::Error;

/// Run the parsed command line to completion. `run` and `demo` get an async runtime; the
/// other commands are synchronous.
pub fn dispatch(cli: &Cli) -> Result<(), Error> {
    let mut stdout = std::io::stdout().lock();
    match &cli.command {
        Command::Inventory(args) => inventory::run(args, &mut stdout),
        Command::Cdi(cmd) => Ok(cdi::run(cmd, &mut stdout)?),
        Command::CdiHook(cmd) => Ok(cdi_hook::run(cmd)?),
        Command::Run(args) => block_on(run::run(args)),
        Command::Demo => block_on(demo::demo(&mut stdout)),
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
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_keep_alive(std::time::Duration::from_secs(1))
        .enable_all()
        .build()
}
