use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::domain::cdi::{GenerateOptions, NoProbe, generate};
use crate::domain::dra::cdi::{claim_spec, qualified, spec_file_name};
use crate::domain::dra::slices::node_devices;
use crate::testkit::fixtures;

const DRIVER: &str = "gpu-slicer.io";
const UID: &str = "6a1f0c2e-8b7d-4e3a-9c55-0d1e2f3a4b5c";

fn want() -> ClaimRef {
    ClaimRef {
        namespace: "ml".into(),
        uid: UID.into(),
        name: "train".into(),
    }
}

fn claim(results: serde_json::Value, config: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "train", "namespace": "ml", "uid": UID, "resourceVersion": "7"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu-slicer.io"}}]}},
        "status": {"allocation": {"devices": {"results": results, "config": config}}}
    }))
    .unwrap()
}

fn result(device: &str) -> serde_json::Value {
    json!({"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device})
}

struct Node {
    devices: NodeDevices,
    prepared: BTreeMap<String, String>,
    spec: crate::domain::cdi::Spec,
}

fn node(health: &[(usize, &str)]) -> Node {
    let (inv, _, plan) =
        fixtures::planned("mixed-a100", "version: v1\nflags:\n  migStrategy: mixed\n");
    let health = health
        .iter()
        .map(|(i, r)| (inv.gpus[*i].uuid.clone(), (*r).to_string()))
        .collect();
    Node {
        devices: node_devices(&inv, &plan, &health),
        prepared: BTreeMap::new(),
        spec: generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe).unwrap(),
    }
}

impl Node {
    fn ctx(&self) -> NodeContext<'_> {
        NodeContext {
            driver: DRIVER,
            pool: "node-a",
            devices: &self.devices,
            prepared: &self.prepared,
        }
    }
}

fn reason(e: DraError) -> String {
    e.to_string()
}

#[test]
fn a_whole_gpu_and_a_mig_device_resolve_and_foreign_results_are_ignored() {
    let n = node(&[]);
    let c = claim(
        json!([result("gpu-2"),
               {"request": "mig/small", "driver": DRIVER, "pool": "node-a", "device": "gpu-0-mig-1g10gb-19-0"},
               {"request": "nic", "driver": "net.example.com", "pool": "other", "device": "eth0"}]),
        json!([{"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"anything": 1}}}]),
    );
    let r = resolve(&want(), &c, &n.ctx()).unwrap();
    assert_eq!(r.devices.len(), 2);
    assert_eq!(
        r.devices[0].uuid,
        "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02"
    );
    assert_eq!(r.devices[1].request, "mig", "subrequest stripped");
    assert_eq!(r.devices[1].kind, DeviceType::Mig);

    let spec = claim_spec(DRIVER, &n.spec, &r).unwrap();
    assert_eq!(spec.kind, "k8s.gpu-slicer.io/claim");
    let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            format!("{UID}-gpu-0-mig-1g10gb-19-0"),
            format!("{UID}-gpu-2")
        ]
    );
    // The same container edits as the node spec's device of the same UUID, and the same
    // spec-level edits: one generator, two front-ends.
    let base = n
        .spec
        .devices
        .iter()
        .find(|d| d.name == r.devices[0].uuid)
        .unwrap();
    assert_eq!(spec.devices[1].container_edits, base.container_edits);
    assert_eq!(spec.container_edits, n.spec.container_edits);
    assert_eq!(
        qualified(DRIVER, UID, "gpu-2"),
        format!("k8s.gpu-slicer.io/claim={UID}-gpu-2")
    );
    assert_eq!(
        spec_file_name(DRIVER, UID),
        format!("k8s.gpu-slicer.io-claim_{UID}.json")
    );
}

#[test]
fn bad_claims_are_refused_with_the_reason() {
    let n = node(&[(3, "xid-79")]);
    let unallocated: ResourceClaim = serde_json::from_value(
        json!({"metadata": {"name": "train", "namespace": "ml", "uid": UID}}),
    )
    .unwrap();
    assert!(
        reason(resolve(&want(), &unallocated, &n.ctx()).unwrap_err()).contains("not allocated")
    );

    let mut recreated = claim(json!([result("gpu-2")]), json!([]));
    recreated.metadata.uid = "00000000-0000-0000-0000-000000000001".into();
    assert!(reason(resolve(&want(), &recreated, &n.ctx()).unwrap_err()).contains("re-created"));

    let other_pool = claim(
        json!([{"request": "gpu", "driver": DRIVER, "pool": "node-b", "device": "gpu-2"}]),
        json!([]),
    );
    let e = reason(resolve(&want(), &other_pool, &n.ctx()).unwrap_err());
    assert!(e.contains("pool node-b") && e.contains("ml/train"), "{e}");

    let e = reason(
        resolve(
            &want(),
            &claim(json!([result("gpu-9")]), json!([])),
            &n.ctx(),
        )
        .unwrap_err(),
    );
    assert!(e.contains("gpu-9 does not exist"), "{e}");
    let e = reason(
        resolve(
            &want(),
            &claim(json!([result("gpu-3")]), json!([])),
            &n.ctx(),
        )
        .unwrap_err(),
    );
    assert!(e.contains("unhealthy (xid-79)"), "{e}");
    let foreign_only = claim(
        json!([{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]),
        json!([]),
    );
    assert!(
        reason(resolve(&want(), &foreign_only, &n.ctx()).unwrap_err())
            .contains("no device of driver")
    );
}

#[test]
fn a_device_prepared_for_another_claim_is_refused_unless_admin_access() {
    let mut n = node(&[]);
    n.prepared
        .insert("gpu-2".into(), "another-claim-uid".into());
    let e = reason(
        resolve(
            &want(),
            &claim(json!([result("gpu-2")]), json!([])),
            &n.ctx(),
        )
        .unwrap_err(),
    );
    assert!(
        e.contains("already prepared for claim another-claim-uid"),
        "{e}"
    );
    // The same claim again (the kubelet repeats calls) is fine.
    n.prepared.insert("gpu-2".into(), UID.into());
    assert!(
        resolve(
            &want(),
            &claim(json!([result("gpu-2")]), json!([])),
            &n.ctx()
        )
        .is_ok()
    );
    n.prepared
        .insert("gpu-2".into(), "another-claim-uid".into());
    let admin = claim(
        json!([{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-2", "adminAccess": true}]),
        json!([]),
    );
    assert!(resolve(&want(), &admin, &n.ctx()).unwrap().devices[0].admin_access);
}

#[test]
fn opaque_config_is_strict_claim_wins_over_class_and_kinds_must_fit() {
    let n = node(&[]);
    let params = |kind: &str, extra: serde_json::Value| {
        let mut p = json!({"apiVersion": "gpu-slicer.io/v1alpha1", "kind": kind});
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        p
    };
    let c = claim(
        json!([result("gpu-2")]),
        json!([
            {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER,
                "parameters": params("GpuConfig", json!({"sharing": {"strategy": "TimeSlicing"}}))}},
            {"source": "FromClass", "opaque": {"driver": DRIVER,
                "parameters": params("GpuConfig", json!({}))}}
        ]),
    );
    let r = resolve(&want(), &c, &n.ctx()).unwrap();
    assert!(
        r.devices[0].config.as_ref().unwrap().sharing.is_some(),
        "claim entry wins"
    );

    let bad_field = claim(
        json!([result("gpu-2")]),
        json!([{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER,
            "parameters": params("GpuConfig", json!({"replicas": 4}))}}]),
    );
    let e = reason(resolve(&want(), &bad_field, &n.ctx()).unwrap_err());
    assert!(
        e.contains("ml/train") && e.contains("request gpu") && e.contains("replicas"),
        "{e}"
    );

    let wrong_kind = claim(
        json!([result("gpu-2")]),
        json!([{"source": "FromClaim", "opaque": {"driver": DRIVER,
            "parameters": params("MigDeviceConfig", json!({}))}}]),
    );
    let e = reason(resolve(&want(), &wrong_kind, &n.ctx()).unwrap_err());
    assert!(
        e.contains("parameters.kind") && e.contains("gpu device"),
        "{e}"
    );

    let mps = claim(
        json!([result("gpu-2")]),
        json!([{"source": "FromClaim", "opaque": {"driver": DRIVER,
            "parameters": params("GpuConfig", json!({"sharing": {"strategy": "MPS"}}))}}]),
    );
    let r = resolve(&want(), &mps, &n.ctx()).unwrap();
    let e = reason(claim_spec(DRIVER, &n.spec, &r).unwrap_err());
    assert!(e.contains("MPS") && e.contains("request gpu"), "{e}");
}
