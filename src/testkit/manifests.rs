//! Kubernetes objects in tests: the manifests in `deploy/` as `kubectl kustomize` renders them
//! (what `kubectl apply -k` sends), a [`node`] to put into the API-server emulator, and its
//! labels there ([`labels_of`], [`until_labels`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_yaml_ng::Value;

use crate::testkit::apiserver::ApiServer;

/// `kubectl` as hack/install-deps.sh provides it: the repository's venv first, else PATH.
pub(crate) fn kubectl() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/kubectl");
    if venv.exists() {
        venv
    } else {
        "kubectl".into()
    }
}

/// Every object `kubectl kustomize <dir>` prints, `dir` relative to the repository root.
///
/// # Panics
/// When kubectl is missing or fails, or prints something that is not YAML.
pub fn kustomize(dir: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let out = std::process::Command::new(kubectl())
        .arg("kustomize")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("kubectl ({e}): run hack/install-deps.sh"));
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)
        .unwrap_or_else(|e| panic!("kubectl kustomize {dir}: not UTF-8: {e}"));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| {
            Value::deserialize(d).unwrap_or_else(|e| panic!("kustomize output is not YAML: {e}"))
        })
        .collect()
}

/// The object of `kind` named `name` among `objs`.
///
/// # Panics
/// When there is none.
pub fn object<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"].as_str() == Some(kind) && o["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in the kustomize output"))
}

/// A sequence of strings (container args, capabilities); empty when `v` is no sequence.
///
/// # Panics
/// When an element is not a string.
pub fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .map(|a| {
                    a.as_str()
                        .unwrap_or_else(|| panic!("not a string: {a:?}"))
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A Node named `name` with `labels`, as a test inserts it into the API-server emulator.
pub fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// The labels of the Node `name` in `api` (none when it has none or does not exist).
pub(crate) fn labels_of(api: &ApiServer, name: &str) -> BTreeMap<String, String> {
    api.get::<Node>("", name)
        .and_then(|n| n.metadata.labels)
        .unwrap_or_default()
}

/// Wait until the Node `name` in `api` carries every `(key, value)` of `want`.
///
/// # Panics
/// When it does not within `limit`, naming the labels it has.
pub async fn until_labels(api: &ApiServer, name: &str, want: &[(&str, &str)], limit: Duration) {
    let ok = api
        .wait_for::<Node, _>(limit, |nodes| {
            nodes.iter().any(|n| {
                let l = n.metadata.labels.clone().unwrap_or_default();
                n.metadata.name.as_deref() == Some(name)
                    && want
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
        })
        .await;
    assert!(
        ok,
        "labels {want:?} never on the Node: {:?}",
        labels_of(api, name)
    );
}
