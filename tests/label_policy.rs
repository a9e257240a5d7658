//! The ValidatingAdmissionPolicy of deploy/label-configs/policy.yaml, as deployed: its
//! matchConditions, variables and validations are compiled with a CEL interpreter and run as
//! the API-server emulator's admission for Node updates, and the agent's service account
//! (a pod-bound token with the node-name claim) patches Nodes through the real kube client.

use std::collections::HashMap;

use gpu_slicer::testkit::{Admission, ApiServer, Denial, User, Verb};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

const POLICY: &str = include_str!("../deploy/label-configs/policy.yaml");

/// The policy's CEL, compiled once.
struct Policy {
    conditions: Vec<cel::Program>,
    variables: Vec<(String, cel::Program)>,
    validations: Vec<(cel::Program, String, String)>,
}

fn compile(expr: &str) -> cel::Program {
    cel::Program::compile(expr)
        .unwrap_or_else(|e| panic!("policy CEL {expr:?} does not compile: {e:?}"))
}

fn load() -> Policy {
    let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(POLICY)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let vap = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("the policy");
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .expect("its binding");
    assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    let spec = &vap["spec"];
    let strs = |v: &Value, f: &str| v[f].as_str().unwrap_or("").to_owned();
    Policy {
        conditions: spec["matchConditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| compile(&strs(c, "expression")))
            .collect(),
        variables: spec["variables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (strs(v, "name"), compile(&strs(v, "expression"))))
            .collect(),
        validations: spec["validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    compile(&strs(v, "expression")),
                    strs(v, "message"),
                    strs(v, "reason"),
                )
            })
            .collect(),
    }
}

fn context(
    a: &Admission<'_>,
    variables: &serde_json::Map<String, Value>,
) -> cel::Context<'static, 'static> {
    let user = json!({"username": a.user.username, "groups": a.user.groups, "extra": a.user.extra});
    let mut ctx = cel::Context::default();
    ctx.add_variable("object", a.object.cloned().unwrap_or(Value::Null))
        .unwrap();
    ctx.add_variable("oldObject", a.old_object.cloned().unwrap_or(Value::Null))
        .unwrap();
    ctx.add_variable(
        "request",
        json!({"userInfo": user, "operation": "UPDATE", "name": a.name}),
    )
    .unwrap();
    ctx.add_variable("variables", Value::Object(variables.clone()))
        .unwrap();
    ctx
}

impl Policy {
    /// What the API server does with the policy for one Node update.
    fn admit(&self, a: &Admission<'_>) -> Result<(), Denial> {
        if a.resource != "nodes"
            || !a.subresource.is_empty()
            || !matches!(a.verb, Verb::Update | Verb::Patch)
        {
            return Ok(());
        }
        let mut vars = serde_json::Map::new();
        let truth = |p: &cel::Program, vars: &serde_json::Map<String, Value>| {
            matches!(p.execute(&context(a, vars)), Ok(cel::Value::Bool(true)))
        };
        if !self.conditions.iter().all(|c| truth(c, &vars)) {
            return Ok(());
        }
        for (name, program) in &self.variables {
            let value = program
                .execute(&context(a, &vars))
                .expect("variable evaluates");
            vars.insert(name.clone(), value.json().expect("variable as JSON"));
        }
        for (program, message, reason) in &self.validations {
            if !truth(program, &vars) {
                let code = if reason == "Forbidden" { 403 } else { 422 };
                return Err(Denial {
                    code,
                    message: message.clone(),
                });
            }
        }
        Ok(())
    }
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"nvidia.com/device-plugin.config": "inference", "team": "ml"}},
        "spec": {"podCIDR": "10.0.0.0/24"}
    }))
    .unwrap()
}

async fn setup() -> (ApiServer, Api<Node>, Api<Node>) {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node("n1")).unwrap();
    api.insert(&node("n2")).unwrap();
    api.require_tokens(HashMap::from([
        (
            "agent-n1".to_owned(),
            User::service_account("gpu-slicer", "gpu-slicer", Some("n1")),
        ),
        ("admin".to_owned(), User::admin()),
    ]));
    let policy = load();
    api.admit(move |a| policy.admit(a));
    let agent = Api::all(api.client_with_token(Some("agent-n1")).unwrap());
    let admin = Api::all(api.client_with_token(Some("admin")).unwrap());
    (api, agent, admin)
}

async fn patch(nodes: &Api<Node>, name: &str, body: Value) -> Result<(), (u16, String)> {
    match nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err((s.code, s.message)),
        Err(e) => panic!("{e}"),
    }
}

fn labels(kv: Value) -> Value {
    json!({"metadata": {"labels": kv}})
}

#[tokio::test]
async fn own_node_and_owned_keys_are_admitted() {
    let (api, agent, _) = setup().await;
    let state = labels(
        json!({"gpu-slicer.io/config.state": "success", "gpu-slicer.io/config.applied": "inference",
                              "nvidia.com/mig.config.state": "pending", "nvidia.com/gpu.product": "A100"}),
    );
    patch(&agent, "n1", state).await.unwrap();
    patch(
        &agent,
        "n1",
        labels(json!({"nvidia.com/gpu.product": null})),
    )
    .await
    .unwrap();
    let n1: Node = api.get("", "n1").unwrap();
    let l = n1.metadata.labels.unwrap();
    assert_eq!(l["gpu-slicer.io/config.state"], "success");
    assert!(!l.contains_key("nvidia.com/gpu.product"));
    api.stop().await;
}

#[tokio::test]
async fn another_node_is_denied() {
    let (api, agent, _) = setup().await;
    let e = patch(
        &agent,
        "n2",
        labels(json!({"gpu-slicer.io/config.state": "success"})),
    )
    .await
    .unwrap_err();
    assert_eq!(
        e,
        (
            403,
            "gpu-slicer may change only the Node its token is bound to".into()
        )
    );
    api.stop().await;
}

#[tokio::test]
async fn keys_it_does_not_own_are_denied() {
    let (api, agent, _) = setup().await;
    for body in [
        labels(json!({"nvidia.com/device-plugin.config": "training"})),
        labels(json!({"nvidia.com/mig.config": "all-1g.10gb"})),
        labels(json!({"team": null})),
        labels(json!({"node-role.kubernetes.io/control-plane": ""})),
    ] {
        let e = patch(&agent, "n1", body.clone()).await.unwrap_err();
        assert_eq!(e.0, 403, "{body}: {e:?}");
        assert!(e.1.contains("only its state labels"), "{e:?}");
    }
    assert_eq!(
        api.get::<Node>("", "n1").unwrap().metadata.labels.unwrap()["nvidia.com/device-plugin.config"],
        "inference"
    );
    api.stop().await;
}

#[tokio::test]
async fn spec_and_annotation_changes_are_denied_and_others_are_not_bound() {
    let (api, agent, admin) = setup().await;
    let e = patch(&agent, "n1", json!({"spec": {"unschedulable": true}}))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        (403, "gpu-slicer may change only labels of its Node".into())
    );
    let e = patch(
        &agent,
        "n1",
        json!({"metadata": {"annotations": {"x": "y"}}}),
    )
    .await
    .unwrap_err();
    assert_eq!(e.0, 403);
    // Only the annotation that lists the GFD labels it wrote (--labels-to-node).
    patch(
        &agent,
        "n1",
        json!({"metadata": {
            "annotations": {"gpu-slicer.io/labels-owned": "nvidia.com/gpu.count"},
            "labels": {"nvidia.com/gpu.count": "2"}
        }}),
    )
    .await
    .unwrap();
    let e = patch(
        &agent,
        "n1",
        json!({"metadata": {"annotations": {"gpu-slicer.io/labels-owned": "", "x": "y"}}}),
    )
    .await
    .unwrap_err();
    assert_eq!(e.0, 403);
    // The policy binds only the agent's service account.
    patch(
        &admin,
        "n2",
        json!({"spec": {"unschedulable": true}, "metadata": {"labels": {"team": null}}}),
    )
    .await
    .unwrap();
    assert_eq!(api.count(Verb::Patch, "/api/v1/nodes"), 5);
    api.stop().await;
}
