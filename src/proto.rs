//! Generated kubelet gRPC bindings, included once, plus the API constants.
//!
//! `build.rs` compiles `proto/` into `OUT_DIR`. Only `crate::runtime::plugin` and `crate::testkit::kubelet`
//! (the gRPC edges) use these types; domain code never sees prost names such as
//! `device_i_ds`.

/// Device plugin API v1beta1 (`Registration` and `DevicePlugin` services).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
}

/// PodResources API v1 (`PodResourcesLister`).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod podresources {
    tonic::include_proto!("v1");
}

/// The API version string sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";

/// Default device-plugin socket directory.
pub const DEFAULT_DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// File name of the kubelet's registration socket inside the device-plugin directory.
pub const KUBELET_SOCKET_NAME: &str = "kubelet.sock";

/// Health value of a usable device.
pub const HEALTHY: &str = "Healthy";

/// Health value of an unusable device.
pub const UNHEALTHY: &str = "Unhealthy";
