//! Registration with the kubelet: one `Register` call per resource on `kubelet.sock`,
//! retried with exponential backoff while the kubelet is absent or refuses.

use std::path::Path;
use std::time::Duration;

use tonic::transport::Endpoint;

use crate::proto::deviceplugin as pb;

/// Errors of one registration attempt.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegistrationError {
    /// `kubelet.sock` could not be dialled.
    #[error("cannot connect to kubelet socket {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// The kubelet answered Register with an error.
    #[error("kubelet refused registration of {resource}: {status}")]
    Refused {
        resource: String,
        status: Box<tonic::Status>,
    },
}

/// Retry timing: injected so tests and benchmarks control it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    /// First delay.
    pub(crate) initial: Duration,
    /// Ceiling.
    pub(crate) max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(5),
            max: Duration::from_secs(5),
        }
    }
}

impl Backoff {
    /// The delay after `attempt` failures (doubling from `initial`, capped at `max`).
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        self.initial
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max)
    }
}

/// The request gpu-slicer sends for `resource` served on socket file `endpoint`.
pub(crate) fn register_request(resource: &str, endpoint: &str) -> pb::RegisterRequest {
    pb::RegisterRequest {
        version: crate::proto::VERSION.to_string(),
        endpoint: endpoint.to_string(),
        resource_name: resource.to_string(),
        options: Some(super::service::plugin_options()),
    }
}

/// One attempt: dial `kubelet_socket` and send `request`.
pub(crate) async fn register_once(
    kubelet_socket: &Path,
    request: pb::RegisterRequest,
) -> Result<(), RegistrationError> {
    let path = kubelet_socket.display().to_string();
    let connect_err = |source| RegistrationError::Connect {
        path: path.clone(),
        source,
    };
    let channel = Endpoint::from_shared(format!("unix://{path}"))
        .map_err(connect_err)?
        .connect()
        .await
        .map_err(connect_err)?;
    let resource = request.resource_name.clone();
    pb::registration_client::RegistrationClient::new(channel)
        .register(request)
        .await
        .map_err(|status| RegistrationError::Refused {
            resource,
            status: Box::new(status),
        })?;
    Ok(())
}

/// Register, retrying with backoff until it succeeds. Cancel by dropping the future.
pub(crate) async fn register_with_backoff(
    kubelet_socket: &Path,
    request: pb::RegisterRequest,
    backoff: Backoff,
) {
    let mut attempt = 0u32;
    loop {
        match register_once(kubelet_socket, request.clone()).await {
            Ok(()) => return,
            Err(e) => {
                let delay = backoff.delay(attempt);
                tracing::warn!(resource = %request.resource_name, error = %e, retry_in_ms = delay.as_millis() as u64, "registration failed");
                tokio::time::sleep(delay).await;
                attempt = attempt.saturating_add(1);
            }
        }
    }
}
