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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use crate::domain::allocate::view::{self, HealthUpdate, Overlay, ResourceView, StateError};
use crate::domain::inventory::Health;
pub use crate::domain::snapshot::{Held, HeldDevice, Snapshot};

/// The shared handle on the state. Cheap to clone; every clone sees the same state.
#[derive(Debug, Clone)]
pub struct Store {
    tx: Arc<watch::Sender<Arc<Snapshot>>>,
}

impl Store {
    /// A store starting from `initial`.
    pub fn new(initial: Snapshot) -> Self {
        Self {
            tx: Arc::new(watch::Sender::new(Arc::new(initial))),
        }
    }

    /// The current snapshot: read everything a request needs from this one value.
    pub fn current(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// Follow the state; the receiver sees the current snapshot at once.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// The current view of one resource.
    pub fn view(&self, resource: &str) -> Option<Arc<ResourceView>> {
        self.tx.borrow().views.get(resource).cloned()
    }

    /// Names of the served resources.
    pub fn resource_names(&self) -> Vec<String> {
        self.tx.borrow().resource_names()
    }

    /// Apply the snapshot a transition computed. Health and held devices may have moved
    /// since it ran: the current overlay and held set are kept, and views are recomputed
    /// under that overlay; unchanged resources keep their view (same `Arc`), so their
    /// streams stay quiet. Returns the committed snapshot.
    pub fn commit(&self, next: Snapshot) -> Arc<Snapshot> {
        let mut out = None;
        self.tx.send_modify(|current| {
            let generation = current.generation + 1;
            let views = view::views(&next.plan, &current.overlay, &current.views, generation);
            let snapshot = Arc::new(Snapshot {
                generation,
                overlay: current.overlay.clone(),
                views: Arc::new(views),
                held: current.held.clone(),
                ..next
            });
            out = Some(snapshot.clone());
            *current = snapshot;
        });
        out.unwrap_or_else(|| self.current())
    }

    /// Apply a health event (`key` = GPU UUID, MIG UUID or device ID) and publish the views
    /// it changed. Returns the names of the resources whose view changed.
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
        let mut result = Ok(BTreeSet::new());
        self.tx.send_if_modified(|current| {
            let mut overlay = Overlay::clone(&current.overlay);
            if let Err(e) = overlay.apply(&current.plan, &update) {
                result = Err(e);
                return false;
            }
            let generation = current.generation + 1;
            let views = view::views(&current.plan, &overlay, &current.views, generation);
            let changed = view::changed(&current.views, &views);
            if changed.is_empty() {
                // Same health as before (a repeated event): keep the overlay in step but
                // wake nobody.
                let mut next = Snapshot::clone(current);
                next.overlay = Arc::new(overlay);
                *current = Arc::new(next);
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
    pub fn hold<'a>(
        &self,
        resource: &str,
        ids: impl IntoIterator<Item = &'a str>,
        cdi: &BTreeSet<String>,
    ) -> Option<Arc<Held>> {
        let now = Instant::now();
        let mut grown = None;
        // Holding changes no answer: readers are not woken for it.
        self.tx.send_if_modified(|current| {
            let mut held = Held::clone(&current.held);
            let grew = held.record(resource, ids, cdi, now);
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
    pub fn release(
        &self,
        in_use: &BTreeMap<String, BTreeSet<String>>,
        taken_at: Instant,
        grace: std::time::Duration,
    ) -> Option<Arc<Held>> {
        let mut pruned = None;
        self.tx.send_if_modified(|current| {
            let mut held = Held::clone(&current.held);
            if !held.prune(in_use, taken_at, grace) {
                return false;
            }
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
