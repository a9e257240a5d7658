//! The Kubernetes API flags shared by the node-label reporter and the DRA driver, as one
//! clap group to flatten into `run` (and any subcommand that talks to the API).

use clap::Args;

use crate::platform::kube::{ClientSource, InClusterEnv, KubeError};

/// How to reach the Kubernetes API, and which Node this agent runs on.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct KubeArgs {
    /// Kubeconfig file(s), `:`-separated (default: the pod's service account, in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub(crate) kubeconfig: Option<String>,
    /// The Node this agent runs on (from the downward API: `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub(crate) node_name: Option<String>,
}

impl KubeArgs {
    /// Where the client's cluster and credentials come from.
    pub(crate) fn source(&self) -> Result<ClientSource, KubeError> {
        ClientSource::resolve(self.kubeconfig.as_deref(), &InClusterEnv::from_process())
    }

    /// `--node-name` / `NODE_NAME`, required when the API is used.
    pub(crate) fn node_name(&self) -> Result<String, KubeError> {
        crate::platform::kube::node_name(self.node_name.as_deref())
    }
}
