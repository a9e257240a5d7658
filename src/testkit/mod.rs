//! Test and demo support: an in-process kubelet emulator (registration, device manager,
//! PodResources) and [`Node`], the one start-up of a daemon with it, used by `gpu-slicer
//! demo`, the integration tests and the benches; and an in-process Kubernetes API server
//! ([`apiserver`]) for the node-label and DRA tests.

pub mod apiserver;
pub mod fixtures;
pub mod kubelet;
pub mod node;
pub mod stats;

pub use node::{Node, NodeError, wait_until};
