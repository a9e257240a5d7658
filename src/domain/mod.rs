//! The domain: pure logic over plain values. Nothing here does I/O on its own or imports
//! tokio, tonic, hyper, notify or clap; the runtime and the platform layers feed it values and
//! act on what it returns.

pub(crate) mod advise;
pub(crate) mod allocate;
pub(crate) mod cdi;
pub(crate) mod cdi_kind;
pub(crate) mod config;
pub(crate) mod devnodes;
pub(crate) mod dra;
pub(crate) mod fleet;
pub(crate) mod health;
pub(crate) mod inventory;
pub(crate) mod labels;
pub(crate) mod miglayout;
pub(crate) mod mps;
pub(crate) mod plan;
pub(crate) mod snapshot;
pub(crate) mod topology;
pub(crate) mod transition;
pub(crate) mod usage;
pub(crate) mod view;
