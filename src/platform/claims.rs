//! Where the DRA driver reads ResourceClaims from: the port that `crate::platform::kube`
//! implements over the API and the test kit implements over a map. It sits in the platform
//! layer, beside its implementation, so the runtime names it and the platform never names
//! the runtime.

use crate::domain::dra::claim::ResourceClaim;

/// Errors reading a claim from the API, as the claim's error text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimSourceError {
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
}

/// Where claims are read from: the Kubernetes API in the daemon, a map in tests.
pub trait ClaimSource: Send + Sync + std::fmt::Debug {
    /// GET `resourceclaims/<name>` in `namespace`.
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<ResourceClaim, ClaimSourceError>> + Send + 'a>,
    >;
}
