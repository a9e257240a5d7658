//! Label rules against the sim profiles: golden files for the whole set (the book's sample
//! in docs/src/fleets.md is `tests/golden/labels-mixed-a100.txt`), explicit values for each GFD rule.

use std::path::Path;

use super::*;
use crate::testkit::fixtures;

fn labels(profile: &str, config: &str) -> NodeLabels {
    let (inv, cfg, plan) = fixtures::planned(profile, config);
    build(&inv, &cfg, &plan)
}

fn get<'a>(l: &'a NodeLabels, key: &str) -> &'a str {
    l.labels
        .get(key)
        .unwrap_or_else(|| panic!("no label {key} in {:#?}", l.labels))
}

const MIXED: &str = "version: v1\nflags:\n  migStrategy: mixed\n";

/// Compare with a checked-in golden (`UPDATE_GOLDEN=1` rewrites it).
fn golden(name: &str, l: &NodeLabels) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("labels-{name}.txt"));
    let text = l.to_feature_file();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).expect("write golden");
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    assert_eq!(
        want,
        text,
        "{} drifted; `UPDATE_GOLDEN=1 cargo test --lib labels` and review",
        path.display()
    );
}

fn assert_all_valid(l: &NodeLabels) {
    for (k, v) in &l.labels {
        assert!(
            is_valid_label_value(v),
            "{k}={v} is not a valid label value"
        );
        let (prefix, name) = k.split_once('/').expect("prefixed key");
        assert!(prefix == "nvidia.com" || prefix == "gpu-slicer.io", "{k}");
        assert!(
            !name.is_empty() && name.len() <= 63 && is_valid_label_value(name),
            "{k}: key name part invalid"
        );
    }
}

#[test]
fn mixed_a100_mixed_strategy_carries_gfd_names() {
    let l = labels("mixed-a100", MIXED);
    assert_all_valid(&l);
    // Whole-GPU labels: every A100 counts, MIG-enabled or not.
    assert_eq!(get(&l, "nvidia.com/gpu.present"), "true");
    assert_eq!(get(&l, "nvidia.com/gpu.product"), "NVIDIA-A100-SXM4-80GB");
    assert_eq!(get(&l, "nvidia.com/gpu.count"), "4");
    assert_eq!(get(&l, "nvidia.com/gpu.memory"), "81920");
    assert_eq!(get(&l, "nvidia.com/gpu.family"), "ampere");
    assert_eq!(get(&l, "nvidia.com/gpu.compute.major"), "8");
    assert_eq!(get(&l, "nvidia.com/gpu.compute.minor"), "0");
    assert_eq!(get(&l, "nvidia.com/gpu.replicas"), "1");
    assert_eq!(get(&l, "nvidia.com/gpu.sharing-strategy"), "none");
    // Driver 570.124.06 and CUDA 12080.
    assert_eq!(get(&l, "nvidia.com/cuda.driver.major"), "570");
    assert_eq!(get(&l, "nvidia.com/cuda.driver.minor"), "124");
    assert_eq!(get(&l, "nvidia.com/cuda.driver.rev"), "06");
    assert_eq!(get(&l, "nvidia.com/cuda.driver-version.full"), "570.124.06");
    assert_eq!(get(&l, "nvidia.com/cuda.runtime.major"), "12");
    assert_eq!(get(&l, "nvidia.com/cuda.runtime.minor"), "8");
    assert_eq!(get(&l, "nvidia.com/mig.capable"), "true");
    assert_eq!(get(&l, "nvidia.com/mig.strategy"), "mixed");
    assert_eq!(get(&l, "nvidia.com/mps.capable"), "false");
    // One set per profile present: 7 + 2 slices of 1g.10gb, one 2g.20gb, one 3g.40gb.
    assert_eq!(get(&l, "nvidia.com/mig-1g.10gb.count"), "9");
    assert_eq!(get(&l, "nvidia.com/mig-2g.20gb.count"), "1");
    assert_eq!(get(&l, "nvidia.com/mig-3g.40gb.count"), "1");
    assert_eq!(
        get(&l, "nvidia.com/mig-1g.10gb.product"),
        "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    );
    assert_eq!(get(&l, "nvidia.com/mig-3g.40gb.slices.gi"), "3");
    assert_eq!(get(&l, "nvidia.com/mig-1g.10gb.replicas"), "1");
    let inv = fixtures::inventory("mixed-a100");
    let m = &inv.gpus[1].mig_devices[0];
    assert_eq!(m.profile, "3g.40gb");
    assert_eq!(
        get(&l, "nvidia.com/mig-3g.40gb.memory"),
        (m.memory_bytes >> 20).to_string()
    );
    assert_eq!(get(&l, ISOLATION_LABEL), "none");
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    golden("mixed-a100", &l);
}

#[test]
fn dgx_h100_is_hopper_without_mig_labels() {
    let l = labels("dgx-h100", "version: v1\n");
    assert_all_valid(&l);
    assert_eq!(get(&l, "nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3");
    assert_eq!(get(&l, "nvidia.com/gpu.count"), "8");
    assert_eq!(get(&l, "nvidia.com/gpu.family"), "hopper");
    assert_eq!(get(&l, "nvidia.com/gpu.compute.major"), "9");
    assert_eq!(get(&l, "nvidia.com/mig.capable"), "true");
    assert!(!l.labels.contains_key("nvidia.com/mig.strategy"));
    assert!(!l.labels.keys().any(|k| k.starts_with("nvidia.com/mig-")));
    golden("dgx-h100", &l);
}

#[test]
fn time_slicing_adds_shared_suffix_and_replicas() {
    let l = labels(
        "dgx-h100",
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    );
    assert_eq!(
        get(&l, "nvidia.com/gpu.product"),
        "NVIDIA-H100-80GB-HBM3-SHARED"
    );
    assert_eq!(get(&l, "nvidia.com/gpu.replicas"), "4");
    assert_eq!(get(&l, "nvidia.com/gpu.sharing-strategy"), "time-slicing");
    assert_eq!(get(&l, "nvidia.com/gpu.count"), "8");
    assert_eq!(get(&l, ISOLATION_LABEL), "none");
    assert_eq!(get(&l, "nvidia.com/mps.capable"), "false");
}

#[test]
fn renamed_shared_resource_keeps_the_plain_product() {
    let l = labels(
        "dgx-h100",
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
    );
    assert_eq!(get(&l, "nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3");
    assert_eq!(get(&l, "nvidia.com/gpu.replicas"), "2");
    assert_eq!(get(&l, "nvidia.com/gpu.sharing-strategy"), "time-slicing");
}

#[test]
fn mps_sharing_labels_strategy_isolation_and_mps_capable() {
    let l = labels(
        "dgx-h100",
        "version: v1\nflags:\n  mpsRoot: /run/nvidia/mps\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n",
    );
    assert_eq!(get(&l, "nvidia.com/gpu.sharing-strategy"), "mps");
    assert_eq!(get(&l, "nvidia.com/gpu.replicas"), "3");
    assert_eq!(
        get(&l, "nvidia.com/gpu.product"),
        "NVIDIA-H100-80GB-HBM3-SHARED"
    );
    assert_eq!(get(&l, "nvidia.com/mps.capable"), "true");
    assert_eq!(get(&l, ISOLATION_LABEL), "mps");
}

#[test]
fn isolation_is_what_every_share_binds() {
    let one = |iso: &str| {
        let cfg = format!(
            "version: v1\nflags:\n  mpsRoot: /run/nvidia/mps\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      isolation: {iso}\n"
        );
        get(&labels("dgx-h100", &cfg), ISOLATION_LABEL).to_string()
    };
    assert_eq!(one("none"), "none");
    assert_eq!(one("memory"), "memory");
    assert_eq!(one("mps"), "mps");
    // `+` is not allowed in a label value.
    assert_eq!(one("memory+mps"), "memory.mps");
    // shares.yaml mixes memory, memory+mps and plain MPS: nothing common to all.
    let shares = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/configs/shares.yaml"),
    )
    .unwrap();
    let l = labels("mixed-a100", &shares);
    assert_all_valid(&l);
    assert_eq!(get(&l, ISOLATION_LABEL), "none");
    // The MPS-shared MIG profile carries its replicas; renamed whole-GPU shares no suffix.
    assert_eq!(get(&l, "nvidia.com/mig-3g.40gb.replicas"), "2");
    assert_eq!(get(&l, "nvidia.com/mig-3g.40gb.sharing-strategy"), "mps");
    assert_eq!(
        get(&l, "nvidia.com/mig-3g.40gb.product"),
        "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb-SHARED"
    );
    assert_eq!(get(&l, "nvidia.com/gpu.product"), "NVIDIA-A100-SXM4-80GB");
    assert_eq!(get(&l, "nvidia.com/gpu.sharing-strategy"), "time-slicing");
}

#[test]
fn single_strategy_on_a_uniform_node_labels_the_slices_as_gpus() {
    // Every A100 in 7 x 1g.10gb: what `single` is for.
    let node = fixtures::inventory("mixed-a100");
    let mut inv = node.clone();
    let template = inv.gpus[0].clone();
    for g in &mut inv.gpus {
        let (uuid, index) = (g.uuid.clone(), g.index);
        *g = template.clone();
        g.uuid = uuid;
        g.index = index;
    }
    let cfg = fixtures::config("version: v1\nflags:\n  migStrategy: single\n");
    let plan = crate::domain::plan::build(&inv, &cfg).expect("single plan");
    let l = build(&inv, &cfg, &plan);
    assert_all_valid(&l);
    assert_eq!(
        get(&l, "nvidia.com/gpu.product"),
        "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    );
    assert_eq!(get(&l, "nvidia.com/gpu.count"), "28");
    assert_eq!(
        get(&l, "nvidia.com/gpu.memory"),
        (template.mig_devices[0].memory_bytes >> 20).to_string()
    );
    assert_eq!(get(&l, "nvidia.com/gpu.slices.gi"), "1");
    assert_eq!(get(&l, "nvidia.com/mig.strategy"), "single");
    // Architecture labels come from the GPUs.
    assert_eq!(get(&l, "nvidia.com/gpu.family"), "ampere");
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
}

#[test]
fn single_strategy_on_a_mixed_layout_is_labelled_invalid() {
    let inv = fixtures::inventory("mixed-a100");
    let cfg = fixtures::config("version: v1\nflags:\n  migStrategy: single\n");
    // The planner refuses this layout; the labels say so as GFD does.
    let l = build(&inv, &cfg, &Plan::default());
    assert_eq!(
        get(&l, "nvidia.com/gpu.product"),
        "NVIDIA-A100-SXM4-80GB-MIG-INVALID"
    );
    assert_eq!(get(&l, "nvidia.com/gpu.count"), "0");
    assert_eq!(get(&l, "nvidia.com/gpu.replicas"), "0");
    assert_eq!(get(&l, "nvidia.com/gpu.sharing-strategy"), "");
    assert_eq!(get(&l, "nvidia.com/gpu.memory"), "0");
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    assert!(
        l.warnings[0].contains("enabled and disabled"),
        "{:?}",
        l.warnings
    );
}

#[test]
fn mig_enabled_only_product_has_sharing_off() {
    // GPUs 0 and 1 alone: MIG on, no whole GPU of the product overrides them.
    let mut inv = fixtures::inventory("mixed-a100");
    inv.gpus.truncate(2);
    let cfg = fixtures::config(MIXED);
    let plan = crate::domain::plan::build(&inv, &cfg).unwrap();
    let l = build(&inv, &cfg, &plan);
    assert_eq!(get(&l, "nvidia.com/gpu.replicas"), "0");
    assert_eq!(get(&l, "nvidia.com/gpu.count"), "2");
}

#[test]
fn no_gpus_no_labels() {
    let l = build(&Inventory::default(), &Config::default(), &Plan::default());
    assert!(l.is_empty());
    assert_eq!(l.to_feature_file(), "");
}

#[test]
fn unparsable_driver_version_is_a_warning_not_a_label() {
    let mut inv = fixtures::inventory("dgx-h100");
    inv.driver_version = Some("570".into());
    let l = build(&inv, &Config::default(), &Plan::default());
    assert!(
        !l.labels
            .keys()
            .any(|k| k.starts_with("nvidia.com/cuda.driver"))
    );
    assert!(l.warnings[0].contains("570"), "{:?}", l.warnings);
    inv.driver_version = Some("550.54".into());
    let l = build(&inv, &Config::default(), &Plan::default());
    assert_eq!(get(&l, "nvidia.com/cuda.driver.rev"), "");
}

#[test]
fn families_follow_compute_capability() {
    for (cc, want) in [
        ((7, 0), "volta"),
        ((7, 5), "turing"),
        ((8, 0), "ampere"),
        ((8, 6), "ampere"),
        ((8, 9), "ada-lovelace"),
        ((9, 0), "hopper"),
        ((10, 0), "blackwell"),
        ((12, 0), "blackwell"),
        ((4, 0), "undefined"),
    ] {
        assert_eq!(family(cc.0, cc.1), want, "{cc:?}");
    }
}

#[test]
fn product_names_are_sanitised_into_valid_values() {
    assert_eq!(sanitise("NVIDIA A100-SXM4-80GB"), "NVIDIA-A100-SXM4-80GB");
    assert_eq!(sanitise("  Tesla   V100 (PCIe)  "), "Tesla-V100-PCIe");
    assert_eq!(sanitise("GeForce RTX™ 4090/Ti"), "GeForce-RTX-4090Ti");
    let long = "NVIDIA ".repeat(20);
    let v = label_value(&long);
    assert!(v.len() <= 63 && is_valid_label_value(&v), "{v}");
    assert_eq!(label_value("-.x_"), "x");
    assert_eq!(label_value("+++"), "");
    let mut inv = fixtures::inventory("dgx-h100");
    let name = format!("{} (rev. 2) ", "Very Long Product Name".repeat(4));
    for g in &mut inv.gpus {
        g.product.clone_from(&name);
    }
    let l = build(&inv, &Config::default(), &Plan::default());
    assert_all_valid(&l);
}

#[test]
fn label_value_validation_matches_kubernetes() {
    for ok in ["", "a", "A-1", "1g.10gb", "x_y.z", &"a".repeat(63)] {
        assert!(is_valid_label_value(ok), "{ok}");
    }
    for bad in ["-a", "a-", "a b", "memory+mps", ".a", &"a".repeat(64), "ü"] {
        assert!(!is_valid_label_value(bad), "{bad}");
    }
}

#[test]
fn several_products_warn_and_pick_the_lowest_index() {
    let mut inv = fixtures::inventory("dgx-h100");
    inv.gpus[0].product = "NVIDIA H200".into();
    let l = build(&inv, &Config::default(), &Plan::default());
    assert_eq!(get(&l, "nvidia.com/gpu.product"), "NVIDIA-H200");
    assert_eq!(get(&l, "nvidia.com/gpu.count"), "1");
    assert!(
        l.warnings[0].contains("several GPU products"),
        "{:?}",
        l.warnings
    );
}

#[test]
fn clique_label_needs_every_attached_gpu_in_one_clique() {
    let mut inv = fixtures::inventory("dgx-h100");
    let l = build(&inv, &Config::default(), &Plan::default());
    assert!(!l.labels.contains_key(CLIQUE_LABEL), "not fabric-attached");
    let clique = crate::domain::topology::fabric_clique([0xab; 16], 32766, 3, 0);
    assert_eq!(
        clique.as_deref(),
        Some("abababab-abab-abab-abab-abababababab.32766")
    );
    assert_eq!(
        crate::domain::topology::fabric_clique([0; 16], 1, 3, 0),
        None
    );
    assert_eq!(
        crate::domain::topology::fabric_clique([1; 16], 1, 2, 0),
        None
    );
    for g in &mut inv.gpus {
        g.fabric_clique.clone_from(&clique);
    }
    let l = build(&inv, &Config::default(), &Plan::default());
    assert_eq!(
        get(&l, CLIQUE_LABEL),
        "abababab-abab-abab-abab-abababababab.32766"
    );
    assert_all_valid(&l);
    inv.gpus[3].fabric_clique = Some("abababab-abab-abab-abab-abababababab.7".into());
    let l = build(&inv, &Config::default(), &Plan::default());
    assert!(!l.labels.contains_key(CLIQUE_LABEL));
    assert!(
        l.warnings.iter().any(|w| w.contains("2 cliques")),
        "{:?}",
        l.warnings
    );
}
