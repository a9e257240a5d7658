//! The runtime: long-lived actors, each spawned on the daemon's `TaskTracker` and stopped by a
//! `CancellationToken`. They read the state store and talk to the kubelet, the network and
//! the platform layer.

pub mod error;
pub mod health;
pub mod http;
pub mod labels;
pub mod ledger;
pub mod metrics;
pub mod miglayout;
pub mod mps;
pub mod plugin;
pub mod reloader;
pub(crate) mod report;
pub mod supervisor;
pub mod triggers;
pub mod usage;
