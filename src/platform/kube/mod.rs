//! The Kubernetes API: one `kube` client for the agent's own Node (labels, Events) and, in DRA
//! mode, ResourceSlices and ResourceClaims (`resource.k8s.io/v1`, from `k8s-openapi` `v1_37`).
//! Talks to the API server only; callers in `runtime` own the tasks that use it.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

/// The API groups and versions this agent speaks, as the server spells them (for logs).
pub(crate) fn api_versions() -> [String; 3] {
    use ::kube::Resource;
    [
        Node::api_version(&()).into_owned(),
        ResourceSlice::api_version(&()).into_owned(),
        ResourceClaim::api_version(&()).into_owned(),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn resource_api_is_v1() {
        assert_eq!(
            super::api_versions(),
            ["v1", "resource.k8s.io/v1", "resource.k8s.io/v1"]
        );
    }
}
