//! Where the DRA driver reads ResourceClaims from, and writes their device status to: the
//! port that `crate::platform::kube` implements over the API and the test kit implements
//! over a map. It sits in the platform layer, beside its implementation, so the runtime
//! names it and the platform never names the runtime.

use std::future::Future;
use std::pin::Pin;

use crate::domain::dra::claim::{ClaimRef, ResourceClaim};
use crate::domain::dra::status::DeviceStatus;

/// Errors reading a claim from the API, as the claim's error text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClaimSourceError {
    /// The API has no such claim.
    #[error("claim {namespace}/{name} not found in the API")]
    NotFound { namespace: String, name: String },
    /// The API refused, failed or could not be reached.
    #[error("cannot read claim {namespace}/{name} from the API: {message}")]
    Unavailable {
        namespace: String,
        name: String,
        message: String,
    },
    /// The claim's status could not be written (the HTTP status when the API answered).
    #[error("cannot write the status of claim {namespace}/{name}: {message}")]
    Status {
        namespace: String,
        name: String,
        code: Option<u16>,
        message: String,
    },
}

/// A boxed future of the port.
pub(crate) type PortFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, ClaimSourceError>> + Send + 'a>>;

/// Where claims are read from: the Kubernetes API in the daemon, a map in tests.
pub(crate) trait ClaimSource: Send + Sync + std::fmt::Debug {
    /// GET `resourceclaims/<name>` in `namespace`.
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<ResourceClaim, ClaimSourceError>> + Send + 'a>,
    >;

    /// Make `driver`'s entries of the claim's `status.devices` exactly `devices` (none:
    /// remove them), leaving other drivers' entries alone; a claim that is gone or was
    /// re-created (another UID) is left alone. The default writes nothing (a source without
    /// an API).
    fn set_device_status<'a>(
        &'a self,
        claim: &'a ClaimRef,
        driver: &'a str,
        devices: &'a [DeviceStatus],
    ) -> PortFuture<'a, ()> {
        let _ = (claim, driver, devices);
        Box::pin(async { Ok(()) })
    }
}
