//! The agent's own Node through the API: GET it, WATCH it (one watch, field selector on its
//! name, bookmarks on: never a LIST of all nodes), merge-patch its labels (a `null` value
//! removes a key) and record Events about it (core/v1, in the `default` namespace, as the
//! kubelet does for Node events).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use tokio_stream::{Stream, StreamExt as _};

use super::KubeError;

/// How long one watch request stays open before the server ends it (the client re-watches).
const WATCH_TIMEOUT_S: u32 = 290;
/// The namespace Node events go to.
const EVENT_NAMESPACE: &str = "default";
/// `source.component` / `reportingComponent` of our Events.
pub(crate) const COMPONENT: &str = "gpu-slicer";

/// Normal or Warning, as Events carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Normal,
    Warning,
}

/// One node's API handle.
#[derive(Debug, Clone)]
pub(crate) struct NodeApi {
    nodes: Api<Node>,
    events: Api<Event>,
    name: String,
}

impl NodeApi {
    pub(crate) fn new(client: kube::Client, name: String) -> NodeApi {
        NodeApi {
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client, EVENT_NAMESPACE),
            name,
        }
    }

    /// The node's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn api_error(&self, verb: &'static str, source: kube::Error) -> KubeError {
        KubeError::Api {
            verb,
            what: format!("node {}", self.name),
            source,
        }
    }

    /// GET the Node.
    pub(crate) async fn get(&self) -> Result<Node, KubeError> {
        self.nodes
            .get(&self.name)
            .await
            .map_err(|e| self.api_error("get", e))
    }

    /// WATCH the Node from `resource_version` (bookmarks on). The stream ends when the server
    /// ends the request; an `Error` event with code 410 means "GET again".
    pub(crate) async fn watch(
        &self,
        resource_version: &str,
    ) -> Result<impl Stream<Item = Result<WatchEvent<Node>, KubeError>> + use<>, KubeError> {
        let params = WatchParams::default()
            .fields(&format!("metadata.name={}", self.name))
            .timeout(WATCH_TIMEOUT_S);
        let name = self.name.clone();
        let stream = self
            .nodes
            .watch(&params, resource_version)
            .await
            .map_err(|e| self.api_error("watch", e))?;
        Ok(stream.map(move |r| {
            r.map_err(|source| KubeError::Api {
                verb: "watch",
                what: format!("node {name}"),
                source,
            })
        }))
    }

    /// Sets (`Some`) and removes (`None`) labels in one JSON merge patch.
    pub(crate) async fn patch_labels(
        &self,
        labels: &BTreeMap<String, Option<String>>,
    ) -> Result<Node, KubeError> {
        let patch = json!({"metadata": {"labels": labels}});
        let params = PatchParams::default();
        self.nodes
            .patch(&self.name, &params, &Patch::Merge(&patch))
            .await
            .map_err(|e| self.api_error("patch", e))
    }

    /// Sets and removes labels and sets one annotation (when `annotation` is given) in one
    /// JSON merge patch, so both change together or not at all.
    pub(crate) async fn patch_labels_and_annotation(
        &self,
        labels: &BTreeMap<String, Option<String>>,
        annotation: Option<(&str, &str)>,
    ) -> Result<Node, KubeError> {
        let mut metadata = json!({"labels": labels});
        if let Some((key, value)) = annotation {
            metadata["annotations"] = json!({ key: value });
        }
        let patch = json!({ "metadata": metadata });
        self.nodes
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| self.api_error("patch", e))
    }

    /// Records an Event about the Node (`uid` from the last GET or watch event, when known).
    pub(crate) async fn event(
        &self,
        uid: Option<&str>,
        kind: EventKind,
        reason: &str,
        message: &str,
    ) -> Result<(), KubeError> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", self.name)),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(self.name.clone()),
                uid: uid.map(str::to_owned),
                ..ObjectReference::default()
            },
            reason: Some(reason.to_owned()),
            // The API server refuses Event messages over 1 KiB.
            message: Some(truncate(message, 1024)),
            type_: Some(match kind {
                EventKind::Normal => "Normal".into(),
                EventKind::Warning => "Warning".into(),
            }),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: Some(self.name.clone()),
            }),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(self.name.clone()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some(reason.to_owned()),
            count: Some(1),
            ..Event::default()
        };
        self.events
            .create(&PostParams::default(), &event)
            .await
            .map(drop)
            .map_err(|source| KubeError::Api {
                verb: "create",
                what: format!("event on node {}", self.name),
                source,
            })
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max - 3;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}
