//! The driver's own accounting of consumable capacity, as a property (beside the end-to-end
//! share tests of `tests/dra_capacity.rs`): no sequence of prepares and unprepares of shares
//! of one GPU over-commits it, the checkpoint holds exactly the prepared claims, and once
//! every claim is unprepared no spec, record or capacity is left.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::domain::cdi::shares::HookSettings;
use crate::domain::cdi::{GenerateOptions, NoProbe, generate};
use crate::domain::dra::claim::ClaimRef;
use crate::domain::snapshot::Snapshot;
use crate::platform::dra_state::{DraFiles, Prepared};
use crate::runtime::dra::{Driver, DriverExtras};
use crate::state::Store;
use crate::testkit::fixtures;
use crate::testkit::kubelet::dra::Claims;
use proptest::prelude::*;
use serde_json::json;

const GIB: u64 = 1 << 30;
const CONFIG: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.mem, replicas: 4, devices: [2], isolation: memory}\n";

#[derive(Debug, Clone)]
enum Op {
    Prepare {
        claim: usize,
        gib: u64,
        compute: u32,
    },
    Unprepare {
        claim: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..6usize, 1..50u64, 0..60u32).prop_map(|(claim, gib, compute)| Op::Prepare {
            claim,
            gib,
            compute
        }),
        (0..6usize).prop_map(|claim| Op::Unprepare { claim }),
    ]
}

fn claim_ref(i: usize) -> ClaimRef {
    ClaimRef {
        namespace: "ml".into(),
        uid: format!("00000000-0000-4000-8000-00000000000{i}"),
        name: format!("c{i}"),
    }
}

/// Memory and compute the checkpoint holds on gpu-2.
fn held(dir: &std::path::Path) -> (u64, u32, usize) {
    let p: Prepared =
        crate::platform::dra_state::read_checkpoint_file(&dir.join("state/dra-prepared.json"))
            .unwrap_or_default();
    let shares: Vec<_> = p
        .claims
        .values()
        .flat_map(|c| c.devices.iter())
        .filter(|d| d.device == "gpu-2")
        .map(|d| d.consumed.unwrap())
        .collect();
    (
        shares.iter().map(|c| c.memory_bytes).sum(),
        shares.iter().map(|c| c.compute_percent).sum(),
        p.claims.len(),
    )
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let (inv, cfg, plan) = fixtures::planned("mixed-a100", CONFIG);
    let spec = generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe).unwrap();
    let mut snap = Snapshot::serving(cfg, inv, plan);
    snap.spec = Some(Arc::new(spec));
    let files = DraFiles {
        checkpoint: dir.path().join("state/dra-prepared.json"),
        cdi_dir: dir.path().join("cdi"),
        driver: "gpu-slicer.io".into(),
    };
    let claims = Claims::new();
    let extras = DriverExtras {
        hook: Some(HookSettings {
            path: "/opt/gpu-slicer".into(),
            nvml_lib: None,
            env: vec![],
        }),
        ..DriverExtras::default()
    };
    let driver = Driver::with_extras(
        "gpu-slicer.io",
        "node-a",
        Store::new(snap),
        claims.clone(),
        (files, Prepared::default()),
        extras,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The model: what each prepared claim holds.
    let mut model: BTreeMap<usize, (u64, u32)> = BTreeMap::new();
    for (n, op) in ops.into_iter().enumerate() {
        match op {
            Op::Prepare {
                claim,
                gib,
                compute,
            } => {
                let c = claim_ref(claim);
                // A fresh allocation each time, as a (possibly buggy) scheduler writes it.
                claims.put(json!({"metadata": {"namespace": "ml", "name": c.name, "uid": c.uid},
                    "status": {"allocation": {"devices": {"results": [{"request": "gpu",
                        "driver": "gpu-slicer.io", "pool": "node-a", "device": "gpu-2",
                        "shareID": format!("share-{n}"),
                        "consumedCapacity": {"memory": format!("{gib}Gi"), "compute": compute.to_string()}}]}}}}));
                let out = rt.block_on(driver.prepare(std::slice::from_ref(&c)));
                let (mem, cpu): (u64, u32) = model
                    .iter()
                    .filter(|(k, _)| **k != claim)
                    .fold((0, 0), |(m, p), (_, (a, b))| (m + a, p + b));
                let fits = mem + gib * GIB <= 80 * GIB && cpu + compute <= 100;
                match (&out[&c.uid], model.contains_key(&claim)) {
                    // Already prepared: answered again, whatever the API says now.
                    (Ok(_), true) => {}
                    (Ok(_), false) => {
                        prop_assert!(fits, "prepared over capacity: {out:?}");
                        model.insert(claim, (gib * GIB, compute));
                    }
                    (Err(e), false) => {
                        prop_assert!(!fits, "refused although it fits: {e}");
                        prop_assert_eq!(e.rule(), "share_over_capacity", "{}", e);
                        let e = e.to_string();
                        prop_assert!(e.contains("gpu-2") && e.contains("free"), "{e}");
                    }
                    (Err(e), true) => prop_assert!(false, "a prepared claim failed: {e}"),
                }
            }
            Op::Unprepare { claim } => {
                let c = claim_ref(claim);
                let out = rt.block_on(driver.unprepare(std::slice::from_ref(&c)));
                prop_assert!(out[&c.uid].is_ok());
                model.remove(&claim);
            }
        }
        let (mem, cpu, count) = held(dir.path());
        prop_assert!(mem <= 80 * GIB && cpu <= 100, "held {mem} bytes, {cpu} %");
        prop_assert_eq!(count, model.len());
    }
    let all: Vec<ClaimRef> = (0..6).map(claim_ref).collect();
    rt.block_on(driver.unprepare(&all));
    prop_assert_eq!(held(dir.path()), (0, 0, 0));
    prop_assert!(driver.prepared_claims().is_empty());
    // No spec and no claim record (in the records folder beside the specs) is left.
    let files = |d: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(d)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect()
    };
    let left: Vec<_> = files(&dir.path().join("cdi"))
        .into_iter()
        .flat_map(|p| if p.is_dir() { files(&p) } else { vec![p] })
        .collect();
    prop_assert!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn no_sequence_of_prepares_and_unprepares_over_commits_a_device(
        ops in proptest::collection::vec(op(), 1..24)
    ) {
        run(ops)?;
    }
}
