//! Health policy: which events make a device unhealthy, which devices an event reaches, and
//! when a device recovers. Pure: events and times in, transitions out.
//!
//! Fed by the NVML event thread (`nvml_events`) or the sim injector, driven by the health
//! task in the supervisor, which applies the transitions to the device plugin's state.
//!
//! What NVIDIA's plugin does and what we do differently:
//! - same XID filter: XIDs 13, 31, 43, 45, 68, 109 are application errors and ignored by
//!   default; `DP_DISABLE_HEALTHCHECKS` (`all`/`xids`, or a list of extra XIDs to ignore) and
//!   `DP_ENABLE_HEALTHCHECKS` (a list forced on over any disable; `all` counts every XID);
//! - an event on a GPU marks the GPU itself *and* everything backed by it (all replicas,
//!   all MIG slices) unhealthy; an event attributed to one MIG instance marks that slice;
//! - double-bit ECC errors and a lost GPU count too (the incumbent registers ECC but
//!   ignores it);
//! - recovery: once no event has arrived for the quiet period, the GPU is re-probed, and a
//!   successful probe makes it healthy again (the incumbent keeps it unhealthy until the
//!   process restarts).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// XIDs NVIDIA's plugin ignores by default: errors caused by the application, not the GPU.
pub(crate) const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

#[cfg(test)]
/// Default quiet period before a re-probe may bring a device back.
pub(crate) const DEFAULT_QUIET_PERIOD: Duration = Duration::from_secs(60);

/// Which XIDs count as critical.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct XidFilter {
    /// Health checks off (`DP_DISABLE_HEALTHCHECKS=all|xids`).
    pub(crate) disabled: bool,
    /// Ignored XIDs (defaults plus `DP_DISABLE_HEALTHCHECKS` entries).
    pub(crate) ignored: BTreeSet<u64>,
    /// XIDs forced on (`DP_ENABLE_HEALTHCHECKS`).
    pub(crate) enabled: BTreeSet<u64>,
    /// `DP_ENABLE_HEALTHCHECKS=all`: every XID counts.
    pub(crate) enable_all: bool,
}

impl Default for XidFilter {
    fn default() -> Self {
        Self {
            disabled: false,
            ignored: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            enabled: BTreeSet::new(),
            enable_all: false,
        }
    }
}

impl XidFilter {
    /// Build from the values of `DP_DISABLE_HEALTHCHECKS` and `DP_ENABLE_HEALTHCHECKS`.
    /// Entries that are not numbers are ignored, as the incumbent does.
    pub(crate) fn from_env(disable: Option<&str>, enable: Option<&str>) -> Self {
        let mut f = Self::default();
        let list = |s: &str| -> Vec<String> {
            s.split(',')
                .map(|x| x.trim().to_ascii_lowercase())
                .filter(|x| !x.is_empty())
                .collect()
        };
        if let Some(d) = disable {
            for item in list(d) {
                match item.as_str() {
                    "all" | "xids" => f.disabled = true,
                    n => {
                        if let Ok(x) = n.parse() {
                            f.ignored.insert(x);
                        }
                    }
                }
            }
        }
        if let Some(e) = enable {
            for item in list(e) {
                match item.as_str() {
                    "all" | "xids" => f.enable_all = true,
                    n => {
                        if let Ok(x) = n.parse() {
                            f.enabled.insert(x);
                        }
                    }
                }
            }
        }
        f
    }

    /// Whether this XID makes a device unhealthy.
    pub(crate) fn is_critical(&self, xid: u64) -> bool {
        if self.enable_all || self.enabled.contains(&xid) {
            return true;
        }
        !self.disabled && !self.ignored.contains(&xid)
    }

    /// Whether any health checking is on at all.
    pub(crate) fn any_enabled(&self) -> bool {
        !self.disabled || self.enable_all || !self.enabled.is_empty()
    }
}

/// What happened, as the event sources report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EventKind {
    /// XID error with its number.
    Xid(u64),
    /// Double-bit (uncorrectable) ECC error.
    DoubleBitEcc,
    /// Single-bit (corrected) ECC error: logged, never unhealthy.
    SingleBitEcc,
    /// The GPU fell off the bus.
    GpuLost,
    /// Waiting for events failed: the state of every GPU is unknown.
    WaitError(String),
}

/// A health event on a GPU, optionally attributed to one MIG instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// GPU the event was reported on; `None` for events about every GPU (wait errors).
    pub(crate) gpu_uuid: Option<String>,
    /// The MIG device the event is attributed to, already resolved from GI/CI ids.
    pub(crate) mig_uuid: Option<String>,
    /// What happened.
    pub(crate) kind: EventKind,
}

/// A change of health of one physical device (GPU or MIG UUID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transition {
    /// GPU or MIG UUID. Devices backed by a GPU follow its state.
    pub(crate) uuid: String,
    /// Healthy again (`None`) or unhealthy with a reason (`xid-79`, `gpu-lost`, …).
    pub(crate) unhealthy: Option<String>,
}

#[derive(Debug, Clone)]
struct Sick {
    reason: String,
    last_event: Instant,
    /// GPU to re-probe before recovery.
    probe_gpu: String,
}

/// Health state of every physical device that is not healthy.
#[derive(Debug)]
pub(crate) struct Tracker {
    filter: XidFilter,
    quiet: Duration,
    /// All GPUs, for events that concern every GPU.
    gpus: Vec<String>,
    sick: BTreeMap<String, Sick>,
}

impl Tracker {
    /// A tracker for the given GPUs.
    pub(crate) fn new(filter: XidFilter, quiet: Duration, gpus: Vec<String>) -> Self {
        Self {
            filter,
            quiet,
            gpus,
            sick: BTreeMap::new(),
        }
    }

    /// Replace the GPU list after a re-scan; state of GPUs that are gone is dropped.
    pub(crate) fn set_gpus(&mut self, gpus: Vec<String>) {
        self.gpus = gpus;
    }

    #[cfg(test)]
    /// The reason a physical device is unhealthy, if it is.
    pub(crate) fn reason(&self, uuid: &str) -> Option<&str> {
        self.sick.get(uuid).map(|s| s.reason.as_str())
    }

    /// Apply an event. Returns the devices that became unhealthy (a repeat event only
    /// restarts the quiet period).
    pub(crate) fn on_event(&mut self, event: &Event, now: Instant) -> Vec<Transition> {
        let reason = match &event.kind {
            EventKind::Xid(x) if self.filter.is_critical(*x) => format!("xid-{x}"),
            EventKind::Xid(_) | EventKind::SingleBitEcc => return Vec::new(),
            EventKind::DoubleBitEcc if self.filter.any_enabled() && !self.filter.disabled => {
                "double-bit-ecc".to_string()
            }
            EventKind::DoubleBitEcc => return Vec::new(),
            EventKind::GpuLost => "gpu-lost".to_string(),
            EventKind::WaitError(_) => "event-wait-error".to_string(),
        };
        let targets: Vec<(String, String)> = match (&event.gpu_uuid, &event.mig_uuid) {
            (Some(gpu), Some(mig)) => vec![(mig.clone(), gpu.clone())],
            (Some(gpu), None) => vec![(gpu.clone(), gpu.clone())],
            (None, _) => self.gpus.iter().map(|g| (g.clone(), g.clone())).collect(),
        };
        let mut out = Vec::new();
        for (uuid, probe_gpu) in targets {
            match self.sick.get_mut(&uuid) {
                Some(s) => {
                    s.last_event = now;
                    if s.reason != reason {
                        s.reason = reason.clone();
                        out.push(Transition {
                            uuid,
                            unhealthy: Some(reason.clone()),
                        });
                    }
                }
                None => {
                    self.sick.insert(
                        uuid.clone(),
                        Sick {
                            reason: reason.clone(),
                            last_event: now,
                            probe_gpu,
                        },
                    );
                    out.push(Transition {
                        uuid,
                        unhealthy: Some(reason.clone()),
                    });
                }
            }
        }
        out
    }

    /// When the next re-probe is due, if any device is unhealthy.
    pub(crate) fn next_probe_at(&self) -> Option<Instant> {
        self.sick.values().map(|s| s.last_event + self.quiet).min()
    }

    /// GPUs whose devices have been quiet long enough to be re-probed now.
    pub(crate) fn due_for_probe(&self, now: Instant) -> BTreeSet<String> {
        self.sick
            .values()
            .filter(|s| now >= s.last_event + self.quiet)
            .map(|s| s.probe_gpu.clone())
            .collect()
    }

    /// Apply the result of re-probing a GPU: on success every quiet device it backs
    /// recovers; on failure the quiet period starts again.
    pub(crate) fn on_probe(&mut self, gpu: &str, ok: bool, now: Instant) -> Vec<Transition> {
        let quiet = self.quiet;
        let due: Vec<String> = self
            .sick
            .iter()
            .filter(|(_, s)| s.probe_gpu == gpu && now >= s.last_event + quiet)
            .map(|(u, _)| u.clone())
            .collect();
        let mut out = Vec::new();
        for uuid in due {
            if ok {
                self.sick.remove(&uuid);
                out.push(Transition {
                    uuid,
                    unhealthy: None,
                });
            } else if let Some(s) = self.sick.get_mut(&uuid) {
                s.last_event = now;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(gpu: &str, mig: Option<&str>, kind: EventKind) -> Event {
        Event {
            gpu_uuid: Some(gpu.into()),
            mig_uuid: mig.map(Into::into),
            kind,
        }
    }

    #[test]
    fn default_filter_matches_incumbent() {
        let f = XidFilter::default();
        assert!(!f.is_critical(13));
        assert!(!f.is_critical(109));
        assert!(f.is_critical(79));
        assert!(f.is_critical(48));
    }

    #[test]
    fn env_semantics() {
        let f = XidFilter::from_env(Some("all"), None);
        assert!(!f.is_critical(79));
        let f = XidFilter::from_env(Some("79, 48"), None);
        assert!(!f.is_critical(79) && !f.is_critical(48) && f.is_critical(94));
        let f = XidFilter::from_env(Some("xids"), Some("79"));
        assert!(f.is_critical(79) && !f.is_critical(94));
        let f = XidFilter::from_env(None, Some("all"));
        assert!(f.is_critical(13));
        let f = XidFilter::from_env(Some("junk,,"), None);
        assert_eq!(f, XidFilter::default());
    }

    #[test]
    fn xid_marks_then_recovers_after_quiet_and_probe() {
        let t0 = Instant::now();
        let q = Duration::from_secs(10);
        let mut t = Tracker::new(
            XidFilter::default(),
            q,
            vec!["GPU-a".into(), "GPU-b".into()],
        );
        let tr = t.on_event(&ev("GPU-a", None, EventKind::Xid(79)), t0);
        assert_eq!(
            tr,
            vec![Transition {
                uuid: "GPU-a".into(),
                unhealthy: Some("xid-79".into())
            }]
        );
        // Ignored XID: nothing.
        assert!(
            t.on_event(&ev("GPU-b", None, EventKind::Xid(13)), t0)
                .is_empty()
        );
        // A repeat restarts the quiet period without a new transition.
        let t1 = t0 + Duration::from_secs(5);
        assert!(
            t.on_event(&ev("GPU-a", None, EventKind::Xid(79)), t1)
                .is_empty()
        );
        assert_eq!(t.next_probe_at(), Some(t1 + q));
        assert!(t.due_for_probe(t0 + q).is_empty());
        let t2 = t1 + q;
        assert_eq!(
            t.due_for_probe(t2).into_iter().collect::<Vec<_>>(),
            vec!["GPU-a"]
        );
        // A failed probe keeps it unhealthy and restarts the period.
        assert!(t.on_probe("GPU-a", false, t2).is_empty());
        assert_eq!(t.reason("GPU-a"), Some("xid-79"));
        let t3 = t2 + q;
        let tr = t.on_probe("GPU-a", true, t3);
        assert_eq!(tr[0].unhealthy, None);
        assert_eq!(t.next_probe_at(), None);
    }

    #[test]
    fn mig_attributed_event_marks_only_that_slice() {
        let t0 = Instant::now();
        let mut t = Tracker::new(
            XidFilter::default(),
            DEFAULT_QUIET_PERIOD,
            vec!["GPU-a".into()],
        );
        let tr = t.on_event(&ev("GPU-a", Some("MIG-x"), EventKind::Xid(94)), t0);
        assert_eq!(tr.len(), 1);
        assert_eq!(tr[0].uuid, "MIG-x");
        assert_eq!(t.reason("GPU-a"), None);
        // Recovery of the slice re-probes its parent GPU.
        let later = t0 + DEFAULT_QUIET_PERIOD;
        assert!(t.due_for_probe(later).contains("GPU-a"));
    }

    #[test]
    fn wait_error_marks_every_gpu_and_ecc_rules() {
        let t0 = Instant::now();
        let mut t = Tracker::new(
            XidFilter::default(),
            DEFAULT_QUIET_PERIOD,
            vec!["GPU-a".into(), "GPU-b".into()],
        );
        let all = Event {
            gpu_uuid: None,
            mig_uuid: None,
            kind: EventKind::WaitError("unknown".into()),
        };
        assert_eq!(t.on_event(&all, t0).len(), 2);
        let mut t = Tracker::new(
            XidFilter::default(),
            DEFAULT_QUIET_PERIOD,
            vec!["GPU-a".into()],
        );
        assert!(
            t.on_event(&ev("GPU-a", None, EventKind::SingleBitEcc), t0)
                .is_empty()
        );
        assert_eq!(
            t.on_event(&ev("GPU-a", None, EventKind::DoubleBitEcc), t0)
                .len(),
            1
        );
        let mut t = Tracker::new(
            XidFilter::from_env(Some("all"), None),
            DEFAULT_QUIET_PERIOD,
            vec![],
        );
        assert!(
            t.on_event(&ev("GPU-a", None, EventKind::DoubleBitEcc), t0)
                .is_empty()
        );
        // A lost GPU is reported whatever the filter says.
        assert_eq!(
            t.on_event(&ev("GPU-a", None, EventKind::GpuLost), t0).len(),
            1
        );
    }
}
