//! GetPreferredAllocation policies, computed from the in-memory view only.
//!
//! - Whole GPUs: NUMA-aware — keep the answer on one NUMA node (the must-include devices'
//!   node first, else the node that fits the request most tightly), spilling over only when
//!   no node has enough.
//! - Replicas and MIG devices: `packed` fills the physical device with the most allocated
//!   (and picked) units first; `distributed` takes from the least loaded one. Replicas of a
//!   resource without `allowMultiGpu` are kept on one physical device when one has room, so
//!   the hint never leads to an Allocate that the rules refuse.
//!
//! The answer is a hint and an error fails pod admission, so [`preferred`] never fails: it
//! always returns the must-include IDs, then the best picks, then any other available ID.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use crate::config::AllocationPolicy;
use crate::plan::{Device, ResourceKind};

use super::state::ResourceView;

/// Pick `size` IDs out of `available`, including every ID of `must_include`.
///
/// The result has no duplicates, starts with `must_include`, and has
/// `min(size, |must_include ∪ available|)` entries when `must_include` fits in `size`.
pub fn preferred<S: AsRef<str>>(
    view: &ResourceView,
    policy: AllocationPolicy,
    available: &[S],
    must_include: &[S],
    size: usize,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(size.max(must_include.len()));
    let mut taken: HashSet<&str> = HashSet::with_capacity(size + must_include.len());
    for id in must_include {
        let id = id.as_ref();
        if taken.insert(id) {
            out.push(id.to_string());
        }
    }
    if out.len() >= size {
        return out;
    }
    // Known, healthy candidates (in the view's ID order) and everything else as fallback.
    let mut known: Vec<(usize, &str)> = Vec::with_capacity(available.len());
    let mut fallback: Vec<&str> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::with_capacity(available.len());
    for id in available {
        let id = id.as_ref();
        if taken.contains(id) || !seen.insert(id) {
            continue;
        }
        match view.index_of(id) {
            Some(i) if view.unhealthy_reason(i).is_none() => known.push((i, id)),
            _ => fallback.push(id),
        }
    }
    known.sort_unstable_by_key(|(i, _)| *i);
    let need = size - out.len();
    let must_devices: Vec<&Device> = out
        .iter()
        .filter_map(|id| view.index_of(id).map(|i| &view.resource.devices[i]))
        .collect();
    let resource = &view.resource;
    let picks: Vec<&str> = match (&resource.sharing, resource.kind) {
        (None, ResourceKind::Gpu) => numa_pick(view, &known, &must_devices, need),
        (Some(sharing), _) if !sharing.allow_multi_gpu && size > 1 => {
            one_physical_pick(view, policy, &known, &must_devices, need, available).unwrap_or_else(
                || greedy_pick(view, policy, &known, &must_devices, need, available),
            )
        }
        _ => greedy_pick(view, policy, &known, &must_devices, need, available),
    };
    for id in picks {
        if out.len() >= size {
            break;
        }
        if taken.insert(id) {
            out.push(id.to_string());
        }
    }
    // Top up with whatever is left so the answer has the requested size when possible.
    for (_, id) in &known {
        if out.len() >= size {
            break;
        }
        if taken.insert(id) {
            out.push((*id).to_string());
        }
    }
    for id in fallback {
        if out.len() >= size {
            break;
        }
        if taken.insert(id) {
            out.push(id.to_string());
        }
    }
    out
}

/// Whole GPUs: stay on one NUMA node where possible.
fn numa_pick<'a>(
    view: &ResourceView,
    known: &[(usize, &'a str)],
    must: &[&Device],
    need: usize,
) -> Vec<&'a str> {
    let mut by_node: BTreeMap<Option<i64>, Vec<&'a str>> = BTreeMap::new();
    for &(i, id) in known {
        by_node
            .entry(view.resource.devices[i].numa_node)
            .or_default()
            .push(id);
    }
    let must_node = must.iter().find_map(|d| d.numa_node);
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
    let mut groups: Vec<&Vec<&'a str>> = by_node.values().collect();
    groups.sort_by_key(|ids| std::cmp::Reverse(ids.len()));
    groups.into_iter().flatten().copied().take(need).collect()
}

/// The grouping key: the physical device for replicas, the GPU for MIG slices (so `packed`
/// fills one GPU's slices before the next).
fn key_of(view: &ResourceView, d: &Device) -> String {
    if view.resource.sharing.is_some() {
        d.physical.uuid.clone()
    } else {
        d.physical.gpu_uuid.clone()
    }
}

/// Per key: units allocated elsewhere (total − available) and candidate queues.
struct Groups<'a> {
    load: HashMap<String, usize>,
    queues: BTreeMap<String, VecDeque<&'a str>>,
}

fn groups<'a, S: AsRef<str>>(
    view: &ResourceView,
    known: &[(usize, &'a str)],
    must: &[&Device],
    available: &[S],
) -> Groups<'a> {
    let mut load: HashMap<String, usize> = HashMap::new();
    for d in &view.resource.devices {
        *load.entry(key_of(view, d)).or_default() += 1;
    }
    for id in available {
        if let Some((d, _)) = view.get(id.as_ref())
            && let Some(n) = load.get_mut(&key_of(view, d))
        {
            *n = n.saturating_sub(1);
        }
    }
    // Must-include units are about to be taken: count them as load.
    for d in must {
        *load.entry(key_of(view, d)).or_default() += 1;
    }
    let mut queues: BTreeMap<String, VecDeque<&'a str>> = BTreeMap::new();
    for &(i, id) in known {
        queues
            .entry(key_of(view, &view.resource.devices[i]))
            .or_default()
            .push_back(id);
    }
    Groups { load, queues }
}

/// Replicas without allowMultiGpu: take all units from one physical device.
fn one_physical_pick<'a, S: AsRef<str>>(
    view: &ResourceView,
    policy: AllocationPolicy,
    known: &[(usize, &'a str)],
    must: &[&Device],
    need: usize,
    available: &[S],
) -> Option<Vec<&'a str>> {
    let g = groups(view, known, must, available);
    let mut must_keys: Vec<String> = must.iter().map(|d| key_of(view, d)).collect();
    must_keys.dedup();
    let key = match must_keys.as_slice() {
        [] => {
            let fits = g.queues.iter().filter(|(_, q)| q.len() >= need);
            let load = |k: &String| g.load.get(k).copied().unwrap_or(0);
            match policy {
                AllocationPolicy::Packed => {
                    fits.max_by_key(|(k, _)| (load(k), std::cmp::Reverse(*k)))?
                }
                AllocationPolicy::Distributed => fits.min_by_key(|(k, _)| (load(k), *k))?,
            }
            .0
            .clone()
        }
        [one] => one.clone(),
        _ => return None,
    };
    let q = g.queues.get(&key)?;
    (q.len() >= need).then(|| q.iter().take(need).copied().collect())
}

/// Greedy by load: `packed` takes from the most loaded key, `distributed` from the least.
fn greedy_pick<'a, S: AsRef<str>>(
    view: &ResourceView,
    policy: AllocationPolicy,
    known: &[(usize, &'a str)],
    must: &[&Device],
    need: usize,
    available: &[S],
) -> Vec<&'a str> {
    let mut g = groups(view, known, must, available);
    let mut out = Vec::with_capacity(need);
    while out.len() < need {
        let load = |k: &String| g.load.get(k).copied().unwrap_or(0);
        let nonempty = g.queues.iter().filter(|(_, q)| !q.is_empty());
        let chosen = match policy {
            AllocationPolicy::Packed => nonempty
                .max_by_key(|(k, _)| (load(k), std::cmp::Reverse(*k)))
                .map(|(k, _)| k.clone()),
            AllocationPolicy::Distributed => nonempty
                .min_by_key(|(k, _)| (load(k), *k))
                .map(|(k, _)| k.clone()),
        };
        let Some(key) = chosen else { break };
        if let Some(id) = g.queues.get_mut(&key).and_then(VecDeque::pop_front) {
            out.push(id);
            *g.load.entry(key).or_default() += 1;
        }
    }
    out
}
