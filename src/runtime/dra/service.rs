//! The gRPC edge of the DRA driver: `DRAPlugin` v1 and v1beta1 over [`Driver`], the plugin
//! watcher's `Registration`, and `DRAResourceHealth` (v1alpha1 and v1) streams of the
//! complete device list, sent on every change and at least every [`HEALTH_RESEND`].
//! Proto types stay here; [`Driver`] answers in domain terms.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_stream::Stream;
use tokio_stream::wrappers::WatchStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{Request, Response, Status};

use super::driver::Driver;
use crate::domain::dra::claim::ClaimRef;
use crate::domain::dra::claim_error::ClaimError;
use crate::domain::dra::slices;
use crate::platform::dra_state::PreparedDevice;
use crate::proto::{
    dra_v1, dra_v1beta1, drahealth_v1, drahealth_v1alpha1, pluginregistration as reg,
};
use crate::runtime::metrics::Metrics;
use crate::state::Snapshot;

/// The health stream resends the full list at least this often (the kubelet marks devices
/// Unknown after 30 s without a report).
pub(crate) const HEALTH_RESEND: Duration = Duration::from_secs(20);

/// What the registration socket advertises, preferred first (the kubelet takes the first
/// DRA entry it supports).
pub(crate) const SUPPORTED_VERSIONS: [&str; 4] = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1alpha1.DRAResourceHealth",
    "v1.DRAResourceHealth",
];

macro_rules! dra_service {
    ($svc:ident, $pb:ident, $device:path) => {
        /// `DRAPlugin` of one API version.
        #[derive(Debug, Clone)]
        pub(crate) struct $svc {
            pub(crate) driver: Driver,
            pub(crate) metrics: Arc<Metrics>,
        }

        #[tonic::async_trait]
        impl $pb::dra_plugin_server::DraPlugin for $svc {
            async fn node_prepare_resources(
                &self,
                request: Request<$pb::NodePrepareResourcesRequest>,
            ) -> Result<Response<$pb::NodePrepareResourcesResponse>, Status> {
                let claims = refs(
                    request
                        .into_inner()
                        .claims
                        .into_iter()
                        .map(|c| (c.namespace, c.uid, c.name)),
                );
                let started = Instant::now();
                let outcomes = self.driver.prepare(&claims).await;
                record(
                    &self.metrics,
                    &self.driver,
                    true,
                    started,
                    outcomes.values(),
                );
                let claims = outcomes
                    .into_iter()
                    .map(|(uid, o)| {
                        let answer = match o {
                            Ok(devices) => $pb::NodePrepareResourceResponse {
                                devices: devices.into_iter().map($device).collect(),
                                error: String::new(),
                            },
                            Err(error) => $pb::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                // The one place a refusal becomes text.
                                error: error.to_string(),
                            },
                        };
                        (uid, answer)
                    })
                    .collect();
                Ok(Response::new($pb::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$pb::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$pb::NodeUnprepareResourcesResponse>, Status> {
                let claims = refs(
                    request
                        .into_inner()
                        .claims
                        .into_iter()
                        .map(|c| (c.namespace, c.uid, c.name)),
                );
                let started = Instant::now();
                let outcomes = self.driver.unprepare(&claims).await;
                record(
                    &self.metrics,
                    &self.driver,
                    false,
                    started,
                    outcomes.values(),
                );
                let claims = outcomes
                    .into_iter()
                    .map(|(uid, r)| {
                        let error = r.err().map(|e| e.to_string()).unwrap_or_default();
                        (uid, $pb::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new($pb::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

/// A call's duration and outcome, each refused claim under its rule, and the prepared
/// totals after it.
fn record<'a, T: 'a>(
    metrics: &Metrics,
    driver: &Driver,
    prepare: bool,
    started: Instant,
    outcomes: impl Iterator<Item = &'a Result<T, ClaimError>>,
) {
    let mut ok = true;
    for e in outcomes.filter_map(|o| o.as_ref().err()) {
        ok = false;
        tracing::debug!(rule = e.rule(), class = e.class().as_str(), "claim refused");
        metrics.record_dra_refusal(e);
    }
    metrics.record_dra_call(prepare, started.elapsed(), ok);
    let (claims, devices) = driver.prepared_totals();
    metrics.set_dra_prepared(claims, devices);
}

dra_service!(DraV1, dra_v1, v1_device);
dra_service!(DraV1beta1, dra_v1beta1, v1beta1_device);

/// A prepared device in v1 terms: with its share ID (added in 1.35).
fn v1_device(d: PreparedDevice) -> dra_v1::Device {
    dra_v1::Device {
        request_names: vec![d.request],
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_ids,
        share_id: d.share_id,
    }
}

/// A prepared device in v1beta1 terms (no share ID: the CDI ID still names the share).
fn v1beta1_device(d: PreparedDevice) -> dra_v1beta1::Device {
    dra_v1beta1::Device {
        request_names: vec![d.request],
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_ids,
    }
}

fn refs(claims: impl Iterator<Item = (String, String, String)>) -> Vec<ClaimRef> {
    claims
        .map(|(namespace, uid, name)| ClaimRef {
            namespace,
            uid,
            name,
        })
        .collect()
}

/// The plugin watcher's `Registration` service on `<driver>-reg.sock`.
#[derive(Debug, Clone)]
pub(crate) struct Registrar {
    /// Driver name.
    pub(crate) driver: String,
    /// Absolute path of `dra.sock`.
    pub(crate) endpoint: String,
    /// The kubelet's last registration verdict (`None` before the first).
    pub(crate) status: Arc<watch::Sender<super::Verdict>>,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _request: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS
                .iter()
                .map(|s| (*s).to_string())
                .collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            tracing::info!(driver = %self.driver, "registered with the kubelet");
            self.status.send_replace(Some(Ok(())));
        } else {
            tracing::error!(driver = %self.driver, error = %s.error, "kubelet refused registration");
            self.status
                .send_replace(Some(Err(super::RegistrationRefused(s.error))));
        }
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// One device's health as the stream reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceHealthItem {
    /// Device name.
    pub(crate) device: String,
    /// Healthy.
    pub(crate) healthy: bool,
    /// Why not.
    pub(crate) message: String,
}

/// The complete health list of a snapshot.
pub(crate) fn health_list(snapshot: &Snapshot) -> Vec<DeviceHealthItem> {
    slices::snapshot_devices(snapshot)
        .devices
        .into_values()
        .map(|d| DeviceHealthItem {
            device: d.name,
            healthy: d.unhealthy.is_none(),
            message: d.unhealthy.unwrap_or_default().chars().take(1024).collect(),
        })
        .collect()
}

/// Complete lists: on every change of the list and every [`HEALTH_RESEND`]; ends at stop.
pub(crate) struct HealthStream {
    snapshots: WatchStream<Arc<Snapshot>>,
    tick: tokio::time::Interval,
    last: Vec<DeviceHealthItem>,
    stop: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl std::fmt::Debug for HealthStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthStream").finish_non_exhaustive()
    }
}

impl HealthStream {
    /// A stream over `driver`'s store, stopped by `stop`.
    pub(crate) fn new(driver: &Driver, resend: Duration, stop: CancellationToken) -> Self {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + resend, resend);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            snapshots: WatchStream::new(driver.store().subscribe()),
            tick,
            last: Vec::new(),
            stop: Box::pin(stop.cancelled_owned()),
        }
    }
}

impl Stream for HealthStream {
    type Item = Vec<DeviceHealthItem>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        // Drain snapshots: only a changed list is sent (the first one always is).
        let mut first = false;
        loop {
            match Pin::new(&mut self.snapshots).poll_next(cx) {
                Poll::Ready(Some(s)) => {
                    let list = health_list(&s);
                    if list != self.last || self.last.is_empty() {
                        first = true;
                        self.last = list;
                    }
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => break,
            }
        }
        if first {
            self.tick.reset();
            return Poll::Ready(Some(self.last.clone()));
        }
        if self.tick.poll_tick(cx).is_ready() {
            return Poll::Ready(Some(self.last.clone()));
        }
        Poll::Pending
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

macro_rules! health_service {
    ($svc:ident, $pb:ident) => {
        /// `DRAResourceHealth` of one package.
        #[derive(Debug, Clone)]
        pub(crate) struct $svc {
            /// The driver whose devices are reported.
            pub(crate) driver: Driver,
            /// Resend interval.
            pub(crate) resend: Duration,
            /// Ends the streams at shutdown.
            pub(crate) stop: CancellationToken,
        }

        #[tonic::async_trait]
        impl $pb::dra_resource_health_server::DraResourceHealth for $svc {
            type NodeWatchResourcesStream =
                Pin<Box<dyn Stream<Item = Result<$pb::NodeWatchResourcesResponse, Status>> + Send>>;

            async fn node_watch_resources(
                &self,
                _request: Request<$pb::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                use tokio_stream::StreamExt as _;
                let pool = self.driver.pool().to_string();
                let stream = HealthStream::new(&self.driver, self.resend, self.stop.clone()).map(
                    move |list| {
                        let now = unix_now();
                        let devices = list
                            .into_iter()
                            .map(|d| $pb::DeviceHealth {
                                device: Some($pb::DeviceIdentifier {
                                    pool_name: pool.clone(),
                                    device_name: d.device,
                                }),
                                health: if d.healthy {
                                    $pb::HealthStatus::Healthy as i32
                                } else {
                                    $pb::HealthStatus::Unhealthy as i32
                                },
                                last_updated_time: now,
                                health_check_timeout_seconds: 60,
                                message: d.message,
                            })
                            .collect();
                        Ok($pb::NodeWatchResourcesResponse { devices })
                    },
                );
                Ok(Response::new(Box::pin(stream)))
            }
        }
    };
}

health_service!(HealthV1alpha1, drahealth_v1alpha1);
health_service!(HealthV1, drahealth_v1);
