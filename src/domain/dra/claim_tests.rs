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
    prepared: BTreeMap<String, Vec<Holding>>,
    spec: crate::domain::cdi::Spec,
}

/// `device` held whole by `claim`.
fn held_by(claim: &str) -> Vec<Holding> {
    vec![Holding {
        claim: claim.into(),
        share_id: None,
        consumed: None,
    }]
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

fn reason(e: ClaimError) -> String {
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
        .insert("gpu-2".into(), held_by("another-claim-uid"));
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
    n.prepared.insert("gpu-2".into(), held_by(UID));
    assert!(
        resolve(
            &want(),
            &claim(json!([result("gpu-2")]), json!([])),
            &n.ctx()
        )
        .is_ok()
    );
    n.prepared
        .insert("gpu-2".into(), held_by("another-claim-uid"));
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
        e.contains("parameters.kind")
            && e.contains("`MigDeviceConfig` configures MIG devices")
            && e.contains("expected `GpuConfig`"),
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

// ---- shares of shared devices (consumable capacity) ----------------------------------

/// GPU 2 shared with `memory+mps`, GPU 3 with `memory`, GPUs 0/1 as MIG.
const SHARED: &str = "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.mps, replicas: 4, devices: [2], isolation: memory+mps}\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.mem, replicas: 4, devices: [3], isolation: memory}\n";

struct Shared {
    node: Node,
    mps: Vec<crate::domain::mps::DaemonSpec>,
}

fn shared_node() -> Shared {
    let (inv, cfg, plan) = fixtures::planned("mixed-a100", SHARED);
    let health = BTreeMap::new();
    let mps = crate::domain::mps::daemons_for(&plan, &cfg).unwrap();
    Shared {
        node: Node {
            devices: node_devices(&inv, &plan, &health),
            prepared: BTreeMap::new(),
            spec: generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe).unwrap(),
        },
        mps,
    }
}

fn share_result(device: &str, share: &str, memory: &str, compute: &str) -> serde_json::Value {
    json!({"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device,
           "shareID": share, "consumedCapacity": {"memory": memory, "compute": compute}})
}

fn hook() -> crate::domain::cdi::shares::HookSettings {
    crate::domain::cdi::shares::HookSettings {
        path: "/opt/gpu-slicer/bin/gpu-slicer".into(),
        nvml_lib: None,
        env: vec![],
    }
}

fn spec_with(s: &Shared, r: &Resolved) -> Result<crate::domain::cdi::Spec, ClaimError> {
    let made = BTreeMap::new();
    let hook = hook();
    let inputs = crate::domain::dra::cdi::SpecInputs {
        node: &s.node.spec,
        hook: Some(&hook),
        mps: &s.mps,
        made: &made,
    };
    crate::domain::dra::cdi::claim_spec_with(DRIVER, &inputs, r)
}

const SHARE: &str = "7b0c3a64-1f51-4a4b-9e0c-0d7b6a0c1e2f";

#[test]
fn shares_bind_their_exact_memory_and_compute_and_name_the_share() {
    let s = shared_node();
    let gpu2 = s.node.devices.get("gpu-2").unwrap();
    assert_eq!(gpu2.device.allow_multiple_allocations, Some(true));
    assert_eq!(
        gpu2.shared.as_ref().unwrap().isolation,
        crate::domain::config::Isolation::MemoryMps
    );
    let c = claim(
        json!([share_result("gpu-2", SHARE, "10Gi", "25")]),
        json!([]),
    );
    let r = resolve(&want(), &c, &s.node.ctx()).unwrap();
    let share = r.devices[0].share.as_ref().unwrap();
    assert_eq!(share.consumed.memory_bytes, 10 << 30);
    let spec = spec_with(&s, &r).unwrap();
    assert_eq!(spec.devices[0].name, format!("{UID}-gpu-2-{SHARE}"));
    let edits = &spec.devices[0].container_edits;
    let hook_args = edits.hooks[0].args.join(" ");
    assert!(
        hook_args.ends_with(&format!(
            "set-memory-limit --device {} --bytes {}",
            r.devices[0].gpu_uuid,
            10u64 << 30
        )),
        "{hook_args}"
    );
    assert!(
        edits
            .env
            .contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_string()),
        "{:?}",
        edits.env
    );
    assert!(
        edits
            .env
            .contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M".to_string()),
        "{:?}",
        edits.env
    );
    assert_eq!(
        crate::domain::dra::cdi::qualified_resolved(DRIVER, UID, &r.devices[0]),
        format!("k8s.gpu-slicer.io/claim={UID}-gpu-2-{SHARE}")
    );
    // A share that reserves no compute gets no thread percentage: the daemon's applies.
    let c = claim(
        json!([share_result("gpu-2", SHARE, "10Gi", "0")]),
        json!([]),
    );
    let r = resolve(&want(), &c, &s.node.ctx()).unwrap();
    let env = &spec_with(&s, &r).unwrap().devices[0].container_edits.env;
    assert!(
        !env.iter()
            .any(|e| e.starts_with("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")),
        "{env:?}"
    );
}

#[test]
fn the_node_refuses_an_over_committed_share_naming_the_free_figure() {
    let mut s = shared_node();
    let held = |claim: &str, gib: u64| Holding {
        claim: claim.into(),
        share_id: Some(format!("share-{claim}")),
        consumed: Some(Consumed {
            memory_bytes: gib << 30,
            compute_percent: 0,
        }),
    };
    s.node
        .prepared
        .insert("gpu-3".into(), vec![held("a", 10), held("b", 30)]);
    let over = claim(
        json!([share_result("gpu-3", SHARE, "50Gi", "0")]),
        json!([]),
    );
    let e = reason(resolve(&want(), &over, &s.node.ctx()).unwrap_err());
    assert!(
        e.contains("gpu-3") && e.contains("50Gi") && e.contains("40Gi") && e.contains("80Gi"),
        "{e}"
    );
    assert!(
        resolve(
            &want(),
            &claim(
                json!([share_result("gpu-3", SHARE, "40Gi", "0")]),
                json!([])
            ),
            &s.node.ctx()
        )
        .is_ok()
    );
    // Two shares of one device in one claim count together.
    let two = claim(
        json!([
            share_result("gpu-3", SHARE, "30Gi", "0"),
            share_result("gpu-3", "other-share", "20Gi", "0")
        ]),
        json!([]),
    );
    let e = reason(resolve(&want(), &two, &s.node.ctx()).unwrap_err());
    assert!(e.contains("20Gi") && e.contains("10Gi"), "{e}");
    // No consumedCapacity (an API server without consumable capacity): the whole device.
    let whole = claim(json!([result("gpu-3")]), json!([]));
    assert!(
        reason(resolve(&want(), &whole, &s.node.ctx()).unwrap_err()).contains("over-committed")
    );
    // A share of an exclusive device, or a share ID that is not a label, is refused.
    let e = reason(
        resolve(
            &want(),
            &claim(
                json!([share_result("gpu-0-mig-1g10gb-19-0", SHARE, "1Gi", "0")]),
                json!([]),
            ),
            &s.node.ctx(),
        )
        .unwrap_err(),
    );
    assert!(e.contains("not shared") && e.contains(SHARE), "{e}");
    let e = reason(
        resolve(
            &want(),
            &claim(
                json!([share_result("gpu-3", "../x", "1Gi", "0")]),
                json!([]),
            ),
            &s.node.ctx(),
        )
        .unwrap_err(),
    );
    assert!(e.contains("shareID"), "{e}");
}

#[test]
fn opaque_config_meets_the_device_isolation_and_conflicts_name_both() {
    let s = shared_node();
    let opaque = |params: serde_json::Value| json!([{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]);
    let gpu = |extra: serde_json::Value| {
        let mut p = json!({"apiVersion": "gpu-slicer.io/v1alpha1", "kind": "GpuConfig"});
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        p
    };
    // MPS on the `memory` GPU: no daemon serves it.
    let c = claim(
        json!([share_result("gpu-3", SHARE, "10Gi", "0")]),
        opaque(gpu(json!({"sharing": {"strategy": "MPS"}}))),
    );
    let r = resolve(&want(), &c, &s.node.ctx()).unwrap();
    let e = reason(spec_with(&s, &r).unwrap_err());
    assert!(
        e.contains("strategy MPS")
            && e.contains("gpu-3")
            && e.contains("`memory`")
            && e.contains("sharing.timeSlicing"),
        "{e}"
    );
    // Time-slicing on the MPS GPU: its tenants go through its daemon.
    let c = claim(
        json!([share_result("gpu-2", SHARE, "10Gi", "0")]),
        opaque(gpu(json!({"sharing": {"strategy": "TimeSlicing"}}))),
    );
    let r = resolve(&want(), &c, &s.node.ctx()).unwrap();
    let e = reason(spec_with(&s, &r).unwrap_err());
    assert!(
        e.contains("TimeSlicing") && e.contains("`memory+mps`"),
        "{e}"
    );
    // A capacity request wins over the config's default; the default fills in without one.
    let c = claim(
        json!([share_result("gpu-2", SHARE, "10Gi", "0")]),
        opaque(gpu(json!({"sharing": {"strategy": "MPS", "mpsConfig": {
            "defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "4Gi"}}}))),
    );
    let r = resolve(&want(), &c, &s.node.ctx()).unwrap();
    let env = spec_with(&s, &r).unwrap().devices[0]
        .container_edits
        .env
        .clone();
    assert!(
        env.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40".to_string()),
        "{env:?}"
    );
    assert!(
        env.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M".to_string()),
        "{env:?}"
    );
    let c = claim(
        json!([share_result("gpu-2", SHARE, "10Gi", "25")]),
        opaque(gpu(
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}}),
        )),
    );
    let r = resolve(&want(), &c, &s.node.ctx()).unwrap();
    let env = spec_with(&s, &r).unwrap().devices[0]
        .container_edits
        .env
        .clone();
    assert!(
        env.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_string()),
        "{env:?}"
    );
    // Isolation `memory` asked on an exclusive whole GPU: the hook with the whole device.
    let (inv, _, plan) = fixtures::planned("mixed-a100", "version: v1\n");
    let plain = Shared {
        node: Node {
            devices: node_devices(&inv, &plan, &BTreeMap::new()),
            prepared: BTreeMap::new(),
            spec: s.node.spec.clone(),
        },
        mps: Vec::new(),
    };
    let c = claim(
        json!([result("gpu-2")]),
        opaque(gpu(json!({"isolation": "memory"}))),
    );
    let r = resolve(&want(), &c, &plain.node.ctx()).unwrap();
    let spec = spec_with(&plain, &r).unwrap();
    assert!(
        spec.devices[0].container_edits.hooks[0]
            .args
            .join(" ")
            .contains(&format!("--bytes {}", 80u64 << 30))
    );
}
