//! The Kubernetes API: one `kube` client for the agent's own Node (labels, Events) and, in DRA
//! mode, this node's ResourceSlices ([`SliceApi`]) and ResourceClaims (read, and their
//! `status.devices` written; `resource.k8s.io/v1`, from `k8s-openapi` `v1_37`). Talks to the API server only; callers in `runtime` own the
//! tasks that use it.
//!
//! How to get a client:
//! ```ignore
//! let source = ClientSource::resolve(args.kubeconfig.as_deref(), &InClusterEnv::from_process())?;
//! let client = connect(&source).await?;      // kube::Client; kube's own retries are off
//! let node = NodeApi::new(client.clone(), node_name(args.node_name.as_deref())?);
//! ```
//! [`ClientSource::resolve`]: `--kubeconfig` / `KUBECONFIG` (a path list, merged as kubectl
//! does) wins; else in-cluster: `KUBERNETES_SERVICE_HOST` / `KUBERNETES_SERVICE_PORT`, the
//! service-account token (re-read as it rotates) and CA under
//! `/var/run/secrets/kubernetes.io/serviceaccount`. Tests point `--kubeconfig` at
//! [`crate::testkit::apiserver::ApiServer::kubeconfig`], or build the client from the emulator.
//! Retrying is the caller's (with jittered backoff), so that a fault
//! is seen once and counted.

mod claim_status;
mod claims;
mod node;
mod slices;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

pub(crate) use claims::KubeClaims;
pub(crate) use node::{EventKind, NodeApi};
pub(crate) use slices::{SliceApi, from_api};

/// Where the service-account files are mounted in a pod.
pub(crate) const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How long connecting to the API server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of the API client setup and calls.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubeError {
    /// No kubeconfig was given and the in-cluster environment is incomplete.
    #[error(
        "no Kubernetes API: --kubeconfig / KUBECONFIG is unset and {missing} is not set (not running in a pod?)"
    )]
    NoSource { missing: &'static str },
    /// `KUBERNETES_SERVICE_PORT` is not a port.
    #[error("KUBERNETES_SERVICE_PORT={value:?} is not a port number")]
    BadPort { value: String },
    /// A kubeconfig file could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The service-account files could not be used.
    #[error("in-cluster config from {dir}: {message}")]
    InCluster { dir: String, message: String },
    /// The client could not be built (TLS setup).
    #[error("kube client: {0}")]
    Client(#[source] kube::Error),
    /// `--node-name` / `NODE_NAME` is missing or empty.
    #[error(
        "--node-name / NODE_NAME is required to talk to the Kubernetes API (set it from the downward API: spec.nodeName)"
    )]
    NoNodeName,
    /// One of our objects did not convert to or from the API's types.
    #[error("{what}: cannot convert to the API's types: {message}")]
    Convert { what: String, message: String },
    /// An API call failed.
    #[error("{verb} {what}: {source}")]
    Api {
        verb: &'static str,
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl KubeError {
    /// The HTTP status the API server answered, if it answered one.
    pub(crate) fn status_code(&self) -> Option<u16> {
        match self {
            KubeError::Api {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }
}

/// The in-cluster environment, read once (so tests can give their own).
#[derive(Debug, Clone, Default)]
pub(crate) struct InClusterEnv {
    pub(crate) service_host: Option<String>,
    pub(crate) service_port: Option<String>,
    pub(crate) service_account_dir: PathBuf,
}

impl InClusterEnv {
    /// `KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT` and the standard mount point.
    pub(crate) fn from_process() -> InClusterEnv {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        InClusterEnv {
            service_host: var("KUBERNETES_SERVICE_HOST"),
            service_port: var("KUBERNETES_SERVICE_PORT"),
            service_account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
        }
    }
}

/// Where the client's cluster and credentials come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClientSource {
    /// One or more kubeconfig files (merged in order, as kubectl does).
    Kubeconfig(Vec<PathBuf>),
    /// The pod's service account against `https://<host>:<port>`.
    InCluster {
        url: String,
        service_account_dir: PathBuf,
    },
}

impl ClientSource {
    /// `kubeconfig` (the `--kubeconfig` / `KUBECONFIG` value, a `:`-separated list) if set,
    /// else the in-cluster environment.
    pub(crate) fn resolve(
        kubeconfig: Option<&str>,
        env: &InClusterEnv,
    ) -> Result<ClientSource, KubeError> {
        if let Some(list) = kubeconfig.filter(|s| !s.is_empty()) {
            let paths: Vec<PathBuf> = std::env::split_paths(list)
                .filter(|p| !p.as_os_str().is_empty())
                .collect();
            return Ok(ClientSource::Kubeconfig(paths));
        }
        let host = env.service_host.as_deref().ok_or(KubeError::NoSource {
            missing: "KUBERNETES_SERVICE_HOST",
        })?;
        let port = env.service_port.as_deref().ok_or(KubeError::NoSource {
            missing: "KUBERNETES_SERVICE_PORT",
        })?;
        let port: u16 = port.parse().map_err(|_| KubeError::BadPort {
            value: port.to_owned(),
        })?;
        // IPv6 service addresses are bracketed in URLs.
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        Ok(ClientSource::InCluster {
            url: format!("https://{host}:{port}"),
            service_account_dir: env.service_account_dir.clone(),
        })
    }
}

/// The node name from `--node-name` / `NODE_NAME`.
pub(crate) fn node_name(value: Option<&str>) -> Result<String, KubeError> {
    value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .ok_or(KubeError::NoNodeName)
}

/// Builds a client for `source`. Nothing is sent yet: an API server that is down shows on
/// the first call, not here.
pub(crate) async fn connect(source: &ClientSource) -> Result<kube::Client, KubeError> {
    install_crypto_provider();
    let (kubeconfig, what) = match source {
        ClientSource::Kubeconfig(paths) => (read_kubeconfigs(paths)?, paths_display(paths)),
        ClientSource::InCluster {
            url,
            service_account_dir,
        } => (
            in_cluster_kubeconfig(url, service_account_dir)?,
            service_account_dir.display().to_string(),
        ),
    };
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|source| KubeError::Kubeconfig { path: what, source })?;
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.default_retry = false;
    kube::Client::try_from(config).map_err(KubeError::Client)
}

/// Makes ring the process's rustls provider (a no-op when one is installed already).
pub(crate) fn install_crypto_provider() {
    // Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn paths_display(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

fn read_kubeconfigs(paths: &[PathBuf]) -> Result<Kubeconfig, KubeError> {
    let mut merged: Option<Kubeconfig> = None;
    for path in paths {
        let next = Kubeconfig::read_from(path).map_err(|source| KubeError::Kubeconfig {
            path: path.display().to_string(),
            source,
        })?;
        merged = Some(match merged {
            None => next,
            Some(m) => m.merge(next).map_err(|source| KubeError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?,
        });
    }
    merged.ok_or(KubeError::NoSource {
        missing: "a kubeconfig path",
    })
}

/// The in-cluster setup as a kubeconfig: the server, the CA file and the token file (kube
/// re-reads the token file, so rotated tokens are picked up).
fn in_cluster_kubeconfig(url: &str, dir: &Path) -> Result<Kubeconfig, KubeError> {
    let (token, ca) = (dir.join("token"), dir.join("ca.crt"));
    for file in [&token, &ca] {
        if !file.is_file() {
            return Err(KubeError::InCluster {
                dir: dir.display().to_string(),
                message: format!("{} is missing", file.display()),
            });
        }
    }
    let quoted = |p: &Path| serde_json::to_string(&p.display().to_string()).unwrap_or_default();
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: in-cluster\n  cluster: {{server: {}, certificate-authority: {}}}\nusers:\n- name: sa\n  user: {{tokenFile: {}}}\ncontexts:\n- name: in-cluster\n  context: {{cluster: in-cluster, user: sa}}\ncurrent-context: in-cluster\n",
        serde_json::to_string(url).unwrap_or_default(),
        quoted(&ca),
        quoted(&token),
    );
    Kubeconfig::from_yaml(&yaml).map_err(|source| KubeError::Kubeconfig {
        path: dir.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(host: Option<&str>, port: Option<&str>) -> InClusterEnv {
        InClusterEnv {
            service_host: host.map(Into::into),
            service_port: port.map(Into::into),
            service_account_dir: PathBuf::from("/sa"),
        }
    }

    #[test]
    fn kubeconfig_wins_then_in_cluster() {
        let both = env(Some("10.0.0.1"), Some("443"));
        assert_eq!(
            ClientSource::resolve(Some("/a:/b"), &both).unwrap(),
            ClientSource::Kubeconfig(vec!["/a".into(), "/b".into()])
        );
        assert_eq!(
            ClientSource::resolve(None, &both).unwrap(),
            ClientSource::InCluster {
                url: "https://10.0.0.1:443".into(),
                service_account_dir: "/sa".into()
            }
        );
        let v6 = ClientSource::resolve(None, &env(Some("fd00::1"), Some("6443"))).unwrap();
        assert!(
            matches!(v6, ClientSource::InCluster { url, .. } if url == "https://[fd00::1]:6443")
        );
    }

    #[test]
    fn missing_or_bad_environment_is_named() {
        let e = ClientSource::resolve(None, &env(None, Some("443"))).unwrap_err();
        assert!(e.to_string().contains("KUBERNETES_SERVICE_HOST"), "{e}");
        let e = ClientSource::resolve(None, &env(Some("h"), Some("https"))).unwrap_err();
        assert!(
            e.to_string().contains("KUBERNETES_SERVICE_PORT=\"https\""),
            "{e}"
        );
        assert!(
            node_name(Some(" "))
                .unwrap_err()
                .to_string()
                .contains("NODE_NAME")
        );
        assert_eq!(node_name(Some("n1")).unwrap(), "n1");
    }

    #[tokio::test]
    async fn in_cluster_needs_the_token_and_ca_files() {
        let dir = tempfile::tempdir().unwrap();
        let source = ClientSource::InCluster {
            url: "https://10.0.0.1:443".into(),
            service_account_dir: dir.path().into(),
        };
        let e = connect(&source)
            .await
            .err()
            .expect("no client without the files");
        assert!(e.to_string().contains("token is missing"), "{e}");
    }
}

#[cfg(test)]
mod kube_apiserver_tests;
