//! Publishes this node's ResourceSlices and keeps them so: the devices the store's current
//! snapshot serves ([`crate::domain::dra::slices`]), in the layout of the server's version
//! (read once from `/version`: dynamic MIG GPUs' counter sets share slices with their devices
//! up to 1.34 and have slices of their own from 1.35), written through the API
//! ([`crate::platform::kube::SliceApi`]) with an owner reference to the Node (its UID read
//! once), and followed with one LIST and one WATCH on our driver and node.
//!
//! Whenever what is stored differs from what is wanted — the inventory, the plan or a
//! device's health changed, a slice was deleted (the kubelet deletes a node's slices when it
//! starts and a driver's 30 s after it disconnects) or changed by someone else — the whole
//! pool is written again at the next generation (consumers use only the highest one), and
//! slices that are not part of it (an old generation, another split) are deleted. A write the
//! server stored with fields dropped (device taints on a 1.34/1.35 server without the
//! `DRADeviceTaints` gate) is remembered as accepted, so it is not rewritten forever.
//!
//! Failures (the API down, 5xx, 401/403, a cut watch) are retried after a jittered
//! exponential backoff ([`crate::domain::fleet::backoff`]) from a fresh LIST; a 409 (a
//! concurrent writer, a stale cache) or 410 (the watch's version compacted away) lists again
//! at once. The kubelet side of the driver never waits on any of it. Exposes a
//! [`PublishStatus`] watch.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice as ApiSlice;
use kube::api::WatchEvent;
use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;

use crate::domain::dra::model::ResourceSlice;
use crate::domain::dra::slices::{self, SliceFormat, SliceTarget};
use crate::domain::fleet::backoff;
use crate::platform::kube::{KubeError, NodeApi, SliceApi, from_api};
use crate::runtime::{Context, Handle};
use crate::state::Store;

/// Settings of the slice publisher.
#[derive(Debug, Clone)]
pub(crate) struct PublishSettings {
    /// Our slices (driver and node) through the API.
    pub(crate) slices: SliceApi,
    /// The Node, for the owner reference's UID.
    pub(crate) node: NodeApi,
    /// First retry delay (before jitter).
    pub(crate) backoff_base: Duration,
    /// Longest retry delay.
    pub(crate) backoff_cap: Duration,
}

impl PublishSettings {
    /// 500 ms doubling to 30 s, as the node watcher.
    pub(crate) fn new(slices: SliceApi, node: NodeApi) -> Self {
        Self {
            slices,
            node,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(30),
        }
    }
}

/// Where publishing stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PublishStatus {
    /// The pool generation last written or found in place (0: none yet).
    pub(crate) generation: i64,
    /// Slices of the pool at that generation.
    pub(crate) slices: usize,
    /// Successful create, update and delete calls so far.
    pub(crate) writes: u64,
    /// The last failure, cleared by the next pass that converges.
    pub(crate) last_error: Option<String>,
}

/// Starts the publisher; the handle exposes its status.
pub(crate) fn spawn(
    settings: PublishSettings,
    ctx: &Context,
) -> Handle<watch::Receiver<PublishStatus>> {
    let token = ctx.child_token();
    let (tx, rx) = watch::channel(PublishStatus::default());
    let publisher = Publisher {
        s: settings,
        store: ctx.store.clone(),
        node_uid: None,
        format: None,
        warnings: Vec::new(),
        cache: BTreeMap::new(),
        rv: None,
        generation: 0,
        accepted: BTreeMap::new(),
        status: tx,
    };
    ctx.tracker.spawn(publisher.run(token));
    Handle::new(rx)
}

type SliceEvents = Pin<Box<dyn Stream<Item = Result<WatchEvent<ApiSlice>, KubeError>> + Send>>;

/// Why a pass did not converge.
enum Failed {
    /// The API failed or could not be reached: back off, then LIST again.
    Api(KubeError),
    /// 409 / 404 on a write or 410 on the watch: our view is stale, LIST again now.
    Stale(String),
}

struct Publisher {
    s: PublishSettings,
    store: Store,
    node_uid: Option<String>,
    /// The slice layout of the server's version (`None`: not read yet).
    format: Option<SliceFormat>,
    /// The last warnings of the device build (logged when they change).
    warnings: Vec<String>,
    /// Our slices as last seen (LIST, WATCH, our writes' answers), by name.
    cache: BTreeMap<String, ApiSlice>,
    /// The version to watch from; `None`: LIST first.
    rv: Option<String>,
    /// The highest generation written.
    generation: i64,
    /// By slice name: (what we sent, what the server stored) when they differed.
    accepted: BTreeMap<String, (ResourceSlice, ResourceSlice)>,
    status: watch::Sender<PublishStatus>,
}

impl Publisher {
    async fn run(mut self, token: CancellationToken) {
        let jitter = std::collections::hash_map::RandomState::new();
        let mut snapshots = self.store.subscribe();
        let mut events: Option<SliceEvents> = None;
        let mut attempt = 0u32;
        let mut outage = crate::runtime::retry_summary::RetrySummary::default();
        loop {
            let pass = tokio::select! {
                () = token.cancelled() => return,
                r = self.converge(&mut events) => r,
            };
            match pass {
                Ok(()) => {
                    attempt = 0;
                    if let Some(o) = outage.recovered(std::time::Instant::now()) {
                        tracing::info!(driver = self.s.slices.driver(), node = self.s.slices.node(),
                            failures = o.failures, lasted = ?o.lasted, "ResourceSlices published again");
                    }
                }
                Err(failed) => {
                    self.rv = None;
                    events = None;
                    let (message, wait) = match failed {
                        Failed::Stale(m) if attempt == 0 => (m, false),
                        Failed::Stale(m) => (m, true),
                        Failed::Api(e) => (e.to_string(), true),
                    };
                    let delay = wait.then(|| {
                        let mut h = jitter.build_hasher();
                        h.write_u32(attempt);
                        let sample = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
                        backoff(attempt, self.s.backoff_base, self.s.backoff_cap, sample)
                    });
                    // One line per retry with its backoff (kube-client's own error line is
                    // off at the subscriber), a summary a minute at most.
                    tracing::warn!(driver = self.s.slices.driver(), node = self.s.slices.node(),
                        error = %message, attempt, retry_in = ?delay.unwrap_or_default(),
                        "ResourceSlices not published yet; retrying");
                    if let Some(o) = outage.failed(std::time::Instant::now()) {
                        tracing::warn!(driver = self.s.slices.driver(), node = self.s.slices.node(),
                            failures = o.failures, lasted = ?o.lasted,
                            "ResourceSlices still not published; still retrying");
                    }
                    self.status
                        .send_modify(|s| s.last_error = Some(message.clone()));
                    if let Some(delay) = delay {
                        tokio::select! {
                            () = token.cancelled() => return,
                            () = tokio::time::sleep(delay) => {},
                        }
                    }
                    attempt = attempt.saturating_add(1);
                    continue;
                }
            }
            // In sync: wait for the devices to change or the stored slices to.
            let Some(stream) = events.as_mut() else {
                continue;
            };
            tokio::select! {
                () = token.cancelled() => return,
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                event = stream.next() => match event {
                    Some(Ok(event)) => self.apply(event),
                    Some(Err(error)) => {
                        tracing::debug!(node = self.s.slices.node(), %error, "slice watch cut");
                        events = None;
                    }
                    // The server ended the request: watch again from the last version.
                    None => events = None,
                },
            }
        }
    }

    /// One pass: the Node's UID, a LIST when needed, the writes that make the stored pool
    /// the wanted one, and a watch from the last version seen.
    async fn converge(&mut self, events: &mut Option<SliceEvents>) -> Result<(), Failed> {
        if self.node_uid.is_none() {
            let node = self.s.node.get().await.map_err(Failed::Api)?;
            self.node_uid = node.metadata.uid;
        }
        if self.format.is_none() {
            let (major, minor) = self.s.slices.server_version().await.map_err(Failed::Api)?;
            let format = SliceFormat::for_server(&major, &minor);
            tracing::info!(major = %major, minor = %minor, format = ?format, "API server version read");
            self.format = Some(format);
        }
        if self.rv.is_none() {
            let (items, rv) = self.s.slices.list().await.map_err(Failed::Api)?;
            self.cache = items
                .into_iter()
                .filter_map(|s| Some((s.metadata.name.clone()?, s)))
                .collect();
            self.rv = Some(rv);
            *events = None;
        }
        let stored = self.stored_generation();
        let want = self.wanted(stored);
        match self.in_sync(&want) {
            Some(generation) => {
                self.generation = self.generation.max(generation);
                self.status.send_if_modified(|s| {
                    let next = PublishStatus {
                        generation,
                        slices: want.len(),
                        writes: s.writes,
                        last_error: None,
                    };
                    let changed = *s != next;
                    *s = next;
                    changed
                });
            }
            None => self.write().await?,
        }
        if events.is_none() {
            let from = self.rv.clone().unwrap_or_default();
            let stream = self.s.slices.watch(&from).await.map_err(Failed::Api)?;
            *events = Some(Box::pin(stream));
        }
        Ok(())
    }

    /// The highest generation among the stored slices (0: none).
    fn stored_generation(&self) -> i64 {
        self.cache
            .values()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0)
    }

    /// The slices the current snapshot wants, at `generation`.
    fn wanted(&mut self, generation: i64) -> Vec<ResourceSlice> {
        let snapshot = self.store.current();
        let devices = slices::snapshot_devices(&snapshot);
        if devices.warnings != self.warnings {
            for w in &devices.warnings {
                tracing::warn!(warning = %w, "dynamic MIG");
            }
            self.warnings.clone_from(&devices.warnings);
        }
        let target = SliceTarget {
            driver: self.s.slices.driver(),
            node_name: self.s.slices.node(),
            node_uid: self.node_uid.as_deref(),
            generation,
        };
        slices::build_for(&target, &devices, self.format.unwrap_or_default())
    }

    /// The stored pool's generation when it is exactly `want` (same names, one generation,
    /// same content or content the server accepted for it).
    fn in_sync(&self, want: &[ResourceSlice]) -> Option<i64> {
        if self.cache.len() != want.len() {
            return None;
        }
        let mut generation = None;
        for w in want {
            let have = from_api(self.cache.get(&w.metadata.name)?)?;
            if *generation.get_or_insert(have.spec.pool.generation) != have.spec.pool.generation {
                return None;
            }
            let (w, have) = (comparable(w), comparable(&have));
            let accepted = self
                .accepted
                .get(&w.metadata.name)
                .is_some_and(|(sent, stored)| *sent == w && *stored == have);
            if w != have && !accepted {
                return None;
            }
        }
        generation
    }

    /// Write the wanted pool at the next generation, then delete what is not part of it.
    async fn write(&mut self) -> Result<(), Failed> {
        // Set before the first call: a pass cut half-way still moves past this generation.
        self.generation = self.generation.max(self.stored_generation()) + 1;
        let generation = self.generation;
        let want = self.wanted(generation);
        let mut writes = 0u64;
        for slice in &want {
            let name = slice.metadata.name.clone();
            let previous = self
                .cache
                .get(&name)
                .and_then(|s| s.metadata.resource_version.clone());
            let written = match &previous {
                Some(rv) => self.s.slices.replace(slice, rv).await,
                None => self.s.slices.create(slice).await,
            };
            let stored = match written {
                Ok(s) => s,
                Err(e) if matches!(e.status_code(), Some(404 | 409)) => {
                    return Err(Failed::Stale(e.to_string()));
                }
                Err(e) => return Err(Failed::Api(e)),
            };
            writes += 1;
            self.note_accepted(slice, &stored);
            self.cache.insert(name, stored);
        }
        let stale: Vec<String> = self
            .cache
            .keys()
            .filter(|n| !want.iter().any(|w| &w.metadata.name == *n))
            .cloned()
            .collect();
        for name in stale {
            self.s.slices.delete(&name).await.map_err(Failed::Api)?;
            writes += 1;
            self.cache.remove(&name);
            self.accepted.remove(&name);
        }
        tracing::info!(
            driver = self.s.slices.driver(),
            node = self.s.slices.node(),
            generation,
            slices = want.len(),
            devices = want.iter().map(|s| s.spec.devices.len()).sum::<usize>(),
            "ResourceSlices published"
        );
        self.status.send_modify(|s| {
            s.generation = generation;
            s.slices = want.len();
            s.writes += writes;
            s.last_error = None;
        });
        Ok(())
    }

    /// Remember a write the server stored differently from what was sent.
    fn note_accepted(&mut self, sent: &ResourceSlice, stored: &ApiSlice) {
        let name = sent.metadata.name.clone();
        match from_api(stored).map(|s| comparable(&s)) {
            Some(have) if have != comparable(sent) => {
                tracing::warn!(
                    slice = %name,
                    "the API server stored the slice with fields dropped (DRADeviceTaints off?); kept as it is"
                );
                self.accepted.insert(name, (comparable(sent), have));
            }
            _ => {
                self.accepted.remove(&name);
            }
        }
    }

    /// A watch event into the cache.
    fn apply(&mut self, event: WatchEvent<ApiSlice>) {
        match event {
            WatchEvent::Added(s) | WatchEvent::Modified(s) => {
                self.rv.clone_from(&s.metadata.resource_version);
                if let Some(name) = s.metadata.name.clone() {
                    self.cache.insert(name, s);
                }
            }
            WatchEvent::Deleted(s) => {
                self.rv.clone_from(&s.metadata.resource_version);
                if let Some(name) = &s.metadata.name {
                    tracing::info!(slice = %name, "ResourceSlice deleted; writing the pool again");
                    self.cache.remove(name);
                }
            }
            WatchEvent::Bookmark(b) => self.rv = Some(b.metadata.resource_version),
            WatchEvent::Error(e) => {
                // 410: our version is gone; anything else: start over the same way.
                tracing::debug!(code = e.code, message = %e.message, "slice watch error");
                self.rv = None;
            }
        }
    }
}

/// What is compared between a wanted and a stored slice: the fields we set, the generation
/// left out (the wanted one does not have one yet).
fn comparable(s: &ResourceSlice) -> ResourceSlice {
    let mut c = s.clone();
    c.spec.pool.generation = 0;
    c.metadata.generate_name.clear();
    c
}
