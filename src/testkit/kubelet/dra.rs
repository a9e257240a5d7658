//! The kubelet's DRA side, in-process: a plugin watcher that finds `*-reg.sock` in a registry
//! directory, asks `GetInfo`, checks it as the kubelet does (type `DRAPlugin`, a supported
//! DRA version), answers `NotifyRegistrationStatus` and dials the endpoint; then
//! NodePrepareResources / NodeUnprepareResources (v1, or v1beta1 when that is all the plugin
//! offers, or forced) and the DRAResourceHealth stream. [`Claims`] is an in-memory
//! [`ClaimSource`] (what the API server holds), with failures to inject.
//!
//! Used by the integration tests and benches; talks to `crate::runtime::dra` over real unix
//! sockets only.

use std::collections::BTreeMap;
use std::path::Path;
#[cfg(test)]
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use tonic::transport::{Channel, Endpoint};

use crate::domain::dra::claim::ResourceClaim;
use crate::platform::uds_authority::{AuthorityFix, Lenient};
#[cfg(test)]
use crate::proto::drahealth_v1alpha1;
use crate::proto::{dra_v1, dra_v1beta1, pluginregistration as reg};
use crate::runtime::dra::{ClaimSource, ClaimSourceError};

/// Errors of the emulated kubelet.
#[derive(Debug, thiserror::Error)]
pub enum DraKubeletError {
    /// A socket could not be dialled.
    #[error("cannot connect to {path}: {message}")]
    Connect { path: String, message: String },
    /// An RPC failed.
    #[error("{rpc}: {status}")]
    Rpc {
        rpc: &'static str,
        status: Box<tonic::Status>,
    },
    /// The plugin's info would make a kubelet refuse it.
    #[error("plugin refused: {0}")]
    Refused(String),
}

/// The DRA API a call used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraVersion {
    /// `v1.DRAPlugin`.
    V1,
    /// `v1beta1.DRAPlugin`.
    V1beta1,
}

/// A registered DRA plugin, as the kubelet holds it.
#[derive(Debug, Clone)]
pub struct DraPluginConn {
    /// `GetInfo`'s answer.
    pub info: reg::PluginInfo,
    /// The version picked (the first supported entry).
    pub(crate) version: DraVersion,
    channel: Channel,
}

async fn dial(path: &Path) -> Result<Channel, DraKubeletError> {
    Endpoint::from_shared(format!("unix://{}", path.display()))
        .map_err(|e| DraKubeletError::Connect {
            path: path.display().to_string(),
            message: e.to_string(),
        })?
        .connect()
        .await
        .map_err(|e| DraKubeletError::Connect {
            path: path.display().to_string(),
            message: e.to_string(),
        })
}

/// Dial a registration socket as the kubelet's plugin watcher does: grpc-go given the bare
/// path with a unix context dialer, so the socket path goes out as the HTTP/2 `:authority`
/// (tonic cannot send such an authority itself; the rewriter puts it in on the way out).
async fn dial_as_plugin_watcher(path: &Path) -> Result<Channel, DraKubeletError> {
    let connect_err = |message: String| DraKubeletError::Connect {
        path: path.display().to_string(),
        message,
    };
    let socket = path.to_path_buf();
    let authority = path.as_os_str().as_encoded_bytes().to_vec();
    let connector = tower::service_fn(move |_: tonic::codegen::http::Uri| {
        let (socket, authority) = (socket.clone(), authority.clone());
        async move {
            let stream = tokio::net::UnixStream::connect(&socket).await?;
            let fix: AuthorityFix = Box::new(move |_| Some(authority.clone()));
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(Lenient::client(stream, fix)))
        }
    });
    Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await
        .map_err(|e| connect_err(e.to_string()))
}

fn rpc(rpc: &'static str) -> impl FnOnce(tonic::Status) -> DraKubeletError {
    move |status| DraKubeletError::Rpc {
        rpc,
        status: Box::new(status),
    }
}

#[cfg(test)]
/// The registration sockets in `registry_dir` (what the plugin watcher would find).
pub(crate) fn registration_sockets(registry_dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(registry_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with("-reg.sock"))
        .collect();
    out.sort();
    out
}

/// Register the plugin behind `socket` as the kubelet's plugin watcher does.
pub(crate) async fn register(socket: &Path) -> Result<DraPluginConn, DraKubeletError> {
    let mut client =
        reg::registration_client::RegistrationClient::new(dial_as_plugin_watcher(socket).await?);
    let info = client
        .get_info(reg::InfoRequest {})
        .await
        .map_err(rpc("GetInfo"))?
        .into_inner();
    let version = info
        .supported_versions
        .iter()
        .find_map(|v| match v.as_str() {
            "v1.DRAPlugin" => Some(DraVersion::V1),
            "v1beta1.DRAPlugin" => Some(DraVersion::V1beta1),
            _ => None,
        });
    let verdict = match (&version, info.r#type.as_str()) {
        (_, t) if t != "DRAPlugin" => Err(format!("type {t}")),
        (None, _) => Err(format!(
            "no supported version in {:?}",
            info.supported_versions
        )),
        (Some(_), _) if !Path::new(&info.endpoint).is_absolute() => {
            Err(format!("endpoint {} is not absolute", info.endpoint))
        }
        _ => Ok(()),
    };
    client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: verdict.is_ok(),
            error: verdict.clone().err().unwrap_or_default(),
        })
        .await
        .map_err(rpc("NotifyRegistrationStatus"))?;
    verdict.map_err(DraKubeletError::Refused)?;
    let channel = dial(Path::new(&info.endpoint)).await?;
    Ok(DraPluginConn {
        info,
        version: version.unwrap_or(DraVersion::V1),
        channel,
    })
}

/// One claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletClaim {
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
}

/// One claim's prepare answer: its devices' CDI IDs, or its error.
pub(crate) type PrepareAnswer = BTreeMap<String, Result<Vec<(String, Vec<String>)>, String>>;

impl DraPluginConn {
    /// Register the plugin behind `socket` as the kubelet's plugin watcher does ([`register`]).
    pub async fn register(socket: &Path) -> Result<Self, DraKubeletError> {
        register(socket).await
    }

    /// NodePrepareResources through `version` (default: the registered one). Answer per
    /// claim UID: `(device name, cdi ids)` pairs, or the claim's error.
    pub async fn prepare(
        &self,
        claims: &[KubeletClaim],
        version: Option<DraVersion>,
    ) -> Result<PrepareAnswer, DraKubeletError> {
        // The two API versions differ only in their generated types.
        macro_rules! prepare_with {
            ($pb:ident) => {{
                let mut c = $pb::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = $pb::NodePrepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|k| $pb::Claim {
                            namespace: k.namespace.clone(),
                            uid: k.uid.clone(),
                            name: k.name.clone(),
                        })
                        .collect(),
                };
                let resp = c
                    .node_prepare_resources(req)
                    .await
                    .map_err(rpc("NodePrepareResources"))?;
                Ok(resp
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let v = if r.error.is_empty() {
                            Ok(r.devices
                                .into_iter()
                                .map(|d| (d.device_name, d.cdi_device_ids))
                                .collect())
                        } else {
                            Err(r.error)
                        };
                        (uid, v)
                    })
                    .collect())
            }};
        }
        match version.unwrap_or(self.version) {
            DraVersion::V1 => prepare_with!(dra_v1),
            DraVersion::V1beta1 => prepare_with!(dra_v1beta1),
        }
    }

    /// NodeUnprepareResources (v1): per claim UID, its error text (empty on success).
    pub async fn unprepare(
        &self,
        claims: &[KubeletClaim],
    ) -> Result<BTreeMap<String, String>, DraKubeletError> {
        let mut c = dra_v1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
        let req = dra_v1::NodeUnprepareResourcesRequest {
            claims: claims
                .iter()
                .map(|k| dra_v1::Claim {
                    namespace: k.namespace.clone(),
                    uid: k.uid.clone(),
                    name: k.name.clone(),
                })
                .collect(),
        };
        let resp = c
            .node_unprepare_resources(req)
            .await
            .map_err(rpc("NodeUnprepareResources"))?;
        Ok(resp
            .into_inner()
            .claims
            .into_iter()
            .map(|(u, r)| (u, r.error))
            .collect())
    }

    #[cfg(test)]
    /// Open the v1alpha1 health stream (what the kubelet dials).
    pub(crate) async fn watch_health(
        &self,
    ) -> Result<tonic::Streaming<drahealth_v1alpha1::NodeWatchResourcesResponse>, DraKubeletError>
    {
        let mut c = drahealth_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
            self.channel.clone(),
        );
        Ok(
            c.node_watch_resources(drahealth_v1alpha1::NodeWatchResourcesRequest {})
                .await
                .map_err(rpc("NodeWatchResources"))?
                .into_inner(),
        )
    }
}

/// Claims as an API server holds them, by namespace and name; an entry may be a failure.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    map: Mutex<BTreeMap<(String, String), Result<ResourceClaim, ClaimSourceError>>>,
    gets: Mutex<u64>,
    /// How long each GET takes (a slow API server).
    delay: Mutex<std::time::Duration>,
}

impl Claims {
    /// An empty store.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Put (or replace) a claim object (JSON as the API returns it).
    ///
    /// # Panics
    /// When `json` is not a claim: fixtures are for tests.
    pub(crate) fn put(&self, json: serde_json::Value) {
        let c: ResourceClaim = serde_json::from_value(json).expect("a ResourceClaim");
        let key = (c.metadata.namespace.clone(), c.metadata.name.clone());
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, Ok(c));
    }

    #[cfg(test)]
    /// Make GETs of `namespace/name` fail with `error`.
    pub(crate) fn fail(&self, namespace: &str, name: &str, error: ClaimSourceError) {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((namespace.into(), name.into()), Err(error));
    }

    /// Make every GET take `delay` from now on, as a slow API server's.
    #[cfg(test)]
    pub(crate) fn slow(&self, delay: std::time::Duration) {
        *self.delay.lock().unwrap_or_else(PoisonError::into_inner) = delay;
    }

    #[cfg(test)]
    /// How many GETs were answered.
    pub(crate) fn gets(&self) -> u64 {
        *self.gets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ClaimSource for Claims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<ResourceClaim, ClaimSourceError>> + Send + 'a>,
    > {
        Box::pin(async move {
            let delay = *self.delay.lock().unwrap_or_else(PoisonError::into_inner);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            *self.gets.lock().unwrap_or_else(PoisonError::into_inner) += 1;
            self.map
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&(namespace.to_string(), name.to_string()))
                .cloned()
                .unwrap_or_else(|| {
                    Err(ClaimSourceError::NotFound {
                        namespace: namespace.into(),
                        name: name.into(),
                    })
                })
        })
    }
}
