//! The DRA driver reading claims through the real `kube` client from the in-process API
//! server emulator: a claim allocated as the scheduler would (`allocate_claim`) is prepared;
//! a deleted and re-created claim (new UID), an unallocated one, a missing one, 403 and 500
//! answers are each that claim's error; a slow answer still prepares.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpu_slicer::domain::cdi::{GenerateOptions, NoProbe, generate};
use gpu_slicer::domain::snapshot::Snapshot;
use gpu_slicer::platform::kube::KubeClaims;
use gpu_slicer::runtime::Context;
use gpu_slicer::runtime::dra::{DraSettings, spawn};
use gpu_slicer::state::Store;
use gpu_slicer::testkit::apiserver::{ApiServer, Fault, Verb};
use gpu_slicer::testkit::fixtures;
use gpu_slicer::testkit::kubelet::dra::{KubeletClaim, register};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const DRIVER: &str = "gpu-slicer.io";

fn store() -> Store {
    let (inv, cfg, plan) =
        fixtures::planned("mixed-a100", "version: v1\nflags:\n  migStrategy: mixed\n");
    let spec = generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe).unwrap();
    let mut snap = Snapshot::serving(cfg, inv, plan);
    snap.spec = Some(Arc::new(spec));
    Store::new(snap)
}

fn settings(root: &Path) -> DraSettings {
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

async fn create(api: &Api<ResourceClaim>, name: &str) -> String {
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu-slicer.io"}}]}}
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &claim).await.unwrap();
    created.metadata.uid.unwrap()
}

fn allocation(device: &str) -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(vec![DeviceRequestAllocationResult {
                request: "gpu".into(),
                driver: DRIVER.into(),
                pool: "node-a".into(),
                device: device.into(),
                ..Default::default()
            }]),
            config: None,
        }),
        ..Default::default()
    }
}

fn k(name: &str, uid: &str) -> KubeletClaim {
    KubeletClaim {
        namespace: "ml".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

#[tokio::test]
async fn claims_come_from_the_api_and_its_failures_are_the_claims_errors() {
    gpu_slicer::platform::kube::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServer::start().await.unwrap();
    let client = server.client().unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "ml");
    let good = create(&claims, "good").await;
    server
        .allocate_claim("ml", "good", &allocation("gpu-2"))
        .unwrap();
    let pending = create(&claims, "pending").await;
    let old = create(&claims, "replaced").await;
    claims
        .delete("replaced", &DeleteParams::default())
        .await
        .unwrap();
    let new = create(&claims, "replaced").await;
    assert_ne!(old, new);
    server
        .allocate_claim("ml", "replaced", &allocation("gpu-3"))
        .unwrap();
    let denied = create(&claims, "denied").await;
    let failing = create(&claims, "failing").await;
    let slow = create(&claims, "slow").await;
    server
        .allocate_claim("ml", "slow", &allocation("gpu-3"))
        .unwrap();
    server.inject(Fault::status(Verb::Get, "/resourceclaims/denied", 403));
    server.inject(Fault::status(Verb::Get, "/resourceclaims/failing", 500));
    server.inject(Fault::delay(
        Verb::Get,
        "/resourceclaims/slow",
        Duration::from_millis(200),
    ));

    let ctx = Context::new(store());
    let _handle = spawn(
        settings(dir.path()),
        Arc::new(KubeClaims::new(client)),
        &ctx,
    )
    .await
    .unwrap();
    let kubelet = register(&dir.path().join(format!("reg/{DRIVER}-reg.sock")))
        .await
        .unwrap();
    let answer = kubelet
        .prepare(
            &[
                k("good", &good),
                k("pending", &pending),
                k("replaced", &old),
                k("absent", "00000000-0000-4000-8000-0000000000aa"),
                k("denied", &denied),
                k("failing", &failing),
                k("slow", &slow),
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(answer.len(), 7);
    assert_eq!(
        answer[&good].as_ref().unwrap()[0].1,
        [format!("k8s.{DRIVER}/claim={good}-gpu-2")]
    );
    let err = |uid: &str| answer[uid].clone().unwrap_err();
    assert!(err(&pending).contains("not allocated"), "{}", err(&pending));
    assert!(err(&old).contains("re-created"), "{}", err(&old));
    assert!(err("00000000-0000-4000-8000-0000000000aa").contains("not found"));
    assert!(err(&denied).contains("403"), "{}", err(&denied));
    assert!(err(&failing).contains("500"), "{}", err(&failing));
    assert!(answer[&slow].is_ok(), "{:?}", answer[&slow]);
    ctx.token.cancel();
    ctx.tracker.close();
    ctx.tracker.wait().await;
    server.stop().await;
}
