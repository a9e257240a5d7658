//! The agent's own Kubernetes client against the API-server emulator over HTTP: set up from
//! a kubeconfig with a pod-bound token, it reads its Node, patches labels (setting and
//! removing), records an Event and watches the Node. (The emulator itself:
//! tests/kube_apiserver.rs.)

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::WatchEvent;
use tokio_stream::StreamExt;

use crate::platform::kube::{ClientSource, EventKind, InClusterEnv, NodeApi, connect};
use crate::testkit::apiserver::{ApiServer, User};
use crate::testkit::manifests::node;

const T: Duration = Duration::from_secs(10);

#[tokio::test]
async fn agent_client_from_kubeconfig_patches_labels_and_records_events() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node("n1", &[("keep", "me"), ("gpu-slicer.io/old", "x")]))
        .unwrap();
    api.require_tokens(HashMap::from([(
        "t0k".to_owned(),
        User::service_account("gpu-slicer", "gpu-slicer", Some("n1")),
    )]));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, api.kubeconfig(Some("t0k"))).unwrap();
    let source = ClientSource::resolve(path.to_str(), &InClusterEnv::default()).unwrap();
    let node_api = NodeApi::new(connect(&source).await.unwrap(), "n1".into());
    let got = node_api.get().await.unwrap();
    let labels = BTreeMap::from([
        (
            "gpu-slicer.io/config.state".to_owned(),
            Some("success".to_owned()),
        ),
        ("gpu-slicer.io/old".to_owned(), None),
    ]);
    let patched = node_api.patch_labels(&labels).await.unwrap();
    let l = patched.metadata.labels.unwrap();
    assert_eq!(
        (
            l.get("keep").map(String::as_str),
            l.get("gpu-slicer.io/old")
        ),
        (Some("me"), None)
    );
    assert_eq!(l["gpu-slicer.io/config.state"], "success");
    node_api
        .event(
            got.metadata.uid.as_deref(),
            EventKind::Warning,
            "ConfigRefused",
            "label x: no key y",
        )
        .await
        .unwrap();
    let events = api.list::<Event>();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].involved_object.name.as_deref(), Some("n1"));
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    let mut w = Box::pin(
        node_api
            .watch(&patched.metadata.resource_version.unwrap())
            .await
            .unwrap(),
    );
    api.label_node(
        "n1",
        &[("nvidia.com/device-plugin.config", Some("inference"))],
    )
    .unwrap();
    match tokio::time::timeout(T, w.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Modified(n) => assert_eq!(
            n.metadata.labels.unwrap()["nvidia.com/device-plugin.config"],
            "inference"
        ),
        other => panic!("{other:?}"),
    }
    api.stop().await;
}
