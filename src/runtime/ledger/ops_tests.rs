//! Operating the daemon: the PodResources ledger against the kubelet emulator, metrics of a
//! running daemon scraped over real HTTP (and checked by `promtool`), and the probes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::domain::config::{self, Overrides};
use crate::domain::inventory::{Backend, Health};
use crate::platform::sim::SimBackend;
use crate::runtime::Context;
use crate::runtime::ledger::{self, LedgerPeers, LedgerSettings, LedgerSnapshot};
use crate::runtime::plugin::Backoff;
use crate::runtime::supervisor::{self as app, RunSettings};
use crate::state::Store;
use crate::testkit::fixtures;
use crate::testkit::kubelet::{KubeletEmulator, PodRef};
use crate::testkit::{STEP, http, promtool_check, temp_dir, wait_until, within};

const CONFIG: &str =
    "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n";
const GPU: &str = "nvidia.com/gpu";

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(addr, "GET", path).await
}

/// Scrape until `pred` holds on the body (metrics follow events asynchronously).
async fn scrape_until(addr: SocketAddr, what: &str, pred: impl Fn(&str) -> bool) -> String {
    wait_until(STEP, || async {
        let (code, body) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        pred(&body).then_some(body)
    })
    .await
    .unwrap_or_else(|| panic!("timed out: {what}"))
}

async fn wait_snapshot(
    rx: &mut watch::Receiver<Arc<LedgerSnapshot>>,
    what: &str,
    pred: impl FnMut(&Arc<LedgerSnapshot>) -> bool,
) -> Arc<LedgerSnapshot> {
    within(what, rx.wait_for(pred))
        .await
        .expect("ledger running")
        .clone()
}

#[tokio::test]
async fn running_daemon_reports_ledger_metrics_and_probes() {
    let dir = temp_dir();
    let plugin_dir = dir.path().join("dp");
    let pod_resources = dir.path().join("pr").join("kubelet.sock");
    let config = config::parse(CONFIG, "test.yaml", &Overrides::default()).expect("config");
    let backend = Arc::new(SimBackend::open("dgx-h100").expect("profile"));
    let mut settings = RunSettings::new(config, &plugin_dir, dir.path().join("cdi"));
    settings.backoff = Backoff {
        initial: Duration::from_millis(2),
        max: Duration::from_millis(100),
    };
    settings.http_listen = Some("127.0.0.1:0".into());
    settings.ledger = Some(LedgerSettings {
        socket: pod_resources.clone(),
        interval: Duration::from_millis(50),
    });
    let (tx, rx) = oneshot::channel();
    settings.on_ready = Some(tx);
    let shutdown = CancellationToken::new();
    // The daemon starts before the kubelet: it serves HTTP but is not ready.
    let app = tokio::spawn(app::run(settings, backend, shutdown.clone()));
    let running = within("daemon ready", rx).await.expect("daemon ready");
    let addr = running.probe().http_addr.expect("http enabled");
    assert_eq!(get(addr, "/healthz").await.0, 200);
    let (code, body) = get(addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("not registered with the kubelet: nvidia.com/gpu"),
        "{body}"
    );
    assert!(
        !body.contains("CDI spec"),
        "the spec is written before serving: {body}"
    );
    assert_eq!(get(addr, "/nope").await.0, 404);

    let emulator = KubeletEmulator::start(&plugin_dir).await.expect("emulator");
    emulator
        .serve_pod_resources(&pod_resources)
        .expect("pod-resources");
    within(
        "registration",
        emulator.wait_registered(&[GPU.to_string()], 1),
    )
    .await;
    wait_until(STEP, || async {
        (get(addr, "/readyz").await.0 == 200).then_some(())
    })
    .await
    .expect("ready");

    let pod = PodRef {
        namespace: "team-a".into(),
        name: "trainer".into(),
        container: "main".into(),
    };
    let allocation = emulator.allocate_for(pod, GPU, 2).await.expect("allocate");
    assert!(
        emulator
            .allocate_ids(GPU, &["no-such-device".into()])
            .await
            .is_err(),
        "an unknown ID is refused"
    );
    let mut ledger = running.probe().ledger.clone().expect("ledger").subscribe();
    let snapshot = wait_snapshot(&mut ledger, "ledger sees the allocation", |s| {
        s.allocated_ids(GPU).len() == 2
    })
    .await;
    assert!(snapshot.up);
    assert_eq!(
        snapshot.allocated_ids(GPU),
        allocation.device_ids.iter().cloned().collect()
    );
    assert_eq!(snapshot.drift, vec![], "emulator and plan agree");

    running
        .probe()
        .store
        .set_health(&allocation.device_ids[0], Health::Unhealthy, "xid-79")
        .expect("known device");
    let body = scrape_until(addr, "health reaches metrics", |b| {
        b.contains("gpu_slicer_unhealthy_devices{resource=\"nvidia.com/gpu\"} 1")
    })
    .await;
    for line in [
        "gpu_slicer_allocatable_devices{resource=\"nvidia.com/gpu\"} 15",
        "gpu_slicer_allocated_devices{resource=\"nvidia.com/gpu\"} 2",
        "gpu_slicer_allocate_duration_seconds_count{resource=\"nvidia.com/gpu\"} 2",
        "gpu_slicer_preferred_allocation_duration_seconds_count{resource=\"nvidia.com/gpu\"} 1",
        "gpu_slicer_allocate_rejections_total{resource=\"nvidia.com/gpu\",rule=\"unknown-device\"} 1",
        "gpu_slicer_kubelet_registrations_total{resource=\"nvidia.com/gpu\"} 1",
        "gpu_slicer_ledger_up 1",
    ] {
        assert!(body.contains(line), "missing {line}\n{body}");
    }
    let unhealthy = format!(
        "gpu_slicer_device_healthy{{resource=\"nvidia.com/gpu\",device=\"{}\",reason=\"xid-79\"}} 0",
        allocation.device_ids[0]
    );
    assert!(body.contains(&unhealthy), "missing {unhealthy}\n{body}");
    for id in &allocation.device_ids {
        let series = format!(
            "gpu_slicer_pod_device_allocation{{namespace=\"team-a\",pod=\"trainer\",container=\"main\",resource=\"nvidia.com/gpu\",device=\"{id}\"}} 1"
        );
        assert!(body.contains(&series), "missing {series}\n{body}");
    }
    assert_eq!(
        body.matches("gpu_slicer_device_healthy{").count(),
        16,
        "one series per device, none stale"
    );
    promtool_check(&body);

    // A device held while unhealthy is drift; releasing the pod removes its series.
    let snapshot = wait_snapshot(&mut ledger, "drift of the unhealthy device", |s| {
        !s.drift.is_empty()
    })
    .await;
    assert_eq!(snapshot.drift.len(), 1, "{:?}", snapshot.drift);
    emulator.release("team-a", "trainer");
    wait_snapshot(&mut ledger, "release", |s| s.allocated_ids(GPU).is_empty()).await;
    let body = scrape_until(addr, "pod series removed", |b| {
        !b.contains("gpu_slicer_pod_device_allocation{")
    })
    .await;
    assert!(body.contains("gpu_slicer_allocated_devices{resource=\"nvidia.com/gpu\"} 0"));
    assert!(body.contains("gpu_slicer_ledger_drift_devices 0"), "{body}");

    shutdown.cancel();
    within("daemon stop", app)
        .await
        .expect("join")
        .expect("clean stop");
    emulator.shutdown().await;
}

#[tokio::test]
async fn ledger_degrades_without_the_socket_and_recovers() {
    let dir = temp_dir();
    let socket = dir.path().join("pod-resources").join("kubelet.sock");
    let inventory = SimBackend::open("dgx-h100")
        .expect("profile")
        .discover()
        .expect("inventory");
    let config = config::parse(CONFIG, "test.yaml", &Overrides::default()).expect("config");
    let plan = crate::domain::plan::build(&inventory, &config).expect("plan");
    let health = Store::new(crate::domain::snapshot::Snapshot::serving(
        config, inventory, plan,
    ));
    let ctx = Context::new(health);
    let (metrics, tracker, token) = (ctx.metrics.clone(), ctx.tracker.clone(), ctx.token.clone());
    let ledger = ledger::spawn(
        LedgerSettings {
            socket: socket.clone(),
            interval: Duration::from_millis(20),
        },
        LedgerPeers::default(),
        &ctx,
    )
    .into_inner();
    let mut rx = ledger.subscribe();
    // Several rounds against an absent socket: still down, nothing invented.
    wait_snapshot(&mut rx, "three failed rounds", |s| s.failed_rounds >= 3).await;
    assert!(!ledger.snapshot().up);
    assert_eq!(ledger.snapshot().rounds, 0);
    assert!(
        metrics
            .encode_prometheus()
            .contains("gpu_slicer_ledger_up 0")
    );

    // The kubelet comes up (the socket appears) with an allocation.
    let emulator = KubeletEmulator::start(dir.path().join("dp"))
        .await
        .expect("emulator");
    emulator
        .serve_pod_resources(&socket)
        .expect("pod-resources");
    let up = wait_snapshot(&mut rx, "ledger up", |s| s.up).await;
    assert!(up.rounds >= 1);
    assert!(
        metrics
            .encode_prometheus()
            .contains("gpu_slicer_ledger_up 1")
    );
    // No plugin registered with this emulator, so the kubelet can allocate none of the
    // devices the plan advertises: every one is drift.
    assert_eq!(up.drift.len(), 16, "{:?}", up.drift);

    // The kubelet goes away again: down, last known state kept.
    emulator.shutdown().await;
    let down = wait_snapshot(&mut rx, "ledger down", |s| !s.up).await;
    assert!(
        down.rounds >= up.rounds,
        "the last known state is kept, not reset"
    );
    assert!(
        metrics
            .encode_prometheus()
            .contains("gpu_slicer_ledger_up 0")
    );

    token.cancel();
    tracker.close();
    within("ledger stop", tracker.wait()).await;
}

/// A reload on a running daemon: counted by outcome; series of removed resources go away
/// while a device still held stays visible (as drift); readiness follows the new plan; the
/// ledger prunes the Allocate log once the holder is gone.
#[tokio::test]
async fn metrics_readiness_and_ledger_follow_a_reload() {
    use crate::runtime::ledger::Drift;
    use crate::runtime::supervisor::ReloadSettings;
    use crate::runtime::triggers::{Cause, TriggerSettings};

    const MIG: &str = "nvidia.com/mig-1g.10gb";
    let dir = temp_dir();
    let plugin_dir = dir.path().join("dp");
    let pod_resources = dir.path().join("pr").join("kubelet.sock");
    let config_file = dir.path().join("config.yaml");
    std::fs::write(&config_file, "version: v1\nflags: {migStrategy: mixed}\n").expect("config");
    let emulator = KubeletEmulator::start(&plugin_dir).await.expect("emulator");
    emulator
        .serve_pod_resources(&pod_resources)
        .expect("pod-resources");
    let load = fixtures::file_loader(&config_file);
    let mut settings =
        RunSettings::new(load().expect("config"), &plugin_dir, dir.path().join("cdi"));
    settings.backoff = Backoff {
        initial: Duration::from_millis(2),
        max: Duration::from_millis(100),
    };
    settings.reload = ReloadSettings {
        load: Some(load),
        triggers: TriggerSettings::default(),
    };
    settings.http_listen = Some("127.0.0.1:0".into());
    settings.ledger = Some(LedgerSettings {
        socket: pod_resources,
        interval: Duration::from_millis(50),
    });
    let (tx, rx) = oneshot::channel();
    settings.on_ready = Some(tx);
    let shutdown = CancellationToken::new();
    let backend = Arc::new(SimBackend::open("mixed-a100").expect("profile"));
    let app = tokio::spawn(app::run(settings, backend, shutdown.clone()));
    let running = within("daemon ready", rx).await.expect("daemon ready");
    let addr = running.probe().http_addr.expect("http enabled");
    let names: Vec<String> = running
        .plan
        .resources
        .iter()
        .map(|r| r.name.clone())
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");
    within("registration", emulator.wait_registered(&names, 1)).await;

    let holder = PodRef {
        namespace: "keep".into(),
        name: "holder".into(),
        container: "main".into(),
    };
    let held = emulator
        .allocate_for(holder, MIG, 1)
        .await
        .expect("allocate");
    let mut ledger = running.probe().ledger.clone().expect("ledger").subscribe();
    wait_snapshot(&mut ledger, "ledger sees the MIG slice", |s| {
        s.allocated_ids(MIG).len() == 1
    })
    .await;

    // migStrategy none: the three MIG resources leave the plan.
    let mut reloads = running.reloads.clone();
    std::fs::write(&config_file, "version: v1\nflags: {migStrategy: none}\n").expect("rewrite");
    running
        .probe()
        .reload
        .send(Cause::Request)
        .await
        .expect("reload");
    within("reload applied", reloads.wait_for(|s| s.applied == 1))
        .await
        .expect("daemon alive");
    let body = scrape_until(addr, "removed resources forgotten", |b| {
        !b.contains("gpu_slicer_allocatable_devices{resource=\"nvidia.com/mig-2g.20gb\"}")
    })
    .await;
    for line in [
        "gpu_slicer_config_reloads_total{outcome=\"ok\"} 1",
        "gpu_slicer_allocatable_devices{resource=\"nvidia.com/gpu\"} 4",
    ] {
        assert!(body.contains(line), "missing {line}\n{body}");
    }
    for gone in ["nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb", MIG] {
        assert!(
            !body.contains(&format!("gpu_slicer_device_healthy{{resource=\"{gone}\"")),
            "{gone} health series left\n{body}"
        );
    }
    let snapshot = wait_snapshot(
        &mut ledger,
        "held device of a removed resource is drift",
        |s| {
            s.drift.iter().any(
                |d| matches!(d, Drift::AllocatedNotPlanned { resource, .. } if resource == MIG),
            )
        },
    )
    .await;
    assert_eq!(
        snapshot.allocated_ids(MIG),
        held.device_ids.iter().cloned().collect()
    );
    let body = scrape_until(addr, "held slice still counted", |b| {
        b.contains("gpu_slicer_allocated_devices{resource=\"nvidia.com/mig-1g.10gb\"} 1")
    })
    .await;
    promtool_check(&body);
    wait_until(STEP, || async {
        (get(addr, "/readyz").await.0 == 200).then_some(())
    })
    .await
    .expect("ready on the new plan");

    // The holder goes away: the ledger releases it in the store, so the spec no longer
    // keeps that slice.
    assert!(running.probe().store.current().held.ids().contains_key(MIG));
    emulator.release("keep", "holder");
    wait_until(STEP, || async {
        (!running.probe().store.current().held.ids().contains_key(MIG)).then_some(())
    })
    .await
    .expect("allocation log pruned");

    // A broken config is counted as failed.
    std::fs::write(
        &config_file,
        "version: v1\nflags: {migStrategy: sideways}\n",
    )
    .expect("rewrite");
    running
        .probe()
        .reload
        .send(Cause::Request)
        .await
        .expect("reload");
    within("reload refused", reloads.wait_for(|s| s.failed == 1))
        .await
        .expect("daemon alive");
    scrape_until(addr, "failed reload counted", |b| {
        b.contains("gpu_slicer_config_reloads_total{outcome=\"failed\"} 1")
    })
    .await;

    shutdown.cancel();
    within("daemon stop", app)
        .await
        .expect("join")
        .expect("clean stop");
    emulator.shutdown().await;
}
