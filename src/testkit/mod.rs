//! Test and demo support: an in-process kubelet emulator (registration, device manager,
//! PodResources) used by `gpu-slicer demo`, the integration tests and the benches; and an
//! in-process Kubernetes API server ([`apiserver`]) for the node-label and DRA tests.

pub mod apiserver;
pub mod fixtures;
pub mod kubelet;
