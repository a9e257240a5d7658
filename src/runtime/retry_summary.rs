//! How long a retried API call has been failing, for one summary line a minute at most:
//! each retry logs its own WARN (with its backoff); an outage of minutes would otherwise
//! give no sense of how long it has lasted. The node watcher, the fleet reporter and the DRA
//! slice publisher each keep one. Time is passed in, so the rule is tested without clocks.

use std::time::{Duration, Instant};

/// The interval between summaries.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// Failures since the last success.
#[derive(Debug, Clone)]
pub(crate) struct RetrySummary {
    every: Duration,
    since: Option<Instant>,
    failures: u32,
    last: Option<Instant>,
}

/// What a summary line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outage {
    /// Failed tries since the last success.
    pub(crate) failures: u32,
    /// Time since the first of them.
    pub(crate) lasted: Duration,
}

impl Default for RetrySummary {
    fn default() -> Self {
        Self::new(SUMMARY_EVERY)
    }
}

impl RetrySummary {
    /// A summary at most every `every`.
    pub(crate) fn new(every: Duration) -> Self {
        Self {
            every,
            since: None,
            failures: 0,
            last: None,
        }
    }

    /// One more failure at `now`: `Some` when a summary is due (`every` after the first
    /// failure, then `every` after the last summary).
    pub(crate) fn failed(&mut self, now: Instant) -> Option<Outage> {
        let since = *self.since.get_or_insert(now);
        self.failures = self.failures.saturating_add(1);
        let from = self.last.unwrap_or(since);
        if now.saturating_duration_since(from) < self.every {
            return None;
        }
        self.last = Some(now);
        Some(Outage {
            failures: self.failures,
            lasted: now.saturating_duration_since(since),
        })
    }

    /// A success at `now`: the outage it ends, when there was one.
    pub(crate) fn recovered(&mut self, now: Instant) -> Option<Outage> {
        let since = self.since.take()?;
        let outage = Outage {
            failures: self.failures,
            lasted: now.saturating_duration_since(since),
        };
        self.failures = 0;
        self.last = None;
        Some(outage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_summary_a_minute_at_most_and_the_end_of_an_outage_once() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut r = RetrySummary::default();
        assert_eq!(r.recovered(t0), None, "no outage, nothing to say");
        // Retries at 0, 10, ..., 170 s: summaries at 60 and 120 s only.
        let due: Vec<u64> = (0..18)
            .map(|i| i * 10)
            .filter(|&t| r.failed(t0 + s(t)).is_some())
            .collect();
        assert_eq!(due, [60, 120]);
        assert_eq!(
            r.failed(t0 + s(180)),
            Some(Outage {
                failures: 19,
                lasted: s(180)
            })
        );
        assert_eq!(
            r.recovered(t0 + s(185)),
            Some(Outage {
                failures: 19,
                lasted: s(185)
            })
        );
        assert_eq!(r.recovered(t0 + s(186)), None);
        // A new outage counts from its own start.
        assert_eq!(r.failed(t0 + s(200)), None);
        assert!(r.failed(t0 + s(260)).is_some());
    }
}
