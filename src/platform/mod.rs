//! The platform: everything that touches the host — NVML (inventory, events, memory limits),
//! the sim backend's node files, files on disk (atomic CDI spec and NFD feature-file writes),
//! and the MPS daemons' size-bounded `/dev/shm` mounts.

pub mod atomic_file;
pub mod cdi_host;
pub mod cdi_writer;
pub mod checkpoint;
pub mod claims;
pub mod config_file;
pub mod dra_mig;
pub mod dra_state;
pub mod driver;
pub mod enforce;
pub mod fleet_state;
pub mod fswatch;
pub mod kube;
pub mod labels_file;
pub mod mig;
pub mod mps_shm;
pub mod nvml;
pub mod nvml_events;
pub(crate) mod nvml_topology;
pub mod sim;
pub mod usage;
