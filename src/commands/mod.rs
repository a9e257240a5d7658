//! Subcommand implementations: each takes parsed arguments, calls the library and returns
//! its error; `main` maps errors to exit codes.

pub mod demo;
pub mod run;
