//! The state store: everything the daemon serves, as one immutable [`Snapshot`] behind one
//! `watch` channel.
//!
//! Every reader — each resource's gRPC service, ListAndWatch, metrics, the ledger, the MPS
//! supervisor, `/readyz`, the health monitor — takes one snapshot per request and reads the
//! config, inventory, plan, device nodes, health and views from that one value, so a reload
//! can never be half-seen. Writers send commands: [`Store::commit`] (the reloader, with what
//! [`crate::domain::transition::next`] computed), [`Store::set_health`] (health monitor, MPS
//! supervisor), [`Store::hold`] / [`Store::release`] (Allocate, ledger). Each command builds a
//! new snapshot from the current one under the channel's lock, so commands never interleave.
//!
//! Held devices (what Allocate handed out, with the CDI devices it answered) are part of the
//! snapshot but do not bump the generation: they change no answer, only what the next spec
//! must keep. They are persisted by the caller ([`crate::platform::checkpoint`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::watch;

use crate::domain::inventory::Health;
pub(crate) use crate::domain::snapshot::{Computed, Held, Snapshot};
use crate::domain::view::{self, HealthUpdate, Overlay, ResourceView, StateError};

/// The shared handle on the state. Cheap to clone; every clone sees the same state.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    tx: Arc<watch::Sender<Arc<Snapshot>>>,
    /// When Allocate last handed out each held device (resource → ID), kept beside the
    /// snapshot: refreshing it on every Allocate must not copy the whole held set. Written
    /// and read only under the channel's write lock (in `hold` and `release`), so a release
    /// never misses a hand-out; merged into the held set's `at` before it is pruned.
    stamps: Arc<Mutex<HashMap<String, HashMap<String, Instant>>>>,
}

impl Store {
    /// A store starting from `initial`.
    pub(crate) fn new(initial: Snapshot) -> Self {
        Self {
            tx: Arc::new(watch::Sender::new(Arc::new(initial))),
            stamps: Arc::default(),
        }
    }

    fn stamps(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, Instant>>> {
        // Instants only: a panic elsewhere leaves nothing inconsistent.
        self.stamps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current snapshot: read everything a request needs from this one value.
    pub(crate) fn current(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// Follow the state; the receiver sees the current snapshot at once.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// The current view of one resource.
    pub(crate) fn view(&self, resource: &str) -> Option<Arc<ResourceView>> {
        self.tx.borrow().views.get(resource).cloned()
    }

    #[cfg(test)]
    /// Names of the served resources.
    pub(crate) fn resource_names(&self) -> Vec<String> {
        self.tx.borrow().resource_names()
    }

    /// Apply what a transition computed. Health and held devices may have moved since it
    /// ran: the current overlay and held set are kept, and views are computed under that
    /// overlay; unchanged resources keep their view (same `Arc`), so their streams stay
    /// quiet. The spec it computed is the one written (`spec_written`). Returns the
    /// committed snapshot.
    pub(crate) fn commit(&self, next: Computed) -> Arc<Snapshot> {
        self.commit_as(next, false)
    }

    /// [`Store::commit`], with the spec not yet written: readers see the plan, but
    /// ListAndWatch and Allocate wait ([`Store::spec_on_disk`]) until
    /// [`Store::spec_now_written`] says the write of `generation` finished.
    pub(crate) fn commit_before_write(&self, next: Computed) -> Arc<Snapshot> {
        self.commit_as(next, true)
    }

    /// The spec of `generation` is on disk: the snapshot of that generation (and any made
    /// from it since, by health or held changes) is marked written, waking the readers that
    /// wait for it. A later transition already committed is left alone.
    pub(crate) fn spec_now_written(&self, generation: u64) {
        self.tx.send_if_modified(|current| {
            if !current.spec_pending || current.generation < generation {
                return false;
            }
            let mut next = Snapshot::clone(current);
            next.spec_pending = false;
            next.spec_written = next.spec.is_some();
            *current = Arc::new(next);
            true
        });
    }

    /// The current snapshot once its spec is on disk (at once, except right after start
    /// while the first spec is being written), or `None` if that takes longer than `limit`.
    pub(crate) async fn spec_on_disk(&self, limit: std::time::Duration) -> Option<Arc<Snapshot>> {
        let current = self.current();
        if !current.spec_pending {
            return Some(current);
        }
        let mut rx = self.subscribe();
        let waited = tokio::time::timeout(limit, rx.wait_for(|s| !s.spec_pending)).await;
        match waited {
            Ok(Ok(s)) => Some(s.clone()),
            _ => None,
        }
    }

    fn commit_as(&self, next: Computed, pending: bool) -> Arc<Snapshot> {
        let mut out = None;
        self.tx.send_modify(|current| {
            let generation = current.generation + 1;
            let views = view::views(&next.plan, &current.overlay, &current.views);
            let snapshot = Arc::new(Snapshot {
                generation,
                overlay: current.overlay.clone(),
                views: Arc::new(views),
                held: current.held.clone(),
                spec_written: !pending && next.spec.is_some(),
                spec_pending: pending && next.spec.is_some(),
                config: next.config,
                inventory: next.inventory,
                plan: next.plan,
                nodes: next.nodes,
                spec: next.spec,
                kept: next.kept,
                skipped: next.skipped,
                mps: next.mps,
            });
            out = Some(snapshot.clone());
            *current = snapshot;
        });
        out.unwrap_or_else(|| self.current())
    }

    /// Apply a health event (`key` = GPU UUID, MIG UUID or device ID) and publish the views
    /// it changed. Returns the names of the resources whose view changed.
    pub(crate) fn set_health(
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
        self.change_overlay(key, |overlay, now| {
            overlay.apply(&now.plan, &now.inventory, &update)
        })
    }

    /// Take a GPU out of service (`Some(code)`: its devices are Unhealthy with that reason
    /// code) or back (`None`), apart from its health events: a drain never clears an XID.
    /// Returns the names of the resources whose view changed.
    pub(crate) fn drain(
        &self,
        gpu_uuid: &str,
        code: Option<&str>,
    ) -> Result<BTreeSet<String>, StateError> {
        self.change_overlay(gpu_uuid, |overlay, now| {
            overlay.drain(&now.plan, gpu_uuid, code)
        })
    }

    /// Change what the overlay says about `key` and publish the views it changed (the
    /// overlay unchanged: nobody wakes).
    fn change_overlay(
        &self,
        key: &str,
        change: impl FnOnce(&mut Overlay, &Snapshot) -> Result<(), StateError>,
    ) -> Result<BTreeSet<String>, StateError> {
        let mut result = Ok(BTreeSet::new());
        self.tx.send_if_modified(|current| {
            let mut overlay = Overlay::clone(&current.overlay);
            if let Err(e) = change(&mut overlay, current) {
                result = Err(e);
                return false;
            }
            let generation = current.generation + 1;
            // The views are those of `current.plan`: only their health can change here.
            let views = view::under_overlay(&current.views, &overlay, key);
            let changed = view::changed(&current.views, &views);
            // An event on a GPU the plan serves nothing of (a dynamic MIG GPU, DRA) changes
            // no view but what the DRA slices publish: it wakes the store's readers.
            if changed.is_empty() && overlay == *current.overlay {
                // Same health as before (a repeated event): wake nobody.
                return false;
            }
            let mut next = Snapshot::clone(current);
            next.generation = generation;
            next.overlay = Arc::new(overlay);
            next.views = Arc::new(views);
            *current = Arc::new(next);
            result = Ok(changed);
            true
        });
        result
    }

    /// Record devices handed out by Allocate with the CDI devices answered. Returns the held
    /// set when it grew (the caller persists it before answering), `None` otherwise.
    pub(crate) fn hold<'a>(
        &self,
        resource: &str,
        ids: impl IntoIterator<Item = &'a str>,
        cdi: &BTreeSet<String>,
    ) -> Option<Arc<Held>> {
        let now = Instant::now();
        let ids: Vec<&str> = ids.into_iter().collect();
        let mut grown = None;
        // Holding changes no answer: readers are not woken for it.
        self.tx.send_if_modified(|current| {
            {
                let mut stamps = self.stamps();
                let stamps = match stamps.get_mut(resource) {
                    Some(s) => s,
                    None => stamps.entry(resource.to_string()).or_default(),
                };
                for id in &ids {
                    match stamps.get_mut(*id) {
                        Some(at) => *at = now,
                        None => {
                            stamps.insert((*id).to_string(), now);
                        }
                    }
                }
            }
            // The steady state: everything is held already; only the stamps moved.
            if current.held.covers(resource, &ids, cdi) {
                return false;
            }
            let mut held = Held::clone(&current.held);
            let grew = held.record(resource, ids.iter().copied(), cdi, now);
            let held = Arc::new(held);
            let mut next = Snapshot::clone(current);
            next.held = held.clone();
            *current = Arc::new(next);
            if grew {
                grown = Some(held);
            }
            false
        });
        grown
    }

    /// Forget held devices an authoritative list taken at `taken_at` no longer has (see
    /// [`Held::prune`]). Returns the held set when something was forgotten.
    pub(crate) fn release(
        &self,
        in_use: &BTreeMap<String, BTreeSet<String>>,
        taken_at: Instant,
        grace: std::time::Duration,
    ) -> Option<Arc<Held>> {
        let mut pruned = None;
        self.tx.send_if_modified(|current| {
            let mut held = Held::clone(&current.held);
            let mut stamps = self.stamps();
            held.refresh(&stamps);
            if !held.prune(in_use, taken_at, grace) {
                return false;
            }
            // Forget the stamps of what is no longer held.
            stamps.retain(|r, ids| {
                let kept = held.resources.get(r);
                ids.retain(|id, _| kept.is_some_and(|k| k.contains_key(id)));
                !ids.is_empty()
            });
            let held = Arc::new(held);
            let mut next = Snapshot::clone(current);
            next.held = held.clone();
            *current = Arc::new(next);
            pruned = Some(held);
            // Readers of `held` (the reloader, metrics) follow releases.
            true
        });
        pruned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU2: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02";

    fn gpu2(store: &Store) -> (Health, Option<String>) {
        let view = store.view("nvidia.com/gpu").expect("whole GPUs");
        let (_, h) = view.get(GPU2).expect("GPU 2 is served whole");
        (h.health, h.reason.as_deref().map(str::to_string))
    }

    #[test]
    fn a_drain_takes_a_gpu_out_and_back_without_clearing_its_health_events() {
        let store = crate::testkit::fixtures::store(
            "mixed-a100",
            "version: v1\nflags: {migStrategy: mixed}\n",
        );
        assert_eq!(gpu2(&store), (Health::Healthy, None));

        let changed = store.drain(GPU2, Some("mig-layout-applying")).unwrap();
        assert!(changed.contains("nvidia.com/gpu"), "{changed:?}");
        assert_eq!(
            gpu2(&store),
            (Health::Unhealthy, Some("mig-layout-applying".into()))
        );
        // An XID while drained: its reason wins, and ending the drain keeps it.
        store.set_health(GPU2, Health::Unhealthy, "xid-79").unwrap();
        store.drain(GPU2, None).unwrap();
        assert_eq!(gpu2(&store), (Health::Unhealthy, Some("xid-79".into())));
        // Recovery of the event alone brings it back; an undrained GPU stays up.
        store.set_health(GPU2, Health::Healthy, "").unwrap();
        assert_eq!(gpu2(&store), (Health::Healthy, None));
        // A drain of a GPU nothing serves is refused, as health events are.
        assert!(
            store
                .drain("GPU-nope", Some("mig-layout-applying"))
                .is_err()
        );
    }

    /// A GPU whose MIG devices DRA claims make serves nothing until a claim comes; an XID on
    /// it is still recorded, wakes the store's readers (the slice publisher) and taints
    /// every device the GPU publishes, and its recovery clears them. A key that names no
    /// GPU and nothing served is still refused.
    #[test]
    fn an_event_on_a_gpu_that_serves_nothing_taints_what_dra_publishes_for_it() {
        use crate::domain::dra::slices;
        let (mut inventory, _, _) = crate::testkit::fixtures::planned("dgx-h100", "version: v1\n");
        for g in &mut inventory.gpus {
            g.mig_mode.current = true;
        }
        let config = crate::testkit::fixtures::config(
            "version: v1\nflags: {migStrategy: mixed, dra: {dynamicMig: all}}\n",
        );
        let plan = crate::domain::plan::build(&inventory, &config).unwrap();
        assert_eq!(
            plan.devices().count(),
            0,
            "MIG on, no instances: nothing served"
        );
        let gpu = inventory.gpus[3].uuid.clone();
        let store = Store::new(Snapshot::serving(config, inventory, plan));
        let tainted = |store: &Store| -> Vec<String> {
            let devices = slices::snapshot_devices(&store.current());
            devices
                .devices
                .values()
                .filter(|d| !d.device.taints.is_empty())
                .map(|d| d.name.clone())
                .collect()
        };
        assert!(tainted(&store).is_empty());
        let mut readers = store.subscribe();
        readers.borrow_and_update();

        store.set_health(&gpu, Health::Unhealthy, "xid-79").unwrap();
        assert!(readers.has_changed().unwrap(), "the publisher is woken");
        let sick = tainted(&store);
        // The whole GPU and its 25 placements, nothing of another GPU.
        assert_eq!(sick.len(), 26, "{sick:?}");
        assert!(
            sick.iter()
                .all(|n| n == "gpu-3" || n.starts_with("gpu-3-mig-"))
        );
        readers.borrow_and_update();
        // The same event again changes nothing and wakes nobody.
        store.set_health(&gpu, Health::Unhealthy, "xid-79").unwrap();
        assert!(!readers.has_changed().unwrap());

        store.set_health(&gpu, Health::Healthy, "").unwrap();
        assert!(readers.has_changed().unwrap());
        assert!(tainted(&store).is_empty());
        assert!(
            store
                .set_health("GPU-nope", Health::Unhealthy, "xid-79")
                .is_err()
        );
    }

    /// A device handed out again (nothing new to record, the snapshot is not copied) is
    /// still recent to a release: its hand-out time lives beside the snapshot and is
    /// merged before pruning. Without a recent hand-out it is pruned.
    #[test]
    fn a_repeated_hand_out_keeps_a_device_from_being_released() {
        let store = crate::testkit::fixtures::store(
            "mixed-a100",
            "version: v1\nflags: {migStrategy: mixed}\n",
        );
        let cdi: BTreeSet<String> = [GPU2.to_string()].into_iter().collect();
        assert!(store.hold("nvidia.com/gpu", [GPU2], &cdi).is_some(), "grew");
        let before = store.current();
        let listed = Instant::now();
        // The repeated hand-out comes strictly after the list was taken.
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(
            store.hold("nvidia.com/gpu", [GPU2], &cdi).is_none(),
            "nothing new"
        );
        assert!(
            Arc::ptr_eq(&before, &store.current()),
            "the snapshot is not copied for a repeated hand-out"
        );
        // No grace: only a hand-out after the list keeps an unlisted device. The first
        // hand-out came before the list, so the repeated one alone keeps it.
        let grace = std::time::Duration::ZERO;
        let none = BTreeMap::new();
        assert!(store.release(&none, listed, grace).is_none());
        assert_eq!(store.current().held.len(), 1);
        // A list taken after every hand-out names nothing: released.
        let later = Instant::now() + std::time::Duration::from_secs(1);
        let pruned = store.release(&none, later, grace).expect("released");
        assert!(pruned.is_empty());
        assert!(store.current().held.is_empty());
    }
}

#[cfg(test)]
mod state_tests;
