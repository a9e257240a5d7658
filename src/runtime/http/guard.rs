//! What an HTTP client may hold: a bounded number of connections, each given a bounded time
//! to send its request head, and an accept loop that slows down instead of spinning when
//! the process runs out of file descriptors.
//!
//! The endpoint listens on the node's address (the DaemonSet binds `0.0.0.0:9400`), so any
//! pod that reaches the node can open connections and never send a request. Unbounded,
//! those take every descriptor: `accept` then fails with EMFILE at once, forever (a busy
//! loop, one log line per failure), the liveness probe cannot connect, and the device-plugin
//! gRPC servers of the same process cannot accept the kubelet either. Here:
//! * [`ConnectionLimits::for_this_process`] caps connections at a quarter of the soft
//!   `RLIMIT_NOFILE` (16 to 1024), leaving the rest to gRPC, inotify, NVML and files;
//! * [`Slots`] keeps the open connections oldest first; admitting one past the cap closes
//!   the oldest, so a flood of idle connections cannot lock out the probe that comes after
//!   it (a probe sends its request at once and is served in microseconds);
//! * [`AcceptBackoff`] paces accept errors (5 ms doubling to 1 s, reset on success) and
//!   [`LogEvery`] keeps their log to one line per interval, with the count left out.
//!
//! Used by [`super::serve_with_state`] only; talks to nothing but the OS resource limit. Hand-written:
//! a semaphore does not give "close the oldest", and a rate-limiting crate (governor) is a
//! large dependency for one warning per ten seconds.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// How long a client may take to send a complete request head, from connect (and between
/// keep-alive requests). A probe or scrape sends it at once.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One accept-error warning per this interval at most.
pub(crate) const ACCEPT_WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Bounds of the HTTP endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionLimits {
    /// Open connections at most; one more closes the oldest.
    pub(crate) max_connections: usize,
    /// See [`HEADER_READ_TIMEOUT`].
    pub(crate) header_read_timeout: Duration,
}

impl ConnectionLimits {
    /// A quarter of this process's soft descriptor limit, between 16 and 1024.
    pub(crate) fn for_this_process() -> Self {
        let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(soft, _)| soft);
        Self::for_fd_limit(soft)
    }

    /// The limits for a soft descriptor limit of `nofile`.
    pub(crate) fn for_fd_limit(nofile: u64) -> Self {
        let quarter = usize::try_from(nofile / 4).unwrap_or(usize::MAX);
        Self {
            max_connections: quarter.clamp(16, 1024),
            header_read_timeout: HEADER_READ_TIMEOUT,
        }
    }
}

/// The open connections, oldest first.
#[derive(Debug)]
pub(crate) struct Slots {
    max: usize,
    inner: Mutex<SlotsInner>,
}

#[derive(Debug, Default)]
struct SlotsInner {
    next_id: u64,
    open: BTreeMap<u64, CancellationToken>,
}

/// One admitted connection: its token is cancelled when it must close to make room; the
/// slot frees itself when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    id: u64,
    slots: Arc<Slots>,
    /// Cancelled when this connection is evicted.
    pub(crate) evicted: CancellationToken,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().open.remove(&self.id);
    }
}

impl Slots {
    /// Room for `max` connections (at least one).
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            inner: Mutex::new(SlotsInner::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotsInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admit a new connection; returns its slot and how many older ones were told to close
    /// to stay within the cap.
    pub(crate) fn admit(self: &Arc<Self>) -> (Slot, usize) {
        let mut inner = self.lock();
        let mut evicted = 0;
        while inner.open.len() >= self.max {
            match inner.open.pop_first() {
                Some((_, token)) => {
                    token.cancel();
                    evicted += 1;
                }
                None => break,
            }
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let token = CancellationToken::new();
        inner.open.insert(id, token.clone());
        let slot = Slot {
            id,
            slots: Arc::clone(self),
            evicted: token,
        };
        (slot, evicted)
    }

    /// Close the oldest connection (to free a descriptor after EMFILE); whether there was one.
    pub(crate) fn evict_oldest(&self) -> bool {
        match self.lock().open.pop_first() {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// Connections open now.
    pub(crate) fn len(&self) -> usize {
        self.lock().open.len()
    }
}

/// Delay after a failed accept: 5 ms, doubling to 1 s; a successful accept resets it.
#[derive(Debug, Clone, Default)]
pub(crate) struct AcceptBackoff {
    failures: u32,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1);

    /// The delay before the next accept, after one more failure.
    pub(crate) fn failed(&mut self) -> Duration {
        let delay = Self::FIRST
            .saturating_mul(1 << self.failures.min(16))
            .min(Self::MAX);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    /// An accept succeeded.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Lets one event through per interval and counts the ones held back.
#[derive(Debug, Clone)]
pub(crate) struct LogEvery {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogEvery {
    /// At most one line per `interval`.
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)`: log now, `n` events were held back since the last line; `None`: stay quiet.
    pub(crate) fn ready(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// Whether an accept error means the process or system is out of a resource (descriptors,
/// buffers), which retrying at once cannot cure.
pub(crate) fn is_exhaustion(error: &std::io::Error) -> bool {
    use nix::errno::Errno;
    error.raw_os_error().is_some_and(|code| {
        [Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM]
            .iter()
            .any(|e| *e as i32 == code)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_follow_the_descriptor_limit() {
        assert_eq!(ConnectionLimits::for_fd_limit(256).max_connections, 64);
        assert_eq!(ConnectionLimits::for_fd_limit(20).max_connections, 16);
        assert_eq!(
            ConnectionLimits::for_fd_limit(1 << 20).max_connections,
            1024
        );
        assert_eq!(
            ConnectionLimits::for_fd_limit(u64::MAX).max_connections,
            1024
        );
    }

    #[test]
    fn admitting_past_the_cap_closes_the_oldest() {
        let slots = Slots::new(2);
        let (a, _) = slots.admit();
        let (b, _) = slots.admit();
        assert_eq!(slots.len(), 2);
        let (c, evicted) = slots.admit();
        assert_eq!(evicted, 1);
        assert!(a.evicted.is_cancelled() && !b.evicted.is_cancelled());
        assert_eq!(slots.len(), 2);
        // The evicted connection's task ends and drops its slot: nothing else moves.
        drop(a);
        assert_eq!(slots.len(), 2);
        drop(b);
        assert_eq!(slots.len(), 1);
        assert!(slots.evict_oldest());
        assert!(c.evicted.is_cancelled());
        drop(c);
        assert_eq!(slots.len(), 0);
        assert!(!slots.evict_oldest());
    }

    #[test]
    fn backoff_doubles_to_a_ceiling_and_resets() {
        let mut b = AcceptBackoff::default();
        let delays: Vec<Duration> = (0..10).map(|_| b.failed()).collect();
        assert_eq!(delays[0], Duration::from_millis(5));
        assert_eq!(delays[1], Duration::from_millis(10));
        assert_eq!(delays[9], Duration::from_secs(1));
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        for _ in 0..100 {
            assert!(b.failed() <= Duration::from_secs(1));
        }
        b.reset();
        assert_eq!(b.failed(), Duration::from_millis(5));
    }

    #[test]
    fn log_every_lets_one_line_through_per_interval() {
        let mut log = LogEvery::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(log.ready(t0), Some(0));
        for i in 1..=1000 {
            assert_eq!(log.ready(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(log.ready(t0 + Duration::from_secs(10)), Some(1000));
        assert_eq!(log.ready(t0 + Duration::from_secs(11)), None);
    }

    #[test]
    fn descriptor_exhaustion_is_recognised() {
        let emfile = std::io::Error::from_raw_os_error(nix::errno::Errno::EMFILE as i32);
        assert!(is_exhaustion(&emfile));
        let aborted = std::io::Error::from_raw_os_error(nix::errno::Errno::ECONNABORTED as i32);
        assert!(!is_exhaustion(&aborted));
    }
}
