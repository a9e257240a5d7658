//! Property tests of the pure reload transition (`domain::transition::next`) and the store's
//! commit: whatever sequence of configs the operator applies and whatever containers hold,
//! every held device stays in the spec until released, resources that did not change keep
//! their view (their ListAndWatch streams get no frame), and the diff applied to the old
//! plan gives the new one.

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;

use crate::domain::allocate;
use crate::domain::cdi::shares::HookSettings;
use crate::domain::snapshot::Snapshot;
use crate::domain::transition::{self, Host};
use crate::state::Store;
use crate::testkit::fixtures;

/// Configs an operator might flip between on the `mixed-a100` node.
const CONFIGS: &[&str] = &[
    "version: v1\nflags: {migStrategy: mixed}\n",
    "version: v1\nflags: {migStrategy: none}\n",
    "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
    "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n",
    "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.shared, devices: [3], replicas: 4, isolation: memory}\n",
    "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n",
];

fn host() -> Host {
    Host {
        hook: Some(HookSettings {
            path: "/opt/gpu-slicer/bin/gpu-slicer".into(),
            nvml_lib: None,
            env: Vec::new(),
        }),
        ..Host::default()
    }
}

/// One step: apply config `config`, then (before the next step) hold the devices picked by
/// `picks` (indices into the plan's devices) or release everything.
#[derive(Debug, Clone)]
struct Step {
    config: usize,
    picks: Vec<usize>,
    release: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        0..CONFIGS.len(),
        proptest::collection::vec(0usize..200, 0..4),
        proptest::bool::weighted(0.2),
    )
        .prop_map(|(config, picks, release)| Step {
            config,
            picks,
            release,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn held_devices_stay_unchanged_views_stay_and_diffs_add_up(steps in proptest::collection::vec(step(), 1..6)) {
        let inventory = Arc::new(fixtures::inventory("mixed-a100"));
        let store = Store::new(Snapshot::default());
        for s in &steps {
            let config = Arc::new(fixtures::config(CONFIGS[s.config]));
            let before = store.current();
            let nodes = Arc::new(transition::device_nodes(&inventory, false).expect("nodes"));
            let next = transition::next(&before, config, inventory.clone(), nodes, &host())
                .expect("every config fits the node");
            // The diff applied to the old plan gives the new plan's resources.
            let old: BTreeSet<String> = before.plan.resources.iter().map(|r| r.name.clone()).collect();
            let new: BTreeSet<String> = next.state.plan.resources.iter().map(|r| r.name.clone()).collect();
            let mut applied = old.clone();
            for r in &next.diff.removed { prop_assert!(applied.remove(r), "removed {r} was not served"); }
            for r in &next.diff.added { prop_assert!(applied.insert(r.clone()), "added {r} was served"); }
            prop_assert_eq!(&applied, &new);
            let kept: BTreeSet<String> = next.diff.changed.iter().chain(&next.diff.unchanged).cloned().collect();
            prop_assert_eq!(kept, old.intersection(&new).cloned().collect::<BTreeSet<_>>());
            // Every held device is in the spec written for the new state.
            let spec = next.state.spec.clone().expect("a node with GPUs has a spec");
            let names: BTreeSet<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
            for held in before.held.cdi_names() {
                prop_assert!(names.contains(held.as_str()), "held {held} lost");
            }
            let committed = store.commit(next.state.clone());
            // Unchanged resources keep their view: no new ListAndWatch frame.
            for r in &next.diff.unchanged {
                prop_assert!(Arc::ptr_eq(&before.views[r], &committed.views[r]), "{r} got a new view");
            }
            for r in next.diff.changed.iter().chain(&next.diff.added) {
                prop_assert!(committed.views.contains_key(r));
            }
            // Containers take devices of the new plan (as Allocate records them)...
            let devices: Vec<(&str, &crate::domain::plan::Device)> = committed
                .plan
                .resources
                .iter()
                .flat_map(|r| r.devices.iter().map(move |d| (r.name.as_str(), d)))
                .collect();
            for &i in &s.picks {
                if devices.is_empty() { break; }
                let (resource, device) = devices[i % devices.len()];
                let r = committed.plan.resource(resource).unwrap();
                let answer = allocate::build_response(&committed.config, r, &[device]);
                let prefix = format!("{}=", committed.config.cdi_kind);
                let cdi: BTreeSet<String> = answer.cdi_devices.iter().filter_map(|q| q.strip_prefix(&prefix)).map(str::to_string).collect();
                store.hold(resource, [device.id.as_str()], &cdi);
            }
            // ...or the kubelet reports them all gone.
            if s.release {
                let later = std::time::Instant::now() + std::time::Duration::from_secs(1);
                store.release(&Default::default(), later, std::time::Duration::ZERO);
                prop_assert!(store.current().held.is_empty());
            }
        }
    }
}
