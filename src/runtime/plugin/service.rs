//! The `DevicePlugin` gRPC service of one resource: translates prost messages to the
//! `crate::domain::allocate` domain and back, once, and maps refusals to gRPC codes.
//!
//! Reads the resource's live view from the `HealthMap` watch channel; never blocks on IO.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status};

use crate::domain::allocate::{
    self, AllocateError, AllocationLog, ContainerAllocation, ErrorClass, ResourceView,
};
use crate::domain::inventory::Health;
use crate::proto::deviceplugin as pb;
use crate::runtime::metrics::Metrics;

use super::Serving;

/// Options this plugin registers with and reports: GetPreferredAllocation only.
pub fn plugin_options() -> pb::DevicePluginOptions {
    pb::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// One resource's DevicePlugin service.
#[derive(Debug, Clone)]
pub(crate) struct DevicePluginService {
    resource: Arc<str>,
    view: watch::Receiver<Arc<ResourceView>>,
    /// Config and device nodes; a reload publishes new ones.
    serving: watch::Receiver<Arc<Serving>>,
    /// Records every device handed out (a reload keeps their CDI devices).
    allocations: AllocationLog,
    tracker: TaskTracker,
    /// RPC latencies and refusals are recorded here.
    metrics: Arc<Metrics>,
    /// Ends open ListAndWatch streams when this server instance stops; graceful server
    /// shutdown would otherwise wait forever on them.
    token: CancellationToken,
}

impl DevicePluginService {
    pub(crate) fn new(
        resource: &str,
        view: watch::Receiver<Arc<ResourceView>>,
        serving: watch::Receiver<Arc<Serving>>,
        allocations: AllocationLog,
        tracker: TaskTracker,
        metrics: Arc<Metrics>,
        token: CancellationToken,
    ) -> Self {
        Self {
            resource: Arc::from(resource),
            view,
            serving,
            allocations,
            tracker,
            metrics,
            token,
        }
    }
}

/// The ListAndWatch frame of a view.
pub(crate) fn frame(view: &ResourceView) -> pb::ListAndWatchResponse {
    pb::ListAndWatchResponse {
        devices: view
            .devices()
            .map(|(d, h)| pb::Device {
                id: d.id.clone(),
                health: match h.health {
                    Health::Healthy => crate::proto::HEALTHY,
                    Health::Unhealthy => crate::proto::UNHEALTHY,
                }
                .to_string(),
                topology: d.numa_node.map(|n| pb::TopologyInfo {
                    nodes: vec![pb::NumaNode { id: n }],
                }),
            })
            .collect(),
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
        envs: a.envs.into_iter().collect(),
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
        annotations: a.annotations.into_iter().collect(),
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

    type ListAndWatchStream = ReceiverStream<Result<pb::ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _request: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut view = self.view.clone();
        let token = self.token.clone();
        let resource = self.resource.clone();
        tracing::debug!(resource = %resource, "list-and-watch opened");
        self.tracker.spawn(async move {
            loop {
                let frame = frame(&view.borrow_and_update());
                tracing::trace!(resource = %resource, devices = frame.devices.len(), "list-and-watch frame");
                if tx.send(Ok(frame)).await.is_err() {
                    break;
                }
                tokio::select! {
                    () = token.cancelled() => break,
                    () = tx.closed() => break,
                    changed = view.changed() => if changed.is_err() { break },
                }
            }
            tracing::debug!(resource = %resource, "list-and-watch closed");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        let started = std::time::Instant::now();
        let view = self.view.borrow().clone();
        let policy = self.serving.borrow().config.allocation_policy;
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
        let view = self.view.borrow().clone();
        let serving = self.serving.borrow().clone();
        let requests = request.into_inner().container_requests;
        // Validate every container request before answering any: all or nothing.
        let mut validated = Vec::with_capacity(requests.len());
        for c in &requests {
            match allocate::validate(&view, &c.devices_ids) {
                Ok(devices) => validated.push(devices),
                Err(e) => {
                    tracing::warn!(resource = %self.resource, device = e.device_id().unwrap_or(""), rule = e.rule(), error = %e, "allocate refused");
                    self.metrics
                        .record_allocate(&self.resource, started.elapsed(), Some(e.rule()));
                    return Err(to_status(&e));
                }
            }
        }
        self.allocations.record(
            &self.resource,
            validated.iter().flatten().map(|d| d.id.as_str()),
        );
        let container_responses = validated
            .iter()
            .map(|devices| {
                let mut answer = allocate::build_response(&serving.config, &view.resource, devices);
                allocate::add_device_specs(&mut answer, &serving.config, &serving.nodes, devices);
                to_pb(answer)
            })
            .collect();
        self.metrics
            .record_allocate(&self.resource, started.elapsed(), None);
        tracing::debug!(resource = %self.resource, containers = requests.len(), "allocated");
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
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
