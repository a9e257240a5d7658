//! Generated kubelet gRPC bindings (device plugin, pod resources, DRA, plugin registration,
//! DRA health), included once, plus the API constants.
//!
//! `build.rs` compiles `proto/` into `OUT_DIR`. Only `crate::runtime::plugin`, `crate::runtime::dra` and `crate::testkit::kubelet`
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
pub(crate) mod podresources {
    tonic::include_proto!("v1");
}

/// Kubelet DRA plugin API v1 (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, Kubernetes 1.34+).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub(crate) mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// Kubelet DRA plugin API v1beta1 (`k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub(crate) mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// The kubelet plugin watcher's registration API (`pluginregistration.Registration`).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub(crate) mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// DRA resource health, bare package `v1alpha1` (`v1alpha1.DRAResourceHealth`).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub(crate) mod drahealth_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// DRA resource health, bare package `v1` (`v1.DRAResourceHealth`, 1.37), generated apart
/// from pod-resources v1 (same package name) by `build.rs`.
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub(crate) mod drahealth_v1 {
    include!(concat!(env!("OUT_DIR"), "/drahealth_v1/v1.rs"));
}

/// The API version string sent in `RegisterRequest.version`.
pub(crate) const VERSION: &str = "v1beta1";

/// Default device-plugin socket directory.
pub(crate) const DEFAULT_DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// File name of the kubelet's registration socket inside the device-plugin directory.
pub(crate) const KUBELET_SOCKET_NAME: &str = "kubelet.sock";

/// Health value of a usable device.
pub const HEALTHY: &str = "Healthy";

/// Health value of an unusable device.
pub(crate) const UNHEALTHY: &str = "Unhealthy";
