//! GetPreferredAllocation policies, computed from the in-memory view only.
//!
//! - Whole GPUs: NUMA-aware — keep the answer on one NUMA node (the must-include devices'
//!   node first, else the node that fits the request most tightly), spilling over only when
//!   no node has enough.
//! - Replicas and MIG devices: `packed` fills the physical device (GPU for MIG slices) with
//!   the most allocated-or-picked units first; `distributed` takes from the least loaded one.
//!   Replicas of a resource without `allowMultiGpu` are kept on one physical device when one
//!   has room, so the hint never leads to an Allocate that the rules refuse.
//!
//! - With a topology (whole GPUs, and replicas of whole GPUs spread over several GPUs by
//!   `allowMultiGpu`): the set of GPUs with the best links (NVLink count, then PCIe
//!   distance, then NUMA), found by [`best_subset`]; a one-GPU request takes the GPU with
//!   the weakest links to the other free ones, keeping well-connected sets whole.
//!
//! The answer is a hint and an error fails pod admission, so [`preferred`] never fails: it
//! always returns the must-include IDs, then the best picks, then any other available ID.
//! Work is index-based (one binary search per ID, no per-call string hashing) because the
//! kubelet sends every free ID on each call.

use std::collections::{BTreeMap, HashSet};

use crate::domain::config::AllocationPolicy;
use crate::domain::plan::ResourceKind;

use crate::domain::topology::ResourceLinks;
use crate::domain::topology::search::best_subset;

use crate::domain::view::ResourceView;

/// Pick `size` IDs out of `available`, including every ID of `must_include`.
///
/// The result has no duplicates, starts with `must_include`, and has
/// `min(size, |must_include ∪ available|)` entries when `must_include` fits in `size`.
pub(crate) fn preferred<S: AsRef<str>>(
    view: &ResourceView,
    policy: AllocationPolicy,
    available: &[S],
    must_include: &[S],
    size: usize,
) -> Vec<String> {
    let mut answer = Answer::new(view, must_include, size);
    if answer.out.len() >= size {
        return answer.out;
    }
    let offered = answer.offered(view, available);
    let mut load = offered.load(view, &answer.must);
    let need = size - answer.out.len();
    let picks = pick(
        view,
        policy,
        &offered.known,
        &answer.must,
        &mut load,
        need,
        size,
    );
    answer.finish(view, picks, &offered, size)
}

/// The answer being built: the IDs in order, and which are in it (or queued) already.
struct Answer<'a> {
    out: Vec<String>,
    /// Known devices in the answer or queued, by index.
    taken: Vec<bool>,
    /// IDs the view does not know, in the answer or queued.
    taken_unknown: HashSet<&'a str>,
    /// The must-include devices the view knows, by index.
    must: Vec<usize>,
}

/// What the kubelet offered, read against the view.
struct Offered<'a> {
    /// Healthy known candidates not in the answer, in index (= ID) order.
    known: Vec<usize>,
    /// Offered IDs to use only when nothing better is left: unhealthy or unknown ones.
    fallback: Vec<&'a str>,
    /// Known devices offered, by index.
    seen: Vec<bool>,
    /// Offered devices per group (physical device).
    free_in_group: Vec<usize>,
}

impl<'a> Answer<'a> {
    /// The answer that starts with `must_include`, each ID once.
    fn new<S: AsRef<str>>(view: &ResourceView, must_include: &'a [S], size: usize) -> Self {
        let mut answer = Answer {
            out: Vec::with_capacity(size.max(must_include.len())),
            taken: vec![false; view.resource.devices.len()],
            taken_unknown: HashSet::new(),
            must: Vec::with_capacity(must_include.len()),
        };
        for id in must_include {
            let id = id.as_ref();
            let fresh = match view.index_of(id) {
                Some(i) => {
                    answer.must.push(i);
                    !std::mem::replace(&mut answer.taken[i], true)
                }
                None => answer.taken_unknown.insert(id),
            };
            if fresh {
                answer.out.push(id.to_string());
            }
        }
        answer
    }

    /// Read `available`: healthy candidates, fallbacks and what each group has free.
    fn offered<S: AsRef<str>>(&mut self, view: &ResourceView, available: &'a [S]) -> Offered<'a> {
        let n = view.resource.devices.len();
        let mut offered = Offered {
            known: Vec::with_capacity(available.len()),
            fallback: Vec::new(),
            seen: vec![false; n],
            free_in_group: vec![0usize; view.grouping.sizes.len()],
        };
        for id in available {
            let id = id.as_ref();
            match view.index_of(id) {
                Some(i) if !std::mem::replace(&mut offered.seen[i], true) => {
                    offered.free_in_group[view.grouping.of_device[i]] += 1;
                    if !self.taken[i] && view.unhealthy_reason(i).is_none() {
                        offered.known.push(i);
                    } else if !self.taken[i] {
                        offered.fallback.push(id);
                    }
                }
                Some(_) => {}
                None => {
                    if self.taken_unknown.insert(id) {
                        offered.fallback.push(id);
                    }
                }
            }
        }
        offered.known.sort_unstable();
        offered
    }

    /// Add the picks, then the other healthy candidates, then the fallbacks, up to `size`.
    fn finish(
        mut self,
        view: &ResourceView,
        picks: Vec<usize>,
        offered: &Offered<'a>,
        size: usize,
    ) -> Vec<String> {
        for i in picks.into_iter().chain(offered.known.iter().copied()) {
            if self.out.len() >= size {
                break;
            }
            if !std::mem::replace(&mut self.taken[i], true) {
                self.out.push(view.resource.devices[i].id.clone());
            }
        }
        for id in &offered.fallback {
            if self.out.len() >= size {
                break;
            }
            self.out.push((*id).to_string());
        }
        self.out
    }
}

impl Offered<'_> {
    /// Load of each group: units allocated elsewhere plus the must-include ones.
    fn load(&self, view: &ResourceView, must: &[usize]) -> Vec<usize> {
        let grouping = &view.grouping;
        let mut load: Vec<usize> = grouping
            .sizes
            .iter()
            .zip(&self.free_in_group)
            .map(|(size, free)| size.saturating_sub(*free))
            .collect();
        for &i in must {
            if !self.seen[i] {
                // Not listed as available: it was counted as allocated already.
                continue;
            }
            load[grouping.of_device[i]] += 1;
        }
        load
    }
}

/// The policy for this resource: links or NUMA for whole GPUs, linked replicas across GPUs,
/// one physical device for replicas that may not spread, else packed / distributed.
fn pick(
    view: &ResourceView,
    policy: AllocationPolicy,
    known: &[usize],
    must: &[usize],
    load: &mut [usize],
    need: usize,
    size: usize,
) -> Vec<usize> {
    let resource = &view.resource;
    match (&resource.sharing, resource.kind) {
        (None, ResourceKind::Gpu) => match &resource.links {
            Some(links) => linked_pick(links, known, must, need)
                .unwrap_or_else(|| numa_pick(view, known, must, need)),
            None => numa_pick(view, known, must, need),
        },
        (Some(sharing), ResourceKind::Gpu)
            if sharing.allow_multi_gpu && size > 1 && resource.links.is_some() =>
        {
            linked_replica_pick(view, policy, known, must, load, need)
        }
        (Some(sharing), _) if !sharing.allow_multi_gpu && size > 1 => {
            one_group_pick(view, policy, known, must, load, need)
                .unwrap_or_else(|| greedy_pick(view, policy, known, load, need))
        }
        _ => greedy_pick(view, policy, known, load, need),
    }
}

/// Whole GPUs: stay on one NUMA node where possible.
fn numa_pick(view: &ResourceView, known: &[usize], must: &[usize], need: usize) -> Vec<usize> {
    let devices = &view.resource.devices;
    let mut by_node: BTreeMap<Option<i64>, Vec<usize>> = BTreeMap::new();
    for &i in known {
        by_node.entry(devices[i].numa_node).or_default().push(i);
    }
    let must_node = must.iter().find_map(|&i| devices[i].numa_node);
    if let Some(node) = must_node
        && let Some(ids) = by_node.get(&Some(node))
        && ids.len() >= need
    {
        return ids[..need].to_vec();
    }
    // Tightest single node that fits, so larger nodes stay whole for larger requests.
    if let Some(ids) = by_node
        .values()
        .filter(|ids| ids.len() >= need)
        .min_by_key(|ids| ids.len())
    {
        return ids[..need].to_vec();
    }
    // No node fits: largest groups first to span as few nodes as possible.
    let mut groups: Vec<&Vec<usize>> = by_node.values().collect();
    groups.sort_by_key(|ids| std::cmp::Reverse(ids.len()));
    groups.into_iter().flatten().copied().take(need).collect()
}

/// Candidates per group, in ID order.
fn queues(view: &ResourceView, known: &[usize]) -> Vec<Vec<usize>> {
    let mut q = vec![Vec::new(); view.grouping.sizes.len()];
    for &i in known {
        q[view.grouping.of_device[i]].push(i);
    }
    q
}

/// Best group by policy among `groups` (ties: lowest group number, i.e. lowest UUID).
fn choose(
    policy: AllocationPolicy,
    load: &[usize],
    groups: impl Iterator<Item = usize>,
) -> Option<usize> {
    match policy {
        AllocationPolicy::Packed => groups.max_by_key(|&g| (load[g], std::cmp::Reverse(g))),
        AllocationPolicy::Distributed => groups.min_by_key(|&g| (load[g], g)),
    }
}

/// Replicas without allowMultiGpu: take all units from one physical device.
fn one_group_pick(
    view: &ResourceView,
    policy: AllocationPolicy,
    known: &[usize],
    must: &[usize],
    load: &[usize],
    need: usize,
) -> Option<Vec<usize>> {
    let q = queues(view, known);
    let mut must_groups: Vec<usize> = must.iter().map(|&i| view.grouping.of_device[i]).collect();
    must_groups.sort_unstable();
    must_groups.dedup();
    let group = match must_groups.as_slice() {
        [] => choose(policy, load, (0..q.len()).filter(|&g| q[g].len() >= need))?,
        [one] => *one,
        _ => return None,
    };
    (q[group].len() >= need).then(|| q[group][..need].to_vec())
}

/// Greedy by load: `packed` takes from the most loaded group, `distributed` from the least.
fn greedy_pick(
    view: &ResourceView,
    policy: AllocationPolicy,
    known: &[usize],
    load: &mut [usize],
    need: usize,
) -> Vec<usize> {
    let q = queues(view, known);
    let mut next = vec![0usize; q.len()];
    let mut out = Vec::with_capacity(need);
    while out.len() < need {
        let Some(g) = choose(policy, load, (0..q.len()).filter(|&g| next[g] < q[g].len())) else {
            break;
        };
        out.push(q[g][next[g]]);
        next[g] += 1;
        load[g] += 1;
    }
    out
}

/// Whole GPUs on a node with a topology: the best-linked set containing the must-include
/// GPUs. `None` when some device has no place in the topology (then NUMA placement).
fn linked_pick(
    links: &ResourceLinks,
    known: &[usize],
    must: &[usize],
    need: usize,
) -> Option<Vec<usize>> {
    // Local candidates in topology (bus ID) order, so the answer ignores the kubelet's order.
    let mut cands: Vec<(usize, usize, bool)> = Vec::with_capacity(known.len() + must.len());
    for (&i, forced) in must
        .iter()
        .map(|i| (i, true))
        .chain(known.iter().map(|i| (i, false)))
    {
        cands.push((links.slot.get(i).copied().flatten()?, i, forced));
    }
    cands.sort_unstable();
    cands.dedup_by_key(|c| c.0);
    let t = &links.topology;
    let m = cands.len();
    let mut s = vec![0u64; m * m];
    for a in 0..m {
        for b in 0..m {
            if a != b {
                s[a * m + b] = t.pair_score(cands[a].0, cands[b].0);
            }
        }
    }
    let forced: Vec<usize> = (0..m).filter(|&a| cands[a].2).collect();
    let k = (forced.len() + need).min(m);
    if forced.is_empty() && need == 1 {
        // The GPU whose loss costs the others least: lowest total link score to them.
        let lone = (0..m).min_by_key(|&a| ((0..m).map(|b| s[a * m + b]).sum::<u64>(), a))?;
        return Some(vec![cands[lone].1]);
    }
    let best = best_subset(&s, m, &forced, k)?;
    Some(
        best.set
            .into_iter()
            .filter(|&a| !cands[a].2)
            .map(|a| cands[a].1)
            .collect(),
    )
}

/// Replicas of whole GPUs that may span GPUs: as many GPUs as the policy's greedy pick
/// would use, chosen by link quality, then the greedy pick within them.
fn linked_replica_pick(
    view: &ResourceView,
    policy: AllocationPolicy,
    known: &[usize],
    must: &[usize],
    load: &mut [usize],
    need: usize,
) -> Vec<usize> {
    let mut trial = load.to_vec();
    let plain = greedy_pick(view, policy, known, &mut trial, need);
    let of = &view.grouping.of_device;
    let mut used: Vec<usize> = plain.iter().chain(must).map(|&i| of[i]).collect();
    used.sort_unstable();
    used.dedup();
    let Some(links) = view.resource.links.as_deref() else {
        load.copy_from_slice(&trial);
        return plain;
    };
    // One representative device per group, as whole-GPU placement sees it.
    let mut rep: BTreeMap<usize, usize> = BTreeMap::new();
    for &i in known.iter().chain(must) {
        rep.entry(of[i]).or_insert(i);
    }
    let mut must_reps: Vec<usize> = must
        .iter()
        .filter_map(|&i| rep.get(&of[i]).copied())
        .collect();
    must_reps.sort_unstable();
    must_reps.dedup();
    let free_reps: Vec<usize> = rep
        .values()
        .copied()
        .filter(|r| !must_reps.contains(r))
        .collect();
    let groups_needed = used.len().saturating_sub(must_reps.len());
    if used.len() < 2 || groups_needed == 0 {
        load.copy_from_slice(&trial);
        return plain;
    }
    let Some(chosen) = linked_pick(links, &free_reps, &must_reps, groups_needed) else {
        load.copy_from_slice(&trial);
        return plain;
    };
    let keep: Vec<usize> = chosen.iter().chain(&must_reps).map(|&r| of[r]).collect();
    let within: Vec<usize> = known
        .iter()
        .copied()
        .filter(|&i| keep.contains(&of[i]))
        .collect();
    let mut again = load.to_vec();
    let picks = greedy_pick(view, policy, &within, &mut again, need);
    if picks.len() == need {
        load.copy_from_slice(&again);
        picks
    } else {
        load.copy_from_slice(&trial);
        plain
    }
}
