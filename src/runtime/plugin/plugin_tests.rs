//! Device plugin over real gRPC and unix sockets against the kubelet emulator:
//! registration, ListAndWatch, every Allocate rule, preferred allocation, kubelet restarts.

use std::os::unix::fs::PermissionsExt;

use proptest::prelude::*;
use tonic::Code;

use crate::domain::inventory::Health;
use crate::runtime::plugin::socket_name;
use crate::testkit::fixtures::{self, SHARED_CONFIG};
use crate::testkit::kubelet::EmulatorError;
use crate::testkit::{Node, temp_dir, within};

const GPU2: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02";
const GPU3: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03";

/// The emulator and the daemon on `profile` with `config_text`, every resource registered.
async fn start(profile: &str, config_text: &str) -> Node {
    Node::start(profile, fixtures::config(config_text), |_, _| {})
        .await
        .unwrap_or_else(|e| panic!("daemon did not start: {e}"))
}

fn rep(uuid: &str, n: u32) -> String {
    format!("{uuid}::{n}")
}

fn rpc(err: EmulatorError) -> (Code, String) {
    match err {
        EmulatorError::Rpc { code, message, .. } => (code, message),
        other => panic!("expected an RPC error, got {other}"),
    }
}

#[tokio::test]
async fn registration_shape() {
    let h = start("mixed-a100", SHARED_CONFIG).await;
    let regs = h.emulator.registrations().borrow().clone();
    assert_eq!(
        regs.keys().cloned().collect::<Vec<_>>(),
        vec![
            "nvidia.com/gpu",
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-2g.20gb",
            "nvidia.com/mig-3g.40gb"
        ]
    );
    for (name, reg) in &regs {
        assert_eq!(
            reg.endpoint,
            socket_name(name),
            "endpoint is the socket file name"
        );
        assert!(reg.get_preferred_allocation_available);
        assert_eq!(reg.count, 1);
        let meta = std::fs::metadata(h.plugin_dir().join(&reg.endpoint)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }
    assert_eq!(
        socket_name("nvidia.com/mig-1g.10gb"),
        "gpu-slicer-nvidia.com-mig-1g.10gb.sock"
    );
    h.stop().await.unwrap();
}

#[tokio::test]
async fn list_and_watch_initial_frame_and_health_update() {
    let h = start("mixed-a100", SHARED_CONFIG).await;
    let mut gpu = h.emulator.devices("nvidia.com/gpu").unwrap();
    let mut mig = h.emulator.devices("nvidia.com/mig-1g.10gb").unwrap();
    {
        let frame = gpu.borrow_and_update();
        assert_eq!(frame.len(), 8);
        assert!(frame.iter().all(|d| d.healthy && d.numa_node == Some(1)));
    }
    assert_eq!(mig.borrow_and_update().len(), 9);
    // A GPU event takes out every replica of that GPU and nothing else.
    let changed = h
        .running
        .probe()
        .store
        .set_health(GPU3, Health::Unhealthy, "Xid 79")
        .unwrap();
    assert_eq!(changed.len(), 1);
    within("frame after event", gpu.changed()).await.unwrap();
    {
        let frame = gpu.borrow_and_update();
        let down: Vec<&str> = frame
            .iter()
            .filter(|d| !d.healthy)
            .map(|d| d.id.as_str())
            .collect();
        assert_eq!(down.len(), 4);
        assert!(down.iter().all(|id| id.starts_with(GPU3)));
    }
    assert!(!mig.has_changed().unwrap());
    // Parent GPU 0 of seven 1g.10gb slices.
    h.running
        .probe()
        .store
        .set_health(
            "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e00",
            Health::Unhealthy,
            "fell off the bus",
        )
        .unwrap();
    within("mig frame", mig.changed()).await.unwrap();
    assert_eq!(mig.borrow().iter().filter(|d| d.healthy).count(), 2);
    // Recovery.
    h.running
        .probe()
        .store
        .set_health(GPU3, Health::Healthy, "")
        .unwrap();
    within("recovery frame", gpu.changed()).await.unwrap();
    assert!(gpu.borrow().iter().all(|d| d.healthy));
    h.stop().await.unwrap();
}

#[tokio::test]
async fn allocate_success_cdi_first() {
    let h = start("mixed-a100", SHARED_CONFIG).await;
    let a = h
        .emulator
        .allocate_ids("nvidia.com/gpu", &[rep(GPU2, 0), rep(GPU2, 3)])
        .await
        .unwrap();
    assert_eq!(a.cdi_devices, vec![format!("gpu-slicer.io/gpu={GPU2}")]);
    assert_eq!(
        a.annotations.get("cdi.k8s.io/gpu-slicer_nvidia.com_gpu"),
        Some(&format!("gpu-slicer.io/gpu={GPU2}"))
    );
    assert_eq!(
        a.envs.get("NVIDIA_VISIBLE_DEVICES"),
        Some(&GPU2.to_string())
    );
    assert_eq!(a.envs.get("GPU_SLICER_REPLICAS").unwrap(), "2");
    assert_eq!(a.envs.get("GPU_SLICER_COMPUTE_PERCENT").unwrap(), "50");
    h.stop().await.unwrap();
}

#[tokio::test]
async fn allocate_rule_unknown_id() {
    let h = start("mixed-a100", SHARED_CONFIG).await;
    let err = h
        .emulator
        .allocate_ids("nvidia.com/gpu", &[rep(GPU2, 0), "GPU-bogus::0".into()])
        .await
        .unwrap_err();
    let (code, message) = rpc(err);
    assert_eq!(code, Code::InvalidArgument);
    assert!(
        message.contains("GPU-bogus::0") && message.contains("IDs must exist"),
        "{message}"
    );
    h.stop().await.unwrap();
}

#[tokio::test]
async fn allocate_rule_duplicate_id() {
    let h = start("mixed-a100", SHARED_CONFIG).await;
    let err = h
        .emulator
        .allocate_ids("nvidia.com/gpu", &[rep(GPU2, 1), rep(GPU2, 1)])
        .await
        .unwrap_err();
    let (code, message) = rpc(err);
    assert_eq!(code, Code::InvalidArgument);
    assert!(
        message.contains(&rep(GPU2, 1)) && message.contains("unique"),
        "{message}"
    );
    h.stop().await.unwrap();
}

#[tokio::test]
async fn allocate_rule_unhealthy() {
    let h = start("mixed-a100", SHARED_CONFIG).await;
    let mut gpu = h.emulator.devices("nvidia.com/gpu").unwrap();
    gpu.borrow_and_update();
    h.running
        .probe()
        .store
        .set_health(&rep(GPU2, 2), Health::Unhealthy, "ECC error")
        .unwrap();
    within("frame", gpu.changed()).await.unwrap();
    let err = h
        .emulator
        .allocate_ids("nvidia.com/gpu", &[rep(GPU2, 2)])
        .await
        .unwrap_err();
    let (code, message) = rpc(err);
    assert_eq!(code, Code::FailedPrecondition);
    assert!(
        message.contains(&rep(GPU2, 2))
            && message.contains("ECC error")
            && message.contains("healthy"),
        "{message}"
    );
    // Its siblings are fine.
    h.emulator
        .allocate_ids("nvidia.com/gpu", &[rep(GPU2, 1)])
        .await
        .unwrap();
    h.stop().await.unwrap();
}

#[tokio::test]
async fn allocate_rule_fail_requests_greater_than_one() {
    let h = start(
        "mixed-a100",
        "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
    )
    .await;
    h.emulator
        .allocate_ids("nvidia.com/gpu", &[rep(GPU3, 0)])
        .await
        .unwrap();
    let err = h
        .emulator
        .allocate_ids("nvidia.com/gpu", &[rep(GPU3, 0), rep(GPU3, 1)])
        .await
        .unwrap_err();
    let (code, message) = rpc(err);
    assert_eq!(code, Code::InvalidArgument);
    assert!(
        message.contains("failRequestsGreaterThanOne") && message.contains(&rep(GPU3, 1)),
        "{message}"
    );
    h.stop().await.unwrap();
}

#[tokio::test]
async fn allocate_rule_replicas_on_one_gpu() {
    let h = start("mixed-a100", SHARED_CONFIG).await;
    let err = h
        .emulator
        .allocate_ids("nvidia.com/gpu", &[rep(GPU2, 0), rep(GPU3, 0)])
        .await
        .unwrap_err();
    let (code, message) = rpc(err);
    assert_eq!(code, Code::InvalidArgument);
    assert!(
        message.contains(&rep(GPU3, 0)) && message.contains("allowMultiGpu"),
        "{message}"
    );
    h.stop().await.unwrap();
}

#[tokio::test]
async fn allocate_rule_empty_request() {
    let h = start("mixed-a100", SHARED_CONFIG).await;
    let err = h
        .emulator
        .allocate_ids("nvidia.com/gpu", &[])
        .await
        .unwrap_err();
    assert_eq!(rpc(err).0, Code::InvalidArgument);
    h.stop().await.unwrap();
}

#[tokio::test]
async fn kubelet_style_allocation_uses_preferred_and_is_listed_in_pod_resources() {
    use crate::proto::podresources as pr;
    let h = start("mixed-a100", SHARED_CONFIG).await;
    let a = h.emulator.allocate("nvidia.com/gpu", 3).await.unwrap();
    // Preferred allocation keeps replicas of one request on one GPU.
    let gpu = &a.device_ids[0][..GPU2.len()];
    assert!(
        a.device_ids.iter().all(|id| id.starts_with(gpu)),
        "{:?}",
        a.device_ids
    );
    let path = h.dir.path().join("pr.sock");
    h.emulator.serve_pod_resources(&path).unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", path.display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = pr::pod_resources_lister_client::PodResourcesListerClient::new(channel);
    let list = within("List", client.list(pr::ListPodResourcesRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.pod_resources.len(), 1);
    let devices = &list.pod_resources[0].containers[0].devices[0];
    assert_eq!(devices.resource_name, "nvidia.com/gpu");
    assert_eq!(devices.device_ids, a.device_ids);
    let alloc = within(
        "GetAllocatable",
        client.get_allocatable_resources(pr::AllocatableResourcesRequest {}),
    )
    .await
    .unwrap()
    .into_inner();
    assert_eq!(alloc.devices.len(), 8 + 9 + 1 + 1);
    h.stop().await.unwrap();
}

#[tokio::test]
async fn preferred_allocation_policies_over_grpc() {
    let h = start("dgx-h100", "").await;
    let all: Vec<String> = h
        .emulator
        .devices("nvidia.com/gpu")
        .unwrap()
        .borrow()
        .iter()
        .map(|d| d.id.clone())
        .collect();
    // NUMA-aware: must-include on node 1 pulls the rest from node 1.
    let must = vec!["GPU-4a1f3c2e-8b7d-4e6f-9a0b-1c2d3e4f5004".to_string()];
    let got = h
        .emulator
        .preferred("nvidia.com/gpu", &all, &must, 4)
        .await
        .unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(got[0], must[0]);
    let frame = h
        .emulator
        .devices("nvidia.com/gpu")
        .unwrap()
        .borrow()
        .clone();
    for id in &got {
        let d = frame.iter().find(|d| &d.id == id).unwrap();
        assert_eq!(d.numa_node, Some(1), "{got:?}");
    }
    h.stop().await.unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn preferred_over_grpc_is_well_formed(mask in proptest::collection::vec(any::<bool>(), 32), must_n in 0usize..3, size in 1usize..8) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let h = start("dgx-h100", "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n").await;
            let available: Vec<String> = h.emulator.devices("nvidia.com/gpu").unwrap().borrow().iter()
                .enumerate().filter(|(i, _)| mask[i % mask.len()]).map(|(_, d)| d.id.clone()).collect();
            let must: Vec<String> = available.iter().take(must_n.min(size)).cloned().collect();
            let got = h.emulator.preferred("nvidia.com/gpu", &available, &must, size).await.unwrap();
            assert_eq!(got.len(), size.min(available.len()));
            assert!(got.iter().all(|id| available.contains(id)));
            assert!(must.iter().all(|id| got.contains(id)));
            h.stop().await.unwrap();
        });
    }
}

#[tokio::test]
async fn kubelet_restart_reregisters_and_serves() {
    let h = start("mixed-a100", SHARED_CONFIG).await;
    let names = h.resources();
    within("restart", h.emulator.restart()).await.unwrap();
    within("re-registration", h.emulator.wait_registered(&names, 2)).await;
    // Serving again: the new connection answers Allocate.
    h.emulator
        .allocate_ids("nvidia.com/gpu", &[rep(GPU2, 0)])
        .await
        .unwrap();
    for name in &names {
        assert!(h.plugin_dir().join(socket_name(name)).exists());
    }
    h.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_kubelet_restarts_in_a_row() {
    let h = start("dgx-h100", "").await;
    let names = h.resources();
    for round in 2..=101u64 {
        within("restart", h.emulator.restart()).await.unwrap();
        within("re-registration", h.emulator.wait_registered(&names, round)).await;
    }
    h.emulator
        .allocate_ids(
            "nvidia.com/gpu",
            &["GPU-4a1f3c2e-8b7d-4e6f-9a0b-1c2d3e4f5000".into()],
        )
        .await
        .unwrap();
    h.stop().await.unwrap();
}

#[tokio::test]
async fn waits_for_kubelet_socket_before_registering() {
    use crate::domain::config::{self, Overrides};
    use crate::platform::sim::SimBackend;
    use crate::runtime::supervisor::{self as app, RunSettings};
    use crate::testkit::kubelet::KubeletEmulator;
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;

    let dir = temp_dir();
    let plugin_dir = dir.path().join("dp");
    let config = config::parse("", "t", &Overrides::default()).unwrap();
    let settings = RunSettings::new(config, &plugin_dir, dir.path().join("cdi"));
    let shutdown = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut settings = settings;
    settings.on_ready = Some(tx);
    let app = tokio::spawn(app::run(
        settings,
        Arc::new(SimBackend::open("dgx-h100").unwrap()),
        shutdown.clone(),
    ));
    within("ready", rx).await.unwrap();
    // No kubelet yet: nothing is bound.
    assert!(!plugin_dir.join(socket_name("nvidia.com/gpu")).exists());
    let emulator = KubeletEmulator::start(&plugin_dir).await.unwrap();
    within(
        "registration",
        emulator.wait_registered(&["nvidia.com/gpu".to_string()], 1),
    )
    .await;
    shutdown.cancel();
    within("stop", app).await.unwrap().unwrap();
    assert!(!plugin_dir.join(socket_name("nvidia.com/gpu")).exists());
    emulator.shutdown().await;
}

#[tokio::test]
async fn shutdown_removes_sockets() {
    let h = start("mixed-a100", SHARED_CONFIG).await;
    let dir = h.plugin_dir();
    let names = h.resources();
    h.shutdown.cancel();
    within("daemon stop", h.app).await.unwrap().unwrap();
    for name in &names {
        assert!(!dir.join(socket_name(name)).exists(), "{name}");
    }
    h.emulator.shutdown().await;
}

#[tokio::test]
async fn health_events_channel_reaches_list_and_watch() {
    use crate::domain::allocate::HealthUpdate;
    use crate::domain::config::{self, Overrides};
    use crate::platform::sim::SimBackend;
    use crate::runtime::supervisor::{self as app, RunSettings};
    use crate::testkit::kubelet::KubeletEmulator;
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;

    let dir = temp_dir();
    let plugin_dir = dir.path().join("dp");
    let emulator = KubeletEmulator::start(&plugin_dir).await.unwrap();
    let config = config::parse(SHARED_CONFIG, "t", &Overrides::default()).unwrap();
    let mut settings = RunSettings::new(config, &plugin_dir, dir.path().join("cdi"));
    let (events_tx, events_rx) = tokio::sync::mpsc::channel(8);
    settings.health_events = Some(events_rx);
    let shutdown = CancellationToken::new();
    let app = tokio::spawn(app::run(
        settings,
        Arc::new(SimBackend::open("mixed-a100").unwrap()),
        shutdown.clone(),
    ));
    let names = vec!["nvidia.com/gpu".to_string()];
    within("registration", emulator.wait_registered(&names, 1)).await;
    let mut gpu = emulator.devices("nvidia.com/gpu").unwrap();
    gpu.borrow_and_update();
    events_tx
        .send(HealthUpdate {
            key: GPU2.into(),
            health: Health::Unhealthy,
            reason: "Xid 79".into(),
        })
        .await
        .unwrap();
    within("frame", gpu.changed()).await.unwrap();
    assert_eq!(gpu.borrow().iter().filter(|d| !d.healthy).count(), 4);
    shutdown.cancel();
    within("stop", app).await.unwrap().unwrap();
    emulator.shutdown().await;
}

/// The daemon writes the CDI spec before serving, and every CDI name an Allocate answers
/// with is a device of that spec (checked by parsing the written file).
#[tokio::test]
async fn allocate_names_exist_in_the_written_spec() {
    use crate::domain::config::{self, Overrides};
    use crate::platform::sim::SimBackend;
    use crate::runtime::supervisor::{self as app, RunSettings};
    use crate::testkit::kubelet::KubeletEmulator;
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;

    let dir = temp_dir();
    let plugin_dir = dir.path().join("dp");
    let cdi_dir = dir.path().join("cdi");
    std::fs::create_dir_all(&cdi_dir).unwrap();
    let emulator = KubeletEmulator::start(&plugin_dir).await.unwrap();
    let config = config::parse(SHARED_CONFIG, "t", &Overrides::default()).unwrap();
    let kind = config.cdi_kind.clone();
    let settings = RunSettings::new(config, &plugin_dir, &cdi_dir);
    let shutdown = CancellationToken::new();
    let app = tokio::spawn(app::run(
        settings,
        Arc::new(SimBackend::open("mixed-a100").unwrap()),
        shutdown.clone(),
    ));
    let names: Vec<String> = [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    within("registration", emulator.wait_registered(&names, 1)).await;
    let spec_path = cdi_dir.join(crate::domain::cdi::spec_file_name(
        &kind,
        crate::domain::cdi::Format::Yaml,
    ));
    let spec =
        crate::platform::cdi_host::validate_file(&spec_path).expect("spec written and valid");
    let offered: std::collections::BTreeSet<String> = spec.qualified_names().into_iter().collect();
    let mut checked = 0;
    for resource in &names {
        let n = emulator.devices(resource).unwrap().borrow().len();
        for _ in 0..n {
            let a = emulator.allocate(resource, 1).await.unwrap();
            assert!(!a.response.cdi_devices.is_empty());
            for name in &a.response.cdi_devices {
                assert!(
                    offered.contains(name),
                    "{name} not in {}",
                    spec_path.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 12, "checked {checked}");
    shutdown.cancel();
    within("stop", app).await.unwrap().unwrap();
    emulator.shutdown().await;
}

/// Right after start the plan is committed before its spec is on disk: the servers register
/// at once, but no ListAndWatch frame is sent and no Allocate answered from that snapshot
/// until the write is reported; then both go on by themselves.
#[tokio::test]
async fn nothing_is_advertised_or_handed_out_before_the_first_spec_is_written() {
    use std::future::Future;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use tokio_stream::{Stream, StreamExt};

    use crate::domain::snapshot::Snapshot;
    use crate::domain::transition::{self, Host};
    use crate::proto::deviceplugin as pb;
    use crate::proto::deviceplugin::device_plugin_server::DevicePlugin;
    use crate::state::Store;

    let (inventory, config, _) = fixtures::planned("mixed-a100", SHARED_CONFIG);
    let devices = Arc::new(transition::device_nodes(&inventory, false).unwrap());
    let host = Host {
        nodes: std::collections::BTreeMap::new(),
        hook: None,
        driver: None,
        no_driver: false,
    };
    let empty = Snapshot::default();
    let next = transition::next(
        &empty,
        Arc::new(config),
        Arc::new(inventory),
        devices,
        &host,
    )
    .unwrap();
    let store = Store::new(Snapshot::default());
    let committed = store.commit_before_write(next.state);
    assert!(committed.spec_pending && !committed.spec_written);
    let service = super::service::DevicePluginService::new(
        "nvidia.com/gpu",
        store.clone(),
        crate::runtime::held::HeldCheckpoint::new(None, store.clone()),
        Arc::default(),
        Arc::default(),
        tokio_util::sync::CancellationToken::new(),
    );
    let mut stream = service
        .list_and_watch(tonic::Request::new(pb::Empty {}))
        .await
        .unwrap()
        .into_inner();
    let ids = vec![rep(GPU2, 0)];
    let request = pb::AllocateRequest {
        container_requests: vec![pb::ContainerAllocateRequest {
            devices_ids: ids.clone(),
        }],
    };
    let mut allocate = Box::pin(service.allocate(tonic::Request::new(request)));
    // Polled by hand: both are waiting on the store, not on time.
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    assert!(matches!(
        std::pin::Pin::new(&mut stream).poll_next(&mut cx),
        Poll::Pending
    ));
    assert!(allocate.as_mut().poll(&mut cx).is_pending());
    // A health event meanwhile keeps the snapshot pending.
    store.set_health(GPU3, Health::Unhealthy, "xid 79").unwrap();
    assert!(store.current().spec_pending);
    assert!(matches!(
        std::pin::Pin::new(&mut stream).poll_next(&mut cx),
        Poll::Pending
    ));

    store.spec_now_written(committed.generation);
    let now = store.current();
    assert!(!now.spec_pending && now.spec_written);
    let frame = within("the first frame", stream.next())
        .await
        .expect("a frame once the spec is written")
        .expect("frame")
        .devices()
        .unwrap();
    assert_eq!(frame.len(), 8, "every replica of GPUs 2 and 3");
    assert_eq!(
        frame.iter().filter(|d| d.health == "Unhealthy").count(),
        4,
        "the event that came meanwhile is in the first frame"
    );
    let answer = within("the Allocate", allocate)
        .await
        .expect("the Allocate answered once the spec is written");
    assert_eq!(answer.into_inner().container_responses.len(), 1);
}
