use super::*;
use crate::domain::inventory::Health;
use crate::state::Store;

fn health() -> Store {
    crate::testkit::fixtures::store(
        "dgx-h100",
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n",
    )
}

fn views(h: &Store) -> Vec<Arc<ResourceView>> {
    h.current().views.values().cloned().collect()
}

fn holder(pod: &str) -> Holder {
    Holder {
        namespace: "ns".into(),
        pod: pod.into(),
        container: "c".into(),
    }
}

#[test]
fn reconcile_finds_holders_and_every_kind_of_drift() {
    let h = health();
    let v = views(&h);
    let ids: Vec<String> = v[0].devices().map(|(d, _)| d.id.clone()).collect();
    h.set_health(&ids[1], Health::Unhealthy, "xid-79").unwrap();
    let v = views(&h);
    let report = KubeletReport {
        assigned: vec![
            (holder("a"), "nvidia.com/gpu".into(), vec![ids[0].clone()]),
            (holder("b"), "nvidia.com/gpu".into(), vec![ids[1].clone()]),
            (
                holder("c"),
                "nvidia.com/mig-1g.10gb".into(),
                vec!["gone".into()],
            ),
            (holder("d"), "example.com/fpga".into(), vec!["f0".into()]),
        ],
        // The kubelet lists all healthy devices but the last, plus one we never had.
        allocatable: vec![(
            "nvidia.com/gpu".into(),
            ids[..ids.len() - 1]
                .iter()
                .filter(|i| **i != ids[1])
                .cloned()
                .chain(["stale".to_string()])
                .collect(),
        )],
        ..KubeletReport::default()
    };
    let s = reconcile(&report, &v, 1, Front::DevicePlugin);
    assert!(s.up);
    assert_eq!(
        s.allocated_ids("nvidia.com/gpu"),
        [ids[0].clone(), ids[1].clone()].into()
    );
    assert_eq!(
        s.allocated_ids("nvidia.com/mig-1g.10gb"),
        ["gone".to_string()].into()
    );
    assert_eq!(s.holder("example.com/fpga", "f0"), Some(&holder("d")));
    assert!(s.allocated_ids("nvidia.com/none").is_empty());
    let expected = vec![
        Drift::AllocatedNotPlanned {
            resource: "nvidia.com/mig-1g.10gb".into(),
            device: "gone".into(),
            holder: holder("c"),
        },
        Drift::AllocatedUnhealthy {
            resource: "nvidia.com/gpu".into(),
            device: ids[1].clone(),
            holder: holder("b"),
        },
        Drift::KubeletExtra {
            resource: "nvidia.com/gpu".into(),
            device: "stale".into(),
        },
        Drift::KubeletMissing {
            resource: "nvidia.com/gpu".into(),
            device: ids[ids.len() - 1].clone(),
        },
    ];
    let mut expected = expected;
    expected.sort();
    assert_eq!(s.drift, expected);
}

#[test]
fn allocated_counts_only_devices_the_plan_has() {
    let h = health();
    let v = views(&h);
    let ids: Vec<String> = v[0].devices().map(|(d, _)| d.id.clone()).collect();
    let report = KubeletReport {
        assigned: vec![
            (holder("a"), "nvidia.com/gpu".into(), vec![ids[0].clone()]),
            // A stale ID the kubelet still lists (e.g. from an old layout).
            (
                holder("b"),
                "nvidia.com/gpu".into(),
                vec!["GPU-gone::0".into()],
            ),
            // Held from a resource a reload removed: kept for its holder.
            (
                holder("c"),
                "nvidia.com/mig-1g.10gb".into(),
                vec!["MIG-x".into()],
            ),
        ],
        allocatable: vec![("nvidia.com/gpu".into(), ids.clone())],
        ..KubeletReport::default()
    };
    let snapshot = reconcile(&report, &v, 1, Front::DevicePlugin);
    let metrics = Metrics::new();
    PublishedPods::default().publish(&metrics, &snapshot, &v);
    let text = metrics.encode_prometheus();
    assert!(
        text.contains("gpu_slicer_allocated_devices{resource=\"nvidia.com/gpu\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("gpu_slicer_allocated_devices{resource=\"nvidia.com/mig-1g.10gb\"} 1"),
        "{text}"
    );
}

#[test]
fn a_matching_report_has_no_drift() {
    let h = health();
    let v = views(&h);
    let ids: Vec<String> = v[0].devices().map(|(d, _)| d.id.clone()).collect();
    let report = KubeletReport {
        assigned: vec![(holder("a"), "nvidia.com/gpu".into(), ids[..3].to_vec())],
        allocatable: vec![("nvidia.com/gpu".into(), ids.clone())],
        ..KubeletReport::default()
    };
    let s = reconcile(&report, &v, 7, Front::DevicePlugin);
    assert_eq!(s.drift, vec![]);
    assert_eq!(s.rounds, 7);
    assert_eq!(s.allocated_ids("nvidia.com/gpu").len(), 3);
}

#[test]
fn dra_devices_map_to_the_plan_devices_of_the_same_physical_device() {
    let store = crate::testkit::fixtures::store("mixed-a100", "flags: {migStrategy: mixed}\n");
    let snapshot = store.current();
    let pool = DraPool {
        driver: "gpu-slicer.io".into(),
        pool: "node-a".into(),
    };
    let claimed = |driver: &str, pool: &str, device: &str| ClaimedDevice {
        holder: holder("p"),
        driver: driver.into(),
        pool: pool.into(),
        device: device.into(),
    };
    let got = dra_assigned(
        &[
            claimed("gpu-slicer.io", "node-a", "gpu-2"),
            claimed("gpu-slicer.io", "node-a", "gpu-0-mig-1g10gb-19-1"),
            claimed("gpu-slicer.io", "node-a", "gpu-7"),
            claimed("gpu-slicer.io", "node-b", "gpu-3"),
            claimed("other.example.com", "node-a", "gpu-3"),
        ],
        &pool,
        &snapshot,
    );
    let got: Vec<(String, Vec<String>)> = got.into_iter().map(|(_, r, ids)| (r, ids)).collect();
    assert_eq!(
        got,
        [
            (
                "nvidia.com/gpu".to_string(),
                vec!["GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02".to_string()]
            ),
            (
                "nvidia.com/mig-1g.10gb".to_string(),
                vec!["MIG-1b2c3d4e-0000-4a00-8000-000000000008".to_string()]
            ),
            // Not on this node (any more): kept under the driver's name, never dropped.
            ("gpu-slicer.io".to_string(), vec!["gpu-7".to_string()]),
        ]
    );
    // Under the DRA front-end the kubelet's (device-plugin) allocatable list is not drift.
    let report = KubeletReport {
        assigned: vec![(
            holder("p"),
            "nvidia.com/gpu".into(),
            vec!["GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02".into()],
        )],
        ..KubeletReport::default()
    };
    let v = views(&store);
    assert!(reconcile(&report, &v, 1, Front::Dra).drift.is_empty());
    assert!(
        !reconcile(&report, &v, 1, Front::DevicePlugin)
            .drift
            .is_empty()
    );
}

#[test]
fn reachability_reports_only_changes() {
    let mut r = Reachability::default();
    assert!(r.record(false), "first failure is logged");
    assert!(!r.record(false), "a persisting failure is not");
    assert!(!r.record(false));
    assert!(r.record(true), "recovery is logged");
    assert!(!r.record(true));
    assert!(r.record(false));
}
