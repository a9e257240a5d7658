//! The domain: pure logic over plain values. Nothing here does I/O on its own or imports
//! tokio, tonic, hyper, notify or clap; the runtime and the platform layers feed it values and
//! act on what it returns.

pub mod allocate;
pub mod cdi;
pub mod cdi_kind;
pub mod config;
pub mod devnodes;
pub mod dra;
pub mod fleet;
pub mod health;
pub mod inventory;
pub mod labels;
pub mod miglayout;
pub mod mps;
pub mod plan;
pub mod snapshot;
pub mod topology;
pub mod transition;
pub mod usage;
pub mod view;
