//! Topology tests: building from raw answers (asymmetric, unsupported), the matrix, the
//! search against brute force on the reference layouts, and GetPreferredAllocation through
//! the real plan and views of the `hack/nodes/topo-*.yaml` node files.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::layouts::{Layout, reference};
use super::search::{best_subset, pairs_score};
use super::*;
use crate::domain::allocate::{Overlay, preferred};
use crate::domain::config::{AllocationPolicy, Config};
use crate::domain::inventory::Backend;
use crate::domain::plan;
use crate::domain::view;
use crate::platform::sim::SimBackend;

fn node(name: &str) -> (crate::domain::inventory::Inventory, view::ResourceView) {
    let path = format!("{}/hack/nodes/topo-{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    let inv = SimBackend::from_file(std::path::Path::new(&path))
        .and_then(|b| b.discover())
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let plan = plan::build(&inv, &Config::default()).expect("plan");
    let views = view::views(&plan, &Overlay::default(), &BTreeMap::new());
    let v = views.get("nvidia.com/gpu").expect("nvidia.com/gpu view");
    (inv, view::ResourceView::clone(v))
}

fn ids_of(inv: &crate::domain::inventory::Inventory, idx: &[u32]) -> Vec<String> {
    idx.iter()
        .map(|&i| inv.gpus[i as usize].uuid.clone())
        .collect()
}

fn index_of(inv: &crate::domain::inventory::Inventory, id: &str) -> u32 {
    inv.gpu(id).map(|g| g.index).expect("known GPU")
}

/// The exhaustive optimum over all k-subsets containing `forced`.
fn brute(s: &[u64], m: usize, forced: &[usize], k: usize) -> u64 {
    (0u32..1 << m)
        .filter(|mask| mask.count_ones() as usize == k)
        .filter(|mask| forced.iter().all(|&f| mask & (1 << f) != 0))
        .map(|mask| {
            let set: Vec<usize> = (0..m).filter(|&i| mask & (1 << i) != 0).collect();
            pairs_score(s, m, &set)
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn matrix_renders_as_nvidia_smi_does() {
    let t = reference()[1].topology();
    let text = t.render();
    let first_row = text.lines().nth(1).expect("row");
    assert_eq!(
        first_row,
        "GPU0\t X \tSYS\tNV12\tSYS\tSYS\tSYS\tSYS\tSYS\t0"
    );
    assert!(text.starts_with("\tGPU0\tGPU1"), "{text}");
    assert!(text.contains("NV#  = Connection traversing a bonded set of # NVLinks"));
}

#[test]
fn asymmetric_and_unsupported_answers_warn_and_stay_usable() {
    let gpus: Vec<RawGpu> = (0..3)
        .map(|i| RawGpu {
            pci_bus_id: Layout::bus_id(i),
            index: i as u32,
            numa_node: None,
            switch_links: 0,
        })
        .collect();
    let (t, warnings) = Topology::from_raw(&gpus, |a, b| match (a, b) {
        (0, 1) => RawPair {
            ancestor: Some(10),
            direct_nvlinks: 4,
        },
        (1, 0) => RawPair {
            ancestor: Some(20),
            direct_nvlinks: 0,
        },
        (2, _) | (_, 2) => RawPair {
            ancestor: None,
            direct_nvlinks: 0,
        },
        _ => RawPair {
            ancestor: Some(99),
            direct_nvlinks: 0,
        },
    });
    assert!(
        warnings
            .iter()
            .any(|w| matches!(w, TopologyWarning::Asymmetric { .. })),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| matches!(w, TopologyWarning::NoPcieAnswer { .. })),
        "{warnings:?}"
    );
    assert_eq!(
        t.link(0, 1),
        PairLink {
            pcie: PcieLevel::Pxb,
            nvlinks: 0
        }
    );
    assert_eq!(
        t.link(0, 2),
        PairLink {
            pcie: PcieLevel::Sys,
            nvlinks: 0
        }
    );
}

#[test]
fn nvswitch_pairs_all_score_as_nvlink_connected() {
    let (inv, _) = node("nvswitch-h100");
    let t = inv.topology.expect("topology");
    for a in 0..t.len() {
        for b in 0..t.len() {
            if a != b {
                assert_eq!(t.link(a, b).nvlinks, 18, "{a}-{b}");
            }
        }
    }
    let attrs = placement_attributes(&t);
    assert!(
        attrs
            .iter()
            .all(|a| a.nvlink_domain == attrs[0].nvlink_domain && a.nvlink_domain.is_some())
    );
}

#[test]
fn placement_attributes_group_bridged_pairs() {
    let attrs = placement_attributes(&reference()[1].topology());
    assert_eq!(attrs[0].nvlink_domain, attrs[2].nvlink_domain);
    assert_ne!(attrs[0].nvlink_domain, attrs[1].nvlink_domain);
    assert_eq!(attrs[0].nvlink_domain.as_deref(), Some("nvl-0000:10:00.0"));
}

#[test]
fn one_gpu_request_takes_the_lone_gpu() {
    // Bridged pairs with GPU 7 taken: pairs 0-2, 1-3, 4-5 free and GPU 6 alone.
    let (inv, v) = node("bridged-pairs");
    let avail = ids_of(&inv, &[5, 0, 6, 3, 1, 4, 2]);
    let got = preferred(&v, AllocationPolicy::Distributed, &avail, &[], 1);
    assert_eq!(got, ids_of(&inv, &[6]));
}

proptest! {
    #[test]
    fn bridged_pairs_give_an_nv_pair_in_any_order(
        perm in Just((0u32..8).collect::<Vec<_>>()).prop_shuffle(),
        drop in proptest::collection::vec(0u32..8, 0..4),
    ) {
        let (inv, v) = node("bridged-pairs");
        let avail_idx: Vec<u32> = perm.into_iter().filter(|i| !drop.contains(i)).collect();
        let avail = ids_of(&inv, &avail_idx);
        let got = preferred(&v, AllocationPolicy::Distributed, &avail, &[], 2);
        let t = inv.topology.as_ref().expect("topology");
        let has_pair = avail_idx.iter().any(|&a| avail_idx.iter().any(|&b| a != b
            && t.link(a as usize, b as usize).nvlinks > 0));
        let g: Vec<u32> = got.iter().map(|id| index_of(&inv, id)).collect();
        prop_assert_eq!(g.len(), 2);
        if has_pair {
            prop_assert_eq!(t.link(g[0] as usize, g[1] as usize).nvlinks, 12, "{:?} from {:?}", g, avail_idx);
        }
    }

    #[test]
    fn search_equals_brute_force_on_reference_layouts(
        layout in 0usize..6,
        avail_mask in 1u32..(1 << 10),
        must_mask in 0u32..(1 << 10),
        k in 1usize..9,
    ) {
        let t = reference()[layout].topology();
        let n = t.len().min(10);
        let cands: Vec<usize> = (0..n).filter(|&i| avail_mask & (1 << i) != 0).collect();
        let m = cands.len();
        let forced: Vec<usize> = (0..m).filter(|&p| must_mask & (1 << cands[p]) != 0).collect();
        prop_assume!(k <= m && forced.len() <= k);
        let mut s = vec![0u64; m * m];
        for a in 0..m {
            for b in 0..m {
                if a != b { s[a * m + b] = t.pair_score(cands[a], cands[b]); }
            }
        }
        let best = best_subset(&s, m, &forced, k).expect("feasible");
        prop_assert!(best.exact);
        prop_assert_eq!(best.set.len(), k);
        prop_assert!(forced.iter().all(|f| best.set.contains(f)));
        prop_assert_eq!(best.score, pairs_score(&s, m, &best.set));
        prop_assert_eq!(best.score, brute(&s, m, &forced, k));
    }

    #[test]
    fn preferred_is_optimal_and_order_free(
        layout in 0usize..6,
        avail_mask in 1u32..(1 << 10),
        must_mask in 0u32..(1 << 10),
        size in 2usize..6,
        perm_seed in any::<u64>(),
    ) {
        let names = ["nvswitch-h100", "bridged-pairs", "pcie-dual-socket", "l40s-4", "workstation-5", "pairs-16"];
        let (inv, v) = node(names[layout]);
        let t = inv.topology.clone().expect("topology");
        let n = inv.gpus.len().min(10) as u32;
        let mut avail_idx: Vec<u32> = (0..n).filter(|i| avail_mask & (1 << i) != 0).collect();
        let must_idx: Vec<u32> = avail_idx.iter().copied().filter(|i| must_mask & (1 << i) != 0).collect();
        prop_assume!(size <= avail_idx.len() && must_idx.len() <= size);
        let sorted = preferred(&v, AllocationPolicy::Distributed, &ids_of(&inv, &avail_idx), &ids_of(&inv, &must_idx), size);
        let rot = (perm_seed % avail_idx.len() as u64) as usize;
        avail_idx.rotate_left(rot);
        avail_idx.reverse();
        let shuffled = preferred(&v, AllocationPolicy::Distributed, &ids_of(&inv, &avail_idx), &ids_of(&inv, &must_idx), size);
        let set = |ids: &[String]| { let mut s: Vec<u32> = ids.iter().map(|id| index_of(&inv, id)).collect(); s.sort(); s };
        prop_assert_eq!(set(&sorted), set(&shuffled));
        let got: Vec<usize> = set(&sorted).into_iter().map(|i| t.position(&inv.gpus[i as usize].pci_bus_id).expect("pos")).collect();
        prop_assert!(must_idx.iter().all(|m| set(&sorted).contains(m)));
        let cands: Vec<usize> = avail_idx.iter().map(|&i| t.position(&inv.gpus[i as usize].pci_bus_id).expect("pos")).collect();
        let mut all: Vec<usize> = cands.clone();
        all.sort();
        let m = all.len();
        let mut s = vec![0u64; m * m];
        for a in 0..m { for b in 0..m { if a != b { s[a * m + b] = t.pair_score(all[a], all[b]); } } }
        let forced: Vec<usize> = must_idx.iter().map(|&i| all.iter().position(|&p| p == t.position(&inv.gpus[i as usize].pci_bus_id).expect("pos")).expect("in")).collect();
        let got_local: Vec<usize> = got.iter().map(|p| all.iter().position(|q| q == p).expect("in")).collect();
        prop_assert_eq!(pairs_score(&s, m, &got_local), brute(&s, m, &forced, size));
    }
}
