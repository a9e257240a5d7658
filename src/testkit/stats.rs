//! The benches' one percentile: nearest rank on the sorted samples, the rank rounded from
//! `(n - 1) * q` (so `q = 0.5` of an even count is the upper middle, as a median by index
//! `n / 2`). Used by every bench in `benches/`.

use std::time::Duration;

/// The `q`-quantile (0.0 ..= 1.0) of `samples`, in any order; zero when there are none.
pub fn percentile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let Some(last) = sorted.len().checked_sub(1) else {
        return Duration::ZERO;
    };
    // In range by construction: q is clamped and `last` is an index.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((last as f64) * q.clamp(0.0, 1.0)).round() as usize;
    sorted[i.min(last)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_of_unsorted_samples() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|m| Duration::from_millis(*m))
                .collect::<Vec<_>>()
        };
        let v = ms(&[40, 10, 30, 20]);
        assert_eq!(
            percentile(&v, 0.5),
            Duration::from_millis(30),
            "upper middle, as v[n/2]"
        );
        assert_eq!(percentile(&v, 0.0), Duration::from_millis(10));
        assert_eq!(percentile(&v, 1.0), Duration::from_millis(40));
        assert_eq!(percentile(&ms(&[5, 1, 3]), 0.5), Duration::from_millis(3));
        assert_eq!(percentile(&[], 0.99), Duration::ZERO);
    }
}
