//! What one GPU instance of each MIG profile holds: streaming multiprocessors and engines.
//!
//! These are the `SM`, `CE`, `DEC`, `ENC`, `JPEG` and `OFA` columns of `nvidia-smi mig -lgip`
//! (the `multiprocessorCount`, `copyEngineCount`, `decoderCount`, `encoderCount`, `jpegCount`
//! and `ofaCount` fields of `nvmlGpuInstanceProfileInfo_t`). The DRA ResourceSlices publish
//! them as capacities, so a claim can ask for a MIG device with at least N SMs or a decoder,
//! and the sim backend needs them without a driver to ask.
//!
//! Sources, checked 2026-12 (facts only): `nvidia-smi mig -lgip` listings quoted in the MIG
//! User Guide (A100-40GB) and in public notes and issues (A100-80GB, H100 80GB HBM3, A30).
//! A100 and A30 have no NVENC, so `ENC` is 0 throughout. UNCONFIRMED: H200 (no full `-lgip`
//! with the SM/engine columns was found; the GH100 figures of H100 SXM are used, the same die
//! with the same 132 SMs). Not known: H100 PCIe (114 SMs, other per-profile SM counts), so
//! [`mig_engines`] answers `None` for it rather than a guess.

use crate::products::lookup_product;

/// SMs and engines of one GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigEngines {
    /// Streaming multiprocessors (`SM`).
    pub multiprocessors: u32,
    /// Copy engines (`CE`).
    pub copy_engines: u32,
    /// Video decoders, NVDEC (`DEC`).
    pub decoders: u32,
    /// Video encoders, NVENC (`ENC`).
    pub encoders: u32,
    /// JPEG decoders, NVJPG (`JPEG`).
    pub jpeg_engines: u32,
    /// Optical-flow accelerators (`OFA`).
    pub ofa_engines: u32,
}

const fn e(sm: u32, ce: u32, dec: u32, enc: u32, jpeg: u32, ofa: u32) -> MigEngines {
    MigEngines {
        multiprocessors: sm,
        copy_engines: ce,
        decoders: dec,
        encoders: enc,
        jpeg_engines: jpeg,
        ofa_engines: ofa,
    }
}

/// GA100 (A100 40 GB and 80 GB): 108 SMs, 98 of them usable under MIG; `+me` and the full
/// instance hold the JPEG decoder and the OFA. Profiles in the eight-slice order of
/// `placements` (1g, 1g+me, 1g two-slice, 2g, 3g, 4g, 7g).
const GA100: [MigEngines; 7] = [
    e(14, 1, 0, 0, 0, 0),
    e(14, 1, 1, 0, 1, 1),
    e(14, 1, 1, 0, 0, 0),
    e(28, 2, 1, 0, 0, 0),
    e(42, 3, 2, 0, 0, 0),
    e(56, 4, 2, 0, 0, 0),
    e(98, 7, 5, 0, 1, 1),
];

/// GH100 SXM (H100 80GB HBM3; H200 taken to be the same, see the module header): 132 SMs,
/// one NVDEC and one NVJPG per compute slice, no NVENC, the OFA with `+me` and the full
/// instance.
const GH100_SXM: [MigEngines; 7] = [
    e(16, 1, 1, 0, 1, 0),
    e(16, 1, 1, 0, 1, 1),
    e(26, 1, 1, 0, 1, 0),
    e(32, 2, 2, 0, 2, 0),
    e(60, 3, 3, 0, 3, 0),
    e(64, 4, 4, 0, 4, 0),
    e(132, 8, 7, 0, 7, 1),
];

/// GA100 in A30 (56 SMs, four NVDEC, one NVJPG, one OFA): 1g, 1g+me, 2g, 2g+me, 4g.
const A30: [MigEngines; 5] = [
    e(14, 1, 0, 0, 0, 0),
    e(14, 1, 1, 0, 1, 1),
    e(28, 2, 2, 0, 0, 0),
    e(28, 2, 2, 0, 1, 1),
    e(56, 4, 4, 0, 1, 1),
];

/// Where `profile` (e.g. `1g.10gb+me`) sits in an eight-slice table: by its compute slices,
/// `+me`, and for one compute slice whether it takes two memory slices.
fn eight_slice(
    table: &[MigEngines; 7],
    profiles: &[crate::MigProfileInfo],
    profile: &str,
) -> Option<MigEngines> {
    let info = profiles.iter().find(|p| p.name == profile)?;
    let me = profile.ends_with("+me");
    let i = match (info.compute_slices, info.memory_slices, me) {
        (1, 1, false) => 0,
        (1, 1, true) => 1,
        (1, 2, false) => 2,
        (2, _, false) => 3,
        (3, _, false) => 4,
        (4, _, false) => 5,
        (7, _, false) => 6,
        _ => return None,
    };
    table.get(i).copied()
}

/// The SMs and engines of one `profile` instance on the GPU NVML names `product_name`, when
/// known (see the module header for what is not).
pub fn mig_engines(product_name: &str, profile: &str) -> Option<MigEngines> {
    let product = lookup_product(product_name)?;
    match product.name {
        "A100-40GB" | "A100-80GB" => eight_slice(&GA100, product.profiles, profile),
        "H100-80GB" if !product_name.to_ascii_uppercase().contains("PCIE") => {
            eight_slice(&GH100_SXM, product.profiles, profile)
        }
        "H200-141GB" => eight_slice(&GH100_SXM, product.profiles, profile),
        "A30" => {
            let i = product.profiles.iter().position(|p| p.name == profile)?;
            A30.get(i).copied()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PRODUCTS;

    #[test]
    fn every_profile_of_a_known_product_has_figures_that_add_up() {
        for (nvml_name, product) in [
            ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
            ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
            ("NVIDIA H100 80GB HBM3", "H100-80GB"),
            ("NVIDIA H200", "H200-141GB"),
            ("NVIDIA A30", "A30"),
        ] {
            let p = PRODUCTS.iter().find(|p| p.name == product).unwrap();
            let full = p.profiles.last().unwrap();
            let whole = mig_engines(nvml_name, full.name).unwrap();
            for profile in p.profiles {
                let got = mig_engines(nvml_name, profile.name)
                    .unwrap_or_else(|| panic!("{nvml_name} {}", profile.name));
                // No instance holds more than the full one; SMs grow with compute slices.
                assert!(
                    got.multiprocessors <= whole.multiprocessors,
                    "{}",
                    profile.name
                );
                assert!(got.copy_engines >= 1, "{}", profile.name);
                assert!(got.decoders <= whole.decoders, "{}", profile.name);
                assert!(got.ofa_engines <= whole.ofa_engines, "{}", profile.name);
            }
        }
    }

    #[test]
    fn known_listings() {
        assert_eq!(
            mig_engines("NVIDIA A100-SXM4-80GB", "1g.10gb"),
            Some(e(14, 1, 0, 0, 0, 0))
        );
        assert_eq!(
            mig_engines("NVIDIA A100-SXM4-40GB", "1g.5gb+me"),
            Some(e(14, 1, 1, 0, 1, 1))
        );
        assert_eq!(
            mig_engines("NVIDIA H100 80GB HBM3", "7g.80gb"),
            Some(e(132, 8, 7, 0, 7, 1))
        );
        assert_eq!(
            mig_engines("NVIDIA A30", "4g.24gb"),
            Some(e(56, 4, 4, 0, 1, 1))
        );
        // H100 PCIe: not known, not guessed.
        assert_eq!(mig_engines("NVIDIA H100 PCIe", "1g.10gb"), None);
        assert_eq!(mig_engines("NVIDIA A100-SXM4-80GB", "5g.50gb"), None);
    }
}
