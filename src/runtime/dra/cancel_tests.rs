//! The driver as a hostile kubelet meets it: Prepare and Unprepare RPCs cut while their work
//! is half-way (a test gate holds the work at the worst point while the client drops the
//! call), a restart over what a cut left, a slow API that must not stall unrelated claims,
//! and concurrent batches that must never hand one device to two claims.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::driver::{Gate, Stage};
use super::kubelet_tests::{
    claim_json, k, reg_socket, run_with, spec_path, store, two_claims_for_one_gpu,
};
use crate::platform::dra_state::Prepared;
use crate::runtime::dra::DriverExtras;
use crate::testkit::kubelet::dra::{Claims, register};

const UID_A: &str = "aaaaaaaa-0000-4000-8000-0000000000a1";
const UID_B: &str = "bbbbbbbb-0000-4000-8000-0000000000b2";
const UID_C: &str = "cccccccc-0000-4000-8000-0000000000c3";

fn gated(stage: Stage) -> (Arc<Gate>, DriverExtras) {
    let gate = Gate::at(stage);
    let extras = DriverExtras {
        gate: Some(gate.clone()),
        ..DriverExtras::default()
    };
    (gate, extras)
}

fn checkpoint(root: &Path) -> Prepared {
    crate::platform::dra_state::read_checkpoint_file(&root.join("state/dra-prepared.json"))
        .unwrap_or_default()
}

fn record_path(root: &Path, uid: &str) -> std::path::PathBuf {
    root.join(format!("cdi/k8s.gpu-slicer.io-claim-records/{uid}.json"))
}

/// Two calls that name the same claims in opposite orders never wait on each other. A
/// Prepare of [A, C, B] holds A while it waits for C (another Prepare holds it); an Unprepare
/// of [B, A] comes in between. Taken in the order given, the Unprepare would hold B and wait
/// for A while the Prepare, once C is free, waits for B: neither ever answers (the
/// concurrent-batches property found this). Both take their claims in UID order instead.
#[tokio::test]
async fn calls_naming_claims_in_opposite_orders_never_wait_on_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let claims = Claims::new();
    claims.put(claim_json("a", UID_A, "gpu-2", "node-a"));
    claims.put(claim_json("b", UID_B, "gpu-3", "node-a"));
    claims.put(claim_json("c", UID_C, "gpu-0-mig-1g10gb-19-0", "node-a"));
    let (gate, extras) = gated(Stage::BeforePrepareCommit);
    let r = run_with(dir.path(), store(), claims.clone(), extras).await;
    let driver = r.handle.driver().clone();
    let kubelet = Arc::new(register(&reg_socket(dir.path())).await.unwrap());
    let held_c = tokio::spawn({
        let kubelet = kubelet.clone();
        async move { kubelet.prepare(&[k("c", UID_C)], None).await }
    });
    gate.reached().await;
    let busy = |uid: &'static str| {
        let driver = driver.clone();
        move || {
            let driver = driver.clone();
            async move { driver.busy_claims().iter().any(|b| b == uid).then_some(()) }
        }
    };
    let prepare = tokio::spawn({
        let kubelet = kubelet.clone();
        async move {
            let order = [k("a", UID_A), k("c", UID_C), k("b", UID_B)];
            kubelet.prepare(&order, None).await
        }
    });
    // The Prepare holds A (and waits for C).
    crate::testkit::wait_until(Duration::from_secs(10), busy(UID_A))
        .await
        .expect("the Prepare marks A busy");
    let unprepare = tokio::spawn({
        let kubelet = kubelet.clone();
        async move { kubelet.unprepare(&[k("b", UID_B), k("a", UID_A)]).await }
    });
    // Taken in the order given, the Unprepare marks B before it waits for A; give it the
    // chance (in UID order it never marks B first, and this times out harmlessly).
    let _ = crate::testkit::wait_until(Duration::from_millis(500), busy(UID_B)).await;
    gate.release();
    let all = async {
        let c = held_c.await.unwrap().unwrap();
        let p = prepare.await.unwrap().unwrap();
        let u = unprepare.await.unwrap().unwrap();
        (c, p, u)
    };
    let (c, p, u) = crate::testkit::within("every call answered", all).await;
    assert!(c[UID_C].is_ok(), "{c:?}");
    assert!(p.values().all(Result::is_ok), "{p:?}");
    assert!(u.values().all(String::is_empty), "{u:?}");
    r.stop().await;
}

#[tokio::test]
async fn a_prepare_cut_during_its_write_is_finished_and_its_device_goes_to_nobody_else() {
    let dir = tempfile::tempdir().unwrap();
    let claims = two_claims_for_one_gpu(UID_A, UID_B);
    let (gate, extras) = gated(Stage::BeforePrepareCommit);
    let r = run_with(dir.path(), store(), claims.clone(), extras).await;
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    // The kubelet gives up on the call while its files are on disk and the checkpoint is not.
    let a = [k("a", UID_A)];
    tokio::select! {
        answer = kubelet.prepare(&a, None) => panic!("answered through the gate: {answer:?}"),
        () = gate.reached() => {}
    }
    assert!(spec_path(dir.path(), UID_A).exists());
    gate.release();
    // A second claim for the same device is refused, whether the first is still on its way
    // to the checkpoint or already there.
    let b = kubelet.prepare(&[k("b", UID_B)], None).await.unwrap();
    let e = b[UID_B].clone().unwrap_err();
    assert!(e.contains("gpu-2") && e.contains(UID_A), "{e}");
    // The kubelet's retry gets the first claim's CDI IDs, as its spec names them.
    let a = kubelet.prepare(&[k("a", UID_A)], None).await.unwrap();
    let ids = a[UID_A].clone().unwrap();
    assert_eq!(
        ids,
        [(
            "gpu-2".to_string(),
            vec![format!("k8s.gpu-slicer.io/claim={UID_A}-gpu-2")]
        )]
    );
    let spec = std::fs::read_to_string(spec_path(dir.path(), UID_A)).unwrap();
    assert!(spec.contains(&format!("{UID_A}-gpu-2")), "{spec}");
    assert_eq!(
        checkpoint(dir.path()).claims.keys().collect::<Vec<_>>(),
        [UID_A]
    );
    // Unprepared, then restarted: nothing is held, and the other claim gets the device.
    let un = kubelet.unprepare(&[k("a", UID_A)]).await.unwrap();
    assert_eq!(un[UID_A], "");
    r.stop().await;
    let r = run_with(dir.path(), store(), claims, DriverExtras::default()).await;
    assert!(r.handle.driver().prepared_claims().is_empty());
    assert!(r.handle.repairs.is_empty(), "{:?}", r.handle.repairs);
    assert!(!spec_path(dir.path(), UID_A).exists());
    assert!(!record_path(dir.path(), UID_A).exists());
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    let b = kubelet.prepare(&[k("b", UID_B)], None).await.unwrap();
    assert!(b[UID_B].is_ok(), "{b:?}");
    r.stop().await;
}

#[tokio::test]
async fn an_unprepare_cut_before_its_checkpoint_is_finished_or_finished_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let claims = two_claims_for_one_gpu(UID_A, UID_B);
    let (gate, extras) = gated(Stage::BeforeUnprepareCommit);
    let r = run_with(dir.path(), store(), claims.clone(), extras).await;
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    assert!(kubelet.prepare(&[k("a", UID_A)], None).await.unwrap()[UID_A].is_ok());
    let a = [k("a", UID_A)];
    tokio::select! {
        answer = kubelet.unprepare(&a) => panic!("answered through the gate: {answer:?}"),
        () = gate.reached() => {}
    }
    // Cut with its spec gone and its checkpoint entry still there. Until the work goes on,
    // the device is still held.
    assert!(!spec_path(dir.path(), UID_A).exists());
    assert!(checkpoint(dir.path()).claims.contains_key(UID_A));
    gate.release();
    // The retry answers ok; the checkpoint, record and spec all lost the claim.
    let un = kubelet.unprepare(&[k("a", UID_A)]).await.unwrap();
    assert_eq!(un[UID_A], "");
    assert!(checkpoint(dir.path()).claims.is_empty());
    assert!(!record_path(dir.path(), UID_A).exists());
    assert!(kubelet.prepare(&[k("b", UID_B)], None).await.unwrap()[UID_B].is_ok());
    r.stop().await;

    // A crash at the same point (spec removed, entry and record left): the next start
    // finishes the unprepare, says so, and the device is free.
    let (gate, extras) = gated(Stage::BeforeUnprepareCommit);
    let r = run_with(dir.path(), store(), claims.clone(), extras).await;
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    let b = [k("b", UID_B)];
    tokio::select! {
        answer = kubelet.unprepare(&b) => panic!("answered through the gate: {answer:?}"),
        () = gate.reached() => {}
    }
    assert!(checkpoint(dir.path()).claims.contains_key(UID_B));
    assert!(record_path(dir.path(), UID_B).exists());
    // The process dies here: a second driver starts over the same files while the first
    // is frozen at the gate.
    let other = tempfile::tempdir().unwrap();
    copy_tree(dir.path(), other.path());
    gate.release();
    r.stop().await;
    let r = run_with(other.path(), store(), claims, DriverExtras::default()).await;
    assert!(r.handle.driver().prepared_claims().is_empty());
    assert!(
        r.handle
            .repairs
            .iter()
            .any(|x| x.to_string().contains(UID_B) && x.to_string().contains("unprepare")),
        "{:?}",
        r.handle.repairs
    );
    assert!(checkpoint(other.path()).claims.is_empty());
    assert!(!record_path(other.path(), UID_B).exists());
    let kubelet = register(&reg_socket(other.path())).await.unwrap();
    assert!(kubelet.prepare(&[k("a", UID_A)], None).await.unwrap()[UID_A].is_ok());
    r.stop().await;
}

/// Copy the driver's files (state and CDI dirs) from `from` to `to`, as a crash leaves them.
fn copy_tree(from: &Path, to: &Path) {
    for sub in [
        "state",
        "cdi",
        "cdi/k8s.gpu-slicer.io-claim-records",
        "proc/sys/kernel/random",
    ] {
        let (src, dst) = (from.join(sub), to.join(sub));
        std::fs::create_dir_all(&dst).unwrap();
        for e in std::fs::read_dir(&src).unwrap().flatten() {
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
            }
        }
    }
}

#[tokio::test]
async fn a_slow_api_delays_no_other_claim_and_no_unprepare() {
    let dir = tempfile::tempdir().unwrap();
    let store = sixteen_gpus();
    let mut devices: Vec<String> = crate::domain::dra::slices::snapshot_devices(&store.current())
        .devices
        .into_keys()
        .collect();
    devices.truncate(14);
    assert_eq!(devices.len(), 14, "the node has 14 devices to hand out");
    let claims = Claims::new();
    let uid = |i: usize| format!("cccccccc-0000-4000-8000-{i:012}");
    for (i, d) in devices.iter().enumerate() {
        claims.put(claim_json(&format!("c{i}"), &uid(i), d, "node-a"));
    }
    let r = run_with(dir.path(), store, claims.clone(), DriverExtras::default()).await;
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    assert!(kubelet.prepare(&[k("c13", &uid(13))], None).await.unwrap()[&uid(13)].is_ok());
    // Every claim read now takes 2 s.
    claims.slow(Duration::from_secs(2));
    let start = Instant::now();
    let prepares = (0..13).map(|i| {
        let kubelet = &kubelet;
        let (name, u) = (format!("c{i}"), uid(i));
        async move {
            let answer = kubelet.prepare(&[k(&name, &u)], None).await.unwrap();
            (answer[&u].is_ok(), start.elapsed())
        }
    });
    let unprepare = async {
        // Sent while the 13 wait on their reads.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = Instant::now();
        let un = kubelet.unprepare(&[k("c13", &uid(13))]).await.unwrap();
        (un[&uid(13)].clone(), sent.elapsed())
    };
    let (answers, (un, un_took)) = tokio::join!(join_all(prepares), unprepare);
    assert_eq!(un, "");
    assert!(
        un_took < Duration::from_secs(1),
        "the unprepare waited {un_took:?}"
    );
    for (i, (ok, at)) in answers.iter().enumerate() {
        assert!(ok, "claim {i} not prepared");
        assert!(
            *at < Duration::from_secs(5),
            "claim {i} answered after {at:?}"
        );
    }
    r.stop().await;
}

/// A node of 16 whole GPUs (`gpu-0` … `gpu-15`) with its CDI spec written.
fn sixteen_gpus() -> crate::state::Store {
    use crate::domain::cdi::{GenerateOptions, NoProbe, generate};
    let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/nodes/topo-pairs-16.yaml");
    let (inv, cfg, plan) =
        crate::testkit::fixtures::planned(&node.display().to_string(), "version: v1\n");
    let spec = generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe).unwrap();
    let mut snap = crate::domain::snapshot::Snapshot::serving(cfg, inv, plan);
    snap.spec = Some(Arc::new(spec));
    crate::state::Store::new(snap)
}

/// Await every future of `futures` together.
async fn join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in pinned.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// A node of A100-40GB GPUs with MIG on, served by a private fake NVML, whose GPU 4 makes its
/// MIG devices on demand: the store, the instance operations, and what must live as long.
fn dynamic_mig_node(
    root: &Path,
) -> (
    crate::state::Store,
    Arc<dyn crate::platform::dra_mig::InstanceOps>,
    crate::testkit::PrivateFake,
) {
    use crate::domain::cdi::{GenerateOptions, NoProbe, generate};
    use crate::domain::inventory::Backend as _;
    let fake = crate::testkit::PrivateFake::new(root);
    let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mig/a100-40gb.yaml");
    fake.set_node(&std::fs::read_to_string(node).unwrap());
    let proc_root = root.join("proc");
    crate::testkit::write_mig_minors(&proc_root, &[0, 1, 2, 3, 4, 5, 6, 7]);
    let backend =
        crate::platform::nvml::NvmlBackend::new(Some(fake.path.clone()), proc_root.clone());
    let inv = backend.discover().unwrap();
    let cfg = crate::testkit::fixtures::config(
        "version: v1\nflags:\n  migStrategy: mixed\n  dra: {dynamicMig: [4]}\n",
    );
    let plan = crate::domain::plan::build(&inv, &cfg).unwrap();
    let spec = generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe).unwrap();
    let mut snap = crate::domain::snapshot::Snapshot::serving(cfg, inv, plan);
    snap.spec = Some(Arc::new(spec));
    let ops: Arc<dyn crate::platform::dra_mig::InstanceOps> =
        Arc::new(crate::platform::dra_mig::NvmlInstances {
            lib: Some(fake.path.clone()),
            proc_root,
        });
    (crate::state::Store::new(snap), ops, fake)
}

#[tokio::test]
async fn a_prepare_cut_after_its_mig_device_was_made_records_it_and_unprepare_destroys_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ops, _fake) = dynamic_mig_node(dir.path());
    let device = "gpu-4-mig-1g5gb-19-3";
    let claims = Claims::new();
    claims.put(claim_json("a", UID_A, device, "node-a"));
    claims.put(claim_json("b", UID_B, device, "node-a"));
    let gate = Gate::at(Stage::AfterMigMake);
    let extras = DriverExtras {
        instances: Some(ops.clone()),
        gate: Some(gate.clone()),
        ..DriverExtras::default()
    };
    let r = run_with(dir.path(), store.clone(), claims.clone(), extras).await;
    let kubelet = register(&reg_socket(dir.path())).await.unwrap();
    let a = [k("a", UID_A)];
    tokio::select! {
        answer = kubelet.prepare(&a, None) => panic!("answered through the gate: {answer:?}"),
        () = gate.reached() => {}
    }
    // Made, and nothing on disk names it yet.
    assert_eq!(ops.instances(4, &gpu_uuid(&store, 4)).unwrap().len(), 1);
    assert!(!spec_path(dir.path(), UID_A).exists());
    gate.release();
    let b = kubelet.prepare(&[k("b", UID_B)], None).await.unwrap();
    assert!(b[UID_B].is_err(), "{b:?}");
    let a = kubelet.prepare(&[k("a", UID_A)], None).await.unwrap();
    assert!(a[UID_A].is_ok(), "{a:?}");
    // Recorded in the checkpoint with the instance made for it.
    let saved = checkpoint(dir.path());
    let made = saved.claims[UID_A].devices[0].made.clone();
    assert!(made.is_some(), "{saved:?}");
    // Unprepare destroys it; a restart finds nothing held and nothing made.
    assert_eq!(
        kubelet.unprepare(&[k("a", UID_A)]).await.unwrap()[UID_A],
        ""
    );
    assert!(ops.instances(4, &gpu_uuid(&store, 4)).unwrap().is_empty());
    r.stop().await;
    let extras = DriverExtras {
        instances: Some(ops.clone()),
        ..DriverExtras::default()
    };
    let r = run_with(dir.path(), store.clone(), claims, extras).await;
    assert!(r.handle.driver().prepared_claims().is_empty());
    assert!(ops.instances(4, &gpu_uuid(&store, 4)).unwrap().is_empty());
    r.stop().await;
}

fn gpu_uuid(store: &crate::state::Store, index: u32) -> String {
    store
        .current()
        .inventory
        .gpus
        .iter()
        .find(|g| g.index == index)
        .map(|g| g.uuid.clone())
        .unwrap()
}

mod batches {
    //! Concurrent batches of Prepares and Unprepares, in random interleavings, over claims
    //! that compete for few devices: no device is ever prepared for two claims, memory and
    //! checkpoint agree, and every prepared claim (and only those) has its spec.

    use super::*;
    use crate::domain::dra::claim::ClaimRef;
    use crate::platform::dra_state::DraFiles;
    use crate::runtime::dra::Driver;
    use proptest::prelude::*;

    const DEVICES: [&str; 3] = ["gpu-0", "gpu-1", "gpu-2"];

    fn claim_ref(i: usize) -> ClaimRef {
        ClaimRef {
            namespace: "ml".into(),
            uid: format!("dddddddd-0000-4000-8000-{i:012}"),
            name: format!("d{i}"),
        }
    }

    #[derive(Debug, Clone)]
    enum Call {
        Prepare(Vec<usize>),
        Unprepare(Vec<usize>),
    }

    fn call() -> impl Strategy<Value = Call> {
        prop_oneof![
            3 => prop::collection::vec(0..8usize, 1..5).prop_map(Call::Prepare),
            1 => prop::collection::vec(0..8usize, 1..3).prop_map(Call::Unprepare),
        ]
    }

    fn run(devices_of: Vec<usize>, rounds: Vec<Vec<Call>>) -> Result<(), TestCaseError> {
        let dir = tempfile::tempdir().unwrap();
        let files = DraFiles {
            checkpoint: dir.path().join("state/dra-prepared.json"),
            cdi_dir: dir.path().join("cdi"),
            driver: "gpu-slicer.io".into(),
        };
        let claims = Claims::new();
        for (i, d) in devices_of.iter().enumerate() {
            let c = claim_ref(i);
            claims.put(claim_json(&c.name, &c.uid, DEVICES[*d], "node-a"));
        }
        let driver = Driver::with_extras(
            "gpu-slicer.io",
            "node-a",
            sixteen_gpus(),
            claims,
            (files, Prepared::default()),
            DriverExtras::default(),
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        for round in rounds {
            // Every call of a round at once.
            let outcomes = rt.block_on(async {
                let mut set = tokio::task::JoinSet::new();
                for c in round {
                    let driver = driver.clone();
                    set.spawn(async move {
                        match c {
                            Call::Prepare(ix) => {
                                let refs: Vec<_> = ix.iter().map(|i| claim_ref(*i)).collect();
                                let out = driver.prepare(&refs).await;
                                out.into_iter().find_map(|(_, o)| match o {
                                    Err(e) if !e.to_string().contains("already prepared") => {
                                        Some(e)
                                    }
                                    _ => None,
                                })
                            }
                            Call::Unprepare(ix) => {
                                let refs: Vec<_> = ix.iter().map(|i| claim_ref(*i)).collect();
                                driver
                                    .unprepare(&refs)
                                    .await
                                    .into_values()
                                    .find_map(Result::err)
                            }
                        }
                    });
                }
                set.join_all().await
            });
            prop_assert!(
                outcomes.iter().all(|e| e.is_none()),
                "an unexpected error: {:?}",
                outcomes
            );
            let held = driver.prepared_claims();
            let mut taken = std::collections::BTreeMap::new();
            for uid in &held {
                let i: usize = uid[24..].parse().unwrap();
                if let Some(other) = taken.insert(devices_of[i], uid.clone()) {
                    prop_assert!(
                        false,
                        "{} held by {other} and {uid}",
                        DEVICES[devices_of[i]]
                    );
                }
            }
            let saved = checkpoint(dir.path());
            prop_assert_eq!(
                saved.claims.keys().cloned().collect::<Vec<_>>(),
                held.clone()
            );
            for i in 0..devices_of.len() {
                let uid = claim_ref(i).uid;
                let spec = dir
                    .path()
                    .join(format!("cdi/k8s.gpu-slicer.io-claim_{uid}.json"));
                prop_assert_eq!(spec.exists(), held.contains(&uid), "spec of {}", uid);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
        #[test]
        fn concurrent_batches_never_hand_one_device_to_two_claims(
            devices_of in prop::collection::vec(0..3usize, 8),
            rounds in prop::collection::vec(prop::collection::vec(call(), 1..5), 1..4),
        ) {
            run(devices_of, rounds)?;
        }
    }
}
