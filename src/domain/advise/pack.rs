//! Shares and packing: the smallest share that holds each sharing candidate's peak plus
//! headroom and its p95 compute, and the GPUs of its model those shares are packed onto.
//!
//! A share is a MIG instance (the smallest profile of the model with memory ≥ the grant and
//! compute slices ≥ the p95) or one of `k` memory-enforced time-sliced replicas (`k` from
//! [`REPLICA_STEPS`], at most ⌊GPU memory / grant⌋). Items of one *group* are packed together:
//! all MIG items of a model (a GPU holds any profiles a valid layout places, checked with the
//! real placement rules, [`node_spec::search_placements`]), or all items with the same `k`
//! (a GPU holds at most `k`). On every GPU the items' p95 compute sums to at most 1.
//! Packing is first-fit decreasing (by grant, then compute), or an exact branch and bound
//! over the same test for groups of few items. The lower bound is the largest of
//! ⌈Σ grants / GPU memory⌉, ⌈Σ p95⌉ and the number of items over half a GPU (no two of
//! those share one).

use node_spec::{GiProfile, Product, gi_profiles, lookup_product, search_placements};

/// Slack on compute sums, so that ratios summing to 1 in decimal do not fail in binary.
const EPS: f64 = 1e-9;

/// One share to place: one pod of a sharing candidate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Item {
    /// Index of its workload in the advice's workload list.
    pub(crate) workload: usize,
    /// Memory it must get, bytes (peak + headroom).
    pub(crate) grant_bytes: u64,
    /// p95 compute, 0–1 of a GPU.
    pub(crate) compute_p95: f64,
    /// Mean compute, for the projection.
    pub(crate) compute_mean: f64,
    /// Its smallest MIG profile on this model, if any holds it.
    pub(crate) profile: Option<&'static GiProfile>,
}

/// The GPU model items are packed onto.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Model {
    /// The MIG product, when the tables know one.
    pub(crate) product: Option<&'static Product>,
    /// Memory of one GPU, bytes.
    pub(crate) memory_bytes: u64,
}

impl Model {
    /// The model of an NVML product name with this much memory.
    pub(crate) fn new(product_name: &str, memory_bytes: u64) -> Self {
        Model {
            product: lookup_product(product_name).filter(|p| !gi_profiles(p).is_empty()),
            memory_bytes,
        }
    }

    /// Memory a MIG instance of `profile` gets: its share of memory slices of the GPU (as
    /// the sim backend and the fake driver report it).
    pub(crate) fn profile_bytes(&self, profile: &GiProfile) -> u64 {
        match self.product {
            Some(p) => {
                self.memory_bytes / u64::from(p.memory_slices) * u64::from(profile.memory_slices)
            }
            None => 0,
        }
    }

    /// The smallest MIG profile (memory slices, then compute slices) holding `grant` bytes
    /// and `p95` of the GPU's compute; `+me` profiles (media engines) are never proposed.
    pub(crate) fn smallest_profile(&self, grant: u64, p95: f64) -> Option<&'static GiProfile> {
        let product = self.product?;
        gi_profiles(product)
            .iter()
            .filter(|g| !g.name.contains("+me"))
            .filter(|g| self.profile_bytes(g) >= grant)
            .filter(|g| {
                f64::from(g.compute_slices) / f64::from(product.compute_slices) + EPS >= p95
            })
            .min_by_key(|g| (g.memory_slices, g.compute_slices, g.name))
    }

    /// Replicas per GPU when the largest grant is `grant`: ⌊memory / grant⌋.
    pub(crate) fn replicas_for(&self, grant: u64) -> u64 {
        self.memory_bytes.checked_div(grant).unwrap_or(u64::MAX)
    }
}

/// The share a sharing candidate gets on its model, decided per workload so that all its
/// pods ask for the same resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ShareKind {
    /// A MIG instance of this profile.
    Mig(&'static str),
    /// One of `k` memory-enforced time-sliced replicas of a GPU.
    Replicas(u64),
}

/// Replica counts offered: few distinct configs rather than one per workload size.
pub(crate) const REPLICA_STEPS: &[u64] = &[2, 3, 4, 6, 8, 12, 16, 24, 32];

impl Model {
    /// The replica count of the largest step whose replicas still hold `grant` bytes.
    pub(crate) fn replica_step(&self, grant: u64) -> Option<u64> {
        let k = self.replicas_for(grant);
        REPLICA_STEPS.iter().rev().copied().find(|&s| s <= k)
    }

    /// Memory of one of `k` replicas, bytes (whole MiB: the config writes `memory` in Mi).
    pub(crate) fn replica_bytes(&self, k: u64) -> u64 {
        self.memory_bytes / k / (1 << 20) * (1 << 20)
    }

    /// The share for a workload needing `grant` bytes and `p95` compute: the one taking the
    /// smaller fraction of a GPU (memory or compute, whichever is more), ties to MIG (its
    /// compute is its own). `None`: nothing smaller than a whole GPU holds it.
    pub(crate) fn share_for(&self, grant: u64, p95: f64) -> Option<ShareKind> {
        let mig = self.smallest_profile(grant, p95).and_then(|g| {
            let product = self.product?;
            // The full-GPU profile is no share.
            (g.compute_slices < product.compute_slices).then(|| {
                let frac = (f64::from(g.memory_slices) / f64::from(product.memory_slices))
                    .max(f64::from(g.compute_slices) / f64::from(product.compute_slices));
                (frac, ShareKind::Mig(g.name))
            })
        });
        let replicas = self
            .replica_step(grant)
            .filter(|_| p95 < 1.0)
            .map(|k| ((1.0 / k as f64).max(p95), ShareKind::Replicas(k)));
        match (mig, replicas) {
            (Some(m), Some(r)) => Some(if r.0 < m.0 - EPS { r.1 } else { m.1 }),
            (m, r) => m.or(r).map(|x| x.1),
        }
    }
}

/// How a packed GPU is configured.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum GpuShape {
    /// One pod takes it whole.
    Whole,
    /// MIG with these profiles (sorted by name).
    Mig(Vec<&'static str>),
    /// `replicas` memory-enforced time-sliced replicas of `memory_bytes` each.
    Replicas {
        /// Replicas on the GPU.
        replicas: u64,
        /// Memory limit of each, bytes.
        memory_bytes: u64,
    },
}

/// A packed GPU.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bin {
    /// Its configuration.
    pub(crate) shape: GpuShape,
    /// Items on it (indices into the item list).
    pub(crate) items: Vec<usize>,
}

/// Running totals of a bin under construction, for the quick rejections.
#[derive(Debug, Clone, Default)]
struct Open {
    items: Vec<usize>,
    p95: f64,
    slices: u32,
}

fn mig_feasible(product: &Product, items: &[Item], members: &[usize]) -> bool {
    let profiles: Vec<&'static GiProfile> =
        members.iter().filter_map(|&i| items[i].profile).collect();
    profiles.len() == members.len() && search_placements(product, &profiles, &[]).is_some()
}

impl Open {
    /// Whether `i` may join a bin of `kind`; updates the bin when it does.
    fn try_add(&mut self, model: &Model, kind: ShareKind, items: &[Item], i: usize) -> bool {
        let it = &items[i];
        let slices = it.profile.map_or(0, |p| p.memory_slices);
        if !self.items.is_empty() && self.p95 + it.compute_p95 > 1.0 + EPS {
            return false;
        }
        let fits = match kind {
            ShareKind::Replicas(k) => (self.items.len() as u64) < k,
            ShareKind::Mig(_) => match model.product {
                Some(product) => {
                    self.slices + slices <= product.memory_slices && {
                        self.items.push(i);
                        let ok = mig_feasible(product, items, &self.items);
                        self.items.pop();
                        ok
                    }
                }
                None => false,
            },
        };
        if fits {
            self.items.push(i);
            self.p95 += it.compute_p95;
            self.slices += slices;
        }
        fits
    }

    fn close(self, model: &Model, kind: ShareKind, items: &[Item]) -> Bin {
        let shape = match kind {
            ShareKind::Mig(_) => {
                let mut names: Vec<&'static str> = self
                    .items
                    .iter()
                    .filter_map(|&i| items[i].profile.map(|p| p.name))
                    .collect();
                names.sort_unstable();
                GpuShape::Mig(names)
            }
            ShareKind::Replicas(k) => GpuShape::Replicas {
                replicas: k,
                memory_bytes: model.replica_bytes(k),
            },
        };
        Bin {
            shape,
            items: self.items,
        }
    }

    /// No item of `min_p95` compute and `min_slices` fits any more.
    fn full(&self, model: &Model, kind: ShareKind, min_p95: f64, min_slices: u32) -> bool {
        self.p95 + min_p95 > 1.0 + EPS
            || match kind {
                ShareKind::Replicas(k) => self.items.len() as u64 >= k,
                ShareKind::Mig(_) => model
                    .product
                    .is_none_or(|p| self.slices + min_slices > p.memory_slices),
            }
    }
}

/// The order items are packed in: largest grant first, then compute, then workload.
fn order(items: &[Item]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..items.len()).collect();
    idx.sort_by(|&a, &b| {
        let (x, y) = (&items[a], &items[b]);
        y.grant_bytes
            .cmp(&x.grant_bytes)
            .then(y.compute_p95.total_cmp(&x.compute_p95))
            .then(x.workload.cmp(&y.workload))
            .then(a.cmp(&b))
    });
    idx
}

/// First-fit decreasing of `items` (all of one `kind`: the same replica count, or MIG).
pub(crate) fn first_fit_decreasing(model: &Model, kind: ShareKind, items: &[Item]) -> Vec<Bin> {
    let mut bins: Vec<Open> = Vec::new();
    // Bins before `first_open` cannot take even the smallest item still to come.
    let mut first_open = 0;
    let min_p95 = items.iter().map(|i| i.compute_p95).fold(1.0, f64::min);
    let min_slices = items
        .iter()
        .map(|i| i.profile.map_or(0, |p| p.memory_slices))
        .min()
        .unwrap_or(0);
    for i in order(items) {
        let placed = bins
            .iter_mut()
            .skip(first_open)
            .any(|b| b.try_add(model, kind, items, i));
        if !placed {
            let mut b = Open::default();
            b.try_add(model, kind, items, i);
            bins.push(b);
        }
        while bins
            .get(first_open)
            .is_some_and(|b| b.full(model, kind, min_p95, min_slices))
        {
            first_open += 1;
        }
    }
    bins.into_iter()
        .map(|b| b.close(model, kind, items))
        .collect()
}

/// The lower bound on GPUs for these items.
pub(crate) fn lower_bound(model: &Model, items: &[Item]) -> usize {
    if items.is_empty() || model.memory_bytes == 0 {
        return 0;
    }
    let grant: u64 = items.iter().map(|i| i.grant_bytes).sum();
    let by_memory = grant.div_ceil(model.memory_bytes) as usize;
    let p95: f64 = items.iter().map(|i| i.compute_p95).sum();
    let by_compute = (p95 - EPS).max(0.0).ceil() as usize;
    let big = items
        .iter()
        .filter(|i| i.grant_bytes * 2 > model.memory_bytes)
        .count();
    by_memory.max(by_compute).max(big).max(1)
}

/// The fewest bins for `items` of one `kind`, found exhaustively (branch and bound over the
/// FFD order, a new bin opened once per level, stopping at the lower bound). `None` above
/// `limit` items.
pub(crate) fn exact(
    model: &Model,
    kind: ShareKind,
    items: &[Item],
    limit: usize,
) -> Option<Vec<Bin>> {
    if items.len() > limit {
        return None;
    }
    struct Search<'a> {
        model: &'a Model,
        kind: ShareKind,
        items: &'a [Item],
        order: Vec<usize>,
        bins: Vec<Open>,
        best: Option<Vec<Open>>,
        best_len: usize,
        bound: usize,
    }
    impl Search<'_> {
        fn go(&mut self, depth: usize) {
            if self.best_len <= self.bound {
                return;
            }
            if depth == self.order.len() {
                if self.bins.len() < self.best_len {
                    self.best_len = self.bins.len();
                    self.best = Some(self.bins.clone());
                }
                return;
            }
            let i = self.order[depth];
            for b in 0..self.bins.len() {
                let saved = self.bins[b].clone();
                if self.bins[b].try_add(self.model, self.kind, self.items, i) {
                    self.go(depth + 1);
                }
                self.bins[b] = saved;
            }
            if self.bins.len() + 1 < self.best_len {
                let mut o = Open::default();
                o.try_add(self.model, self.kind, self.items, i);
                self.bins.push(o);
                self.go(depth + 1);
                self.bins.pop();
            }
        }
    }
    let ffd = first_fit_decreasing(model, kind, items);
    let mut s = Search {
        model,
        kind,
        items,
        order: order(items),
        bins: Vec::new(),
        best: None,
        best_len: ffd.len(),
        bound: lower_bound(model, items),
    };
    s.go(0);
    Some(match s.best {
        Some(found) => found
            .into_iter()
            .map(|b| b.close(model, kind, items))
            .collect(),
        None => ffd,
    })
}
