//! Allocate tests: each enforcement rule, health fan-out, preferred-allocation policies
//! (with property tests) and response formats.

use proptest::prelude::*;

use super::*;
use crate::domain::config::{self, AllocationPolicy, Config, DeviceListStrategy, Overrides};
use crate::domain::inventory::{Backend, Health};
use crate::domain::plan::{self, Physical, Plan, Resource, ResourceKind, Share};
use crate::domain::view;
use crate::platform::sim::SimBackend;

const GPU2: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02";
const GPU3: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03";
const GPU0: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e00";
const MIG07: &str = "MIG-1b2c3d4e-0000-4a00-8000-000000000007";
const MIG1_3G: &str = "MIG-2c3d4e5f-0000-4b00-8000-000000000002";

fn plan_of(profile: &str, text: &str) -> (Plan, Config) {
    let (_, cfg, plan) = crate::testkit::fixtures::planned(profile, text);
    (plan, cfg)
}

/// Plan × health overlay, the way the state store derives views, without the store.
struct NodeHealth {
    plan: Plan,
    overlay: Overlay,
    views: std::collections::BTreeMap<String, std::sync::Arc<ResourceView>>,
}

impl NodeHealth {
    fn new(plan: &Plan) -> Self {
        let overlay = Overlay::default();
        let views = view::views(plan, &overlay, &std::collections::BTreeMap::new());
        Self {
            plan: plan.clone(),
            overlay,
            views,
        }
    }

    fn apply(
        &mut self,
        u: &HealthUpdate,
    ) -> Result<std::collections::BTreeSet<String>, StateError> {
        self.overlay.apply(
            &self.plan,
            &crate::domain::inventory::Inventory::default(),
            u,
        )?;
        let next = view::views(&self.plan, &self.overlay, &self.views);
        let changed = view::changed(&self.views, &next);
        self.views = next;
        Ok(changed)
    }

    fn view(&self, name: &str) -> Option<ResourceView> {
        self.views.get(name).map(|v| ResourceView::clone(v))
    }
}

fn shared(extra: &str) -> (Plan, Config) {
    plan_of(
        "mixed-a100",
        &format!(
            "flags: {{migStrategy: mixed}}\nsharing:\n  timeSlicing:\n{extra}    resources:\n    - {{name: nvidia.com/gpu, replicas: 4}}\n"
        ),
    )
}

fn view(plan: &Plan, name: &str) -> ResourceView {
    NodeHealth::new(plan).view(name).unwrap()
}

fn rep(uuid: &str, n: u32) -> String {
    format!("{uuid}::{n}")
}

#[test]
fn valid_replicas_of_one_gpu() {
    let (plan, _) = shared("");
    let v = view(&plan, "nvidia.com/gpu");
    let got = validate(&v, &[rep(GPU2, 0), rep(GPU2, 1)]).unwrap();
    assert_eq!(got.len(), 2);
}

#[test]
fn rule_empty_request() {
    let (plan, _) = shared("");
    let v = view(&plan, "nvidia.com/gpu");
    let err = validate::<String>(&v, &[]).unwrap_err();
    assert_eq!(err, AllocateError::Empty);
    assert_eq!(err.class(), ErrorClass::Invalid);
}

#[test]
fn rule_unknown_id() {
    let (plan, _) = shared("");
    let v = view(&plan, "nvidia.com/gpu");
    let err = validate(&v, &[rep(GPU2, 0), "GPU-nope".to_string()]).unwrap_err();
    assert!(matches!(&err, AllocateError::Unknown { id, .. } if id == "GPU-nope"));
    assert_eq!(err.class(), ErrorClass::Invalid);
    assert!(err.to_string().contains("GPU-nope"), "{err}");
    assert!(err.to_string().contains("IDs must exist"), "{err}");
}

#[test]
fn rule_id_of_another_resource_is_unknown() {
    let (plan, _) = shared("");
    let v = view(&plan, "nvidia.com/gpu");
    let err = validate(&v, &[MIG07]).unwrap_err();
    assert!(matches!(err, AllocateError::Unknown { .. }));
}

#[test]
fn rule_duplicate_id() {
    let (plan, _) = shared("");
    let v = view(&plan, "nvidia.com/gpu");
    let err = validate(&v, &[rep(GPU2, 1), rep(GPU2, 1)]).unwrap_err();
    assert_eq!(err, AllocateError::Duplicate { id: rep(GPU2, 1) });
    assert!(err.to_string().contains("unique"), "{err}");
}

#[test]
fn rule_unhealthy_device() {
    let (plan, _) = shared("");
    let mut state = NodeHealth::new(&plan);
    state
        .apply(&HealthUpdate {
            key: GPU2.into(),
            health: Health::Unhealthy,
            reason: "Xid 79".into(),
        })
        .unwrap();
    let v = state.view("nvidia.com/gpu").unwrap();
    let err = validate(&v, &[rep(GPU2, 3)]).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Unhealthy);
    assert!(err.to_string().contains("Xid 79"), "{err}");
    assert!(err.to_string().contains(&rep(GPU2, 3)), "{err}");
    // The other GPU's replicas stay allocatable.
    validate(&v, &[rep(GPU3, 0)]).unwrap();
}

#[test]
fn rule_fail_requests_greater_than_one() {
    let (plan, _) = shared("    failRequestsGreaterThanOne: true\n");
    let v = view(&plan, "nvidia.com/gpu");
    validate(&v, &[rep(GPU2, 0)]).unwrap();
    let err = validate(&v, &[rep(GPU2, 0), rep(GPU2, 1)]).unwrap_err();
    assert!(matches!(
        err,
        AllocateError::TooManyReplicas { count: 2, .. }
    ));
    assert!(
        err.to_string().contains("failRequestsGreaterThanOne"),
        "{err}"
    );
}

#[test]
fn rule_replicas_on_one_gpu() {
    let (plan, _) = shared("");
    let v = view(&plan, "nvidia.com/gpu");
    let err = validate(&v, &[rep(GPU2, 0), rep(GPU3, 0)]).unwrap_err();
    assert_eq!(
        err,
        AllocateError::MultiGpu {
            id: rep(GPU3, 0),
            physical: GPU3.into(),
            other: GPU2.into()
        }
    );
    assert!(err.to_string().contains("allowMultiGpu"), "{err}");
}

#[test]
fn rule_multi_gpu_allowed_when_configured() {
    let mut plan = shared("").0;
    for r in &mut plan.resources {
        if let Some(s) = &mut r.sharing {
            s.allow_multi_gpu = true;
        }
    }
    let v = view(&plan, "nvidia.com/gpu");
    validate(&v, &[rep(GPU2, 0), rep(GPU3, 0)]).unwrap();
}

fn device(id: &str, gpu: &str, mig: Option<u32>) -> plan::Device {
    plan::Device {
        id: id.into(),
        physical: Physical {
            uuid: id.into(),
            gpu_uuid: gpu.into(),
            gpu_index: 0,
            mig_index: mig,
            mig_profile: mig.map(|_| "1g.10gb".into()),
        },
        replica: None,
        share: Share {
            memory_bytes: 1,
            compute_percent: 1,
        },
        health: Health::Healthy,
        numa_node: None,
    }
}

#[test]
fn rule_whole_gpu_with_its_mig_slice() {
    // Plans never build such a resource; the rule guards against one anyway.
    let mut devices = vec![device(GPU0, GPU0, None), device(MIG07, GPU0, Some(0))];
    devices.sort_by(|a, b| a.id.cmp(&b.id));
    let plan = Plan {
        resources: vec![Resource {
            name: "example.com/mixed".into(),
            kind: ResourceKind::Gpu,
            sharing: None,
            devices,
            links: None,
        }],
    };
    let v = view(&plan, "example.com/mixed");
    let err = validate(&v, &[GPU0, MIG07]).unwrap_err();
    assert_eq!(
        err,
        AllocateError::WholeAndMig {
            id: MIG07.into(),
            gpu: GPU0.into()
        }
    );
}

#[test]
fn gpu_event_marks_every_device_backed_by_it() {
    // GPU 0 is split into seven 1g.10gb slices; replicate MIG slices too.
    let (plan, _) = plan_of(
        "mixed-a100",
        "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n",
    );
    let mut state = NodeHealth::new(&plan);
    let changed = state
        .apply(&HealthUpdate {
            key: GPU0.into(),
            health: Health::Unhealthy,
            reason: "fell off the bus".into(),
        })
        .unwrap();
    assert_eq!(
        changed.into_iter().collect::<Vec<_>>(),
        vec!["nvidia.com/mig-1g.10gb".to_string()]
    );
    let v = state.view("nvidia.com/mig-1g.10gb").unwrap();
    let unhealthy: Vec<&str> = v
        .devices()
        .filter(|(_, h)| h.health == Health::Unhealthy)
        .map(|(d, _)| d.id.as_str())
        .collect();
    assert_eq!(unhealthy.len(), 14, "7 slices x 2 replicas");
    assert!(unhealthy.iter().all(|id| id.starts_with("MIG-1b2c3d4e")));
    // GPU 1's slices are untouched.
    assert_eq!(v.healthy_count(), 4);
    // Recovery restores them.
    let changed = state
        .apply(&HealthUpdate {
            key: GPU0.into(),
            health: Health::Healthy,
            reason: String::new(),
        })
        .unwrap();
    assert_eq!(changed.len(), 1);
    assert_eq!(
        state
            .view("nvidia.com/mig-1g.10gb")
            .unwrap()
            .healthy_count(),
        18
    );
}

#[test]
fn parent_gpu_event_reaches_every_mig_resource() {
    let (plan, _) = plan_of("mixed-a100", "flags: {migStrategy: mixed}");
    let mut state = NodeHealth::new(&plan);
    let changed = state
        .apply(&HealthUpdate {
            key: "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e01".into(),
            health: Health::Unhealthy,
            reason: "Xid 48".into(),
        })
        .unwrap();
    assert_eq!(
        changed.into_iter().collect::<Vec<_>>(),
        vec![
            "nvidia.com/mig-1g.10gb".to_string(),
            "nvidia.com/mig-2g.20gb".to_string(),
            "nvidia.com/mig-3g.40gb".to_string()
        ]
    );
}

#[test]
fn mig_event_marks_only_that_slice() {
    let (plan, _) = plan_of("mixed-a100", "flags: {migStrategy: mixed}");
    let mut state = NodeHealth::new(&plan);
    let changed = state
        .apply(&HealthUpdate {
            key: MIG1_3G.into(),
            health: Health::Unhealthy,
            reason: "ECC".into(),
        })
        .unwrap();
    assert_eq!(changed.len(), 1);
    assert_eq!(
        state
            .view("nvidia.com/mig-3g.40gb")
            .unwrap()
            .healthy_count(),
        0
    );
    assert_eq!(
        state
            .view("nvidia.com/mig-1g.10gb")
            .unwrap()
            .healthy_count(),
        9
    );
    assert!(matches!(
        state.apply(&HealthUpdate {
            key: "GPU-unknown".into(),
            health: Health::Unhealthy,
            reason: String::new()
        }),
        Err(StateError::UnknownKey { .. })
    ));
}

#[test]
fn the_store_publishes_changed_views_only() {
    let (inv, cfg, plan) = crate::testkit::fixtures::planned(
        "mixed-a100",
        "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
    );
    let store =
        crate::state::Store::new(crate::domain::snapshot::Snapshot::serving(cfg, inv, plan));
    let mut rx = store.subscribe();
    let before = rx.borrow_and_update().clone();
    assert_eq!(before.view("nvidia.com/gpu").unwrap().healthy_count(), 8);
    let changed = store
        .set_health(&rep(GPU3, 2), Health::Unhealthy, "test")
        .unwrap();
    assert_eq!(
        changed.into_iter().collect::<Vec<_>>(),
        vec!["nvidia.com/gpu".to_string()]
    );
    assert!(rx.has_changed().unwrap());
    let after = rx.borrow_and_update().clone();
    assert_eq!(after.view("nvidia.com/gpu").unwrap().healthy_count(), 7);
    assert!(after.generation > before.generation);
    assert!(
        std::sync::Arc::ptr_eq(
            before.view("nvidia.com/mig-1g.10gb").unwrap(),
            after.view("nvidia.com/mig-1g.10gb").unwrap()
        ),
        "an untouched resource keeps its view"
    );
}

fn ids(v: &ResourceView) -> Vec<String> {
    v.resource.devices.iter().map(|d| d.id.clone()).collect()
}

#[test]
fn packed_fills_one_gpu_first() {
    let (mut plan, _) = shared("");
    for r in &mut plan.resources {
        if let Some(s) = &mut r.sharing {
            s.allow_multi_gpu = true;
        }
    }
    let v = view(&plan, "nvidia.com/gpu");
    let all = ids(&v);
    let got = preferred(&v, AllocationPolicy::Packed, &all, &[], 4);
    assert!(got.iter().all(|id| id.starts_with(GPU2)), "{got:?}");
    // With one replica of GPU3 already in use elsewhere, packing prefers GPU3.
    let avail: Vec<String> = all
        .iter()
        .filter(|id| **id != rep(GPU3, 0))
        .cloned()
        .collect();
    let got = preferred(&v, AllocationPolicy::Packed, &avail, &[], 2);
    assert!(got.iter().all(|id| id.starts_with(GPU3)), "{got:?}");
}

#[test]
fn distributed_spreads_replicas() {
    let (mut plan, _) = shared("");
    for r in &mut plan.resources {
        if let Some(s) = &mut r.sharing {
            s.allow_multi_gpu = true;
        }
    }
    let v = view(&plan, "nvidia.com/gpu");
    let got = preferred(&v, AllocationPolicy::Distributed, &ids(&v), &[], 2);
    assert!(got.iter().any(|id| id.starts_with(GPU2)), "{got:?}");
    assert!(got.iter().any(|id| id.starts_with(GPU3)), "{got:?}");
    // Size 1 picks the least loaded GPU.
    let avail: Vec<String> = ids(&v)
        .into_iter()
        .filter(|id| !id.starts_with(GPU2) || id.ends_with("::3"))
        .collect();
    let got = preferred(&v, AllocationPolicy::Distributed, &avail, &[], 1);
    assert!(got[0].starts_with(GPU3), "{got:?}");
}

#[test]
fn replicas_without_multi_gpu_stay_on_one_gpu() {
    let (plan, _) = shared("");
    let v = view(&plan, "nvidia.com/gpu");
    for policy in [AllocationPolicy::Packed, AllocationPolicy::Distributed] {
        let got = preferred(&v, policy, &ids(&v), &[rep(GPU3, 2)], 3);
        assert_eq!(got[0], rep(GPU3, 2));
        assert!(got.iter().all(|id| id.starts_with(GPU3)), "{got:?}");
        validate(&v, &got).unwrap();
    }
}

#[test]
fn whole_gpus_prefer_one_numa_node() {
    let (plan, _) = plan_of("dgx-h100", "");
    let v = view(&plan, "nvidia.com/gpu");
    // Must-include on NUMA node 1 (GPU 4): the rest comes from node 1 too.
    let must = vec![
        v.resource
            .devices
            .iter()
            .find(|d| d.physical.gpu_index == 4)
            .unwrap()
            .id
            .clone(),
    ];
    let got = preferred(&v, AllocationPolicy::Distributed, &ids(&v), &must, 3);
    for id in &got {
        assert_eq!(v.get(id).unwrap().0.numa_node, Some(1), "{got:?}");
    }
    // Node 0 has only 2 GPUs left, node 1 has 4: a request for 3 goes to node 1.
    let avail: Vec<String> = v
        .resource
        .devices
        .iter()
        .filter(|d| d.physical.gpu_index >= 2)
        .map(|d| d.id.clone())
        .collect();
    let got = preferred(&v, AllocationPolicy::Packed, &avail, &[], 3);
    for id in &got {
        assert_eq!(v.get(id).unwrap().0.numa_node, Some(1), "{got:?}");
    }
}

#[test]
fn preferred_never_fails_on_odd_input() {
    let (plan, _) = shared("");
    let v = view(&plan, "nvidia.com/gpu");
    let avail = vec!["x".to_string(), rep(GPU2, 0)];
    let got = preferred(&v, AllocationPolicy::Packed, &avail, &["y".to_string()], 3);
    assert_eq!(got, vec!["y".to_string(), rep(GPU2, 0), "x".to_string()]);
    let got = preferred::<String>(&v, AllocationPolicy::Packed, &[], &[], 2);
    assert!(got.is_empty());
}

fn policies() -> impl Strategy<Value = AllocationPolicy> {
    prop_oneof![
        Just(AllocationPolicy::Packed),
        Just(AllocationPolicy::Distributed)
    ]
}

proptest! {
    #[test]
    fn preferred_answers_are_well_formed(
        profile in prop_oneof![Just(0usize), Just(1), Just(2)],
        policy in policies(),
        mask in proptest::collection::vec(any::<bool>(), 64),
        must_n in 0usize..3,
        size in 1usize..10,
    ) {
        let (plan, _) = match profile {
            0 => plan_of("dgx-h100", "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 8}\n"),
            1 => plan_of("dgx-h100", ""),
            _ => plan_of("mixed-a100", "flags: {migStrategy: mixed}"),
        };
        let name = &plan.resources.iter().max_by_key(|r| r.devices.len()).unwrap().name;
        let v = view(&plan, name);
        let available: Vec<String> = v.resource.devices.iter().enumerate()
            .filter(|(i, _)| mask[i % mask.len()])
            .map(|(_, d)| d.id.clone()).collect();
        let must: Vec<String> = available.iter().take(must_n.min(size)).cloned().collect();
        let got = preferred(&v, policy, &available, &must, size);
        prop_assert_eq!(got.len(), size.min(available.len()));
        prop_assert!(got.iter().all(|id| available.contains(id)));
        prop_assert!(must.iter().all(|id| got.contains(id)));
        let mut dedup = got.clone();
        dedup.sort();
        dedup.dedup();
        prop_assert_eq!(dedup.len(), got.len());
    }
}

#[test]
fn response_is_cdi_first_and_deduplicated() {
    let (plan, cfg) = shared("");
    let v = view(&plan, "nvidia.com/gpu");
    let devices = validate(&v, &[rep(GPU2, 0), rep(GPU2, 1)]).unwrap();
    let r = build_response(&cfg, &v.resource, &devices);
    assert_eq!(r.cdi_devices, vec![format!("gpu-slicer.io/gpu={GPU2}")]);
    assert_eq!(
        r.annotations.get("cdi.k8s.io/gpu-slicer_nvidia.com_gpu"),
        Some(&format!("gpu-slicer.io/gpu={GPU2}"))
    );
    // Default strategy is envvar.
    assert_eq!(
        r.envs.get("NVIDIA_VISIBLE_DEVICES"),
        Some(&GPU2.to_string())
    );
    assert_eq!(
        r.envs.get("GPU_SLICER_REPLICAS").map(String::as_str),
        Some("2")
    );
    assert_eq!(
        r.envs.get("GPU_SLICER_COMPUTE_PERCENT").map(String::as_str),
        Some("50")
    );
    assert_eq!(
        r.envs.get("GPU_SLICER_MEMORY_BYTES"),
        Some(&((80u64 << 30) / 2).to_string())
    );
    assert!(r.mounts.is_empty());
}

#[test]
fn response_strategies() {
    let (plan, mut cfg) = plan_of("mixed-a100", "flags: {migStrategy: mixed}");
    let v = view(&plan, "nvidia.com/mig-1g.10gb");
    let devices = validate(&v, &[MIG07]).unwrap();
    cfg.device_list_strategy = vec![
        DeviceListStrategy::CdiCri,
        DeviceListStrategy::CdiAnnotations,
    ];
    let r = build_response(&cfg, &v.resource, &devices);
    assert!(!r.envs.contains_key("NVIDIA_VISIBLE_DEVICES"));
    assert!(r.mounts.is_empty());
    cfg.device_list_strategy = vec![DeviceListStrategy::VolumeMounts];
    cfg.device_id_strategy = config::DeviceIdStrategy::Index;
    let r = build_response(&cfg, &v.resource, &devices);
    assert_eq!(
        r.envs.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str),
        Some("/var/run/nvidia-container-devices")
    );
    assert_eq!(r.mounts.len(), 1);
    assert_eq!(
        r.mounts[0].container_path,
        "/var/run/nvidia-container-devices/0:0"
    );
    assert_eq!(r.mounts[0].host_path, "/dev/null");
}

#[test]
fn annotation_keys_are_valid_names() {
    let long = format!("example.com/{}", "a".repeat(50));
    for resource in ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb.me", long.as_str()] {
        let key = response::annotation_key("cdi.k8s.io/", resource);
        let name = key.strip_prefix("cdi.k8s.io/").unwrap();
        assert!(name.len() <= 63, "{name}");
        assert!(name.starts_with("gpu-slicer_"));
        assert!(name.chars().last().unwrap().is_ascii_alphanumeric());
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        );
    }
}

#[test]
fn device_specs_only_when_asked() {
    let inv = SimBackend::open("mixed-a100").unwrap().discover().unwrap();
    let (plan, mut cfg) = plan_of("mixed-a100", "flags: {migStrategy: mixed}");
    let nodes = DeviceNodes::new(&inv).unwrap();
    let v = view(&plan, "nvidia.com/mig-1g.10gb");
    let devices = validate(&v, &[MIG07]).unwrap();
    let mut r = build_response(&cfg, &v.resource, &devices);
    add_device_specs(&mut r, &cfg, &nodes, &devices);
    assert!(r.device_specs.is_empty());
    cfg.pass_device_specs = true;
    cfg.dev_root = "/host".into();
    add_device_specs(&mut r, &cfg, &nodes, &devices);
    let paths: Vec<&str> = r
        .device_specs
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert!(paths.contains(&"/dev/nvidiactl"));
    let gpu0 = inv.gpus.iter().find(|g| g.index == 0).unwrap();
    let gpu_node = format!("/dev/nvidia{}", gpu0.minor);
    assert!(paths.contains(&gpu_node.as_str()), "{paths:?}");
    let mig = &gpu0.mig_devices[0];
    if let Some(gi) = mig.gi_cap_minor {
        assert!(
            paths.contains(&format!("/dev/nvidia-caps/nvidia-cap{gi}").as_str()),
            "{paths:?}"
        );
    }
    assert!(
        r.device_specs
            .iter()
            .all(|d| d.host_path.starts_with("/host/dev/") && d.permissions == "rw")
    );
}

/// GPUs 2 and 3 of mixed-a100 split 4 ways with `isolation`.
fn enforced(isolation: &str, extra: &str) -> (Plan, Config) {
    plan_of(
        "mixed-a100",
        &format!(
            "flags: {{migStrategy: mixed}}\nsharing:\n  timeSlicing:\n    resources:\n    - {{name: nvidia.com/gpu, replicas: 4, isolation: \"{isolation}\"{extra}}}\n"
        ),
    )
}

#[test]
fn enforced_k_replicas_answer_with_the_k_share_device() {
    for isolation in ["memory", "mps", "memory+mps"] {
        let (plan, cfg) = enforced(isolation, "");
        let v = view(&plan, "nvidia.com/gpu");
        let devices = validate(&v, &[rep(GPU2, 3), rep(GPU2, 0), rep(GPU2, 1)]).unwrap();
        let r = build_response(&cfg, &v.resource, &devices);
        let want = format!("gpu-slicer.io/gpu={GPU2}-share-3");
        assert_eq!(r.cdi_devices, vec![want.clone()], "{isolation}");
        assert_eq!(
            r.annotations.get("cdi.k8s.io/gpu-slicer_nvidia.com_gpu"),
            Some(&want)
        );
        assert_eq!(
            r.envs.get("GPU_SLICER_MEMORY_BYTES"),
            Some(&(3 * ((80u64 << 30) / 4)).to_string())
        );
    }
    // `none` keeps naming the GPU itself.
    let (plan, cfg) = enforced("none", "");
    let v = view(&plan, "nvidia.com/gpu");
    let devices = validate(&v, &[rep(GPU2, 3), rep(GPU2, 0)]).unwrap();
    let r = build_response(&cfg, &v.resource, &devices);
    assert_eq!(r.cdi_devices, vec![format!("gpu-slicer.io/gpu={GPU2}")]);
}

#[test]
fn enforced_replicas_spanning_gpus_are_invalid_naming_both() {
    let (plan, _) = enforced("memory", "");
    let v = view(&plan, "nvidia.com/gpu");
    let err = validate(&v, &[rep(GPU2, 0), rep(GPU3, 1)]).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Invalid);
    let msg = err.to_string();
    assert!(msg.contains(GPU2) && msg.contains(GPU3), "{msg}");
}

#[test]
fn enforced_multi_gpu_when_allowed_gets_one_share_device_per_gpu() {
    let (plan, cfg) = enforced("memory", ", allowMultiGpu: true");
    let v = view(&plan, "nvidia.com/gpu");
    let devices = validate(&v, &[rep(GPU2, 0), rep(GPU3, 1), rep(GPU2, 2)]).unwrap();
    let r = build_response(&cfg, &v.resource, &devices);
    assert_eq!(
        r.cdi_devices,
        vec![
            format!("gpu-slicer.io/gpu={GPU2}-share-2"),
            format!("gpu-slicer.io/gpu={GPU3}-share-1")
        ]
    );
}

#[test]
fn mps_section_keeps_fail_requests_greater_than_one_by_default() {
    let (plan, _) = plan_of(
        "mixed-a100",
        "flags: {migStrategy: mixed}\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
    );
    let v = view(&plan, "nvidia.com/gpu");
    let err = validate(&v, &[rep(GPU2, 0), rep(GPU2, 1)]).unwrap_err();
    assert!(
        matches!(err, AllocateError::TooManyReplicas { .. }),
        "{err}"
    );
    let (plan, _) = plan_of(
        "mixed-a100",
        "flags: {migStrategy: mixed}\nsharing:\n  mps:\n    failRequestsGreaterThanOne: false\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
    );
    let v = view(&plan, "nvidia.com/gpu");
    validate(&v, &[rep(GPU2, 0), rep(GPU2, 1)]).unwrap();
}

#[test]
fn preferred_packs_k_replicas_on_the_gpu_with_k_free() {
    let (plan, _) = enforced("memory", "");
    let v = view(&plan, "nvidia.com/gpu");
    // GPU 3 has 2 free replicas, GPU 2 has 3: a 3-replica request must land on GPU 2
    // whatever the policy (packed would otherwise prefer the fuller GPU 3).
    let avail = vec![
        rep(GPU2, 0),
        rep(GPU2, 1),
        rep(GPU2, 3),
        rep(GPU3, 0),
        rep(GPU3, 2),
    ];
    for policy in [AllocationPolicy::Packed, AllocationPolicy::Distributed] {
        let got = preferred(&v, policy, &avail, &[], 3);
        assert_eq!(got.len(), 3);
        assert!(
            got.iter().all(|id| id.starts_with(GPU2)),
            "{policy:?}: {got:?}"
        );
        validate(&v, &got).unwrap();
    }
}

proptest! {
    /// For every k = 1..N and any k replicas of one GPU: the answer is the k-share device,
    /// that device exists in the generated spec, and its hook sets k × memory / N.
    #[test]
    fn k_replicas_get_a_spec_device_with_k_shares_of_memory(
        n in 2u32..9,
        picks in proptest::collection::vec(any::<proptest::sample::Index>(), 1..9),
        gpu3 in any::<bool>(),
    ) {
        let inv = SimBackend::open("mixed-a100").unwrap().discover().unwrap();
        let text = format!(
            "flags: {{migStrategy: mixed}}\nsharing:\n  timeSlicing:\n    resources:\n    - {{name: nvidia.com/gpu, replicas: {n}, isolation: memory}}\n"
        );
        let cfg = config::parse(&text, "cfg.yaml", &Overrides::default()).unwrap();
        let plan = plan::build(&inv, &cfg).unwrap();
        let v = view(&plan, "nvidia.com/gpu");
        let gpu = if gpu3 { GPU3 } else { GPU2 };
        let mut chosen: Vec<String> = picks.iter().map(|i| rep(gpu, i.index(n as usize) as u32)).collect();
        chosen.sort();
        chosen.dedup();
        let k = chosen.len() as u64;
        let devices = validate(&v, &chosen).unwrap();
        let r = build_response(&cfg, &v.resource, &devices);
        prop_assert_eq!(r.cdi_devices.len(), 1);
        let name = r.cdi_devices[0].strip_prefix("gpu-slicer.io/gpu=").unwrap().to_string();
        prop_assert_eq!(&name, &format!("{gpu}-share-{k}"));
        let opts = crate::domain::cdi::GenerateOptions {
            kind: "gpu-slicer.io/gpu".into(),
            dev_root: None,
            shares: Some(crate::domain::cdi::shares::ShareOptions {
                plan: plan.clone().into(),
                mps_root: None,
                hook: crate::domain::cdi::shares::HookSettings {
                    path: "/bin/gpu-slicer".into(),
                    nvml_lib: None,
                    env: Vec::new(),
                },
            }),
            driver: None,
        };
        let spec = crate::domain::cdi::generate(&inv, &opts, &crate::domain::cdi::NoProbe).unwrap();
        let dev = spec.devices.iter().find(|d| d.name == name).unwrap();
        let memory = inv.gpus.iter().find(|g| g.uuid == gpu).unwrap().memory_bytes;
        let bytes: u64 = dev.container_edits.hooks[0]
            .args
            .windows(2)
            .find(|w| w[0] == "--bytes")
            .map(|w| w[1].parse().unwrap())
            .unwrap();
        prop_assert_eq!(bytes, k * (memory / u64::from(n)));
        prop_assert!(bytes <= memory);
        let granted: u64 = r.envs["GPU_SLICER_MEMORY_BYTES"].parse().unwrap();
        prop_assert_eq!(granted, bytes, "the env states what the hook enforces");
    }
}

/// One call, all or nothing: a bad second container request refuses the whole call; a
/// good call answers every container with the generation annotation and says what it holds,
/// CDI names without `<kind>=`.
#[test]
fn answer_is_all_or_nothing_and_names_what_it_holds() {
    const SHARED: &str = "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n";
    let store = crate::testkit::fixtures::store("mixed-a100", SHARED);
    let snapshot = store.current();
    let good = vec![rep(GPU2, 0), rep(GPU2, 1)];
    let err = answer(
        &snapshot,
        "nvidia.com/gpu",
        &[good.clone(), vec!["GPU-nope".to_string()]],
    )
    .unwrap_err();
    assert_eq!(err.rule(), "unknown-device");
    let err = answer(&snapshot, "example.com/gone", std::slice::from_ref(&good)).unwrap_err();
    assert!(matches!(err, AllocateError::NotServed { .. }), "{err}");
    assert_eq!(err.class(), ErrorClass::Unhealthy);
    let got = answer(
        &snapshot,
        "nvidia.com/gpu",
        &[good.clone(), vec![rep(GPU3, 0)]],
    )
    .unwrap();
    assert_eq!(got.containers.len(), 2);
    for c in &got.containers {
        assert_eq!(
            c.annotations.get(GENERATION_ANNOTATION),
            Some(&snapshot.generation.to_string())
        );
    }
    assert_eq!(
        got.containers[0].cdi_devices,
        vec![format!("{}={GPU2}", snapshot.config.cdi_kind)]
    );
    assert_eq!(got.held.ids, vec![rep(GPU2, 0), rep(GPU2, 1), rep(GPU3, 0)]);
    assert_eq!(
        got.held.cdi,
        [GPU2.to_string(), GPU3.to_string()].into_iter().collect()
    );
}
