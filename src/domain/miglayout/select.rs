//! Which entry of a layout applies to which GPU, and what that GPU should then hold.
//!
//! mig-parted's walk: entries in file order, each applied to every GPU that passes its
//! `device-filter` and `devices`; a GPU matched by several entries ends with the last one.
//! GPUs no entry selects are left alone. A GPU without MIG support is skipped by
//! `devices: all` and by entries with `mig-enabled: false`, and is an error for an entry that
//! names it and enables MIG.
//!
//! `device-filter` values are PCI device ids as mig-parted writes them (`0x20B010DE`: device
//! then vendor) or product names. The NVML inventory carries the product name, not the PCI
//! device id, so an id matches the GPUs of the product it belongs to (the table below: the
//! SXM and PCIe boards of a product share their MIG profiles, which is what the filter is for).
//! A name matches the NVML name case-insensitively as a substring (`A100-SXM4-40GB`,
//! `H100`) or the product's short name (`A100-80GB`).

use node_spec::{GiProfile, Product, lookup_product};

use super::parse::{Devices, LayoutEntry, MigPartedFile};
use super::{MigLayoutError, Result};

/// What the planner needs to know about one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuFacts {
    /// NVML index.
    pub(crate) index: u32,
    /// `GPU-…` UUID.
    pub(crate) uuid: String,
    /// NVML product name.
    pub(crate) product: String,
    /// MIG mode now.
    pub(crate) mig_enabled: bool,
}

/// What a GPU should hold under the selected layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// No entry selects it (or it cannot do MIG and the entry does not insist): left alone.
    Untouched(&'static str),
    /// MIG mode off.
    Disabled,
    /// MIG mode on with these GPU instances (one full compute instance each), sorted.
    Enabled(Vec<&'static GiProfile>),
}

/// PCI device ids (device << 16 | vendor) of MIG-capable boards → product short name.
const DEVICE_IDS: &[(u32, &str)] = &[
    (0x20B0_10DE, "A100-40GB"), // A100-SXM4-40GB
    (0x20F1_10DE, "A100-40GB"), // A100-PCIE-40GB
    (0x20B2_10DE, "A100-80GB"), // A100-SXM4-80GB
    (0x20B5_10DE, "A100-80GB"), // A100 80GB PCIe
    (0x20B7_10DE, "A30"),
    (0x2330_10DE, "H100-80GB"),  // H100 SXM5 80GB
    (0x2331_10DE, "H100-80GB"),  // H100 PCIe
    (0x2335_10DE, "H200-141GB"), // H200 SXM 141GB
];

fn filter_matches(filter: &str, gpu: &GpuFacts) -> bool {
    let product = lookup_product(&gpu.product);
    let hex = filter
        .strip_prefix("0x")
        .or_else(|| filter.strip_prefix("0X"))
        .and_then(|h| u32::from_str_radix(h, 16).ok());
    if let Some(id) = hex {
        return DEVICE_IDS
            .iter()
            .any(|(d, name)| *d == id && product.is_some_and(|p| p.name == *name));
    }
    let f = filter.to_ascii_uppercase();
    gpu.product.to_ascii_uppercase().contains(&f)
        || product.is_some_and(|p| p.name.eq_ignore_ascii_case(filter))
}

fn entry_selects(entry: &LayoutEntry, gpu: &GpuFacts) -> bool {
    let by_filter = entry.device_filter.is_empty()
        || entry.device_filter.iter().any(|f| filter_matches(f, gpu));
    let by_index = match &entry.devices {
        Devices::All => true,
        Devices::Indices(list) => list.contains(&gpu.index),
    };
    by_filter && by_index
}

/// The target of every GPU in `gpus` under `layout` of `file`, in the order of `gpus`.
pub(crate) fn select(file: &MigPartedFile, layout: &str, gpus: &[GpuFacts]) -> Result<Vec<Target>> {
    let entries = file.layout(layout)?;
    gpus.iter()
        .map(|gpu| {
            let Some(entry) = entries.iter().rev().find(|e| entry_selects(e, gpu)) else {
                return Ok(Target::Untouched("no entry of the layout selects this GPU"));
            };
            let fit = |profile: Option<&str>, message: String| MigLayoutError::Fit {
                file: file.origin.clone(),
                layout: layout.to_string(),
                gpu: gpu.index,
                product: gpu.product.clone(),
                profile: profile.map(str::to_string),
                message,
            };
            let Some(product) = lookup_product(&gpu.product) else {
                if entry.mig_enabled && entry.devices != Devices::All {
                    return Err(fit(None, "this GPU does not support MIG".into()));
                }
                return Ok(Target::Untouched("the GPU does not support MIG"));
            };
            if !entry.mig_enabled {
                return Ok(Target::Disabled);
            }
            resolve(product, entry, &fit).map(Target::Enabled)
        })
        .collect()
}

/// The GPU instances of `entry` on `product`, checked to fit.
fn resolve(
    product: &Product,
    entry: &LayoutEntry,
    fit: &dyn Fn(Option<&str>, String) -> MigLayoutError,
) -> Result<Vec<&'static GiProfile>> {
    let table = node_spec::gi_profiles(product);
    let mut out = Vec::new();
    for (name, &count) in &entry.mig_devices {
        if count == 0 {
            continue;
        }
        if let Some((c, rest)) = name.split_once("c.")
            && c.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(fit(
                Some(name),
                format!("compute-instance sub-slices are not supported; use `{rest}`"),
            ));
        }
        let Some(p) = table.iter().find(|p| p.name == name) else {
            let valid: Vec<&str> = table.iter().map(|p| p.name).collect();
            return Err(fit(
                Some(name),
                format!(
                    "no such profile on {} (valid: {})",
                    product.name,
                    valid.join(", ")
                ),
            ));
        };
        if count > p.instance_count {
            return Err(fit(
                Some(name),
                format!(
                    "{count} instances asked, {} holds at most {}",
                    product.name, p.instance_count
                ),
            ));
        }
        out.extend(std::iter::repeat_n(p, count as usize));
    }
    out.sort_by(|a: &&GiProfile, b: &&GiProfile| {
        (b.memory_slices, b.compute_slices, a.name).cmp(&(
            a.memory_slices,
            a.compute_slices,
            b.name,
        ))
    });
    if node_spec::search_placements(product, &out, &[]).is_none() {
        let compute: u32 = out.iter().map(|p| p.compute_slices).sum();
        let memory: u32 = out.iter().map(|p| p.memory_slices).sum();
        return Err(fit(
            None,
            format!(
                "the layout does not fit: {compute}/{} compute and {memory}/{} memory slices, and no set of placements holds every instance",
                product.compute_slices, product.memory_slices
            ),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, product: &str) -> GpuFacts {
        GpuFacts {
            index,
            uuid: format!("GPU-{index}"),
            product: product.into(),
            mig_enabled: true,
        }
    }

    fn file(text: &str) -> MigPartedFile {
        MigPartedFile::parse(text, "layouts.yaml").unwrap()
    }

    #[test]
    fn last_matching_entry_wins_and_unselected_gpus_stay() {
        let f = file(
            "version: v1\nmig-configs:\n  l:\n    - {devices: all, mig-enabled: true, mig-devices: {1g.5gb: 7}}\n    - {devices: [1], mig-enabled: false}\n",
        );
        let gpus = [
            gpu(0, "NVIDIA A100-SXM4-40GB"),
            gpu(1, "NVIDIA A100-SXM4-40GB"),
            gpu(2, "Tesla T4"),
        ];
        let t = select(&f, "l", &gpus).unwrap();
        assert!(matches!(&t[0], Target::Enabled(v) if v.len() == 7));
        assert_eq!(t[1], Target::Disabled);
        assert!(matches!(t[2], Target::Untouched(_)));
        let f = file(
            "version: v1\nmig-configs:\n  l:\n    - {devices: [2], mig-enabled: true, mig-devices: {}}\n",
        );
        let e = select(&f, "l", &gpus).unwrap_err().to_string();
        assert!(
            e.contains("GPU 2") && e.contains("does not support MIG"),
            "{e}"
        );
    }

    #[test]
    fn device_filters() {
        let f = file(
            "version: v1\nmig-configs:\n  l:\n    - {devices: all, device-filter: \"0x20B010DE\", mig-enabled: true, mig-devices: {3g.20gb: 2}}\n    - {devices: all, device-filter: [H100, A30], mig-enabled: false}\n",
        );
        let gpus = [
            gpu(0, "NVIDIA A100-SXM4-40GB"),
            gpu(1, "NVIDIA A100-SXM4-80GB"),
            gpu(2, "NVIDIA H100 80GB HBM3"),
        ];
        let t = select(&f, "l", &gpus).unwrap();
        assert!(matches!(&t[0], Target::Enabled(v) if v.len() == 2));
        assert!(matches!(t[1], Target::Untouched(_)));
        assert_eq!(t[2], Target::Disabled);
    }

    #[test]
    fn layouts_that_do_not_fit_name_file_layout_gpu_and_profile() {
        let gpus = [gpu(0, "NVIDIA A100-SXM4-80GB")];
        let e = select(&file("version: v1\nmig-configs:\n  l:\n    - {devices: all, mig-enabled: true, mig-devices: {1g.5gb: 1}}\n"), "l", &gpus)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layouts.yaml")
                && e.contains("`l`")
                && e.contains("GPU 0")
                && e.contains("`1g.5gb`")
                && e.contains("1g.10gb"),
            "{e}"
        );
        let e = select(&file("version: v1\nmig-configs:\n  l:\n    - {devices: all, mig-enabled: true, mig-devices: {4g.40gb: 1, 3g.40gb: 1, 1g.10gb: 1}}\n"), "l", &gpus)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("does not fit") && e.contains("8/7 compute"),
            "{e}"
        );
        let e = select(&file("version: v1\nmig-configs:\n  l:\n    - {devices: all, mig-enabled: true, mig-devices: {1g.10gb+me: 2}}\n"), "l", &gpus)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 1"), "{e}");
        let e = select(&file("version: v1\nmig-configs:\n  l:\n    - {devices: all, mig-enabled: true, mig-devices: {1c.2g.20gb: 1}}\n"), "l", &gpus)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sub-slices"), "{e}");
    }
}
