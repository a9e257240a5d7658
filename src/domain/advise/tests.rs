//! Unit tests of `advise`: grouping, classification, shares, packing against the lower bound
//! and the exact optimum, and the plan loading in the project's own parsers.

use super::input::{Export, GpuRecord, MemoryStat, PodRecord, Stat};
use super::pack::{self, GpuShape, Item, Model, ShareKind};
use super::workload::{Class, owner_of};
use super::*;

const GIB: u64 = 1 << 30;
const H100: &str = "NVIDIA H100 80GB HBM3";
const H100_BYTES: u64 = 81559 * (1 << 20);
const L4: &str = "NVIDIA L4";
const L4_BYTES: u64 = 23034 * (1 << 20);

fn gpu(node: &str, i: usize, model: &str, bytes: u64, util: f64) -> GpuRecord {
    GpuRecord {
        node: node.into(),
        uuid: format!("GPU-{node}-{i}"),
        model: model.into(),
        memory_total_bytes: bytes,
        utilization: Stat {
            mean: util,
            p95: (util * 2.0).min(1.0),
        },
    }
}

fn pod(ns: &str, name: &str, gpus: &[&str], peak_gib: f64, p95: f64, mean: f64) -> PodRecord {
    let peak = (peak_gib * GIB as f64) as u64;
    PodRecord {
        namespace: ns.into(),
        pod: name.into(),
        container: "main".into(),
        gpus: gpus.iter().map(|s| s.to_string()).collect(),
        memory: MemoryStat {
            peak_bytes: peak,
            p99_bytes: peak * 9 / 10,
        },
        compute: Stat { mean, p95 },
        history_seconds: 7.0 * 86400.0,
        ..PodRecord::default()
    }
}

/// Two H100 nodes of 4 GPUs, one pod per GPU: 6 small inference pods of 3 workloads and a
/// training pod on 2 GPUs (8 GPUs held).
fn small_fleet() -> Export {
    let mut gpus = Vec::new();
    for n in ["node-a", "node-b"] {
        for i in 0..4 {
            gpus.push(gpu(n, i, H100, H100_BYTES, 0.1));
        }
    }
    let pods = vec![
        pod(
            "ml",
            "chat-7d9f8b6c5d-x2k4p",
            &["GPU-node-a-0"],
            6.0,
            0.2,
            0.1,
        ),
        pod(
            "ml",
            "chat-7d9f8b6c5d-q9z8w",
            &["GPU-node-a-1"],
            7.0,
            0.2,
            0.1,
        ),
        pod(
            "ml",
            "embed-6c5d7d9f8b-bcdfg",
            &["GPU-node-a-2"],
            3.0,
            0.1,
            0.05,
        ),
        pod(
            "ml",
            "embed-6c5d7d9f8b-hjklm",
            &["GPU-node-a-3"],
            3.5,
            0.1,
            0.05,
        ),
        pod("ml", "rank-0", &["GPU-node-b-0"], 15.0, 0.3, 0.2),
        pod("ml", "rank-1", &["GPU-node-b-1"], 14.0, 0.3, 0.2),
        pod(
            "research",
            "train-x7k2p",
            &["GPU-node-b-2", "GPU-node-b-3"],
            70.0,
            0.99,
            0.9,
        ),
    ];
    Export {
        version: "v1".into(),
        source: "gpu-slicer".into(),
        window_seconds: 7.0 * 86400.0,
        gpus,
        pods,
    }
}

#[test]
fn pod_names_lose_their_generated_suffixes() {
    assert_eq!(owner_of("chat-7d9f8b6c5d-x2k4p"), "chat");
    assert_eq!(owner_of("batch-job-x7k2p"), "batch-job");
    assert_eq!(owner_of("db-0"), "db");
    assert_eq!(owner_of("plain"), "plain");
    // `-main` is not a generated suffix (vowels are not in the alphabet).
    assert_eq!(owner_of("my-main"), "my-main");
}

#[test]
fn workloads_are_grouped_measured_and_explained() {
    let a = advise(&small_fleet(), &Settings::default());
    let names: Vec<_> = a.workloads.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["chat", "embed", "rank", "train"]);
    let chat = &a.workloads[0];
    assert_eq!(chat.pods, 2);
    assert_eq!(chat.peak_bytes, 7 * GIB);
    assert_eq!(chat.class, Class::Shared);
    let train = &a.workloads[3];
    assert_eq!(train.class, Class::Training);
    assert!(train.reason.contains("multi-GPU"), "{}", train.reason);
}

#[test]
fn short_history_and_bursty_memory_are_kept_with_the_reason() {
    let mut e = small_fleet();
    e.pods[0].history_seconds = 3600.0;
    e.pods[1].history_seconds = 7200.0;
    e.pods[2].memory.p99_bytes = e.pods[2].memory.peak_bytes / 10;
    e.pods[3].memory.p99_bytes = e.pods[3].memory.peak_bytes / 10;
    let a = advise(&e, &Settings::default());
    assert_eq!(a.workloads[0].class, Class::Kept);
    assert!(
        a.workloads[0].reason.contains("--min-history"),
        "{}",
        a.workloads[0].reason
    );
    assert_eq!(a.workloads[1].class, Class::Kept);
    assert!(
        a.workloads[1].reason.contains("bursty"),
        "{}",
        a.workloads[1].reason
    );
    assert_eq!(a.warnings.len(), 2);
    // Kept at their current size: one whole GPU per pod.
    assert_eq!(a.grants[0].resource, ("nvidia.com/gpu".to_string(), 1));
}

#[test]
fn an_override_file_reclassifies_by_name_or_label() {
    let mut e = small_fleet();
    e.pods[4].labels.insert("team".into(), "search".into());
    let text = "overrides:\n- name: chat\n  class: kept\n  reason: SLO\n- selector: {team: search}\n  class: training\n";
    let s = Settings {
        overrides: workload::Overrides::parse(text, "o.yaml").unwrap(),
        ..Settings::default()
    };
    let a = advise(&e, &s);
    assert_eq!(a.workloads[0].class, Class::Kept);
    assert_eq!(a.workloads[0].reason, "override (SLO)");
    assert_eq!(a.workloads[2].class, Class::Training);
    let bad = workload::Overrides::parse("overrides:\n- class: huge\n", "o.yaml").unwrap_err();
    assert!(
        bad.to_string().contains("o.yaml") && bad.to_string().contains("class"),
        "{bad}"
    );
}

#[test]
fn no_share_is_smaller_than_peak_plus_headroom() {
    let a = advise(&small_fleet(), &Settings::default());
    for (w, g) in a.workloads.iter().zip(&a.grants) {
        // A whole GPU is the most there is: headroom stops there, the peak never does.
        let need = ((w.peak_bytes as f64 * 1.15) as u64).min(w.gpu_memory_bytes);
        assert!(g.memory_bytes >= w.peak_bytes);
        assert!(
            g.memory_bytes >= need,
            "{}: {} < {need}",
            w.name,
            g.memory_bytes
        );
    }
}

#[test]
fn shares_pick_the_smaller_fraction_of_a_gpu() {
    let m = Model::new(H100, H100_BYTES);
    // 3.4 GiB: a replica of 1/16 (5 GiB) takes less than 1g.10gb (1/7 of compute).
    assert_eq!(
        m.share_for(34 * GIB / 10, 0.05),
        Some(ShareKind::Replicas(16))
    );
    // 8 GiB with 30 % compute: a 1/8 replica (0.3: its compute) beats 3g.40gb (the smallest
    // profile with 30 % of the SMs: 0.5).
    assert_eq!(m.share_for(8 * GIB, 0.3), Some(ShareKind::Replicas(8)));
    // 35 GiB with 40 % compute: 1/2 replica (0.5) vs 3g.40gb (max(4/8, 3/7) = 0.5): tie to MIG.
    assert_eq!(m.share_for(35 * GIB, 0.4), Some(ShareKind::Mig("3g.40gb")));
    // No MIG on an L4: replicas only.
    let l4 = Model::new(L4, L4_BYTES);
    assert_eq!(l4.product, None);
    assert_eq!(l4.share_for(5 * GIB, 0.1), Some(ShareKind::Replicas(4)));
    // More than half a GPU fits no share.
    assert_eq!(l4.share_for(13 * GIB, 0.1), None);
}

fn item(w: usize, grant_gib: f64, p95: f64, profile: Option<&str>) -> Item {
    Item {
        workload: w,
        grant_bytes: (grant_gib * GIB as f64) as u64,
        compute_p95: p95,
        compute_mean: p95 / 2.0,
        profile: profile.and_then(|p| node_spec::gi_profile(H100, p)),
    }
}

#[test]
fn mig_packing_follows_the_placement_rules() {
    let m = Model::new(H100, H100_BYTES);
    // 4g.40gb + 3g.40gb fill a GPU; two 4g never share one.
    let items = vec![
        item(0, 30.0, 0.4, Some("4g.40gb")),
        item(1, 30.0, 0.4, Some("4g.40gb")),
        item(2, 30.0, 0.3, Some("3g.40gb")),
        item(3, 30.0, 0.3, Some("3g.40gb")),
    ];
    let bins = pack::first_fit_decreasing(&m, ShareKind::Mig(""), &items);
    assert_eq!(bins.len(), 2);
    for b in &bins {
        assert_eq!(b.shape, GpuShape::Mig(vec!["3g.40gb", "4g.40gb"]));
    }
    // Seven 1g.10gb fill one GPU; the eighth opens another.
    let ones: Vec<Item> = (0..8).map(|i| item(i, 8.0, 0.1, Some("1g.10gb"))).collect();
    let bins = pack::first_fit_decreasing(&m, ShareKind::Mig(""), &ones);
    assert_eq!(
        bins.iter().map(|b| b.items.len()).collect::<Vec<_>>(),
        [7, 1]
    );
}

#[test]
fn replica_packing_respects_count_and_compute() {
    let m = Model::new(H100, H100_BYTES);
    // 6 items at 40 % p95 on 4-way replicas: 2 per GPU by compute.
    let items: Vec<Item> = (0..6).map(|i| item(i, 15.0, 0.4, None)).collect();
    let bins = pack::first_fit_decreasing(&m, ShareKind::Replicas(4), &items);
    assert_eq!(bins.len(), 3);
    assert_eq!(pack::lower_bound(&m, &items), 3);
    // 9 light items on 4-way replicas: count bounds it.
    let light: Vec<Item> = (0..9).map(|i| item(i, 15.0, 0.05, None)).collect();
    assert_eq!(
        pack::first_fit_decreasing(&m, ShareKind::Replicas(4), &light).len(),
        3
    );
}

#[test]
fn exact_packing_beats_first_fit_where_first_fit_is_poor() {
    let m = Model::new(H100, H100_BYTES);
    // Compute sizes where FFD needs 3 bins and 2 suffice: 0.5 0.4 0.3 0.3 0.3 0.2
    // FFD: [0.5 0.4] [0.3 0.3 0.3] [0.2]? no: [0.5 0.4] then 0.3 -> bin2, 0.3, 0.3 -> bin2
    // (0.9), 0.2 -> ... use a classic case instead: 0.45 0.45 0.35 0.35 0.2 0.2.
    let sizes = [0.45, 0.45, 0.35, 0.35, 0.2, 0.2];
    let items: Vec<Item> = sizes
        .iter()
        .enumerate()
        .map(|(i, &c)| item(i, 4.0, c, None))
        .collect();
    let ffd = pack::first_fit_decreasing(&m, ShareKind::Replicas(16), &items);
    let best = pack::exact(&m, ShareKind::Replicas(16), &items, 10).unwrap();
    assert_eq!(best.len(), 2, "{best:?}");
    assert!(ffd.len() >= best.len());
    for b in &best {
        let c: f64 = b.items.iter().map(|&i| items[i].compute_p95).sum();
        assert!(c <= 1.0 + 1e-9);
    }
    assert!(pack::exact(&m, ShareKind::Replicas(16), &items, 3).is_none());
}

#[test]
fn the_plan_beats_whole_gpus_and_reports_the_bound() {
    let a = advise(&small_fleet(), &Settings::default());
    assert_eq!(a.gpus_before(), 8);
    // train: 2 whole GPUs; the 6 small pods (0.2 + 0.2 + 0.1 + 0.1 + 0.3 + 0.3 of compute
    // at p95, 49 GiB with headroom) fit 2 more.
    assert!(a.gpus_after() <= 4, "{}", a.gpus_after());
    assert!(a.lower_bound() <= a.gpus_after());
    assert!(a.models.iter().all(|m| m.exact));
    let s = report::summary(&a);
    assert_eq!(s.gpus_freed, 8 - a.gpus_after() as i64);
    assert!(s.utilization_after > s.utilization_before);
}

#[test]
fn the_plan_loads_in_the_config_and_mig_layout_parsers() {
    let a = advise(&small_fleet(), &Settings::default());
    let files = emit::files(&a);
    assert!(files.contains_key("configs/default.yaml"));
    assert!(files.contains_key("kustomization.yaml"));
    for (path, text) in &files {
        if path.starts_with("configs/") {
            crate::domain::config::parse(text, path, &Default::default())
                .unwrap_or_else(|e| panic!("{path}: {e}\n{text}"));
        }
    }
    if let Some(mig) = files.get("mig-parted.yaml") {
        let f = crate::domain::miglayout::parse::MigPartedFile::parse(mig, "mig-parted.yaml")
            .unwrap_or_else(|e| panic!("{e}\n{mig}"));
        for p in a
            .fleet
            .pools
            .iter()
            .filter(|p| p.shapes.iter().any(|s| matches!(s, GpuShape::Mig(_))))
        {
            f.layout(&p.name).unwrap();
        }
    }
    // Every node is labelled, into a pool that has a config.
    for n in &a.fleet.nodes {
        assert!(
            files.contains_key(&format!("configs/{}.yaml", n.pool)),
            "{}",
            n.pool
        );
    }
}

#[test]
fn the_same_input_gives_the_same_bytes() {
    let s = Settings {
        dra: true,
        gpu_hour_price: Some(2.5),
        ..Settings::default()
    };
    let a = advise(&small_fleet(), &s);
    let b = advise(&small_fleet(), &s);
    assert_eq!(emit::files(&a), emit::files(&b));
    let (sa, sb) = (report::summary(&a), report::summary(&b));
    assert_eq!(report::html(&a, &sa), report::html(&b, &sb));
    assert!(emit::files(&a).contains_key("claim-templates.yaml"));
}

#[test]
fn the_report_is_self_contained() {
    let a = advise(&small_fleet(), &Settings::default());
    let s = report::summary(&a);
    let h = report::html(&a, &s);
    assert!(h.starts_with("<!DOCTYPE html>"));
    assert!(!h.contains("<script"));
    // The only URL is the SVG namespace (an identifier, never fetched).
    let urls = h.matches("http").count();
    assert_eq!(urls, h.matches("http://www.w3.org/2000/svg").count());
    assert!(h.contains("<svg"));
}

#[test]
fn the_export_is_checked_with_the_field_named() {
    let mut e = small_fleet();
    e.pods[0].gpus = vec!["GPU-nope".into()];
    let text = serde_json::to_string(&e).unwrap();
    let err = Export::parse(&text, "x.json").unwrap_err().to_string();
    assert!(
        err.contains("x.json") && err.contains("pods[0].gpus[0]") && err.contains("GPU-nope"),
        "{err}"
    );
    let err = Export::parse("{\"version\": \"v1\", \"gpus\": 3}", "y.json")
        .unwrap_err()
        .to_string();
    assert!(err.contains("y.json") && err.contains("gpus"), "{err}");
}

#[test]
fn promql_answers_assemble_into_an_export() {
    use super::promql::{Family, Key, Sample, assemble, queries};
    use std::collections::BTreeMap;
    let s = |labels: &[(&str, &str)], value: f64| Sample {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        value,
    };
    let q = queries(Family::Dcgm, 604800, 300);
    assert!(q.iter().all(|(_, q)| q.contains("604800s")));
    // Utilisation figures read every sample (a `[w:step]` subquery would see one point a
    // step and miss shorter bursts), engine activity where exported, else GPU_UTIL / 100.
    for key in [
        Key::GpuUtilMean,
        Key::GpuUtilP95,
        Key::PodComputeP95,
        Key::PodComputeMean,
    ] {
        let (_, text) = q.iter().find(|(k, _)| *k == key).unwrap();
        assert!(!text.contains(":300s"), "{text}");
        assert!(
            text.contains("DCGM_FI_PROF_GR_ENGINE_ACTIVE") && text.contains("[604800s]) / 100)"),
            "{text}"
        );
    }
    let mut answers = BTreeMap::new();
    answers.insert(
        Key::GpuMemory,
        vec![s(
            &[("UUID", "GPU-1"), ("modelName", H100), ("Hostname", "n1")],
            81559.0,
        )],
    );
    answers.insert(Key::GpuUtilMean, vec![s(&[("UUID", "GPU-1")], 0.2)]);
    let pod = [
        ("UUID", "GPU-1"),
        ("namespace", "ml"),
        ("pod", "chat-0"),
        ("container", "main"),
    ];
    answers.insert(Key::PodPeak, vec![s(&pod, 4096.0)]);
    answers.insert(Key::PodP99, vec![s(&pod, 3000.0)]);
    answers.insert(Key::PodFirst, vec![s(&pod, 1000.0)]);
    answers.insert(Key::PodLast, vec![s(&pod, 91000.0)]);
    answers.insert(Key::PodComputeP95, vec![s(&pod, 0.3)]);
    let e = assemble(Family::Dcgm, 604800, &answers);
    e.check("prometheus").unwrap();
    assert_eq!(e.gpus[0].memory_total_bytes, H100_BYTES);
    assert_eq!(e.pods[0].memory.peak_bytes, 4096 << 20);
    assert_eq!(e.pods[0].history_seconds, 90000.0);
    assert_eq!(e.pods[0].compute.p95, 0.3);
    assert_eq!(e.pods[0].gpus, ["GPU-1"]);
    // gpu-slicer's series carry no product name: the closest product by memory.
    assert_eq!(super::promql::model_from_memory(H100_BYTES), H100);
    assert_eq!(
        super::promql::model_from_memory(81920 << 20),
        "NVIDIA A100-SXM4-80GB"
    );
    assert_eq!(super::promql::model_from_memory(L4_BYTES), "GPU 22 GiB");
}

#[test]
fn every_packed_gpu_holds_what_it_is_given_on_synthetic_fleets() {
    for seed in 1..=6 {
        let text = crate::bench::advise_fleet(64, 4, seed);
        let e = Export::parse(&text, "synthetic").unwrap();
        let a = advise(&e, &Settings::default());
        let mut placed = vec![0usize; a.workloads.len()];
        for m in &a.models {
            let model = Model::new(&m.model, m.memory_bytes);
            for b in &m.bins {
                let p95: f64 = b
                    .workloads
                    .iter()
                    .map(|&w| a.workloads[w].compute_p95)
                    .sum();
                match &b.shape {
                    GpuShape::Whole => assert_eq!(b.workloads.len(), 1),
                    GpuShape::Replicas {
                        replicas,
                        memory_bytes,
                    } => {
                        assert!(b.workloads.len() as u64 <= *replicas, "seed {seed}: {b:?}");
                        assert!(p95 <= 1.0 + 1e-9, "seed {seed}: {b:?}");
                        assert!(replicas * memory_bytes <= m.memory_bytes);
                        for &w in &b.workloads {
                            let need = grant_bytes(&a.workloads[w], 0.15);
                            assert!(
                                *memory_bytes >= need,
                                "seed {seed}: {w} {need} > {memory_bytes}"
                            );
                        }
                    }
                    GpuShape::Mig(names) => {
                        assert!(p95 <= 1.0 + 1e-9, "seed {seed}: {b:?}");
                        let product = model.product.unwrap();
                        let profiles: Vec<_> = names
                            .iter()
                            .map(|n| node_spec::gi_profile(&m.model, n).unwrap())
                            .collect();
                        assert!(node_spec::search_placements(product, &profiles, &[]).is_some());
                    }
                }
                for &w in &b.workloads {
                    placed[w] += 1;
                }
            }
        }
        for (i, w) in a.workloads.iter().enumerate() {
            assert_eq!(
                placed[i],
                w.pods * a.grants[i].resource.1,
                "seed {seed}: {}",
                w.name
            );
        }
        assert_eq!(a.fleet.unplaced, 0);
        for n in &a.fleet.nodes {
            assert!(n.used <= n.gpus);
        }
        assert!(a.lower_bound() <= a.gpus_after() && a.gpus_after() < a.gpus_before());
    }
}
