//! This node's ResourceSlices through the API (`resource.k8s.io/v1`): LIST and WATCH with a
//! field selector on `spec.driver` and `spec.nodeName` (never every slice of the cluster),
//! create, replace (with the resourceVersion read, so a concurrent writer is a 409) and
//! delete. The driver's slices are built in the domain ([`crate::domain::dra::slices`]) as
//! its own serde model and converted here through their JSON, which has the API's field
//! names; the publisher in `crate::runtime::dra::publish` owns the task that calls this.

use k8s_openapi::api::resource::v1::ResourceSlice as ApiSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use tokio_stream::{Stream, StreamExt as _};

use super::KubeError;
use crate::domain::dra::model::ResourceSlice;

/// How long one watch request stays open before the server ends it (the client re-watches).
const WATCH_TIMEOUT_S: u32 = 290;

/// The slices of one driver on one node.
#[derive(Clone)]
pub(crate) struct SliceApi {
    api: Api<ApiSlice>,
    client: kube::Client,
    driver: String,
    node: String,
}

impl std::fmt::Debug for SliceApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceApi")
            .field("driver", &self.driver)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Our slice as the API types it (for a create or replace body).
pub(crate) fn to_api(slice: &ResourceSlice) -> Result<ApiSlice, KubeError> {
    let json = serde_json::to_value(slice).map_err(|e| convert(&slice.metadata.name, &e))?;
    serde_json::from_value(json).map_err(|e| convert(&slice.metadata.name, &e))
}

/// A stored slice in our model (fields we do not set are dropped); `None` when it does not
/// have the shape of one we write (someone else's object under our selector).
pub(crate) fn from_api(slice: &ApiSlice) -> Option<ResourceSlice> {
    serde_json::to_value(slice)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
}

fn convert(name: &str, e: &serde_json::Error) -> KubeError {
    KubeError::Convert {
        what: format!("resourceslice {name}"),
        message: e.to_string(),
    }
}

impl SliceApi {
    /// The slices of `driver` whose `spec.nodeName` is `node`.
    pub(crate) fn new(client: kube::Client, driver: &str, node: &str) -> SliceApi {
        SliceApi {
            api: Api::all(client.clone()),
            client,
            driver: driver.to_owned(),
            node: node.to_owned(),
        }
    }

    /// The driver name.
    pub(crate) fn driver(&self) -> &str {
        &self.driver
    }

    /// The node name.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// The API server's version (`/version`): `(major, minor)` as it writes them (`1`,
    /// `35+`). The slice layout for partitionable devices changed in 1.35.
    pub(crate) async fn server_version(&self) -> Result<(String, String), KubeError> {
        let info = self
            .client
            .apiserver_version()
            .await
            .map_err(|source| KubeError::Api {
                verb: "get",
                what: "the API server's /version".into(),
                source,
            })?;
        Ok((info.major, info.minor))
    }

    fn selector(&self) -> String {
        format!("spec.driver={},spec.nodeName={}", self.driver, self.node)
    }

    fn api_error(&self, verb: &'static str, name: &str, source: kube::Error) -> KubeError {
        KubeError::Api {
            verb,
            what: if name.is_empty() {
                format!("resourceslices of {} on node {}", self.driver, self.node)
            } else {
                format!("resourceslice {name}")
            },
            source,
        }
    }

    /// LIST our slices: the objects and the list's resourceVersion (to watch from).
    pub(crate) async fn list(&self) -> Result<(Vec<ApiSlice>, String), KubeError> {
        let params = ListParams::default().fields(&self.selector());
        let list = self
            .api
            .list(&params)
            .await
            .map_err(|e| self.api_error("list", "", e))?;
        let rv = list.metadata.resource_version.clone().unwrap_or_default();
        Ok((list.items, rv))
    }

    /// Create `slice`.
    pub(crate) async fn create(&self, slice: &ResourceSlice) -> Result<ApiSlice, KubeError> {
        let body = to_api(slice)?;
        self.api
            .create(&PostParams::default(), &body)
            .await
            .map_err(|e| self.api_error("create", &slice.metadata.name, e))
    }

    /// Replace the stored slice of the same name, which was at `resource_version`.
    pub(crate) async fn replace(
        &self,
        slice: &ResourceSlice,
        resource_version: &str,
    ) -> Result<ApiSlice, KubeError> {
        let mut body = to_api(slice)?;
        body.metadata.resource_version = Some(resource_version.to_owned());
        self.api
            .replace(&slice.metadata.name, &PostParams::default(), &body)
            .await
            .map_err(|e| self.api_error("update", &slice.metadata.name, e))
    }

    /// Delete slice `name` (already gone is success).
    pub(crate) async fn delete(&self, name: &str) -> Result<(), KubeError> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.api_error("delete", name, e)),
        }
    }

    /// WATCH our slices from `resource_version` (bookmarks on). The stream ends when the
    /// server ends the request; an `Error` event with code 410 means "LIST again".
    pub(crate) async fn watch(
        &self,
        resource_version: &str,
    ) -> Result<impl Stream<Item = Result<WatchEvent<ApiSlice>, KubeError>> + Send + use<>, KubeError>
    {
        let params = WatchParams::default()
            .fields(&self.selector())
            .timeout(WATCH_TIMEOUT_S);
        let stream = self
            .api
            .watch(&params, resource_version)
            .await
            .map_err(|e| self.api_error("watch", "", e))?;
        let what = format!("resourceslices of {} on node {}", self.driver, self.node);
        Ok(stream.map(move |r| {
            r.map_err(|source| KubeError::Api {
                verb: "watch",
                what: what.clone(),
                source,
            })
        }))
    }
}
