//! The Prometheus rules and the Grafana dashboard in `deploy/monitoring/` ask only for
//! metrics the daemon exports: every metric name in their expressions (and in the rule
//! tests' input series) is a family of a real scrape of the daemon on the sim backend, or a
//! series the rules record. `promtool check rules` / `promtool test rules` run in
//! `hack/validate-manifests.sh`. And a fresh daemon exposes every family from the start.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::domain::config::{self, Overrides};
use crate::platform::sim::SimBackend;
use crate::platform::usage::{CHECKPOINT_FILE, SimUsage};
use crate::runtime::ledger::LedgerSettings;
use crate::runtime::supervisor::{self as app, RunSettings};
use crate::runtime::usage::UsageSettings;
use crate::testkit::kubelet::KubeletEmulator;
use crate::testkit::kubelet::PodRef;
use crate::testkit::{Node, STEP, http, promtool_check, temp_dir, wait_until, within};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// Sample-name suffixes of a family (OpenMetrics counters, histograms, summaries).
const SUFFIXES: &[&str] = &["_total", "_bucket", "_sum", "_count", "_created", "_info"];

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring")
}

/// Metric names in a PromQL expression: identifiers outside string literals that contain
/// `gpu_slicer_` (recorded series carry colons, `cluster:gpu_slicer_…:avg`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut ident = String::new();
    let mut quote: Option<char> = None;
    let mut flush = |ident: &mut String| {
        if ident.contains("gpu_slicer_") {
            names.push(std::mem::take(ident));
        }
        ident.clear();
    };
    let mut prev_escape = false;
    for c in expr.chars() {
        if let Some(q) = quote {
            if c == q && !prev_escape {
                quote = None;
            }
            prev_escape = c == '\\' && !prev_escape;
            continue;
        }
        if c == '"' || c == '\'' || c == '`' {
            flush(&mut ident);
            quote = Some(c);
        } else if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            ident.push(c);
        } else {
            flush(&mut ident);
        }
    }
    flush(&mut ident);
    names
}

#[test]
fn metric_names_skip_strings_labels_and_functions() {
    assert_eq!(
        metric_names(
            r#"sum by (resource) (rate(gpu_slicer_x_total{a="gpu_slicer_not", b=~'q'}[5m])) / cluster:gpu_slicer_y:avg"#
        ),
        vec!["gpu_slicer_x_total", "cluster:gpu_slicer_y:avg"]
    );
}

struct Used {
    /// Names the rules record.
    recorded: BTreeSet<String>,
    /// (where, name) for every metric name an expression reads.
    reads: Vec<(String, String)>,
}

fn used() -> Used {
    let rules: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(monitoring().join("rules.yaml")).unwrap())
            .expect("rules.yaml");
    let mut recorded = BTreeSet::new();
    let mut reads = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let what = rule["record"]
                .as_str()
                .or(rule["alert"].as_str())
                .expect("record or alert")
                .to_string();
            if let Some(r) = rule["record"].as_str() {
                recorded.insert(r.to_string());
            }
            for n in metric_names(rule["expr"].as_str().expect("expr")) {
                reads.push((format!("rules.yaml {what}"), n));
            }
        }
    }
    let tests: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(monitoring().join("rules.test.yaml")).unwrap(),
    )
    .expect("rules.test.yaml");
    for test in tests["tests"].as_sequence().expect("tests") {
        for s in test["input_series"].as_sequence().into_iter().flatten() {
            let series = s["series"].as_str().expect("series");
            for n in metric_names(series.split('{').next().unwrap()) {
                reads.push(("rules.test.yaml input".into(), n));
            }
        }
    }
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(monitoring().join("dashboard.json")).unwrap(),
    )
    .expect("dashboard.json");
    let mut exprs = 0;
    for panel in dash["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().expect("targets") {
            exprs += 1;
            for n in metric_names(t["expr"].as_str().expect("expr")) {
                reads.push((format!("dashboard {}", panel["title"]), n));
            }
        }
    }
    assert!(exprs > 10, "dashboard has its queries");
    for var in dash["templating"]["list"].as_array().expect("templating") {
        if let Some(q) = var["definition"].as_str() {
            for n in metric_names(q) {
                reads.push((format!("dashboard variable {}", var["name"]), n));
            }
        }
    }
    Used { recorded, reads }
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    let (status, body) = http(addr, "GET", "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Family names (`# TYPE <name> <type>`) of the daemon's `/metrics` on the sim backend, as
/// deployed: HTTP and the PodResources ledger on (the allocation families need it).
async fn exported_families() -> BTreeSet<String> {
    let dir = temp_dir();
    let emulator = KubeletEmulator::start(dir.path().join("dp"))
        .await
        .expect("emulator");
    let pod_resources = dir.path().join("pr").join("kubelet.sock");
    emulator
        .serve_pod_resources(&pod_resources)
        .expect("pod-resources");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/configs/mixed-timeslicing.yaml"),
    )
    .unwrap();
    let cfg = config::parse(&text, "mixed-timeslicing.yaml", &Overrides::default()).unwrap();
    let mut settings = RunSettings::new(cfg, dir.path().join("dp"), dir.path().join("cdi"));
    settings.http_listen = Some("127.0.0.1:0".into());
    settings.ledger = Some(LedgerSettings {
        socket: pod_resources,
        interval: Duration::from_millis(50),
    });
    let sim = SimBackend::open("mixed-a100").unwrap();
    settings.usage = Some(UsageSettings {
        source: Box::new(SimUsage::new(sim.spec().clone(), None)),
        interval: Duration::from_millis(50),
        idle_window: Duration::from_millis(100),
        proc_root: dir.path().join("proc"),
        checkpoint: dir.path().join("dp").join(CHECKPOINT_FILE),
    });
    let h = Node::launch(dir, emulator, settings, Arc::new(sim))
        .await
        .expect("daemon started");
    let addr = h.running.probe().http_addr.expect("http enabled");
    // One held share: the per-holder families have series only while something is held.
    let pod = PodRef {
        namespace: "ml".into(),
        name: "p".into(),
        container: "main".into(),
    };
    h.emulator
        .allocate_for(pod, "nvidia.com/gpu", 1)
        .await
        .expect("allocate");
    // Scrape once the ledger has reconciled and the sampler has seen the holder.
    let body = wait_until(STEP, || async {
        let body = scrape(addr).await;
        (body.contains("gpu_slicer_ledger_up 1")
            && body.contains("gpu_slicer_share_memory_granted_bytes{"))
        .then_some(body)
    })
    .await
    .expect("ledger and usage families");
    h.stop().await.expect("clean stop");
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn is_exported(name: &str, families: &BTreeSet<String>) -> bool {
    families.contains(name)
        || SUFFIXES.iter().any(|s| {
            name.strip_suffix(s)
                .is_some_and(|base| families.contains(base))
        })
}

#[tokio::test]
async fn rules_and_dashboard_use_only_exported_metrics() {
    let families = exported_families().await;
    assert!(
        families.contains("gpu_slicer_allocatable_devices"),
        "scrape parsed: {families:?}"
    );
    let used = used();
    let mut missing = Vec::new();
    for (place, name) in &used.reads {
        if name.contains(':') {
            if !used.recorded.contains(name) {
                missing.push(format!("{place}: {name} (not recorded by rules.yaml)"));
            }
        } else if !is_exported(name, &families) {
            missing.push(format!("{place}: {name}"));
        }
    }
    assert!(
        missing.is_empty(),
        "not exported by the daemon:\n{}",
        missing.join("\n")
    );
}

/// The metrics of a fresh daemon (moved from tests/compat.rs, item 21): every family is
/// there before anything happened, and the scrape passes promtool.
#[tokio::test]
async fn a_fresh_daemon_exposes_every_family_and_passes_promtool() {
    let dir = temp_dir();
    let config = config::parse(
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n",
        "test.yaml",
        &Overrides::default(),
    )
    .expect("config");
    let backend = Arc::new(SimBackend::open("dgx-h100").expect("profile"));
    let mut settings = RunSettings::new(config, dir.path().join("dp"), dir.path().join("cdi"));
    settings.http_listen = Some("127.0.0.1:0".into());
    let (tx, rx) = oneshot::channel();
    settings.on_ready = Some(tx);
    let shutdown = CancellationToken::new();
    let app = tokio::spawn(app::run(settings, backend, shutdown.clone()));
    let running = within("daemon ready", rx).await.expect("ready");
    let addr = running.probe().http_addr.expect("http");
    // Per-resource series follow the first publication, asynchronously.
    let body = wait_until(STEP, || async {
        let body = scrape(addr).await;
        body.contains("gpu_slicer_device_healthy{").then_some(body)
    })
    .await
    .expect("per-resource series");
    for sample in [
        "gpu_slicer_build_info{version=\"",
        "gpu_slicer_config_reloads_total{outcome=\"ok\"} 0",
        "gpu_slicer_config_reloads_total{outcome=\"failed\"} 0",
        "gpu_slicer_config_entries_skipped{reason=\"resource-not-on-node\"} 0",
        "gpu_slicer_config_entries_skipped{reason=\"no-matching-devices\"} 0",
        "gpu_slicer_ledger_up ",
        "gpu_slicer_ledger_drift_devices ",
        "gpu_slicer_allocatable_devices{resource=\"nvidia.com/gpu\"} 16",
        "gpu_slicer_unhealthy_devices{resource=\"nvidia.com/gpu\"} 0",
        "gpu_slicer_kubelet_registrations_total{resource=\"nvidia.com/gpu\"} 0",
        "gpu_slicer_allocate_rejections_total{resource=\"nvidia.com/gpu\",rule=\"unknown-device\"} 0",
        "gpu_slicer_allocate_duration_seconds_count{resource=\"nvidia.com/gpu\"} 0",
        "gpu_slicer_preferred_allocation_duration_seconds_count{resource=\"nvidia.com/gpu\"} 0",
    ] {
        assert!(body.contains(sample), "missing {sample:?} in:\n{body}");
    }
    promtool_check(&body);
    shutdown.cancel();
    within("stop", app)
        .await
        .expect("join")
        .expect("clean stop");
}
