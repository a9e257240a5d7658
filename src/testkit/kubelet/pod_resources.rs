//! PodResources v1 server of the kubelet emulator: `List`, `Get` and
//! `GetAllocatableResources` answered from the emulator's allocations, the DRA claims its
//! containers hold (`dynamic_resources`) and device lists.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Weak};

use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use super::{EmulatorError, Inner};
use crate::proto::podresources as pb;
use pb::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};

pub(super) fn serve(inner: &Arc<Inner>, path: &Path) -> Result<(), EmulatorError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| EmulatorError::Io {
            action: "create",
            path: dir.display().to_string(),
            source,
        })?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|source| EmulatorError::Io {
        action: "bind",
        path: path.display().to_string(),
        source,
    })?;
    let service = Lister {
        inner: Arc::downgrade(inner),
    };
    let stop = inner.token.clone().cancelled_owned();
    inner.tracker.spawn(async move {
        if let Err(e) = Server::builder()
            .add_service(PodResourcesListerServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop)
            .await
        {
            tracing::error!(error = %e, "emulated pod-resources server failed");
        }
    });
    Ok(())
}

/// What one container holds: resource name -> device IDs, and its DRA claims.
type Held = (BTreeMap<String, Vec<String>>, Vec<pb::DynamicResource>);

/// (namespace, pod) -> container -> what it holds.
type Pods = BTreeMap<(String, String), BTreeMap<String, Held>>;

fn container<'a>(pods: &'a mut Pods, pod: &super::PodRef) -> &'a mut Held {
    pods.entry((pod.namespace.clone(), pod.name.clone()))
        .or_default()
        .entry(pod.container.clone())
        .or_default()
}

#[derive(Debug)]
struct Lister {
    inner: Weak<Inner>,
}

impl Lister {
    fn inner(&self) -> Result<Arc<Inner>, Status> {
        self.inner
            .upgrade()
            .ok_or_else(|| Status::unavailable("kubelet emulator is shutting down"))
    }

    fn pods(&self) -> Result<Vec<pb::PodResources>, Status> {
        let inner = self.inner()?;
        let state = inner.state();
        let mut pods = Pods::new();
        for a in &state.allocations {
            container(&mut pods, &a.pod)
                .0
                .entry(a.resource.clone())
                .or_default()
                .extend(a.device_ids.iter().cloned());
        }
        for c in &state.claims {
            container(&mut pods, &c.pod).1.push(c.to_pb());
        }
        Ok(pods
            .into_iter()
            .map(|((namespace, name), containers)| pb::PodResources {
                name,
                namespace,
                containers: containers
                    .into_iter()
                    .map(
                        |(name, (resources, dynamic_resources))| pb::ContainerResources {
                            name,
                            devices: resources
                                .into_iter()
                                .map(|(resource_name, device_ids)| pb::ContainerDevices {
                                    resource_name,
                                    device_ids,
                                    topology: None,
                                })
                                .collect(),
                            dynamic_resources,
                            ..Default::default()
                        },
                    )
                    .collect(),
            })
            .collect())
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _request: Request<pb::ListPodResourcesRequest>,
    ) -> Result<Response<pb::ListPodResourcesResponse>, Status> {
        Ok(Response::new(pb::ListPodResourcesResponse {
            pod_resources: self.pods()?,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<pb::AllocatableResourcesRequest>,
    ) -> Result<Response<pb::AllocatableResourcesResponse>, Status> {
        let inner = self.inner()?;
        let state = inner.state();
        let devices = state
            .devices
            .iter()
            .flat_map(|(resource, tx)| {
                tx.borrow()
                    .iter()
                    .filter(|d| d.healthy)
                    .map(|d| pb::ContainerDevices {
                        resource_name: resource.clone(),
                        device_ids: vec![d.id.clone()],
                        topology: d.numa_node.map(|n| pb::TopologyInfo {
                            nodes: vec![pb::NumaNode { id: n }],
                        }),
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        Ok(Response::new(pb::AllocatableResourcesResponse {
            devices,
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<pb::GetPodResourcesRequest>,
    ) -> Result<Response<pb::GetPodResourcesResponse>, Status> {
        let req = request.into_inner();
        let pod = self
            .pods()?
            .into_iter()
            .find(|p| p.name == req.pod_name && p.namespace == req.pod_namespace)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "pod {}/{} has no device allocations",
                    req.pod_namespace, req.pod_name
                ))
            })?;
        Ok(Response::new(pb::GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}
