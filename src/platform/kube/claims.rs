//! ResourceClaims through the API: the [`ClaimSource`] the DRA driver's Prepare reads claims
//! with (`GET resourceclaims/<name>` in the claim's namespace, `resource.k8s.io/v1`). The
//! object is handed to the domain as its JSON, so the domain's claim model stays free of
//! `k8s-openapi`. A 404 is the claim's "not found"; any other failure (403, 5xx, a timeout,
//! the API down) is "unavailable" with the status, and the kubelet retries the prepare.
//! Device status is written by `super::claim_status`.

use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim as ApiClaim;
use kube::Api;

use crate::domain::dra::claim::{ClaimRef, ResourceClaim};
use crate::domain::dra::status::DeviceStatus;
use crate::platform::claims::{ClaimSource, ClaimSourceError, PortFuture};

/// How long one GET may take (the kubelet gives a whole prepare call 45 s).
const GET_TIMEOUT: Duration = Duration::from_secs(10);

/// Claims read from the API server.
#[derive(Clone)]
pub(crate) struct KubeClaims {
    client: kube::Client,
}

impl std::fmt::Debug for KubeClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClaims").finish_non_exhaustive()
    }
}

impl KubeClaims {
    /// Claims through `client`.
    pub(crate) fn new(client: kube::Client) -> Self {
        Self { client }
    }

    async fn fetch(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimSourceError> {
        let unavailable = |message: String| ClaimSourceError::Unavailable {
            namespace: namespace.into(),
            name: name.into(),
            message,
        };
        let api: Api<ApiClaim> = Api::namespaced(self.client.clone(), namespace);
        let got = tokio::time::timeout(GET_TIMEOUT, api.get(name))
            .await
            .map_err(|_| unavailable(format!("no answer within {GET_TIMEOUT:?}")))?;
        let claim = match got {
            Ok(c) => c,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(ClaimSourceError::NotFound {
                    namespace: namespace.into(),
                    name: name.into(),
                });
            }
            Err(kube::Error::Api(s)) => {
                return Err(unavailable(format!(
                    "{} {}: {}",
                    s.code, s.reason, s.message
                )));
            }
            Err(e) => return Err(unavailable(e.to_string())),
        };
        let json = serde_json::to_value(&claim).map_err(|e| unavailable(e.to_string()))?;
        serde_json::from_value(json)
            .map_err(|e| unavailable(format!("unexpected claim object: {e}")))
    }
}

impl ClaimSource for KubeClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<ResourceClaim, ClaimSourceError>> + Send + 'a>,
    > {
        Box::pin(self.fetch(namespace, name))
    }

    fn set_device_status<'a>(
        &'a self,
        claim: &'a ClaimRef,
        driver: &'a str,
        devices: &'a [DeviceStatus],
    ) -> PortFuture<'a, ()> {
        Box::pin(super::claim_status::set_device_status(
            &self.client,
            claim,
            driver,
            devices,
        ))
    }
}
