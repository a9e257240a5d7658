//! The node's state as one value: config, inventory, plan, device nodes, health overlay,
//! resource views, held devices, the last CDI spec and the MPS daemon set. Plain data (no
//! channels): [`crate::state::Store`] publishes it, [`crate::domain::transition::next`]
//! computes the next one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::domain::cdi::Spec;
use crate::domain::config::Config;
use crate::domain::devnodes::DeviceNodes;
use crate::domain::inventory::Inventory;
use crate::domain::mps::DaemonSpec;
use crate::domain::plan::Plan;
use crate::domain::view::{Overlay, ResourceView};

/// One consistent state of the node.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    /// Bumped by every commit and every health change; names the state an answer was built
    /// from.
    pub(crate) generation: u64,
    /// Validated config.
    pub(crate) config: Arc<Config>,
    /// Discovered GPUs and MIG devices.
    pub(crate) inventory: Arc<Inventory>,
    /// Resources and their devices.
    pub(crate) plan: Arc<Plan>,
    /// Device nodes of each physical device (for `passDeviceSpecs`).
    pub(crate) nodes: Arc<DeviceNodes>,
    /// Health overrides from events.
    pub(crate) overlay: Arc<Overlay>,
    /// The view of every planned resource (plan × overlay).
    pub(crate) views: Arc<BTreeMap<String, Arc<ResourceView>>>,
    /// Devices handed out and not known to be released.
    pub(crate) held: Arc<Held>,
    /// The CDI spec last written (`None` before the first write, or when there are no devices).
    pub(crate) spec: Option<Arc<Spec>>,
    /// CDI devices the spec carries only because they are held (the plan no longer has
    /// them): dropped by the first rewrite after they are released.
    pub(crate) kept: Arc<Vec<String>>,
    /// Config entries this node has nothing for (one ConfigMap for a mixed cluster).
    pub(crate) skipped: Arc<Vec<crate::domain::plan::Skipped>>,
    /// The MPS control daemons the plan needs.
    pub(crate) mps: Arc<Vec<DaemonSpec>>,
    /// Whether a spec describing this plan has been written (for `/readyz`).
    pub(crate) spec_written: bool,
    /// The plan is committed but its spec is still being written (only at start, so the
    /// kubelet's registration does not wait on the write): ListAndWatch sends no frame and
    /// Allocate answers nothing from such a snapshot, so nothing is advertised or handed out
    /// that the spec on disk lacks.
    pub(crate) spec_pending: bool,
}

/// The part of a [`Snapshot`] a transition computes; the rest (generation, health
/// overlay, views, held set) is the store's at commit time.
#[derive(Debug, Clone)]
pub(crate) struct Computed {
    /// Validated config.
    pub(crate) config: Arc<Config>,
    /// Discovered GPUs and MIG devices.
    pub(crate) inventory: Arc<Inventory>,
    /// Resources and their devices.
    pub(crate) plan: Arc<Plan>,
    /// Device nodes of each physical device.
    pub(crate) nodes: Arc<DeviceNodes>,
    /// The spec to write before committing; `None`: no devices, write nothing.
    pub(crate) spec: Option<Arc<Spec>>,
    /// CDI devices carried over from the previous spec because they are still held.
    pub(crate) kept: Arc<Vec<String>>,
    /// Config entries this node has nothing for.
    pub(crate) skipped: Arc<Vec<crate::domain::plan::Skipped>>,
    /// The MPS control daemons the plan needs.
    pub(crate) mps: Arc<Vec<DaemonSpec>>,
}

impl Snapshot {
    /// A snapshot serving `plan` (with no health events and nothing held): what a
    /// transition from the empty snapshot commits, minus the spec. For embedders and tests.
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) fn serving(config: Config, inventory: Inventory, plan: Plan) -> Self {
        let overlay = Overlay::default();
        let views = crate::domain::view::views(&plan, &overlay, &BTreeMap::new());
        Self {
            generation: 1,
            nodes: Arc::new(DeviceNodes::new(&inventory).unwrap_or_default()),
            config: Arc::new(config),
            inventory: Arc::new(inventory),
            plan: Arc::new(plan),
            overlay: Arc::new(overlay),
            views: Arc::new(views),
            ..Self::default()
        }
    }

    /// The view of one resource.
    pub(crate) fn view(&self, resource: &str) -> Option<&Arc<ResourceView>> {
        self.views.get(resource)
    }

    /// Names of the served resources, sorted.
    pub(crate) fn resource_names(&self) -> Vec<String> {
        self.views.keys().cloned().collect()
    }
}

/// One held device: the CDI devices (names without the kind) its Allocate answer used, and
/// when it was last handed out (`None` when it was read back from a checkpoint).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeldDevice {
    /// CDI device names (without `<kind>=`) the answer named.
    pub(crate) cdi: BTreeSet<String>,
    /// When Allocate last handed it out in this process.
    #[serde(skip)]
    pub(crate) at: Option<Instant>,
}

/// Devices handed out by Allocate, per resource and device ID.
///
/// The kubelet never says when a container releases a device; the PodResources ledger does,
/// and prunes this through `Store::release`. Without it the set only grows, which errs on
/// the safe side: it decides which CDI devices every later spec keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Held {
    /// resource → device ID → what it holds.
    pub(crate) resources: BTreeMap<String, BTreeMap<String, HeldDevice>>,
}

impl Held {
    /// Record `ids` of `resource` handed out with the CDI devices `cdi`. Returns whether
    /// anything new was recorded (a new ID or a new CDI name), i.e. whether the set needs to
    /// be persisted again.
    pub(crate) fn record<'a>(
        &mut self,
        resource: &str,
        ids: impl IntoIterator<Item = &'a str>,
        cdi: &BTreeSet<String>,
        now: Instant,
    ) -> bool {
        let entry = self.resources.entry(resource.to_string()).or_default();
        let mut grew = false;
        for id in ids {
            let device = entry.entry(id.to_string()).or_insert_with(|| {
                grew = true;
                HeldDevice {
                    cdi: BTreeSet::new(),
                    at: None,
                }
            });
            device.at = Some(now);
            for name in cdi {
                grew |= device.cdi.insert(name.clone());
            }
        }
        grew
    }

    /// Whether recording `ids` with `cdi` would add nothing: every ID is held for
    /// `resource` with every name of `cdi` already.
    pub(crate) fn covers(&self, resource: &str, ids: &[&str], cdi: &BTreeSet<String>) -> bool {
        let Some(held) = self.resources.get(resource) else {
            return ids.is_empty();
        };
        ids.iter().all(|id| {
            held.get(*id)
                .is_some_and(|d| cdi.iter().all(|name| d.cdi.contains(name)))
        })
    }

    /// Move each device's `at` up to a later hand-out time from `stamps`
    /// (resource → ID → time), kept outside the snapshot by the store.
    pub(crate) fn refresh(
        &mut self,
        stamps: &std::collections::HashMap<String, std::collections::HashMap<String, Instant>>,
    ) {
        for (resource, ids) in &mut self.resources {
            let Some(times) = stamps.get(resource) else {
                continue;
            };
            for (id, d) in ids.iter_mut() {
                if let Some(&t) = times.get(id)
                    && d.at.is_none_or(|at| at < t)
                {
                    d.at = Some(t);
                }
            }
        }
    }

    /// Every CDI device name a held device uses: what every spec must keep.
    pub(crate) fn cdi_names(&self) -> BTreeSet<String> {
        self.resources
            .values()
            .flat_map(|ids| ids.values())
            .flat_map(|d| d.cdi.iter().cloned())
            .collect()
    }

    /// Held device IDs per resource.
    pub(crate) fn ids(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.resources
            .iter()
            .map(|(r, ids)| (r.clone(), ids.keys().cloned().collect()))
            .collect()
    }

    /// Forget devices that an authoritative list taken at `taken_at` (`in_use`: resource →
    /// device IDs) no longer has, if they were recorded at least `grace` before it (or read
    /// from a checkpoint). Newer records stay: the kubelet records an allocation only after
    /// Allocate answered, so a list taken just after our record may not show it yet.
    /// Returns whether anything was forgotten.
    pub(crate) fn prune(
        &mut self,
        in_use: &BTreeMap<String, BTreeSet<String>>,
        taken_at: Instant,
        grace: std::time::Duration,
    ) -> bool {
        let before = self.len();
        for (resource, ids) in &mut self.resources {
            let used = in_use.get(resource);
            ids.retain(|id, d| {
                d.at.is_some_and(|at| at + grace > taken_at) || used.is_some_and(|s| s.contains(id))
            });
        }
        self.resources.retain(|_, ids| !ids.is_empty());
        self.len() != before
    }

    /// Number of held device IDs.
    pub(crate) fn len(&self) -> usize {
        self.resources.values().map(BTreeMap::len).sum()
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn held_records_grow_once_and_prune_by_list_time() {
        let mut held = Held::default();
        let t0 = Instant::now();
        assert!(held.record("r", ["a", "b"], &names(&["GPU-1"]), t0));
        assert!(
            !held.record("r", ["a"], &names(&["GPU-1"]), t0),
            "nothing new"
        );
        assert_eq!(held.cdi_names(), names(&["GPU-1"]));
        let later = t0 + std::time::Duration::from_secs(1);
        let in_use = BTreeMap::from([("r".to_string(), names(&["b"]))]);
        assert!(held.prune(&in_use, later, std::time::Duration::ZERO));
        assert_eq!(held.ids()["r"], names(&["b"]));
        // A record newer than the list survives even when the list lacks it.
        held.record(
            "r",
            ["c"],
            &names(&["GPU-2"]),
            later + std::time::Duration::from_secs(1),
        );
        assert!(
            !held.prune(&in_use, later, std::time::Duration::ZERO),
            "b is in use, c is newer than the list"
        );
        assert_eq!(held.len(), 2);
    }

    #[test]
    fn checkpointed_devices_are_pruned_by_any_later_list() {
        let mut held = Held::default();
        held.record("r", ["a"], &names(&["GPU-1"]), Instant::now());
        let text = serde_json::to_string(&held).unwrap();
        let mut back: Held = serde_json::from_str(&text).unwrap();
        assert_eq!(back.cdi_names(), names(&["GPU-1"]));
        assert!(back.resources["r"]["a"].at.is_none());
        assert!(back.prune(
            &BTreeMap::new(),
            Instant::now(),
            std::time::Duration::from_secs(60)
        ));
        assert!(back.is_empty());
    }
}
