//! Resource views: one resource's planned devices with their current health, the thing
//! ListAndWatch streams and Allocate checks against, and the health [`Overlay`] they are
//! computed from.
//!
//! The overlay records health overrides keyed by a physical UUID (GPU or MIG) or a kubelet
//! device ID. An event on a GPU marks every device backed by it (the whole GPU, its
//! replicas, all its MIG slices and their replicas); an event on a MIG device marks that
//! slice and its replicas. Pure: the state store ([`crate::state`]) applies events and
//! publishes the views.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use crate::domain::inventory::{Health, Inventory};
use crate::domain::plan::{Device, Physical, Plan, Resource};

/// Errors updating device state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StateError {
    /// A health event named nothing this node serves.
    #[error("health event for {key}: no planned device or physical device has that ID")]
    UnknownKey { key: String },
}

/// Health of one device in a view, with the reason when unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceHealth {
    /// Current health.
    pub(crate) health: Health,
    /// Why it is unhealthy (event text), if it is.
    pub(crate) reason: Option<Arc<str>>,
    /// Its GPU is drained ([`Overlay::drain`]): left out of ListAndWatch altogether, so the
    /// kubelet drops it from the node's capacity while its GPU is repartitioned (it is also
    /// Unhealthy, so Allocate refuses it with the drain's reason).
    pub(crate) drained: bool,
}

/// One resource's devices with their current health: what ListAndWatch sends and what
/// Allocate checks against.
#[derive(Debug, Clone)]
pub(crate) struct ResourceView {
    /// The planned resource (devices sorted by ID).
    pub(crate) resource: Arc<Resource>,
    /// Health of `resource.devices[i]` at index `i`.
    pub(crate) health: Vec<DeviceHealth>,
    /// Which physical group each device belongs to (for preferred allocation).
    pub(crate) grouping: Arc<Grouping>,
}

/// Devices grouped by what placement policies balance over: the physical device for
/// replicas, the GPU for MIG slices and whole GPUs. Group numbers follow the sorted group
/// keys, so comparing numbers orders groups by UUID. Computed once per resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grouping {
    /// Group number of `resource.devices[i]`.
    pub(crate) of_device: Vec<usize>,
    /// Number of devices in each group.
    pub(crate) sizes: Vec<usize>,
    /// Device index by kubelet ID. A hash lookup instead of a binary search: IDs share
    /// long prefixes (`<uuid>::n`), which makes every comparison of a search slow, and the
    /// kubelet sends hundreds of IDs per GetPreferredAllocation.
    pub(crate) index: HashMap<String, usize, BuildHasherDefault<Fnv>>,
    /// Device indices by the UUID of the physical device or GPU behind them, ascending:
    /// which devices an event on that UUID touches, found without comparing it with every
    /// device's UUIDs (an XID on one GPU of eight would otherwise look at all 512 replicas).
    pub(crate) backed: HashMap<String, Vec<usize>, BuildHasherDefault<Fnv>>,
}

/// 64-bit FNV-1a: fast for short keys and not exposed to untrusted input sizes that would
/// need SipHash's flooding resistance (IDs come from the kubelet and are ≤ 63 bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Grouping {
    /// Group a resource's devices.
    pub(crate) fn new(r: &Resource) -> Self {
        fn key(shared: bool, d: &Device) -> &str {
            if shared {
                &d.physical.uuid
            } else {
                &d.physical.gpu_uuid
            }
        }
        let shared = r.sharing.is_some();
        let keys: BTreeMap<&str, usize> = r
            .devices
            .iter()
            .map(|d| key(shared, d))
            .collect::<BTreeSet<&str>>()
            .into_iter()
            .enumerate()
            .map(|(i, k)| (k, i))
            .collect();
        let of_device: Vec<usize> = r.devices.iter().map(|d| keys[key(shared, d)]).collect();
        let mut sizes = vec![0; keys.len()];
        for &g in &of_device {
            sizes[g] += 1;
        }
        let index = r
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.id.clone(), i))
            .collect();
        // Built from runs of consecutive devices on one UUID (a GPU's replicas sit
        // together), so a UUID is hashed and copied once per run, not once per device.
        let mut backed: HashMap<String, Vec<usize>, BuildHasherDefault<Fnv>> = HashMap::default();
        let physical = runs(r, |d| Some(d.physical.uuid.as_str()));
        let gpus = runs(r, |d| {
            (d.physical.gpu_uuid != d.physical.uuid).then_some(d.physical.gpu_uuid.as_str())
        });
        for (uuid, devices) in physical.into_iter().chain(gpus) {
            backed.entry(uuid.to_string()).or_default().extend(devices);
        }
        for devices in backed.values_mut() {
            devices.sort_unstable();
            devices.dedup();
        }
        Self {
            of_device,
            sizes,
            index,
            backed,
        }
    }

    /// Indices of the devices `key` names (a kubelet ID) or backs (a physical device's or
    /// a GPU's UUID): those an event or a drain on `key` can change. Each index once.
    pub(crate) fn touched_by<'a>(&'a self, key: &str) -> impl Iterator<Item = usize> + 'a {
        let backed = self.backed.get(key).map_or(&[][..], Vec::as_slice);
        let own = self
            .index
            .get(key)
            .copied()
            .filter(|i| backed.binary_search(i).is_err());
        own.into_iter().chain(backed.iter().copied())
    }
}

/// The indices of `r`'s devices in runs of consecutive devices with the same `key`.
fn runs<'r>(
    r: &'r Resource,
    key: impl Fn(&'r Device) -> Option<&'r str>,
) -> Vec<(&'r str, Vec<usize>)> {
    let mut out: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, d) in r.devices.iter().enumerate() {
        let Some(k) = key(d) else { continue };
        match out.last_mut() {
            Some((last, devices)) if *last == k => devices.push(i),
            _ => out.push((k, vec![i])),
        }
    }
    out
}

impl ResourceView {
    /// Index of a device by kubelet ID.
    pub(crate) fn index_of(&self, id: &str) -> Option<usize> {
        self.grouping.index.get(id).copied()
    }

    /// The device and its health, by kubelet ID.
    pub(crate) fn get(&self, id: &str) -> Option<(&Device, &DeviceHealth)> {
        self.index_of(id)
            .map(|i| (&self.resource.devices[i], &self.health[i]))
    }

    /// The reason a device is unhealthy, or `None` when it is healthy.
    pub(crate) fn unhealthy_reason(&self, index: usize) -> Option<&str> {
        let h = self.health.get(index)?;
        match h.health {
            Health::Healthy => None,
            Health::Unhealthy => Some(h.reason.as_deref().unwrap_or("reported unhealthy")),
        }
    }

    /// Devices with their health, in ID order.
    pub(crate) fn devices(&self) -> impl Iterator<Item = (&Device, &DeviceHealth)> {
        self.resource.devices.iter().zip(self.health.iter())
    }

    /// Number of healthy devices.
    pub(crate) fn healthy_count(&self) -> usize {
        self.health
            .iter()
            .filter(|h| h.health == Health::Healthy)
            .count()
    }
}

/// One health event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HealthUpdate {
    /// A GPU UUID, a MIG UUID, or a kubelet device ID (e.g. one replica).
    pub(crate) key: String,
    /// New health.
    pub(crate) health: Health,
    /// Why (shown in Allocate refusals and logs).
    pub(crate) reason: String,
}

/// Health overrides from events, keyed by GPU UUID, MIG UUID or kubelet device ID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Overlay {
    overrides: BTreeMap<String, (Health, Arc<str>)>,
    /// GPUs taken out of service by the agent itself (a MIG layout being applied), apart
    /// from health events: ending a drain must not clear an XID recorded meanwhile.
    drains: BTreeMap<String, Arc<str>>,
}

impl Overlay {
    /// Whether `key` backs or names `device`.
    fn touches(key: &str, device: &Device) -> bool {
        device.id == key || device.physical.uuid == key || device.physical.gpu_uuid == key
    }

    /// Whether any device of `plan` is named or backed by `key`.
    pub(crate) fn knows(plan: &Plan, key: &str) -> bool {
        plan.resources
            .iter()
            .any(|r| r.devices.iter().any(|d| Self::touches(key, d)))
    }

    /// Record an event. Unknown keys are refused: an event must name something `plan`
    /// serves, or it would linger and mark a device that appears later. A GPU of
    /// `inventory` is known even when the plan serves none of its devices: a GPU whose MIG
    /// devices DRA claims make (`flags.dra.dynamicMig`) serves nothing until a claim comes,
    /// and its health must still taint the devices it publishes ([`Overlay::gpu_health`]).
    pub(crate) fn apply(
        &mut self,
        plan: &Plan,
        inventory: &Inventory,
        update: &HealthUpdate,
    ) -> Result<(), StateError> {
        // A GPU UUID (what an XID names) is found among a few GPUs; only other keys need
        // the plan's devices searched.
        if inventory.gpu(&update.key).is_none() && !Self::knows(plan, &update.key) {
            return Err(StateError::UnknownKey {
                key: update.key.clone(),
            });
        }
        match update.health {
            Health::Healthy => {
                self.overrides.remove(&update.key);
            }
            Health::Unhealthy => {
                self.overrides.insert(
                    update.key.clone(),
                    (Health::Unhealthy, Arc::from(update.reason.as_str())),
                );
            }
        }
        Ok(())
    }

    /// Take the GPU `gpu_uuid` out of service (`Some(code)`) or back (`None`), apart from
    /// its health events. Unknown GPUs are refused as in [`Overlay::apply`].
    pub(crate) fn drain(
        &mut self,
        plan: &Plan,
        gpu_uuid: &str,
        code: Option<&str>,
    ) -> Result<(), StateError> {
        match code {
            Some(code) => {
                if !Self::knows(plan, gpu_uuid) {
                    return Err(StateError::UnknownKey {
                        key: gpu_uuid.to_string(),
                    });
                }
                self.drains.insert(gpu_uuid.to_string(), Arc::from(code));
            }
            None => {
                self.drains.remove(gpu_uuid);
            }
        }
        Ok(())
    }

    /// What the overlay says about the GPU `gpu_uuid` itself (an event on its UUID first,
    /// then a drain), whether or not the plan serves any of its devices.
    pub(crate) fn gpu_health(&self, gpu_uuid: &str) -> Option<Arc<str>> {
        match self.overrides.get(gpu_uuid) {
            Some((Health::Unhealthy, reason)) => Some(reason.clone()),
            _ => self.drains.get(gpu_uuid).cloned(),
        }
    }

    /// [`Self::health_of`] through `last`, the answer for the replica looked at before: a
    /// replica's health follows its own ID's event, else its physical device's (and its
    /// GPU's), so the replicas of one GPU share one answer and one reason `Arc` instead
    /// of each formatting its own (an XID on a GPU of 64 replicas: 64 strings).
    fn health_shared<'p>(
        &self,
        d: &'p Device,
        last: &mut Option<SharedHealth<'p>>,
    ) -> DeviceHealth {
        if d.replica.is_none() || self.overrides.contains_key(d.id.as_str()) {
            return self.health_of(d);
        }
        if let Some(l) = last
            && l.planned == d.health
            && l.physical.uuid == d.physical.uuid
            && l.physical.gpu_uuid == d.physical.gpu_uuid
        {
            return l.health.clone();
        }
        let health = self.health_of(d);
        *last = Some(SharedHealth {
            physical: &d.physical,
            planned: d.health,
            health: health.clone(),
        });
        health
    }

    /// Current health of one device: unhealthy if the plan says so, any override on its
    /// ID, its physical device or its GPU says so (health events first: their reason is
    /// the one to show), or its GPU is drained.
    pub(crate) fn health_of(&self, d: &Device) -> DeviceHealth {
        let keys = [
            d.id.as_str(),
            d.physical.uuid.as_str(),
            d.physical.gpu_uuid.as_str(),
        ];
        for key in keys {
            if let Some((Health::Unhealthy, reason)) = self.overrides.get(key) {
                return DeviceHealth {
                    health: Health::Unhealthy,
                    reason: Some(if key == d.id {
                        reason.clone()
                    } else {
                        Arc::from(format!("{key}: {reason}"))
                    }),
                    drained: self.drains.contains_key(d.physical.gpu_uuid.as_str()),
                };
            }
        }
        if let Some(code) = self.drains.get(d.physical.gpu_uuid.as_str()) {
            return DeviceHealth {
                health: Health::Unhealthy,
                reason: Some(if d.id == d.physical.gpu_uuid {
                    code.clone()
                } else {
                    Arc::from(format!("{}: {code}", d.physical.gpu_uuid))
                }),
                drained: true,
            };
        }
        DeviceHealth {
            health: d.health,
            reason: (d.health == Health::Unhealthy).then(|| Arc::from("unhealthy at discovery")),
            drained: false,
        }
    }
}

/// What [`Overlay::health_shared`] worked out for a replica not named by an event of its
/// own: the same for every such replica of that physical device and planned health.
struct SharedHealth<'p> {
    physical: &'p Physical,
    planned: Health,
    health: DeviceHealth,
}

/// The views of every resource of `plan` under `overlay`, reusing `previous` views whose
/// resource and health did not change (same `Arc`), so their ListAndWatch streams stay
/// quiet.
pub(crate) fn views(
    plan: &Plan,
    overlay: &Overlay,
    previous: &BTreeMap<String, Arc<ResourceView>>,
) -> BTreeMap<String, Arc<ResourceView>> {
    plan.resources
        .iter()
        .map(|r| {
            let mut last = None;
            let health: Vec<DeviceHealth> = r
                .devices
                .iter()
                .map(|d| overlay.health_shared(d, &mut last))
                .collect();
            let view = match previous.get(&r.name) {
                Some(old) if *old.resource == *r && old.health == health => old.clone(),
                Some(old) if *old.resource == *r => Arc::new(ResourceView {
                    resource: old.resource.clone(),
                    health,
                    grouping: old.grouping.clone(),
                }),
                _ => Arc::new(ResourceView {
                    resource: Arc::new(r.clone()),
                    health,
                    grouping: Arc::new(Grouping::new(r)),
                }),
            };
            (r.name.clone(), view)
        })
        .collect()
}

/// The views `current` (the views of the plan being served, under the previous overlay)
/// become once `overlay` changed what it says about `key` (a device ID, a MIG or GPU UUID:
/// the key of a health event or a drain): what [`views`] computes for that plan, but only
/// the devices `key` names or backs are looked at again, the others keep their health. A
/// health event or a drain changes health only, never the planned devices, so each view
/// keeps its resource and grouping, and one whose health is unchanged keeps its `Arc`. On
/// an XID this is 64 devices of 512, not every device of every resource compared again.
pub(crate) fn under_overlay(
    current: &BTreeMap<String, Arc<ResourceView>>,
    overlay: &Overlay,
    key: &str,
) -> BTreeMap<String, Arc<ResourceView>> {
    current
        .iter()
        .map(|(name, old)| {
            let mut health: Option<Vec<DeviceHealth>> = None;
            let mut last = None;
            for i in old.grouping.touched_by(key) {
                let d = &old.resource.devices[i];
                let now = overlay.health_shared(d, &mut last);
                if old.health.get(i) != Some(&now) {
                    health.get_or_insert_with(|| old.health.clone())[i] = now;
                }
            }
            let view = match health {
                None => old.clone(),
                Some(health) => Arc::new(ResourceView {
                    resource: old.resource.clone(),
                    health,
                    grouping: old.grouping.clone(),
                }),
            };
            (name.clone(), view)
        })
        .collect()
}

/// Names of the resources whose view differs (by identity) between two view maps, plus
/// the added and removed ones: what a health event or a commit changed.
pub(crate) fn changed(
    old: &BTreeMap<String, Arc<ResourceView>>,
    new: &BTreeMap<String, Arc<ResourceView>>,
) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = new
        .iter()
        .filter(|(name, v)| old.get(*name).is_none_or(|o| !Arc::ptr_eq(o, v)))
        .map(|(name, _)| name.clone())
        .collect();
    out.extend(old.keys().filter(|n| !new.contains_key(*n)).cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After health events and drains, the views derived from the current ones equal the
    /// views computed from the plan (same health, same identities where nothing changed).
    #[test]
    fn views_under_a_new_overlay_equal_views_of_the_plan() {
        let (inv, _, plan) = crate::testkit::fixtures::planned(
            "mixed-a100",
            "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
        );
        let gpu = plan.resources[0].devices[0].physical.gpu_uuid.clone();
        let mig = plan
            .resources
            .iter()
            .flat_map(|r| &r.devices)
            .find(|d| d.physical.uuid != d.physical.gpu_uuid)
            .map(|d| d.id.clone())
            .expect("a MIG device");
        let mut overlay = Overlay::default();
        let mut current = views(&plan, &overlay, &BTreeMap::new());
        // (the key the step changes, the step)
        type Step<'a> = (&'a str, &'a dyn Fn(&mut Overlay));
        let steps: [Step; 6] = [
            (&gpu, &|o| {
                o.apply(&plan, &inv, &update(&gpu, Health::Unhealthy, "xid-79"))
                    .unwrap()
            }),
            // Still unhealthy, for another reason: the reason is part of the health.
            (&gpu, &|o| {
                o.apply(&plan, &inv, &update(&gpu, Health::Unhealthy, "xid-94"))
                    .unwrap()
            }),
            (&mig, &|o| {
                o.apply(&plan, &inv, &update(&mig, Health::Unhealthy, "xid-48"))
                    .unwrap()
            }),
            (&gpu, &|o| {
                o.drain(&plan, &gpu, Some("mig-layout-applying")).unwrap()
            }),
            (&gpu, &|o| {
                o.apply(&plan, &inv, &update(&gpu, Health::Healthy, ""))
                    .unwrap()
            }),
            (&gpu, &|o| o.drain(&plan, &gpu, None).unwrap()),
        ];
        for (generation, (key, step)) in (2..).zip(steps) {
            step(&mut overlay);
            let expected = views(&plan, &overlay, &current);
            let derived = under_overlay(&current, &overlay, key);
            assert!(derived.keys().eq(expected.keys()));
            for (name, view) in &derived {
                let want = &expected[name];
                assert_eq!(*view.resource, *want.resource, "{name}");
                assert_eq!(
                    view.health, want.health,
                    "{name} at generation {generation}"
                );
                assert_eq!(view.grouping, want.grouping, "{name}");
                // Shared answers are the answers each device gets on its own.
                for (d, h) in view.resource.devices.iter().zip(&view.health) {
                    assert_eq!(
                        *h,
                        overlay.health_of(d),
                        "{} at generation {generation}",
                        d.id
                    );
                }
                let kept = Arc::ptr_eq(view, &current[name]);
                assert_eq!(kept, Arc::ptr_eq(want, &current[name]), "{name}");
            }
            current = derived;
        }
    }

    /// The index finds exactly the devices a key names or backs, each once, for every key
    /// an event can carry (device IDs, MIG and GPU UUIDs), with replicas, MIG slices and
    /// whole GPUs in the plan; and nothing for a key no device has.
    #[test]
    fn touched_by_finds_what_touches_finds() {
        for (node, config) in [
            (
                "mixed-a100",
                "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
            ),
            ("mixed-a100", "version: v1\nflags: {migStrategy: mixed}\n"),
            ("mixed-a100", "version: v1\nflags: {migStrategy: none}\n"),
            ("dgx-h100", "version: v1\n"),
        ] {
            let (_, _, plan) = crate::testkit::fixtures::planned(node, config);
            for r in &plan.resources {
                let grouping = Grouping::new(r);
                let keys: BTreeSet<&str> = r
                    .devices
                    .iter()
                    .flat_map(|d| [&d.id, &d.physical.uuid, &d.physical.gpu_uuid])
                    .map(String::as_str)
                    .collect();
                for key in keys.into_iter().chain(["GPU-nobody"]) {
                    let mut found: Vec<usize> = grouping.touched_by(key).collect();
                    let n = found.len();
                    found.sort_unstable();
                    found.dedup();
                    assert_eq!(found.len(), n, "{node} {} {key}: an index twice", r.name);
                    let want: Vec<usize> = (0..r.devices.len())
                        .filter(|&i| Overlay::touches(key, &r.devices[i]))
                        .collect();
                    assert_eq!(found, want, "{node} {} {key}", r.name);
                }
            }
        }
    }

    /// An XID on a GPU of 4 replicas gives them one reason (one `Arc`, not four strings);
    /// an event on one replica's own ID sets that replica apart, and the replicas after it
    /// still share their GPU's answer.
    #[test]
    fn replicas_of_one_gpu_share_one_answer() {
        let (inv, _, plan) = crate::testkit::fixtures::planned(
            "dgx-h100",
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
        );
        let devices = &plan.resources[0].devices;
        let gpu = devices[0].physical.gpu_uuid.clone();
        let mut overlay = Overlay::default();
        let before = views(&plan, &overlay, &BTreeMap::new());
        overlay
            .apply(&plan, &inv, &update(&gpu, Health::Unhealthy, "xid-79"))
            .unwrap();
        overlay
            .apply(
                &plan,
                &inv,
                &update(&devices[1].id, Health::Unhealthy, "mine"),
            )
            .unwrap();
        for now in [
            views(&plan, &overlay, &before),
            under_overlay(&before, &overlay, &gpu),
        ] {
            let health = &now[&plan.resources[0].name].health;
            let reason = |i: usize| health[i].reason.clone().expect("unhealthy");
            assert_eq!(&*reason(0), format!("{gpu}: xid-79"));
            assert_eq!(&*reason(1), "mine");
            assert!(Arc::ptr_eq(&reason(0), &reason(2)));
            assert!(Arc::ptr_eq(&reason(0), &reason(3)));
            // The next GPU's replicas are healthy, and answered apart from the first's.
            assert_eq!(health[4].health, Health::Healthy);
            assert_ne!(devices[4].physical.gpu_uuid, gpu);
        }
    }

    fn update(key: &str, health: Health, reason: &str) -> HealthUpdate {
        HealthUpdate {
            key: key.to_string(),
            health,
            reason: reason.to_string(),
        }
    }
}
