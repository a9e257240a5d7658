//! The API-server emulator's scheduler (`ApiServer::allocate_share`) against the real one:
//! every case of `tests/fixtures/allocator/capacity-cases.json` (one device, the claims
//! already allocated on it, one claim, and what `k8s.io/dynamic-resource-allocation/structured`
//! v0.37.2 with the 1.37 scheduler's features did with it; written by `hack/allocator.sh`
//! with `ALLOCATOR_WRITE_CASES=1`) is replayed through the emulator, which must give the same
//! device the same way (shared or whole) with the same amounts consumed, or refuse it too.

use std::collections::BTreeMap;

use gpu_slicer::testkit::{ApiServer, ShareRequest};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
struct Corpus {
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    about: String,
    slices: Vec<Value>,
    allocated: Vec<Value>,
    claim: Value,
    device: String,
    expect: Expect,
}

#[derive(Debug, Deserialize)]
struct Expect {
    allocated: bool,
    #[serde(default)]
    results: Vec<Outcome>,
}

#[derive(Debug, Deserialize)]
struct Outcome {
    device: String,
    shared: bool,
    #[serde(rename = "consumedMilli", default)]
    consumed_milli: BTreeMap<String, i128>,
}

/// A quantity as the emulator writes one (`10Gi`, `2Mi`, `25`, `300m`) in milli units.
fn milli(text: &str) -> i128 {
    let (num, mult) = if let Some(n) = text.strip_suffix('m') {
        (n, 1)
    } else if let Some(n) = text.strip_suffix("Gi") {
        (n, 1000 << 30)
    } else if let Some(n) = text.strip_suffix("Mi") {
        (n, 1000 << 20)
    } else {
        (text, 1000)
    };
    num.parse::<i128>()
        .unwrap_or_else(|e| panic!("emulator quantity {text}: {e}"))
        * mult
}

fn corpus() -> Corpus {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/allocator/capacity-cases.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The field at `pointer` of `v` as a string.
fn text<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no {pointer} in {v}"))
}

async fn replay(case: &Case) -> Result<(), String> {
    let api = ApiServer::start().await.unwrap();
    for s in &case.slices {
        let slice: ResourceSlice = serde_json::from_value(s.clone()).unwrap();
        // k8s-openapi must carry every field the allocator read (capacity policies, taints,
        // allowMultipleAllocations): a field it dropped would make the replay meaningless.
        let back = serde_json::to_value(&slice).unwrap();
        assert_eq!(
            back["spec"]["devices"], s["spec"]["devices"],
            "{}: the slice lost fields through k8s-openapi",
            case.name
        );
        api.insert(&slice).unwrap();
    }
    for c in case.allocated.iter().chain([&case.claim]) {
        let claim: ResourceClaim = serde_json::from_value(c.clone()).unwrap();
        api.insert(&claim).unwrap();
    }
    let slice = &case.slices[0];
    let ns = text(&case.claim, "/metadata/namespace");
    let name = text(&case.claim, "/metadata/name");
    let request = text(&case.claim, "/spec/devices/requests/0/name");
    let share = ShareRequest::new(
        request,
        text(slice, "/spec/driver"),
        text(slice, "/spec/pool/name"),
        &case.device,
    );
    let got = api.allocate_share(ns, name, &share);
    let stored = api.get::<ResourceClaim>(ns, name).unwrap();
    api.stop().await;
    match (got, case.expect.allocated) {
        (Err(e), true) => Err(format!("emulator refused ({e}), the allocator allocated")),
        (Ok(a), false) => Err(format!("emulator allocated {a:?}, the allocator refused")),
        (Err(_), false) => Ok(()),
        (Ok(a), true) => {
            let want = &case.expect.results[0];
            let results = stored
                .status
                .and_then(|s| s.allocation)
                .and_then(|a| a.devices.and_then(|d| d.results))
                .unwrap_or_default();
            let written = results.first().ok_or("no result written")?;
            if written.device != want.device {
                return Err(format!("device {}, want {}", written.device, want.device));
            }
            if a.share_id.is_some() != want.shared || written.share_id.is_some() != want.shared {
                return Err(format!(
                    "shareID {:?} (written {:?}), want shared = {}",
                    a.share_id, written.share_id, want.shared
                ));
            }
            let consumed: BTreeMap<String, i128> = a
                .consumed
                .iter()
                .map(|(k, v)| (k.clone(), milli(v)))
                .collect();
            let written_consumed: BTreeMap<String, i128> = written
                .consumed_capacity
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), milli(&v.0)))
                .collect();
            if consumed != want.consumed_milli || written_consumed != want.consumed_milli {
                return Err(format!(
                    "consumed (milli) {consumed:?} (written {written_consumed:?}), want {:?}",
                    want.consumed_milli
                ));
            }
            Ok(())
        }
    }
}

#[tokio::test]
async fn the_emulators_scheduler_decides_every_case_as_the_real_allocator() {
    let corpus = corpus();
    assert!(corpus.cases.len() >= 20, "{} cases", corpus.cases.len());
    let mut failures = Vec::new();
    for case in &corpus.cases {
        if let Err(e) = replay(case).await {
            failures.push(format!("{} ({}): {e}", case.name, case.about));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_corpus_covers_refusals_shares_and_whole_devices() {
    let cases = corpus().cases;
    let refused = cases.iter().filter(|c| !c.expect.allocated).count();
    let shared = cases
        .iter()
        .filter(|c| c.expect.results.iter().any(|r| r.shared))
        .count();
    let whole = cases
        .iter()
        .filter(|c| c.expect.results.iter().any(|r| !r.shared))
        .count();
    assert!(
        refused >= 5 && shared >= 5 && whole >= 2,
        "{refused} refused, {shared} shared, {whole} whole"
    );
}
