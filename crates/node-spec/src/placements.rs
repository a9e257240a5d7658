//! GPU-instance profiles of each MIG product as NVML reports them: profile id and index,
//! how many instances fit, and where they may be placed.
//!
//! Shared by the agent's MIG layout planner (`gpu_slicer::domain::miglayout`) and the fake
//! `libnvidia-ml.so` (`crates/fake-nvml`), so the fake accepts exactly the placements the
//! planner produces and rejects the ones a driver would. The figures are the driver's
//! (`nvidia-smi mig -lgip` / `-lgipp`): a placement is `{start}:size` in memory slices, an
//! instance occupies memory slices `start..start + size`, and two instances collide when those
//! ranges overlap (`NVML_ERROR_INSUFFICIENT_RESOURCES`).
//!
//! Sources, checked 2026-12 (facts only; each table below names its own):
//! - NVIDIA MIG User Guide (v580), "Supported MIG Profiles": names, memory/SM fractions and
//!   "Number of Instances Available" per product; "Getting Started": the A100-40GB
//!   `nvidia-smi mig -lgipp` example.
//! - `nvidia-smi mig -lgip` / `-lgipp` listings quoted in public issues and notes, named per table.
//! - Profile indices: `nvml.h` as mirrored by nvidia-ml-py and nvml-wrapper-sys
//!   (`NVML_GPU_INSTANCE_PROFILE_1_SLICE` = 0 … `_1_SLICE_REV2` = 9).

use crate::products::{Product, lookup_product};

/// One GPU-instance profile with its NVML numbers and placements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiProfile {
    /// Profile name, e.g. `3g.40gb`.
    pub name: &'static str,
    /// `nvmlGpuInstanceProfileInfo_t.id` (what `nvmlDeviceCreateGpuInstanceWithPlacement` takes).
    pub id: u32,
    /// `NVML_GPU_INSTANCE_PROFILE_*` index (what `nvmlDeviceGetGpuInstanceProfileInfo` takes).
    pub index: u32,
    /// Compute slices (`sliceCount`).
    pub compute_slices: u32,
    /// Memory slices one instance occupies (the placement size).
    pub memory_slices: u32,
    /// Most instances of this profile on one GPU (`instanceCount`).
    pub instance_count: u32,
    /// Valid placement starts, ascending (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`).
    pub starts: &'static [u32],
}

impl GiProfile {
    /// Memory slices the instance at `start` covers.
    pub fn span(&self, start: u32) -> std::ops::Range<u32> {
        start..start + self.memory_slices
    }
}

// NVML_GPU_INSTANCE_PROFILE_* indices (nvml.h; confirmed in nvidia-ml-py and nvml-wrapper-sys).
// Which index a profile has: `+me` is 1_SLICE_REV1, the two-memory-slice 1g is 1_SLICE_REV2,
// `2g…+me` (A30) is 2_SLICE_REV1 (go-nvml's A100/A30/H200 mocks key their tables the same way).
const I_1: u32 = 0;
const I_2: u32 = 1;
const I_3: u32 = 2;
const I_4: u32 = 3;
const I_7: u32 = 4;
const I_1_REV1: u32 = 7;
const I_2_REV1: u32 = 8;
const I_1_REV2: u32 = 9;

#[allow(clippy::too_many_arguments)]
const fn g(
    name: &'static str,
    id: u32,
    index: u32,
    compute_slices: u32,
    memory_slices: u32,
    instance_count: u32,
    starts: &'static [u32],
) -> GiProfile {
    GiProfile {
        name,
        id,
        index,
        compute_slices,
        memory_slices,
        instance_count,
        starts,
    }
}

const ONE: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const TWO: &[u32] = &[0, 2, 4, 6];
const TWO_G: &[u32] = &[0, 2, 4];
const THREE_G: &[u32] = &[0, 4];
const ZERO: &[u32] = &[0];

/// The 8-memory-slice layout shared by A100 and H100/H200 (profile names differ only in GB).
///
/// Profile ids (19, 20, 15, 14, 9, 5, 0), instance counts (7, 1, 4, 3, 2, 1, 1) and starts are
/// the same on every such product; `nvidia-smi mig -lgipp` prints exactly these placements
/// (`{0..6}:1`, `{0..6}:1`, `{0,2,4,6}:2`, `{0,2,4}:2`, `{0,4}:4`, `{0}:4`, `{0}:8`) on
/// A100-40GB (MIG User Guide, Getting Started), H100 80GB HBM3 and H100 NVL (public listings).
macro_rules! eight_slice {
    ($one:literal, $one_me:literal, $one_two:literal, $two:literal, $three:literal, $four:literal, $seven:literal) => {
        &[
            g($one, 19, I_1, 1, 1, 7, ONE),
            g($one_me, 20, I_1_REV1, 1, 1, 1, ONE),
            g($one_two, 15, I_1_REV2, 1, 2, 4, TWO),
            g($two, 14, I_2, 2, 2, 3, TWO_G),
            g($three, 9, I_3, 3, 4, 2, THREE_G),
            g($four, 5, I_4, 4, 4, 1, ZERO),
            g($seven, 0, I_7, 7, 8, 1, ZERO),
        ]
    };
}

// A100-SXM4-40GB / A100-PCIE-40GB. Confirmed: names and counts (MIG User Guide, A100 table);
// ids, counts and memory (`-lgip`: 19 7/7, 20 1/1, 15 4/4, 14 3/3, 9 2/2, 5 1/1, 0 1/1, quoted in
// several public MIG notes); placements (MIG User Guide `-lgipp` example; 14/9/5/0 also in
// older-driver listings without 15/20).
const A100_40: &[GiProfile] = eight_slice!(
    "1g.5gb",
    "1g.5gb+me",
    "1g.10gb",
    "2g.10gb",
    "3g.20gb",
    "4g.20gb",
    "7g.40gb"
);
// A100-80GB and H100-80GB. Confirmed: names (MIG User Guide: A100-80GB names "change
// according to the memory proportion" to these; H100 table lists the same names) and counts
// (H100 table); H100 80GB HBM3 `-lgip` (19 7/7, 20 1/1, 15 4/4, 14 3/3, 9 2/2, 5 1/1, 0 1/1)
// and `-lgipp` (the eight-slice placements) from a public nvidia-smi note. For A100-80GB a
// public `-lgipp` with these names (19/20/14/9/5/0, an older driver without 15) matches; its id 15
// placement is the A100-40GB one (same GA100, same guide figure), not seen listed for 80GB.
const A100_80: &[GiProfile] = eight_slice!(
    "1g.10gb",
    "1g.10gb+me",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb"
);
// H200 141GB (SXM and NVL). Confirmed: names, memory fractions (1/8, 1/4, 2/8, 4/8, full) and
// counts (MIG User Guide, H200 table); ids and counts (`-lgip` in NVIDIA/mig-parted#120: 19 7/7,
// 20 1/1, 15 4/4, 14 3/3, 9 2/2, 5 1/1; 7g.141gb id 0 in a second, partial listing).
// UNCONFIRMED: the starts. No H200 `-lgipp` listing was found; they are taken from the same
// GH100 geometry as H100 80GB / H100 NVL, which the guide's fractions and counts agree with.
const H200: &[GiProfile] = eight_slice!(
    "1g.18gb",
    "1g.18gb+me",
    "1g.35gb",
    "2g.35gb",
    "3g.71gb",
    "4g.71gb",
    "7g.141gb"
);
// A30 24GB. Confirmed: names and counts (MIG User Guide, A30 table); ids and counts (`-lgip`:
// 1g.6gb 14 4/4, 1g.6gb+me 21 1/1, 2g.12gb 5 2/2, 2g.12gb+me 6 1/1, 4g.24gb 0 1/1) and
// placements (`-lgipp`: 14 {0,1,2,3}:1, 21 {0,1,2,3}:1, 5 {0,2}:2, 6 {0,2}:2, 0 {0}:4) from two
// independent public A30 notes (one on a driver without the R525 2g.12gb+me profile).
const A30: &[GiProfile] = &[
    g("1g.6gb", 14, I_1, 1, 1, 4, &[0, 1, 2, 3]),
    g("1g.6gb+me", 21, I_1_REV1, 1, 1, 1, &[0, 1, 2, 3]),
    g("2g.12gb", 5, I_2, 2, 2, 2, &[0, 2]),
    g("2g.12gb+me", 6, I_2_REV1, 2, 2, 1, &[0, 2]),
    g("4g.24gb", 0, I_4, 4, 4, 1, ZERO),
];

/// The GPU-instance profiles of `product` (by [`Product::name`]).
pub fn gi_profiles(product: &Product) -> &'static [GiProfile] {
    match product.name {
        "A100-40GB" => A100_40,
        "A100-80GB" | "H100-80GB" => A100_80,
        "H200-141GB" => H200,
        "A30" => A30,
        _ => &[],
    }
}

/// The GPU-instance profile `name` of the product named by NVML as `product_name`.
pub fn gi_profile(product_name: &str, name: &str) -> Option<&'static GiProfile> {
    let product = lookup_product(product_name)?;
    gi_profiles(product).iter().find(|p| p.name == name)
}

/// One GPU instance at a placement, for collision checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed<'a> {
    /// Its profile.
    pub profile: &'a GiProfile,
    /// Its placement start.
    pub start: u32,
}

/// Why an instance cannot be placed next to others (what a driver answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlaceError {
    /// `start` is not one of the profile's placements (`INVALID_ARGUMENT`).
    BadStart,
    /// The memory slices overlap another instance's (`INSUFFICIENT_RESOURCES`).
    Collides(u32),
    /// The profile's instance count or the GPU's compute slices are used up
    /// (`INSUFFICIENT_RESOURCES`).
    Exhausted,
}

/// Whether `new` fits next to `existing` on `product`.
pub fn check_place(
    product: &Product,
    existing: &[Placed<'_>],
    new: Placed<'_>,
) -> Result<(), PlaceError> {
    if !new.profile.starts.contains(&new.start) {
        return Err(PlaceError::BadStart);
    }
    let span = new.profile.span(new.start);
    for e in existing {
        let other = e.profile.span(e.start);
        if span.start < other.end && other.start < span.end {
            return Err(PlaceError::Collides(e.start));
        }
    }
    let same = existing
        .iter()
        .filter(|e| e.profile.name == new.profile.name)
        .count() as u32;
    let compute: u32 = existing.iter().map(|e| e.profile.compute_slices).sum();
    if same >= new.profile.instance_count
        || compute + new.profile.compute_slices > product.compute_slices
    {
        return Err(PlaceError::Exhausted);
    }
    Ok(())
}

/// Place `targets` on an empty `product` GPU: one start per target (same order), chosen
/// deterministically. Among all valid placements it picks the one that keeps the most of
/// `keep` (`(profile name, start)` of instances that exist now); ties go to the first in
/// search order (largest profiles first, lowest starts first). `None`: the layout does not fit.
pub fn search_placements(
    product: &Product,
    targets: &[&'static GiProfile],
    keep: &[(&str, u32)],
) -> Option<Vec<u32>> {
    // Search larger instances first: they have the fewest starts, so dead ends show early.
    let mut order: Vec<usize> = (0..targets.len()).collect();
    order.sort_by(|&a, &b| {
        let (pa, pb) = (targets[a], targets[b]);
        (pb.memory_slices, pb.compute_slices, pa.name, a).cmp(&(
            pa.memory_slices,
            pa.compute_slices,
            pb.name,
            b,
        ))
    });
    struct Search<'a> {
        product: &'a Product,
        targets: &'a [&'static GiProfile],
        order: &'a [usize],
        keep: &'a [(&'a str, u32)],
        placed: Vec<Placed<'static>>,
        starts: Vec<u32>,
        best: Option<(usize, Vec<u32>)>,
    }
    impl Search<'_> {
        fn score(&self) -> usize {
            self.placed
                .iter()
                .filter(|p| self.keep.contains(&(p.profile.name, p.start)))
                .count()
        }
        fn go(&mut self, depth: usize) {
            if depth == self.order.len() {
                let score = self.score();
                if self.best.as_ref().is_none_or(|(b, _)| score > *b) {
                    let mut starts = vec![0; self.targets.len()];
                    for (i, &t) in self.order.iter().enumerate() {
                        starts[t] = self.starts[i];
                    }
                    self.best = Some((score, starts));
                }
                return;
            }
            // Every instance can be kept: nothing better exists.
            if self
                .best
                .as_ref()
                .is_some_and(|(b, _)| *b == self.order.len().min(self.keep.len()))
            {
                return;
            }
            let profile = self.targets[self.order[depth]];
            // Identical profiles are interchangeable: place them in ascending starts only.
            let min = match depth.checked_sub(1) {
                Some(prev) if self.targets[self.order[prev]].name == profile.name => {
                    self.starts[prev] + 1
                }
                _ => 0,
            };
            for &start in profile.starts.iter().filter(|&&s| s >= min) {
                let new = Placed { profile, start };
                if check_place(self.product, &self.placed, new).is_ok() {
                    self.placed.push(new);
                    self.starts.push(start);
                    self.go(depth + 1);
                    self.placed.pop();
                    self.starts.pop();
                }
            }
        }
    }
    let mut s = Search {
        product,
        targets,
        order: &order,
        keep,
        placed: Vec::new(),
        starts: Vec::new(),
        best: None,
    };
    s.go(0);
    s.best.map(|(_, starts)| starts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::products::PRODUCTS;

    #[test]
    fn every_product_profile_has_placements() {
        for product in PRODUCTS {
            let gis = gi_profiles(product);
            for p in product.profiles {
                let gi = gis.iter().find(|g| g.name == p.name).unwrap_or_else(|| {
                    panic!("{} has no placement table for {}", product.name, p.name)
                });
                assert_eq!(gi.compute_slices, p.compute_slices, "{}", p.name);
                assert_eq!(gi.memory_slices, p.memory_slices, "{}", p.name);
                for s in gi.starts {
                    assert!(s + gi.memory_slices <= product.memory_slices, "{}", p.name);
                }
            }
            assert_eq!(gis.len(), product.profiles.len(), "{}", product.name);
        }
    }

    #[test]
    fn collisions_and_limits() {
        let a100 = lookup_product("NVIDIA A100-SXM4-40GB").unwrap();
        let p = |n| gi_profile("NVIDIA A100-SXM4-40GB", n).unwrap();
        let three = Placed {
            profile: p("3g.20gb"),
            start: 4,
        };
        assert_eq!(
            check_place(
                a100,
                &[three],
                Placed {
                    profile: p("2g.10gb"),
                    start: 4
                }
            ),
            Err(PlaceError::Collides(4))
        );
        assert_eq!(
            check_place(
                a100,
                &[three],
                Placed {
                    profile: p("2g.10gb"),
                    start: 0
                }
            ),
            Ok(())
        );
        assert_eq!(
            check_place(
                a100,
                &[three],
                Placed {
                    profile: p("2g.10gb"),
                    start: 1
                }
            ),
            Err(PlaceError::BadStart)
        );
        let me = Placed {
            profile: p("1g.5gb+me"),
            start: 0,
        };
        assert_eq!(
            check_place(
                a100,
                &[me],
                Placed {
                    profile: p("1g.5gb+me"),
                    start: 1
                }
            ),
            Err(PlaceError::Exhausted)
        );
    }

    /// The tables, printed the way `nvidia-smi mig -lgip` / `-lgipp` print them, against the
    /// listings named at each table: `name id count {starts}:size index`. A change to a table
    /// must come with a source that changes this.
    #[test]
    fn tables_match_the_driver_listings() {
        fn render(product: &str) -> Vec<String> {
            let p = lookup_product(product).unwrap();
            gi_profiles(p)
                .iter()
                .map(|g| {
                    let starts: Vec<String> = g.starts.iter().map(u32::to_string).collect();
                    format!(
                        "{} {} {} {{{}}}:{} {}",
                        g.name,
                        g.id,
                        g.instance_count,
                        starts.join(","),
                        g.memory_slices,
                        g.index
                    )
                })
                .collect()
        }
        let eight = |names: [&str; 7]| -> Vec<String> {
            let rest = [
                "19 7 {0,1,2,3,4,5,6}:1 0",
                "20 1 {0,1,2,3,4,5,6}:1 7",
                "15 4 {0,2,4,6}:2 9",
                "14 3 {0,2,4}:2 1",
                "9 2 {0,4}:4 2",
                "5 1 {0}:4 3",
                "0 1 {0}:8 4",
            ];
            names
                .iter()
                .zip(rest)
                .map(|(n, r)| format!("{n} {r}"))
                .collect()
        };
        let a100_40 = [
            "1g.5gb",
            "1g.5gb+me",
            "1g.10gb",
            "2g.10gb",
            "3g.20gb",
            "4g.20gb",
            "7g.40gb",
        ];
        let gb80 = [
            "1g.10gb",
            "1g.10gb+me",
            "1g.20gb",
            "2g.20gb",
            "3g.40gb",
            "4g.40gb",
            "7g.80gb",
        ];
        let h200 = [
            "1g.18gb",
            "1g.18gb+me",
            "1g.35gb",
            "2g.35gb",
            "3g.71gb",
            "4g.71gb",
            "7g.141gb",
        ];
        assert_eq!(render("NVIDIA A100-SXM4-40GB"), eight(a100_40));
        assert_eq!(render("NVIDIA A100-PCIE-40GB"), eight(a100_40));
        assert_eq!(render("NVIDIA A100-SXM4-80GB"), eight(gb80));
        assert_eq!(render("NVIDIA A100 80GB PCIe"), eight(gb80));
        assert_eq!(render("NVIDIA H100 80GB HBM3"), eight(gb80));
        assert_eq!(render("NVIDIA H200"), eight(h200));
        assert_eq!(render("NVIDIA H200 NVL"), eight(h200));
        assert_eq!(
            render("NVIDIA A30"),
            [
                "1g.6gb 14 4 {0,1,2,3}:1 0",
                "1g.6gb+me 21 1 {0,1,2,3}:1 7",
                "2g.12gb 5 2 {0,2}:2 1",
                "2g.12gb+me 6 1 {0,2}:2 8",
                "4g.24gb 0 1 {0}:4 3",
            ]
        );
    }

    #[test]
    fn search_backtracks_and_keeps() {
        let a100 = lookup_product("NVIDIA A100-SXM4-40GB").unwrap();
        let p = |n| gi_profile("NVIDIA A100-SXM4-40GB", n).unwrap();
        // all-balanced: the 3g must go to 4 so both 1g fit.
        let t = [p("1g.5gb"), p("1g.5gb"), p("2g.10gb"), p("3g.20gb")];
        assert_eq!(search_placements(a100, &t, &[]), Some(vec![2, 3, 0, 4]));
        // Keeping a 2g at 4 moves the 3g to 0; without it the first fit is the same.
        let t = [p("3g.20gb"), p("2g.10gb")];
        assert_eq!(
            search_placements(a100, &t, &[("2g.10gb", 4)]),
            Some(vec![0, 4])
        );
        assert_eq!(
            search_placements(a100, &t, &[("3g.20gb", 4)]),
            Some(vec![4, 0])
        );
        let t = [p("4g.20gb"), p("4g.20gb")];
        assert_eq!(search_placements(a100, &t, &[]), None);
    }
}
