//! Health: device health signals that feed the inventory's and plan's health.
//!
//! - [`nvml_events`]: a dedicated thread that waits on NVML events (XID, ECC, GPU lost) and
//!   sends owned [`nvml_events::HealthEvent`]s to the async side; plus a blocking re-probe used
//!   to decide recovery. Blocking NVML calls never run on the async workers.

pub mod nvml_events;
