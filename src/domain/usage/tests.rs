use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::*;
use crate::domain::inventory::Inventory;
use crate::domain::snapshot::Snapshot;
use crate::testkit::fixtures;

const UID: &str = "5f1c2d3e-1111-4222-8333-444455556666";
const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const GPU0: &str = "GPU-4a1f3c2e-8b7d-4e6f-9a0b-1c2d3e4f5000";
const GPU1: &str = "GPU-4a1f3c2e-8b7d-4e6f-9a0b-1c2d3e4f5001";
const SHARED: &str = "nvidia.com/gpu";

fn pod(uid: &str, cid: Option<&str>) -> Option<PodCgroup> {
    Some(PodCgroup {
        pod_uid: uid.into(),
        container_id: cid.map(Into::into),
    })
}

#[test]
fn systemd_v2_path_gives_pod_uid_with_dashes_and_container() {
    let text = format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope\n",
        UID.replace('-', "_")
    );
    assert_eq!(parse_cgroup(&text), pod(UID, Some(CID)));
    // Guaranteed pods have no QoS slice; CRI-O and Docker scopes name the runtime.
    let text = format!(
        "0::/kubepods.slice/kubepods-pod{}.slice/crio-{CID}.scope",
        UID.replace('-', "_")
    );
    assert_eq!(parse_cgroup(&text), pod(UID, Some(CID)));
    let text = format!(
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/docker-{CID}.scope",
        UID.replace('-', "_")
    );
    assert_eq!(parse_cgroup(&text), pod(UID, Some(CID)));
}

#[test]
fn cgroupfs_v1_multi_line_file_gives_pod_and_container() {
    let text = format!(
        "12:memory:/kubepods/burstable/pod{UID}/{CID}\n\
         11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n\
         1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n\
         0::/\n"
    );
    assert_eq!(parse_cgroup(&text), pod(UID, Some(CID)));
    // Guaranteed QoS: no class directory.
    assert_eq!(
        parse_cgroup(&format!("4:devices:/kubepods/pod{UID}/{CID}")),
        pod(UID, Some(CID))
    );
}

#[test]
fn a_line_with_the_container_wins_over_a_pod_only_line() {
    let text = format!(
        "3:cpuset:/\n2:pids:/kubepods/burstable/pod{UID}\n1:memory:/kubepods/burstable/pod{UID}/{CID}\n"
    );
    assert_eq!(parse_cgroup(&text), pod(UID, Some(CID)));
    assert_eq!(
        parse_cgroup(&format!("2:pids:/kubepods/burstable/pod{UID}\n")),
        pod(UID, None)
    );
}

#[test]
fn other_cgroups_are_not_pods() {
    for text in [
        "0::/user.slice/user-1000.slice/session-2.scope\n",
        "0::/system.slice/containerd.service\n",
        "0::/machine.slice/libpod-0123456789abcdef0123.scope\n",
        // A `pod…` directory not below kubepods.
        "0::/podman/pod1234abcd/0123456789abcdef\n",
        "",
        "garbage without colons",
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podnot_hex!.slice\n",
    ] {
        assert_eq!(parse_cgroup(text), None, "{text:?}");
    }
    // CRI-O's monitor process is in the pod but is not the container.
    let text = format!(
        "0::/kubepods.slice/kubepods-pod{}.slice/crio-conmon-{CID}.scope",
        UID.replace('-', "_")
    );
    assert_eq!(parse_cgroup(&text), pod(UID, None));
}

#[test]
fn checkpoint_reads_the_kubelet_format_old_and_new() {
    let text = format!(
        r#"{{"Data":{{"PodDeviceEntries":[
          {{"PodUID":"{UID}","ContainerName":"main","ResourceName":"{SHARED}",
            "DeviceIDs":{{"0":["{GPU0}::1"],"-1":["{GPU0}::0"]}},"AllocResp":"CgA="}},
          {{"PodUID":"a","ContainerName":"side","ResourceName":"x","DeviceIDs":["d2","d1","d1"],"AllocResp":null}}],
          "RegisteredDevices":{{"{SHARED}":["{GPU0}::0"]}}}},"Checksum":12345}}"#
    );
    let entries = parse_checkpoint(&text, "cp").expect("valid");
    assert_eq!(
        entries,
        vec![
            CheckpointEntry {
                pod_uid: UID.into(),
                container: "main".into(),
                resource: SHARED.into(),
                device_ids: vec![format!("{GPU0}::0"), format!("{GPU0}::1")],
            },
            CheckpointEntry {
                pod_uid: "a".into(),
                container: "side".into(),
                resource: "x".into(),
                device_ids: vec!["d1".into(), "d2".into()],
            },
        ]
    );
    // A fresh kubelet writes nil slices as null.
    let empty = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":0}"#;
    assert_eq!(parse_checkpoint(empty, "cp").expect("valid"), vec![]);
    let e = parse_checkpoint("{\"Data\":7}", "/dp/kubelet_internal_checkpoint")
        .expect_err("not a checkpoint");
    assert!(
        e.to_string()
            .contains("invalid kubelet checkpoint /dp/kubelet_internal_checkpoint"),
        "{e}"
    );
}

/// dgx-h100 with 4 time-sliced replicas per GPU.
fn views() -> BTreeMap<String, Arc<ResourceView>> {
    let (inventory, config, plan) = fixtures::planned(
        "dgx-h100",
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
    );
    Snapshot::serving(config, inventory, plan)
        .views
        .as_ref()
        .clone()
}

fn holder(pod: &str) -> Holder {
    Holder {
        namespace: "ml".into(),
        pod: pod.into(),
        container: "main".into(),
    }
}

fn systemd(uid: &str) -> Option<String> {
    Some(format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope\n",
        uid.replace('-', "_")
    ))
}

fn process(pid: u32, device: &str, mib: u64) -> ProcessSample {
    ProcessSample {
        pid,
        device: device.into(),
        memory_used: Some(mib << 20),
    }
}

const UID_B: &str = "00000000-0000-4000-8000-00000000000b";

/// Two pods each holding one replica of GPU 0; pod b also a replica on GPU 1.
struct World {
    views: BTreeMap<String, Arc<ResourceView>>,
    holders: BTreeMap<String, BTreeMap<String, Holder>>,
    checkpoint: Vec<CheckpointEntry>,
    cgroups: BTreeMap<u32, Option<String>>,
}

fn world() -> World {
    let views = views();
    let mut held = BTreeMap::new();
    held.insert(format!("{GPU0}::0"), holder("a"));
    held.insert(format!("{GPU0}::1"), holder("b"));
    held.insert(format!("{GPU1}::2"), holder("b"));
    let checkpoint = vec![
        CheckpointEntry {
            pod_uid: UID.into(),
            container: "main".into(),
            resource: SHARED.into(),
            device_ids: vec![format!("{GPU0}::0")],
        },
        CheckpointEntry {
            pod_uid: UID_B.into(),
            container: "main".into(),
            resource: SHARED.into(),
            device_ids: vec![format!("{GPU0}::1"), format!("{GPU1}::2")],
        },
    ];
    let cgroups = BTreeMap::from([
        (100, systemd(UID)),
        (200, systemd(UID_B)),
        (201, systemd(UID_B)),
        (300, Some("0::/system.slice/sshd.service\n".into())),
        (400, None),
        (500, systemd("99999999-0000-4000-8000-000000000000")),
    ]);
    World {
        views,
        holders: BTreeMap::from([(SHARED.to_string(), held)]),
        checkpoint,
        cgroups,
    }
}

fn key(pod: &str) -> ShareKey {
    ShareKey {
        resource: SHARED.into(),
        holder: holder(pod),
    }
}

#[test]
fn processes_go_to_their_own_share_and_the_rest_is_counted_by_reason() {
    let w = world();
    let sample = Sample {
        devices: vec![],
        processes: vec![
            process(100, GPU0, 1000),
            process(200, GPU0, 3000),
            process(201, GPU1, 500),
            process(300, GPU0, 7),
            process(400, GPU0, 7),
            process(500, GPU0, 7),
            // Pod a runs on GPU 1 where it holds nothing.
            process(100, GPU1, 7),
        ],
    };
    let a = attribute(&Inputs {
        sample: &sample,
        cgroups: &w.cgroups,
        checkpoint: &w.checkpoint,
        holders: &w.holders,
        views: &w.views,
    });
    let share_a = &a.shares[&key("a")];
    assert_eq!(share_a.memory_used(), 1000 << 20);
    assert_eq!(share_a.on[GPU0].pids, vec![100]);
    let share_b = &a.shares[&key("b")];
    assert_eq!(share_b.memory_used(), 3500 << 20);
    assert_eq!(share_b.on[GPU0].memory_used, 3000 << 20);
    assert_eq!(share_b.on[GPU1].memory_used, 500 << 20);
    // Granted: one replica of 80 GB in four is a quarter of the GPU's memory each.
    let quarter = w.views[SHARED].resource.devices[0].share.memory_bytes;
    assert!(quarter > 0);
    assert_eq!(share_a.memory_granted(), quarter);
    assert_eq!(share_b.memory_granted(), 2 * quarter);
    assert!(share_a.busy && share_b.busy);
    assert_eq!(
        a.unattributed,
        BTreeMap::from([
            (Unattributed::NoCgroup, 1),
            (Unattributed::NotAPod, 1),
            (Unattributed::NoCheckpointEntry, 2),
        ])
    );
}

#[test]
fn two_containers_of_one_pod_on_one_gpu_are_ambiguous_and_unknown_holders_are_counted() {
    let mut w = world();
    w.checkpoint.push(CheckpointEntry {
        pod_uid: UID.into(),
        container: "sidecar".into(),
        resource: SHARED.into(),
        device_ids: vec![format!("{GPU0}::3")],
    });
    // PodResources has not reported pod b yet.
    w.holders
        .get_mut(SHARED)
        .expect("shared")
        .retain(|_, h| h.pod != "b");
    let sample = Sample {
        devices: vec![],
        processes: vec![process(100, GPU0, 1), process(200, GPU0, 1)],
    };
    let a = attribute(&Inputs {
        sample: &sample,
        cgroups: &w.cgroups,
        checkpoint: &w.checkpoint,
        holders: &w.holders,
        views: &w.views,
    });
    assert_eq!(
        a.unattributed,
        BTreeMap::from([(Unattributed::Ambiguous, 1), (Unattributed::NoHolder, 1)])
    );
    // The held share with no process is still listed, idle-able.
    assert_eq!(a.shares[&key("a")].memory_used(), 0);
    assert!(!a.shares[&key("a")].busy);
}

#[test]
fn a_share_is_idle_only_after_the_window_without_processes() {
    let w = world();
    let window = Duration::from_secs(60);
    let t0 = Instant::now();
    let run = |procs: Vec<ProcessSample>| {
        let sample = Sample {
            devices: vec![],
            processes: procs,
        };
        attribute(&Inputs {
            sample: &sample,
            cgroups: &w.cgroups,
            checkpoint: &w.checkpoint,
            holders: &w.holders,
            views: &w.views,
        })
    };
    let mut tracker = IdleTracker::default();
    let busy_b = run(vec![process(200, GPU0, 10)]);
    assert!(tracker.observe(&busy_b.shares, t0, window).is_empty());
    let quiet = run(vec![]);
    let idle = tracker.observe(&quiet.shares, t0 + Duration::from_secs(30), window);
    assert!(idle.is_empty(), "held for 30 s only: {idle:?}");
    let idle = tracker.observe(&quiet.shares, t0 + Duration::from_secs(61), window);
    assert_eq!(idle, BTreeSet::from([key("a"), key("b")]));
    // b runs again: busy at once; a stays idle.
    let idle = tracker.observe(&busy_b.shares, t0 + Duration::from_secs(62), window);
    assert_eq!(idle, BTreeSet::from([key("a")]));
    // The report counts held devices: a holds one.
    let inventory = fixtures::inventory("dgx-h100");
    let allocated = BTreeMap::new();
    let r = report(&ReportInputs {
        generation: 1,
        sampled_at_ms: 0,
        interval: Duration::from_secs(1),
        idle_window: window,
        inventory: &inventory,
        views: &w.views,
        sample: &Sample::default(),
        attribution: &busy_b,
        idle: &idle,
        allocated: &allocated,
    });
    assert_eq!(r.idle_shares[SHARED], 1);
    let gpu0 = &r.gpus[0];
    assert_eq!(gpu0.shares.len(), 2);
    assert!(gpu0.shares.iter().any(|s| s.holder.pod == "a" && s.idle));
    assert!(gpu0.shares.iter().any(|s| s.holder.pod == "b" && !s.idle));
}

#[test]
fn a_whole_gpu_busy_by_utilisation_is_not_idle() {
    let (inventory, config, plan) = fixtures::planned("dgx-h100", "version: v1\n");
    let views = Snapshot::serving(config, inventory, plan)
        .views
        .as_ref()
        .clone();
    let holders = BTreeMap::from([(
        SHARED.to_string(),
        BTreeMap::from([(GPU0.to_string(), holder("a"))]),
    )]);
    let sample = Sample {
        devices: vec![DeviceSample {
            uuid: GPU0.into(),
            kind: DeviceKind::Gpu,
            utilization: Some(0.3),
            memory_used: 0,
            memory_total: 1,
        }],
        processes: vec![],
    };
    let cgroups = BTreeMap::new();
    let a = attribute(&Inputs {
        sample: &sample,
        cgroups: &cgroups,
        checkpoint: &[],
        holders: &holders,
        views: &views,
    });
    assert!(a.shares[&key("a")].busy);
}

#[test]
fn placeable_requests_count_per_gpu_not_across_gpus() {
    let views = views();
    let view = &views[SHARED];
    // Eight GPUs of four replicas: take every replica except 2 on GPU 0 and 2 on GPU 1.
    let mut allocated: BTreeSet<String> =
        view.resource.devices.iter().map(|d| d.id.clone()).collect();
    for id in [
        format!("{GPU0}::0"),
        format!("{GPU0}::1"),
        format!("{GPU1}::2"),
        format!("{GPU1}::3"),
    ] {
        allocated.remove(&id);
    }
    assert_eq!(
        placeable(view, &allocated),
        vec![(1, 4), (2, 2), (3, 0), (4, 0)]
    );
    assert_eq!(
        placeable(view, &BTreeSet::new()),
        vec![(1, 32), (2, 16), (3, 8), (4, 8)]
    );
}

proptest::proptest! {
    /// Hostile cgroup and checkpoint text never panics, and what is found is well-formed.
    #[test]
    fn parsers_take_any_text(text in "\\PC{0,400}", path in "(/[a-z0-9_.:-]{0,40}){0,6}") {
        if let Some(p) = parse_cgroup(&text).or_else(|| parse_cgroup(&format!("0::{path}"))) {
            proptest::prop_assert!(p.pod_uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'));
        }
        let _ = parse_checkpoint(&text, "cp");
    }

    /// Fewer free replicas never place more requests, and size 1 counts every free one.
    #[test]
    fn placeable_is_monotone(taken in proptest::collection::btree_set(0usize..32, 0..32)) {
        let views = views();
        let view = &views[SHARED];
        let ids: Vec<String> = view.resource.devices.iter().map(|d| d.id.clone()).collect();
        let allocated: BTreeSet<String> = taken.iter().map(|&i| ids[i].clone()).collect();
        let counts = placeable(view, &allocated);
        proptest::prop_assert_eq!(counts[0], (1, (32 - allocated.len()) as u64));
        for w in counts.windows(2) {
            proptest::prop_assert!(w[1].1 <= w[0].1);
        }
    }
}

#[test]
fn the_report_carries_the_topology_matrix_when_there_is_one() {
    fn inputs(inventory: &Inventory) -> UsageReport {
        report(&ReportInputs {
            generation: 1,
            sampled_at_ms: 0,
            interval: Duration::from_secs(1),
            idle_window: Duration::from_secs(1),
            inventory,
            views: &BTreeMap::new(),
            sample: &Sample::default(),
            attribution: &Attribution::default(),
            idle: &BTreeSet::new(),
            allocated: &BTreeMap::new(),
        })
    }
    let mut inventory = fixtures::inventory("dgx-h100");
    let plain = inputs(&inventory);
    assert_eq!(plain.topology, None);
    assert!(!serde_json::to_string(&plain).unwrap().contains("topology"));
    let layouts = crate::domain::topology::layouts::reference();
    let bridged = layouts.iter().find(|l| l.name == "bridged-pairs").unwrap();
    inventory.topology = Some(bridged.topology());
    let r = inputs(&inventory);
    let t = r.topology.as_ref().expect("topology");
    assert_eq!(t.matrix[0][2], "NV12");
    assert_eq!(t.gpus[7].numa_node, Some(1));
    let back: UsageReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);
}
