//! MIG-capable products and the MIG profiles each one offers.
//!
//! Used to check that a node file describes a layout the hardware can hold and to derive
//! the default memory of each MIG device. Profile names follow NVIDIA's
//! `<G>g.<GB>gb[+me]` form; GB comes from [`profile_name_from_memory`].
//!
//! Sources, checked 2026-12 (facts only): the MIG User Guide (v580) "Supported GPUs" table
//! (compute capability, max instances: 7, A30 4) and "Supported MIG Profiles" tables (names,
//! fractions); `memory_mib` is what `nvidia-smi` prints as total memory, seen in several public
//! listings per product (A100-40GB 40960 on current drivers, 40536/40537 on R450; A100-80GB
//! 81920; A30 24576, also go-nvml's A30 mock; H100 80GB HBM3 81559; H200 and H200 NVL 143771).

/// One MIG profile of a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigProfileInfo {
    /// Profile name, e.g. `1g.10gb+me`.
    pub name: &'static str,
    /// Compute slices (the `G` in `<G>g`).
    pub compute_slices: u32,
    /// Memory slices out of the product's [`Product::memory_slices`].
    pub memory_slices: u32,
}

/// A MIG-capable GPU product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Product {
    /// Short name used in messages.
    pub name: &'static str,
    /// Substrings of the NVML product name that identify it (all must match).
    matches: &'static [&'static str],
    /// Substrings that rule it out: a sibling board whose name contains `matches` but whose
    /// MIG profiles differ (none may match).
    rejects: &'static [&'static str],
    /// Total memory in MiB.
    pub memory_mib: u64,
    /// Compute slices available to MIG.
    pub compute_slices: u32,
    /// Memory slices available to MIG.
    pub memory_slices: u32,
    /// `nvmlDeviceGetMaxMigDeviceCount` for this product.
    pub max_mig_devices: u32,
    /// CUDA compute capability.
    pub compute_capability: (u32, u32),
    /// Profiles offered.
    pub profiles: &'static [MigProfileInfo],
}

const fn p(name: &'static str, compute_slices: u32, memory_slices: u32) -> MigProfileInfo {
    MigProfileInfo {
        name,
        compute_slices,
        memory_slices,
    }
}

const A100_80: &[MigProfileInfo] = &[
    p("1g.10gb", 1, 1),
    p("1g.10gb+me", 1, 1),
    p("1g.20gb", 1, 2),
    p("2g.20gb", 2, 2),
    p("3g.40gb", 3, 4),
    p("4g.40gb", 4, 4),
    p("7g.80gb", 7, 8),
];
const A100_40: &[MigProfileInfo] = &[
    p("1g.5gb", 1, 1),
    p("1g.5gb+me", 1, 1),
    p("1g.10gb", 1, 2),
    p("2g.10gb", 2, 2),
    p("3g.20gb", 3, 4),
    p("4g.20gb", 4, 4),
    p("7g.40gb", 7, 8),
];
const A30: &[MigProfileInfo] = &[
    p("1g.6gb", 1, 1),
    p("1g.6gb+me", 1, 1),
    p("2g.12gb", 2, 2),
    p("2g.12gb+me", 2, 2),
    p("4g.24gb", 4, 4),
];
const H200: &[MigProfileInfo] = &[
    p("1g.18gb", 1, 1),
    p("1g.18gb+me", 1, 1),
    p("1g.35gb", 1, 2),
    p("2g.35gb", 2, 2),
    p("3g.71gb", 3, 4),
    p("4g.71gb", 4, 4),
    p("7g.141gb", 7, 8),
];

/// The products gpu-slicer knows MIG layouts for. Order matters: more specific first.
pub const PRODUCTS: &[Product] = &[
    Product {
        name: "A100-80GB",
        // `NVIDIA A100-SXM4-80GB`, `NVIDIA A100 80GB PCIe`.
        matches: &["A100", "80GB"],
        rejects: &[],
        memory_mib: 81920,
        compute_slices: 7,
        memory_slices: 8,
        max_mig_devices: 7,
        compute_capability: (8, 0),
        profiles: A100_80,
    },
    Product {
        name: "A100-40GB",
        // `NVIDIA A100-SXM4-40GB`, `NVIDIA A100-PCIE-40GB`.
        matches: &["A100"],
        rejects: &[],
        memory_mib: 40960,
        compute_slices: 7,
        memory_slices: 8,
        max_mig_devices: 7,
        compute_capability: (8, 0),
        profiles: A100_40,
    },
    Product {
        name: "A30",
        // `NVIDIA A30`.
        matches: &["A30"],
        rejects: &[],
        memory_mib: 24576,
        compute_slices: 4,
        memory_slices: 4,
        max_mig_devices: 4,
        compute_capability: (8, 0),
        profiles: A30,
    },
    Product {
        name: "H100-80GB",
        // `NVIDIA H100 80GB HBM3`, `NVIDIA H100 PCIe`. Not `NVIDIA H100 NVL` (95830 MiB) nor the
        // 94/96 GB boards: their profiles are 1g.12gb… (MIG User Guide; NVIDIA/gpu-operator#903).
        matches: &["H100"],
        rejects: &["NVL", "94GB", "96GB"],
        memory_mib: 81559,
        compute_slices: 7,
        memory_slices: 8,
        max_mig_devices: 7,
        compute_capability: (9, 0),
        profiles: A100_80,
    },
    Product {
        name: "H200-141GB",
        // `NVIDIA H200`, `NVIDIA H200 NVL`. Not `NVIDIA GH200 480GB` / `NVIDIA GH200 144G HBM3e`:
        // other memory, other names (1g.12gb…, 1g.18gb/1g.36gb…; NVIDIA/mig-parted#139).
        matches: &["H200"],
        rejects: &["GH200"],
        memory_mib: 143771,
        compute_slices: 7,
        memory_slices: 8,
        max_mig_devices: 7,
        compute_capability: (9, 0),
        profiles: H200,
    },
];

/// Find the product for an NVML product name such as `NVIDIA A100-SXM4-80GB`.
pub fn lookup_product(product_name: &str) -> Option<&'static Product> {
    let upper = product_name.to_ascii_uppercase();
    let sizes = gb_sizes(&upper);
    PRODUCTS.iter().find(|p| {
        p.matches.iter().all(|m| upper.contains(m))
            && !p.rejects.iter().any(|r| upper.contains(r))
            // A size in the name must be this product's: `A100-SXM4-800GB` (a typo) is no
            // A100-40GB, whose MIG tables would then explain the wrong mistake.
            && gb_sizes(p.name).first().is_none_or(|own| sizes.iter().all(|s| s == own))
    })
}

/// The names of the built-in products, for messages.
pub fn product_names() -> Vec<&'static str> {
    PRODUCTS.iter().map(|p| p.name).collect()
}

/// The `<digits>GB` sizes written in an upper-case product name (`80` of `H100 80GB HBM3`).
fn gb_sizes(upper: &str) -> Vec<u32> {
    upper
        .match_indices("GB")
        .filter_map(|(at, _)| {
            let head = &upper[..at];
            let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
            head[at - digits..].parse().ok()
        })
        .collect()
}

impl Product {
    /// The profile with this name.
    pub fn profile(&self, name: &str) -> Option<&'static MigProfileInfo> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// All profile names, for error messages.
    pub fn profile_names(&self) -> Vec<&'static str> {
        self.profiles.iter().map(|p| p.name).collect()
    }
}

/// Derive a MIG profile name the way NVIDIA's tooling does: the device's memory as a
/// fraction of the parent, rounded up to an eighth, times the parent's size in whole GiB
/// (rounded half away from zero). `suffix` is e.g. `""` or `"+me"`.
pub fn profile_name_from_memory(
    compute_slices: u32,
    gpu_slices: u32,
    mig_memory_mib: u64,
    parent_memory_bytes: u64,
    suffix: &str,
) -> String {
    const GIB: u64 = 1 << 30;
    let frac = (mig_memory_mib as f64 * (1u64 << 20) as f64) / parent_memory_bytes as f64;
    let frac = (frac * 8.0).ceil() / 8.0;
    let total_gb = parent_memory_bytes.div_ceil(GIB) as f64;
    let gb = (frac * total_gb).round() as u64;
    if compute_slices == gpu_slices {
        format!("{gpu_slices}g.{gb}gb{suffix}")
    } else {
        format!("{compute_slices}c.{gpu_slices}g.{gb}gb{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_round_trip_the_tables() {
        for product in PRODUCTS {
            let total = product.memory_mib << 20;
            for prof in product.profiles {
                let mem = product.memory_mib * u64::from(prof.memory_slices)
                    / u64::from(product.memory_slices);
                let suffix = prof.name.find('+').map(|i| &prof.name[i..]).unwrap_or("");
                let name = profile_name_from_memory(
                    prof.compute_slices,
                    prof.compute_slices,
                    mem,
                    total,
                    suffix,
                );
                assert_eq!(name, prof.name, "{}", product.name);
            }
        }
    }

    #[test]
    fn nvml_names_find_their_product() {
        let name = |n: &str| lookup_product(n).map(|p| p.name);
        for (nvml, want) in [
            ("NVIDIA A100-SXM4-40GB", Some("A100-40GB")),
            ("NVIDIA A100-PCIE-40GB", Some("A100-40GB")),
            ("NVIDIA A100-SXM4-80GB", Some("A100-80GB")),
            ("NVIDIA A100 80GB PCIe", Some("A100-80GB")),
            ("NVIDIA A30", Some("A30")),
            ("NVIDIA H100 80GB HBM3", Some("H100-80GB")),
            ("NVIDIA H100 PCIe", Some("H100-80GB")),
            ("NVIDIA H200", Some("H200-141GB")),
            ("NVIDIA H200 NVL", Some("H200-141GB")),
            // Same silicon, other profile tables: unknown rather than wrong.
            ("NVIDIA H100 NVL", None),
            ("NVIDIA GH200 480GB", None),
            ("NVIDIA GH200 144G HBM3e", None),
            ("NVIDIA L40S", None),
            // A mistyped size names no product rather than the wrong one.
            ("NVIDIA A100-SXM4-800GB", None),
            ("NVIDIA A100-SXM4-4GB", None),
            ("NVIDIA H100 800GB HBM3", None),
        ] {
            assert_eq!(name(nvml), want, "{nvml}");
        }
    }

    #[test]
    fn real_a100_memory_sizes() {
        // Real A100-80GB MIG memory sizes are a little under the even split.
        let total = 81920u64 << 20;
        assert_eq!(profile_name_from_memory(1, 1, 9728, total, ""), "1g.10gb");
        assert_eq!(profile_name_from_memory(3, 3, 40192, total, ""), "3g.40gb");
    }
}
