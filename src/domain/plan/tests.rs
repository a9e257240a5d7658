//! Planner tests: the worked examples, error cases, and property tests.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::domain::config::{self, Overrides};
use crate::domain::inventory::Backend;
use crate::platform::sim::SimBackend;

fn inv(profile: &str) -> Inventory {
    SimBackend::open(profile).unwrap().discover().unwrap()
}

fn cfg(text: &str) -> Config {
    config::parse(text, "cfg.yaml", &Overrides::default()).unwrap()
}

fn counts(plan: &Plan) -> Vec<(String, usize)> {
    plan.resources
        .iter()
        .map(|r| (r.name.clone(), r.devices.len()))
        .collect()
}

#[test]
fn mixed_a100_mixed_strategy() {
    let plan = build(&inv("mixed-a100"), &cfg("flags: {migStrategy: mixed}")).unwrap();
    assert_eq!(
        counts(&plan),
        vec![
            ("nvidia.com/gpu".into(), 2),
            ("nvidia.com/mig-1g.10gb".into(), 9),
            ("nvidia.com/mig-2g.20gb".into(), 1),
            ("nvidia.com/mig-3g.40gb".into(), 1),
        ]
    );
    let mig = plan.resource("nvidia.com/mig-3g.40gb").unwrap();
    assert_eq!(mig.devices[0].share.compute_percent, 42);
    assert_eq!(mig.devices[0].share.memory_bytes, 40 << 30);
    assert_eq!(mig.devices[0].numa_node, Some(0));
}

#[test]
fn time_slicing_four_replicas() {
    let plan = build(
        &inv("mixed-a100"),
        &cfg("flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n"),
    )
    .unwrap();
    let gpu = plan.resource("nvidia.com/gpu").unwrap();
    assert_eq!(gpu.devices.len(), 8);
    let ids: Vec<&str> = gpu.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids[0], "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02::0");
    assert_eq!(ids[3], "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02::3");
    assert_eq!(gpu.devices[0].share.compute_percent, 25);
    assert_eq!(gpu.devices[0].share.memory_bytes, (80u64 << 30) / 4);
}

#[test]
fn none_strategy_exposes_mig_gpus_whole() {
    let plan = build(&inv("mixed-a100"), &Config::default()).unwrap();
    assert_eq!(counts(&plan), vec![("nvidia.com/gpu".into(), 4)]);
}

#[test]
fn single_strategy_rejects_mixed_layouts() {
    let err = build(&inv("mixed-a100"), &cfg("flags: {migStrategy: single}")).unwrap_err();
    assert!(
        matches!(err, PlanError::SingleMixedModes { index: 2, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("cfg.yaml"));
    // Without MIG anywhere, single behaves like none.
    let plan = build(&inv("dgx-h100"), &cfg("flags: {migStrategy: single}")).unwrap();
    assert_eq!(counts(&plan), vec![("nvidia.com/gpu".into(), 8)]);
}

#[test]
fn single_strategy_uniform_mig() {
    let mut inventory = inv("mixed-a100");
    inventory.gpus.truncate(1);
    let plan = build(&inventory, &cfg("flags: {migStrategy: single}")).unwrap();
    assert_eq!(counts(&plan), vec![("nvidia.com/gpu".into(), 7)]);
    let mut inventory = inv("mixed-a100");
    inventory.gpus.truncate(2);
    let err = build(&inventory, &cfg("flags: {migStrategy: single}")).unwrap_err();
    assert!(
        err.to_string().contains("1g.10gb, 2g.20gb, 3g.40gb"),
        "{err}"
    );
}

#[test]
fn per_gpu_sharing_with_rename() {
    let plan = build(
        &inv("mixed-a100"),
        &cfg("flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, rename: gpu.shared, devices: [3], replicas: 4}\n"),
    )
    .unwrap();
    let whole = plan.resource("nvidia.com/gpu").unwrap();
    assert_eq!(whole.devices.len(), 1);
    assert_eq!(whole.devices[0].physical.gpu_index, 2);
    let shared = plan.resource("nvidia.com/gpu.shared").unwrap();
    assert_eq!(shared.devices.len(), 4);
    assert!(shared.devices.iter().all(|d| d.physical.gpu_index == 3));
}

#[test]
fn partial_sharing_without_rename_is_rejected() {
    let err = build(
        &inv("mixed-a100"),
        &cfg("flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, devices: [3], replicas: 4}\n"),
    )
    .unwrap_err();
    assert!(matches!(err, PlanError::MixedResource { .. }), "{err}");
}

#[test]
fn a_device_reference_this_node_lacks_is_skipped_and_the_rest_kept() {
    let planned = build_reporting(
        &inv("dgx-h100"),
        &cfg("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, rename: gpu.shared, devices: [0, 9], replicas: 2}\n"),
    )
    .unwrap();
    assert_eq!(
        planned.skipped,
        vec![Skipped {
            field: "sharing.timeSlicing.resources[0].devices[1]".into(),
            value: "9".into(),
            reason: SkipReason::DeviceNotOnNode,
            node_has: "8 devices of nvidia.com/gpu".into(),
        }]
    );
    let shared = planned.plan.resource("nvidia.com/gpu.shared").unwrap();
    assert_eq!(shared.devices.len(), 2);
    assert!(shared.devices.iter().all(|d| d.physical.gpu_index == 0));
}

#[test]
fn a_sharing_entry_for_a_resource_this_node_lacks_is_skipped() {
    // One ConfigMap for a mixed cluster: MIG sharing on a node without MIG.
    let text = "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n    - {name: gpu, replicas: 3}\n";
    let planned = build_reporting(&inv("dgx-h100"), &cfg(text)).unwrap();
    assert_eq!(
        planned.skipped,
        vec![Skipped {
            field: "sharing.timeSlicing.resources[0].name".into(),
            value: "nvidia.com/mig-1g.10gb".into(),
            reason: SkipReason::ResourceNotOnNode,
            node_has: "nvidia.com/gpu".into(),
        }]
    );
    // The entry that does apply still does.
    assert_eq!(
        counts(&planned.plan),
        vec![("nvidia.com/gpu".into(), 8 * 3)]
    );
    assert_eq!(build(&inv("dgx-h100"), &cfg(text)).unwrap(), planned.plan);
}

#[test]
fn a_selector_matching_nothing_here_skips_the_entry() {
    let text = "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, rename: gpu.big, devices: [\"GPU-not-here\", 12], replicas: 2}\n";
    let planned = build_reporting(&inv("dgx-h100"), &cfg(text)).unwrap();
    let reasons: Vec<(&str, &str, SkipReason)> = planned
        .skipped
        .iter()
        .map(|s| (s.field.as_str(), s.value.as_str(), s.reason))
        .collect();
    assert_eq!(
        reasons,
        vec![
            (
                "sharing.timeSlicing.resources[0].devices[0]",
                "GPU-not-here",
                SkipReason::DeviceNotOnNode
            ),
            (
                "sharing.timeSlicing.resources[0].devices[1]",
                "12",
                SkipReason::DeviceNotOnNode
            ),
            (
                "sharing.timeSlicing.resources[0].devices",
                "[GPU-not-here, 12]",
                SkipReason::NoMatchingDevices
            ),
        ]
    );
    // The node serves its GPUs whole, as if the entry were absent.
    assert_eq!(counts(&planned.plan), vec![("nvidia.com/gpu".into(), 8)]);
}

#[test]
fn malformed_entries_stay_errors() {
    for bad in [
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/mig-1g.10gb, replicas: 1}\n",
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: \"Not A Name\", replicas: 2}\n",
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, devices: [\"x:y:z\"], replicas: 2}\n",
    ] {
        assert!(
            config::parse(bad, "cfg.yaml", &Overrides::default()).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn mig_replicas_and_mig_index_selection() {
    let plan = build(
        &inv("mixed-a100"),
        &cfg("flags: {migStrategy: mixed}\nsharing:\n  mps:\n    resources:\n    - {name: mig-3g.40gb, replicas: 3}\n"),
    )
    .unwrap();
    let r = plan.resource("nvidia.com/mig-3g.40gb").unwrap();
    assert_eq!(r.devices.len(), 3);
    assert_eq!(r.devices[0].share.compute_percent, 14);
    assert!(r.sharing.as_ref().unwrap().fail_requests_greater_than_one);
    let plan = build(
        &inv("mixed-a100"),
        &cfg("flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: mig-1g.10gb, rename: mig-1g.10gb.shared, devices: [\"0:1\"], replicas: 2}\n"),
    )
    .unwrap();
    let r = plan.resource("nvidia.com/mig-1g.10gb.shared").unwrap();
    assert_eq!(r.devices[0].physical.index_name(), "0:1");
    assert_eq!(
        plan.resource("nvidia.com/mig-1g.10gb")
            .unwrap()
            .devices
            .len(),
        8
    );
}

#[test]
fn oversubscribed_memory_refused() {
    let err = build(
        &inv("dgx-h100"),
        &cfg("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4, memory: 30Gi}\n"),
    )
    .unwrap_err();
    assert!(matches!(err, PlanError::OverSubscribed { .. }), "{err}");
}

#[test]
fn mps_replica_limit() {
    let err = build(
        &inv("dgx-h100"),
        &cfg("sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 49}\n"),
    )
    .unwrap_err();
    assert!(err.to_string().contains("at most 48"), "{err}");
}

#[test]
fn diff_names_only_what_changed() {
    let inv = inv("mixed-a100");
    let four = "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n";
    let old = build(&inv, &cfg(four)).unwrap();
    assert!(diff(&old, &old).is_empty());
    let eight = build(&inv, &cfg(&four.replace("replicas: 4", "replicas: 8"))).unwrap();
    let d = diff(&old, &eight);
    assert_eq!(d.changed, vec!["nvidia.com/gpu".to_string()]);
    assert!(d.added.is_empty() && d.removed.is_empty());
    assert_eq!(d.unchanged.len(), 3, "{d:?}");
    // Renaming moves the devices to a new resource: one removed, one added.
    let renamed = build(
        &inv,
        &cfg(&four.replace("replicas: 4}", "replicas: 4, rename: gpu.shared}")),
    )
    .unwrap();
    let d = diff(&old, &renamed);
    assert_eq!(d.added, vec!["nvidia.com/gpu.shared".to_string()]);
    assert_eq!(d.removed, vec!["nvidia.com/gpu".to_string()]);
}

#[test]
fn memory_isolation_on_mig_refused_naming_the_field() {
    let err = build(
        &inv("mixed-a100"),
        &cfg("flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: mig-1g.10gb, replicas: 2, isolation: memory}\n"),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("cfg.yaml") && msg.contains("sharing.timeSlicing.resources[0].isolation"),
        "{msg}"
    );
    assert!(msg.contains("MIG"), "{msg}");
    // MPS inside MIG is fine.
    build(
        &inv("mixed-a100"),
        &cfg("flags: {migStrategy: mixed}\nsharing:\n  mps:\n    resources:\n    - {name: mig-1g.10gb, replicas: 2}\n"),
    )
    .unwrap();
}

#[test]
fn oversubscribed_per_replica_memory_names_file_and_field() {
    let err = build(
        &inv("dgx-h100"),
        &cfg("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4, isolation: memory, memory: 21Gi}\n"),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("cfg.yaml") && msg.contains("sharing.timeSlicing.resources[0].memory"),
        "{msg}"
    );
    // In the units the config writes, with what would fit (an H100 holds 81559 MiB).
    assert!(
        msg.contains("`21Gi`: 4 replicas × 21Gi = 84Gi exceeds the 81559Mi of GPU-")
            && msg.contains("; at most 20389Mi per replica fits"),
        "{msg}"
    );
}

fn arb_config() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just("none"), Just("mixed")],
        proptest::option::of((
            2u32..9,
            proptest::collection::btree_set(0u32..4, 0..3),
            any::<bool>(),
        )),
        proptest::option::of(2u32..5),
    )
        .prop_map(|(strategy, gpu_share, mig_share)| {
            let mut text = format!("flags: {{migStrategy: {strategy}}}\n");
            let mut entries = Vec::new();
            if let Some((replicas, devs, rename)) = gpu_share {
                let devices = if devs.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", devices: [{}]",
                        devs.iter()
                            .map(|d| d.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                let rename = if rename || !devs.is_empty() {
                    ", rename: gpu.shared"
                } else {
                    ""
                };
                entries.push(format!(
                    "    - {{name: gpu, replicas: {replicas}{devices}{rename}}}\n"
                ));
            }
            if let (Some(r), "mixed") = (mig_share, strategy) {
                entries.push(format!("    - {{name: mig-1g.10gb, replicas: {r}}}\n"));
            }
            if !entries.is_empty() {
                text.push_str("sharing:\n  timeSlicing:\n    resources:\n");
                for e in entries {
                    text.push_str(&e);
                }
            }
            text
        })
}

proptest! {
    #[test]
    fn plan_invariants(text in arb_config(), profile in prop_oneof![Just("mixed-a100"), Just("dgx-h100")]) {
        let inventory = inv(profile);
        let config = cfg(&text);
        let Ok(plan) = build(&inventory, &config) else { return Ok(()); };
        // Deterministic.
        prop_assert_eq!(&plan, &build(&inventory, &config).unwrap());
        // Every device ID unique across the node, and ≤ 63 characters.
        let mut ids = BTreeSet::new();
        for (_, d) in plan.devices() {
            prop_assert!(ids.insert(d.id.clone()), "duplicate id {}", d.id);
            prop_assert!(d.id.len() <= 63);
        }
        // No physical device backs two resources.
        let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
        for (r, d) in plan.devices() {
            let prev = owner.insert(&d.physical.uuid, &r.name);
            prop_assert!(prev.is_none() || prev == Some(r.name.as_str()));
        }
        // Replicas of a physical device sum to at most the whole device, and their count is N.
        let mut per_phys: BTreeMap<&str, (u64, u32, u32)> = BTreeMap::new();
        for (_, d) in plan.devices() {
            let e = per_phys.entry(&d.physical.uuid).or_default();
            e.0 += d.share.memory_bytes;
            e.1 += d.share.compute_percent;
            e.2 += 1;
            if let Some(rep) = d.replica {
                prop_assert_eq!(d.id.clone(), format!("{}::{}", d.physical.uuid, rep.index));
            }
        }
        for (uuid, (mem, compute, count)) in per_phys {
            let whole = inventory.gpu(uuid).map(|g| g.memory_bytes)
                .or_else(|| inventory.mig(uuid).map(|(_, m)| m.memory_bytes)).unwrap();
            // Even split: the shares add up to the whole device, less rounding.
            prop_assert!(mem <= whole);
            prop_assert!(whole - mem < u64::from(count), "{} of {} bytes handed out", mem, whole);
            prop_assert!(compute <= 100);
        }
    }
}
