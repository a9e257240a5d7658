//! Test and demo support: an in-process kubelet emulator (registration, device manager,
//! PodResources) used by `gpu-slicer demo`, the integration tests and the benches.

pub mod fixtures;
pub mod kubelet;
