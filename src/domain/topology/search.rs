//! The best-connected subset: choose `k` of `m` candidates (some forced) maximising the sum of
//! pair scores, by depth-first search over include/exclude decisions in candidate order with
//! branch and bound.
//!
//! Bound: a set's score grows, for each added candidate c, by its score to the already chosen
//! ones plus half its scores to the other added ones; the latter is at most half the sum of
//! c's `r - 1` best scores to any free candidate (prefix sums of its sorted row, precomputed),
//! so the best `r` of those per-candidate bounds cap what a branch can still reach. Exact when
//! no node budget is given (used up to 16 candidates); beyond that a greedy answer is the
//! starting incumbent and the search stops after a node budget, returning the best found.
//! Ties go to the lexicographically first set in candidate order, so callers sort candidates
//! (by bus ID) to be deterministic whatever order the IDs arrived in.

/// Largest candidate count searched exactly.
pub(crate) const EXACT_LIMIT: usize = 16;

/// Search nodes allowed beyond [`EXACT_LIMIT`].
const NODE_BUDGET: u64 = 200_000;

/// Result of [`best_subset`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Best {
    /// Chosen candidate indices, ascending, forced ones included.
    pub(crate) set: Vec<usize>,
    /// Sum of pair scores of the set.
    pub(crate) score: u64,
    /// The search ran to completion (the optimum).
    pub(crate) exact: bool,
}

struct Search<'a> {
    s: &'a [u64],
    m: usize,
    k: usize,
    free: Vec<usize>,
    /// For free candidate at free-position p: prefix sums of its sorted scores to the other
    /// free candidates (descending), `pre[p][t]` = sum of the best t.
    pre: Vec<Vec<u64>>,
    best: Option<(u64, Vec<usize>)>,
    nodes: u64,
    budget: Option<u64>,
    scratch: Vec<u64>,
}

/// Choose `k` of `m` candidates including all of `forced`; `s` is the symmetric m×m score
/// matrix. `None` when `k > m` or `forced` has more than `k` entries.
pub(crate) fn best_subset(s: &[u64], m: usize, forced: &[usize], k: usize) -> Option<Best> {
    let mut is_forced = vec![false; m];
    for &f in forced {
        *is_forced.get_mut(f)? = true;
    }
    let chosen: Vec<usize> = (0..m).filter(|&i| is_forced[i]).collect();
    if chosen.len() > k || k > m {
        return None;
    }
    let free: Vec<usize> = (0..m).filter(|&i| !is_forced[i]).collect();
    let pre = free
        .iter()
        .map(|&c| {
            let mut row: Vec<u64> = free
                .iter()
                .filter(|&&d| d != c)
                .map(|&d| s[c * m + d])
                .collect();
            row.sort_unstable_by(|a, b| b.cmp(a));
            let mut acc = vec![0u64];
            for v in row {
                let last = acc.last().copied().unwrap_or(0);
                acc.push(last + v);
            }
            acc
        })
        .collect();
    let base: u64 = pairs_score(s, m, &chosen);
    let gain: Vec<u64> = free
        .iter()
        .map(|&c| chosen.iter().map(|&x| s[c * m + x]).sum())
        .collect();
    let exact_search = m <= EXACT_LIMIT;
    let mut search = Search {
        s,
        m,
        k,
        pre,
        best: None,
        nodes: 0,
        budget: (!exact_search).then_some(NODE_BUDGET),
        scratch: Vec::with_capacity(free.len()),
        free,
    };
    if !exact_search {
        let g = greedy(s, m, &chosen, &search.free, k);
        search.best = Some((pairs_score(s, m, &g), g));
    }
    let mut set = chosen;
    search.dfs(0, &mut set, base, gain);
    let exact = search.budget.is_none_or(|b| search.nodes < b);
    let (score, mut set) = search.best?;
    set.sort_unstable();
    Some(Best { set, score, exact })
}

/// Sum of pair scores within `set`.
pub(crate) fn pairs_score(s: &[u64], m: usize, set: &[usize]) -> u64 {
    let mut t = 0;
    for (i, &a) in set.iter().enumerate() {
        for &b in &set[i + 1..] {
            t += s[a * m + b];
        }
    }
    t
}

/// Add the candidate with the largest gain until `k` are chosen (ties: lowest index).
fn greedy(s: &[u64], m: usize, chosen: &[usize], free: &[usize], k: usize) -> Vec<usize> {
    let mut set = chosen.to_vec();
    let mut left: Vec<usize> = free.to_vec();
    while set.len() < k && !left.is_empty() {
        let gain = |c: usize| -> u64 { set.iter().map(|&x| s[c * m + x]).sum() };
        let mut best = 0;
        for p in 1..left.len() {
            if gain(left[p]) > gain(left[best]) {
                best = p;
            }
        }
        set.push(left.remove(best));
    }
    set
}

impl Search<'_> {
    /// `gain[p]`: score of free candidate p to the chosen set; `pos`: next free candidate.
    fn dfs(&mut self, pos: usize, set: &mut Vec<usize>, cur: u64, mut gain: Vec<u64>) {
        self.nodes += 1;
        if self.budget.is_some_and(|b| self.nodes >= b) {
            return;
        }
        let r = self.k - set.len();
        if r == 0 {
            if self.best.as_ref().is_none_or(|(b, _)| cur > *b) {
                self.best = Some((cur, set.clone()));
            }
            return;
        }
        if self.free.len() - pos < r {
            return;
        }
        if let Some((b, _)) = &self.best {
            let b = *b;
            self.scratch.clear();
            for (pre, g) in self.pre[pos..].iter().zip(&gain[pos..]) {
                let half = pre[(r - 1).min(pre.len() - 1)].div_ceil(2);
                self.scratch.push(g + half);
            }
            self.scratch.sort_unstable_by(|a, b| b.cmp(a));
            let ub: u64 = cur + self.scratch[..r].iter().sum::<u64>();
            if ub <= b {
                return;
            }
        }
        // Include free[pos].
        let c = self.free[pos];
        let mut with = gain.clone();
        for (p, g) in with.iter_mut().enumerate().skip(pos + 1) {
            *g += self.s[self.free[p] * self.m + c];
        }
        set.push(c);
        self.dfs(pos + 1, set, cur + gain[pos], with);
        set.pop();
        // Exclude it.
        gain[pos] = 0;
        self.dfs(pos + 1, set, cur, gain);
    }
}
