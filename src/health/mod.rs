//! Health: event sources (NVML event thread, sim injector) and the policy that turns
//! events into per-device health with recovery. The supervisor runs the health task and
//! pushes transitions into the device plugin's state, which streams them to the kubelet.

pub mod monitor;
pub mod nvml_events;
pub mod policy;
