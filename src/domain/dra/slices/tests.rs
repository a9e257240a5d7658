use std::collections::BTreeMap;

use super::*;
use crate::domain::dra::model::{Attribute, is_dns_label};
use crate::testkit::fixtures;

const DRIVER: &str = "gpu-slicer.io";

fn target(generation: i64) -> SliceTarget<'static> {
    SliceTarget {
        driver: DRIVER,
        node_name: "node-a",
        node_uid: Some("0f2c"),
        generation,
    }
}

#[test]
fn mixed_a100_publishes_mig_devices_and_whole_gpus_with_stable_names() {
    let (inv, _, plan) =
        fixtures::planned("mixed-a100", "version: v1\nflags:\n  migStrategy: mixed\n");
    let devs = node_devices(&inv, &plan, &BTreeMap::new());
    let names: Vec<&str> = devs.devices.keys().map(String::as_str).collect();
    // GPU 0: seven 1g.10gb (GI profile id 19, placements 0..6); GPU 1: 3g.40gb at 4 and so on.
    assert!(names.contains(&"gpu-0-mig-1g10gb-19-0"), "{names:?}");
    assert!(names.contains(&"gpu-0-mig-1g10gb-19-6"), "{names:?}");
    assert!(names.contains(&"gpu-2"), "{names:?}");
    assert!(
        !names.contains(&"gpu-0"),
        "a MIG-mode GPU is not a whole device: {names:?}"
    );
    assert_eq!(names.len(), 7 + 4 + 2);
    assert!(names.iter().all(|n| is_dns_label(n)), "{names:?}");
    // Same inputs, same names: nothing depends on order of discovery.
    assert_eq!(node_devices(&inv, &plan, &BTreeMap::new()), devs);

    let mig = devs.get("gpu-0-mig-1g10gb-19-0").unwrap();
    let a = &mig.device.attributes;
    assert_eq!(a["type"], Attribute::String("mig".into()));
    assert_eq!(a["profile"], Attribute::String("1g.10gb".into()));
    assert_eq!(a["parentUUID"], Attribute::String(inv.gpus[0].uuid.clone()));
    assert_eq!(a["driverVersion"], Attribute::Version("570.124.6".into()));
    assert_eq!(
        a["cudaComputeCapability"],
        Attribute::Version("8.0.0".into())
    );
    assert_eq!(a["architecture"], Attribute::String("Ampere".into()));
    assert_eq!(mig.device.capacity["computeSlices"].value, "1");
    // A100-80GB 1g.10gb per `nvidia-smi mig -lgip`: 14 SMs, one copy engine, no media engines.
    let c = &mig.device.capacity;
    assert_eq!(c["multiprocessors"].value, "14");
    assert_eq!(c["copyEngines"].value, "1");
    for engine in ["decoders", "encoders", "jpegEngines", "ofaEngines"] {
        assert_eq!(c[engine].value, "0", "{engine}");
    }
    let gpu = devs.get("gpu-2").unwrap();
    assert_eq!(
        gpu.device.attributes[ATTR_PCI_BUS_ID],
        Attribute::String("0000:47:00.0".into())
    );
    assert_eq!(gpu.device.capacity["memory"].value, "80Gi");
    assert_eq!(gpu.device.attributes["index"], Attribute::Int(2));
}

#[test]
fn unhealthy_devices_stay_listed_with_taints_and_recover_without_them() {
    let (inv, _, plan) = fixtures::planned("dgx-h100", "version: v1\n");
    let mut health = BTreeMap::new();
    health.insert(inv.gpus[1].uuid.clone(), "xid-79".to_string());
    health.insert(inv.gpus[2].uuid.clone(), "gpu-lost".to_string());
    let devs = node_devices(&inv, &plan, &health);
    assert_eq!(devs.devices.len(), inv.gpus.len());
    let t = &devs.get("gpu-1").unwrap().device.taints;
    assert_eq!(
        (t[0].key.as_str(), t[0].value.as_str(), t[0].effect.as_str()),
        (TAINT_XID, "79", "NoSchedule")
    );
    assert_eq!(
        devs.get("gpu-2").unwrap().device.taints[0].key,
        TAINT_GPU_LOST
    );
    assert!(devs.get("gpu-1").unwrap().unhealthy.is_some());
    let healed = node_devices(&inv, &plan, &BTreeMap::new());
    assert!(
        healed
            .devices
            .values()
            .all(|d| d.device.taints.is_empty() && d.unhealthy.is_none())
    );
    assert_eq!(
        healed.devices.keys().collect::<Vec<_>>(),
        devs.devices.keys().collect::<Vec<_>>()
    );
}

#[test]
fn a_sick_parent_taints_its_mig_devices() {
    let (inv, _, plan) =
        fixtures::planned("mixed-a100", "version: v1\nflags:\n  migStrategy: mixed\n");
    let mut health = BTreeMap::new();
    health.insert(inv.gpus[0].uuid.clone(), "xid-48".to_string());
    let devs = node_devices(&inv, &plan, &health);
    let tainted: Vec<&str> = devs
        .devices
        .values()
        .filter(|d| !d.device.taints.is_empty())
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(tainted.len(), 7, "{tainted:?}");
    assert!(tainted.iter().all(|n| n.starts_with("gpu-0-mig-")));
}

fn many(n: usize, tainted: bool) -> NodeDevices {
    let mut out = NodeDevices::default();
    for i in 0..n {
        let name = format!("gpu-{i:03}");
        out.devices.insert(
            name.clone(),
            NodeDevice {
                name: name.clone(),
                kind: DeviceType::Gpu,
                uuid: format!("GPU-{i}"),
                gpu_uuid: format!("GPU-{i}"),
                memory_bytes: 80 << 30,
                unhealthy: None,
                device: Device {
                    name,
                    attributes: BTreeMap::new(),
                    capacity: BTreeMap::new(),
                    taints: if tainted && i == 0 {
                        vec![taint("xid-79")]
                    } else {
                        vec![]
                    },
                    allow_multiple_allocations: None,
                    consumes_counters: Vec::new(),
                },
                shared: None,
                placement: None,
            },
        );
    }
    out
}

#[test]
fn pools_split_at_128_devices_and_at_64_once_any_device_is_tainted() {
    let slices = build(&target(3), &many(300, false));
    assert_eq!(
        slices
            .iter()
            .map(|s| s.spec.devices.len())
            .collect::<Vec<_>>(),
        [128, 128, 44]
    );
    assert!(
        slices
            .iter()
            .all(|s| s.spec.pool.resource_slice_count == 3 && s.spec.pool.generation == 3)
    );
    let slices = build(&target(4), &many(130, true));
    assert_eq!(
        slices
            .iter()
            .map(|s| s.spec.devices.len())
            .collect::<Vec<_>>(),
        [64, 64, 2]
    );
    let names: Vec<&str> = slices.iter().map(|s| s.metadata.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "node-a-gpu-slicer.io-0",
            "node-a-gpu-slicer.io-1",
            "node-a-gpu-slicer.io-2"
        ]
    );
    let owner = &slices[0].metadata.owner_references[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Node", "node-a", "0f2c")
    );
    // Nothing to offer is still said: one empty slice.
    let empty = build(&target(1), &NodeDevices::default());
    assert_eq!(empty.len(), 1);
    assert!(empty[0].spec.devices.is_empty());
}

#[test]
fn taints_from_reasons() {
    assert_eq!(taint("xid-79").value, "79");
    assert_eq!(taint("GPU-1: xid-48").key, TAINT_XID);
    assert_eq!(taint("gpu-lost").key, TAINT_GPU_LOST);
    let t = taint("mig-layout-applying");
    assert_eq!(
        (t.key.as_str(), t.value.as_str()),
        (TAINT_UNHEALTHY, "mig-layout-applying")
    );
    assert_eq!(
        taint("unhealthy at discovery").value,
        "unhealthy-at-discovery"
    );
    assert_eq!(profile_label("1g.10gb+me"), "1g10gb-me");
}

/// `dgx-h100` with MIG mode on every GPU and every GPU dynamic: 8 counter sets, 8 × 26
/// devices.
fn dynamic_dgx() -> NodeDevices {
    let (mut inv, _, _) = fixtures::planned("dgx-h100", "version: v1\n");
    for g in &mut inv.gpus {
        g.mig_mode.current = true;
    }
    let plan = crate::domain::plan::build(&inv, &fixtures::config("version: v1\n")).unwrap();
    node_devices_with(
        &inv,
        &plan,
        &BTreeMap::new(),
        Some(&crate::domain::config::DeviceSelector::All),
    )
}

fn check_limits(slices: &[ResourceSlice]) {
    for s in slices {
        let counters: usize = s
            .spec
            .shared_counters
            .iter()
            .map(|c| c.counters.len())
            .sum();
        assert!(
            s.spec.shared_counters.len() <= MAX_COUNTER_SETS,
            "{}",
            s.metadata.name
        );
        assert!(counters <= MAX_COUNTERS, "{}: {counters}", s.metadata.name);
        let counted = s
            .spec
            .devices
            .iter()
            .any(|d| !d.consumes_counters.is_empty());
        let limit = if counted {
            MAX_DEVICES_WITH_TAINTS
        } else {
            MAX_DEVICES
        };
        assert!(s.spec.devices.len() <= limit, "{}", s.metadata.name);
        for d in &s.spec.devices {
            assert!(
                d.consumes_counters.len() <= 2 && is_dns_label(&d.name),
                "{}",
                d.name
            );
            assert!(d.attributes.len() + d.capacity.len() <= 32, "{}", d.name);
        }
        for set in &s.spec.shared_counters {
            assert!(is_dns_label(&set.name) && set.counters.keys().all(|k| is_dns_label(k)));
        }
        assert_eq!(s.spec.pool.resource_slice_count, slices.len() as i64);
    }
}

#[test]
fn every_placement_of_8_h100_is_published_in_both_layouts_within_the_limits() {
    let devs = dynamic_dgx();
    assert!(devs.warnings.is_empty(), "{:?}", devs.warnings);
    assert_eq!(devs.counter_sets.len(), 8);
    // Per GPU: the whole GPU and 7 + 7 + 4 + 3 + 2 + 1 + 1 placements.
    assert_eq!(devs.devices.len(), 8 * 26);
    let whole = devs.get("gpu-5").unwrap();
    assert_eq!(whole.placement.as_ref().unwrap().profile, "7g.80gb");
    assert_eq!(whole.device.consumes_counters[0].counters.len(), 10);
    let one = devs.get("gpu-5-mig-1g10gb-19-3").unwrap();
    assert!(one.uuid.is_empty() && !one.device.attributes.contains_key("uuid"));
    assert_eq!(one.placement.as_ref().unwrap().start, 3);

    let split = build_for(&target(1), &devs, SliceFormat::Split);
    check_limits(&split);
    // Devices and counters never share a slice from 1.35 on.
    assert!(
        split
            .iter()
            .all(|s| s.spec.devices.is_empty() || s.spec.shared_counters.is_empty())
    );
    assert_eq!(
        split.iter().map(|s| s.spec.devices.len()).sum::<usize>(),
        8 * 26
    );
    assert_eq!(
        split
            .iter()
            .map(|s| s.spec.shared_counters.len())
            .sum::<usize>(),
        8
    );

    let combined = build_for(&target(1), &devs, SliceFormat::Combined);
    check_limits(&combined);
    // 1.34: a device's counter set is in its own slice; 10 counters a GPU, 32 a slice.
    for s in &combined {
        for d in &s.spec.devices {
            let set = &d.consumes_counters[0].counter_set;
            assert!(
                s.spec.shared_counters.iter().any(|c| &c.name == set),
                "{}",
                d.name
            );
        }
    }
    assert_eq!(combined.len(), 4, "two GPUs a slice");
    assert_eq!(SliceFormat::for_server("1", "34"), SliceFormat::Combined);
    assert_eq!(SliceFormat::for_server("1", "35+"), SliceFormat::Split);
}

#[test]
fn a_mixed_node_publishes_exclusive_shared_static_and_dynamic_gpus_together() {
    let cfg = "version: v1\nflags:\n  migStrategy: mixed\n  dra: {dynamicMig: [0]}\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.mps, replicas: 2, devices: [2], isolation: memory+mps}\n";
    let (inv, config, plan) = fixtures::planned("mixed-a100", cfg);
    let devs = node_devices_with(
        &inv,
        &plan,
        &BTreeMap::new(),
        config.dra.dynamic_mig.as_ref(),
    );
    // GPU 0 dynamic (whole + placements), GPU 1 static MIG, GPU 2 shared, GPU 3 exclusive.
    assert!(devs.get("gpu-0").unwrap().placement.is_some());
    assert!(devs.get("gpu-0-mig-7g80gb-0-0").is_some());
    assert!(
        devs.get("gpu-1-mig-3g40gb-9-4")
            .unwrap()
            .placement
            .is_none()
    );
    assert!(devs.get("gpu-2").unwrap().shared.is_some());
    let gpu3 = devs.get("gpu-3").unwrap();
    assert!(gpu3.shared.is_none() && gpu3.device.allow_multiple_allocations.is_none());
    assert_eq!(devs.counter_sets.len(), 1);
    // A dynamic GPU whose MIG mode is off is published as the plan has it, with a warning.
    let devs = node_devices_with(
        &inv,
        &plan,
        &BTreeMap::new(),
        Some(&crate::domain::config::DeviceSelector::List(vec![
            crate::domain::config::DeviceRef::Index(3),
        ])),
    );
    assert!(devs.counter_sets.is_empty());
    assert!(devs.warnings[0].contains("GPU 3") && devs.warnings[0].contains("MIG mode is off"));
    assert!(devs.get("gpu-3").unwrap().placement.is_none());
}
