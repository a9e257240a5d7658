//! Live device state: the plan plus health events, per resource.
//!
//! [`NodeHealth`] is the pure part: it records health overrides keyed by a physical UUID
//! (GPU or MIG) or a kubelet device ID and computes which resources an event touches. An
//! event on a GPU marks every device backed by it (the whole GPU, its replicas, all its MIG
//! slices and their replicas); an event on a MIG device marks that slice and its replicas.
//!
//! [`HealthMap`] is the shared handle: it publishes one [`ResourceView`] per resource on a
//! `tokio::sync::watch` channel. The device-plugin servers read the current view for every
//! RPC and stream a new ListAndWatch frame whenever it changes; the health subsystem calls
//! [`HealthMap::set_health`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::domain::inventory::Health;
use crate::domain::plan::{Device, Plan, PlanDiff, Resource};

/// Errors updating device state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// A health event named nothing this node serves.
    #[error("health event for {key}: no planned device or physical device has that ID")]
    UnknownKey { key: String },
}

/// Health of one device in a view, with the reason when unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    /// Current health.
    pub health: Health,
    /// Why it is unhealthy (event text), if it is.
    pub reason: Option<Arc<str>>,
}

/// One resource's devices with their current health: what ListAndWatch sends and what
/// Allocate checks against.
#[derive(Debug, Clone)]
pub struct ResourceView {
    /// The planned resource (devices sorted by ID).
    pub resource: Arc<Resource>,
    /// Health of `resource.devices[i]` at index `i`.
    pub health: Vec<DeviceHealth>,
    /// Bumped on every change, so consumers can tell frames apart.
    pub generation: u64,
    /// Which physical group each device belongs to (for preferred allocation).
    pub grouping: Arc<Grouping>,
}

/// Devices grouped by what placement policies balance over: the physical device for
/// replicas, the GPU for MIG slices and whole GPUs. Group numbers follow the sorted group
/// keys, so comparing numbers orders groups by UUID. Computed once per resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grouping {
    /// Group number of `resource.devices[i]`.
    pub of_device: Vec<usize>,
    /// Number of devices in each group.
    pub sizes: Vec<usize>,
    /// Device index by kubelet ID. A hash lookup instead of a binary search: IDs share
    /// long prefixes (`<uuid>::n`), which makes every comparison of a search slow, and the
    /// kubelet sends hundreds of IDs per GetPreferredAllocation.
    pub index: HashMap<String, usize, BuildHasherDefault<Fnv>>,
}

/// 64-bit FNV-1a: fast for short keys and not exposed to untrusted input sizes that would
/// need SipHash's flooding resistance (IDs come from the kubelet and are ≤ 63 bytes).
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

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
    pub fn new(r: &Resource) -> Self {
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
        Self {
            of_device,
            sizes,
            index,
        }
    }
}

impl ResourceView {
    /// Index of a device by kubelet ID.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.grouping.index.get(id).copied()
    }

    /// The device and its health, by kubelet ID.
    pub fn get(&self, id: &str) -> Option<(&Device, &DeviceHealth)> {
        self.index_of(id)
            .map(|i| (&self.resource.devices[i], &self.health[i]))
    }

    /// The reason a device is unhealthy, or `None` when it is healthy.
    pub fn unhealthy_reason(&self, index: usize) -> Option<&str> {
        let h = self.health.get(index)?;
        match h.health {
            Health::Healthy => None,
            Health::Unhealthy => Some(h.reason.as_deref().unwrap_or("reported unhealthy")),
        }
    }

    /// Devices with their health, in ID order.
    pub fn devices(&self) -> impl Iterator<Item = (&Device, &DeviceHealth)> {
        self.resource.devices.iter().zip(self.health.iter())
    }

    /// Number of healthy devices.
    pub fn healthy_count(&self) -> usize {
        self.health
            .iter()
            .filter(|h| h.health == Health::Healthy)
            .count()
    }
}

/// One health event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthUpdate {
    /// A GPU UUID, a MIG UUID, or a kubelet device ID (e.g. one replica).
    pub key: String,
    /// New health.
    pub health: Health,
    /// Why (shown in Allocate refusals and logs).
    pub reason: String,
}

/// The pure health model: plan + overrides.
#[derive(Debug, Clone)]
pub struct NodeHealth {
    resources: Vec<Arc<Resource>>,
    groupings: Vec<Arc<Grouping>>,
    /// key (physical UUID or device ID) -> (health, reason)
    overrides: BTreeMap<String, (Health, Arc<str>)>,
    generation: u64,
}

impl NodeHealth {
    /// Start from a plan; devices keep the health the plan gives them until an event says
    /// otherwise.
    pub fn new(plan: &Plan) -> Self {
        Self {
            resources: plan.resources.iter().cloned().map(Arc::new).collect(),
            groupings: plan
                .resources
                .iter()
                .map(|r| Arc::new(Grouping::new(r)))
                .collect(),
            overrides: BTreeMap::new(),
            generation: 0,
        }
    }

    /// Names of the resources, in plan order.
    pub fn resource_names(&self) -> impl Iterator<Item = &str> {
        self.resources.iter().map(|r| r.name.as_str())
    }

    /// Whether `key` backs or names `device`.
    fn touches(key: &str, device: &Device) -> bool {
        device.id == key || device.physical.uuid == key || device.physical.gpu_uuid == key
    }

    /// Record an event and return the names of the resources whose device list changed.
    pub fn apply(&mut self, update: &HealthUpdate) -> Result<BTreeSet<String>, StateError> {
        let touched: Vec<&Arc<Resource>> = self
            .resources
            .iter()
            .filter(|r| r.devices.iter().any(|d| Self::touches(&update.key, d)))
            .collect();
        if touched.is_empty() {
            return Err(StateError::UnknownKey {
                key: update.key.clone(),
            });
        }
        let before: Vec<Vec<Health>> = touched.iter().map(|r| self.healths(r)).collect();
        let names: Vec<String> = touched.iter().map(|r| r.name.clone()).collect();
        let touched: Vec<Arc<Resource>> = touched.into_iter().cloned().collect();
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
        let mut changed = BTreeSet::new();
        for ((r, before), name) in touched.iter().zip(before).zip(names) {
            if self.healths(r) != before {
                changed.insert(name);
            }
        }
        if !changed.is_empty() {
            self.generation += 1;
        }
        Ok(changed)
    }

    fn healths(&self, r: &Resource) -> Vec<Health> {
        r.devices.iter().map(|d| self.health_of(d).health).collect()
    }

    /// Current health of one device: unhealthy if the plan says so or any override on its
    /// ID, its physical device or its GPU says so.
    pub fn health_of(&self, d: &Device) -> DeviceHealth {
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
                };
            }
        }
        DeviceHealth {
            health: d.health,
            reason: (d.health == Health::Unhealthy).then(|| Arc::from("unhealthy at discovery")),
        }
    }

    /// The current view of one resource.
    pub fn view(&self, name: &str) -> Option<ResourceView> {
        let i = self.resources.iter().position(|r| r.name == name)?;
        let r = &self.resources[i];
        Some(ResourceView {
            resource: r.clone(),
            health: r.devices.iter().map(|d| self.health_of(d)).collect(),
            generation: self.generation,
            grouping: self.groupings[i].clone(),
        })
    }
}

/// Shared, cloneable handle on the live state of every resource.
///
/// Readers (`subscribe`/`view`) never take the writer lock: they read the latest
/// `Arc<ResourceView>` from a watch channel, so Allocate stays cheap under health churn.
#[derive(Debug, Clone)]
pub struct HealthMap {
    inner: Arc<HealthInner>,
}

#[derive(Debug)]
struct HealthInner {
    /// One lock for the model and the per-resource senders, so a re-plan swaps both at once
    /// and no event is applied to a half-replaced plan.
    state: Mutex<Published>,
}

#[derive(Debug)]
struct Published {
    model: NodeHealth,
    senders: BTreeMap<String, watch::Sender<Arc<ResourceView>>>,
}

impl HealthMap {
    /// Build the handle for a plan.
    pub fn new(plan: &Plan) -> Self {
        let model = NodeHealth::new(plan);
        let senders = model
            .resources
            .iter()
            .filter_map(|r| {
                let view = model.view(&r.name)?;
                Some((r.name.clone(), watch::Sender::new(Arc::new(view))))
            })
            .collect();
        Self {
            inner: Arc::new(HealthInner {
                state: Mutex::new(Published { model, senders }),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        // A poisoned lock only means another updater panicked mid-update; the state it
        // guards is still a consistent map, so keep serving it.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Names of the served resources.
    pub fn resource_names(&self) -> Vec<String> {
        self.lock().senders.keys().cloned().collect()
    }

    /// Follow one resource's view; the receiver sees the current view at once. The channel
    /// closes when a re-plan removes the resource.
    pub fn subscribe(&self, resource: &str) -> Option<watch::Receiver<Arc<ResourceView>>> {
        self.lock().senders.get(resource).map(|s| s.subscribe())
    }

    /// The current view of one resource.
    pub fn view(&self, resource: &str) -> Option<Arc<ResourceView>> {
        self.lock()
            .senders
            .get(resource)
            .map(|s| s.borrow().clone())
    }

    /// Apply a health event (`key` = GPU UUID, MIG UUID or device ID) and publish a new view
    /// to every resource it changed. Returns the names of those resources.
    pub fn set_health(
        &self,
        key: &str,
        health: Health,
        reason: &str,
    ) -> Result<BTreeSet<String>, StateError> {
        let update = HealthUpdate {
            key: key.to_string(),
            health,
            reason: reason.to_string(),
        };
        let mut published = self.lock();
        let changed = published.model.apply(&update)?;
        for name in &changed {
            if let (Some(tx), Some(view)) =
                (published.senders.get(name), published.model.view(name))
            {
                tx.send_replace(Arc::new(view));
            }
        }
        Ok(changed)
    }

    /// Serve a new plan. Health events already received keep applying (they are keyed by
    /// UUID or device ID, not by position). Changed resources get a new view on their
    /// existing channel, so open ListAndWatch streams send the new device list at once;
    /// removed resources' channels close; added resources get new channels. Returns the
    /// diff, for the caller to start and stop resource servers.
    pub fn replace_plan(&self, plan: &Plan) -> PlanDiff {
        let mut published = self.lock();
        let old = Plan {
            resources: published
                .model
                .resources
                .iter()
                .map(|r| Resource::clone(r))
                .collect(),
        };
        let diff = crate::domain::plan::diff(&old, plan);
        let mut model = NodeHealth::new(plan);
        model.overrides = std::mem::take(&mut published.model.overrides);
        model.generation = published.model.generation + 1;
        for name in &diff.removed {
            published.senders.remove(name);
        }
        // Unchanged resources keep their view: same devices under the same overrides read
        // the same, and not sending keeps their streams quiet.
        for name in &diff.changed {
            if let (Some(tx), Some(view)) = (published.senders.get(name), model.view(name)) {
                tx.send_replace(Arc::new(view));
            }
        }
        for name in &diff.added {
            if let Some(view) = model.view(name) {
                published
                    .senders
                    .insert(name.clone(), watch::Sender::new(Arc::new(view)));
            }
        }
        published.model = model;
        diff
    }
}
/// Device IDs handed out by Allocate, per resource, with when each was last handed out.
///
/// The kubelet never says when a container releases a device; the PodResources ledger does,
/// when it is available, and prunes this log through [`AllocationLog::prune`]. Without it
/// the log only grows, which errs on the safe side: it decides which CDI devices a reload
/// must keep in the spec.
#[derive(Debug, Clone, Default)]
pub struct AllocationLog {
    inner: Arc<Mutex<BTreeMap<String, BTreeMap<String, std::time::Instant>>>>,
}

impl AllocationLog {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeMap<String, std::time::Instant>>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Record devices of `resource` handed out now.
    pub fn record<'a>(&self, resource: &str, ids: impl IntoIterator<Item = &'a str>) {
        let now = std::time::Instant::now();
        let mut log = self.lock();
        let entry = log.entry(resource.to_string()).or_default();
        for id in ids {
            entry.insert(id.to_string(), now);
        }
    }

    /// Every recorded device ID, per resource.
    pub fn snapshot(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.lock()
            .iter()
            .map(|(r, ids)| (r.clone(), ids.keys().cloned().collect()))
            .collect()
    }

    /// Forget devices recorded before `taken_at` that an authoritative list taken then
    /// (`held`: resource → device IDs in use) no longer has. Later records stay: the list
    /// could not know them.
    pub fn prune(&self, held: &BTreeMap<String, BTreeSet<String>>, taken_at: std::time::Instant) {
        let mut log = self.lock();
        for (resource, ids) in log.iter_mut() {
            let in_use = held.get(resource);
            ids.retain(|id, at| *at >= taken_at || in_use.is_some_and(|s| s.contains(id)));
        }
        log.retain(|_, ids| !ids.is_empty());
    }
}
