//! The `DevicePlugin` gRPC service of one resource: translates prost messages to the
//! `crate::domain::allocate` domain and back, once, and maps refusals to gRPC codes. What an
//! Allocate answers (all or nothing, the generation annotation, what it holds) is decided by
//! [`allocate::answer`](mod@allocate::answer); this handler records the holding, persists it and translates.
//!
//! Every RPC reads one snapshot of the state store: the resource's view, the config and the
//! device nodes of one generation, never a mix. Never blocks on I/O, except that Allocate
//! persists the held-device checkpoint (off the async workers) before answering when it
//! hands out something new.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio_stream::Stream;
use tokio_stream::wrappers::WatchStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{Request, Response, Status};

use crate::domain::allocate::{self, AllocateError, ContainerAllocation, ErrorClass, ResourceView};
use crate::domain::inventory::Health;
use crate::domain::plan::Resource;
use crate::proto::deviceplugin as pb;
use crate::proto::frame::Pick;
use crate::runtime::held::HeldCheckpoint;
use crate::runtime::metrics::Metrics;
use crate::state::{Snapshot, Store};

/// Open ListAndWatch streams one resource accepts at once. The kubelet opens one per
/// registration; the bound keeps a misbehaving local client from making us hold memory
/// for streams without end.
pub(crate) const MAX_STREAMS_PER_RESOURCE: usize = 16;

/// Annotation naming the state generation an Allocate answer was built from.
#[cfg(test)]
pub(crate) use crate::domain::allocate::GENERATION_ANNOTATION;

/// Options this plugin registers with and reports: GetPreferredAllocation only.
pub(crate) fn plugin_options() -> pb::DevicePluginOptions {
    pb::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// One resource's DevicePlugin service.
#[derive(Debug, Clone)]
pub(crate) struct DevicePluginService {
    resource: Arc<str>,
    store: Store,
    /// Persists what Allocate hands out (a no-op without `--state-dir`).
    held: HeldCheckpoint,
    /// RPC latencies and refusals are recorded here.
    metrics: Arc<Metrics>,
    /// Open ListAndWatch streams of this resource.
    streams: Arc<AtomicUsize>,
    /// Ends open ListAndWatch streams when this server instance stops; graceful server
    /// shutdown would otherwise wait forever on them.
    token: CancellationToken,
}

/// How long a request right after start waits for the first spec to be written before it
/// is refused as unavailable (the kubelet retries): a write that slow is a sick disk.
const SPEC_WRITE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl DevicePluginService {
    /// The current snapshot, once its spec is on disk: only right after start can a plan be
    /// served before its spec is written, and nothing may be answered from it until then.
    async fn written(&self) -> Result<Arc<Snapshot>, Status> {
        self.store
            .spec_on_disk(SPEC_WRITE_WAIT)
            .await
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "{}: the CDI spec is still being written",
                    self.resource
                ))
            })
    }

    pub(crate) fn new(
        resource: &str,
        store: Store,
        held: HeldCheckpoint,
        metrics: Arc<Metrics>,
        streams: Arc<AtomicUsize>,
        token: CancellationToken,
    ) -> Self {
        Self {
            resource: Arc::from(resource),
            store,
            held,
            metrics,
            streams,
            token,
        }
    }

    /// The current snapshot once its spec is on disk (see [`Self::written`]) and this
    /// resource's view in it.
    async fn snapshot_view(&self) -> Result<(Arc<Snapshot>, Arc<ResourceView>), Status> {
        let snapshot = self.written().await?;
        let view = snapshot.view(&self.resource).cloned().ok_or_else(|| {
            Status::failed_precondition(format!("resource {} is no longer served", self.resource))
        })?;
        Ok((snapshot, view))
    }
}

/// A ListAndWatch stream: the resource's view of each new snapshot, sent only when it
/// changed (by identity). Ends when the resource leaves the plan, the store goes away or
/// the server instance stops. No task and no channel per stream: it is polled by the
/// connection that carries it, and everything it holds is freed when it is dropped.
pub(crate) struct ViewStream {
    resource: Arc<str>,
    snapshots: WatchStream<Arc<Snapshot>>,
    last: Option<Arc<ResourceView>>,
    /// The devices of `last`'s resource, encoded (built with the first frame).
    fragments: Option<Fragments>,
    stop: Pin<Box<WaitForCancellationFutureOwned>>,
    open: Arc<AtomicUsize>,
}

impl std::fmt::Debug for ViewStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewStream")
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

impl Drop for ViewStream {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!(resource = %self.resource, "list-and-watch closed");
    }
}

impl Stream for ViewStream {
    type Item = Result<pb::ListAndWatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        loop {
            let snapshot = match Pin::new(&mut self.snapshots).poll_next(cx) {
                Poll::Ready(Some(s)) => s,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            let Some(view) = snapshot.view(&self.resource) else {
                return Poll::Ready(None);
            };
            // Right after start the plan is served before its spec is on disk: the first
            // frame waits for the write, so no device is advertised that the spec lacks.
            if snapshot.spec_pending {
                continue;
            }
            if self.last.as_ref().is_some_and(|l| Arc::ptr_eq(l, view)) {
                continue;
            }
            self.last = Some(view.clone());
            let view = view.clone();
            // The table is made again only when a reload changed the resource.
            if !self
                .fragments
                .as_ref()
                .is_some_and(|f| Arc::ptr_eq(&f.resource, &view.resource))
            {
                self.fragments = None;
            }
            let frame = self
                .fragments
                .get_or_insert_with(|| Fragments::of(&view.resource))
                .frame(&view);
            tracing::trace!(resource = %self.resource, devices = view.health.len(), "list-and-watch frame");
            return Poll::Ready(Some(Ok(frame)));
        }
    }
}

/// The ListAndWatch frame of a view: every device but those of a drained GPU (what a
/// stream sends, made here without a stream's table, for tests).
#[cfg(test)]
pub(crate) fn frame(view: &ResourceView) -> pb::ListAndWatchResponse {
    Fragments::of(&view.resource).frame(view)
}

/// Each device of one planned resource encoded as it appears in a frame, healthy and
/// unhealthy: a frame then picks one of the two per device (or leaves a drained GPU's out),
/// with no per-device allocation or encoding when a health event changes a few of 512
/// devices, and the picked bytes are written once, into the encoder's buffer. Rebuilt only
/// when the plan's resource changes (a reload), found by identity.
struct Fragments {
    resource: Arc<Resource>,
    /// `[healthy, unhealthy]` per device, in the resource's device order.
    encoded: Arc<Vec<[Vec<u8>; 2]>>,
}

impl Fragments {
    fn of(resource: &Arc<Resource>) -> Self {
        let encoded = resource
            .devices
            .iter()
            .map(|d| {
                let device = |health: &str| pb::Device {
                    id: d.id.clone(),
                    health: health.to_string(),
                    topology: d.numa_node.map(|n| pb::TopologyInfo {
                        nodes: vec![pb::NumaNode { id: n }],
                    }),
                };
                [
                    crate::proto::frame::fragment(&device(crate::proto::HEALTHY)),
                    crate::proto::frame::fragment(&device(crate::proto::UNHEALTHY)),
                ]
            })
            .collect();
        Self {
            resource: resource.clone(),
            encoded: Arc::new(encoded),
        }
    }

    /// The frame of `view`, whose resource must be this one.
    fn frame(&self, view: &ResourceView) -> pb::ListAndWatchResponse {
        let picks = view
            .health
            .iter()
            .map(|h| match (h.drained, h.health) {
                (true, _) => Pick::Left,
                (false, Health::Healthy) => Pick::Healthy,
                (false, Health::Unhealthy) => Pick::Unhealthy,
            })
            .collect();
        pb::ListAndWatchResponse::picked(self.encoded.clone(), picks)
    }
}

fn to_status(err: &AllocateError) -> Status {
    match err.class() {
        ErrorClass::Invalid => Status::invalid_argument(err.to_string()),
        ErrorClass::Unhealthy => Status::failed_precondition(err.to_string()),
    }
}

fn to_pb(a: ContainerAllocation) -> pb::ContainerAllocateResponse {
    pb::ContainerAllocateResponse {
        envs: a.envs,
        mounts: a
            .mounts
            .into_iter()
            .map(|m| pb::Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: a
            .device_specs
            .into_iter()
            .map(|d| pb::DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: a.annotations,
        cdi_devices: a
            .cdi_devices
            .into_iter()
            .map(|name| pb::CdiDevice { name })
            .collect(),
    }
}

#[tonic::async_trait]
impl pb::device_plugin_server::DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(plugin_options()))
    }

    type ListAndWatchStream = ViewStream;

    async fn list_and_watch(
        &self,
        _request: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let open = self.streams.fetch_add(1, Ordering::AcqRel) + 1;
        // The stream's drop gives the slot back, also when this call refuses it.
        let stream = ViewStream {
            resource: self.resource.clone(),
            snapshots: WatchStream::new(self.store.subscribe()),
            last: None,
            fragments: None,
            stop: Box::pin(self.token.clone().cancelled_owned()),
            open: self.streams.clone(),
        };
        if open > MAX_STREAMS_PER_RESOURCE {
            tracing::warn!(resource = %self.resource, open, max = MAX_STREAMS_PER_RESOURCE, "list-and-watch refused: too many open streams");
            return Err(Status::resource_exhausted(format!(
                "{} already has {MAX_STREAMS_PER_RESOURCE} open ListAndWatch streams",
                self.resource
            )));
        }
        tracing::debug!(resource = %self.resource, open, "list-and-watch opened");
        Ok(Response::new(stream))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        let started = std::time::Instant::now();
        let (snapshot, view) = self.snapshot_view().await?;
        let policy = snapshot.config.allocation_policy;
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| pb::ContainerPreferredAllocationResponse {
                device_i_ds: allocate::preferred(
                    &view,
                    policy,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        self.metrics
            .record_preferred(&self.resource, started.elapsed());
        Ok(Response::new(pb::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let started = std::time::Instant::now();
        let requests: Vec<Vec<String>> = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| c.devices_ids)
            .collect();
        // One snapshot for the whole call: view, config and device nodes of one generation,
        // and its spec on disk.
        let snapshot = self.written().await?;
        let answer = match allocate::answer(&snapshot, &self.resource, &requests) {
            Ok(answer) => answer,
            Err(e) => {
                if !matches!(e, AllocateError::NotServed { .. }) {
                    tracing::warn!(resource = %self.resource, device = e.device_id().unwrap_or(""), rule = e.rule(), error = %e, "allocate refused");
                    self.metrics
                        .record_allocate(&self.resource, started.elapsed(), Some(e.rule()));
                }
                return Err(to_status(&e));
            }
        };
        let grew = self.store.hold(
            &self.resource,
            answer.held.ids.iter().map(String::as_str),
            &answer.held.cdi,
        );
        if grew.is_some() {
            // Persisted before answering: a restart must find what this answer hands out.
            if let Err(error) = self.held.save().await {
                tracing::error!(resource = %self.resource, error = %error, "allocate refused: held devices not persisted");
                self.metrics
                    .record_allocate(&self.resource, started.elapsed(), Some("checkpoint"));
                return Err(Status::unavailable(format!(
                    "cannot persist held devices: {error}"
                )));
            }
        }
        self.metrics
            .record_allocate(&self.resource, started.elapsed(), None);
        tracing::debug!(resource = %self.resource, containers = requests.len(), generation = snapshot.generation, "allocated");
        Ok(Response::new(pb::AllocateResponse {
            container_responses: answer.containers.into_iter().map(to_pb).collect(),
        }))
    }

    async fn pre_start_container(
        &self,
        _request: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        // Registered with pre_start_required = false, so the kubelet never calls this.
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}
