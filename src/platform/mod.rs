//! The platform: everything that touches the host — NVML (inventory, events, memory limits),
//! the sim backend's node files, files on disk (atomic CDI spec and NFD feature-file writes),
//! and the MPS daemons' size-bounded `/dev/shm` mounts.

pub(crate) mod atomic_file;
pub(crate) mod cdi_host;
pub(crate) mod cdi_writer;
pub(crate) mod checkpoint;
pub(crate) mod claims;
pub(crate) mod config_file;
pub(crate) mod dra_mig;
pub(crate) mod dra_state;
pub(crate) mod driver;
pub(crate) mod enforce;
pub(crate) mod fleet_state;
pub(crate) mod fswatch;
pub(crate) mod http_get;
pub(crate) mod kube;
pub(crate) mod labels_file;
pub(crate) mod mig;
pub(crate) mod mps_shm;
pub(crate) mod nvml;
pub(crate) mod nvml_events;
pub(crate) mod nvml_topology;
pub(crate) mod prometheus;
pub(crate) mod sim;
pub(crate) mod uds_authority;
pub(crate) mod usage;
pub(crate) mod versioned;
