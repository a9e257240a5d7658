//! The platform: everything that touches the host — NVML (inventory, events, memory limits),
//! the sim backend's node files, files on disk (atomic CDI spec and NFD feature-file writes),
//! and the MPS daemons' size-bounded `/dev/shm` mounts.

// Without the `agent` feature only what the fuzz targets reach is built (Cargo.toml).
#[cfg(feature = "agent")]
pub(crate) mod atomic_file;
#[cfg(feature = "agent")]
pub(crate) mod cdi_host;
#[cfg(feature = "agent")]
pub(crate) mod cdi_writer;
#[cfg(feature = "agent")]
pub(crate) mod checkpoint;
#[cfg(feature = "agent")]
pub(crate) mod claims;
#[cfg(feature = "agent")]
pub(crate) mod config_file;
#[cfg(feature = "agent")]
pub(crate) mod dra_mig;
#[cfg(feature = "agent")]
pub(crate) mod dra_state;
pub(crate) mod driver;
pub(crate) mod enforce;
#[cfg(feature = "agent")]
pub(crate) mod fleet_state;
#[cfg(feature = "agent")]
pub(crate) mod fswatch;
#[cfg(feature = "agent")]
pub(crate) mod http_get;
#[cfg(feature = "agent")]
pub(crate) mod kube;
#[cfg(feature = "agent")]
pub(crate) mod labels_file;
pub(crate) mod mig;
#[cfg(feature = "agent")]
pub(crate) mod mps_shm;
#[cfg(feature = "agent")]
pub(crate) mod nvml;
#[cfg(feature = "agent")]
pub(crate) mod nvml_events;
#[cfg(feature = "agent")]
pub(crate) mod nvml_topology;
#[cfg(feature = "agent")]
pub(crate) mod prometheus;
pub(crate) mod sim;
#[cfg(feature = "agent")]
pub(crate) mod uds_authority;
#[cfg(feature = "agent")]
pub(crate) mod usage;
#[cfg(feature = "agent")]
pub(crate) mod versioned;
