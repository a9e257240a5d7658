//! The DRA driver's kubelet side end to end over real unix sockets: the emulated plugin
//! watcher registers it, then NodePrepareResources / NodeUnprepareResources through v1 and
//! v1beta1, per-claim CDI specs and the checkpoint on disk, bad claims, exclusivity, a
//! restart over the checkpoint (also a corrupt one), the health stream and re-registration
//! when the registration socket is removed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::domain::cdi::{GenerateOptions, NoProbe, generate};
use crate::domain::inventory::Health;
use crate::domain::snapshot::Snapshot;
use crate::platform::dra_state::LoadOutcome;
use crate::runtime::Context;
use crate::runtime::dra::{ClaimSourceError, DraExposed, DraSettings, DriverExtras, spawn};
use crate::state::Store;
use crate::testkit::fixtures;
use crate::testkit::kubelet::dra::{
    Claims, DraVersion, KubeletClaim, register, registration_sockets,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const DRIVER: &str = "gpu-slicer.io";
const UID_A: &str = "aaaaaaaa-0000-4000-8000-000000000001";
const UID_B: &str = "bbbbbbbb-0000-4000-8000-000000000002";

/// A mixed-a100 node's store with its CDI spec written (shared with the other DRA unit tests).
pub(super) fn store() -> Store {
    let (inv, cfg, plan) =
        fixtures::planned("mixed-a100", "version: v1\nflags:\n  migStrategy: mixed\n");
    let spec = generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe).unwrap();
    let mut snap = Snapshot::serving(cfg, inv, plan);
    snap.spec = Some(Arc::new(spec));
    Store::new(snap)
}

/// DRA settings with every directory under `root`.
pub(super) fn settings(root: &Path) -> DraSettings {
    DraSettings {
        driver: DRIVER.into(),
        node: "node-a".into(),
        registry_dir: root.join("reg"),
        plugins_dir: root.join("plugins"),
        cdi_dir: root.join("cdi"),
        state_dir: root.join("state"),
        proc_root: root.join("proc"),
        health_resend: Duration::from_secs(20),
        socket_check: Duration::from_millis(20),
        extras: Default::default(),
    }
}

pub(super) fn claim_json(name: &str, uid: &str, device: &str, pool: &str) -> serde_json::Value {
    json!({"metadata": {"namespace": "ml", "name": name, "uid": uid},
           "status": {"allocation": {"devices": {"results": [
               {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]}}}})
}

/// Claims `a` and `b` (UIDs `uid_a`, `uid_b`), both allocated gpu-2.
pub(super) fn two_claims_for_one_gpu(uid_a: &str, uid_b: &str) -> Arc<Claims> {
    let claims = Claims::new();
    claims.put(claim_json("a", uid_a, "gpu-2", "node-a"));
    claims.put(claim_json("b", uid_b, "gpu-2", "node-a"));
    claims
}

pub(super) fn k(name: &str, uid: &str) -> KubeletClaim {
    KubeletClaim {
        namespace: "ml".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

pub(super) struct Running {
    pub(super) handle: DraExposed,
    metrics: Arc<crate::runtime::metrics::Metrics>,
    tracker: TaskTracker,
    stop: CancellationToken,
}

async fn run(root: &Path, store: Store, claims: Arc<Claims>) -> Running {
    run_with(root, store, claims, DriverExtras::default()).await
}

/// [`run`] with the driver's `extras` (a test gate, MIG instance operations).
pub(super) async fn run_with(
    root: &Path,
    store: Store,
    claims: Arc<Claims>,
    extras: DriverExtras,
) -> Running {
    std::fs::create_dir_all(root.join("proc/sys/kernel/random")).unwrap();
    if !root.join("proc/sys/kernel/random/boot_id").exists() {
        std::fs::write(root.join("proc/sys/kernel/random/boot_id"), "boot-1\n").unwrap();
    }
    let ctx = Context::new(store);
    let mut settings = settings(root);
    settings.extras = extras;
    let handle = spawn(settings, claims, &ctx).await.unwrap();
    Running {
        handle: handle.into_inner(),
        metrics: ctx.metrics.clone(),
        tracker: ctx.tracker,
        stop: ctx.token,
    }
}

impl Running {
    pub(super) async fn stop(self) {
        self.stop.cancel();
        self.tracker.close();
        tokio::time::timeout(Duration::from_secs(10), self.tracker.wait())
            .await
            .unwrap();
    }
}

pub(super) fn reg_socket(root: &Path) -> PathBuf {
    root.join("reg").join(format!("{DRIVER}-reg.sock"))
}

pub(super) fn spec_path(root: &Path, uid: &str) -> PathBuf {
    root.join("cdi")
        .join(format!("k8s.{DRIVER}-claim_{uid}.json"))
}

#[tokio::test]
async fn registers_with_the_plugin_watcher_and_prepares_through_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let claims = Claims::new();
    claims.put(claim_json("a", UID_A, "gpu-2", "node-a"));
    let r = run(dir.path(), store(), claims.clone()).await;
    assert_eq!(
        registration_sockets(&dir.path().join("reg")),
        [reg_socket(dir.path())]
    );
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    assert_eq!(kubelet.info.r#type, "DRAPlugin");
    assert_eq!(kubelet.info.name, DRIVER);
    assert_eq!(
        kubelet.info.endpoint,
        dir.path()
            .join(format!("plugins/{DRIVER}/dra.sock"))
            .display()
            .to_string()
    );
    assert_eq!(
        kubelet.info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth",
            "v1.DRAResourceHealth"
        ]
    );
    assert_eq!(kubelet.version, DraVersion::V1);
    let mut reg = r.handle.registration.clone();
    reg.wait_for(|s| s.is_some()).await.unwrap();
    assert_eq!(*reg.borrow(), Some(Ok(())));

    let answer = kubelet.prepare(&[k("a", UID_A)], None).await.unwrap();
    let id = format!("k8s.{DRIVER}/claim={UID_A}-gpu-2");
    assert_eq!(
        answer[UID_A],
        Ok(vec![("gpu-2".to_string(), vec![id.clone()])])
    );
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(spec_path(dir.path(), UID_A)).unwrap())
            .unwrap();
    assert_eq!(spec["kind"], format!("k8s.{DRIVER}/claim"));
    assert_eq!(spec["devices"][0]["name"], format!("{UID_A}-gpu-2"));
    let cp = crate::platform::dra_state::read_checkpoint_file(
        &dir.path().join("state/dra-prepared.json"),
    )
    .unwrap();
    assert_eq!(cp.boot_id, "boot-1");
    assert_eq!(cp.claims[UID_A].devices[0].device, "gpu-2");

    // The kubelet repeats calls: the same answer, from the checkpoint, no second GET.
    let gets = claims.gets();
    let again = kubelet
        .prepare(&[k("a", UID_A)], Some(DraVersion::V1beta1))
        .await
        .unwrap();
    assert_eq!(again[UID_A], Ok(vec![("gpu-2".to_string(), vec![id])]));
    assert_eq!(claims.gets(), gets);

    let un = kubelet
        .unprepare(&[k("a", UID_A), k("never", UID_B)])
        .await
        .unwrap();
    assert_eq!(un[UID_A], "");
    assert_eq!(un[UID_B], "", "unpreparing an unknown claim succeeds");
    assert!(!spec_path(dir.path(), UID_A).exists());
    r.stop().await;
    assert!(!reg_socket(dir.path()).exists(), "sockets removed at stop");
}

#[tokio::test]
async fn every_bad_claim_gets_its_own_error_and_the_good_one_is_prepared() {
    let dir = tempfile::tempdir().unwrap();
    let claims = Claims::new();
    let s = store();
    s.set_health(
        "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03",
        Health::Unhealthy,
        "xid-79",
    )
    .unwrap();
    claims.put(claim_json("good", UID_A, "gpu-2", "node-a"));
    claims.put(claim_json("other-pool", "u-pool", "gpu-2", "node-b"));
    claims.put(claim_json("missing", "u-missing", "gpu-9", "node-a"));
    claims.put(claim_json("sick", "u-sick", "gpu-3", "node-a"));
    claims.put(json!({"metadata": {"namespace": "ml", "name": "unallocated", "uid": "u-unalloc"}}));
    claims.put(claim_json("recreated", "u-new", "gpu-2", "node-a"));
    claims.fail(
        "ml",
        "forbidden",
        ClaimSourceError::Unavailable {
            namespace: "ml".into(),
            name: "forbidden".into(),
            message: "403 Forbidden".into(),
        },
    );
    claims.put(json!({"metadata": {"namespace": "ml", "name": "bad-config", "uid": "u-config"},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-1-mig-3g40gb-9-4"}],
            "config": [{"source": "FromClaim", "opaque": {"driver": DRIVER,
                "parameters": {"apiVersion": "gpu-slicer.io/v1alpha1", "kind": "Bogus"}}}]}}}}));
    let r = run(dir.path(), s, claims).await;
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    let ask = [
        k("good", UID_A),
        k("other-pool", "u-pool"),
        k("missing", "u-missing"),
        k("sick", "u-sick"),
        k("unallocated", "u-unalloc"),
        k("recreated", "u-old"),
        k("forbidden", "u-403"),
        k("absent", "u-404"),
        k("bad-config", "u-config"),
    ];
    let answer = kubelet.prepare(&ask, None).await.unwrap();
    assert_eq!(answer.len(), ask.len(), "every claim UID is in the map");
    assert!(answer[UID_A].is_ok());
    let err = |uid: &str| answer[uid].clone().unwrap_err();
    assert!(err("u-pool").contains("pool node-b"), "{}", err("u-pool"));
    assert!(err("u-missing").contains("gpu-9 does not exist"));
    assert!(err("u-sick").contains("unhealthy (xid-79)"));
    assert!(err("u-unalloc").contains("not allocated"));
    assert!(err("u-old").contains("re-created"));
    assert!(err("u-403").contains("403"));
    assert!(err("u-404").contains("not found"));
    let e = err("u-config");
    assert!(
        e.contains("ml/bad-config") && e.contains("parameters.kind") && e.contains("Bogus"),
        "{e}"
    );
    // Each refusal is counted once, under its own rule; rules nobody broke stay at 0.
    let text = r.metrics.encode_prometheus();
    for (rule, n) in [
        ("not_this_node", 1),
        ("device_unknown", 1),
        ("device_unhealthy", 1),
        ("not_allocated", 1),
        ("uid_changed", 1),
        ("claim_unreadable", 1),
        ("claim_not_found", 1),
        ("opaque_config", 1),
        ("device_held", 0),
        ("persistence_failed", 0),
    ] {
        let line = format!("gpu_slicer_dra_claim_refusals_total{{rule=\"{rule}\"}} {n}\n");
        assert!(text.contains(&line), "{line} not in\n{text}");
    }
    // Only the good claim left a spec (and a record, in the records folder beside them).
    let files = |d: &str| -> Vec<_> {
        std::fs::read_dir(dir.path().join(d))
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_file())
            .collect()
    };
    assert_eq!(files("cdi").len(), 1);
    assert_eq!(files(&format!("cdi/k8s.{DRIVER}-claim-records")).len(), 1);
    r.stop().await;
}

#[tokio::test]
async fn a_device_is_never_prepared_for_two_claims_even_racing_or_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let claims = two_claims_for_one_gpu(UID_A, UID_B);
    let r = run(dir.path(), store(), claims.clone()).await;
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    // Two prepares of the same claim racing, and a second claim for the same device.
    let (a, b) = ([k("a", UID_A)], [k("b", UID_B)]);
    let (x, y, z) = tokio::join!(
        kubelet.prepare(&a, None),
        kubelet.prepare(&a, Some(DraVersion::V1beta1)),
        kubelet.prepare(&b, None),
    );
    let (x, y, z) = (x.unwrap(), y.unwrap(), z.unwrap());
    let winners = [x[UID_A].is_ok() && y[UID_A].is_ok(), z[UID_B].is_ok()];
    assert_eq!(
        winners.iter().filter(|w| **w).count(),
        1,
        "{x:?} {y:?} {z:?}"
    );
    let (holder, loser) = if z[UID_B].is_ok() {
        (("b", UID_B), ("a", UID_A))
    } else {
        (("a", UID_A), ("b", UID_B))
    };
    if z[UID_B].is_err() {
        assert_eq!(x[UID_A], y[UID_A]);
    }
    // The view /v1/state shows: the holder only, with the time this run committed it.
    let view = r.handle.prepared.borrow().clone();
    assert_eq!(view.prepared_claims.len(), 1, "{view:?}");
    let shown = &view.prepared_claims[0];
    assert_eq!(
        (
            shown.uid.as_str(),
            shown.namespace.as_str(),
            shown.name.as_str()
        ),
        (holder.1, "ml", holder.0)
    );
    assert_eq!(shown.devices[0].device, "gpu-2");
    assert!(shown.prepared_at_ms.is_some_and(|t| t > 0), "{view:?}");
    r.stop().await;

    // SIGKILL-like restart: the checkpoint keeps the holder; the loser is still refused.
    let r = run(dir.path(), store(), claims.clone()).await;
    assert_eq!(r.handle.loaded, LoadOutcome::Loaded);
    assert_eq!(r.handle.driver().prepared_claims(), [holder.1.to_string()]);
    // Recovered from the checkpoint, which does not record when: shown without a time.
    let view = r.handle.prepared.borrow().clone();
    assert_eq!(view.prepared_claims.len(), 1, "{view:?}");
    assert_eq!(view.prepared_claims[0].uid, holder.1);
    assert_eq!(view.prepared_claims[0].prepared_at_ms, None);
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    let again = kubelet.prepare(&[k(loser.0, loser.1)], None).await.unwrap();
    assert!(
        again[loser.1]
            .clone()
            .unwrap_err()
            .contains("already prepared")
    );
    r.stop().await;

    // A corrupt checkpoint: kept aside, the holder recovered from its spec on disk.
    std::fs::write(
        dir.path().join("state/dra-prepared.json"),
        b"{\"bootId\": \"boot-1\", \"clai",
    )
    .unwrap();
    let r = run(dir.path(), store(), claims.clone()).await;
    let LoadOutcome::Corrupt { kept_as } = &r.handle.loaded else {
        panic!("{:?}", r.handle.loaded)
    };
    assert!(kept_as.exists());
    assert_eq!(r.handle.driver().prepared_claims(), [holder.1.to_string()]);
    // Counted, and declared from the start (a fresh registry shows it at 0).
    let recoveries = "gpu_slicer_dra_checkpoint_recoveries_total";
    assert!(
        r.metrics
            .encode_prometheus()
            .contains(&format!("{recoveries} 1")),
        "{}",
        r.metrics.encode_prometheus()
    );
    assert!(
        crate::runtime::metrics::Metrics::new()
            .encode_prometheus()
            .contains(&format!("{recoveries} 0"))
    );
    // The recovered claims are written back: a new, readable checkpoint holds the holder.
    let rewritten = crate::platform::dra_state::read_checkpoint_file(
        &dir.path().join("state/dra-prepared.json"),
    )
    .unwrap();
    assert!(rewritten.claims.contains_key(holder.1), "{rewritten:?}");
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    let again = kubelet.prepare(&[k(loser.0, loser.1)], None).await.unwrap();
    assert!(
        again[loser.1]
            .clone()
            .unwrap_err()
            .contains("already prepared")
    );
    // Unprepare (only UID/name/namespace) frees it; then the other claim gets it.
    assert_eq!(
        kubelet.unprepare(&[k(holder.0, holder.1)]).await.unwrap()[holder.1],
        ""
    );
    assert!(kubelet.prepare(&[k(loser.0, loser.1)], None).await.unwrap()[loser.1].is_ok());
    r.stop().await;

    // Another boot: entries are void.
    std::fs::write(
        dir.path().join("proc/sys/kernel/random/boot_id"),
        "boot-2\n",
    )
    .unwrap();
    let r = run(dir.path(), store(), claims).await;
    assert_eq!(r.handle.loaded, LoadOutcome::OtherBoot);
    assert!(r.handle.driver().prepared_claims().is_empty());
    assert!(
        !spec_path(dir.path(), loser.1).exists(),
        "the spec of a claim of an earlier boot is removed"
    );
    r.stop().await;
}

#[tokio::test]
async fn the_health_stream_sends_the_complete_list_and_an_xid() {
    use tokio_stream::StreamExt as _;
    let dir = tempfile::tempdir().unwrap();
    let s = store();
    let r = run(dir.path(), s.clone(), Claims::new()).await;
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    let mut stream = kubelet.watch_health().await.unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 7 + 4 + 2, "the complete list");
    assert!(first.devices.iter().all(|d| d.health == 1));
    assert!(
        first
            .devices
            .iter()
            .all(|d| d.device.as_ref().unwrap().pool_name == "node-a")
    );
    s.set_health(
        "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02",
        Health::Unhealthy,
        "xid-79",
    )
    .unwrap();
    let next = stream.next().await.unwrap().unwrap();
    assert_eq!(next.devices.len(), first.devices.len());
    let sick: Vec<_> = next.devices.iter().filter(|d| d.health == 2).collect();
    assert_eq!(sick.len(), 1);
    assert_eq!(sick[0].device.as_ref().unwrap().device_name, "gpu-2");
    assert_eq!(sick[0].message, "xid-79");
    r.stop().await;
}

#[tokio::test]
async fn a_removed_registration_socket_is_served_again_and_registers_anew() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(dir.path(), store(), Claims::new()).await;
    register(&reg_socket(dir.path())).await.unwrap();
    // What a kubelet restart that cleans its plugin directory does.
    std::fs::remove_file(reg_socket(dir.path())).unwrap();
    let back = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(k) = register(&reg_socket(dir.path())).await {
                return k;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(back.info.name, DRIVER);
    r.stop().await;
}

/// The DRA families are in the first scrape (zero), and then follow the calls: each call's
/// duration by outcome, and the prepared claims and devices after it.
#[tokio::test]
async fn prepare_and_unprepare_are_timed_by_outcome_and_the_prepared_counted() {
    let fresh = crate::runtime::metrics::Metrics::new().encode_prometheus();
    for line in [
        "gpu_slicer_dra_prepare_duration_seconds_count{outcome=\"ok\"} 0",
        "gpu_slicer_dra_prepare_duration_seconds_count{outcome=\"failed\"} 0",
        "gpu_slicer_dra_unprepare_duration_seconds_count{outcome=\"ok\"} 0",
        "gpu_slicer_dra_prepared_claims 0",
        "gpu_slicer_dra_prepared_devices 0",
    ] {
        assert!(fresh.contains(line), "{line} not in\n{fresh}");
    }
    for rule in crate::domain::dra::claim_error::ClaimError::RULES {
        let line = format!("gpu_slicer_dra_claim_refusals_total{{rule=\"{rule}\"}} 0\n");
        assert!(fresh.contains(&line), "{line} not in\n{fresh}");
    }
    let dir = tempfile::tempdir().unwrap();
    let claims = two_claims_for_one_gpu(UID_A, UID_B);
    let r = run(dir.path(), store(), claims.clone()).await;
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    let scrape = || r.metrics.encode_prometheus();
    assert!(kubelet.prepare(&[k("a", UID_A)], None).await.unwrap()[UID_A].is_ok());
    // gpu-2 is taken: refused, and the call counts as failed.
    assert!(kubelet.prepare(&[k("b", UID_B)], None).await.unwrap()[UID_B].is_err());
    let text = scrape();
    for line in [
        "gpu_slicer_dra_prepare_duration_seconds_count{outcome=\"ok\"} 1",
        "gpu_slicer_dra_prepare_duration_seconds_count{outcome=\"failed\"} 1",
        "gpu_slicer_dra_prepared_claims 1",
        "gpu_slicer_dra_prepared_devices 1",
        "gpu_slicer_dra_claim_refusals_total{rule=\"device_held\"} 1\n",
        "gpu_slicer_dra_claim_refusals_total{rule=\"share_over_capacity\"} 0\n",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    let done = kubelet.unprepare(&[k("a", UID_A)]).await.unwrap();
    assert_eq!(done[UID_A], "");
    let text = scrape();
    for line in [
        "gpu_slicer_dra_unprepare_duration_seconds_count{outcome=\"ok\"} 1",
        "gpu_slicer_dra_prepared_claims 0",
        "gpu_slicer_dra_prepared_devices 0",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    r.stop().await;
}
