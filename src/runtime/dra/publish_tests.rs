//! The DRA driver's ResourceSlices published through the real `kube` client to the in-process
//! API-server emulator: on start (owner reference to the Node, generation 1), again at the
//! next generation when a device's health changes (a taint) and when it recovers, re-created
//! after a delete, converging after the API was down, after forbidden LISTs, failed and slow
//! writes, and stale
//! slices of the pool (an old generation, another split) removed.

use std::time::Duration;

use crate::domain::inventory::Health;
use crate::platform::kube::{NodeApi, SliceApi};
use crate::runtime::Context;
use crate::runtime::dra::publish::{self, PublishSettings, PublishStatus};
use crate::testkit::apiserver::{ApiServer, Fault, Verb};
use crate::testkit::fixtures;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::watch;

const DRIVER: &str = "gpu-slicer.io";
const NODE: &str = "node-a";
const NODE_UID: &str = "0b6a4d8e-5a7c-4f1e-9c3d-000000000001";
const WAIT: Duration = Duration::from_secs(30);

fn node() -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": NODE, "uid": NODE_UID}
    }))
    .unwrap()
}

struct Publishing {
    ctx: Context,
    status: watch::Receiver<PublishStatus>,
}

impl Publishing {
    async fn stop(self) {
        self.ctx.token.cancel();
        self.ctx.tracker.close();
        tokio::time::timeout(WAIT, self.ctx.tracker.wait())
            .await
            .unwrap();
    }
}

fn start(server: &ApiServer, ctx: Context) -> Publishing {
    let client = server.client().unwrap();
    let mut settings = PublishSettings::new(
        SliceApi::new(client.clone(), DRIVER, NODE),
        NodeApi::new(client, NODE.into()),
    );
    settings.backoff_base = Duration::from_millis(5);
    settings.backoff_cap = Duration::from_millis(50);
    let status = publish::spawn(settings, &ctx).into_inner();
    Publishing { ctx, status }
}

/// Our slices in the emulator, when they form one complete pool: (generation, slices).
fn pool(slices: &[ResourceSlice]) -> Option<(i64, Vec<&ResourceSlice>)> {
    let ours: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(NODE))
        .collect();
    let generation = ours.first()?.spec.pool.generation;
    let complete = ours.iter().all(|s| {
        s.spec.pool.generation == generation
            && usize::try_from(s.spec.pool.resource_slice_count).ok() == Some(ours.len())
    });
    complete.then_some((generation, ours))
}

fn tainted(slices: &[&ResourceSlice], device: &str) -> bool {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .any(|d| d.name == device && d.taints.as_ref().is_some_and(|t| !t.is_empty()))
}

async fn wait_pool(
    server: &ApiServer,
    what: &str,
    mut check: impl FnMut(i64, &[&ResourceSlice]) -> bool,
) -> i64 {
    let mut seen = 0;
    let ok = server
        .wait_for::<ResourceSlice, _>(WAIT, |all| match pool(all) {
            Some((g, ours)) if check(g, &ours) => {
                seen = g;
                true
            }
            _ => false,
        })
        .await;
    assert!(
        ok,
        "{what}: slices now {:#?}",
        server.list::<ResourceSlice>()
    );
    seen
}

#[tokio::test]
async fn published_on_start_and_again_on_every_change() {
    let server = ApiServer::start().await.unwrap();
    server.insert(&node()).unwrap();
    let store = fixtures::store("dgx-h100", "version: v1\n");
    let gpu3 = store.current().inventory.gpus[3].uuid.clone();
    let p = start(&server, Context::new(store.clone()));

    let first = wait_pool(&server, "published on start", |g, ours| {
        g >= 1 && ours.len() == 1
    })
    .await;
    let slices = server.list::<ResourceSlice>();
    let s = &slices[0];
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Node", NODE_UID)
    );
    assert_eq!(s.spec.pool.name, NODE);
    let names: Vec<&str> = s
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names.len(), 8);
    assert!(
        names.contains(&"gpu-0") && names.contains(&"gpu-7"),
        "{names:?}"
    );

    // A device goes unhealthy: the pool is written again, the device tainted.
    store
        .set_health(&gpu3, Health::Unhealthy, "xid-79")
        .unwrap();
    let second = wait_pool(&server, "taint after XID", |g, ours| {
        g > first && tainted(ours, "gpu-3")
    })
    .await;
    // It recovers: the taint goes.
    store.set_health(&gpu3, Health::Healthy, "").unwrap();
    wait_pool(&server, "taint removed", |g, ours| {
        g > second && !tainted(ours, "gpu-3")
    })
    .await;
    // The status follows (it is told after the write's answer).
    let mut status = p.status.clone();
    let s = status
        .wait_for(|s| s.generation > second)
        .await
        .unwrap()
        .clone();
    assert_eq!((s.slices, s.last_error), (1, None));
    p.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn deleted_slices_are_recreated_and_stale_ones_removed() {
    let server = ApiServer::start().await.unwrap();
    server.insert(&node()).unwrap();
    // What an older run left: a slice of another split at an old generation.
    let stale: ResourceSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-a-gpu-slicer.io-7"},
        "spec": {"driver": DRIVER, "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 4, "resourceSliceCount": 8},
                 "devices": [{"name": "gpu-99"}]}
    }))
    .unwrap();
    server.insert(&stale).unwrap();
    let p = start(
        &server,
        Context::new(fixtures::store("dgx-h100", "version: v1\n")),
    );

    let first = wait_pool(&server, "stale slice replaced", |g, ours| {
        ours.len() == 1 && g > 4
    })
    .await;
    let name = server.list::<ResourceSlice>()[0]
        .metadata
        .name
        .clone()
        .unwrap();
    assert_eq!(name, "node-a-gpu-slicer.io-0");

    // The kubelet wipes the node's slices (it does when it starts).
    assert!(server.remove::<ResourceSlice>("", &name));
    wait_pool(&server, "re-created after delete", |g, ours| {
        ours.len() == 1 && g > first
    })
    .await;
    p.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn converges_after_the_api_was_down_and_after_failed_writes() {
    let server = ApiServer::start().await.unwrap();
    server.insert(&node()).unwrap();
    // The first LISTs are forbidden (RBAC not granted yet), the first creates fail (5xx,
    // then a conflict), the next is slow: retried with backoff until it lands.
    server.inject(Fault::status(Verb::List, "/resourceslices", 403).times(2));
    server.inject(Fault::status(Verb::Create, "/resourceslices", 500).times(2));
    server.inject(Fault::status(Verb::Create, "/resourceslices", 409).times(1));
    server
        .inject(Fault::delay(Verb::Create, "/resourceslices", Duration::from_millis(300)).times(1));
    let store = fixtures::store("dgx-h100", "version: v1\n");
    let gpu0 = store.current().inventory.gpus[0].uuid.clone();
    let p = start(&server, Context::new(store.clone()));
    let first = wait_pool(&server, "published after failed creates", |_, ours| {
        ours.len() == 1
    })
    .await;
    assert!(server.count(Verb::Create, "/apis/resource.k8s.io/v1/resourceslices") >= 4);
    assert!(server.count(Verb::List, "/apis/resource.k8s.io/v1/resourceslices") >= 3);

    // The API goes away; meanwhile a device fails; the API comes back.
    server.go_down();
    store
        .set_health(&gpu0, Health::Unhealthy, "gpu-lost")
        .unwrap();
    let mut status = p.status.clone();
    status.wait_for(|s| s.last_error.is_some()).await.unwrap();
    server.come_up().await.unwrap();
    wait_pool(&server, "converged after the API came back", |g, ours| {
        g > first && tainted(ours, "gpu-0")
    })
    .await;
    // A conflicting update (someone else wrote it meanwhile) is re-read and redone.
    server.inject(Fault::status(Verb::Update, "/resourceslices", 409).times(1));
    store.set_health(&gpu0, Health::Healthy, "").unwrap();
    wait_pool(&server, "recovered after a conflict", |_, ours| {
        !tainted(ours, "gpu-0")
    })
    .await;
    p.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn the_layout_follows_the_servers_version() {
    // Two dynamic MIG GPUs of mixed-a100: a counter set each.
    let config = "version: v1\nflags:\n  migStrategy: mixed\n  dra: {dynamicMig: [0, 1]}\n";
    for (minor, combined) in [("34", true), ("35+", false)] {
        let server = ApiServer::start().await.unwrap();
        server.insert(&node()).unwrap();
        server.set_version("1", minor);
        let p = start(&server, Context::new(fixtures::store("mixed-a100", config)));
        wait_pool(&server, "published", |_, ours| {
            let sets: usize = ours
                .iter()
                .map(|s| s.spec.shared_counters.iter().flatten().count())
                .sum();
            let mixing = ours.iter().any(|s| {
                s.spec
                    .shared_counters
                    .as_ref()
                    .is_some_and(|c| !c.is_empty())
                    && s.spec.devices.as_ref().is_some_and(|d| !d.is_empty())
            });
            sets == 2 && mixing == combined
        })
        .await;
        p.stop().await;
        server.stop().await;
    }
}
