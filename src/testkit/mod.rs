//! Test and demo support: an in-process kubelet emulator (registration, device manager,
//! PodResources) and [`Node`], the one start-up of a daemon with it, used by `gpu-slicer
//! demo`, the unit and integration tests and the benches; an in-process Kubernetes API server
//! ([`apiserver`]) for the node-label and DRA tests; and the fixtures every test shares, one
//! of each: [`within`] and [`wait_until`] (bounded waits), [`probe`] (HTTP, promtool),
//! [`fake_nvml`] (the fake driver, [`PrivateFake`]), [`manifests`] (`deploy/` rendered,
//! Kubernetes objects) and [`fixtures`] (nodes, configs, plans, stores).
//!
//! What a release build carries: `gpu-slicer demo` is a shipped command and runs against
//! the kubelet emulator, so [`kubelet`] (device-plugin side and PodResources) and
//! [`node`](mod@node) are always built. Everything else here, the DRA kubelet side included, is built only with
//! the `testkit` feature, which the tests, benches and hack scripts turn on (the crate is its
//! own dev-dependency with it: Cargo.toml).

#[cfg(feature = "testkit")]
pub(crate) mod apiserver;
#[cfg(feature = "testkit")]
pub(crate) mod fake_nvml;
#[cfg(feature = "testkit")]
pub(crate) mod fixtures;
pub(crate) mod kubelet;
#[cfg(feature = "testkit")]
pub(crate) mod manifests;
pub(crate) mod node;
#[cfg(feature = "testkit")]
pub(crate) mod probe;
#[cfg(feature = "testkit")]
pub(crate) mod stats;

#[cfg(feature = "testkit")]
pub use apiserver::{
    Admission, ApiServer, ApiServerError, Denial, Fault, RequestRecord, ShareAllocated,
    ShareRequest, User, Verb,
};
#[cfg(feature = "testkit")]
pub use fake_nvml::{PrivateFake, fake_driver_root, fake_lib, write_mig_minors};
#[cfg(feature = "testkit")]
pub use fixtures::{SHARED_CONFIG, cdi_must_reject, file_names, write_pool_configs};
#[cfg(feature = "testkit")]
pub use kubelet::dra::{DraKubeletError, DraPluginConn, DraVersion, KubeletClaim};
pub use kubelet::{Allocation, DeviceInfo, EmulatorError, KubeletEmulator, Registered};
#[cfg(feature = "testkit")]
pub use manifests::{kustomize, node, object, strings, until_labels};
pub use node::{Node, NodeError, STEP, temp_dir, wait_until, within};
#[cfg(feature = "testkit")]
pub use probe::{free_port, read_cdi_spec, spec_device_names};
#[cfg(test)]
pub(crate) use probe::{http, promtool_check, rerun_alone};
#[cfg(feature = "testkit")]
pub use stats::percentile;

/// The plugin's answer to one container's Allocate ([`Allocation::response`]).
pub use crate::domain::allocate::response::ContainerAllocation;
/// The socket file name of a resource's plugin server in the device-plugin directory.
pub use crate::runtime::plugin::socket_name;
/// How long `gpu-slicer run` may take to stop after SIGTERM, whatever it is doing.
pub use crate::runtime::supervisor::SHUTDOWN_DEADLINE;
