//! DRA (Dynamic Resource Allocation, `resource.k8s.io/v1`): the pure half of the DRA driver.
//!
//! The same inventory, plan and health the device plugin serves are turned here into the
//! objects a DRA driver publishes and the answers it gives the kubelet:
//!
//! - [`slices`]: Inventory × Plan × health → ResourceSlices (device names, attributes,
//!   capacity, taints, splitting at the API's device limits, the 1.34 and 1.35+ layouts);
//! - [`capacity`]: consumable `memory` / `compute` of shared devices, what a claim's share
//!   takes, the node's own over-commit check;
//! - [`partition`]: MIG on demand: the counter set and per-placement devices of a GPU
//!   `flags.dra.dynamicMig` names;
//! - [`classes`]: the DeviceClasses the deploy overlay installs (`gpu.<driver>` with
//!   `extendedResourceName: nvidia.com/gpu`, `mig.<driver>`);
//! - [`opaque`]: strict parsing of `opaque.parameters` (`gpu-slicer.io/v1alpha1`, kinds
//!   `GpuConfig` / `MigDeviceConfig`, NVIDIA's field names);
//! - [`claim`]: the ResourceClaim fields the driver reads, and resolving an allocation to
//!   this node's devices (foreign results ignored, missing/unhealthy/already-prepared
//!   devices refused);
//! - [`cdi`]: the per-claim transient CDI spec, cut from the node's generated spec
//!   (`crate::domain::cdi::generate`), so both front-ends hand out the same container edits;
//! - [`claim_error`]: why a claim is refused, one variant per rule, with its class and rule
//!   name (turned into text only at the gRPC edge);
//! - [`status`]: what a prepared claim's `status.devices` says about each device;
//! - [`check`]: a claim or template checked before it is applied (`dra check-claim`): its
//!   opaque config with Prepare's parser, the names its selectors use against the node's.
//!
//! The runtime (`crate::runtime::dra`) serves the kubelet and publishes the objects; the
//! CLI (`crate::cli::dra`) prints them.

pub(crate) mod capacity;
pub(crate) mod cdi;
pub(crate) mod check;
pub(crate) mod claim;
pub(crate) mod claim_error;
pub(crate) mod classes;
pub(crate) mod model;
pub(crate) mod opaque;
pub(crate) mod partition;
pub(crate) mod slices;
pub(crate) mod status;

/// Default driver name (`--dra-driver-name`).
pub(crate) const DEFAULT_DRIVER_NAME: &str = "gpu-slicer.io";

/// `apiVersion` of the objects this driver publishes and reads.
pub(crate) const API_VERSION: &str = "resource.k8s.io/v1";

/// The first Kubernetes 1.x minor that serves [`API_VERSION`].
pub(crate) const MIN_SERVER_MINOR: u32 = 34;

/// Errors of the DRA domain's names and versions (a claim's are [`claim_error::ClaimError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DraError {
    /// The driver name is not a DNS subdomain of at most 63 characters.
    #[error("invalid DRA driver name `{name}`: {rule}")]
    DriverName { name: String, rule: String },
    /// The node name cannot name a pool.
    #[error("invalid node name `{name}`: {rule}")]
    NodeName { name: String, rule: String },
    /// A Kubernetes version (`dra slices --server-version`) older than the first that serves
    /// `resource.k8s.io/v1`.
    #[error(
        "--server-version `{value}`: DRA objects are resource.k8s.io/v1, which Kubernetes serves from 1.{MIN_SERVER_MINOR}"
    )]
    ServerTooOld { value: String },
    /// A Kubernetes version (`dra slices --server-version`) that is not `MAJOR.MINOR`.
    #[error("invalid --server-version `{value}`: expected MAJOR.MINOR, e.g. 1.34")]
    ServerVersion { value: String },
    /// `dra check-claim`: the claim file cannot be read or is not YAML.
    #[error("claim file {file}: {message}")]
    ClaimFile { file: String, message: String },
    /// `dra check-claim`: what is wrong in the claims of a file, every problem.
    #[error("claim file {file}: {}", problems.iter().map(|p| format!("\n  {p}")).collect::<String>())]
    Claims {
        file: String,
        problems: Vec<check::Problem>,
    },
}

/// Check a driver name: a lowercase DNS subdomain of at most 63 characters (the limit of
/// `ResourceSlice.spec.driver`).
pub(crate) fn check_driver_name(name: &str) -> Result<(), DraError> {
    let bad = |rule: &str| DraError::DriverName {
        name: name.to_string(),
        rule: rule.to_string(),
    };
    if name.is_empty() || name.len() > 63 {
        return Err(bad("must be 1 to 63 characters"));
    }
    if !name.split('.').all(model::is_dns_label) {
        return Err(bad(
            "must be a DNS subdomain: lowercase labels of a-z, 0-9 and '-', joined by '.'",
        ));
    }
    Ok(())
}

/// The CDI vendor of the per-claim specs: `k8s.<driver>`, the DRA helper library's rule.
pub(crate) fn cdi_vendor(driver: &str) -> String {
    format!("k8s.{driver}")
}
