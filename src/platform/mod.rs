//! The platform: everything that touches the host — NVML (inventory, events, memory limits),
//! the sim backend's node files, and files on disk (atomic CDI spec writes).

pub mod cdi_writer;
pub mod checkpoint;
pub mod driver;
pub mod enforce;
pub mod fswatch;
pub mod mig;
pub mod nvml;
pub mod nvml_events;
pub mod sim;
