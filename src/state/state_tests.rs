//! The state store seen from outside: one Allocate never mixes two generations, held
//! devices stay in the CDI spec across reloads until released, and shutdown never waits
//! behind a reload. In-process daemons over real sockets (restarts of the built binary are in
//! tests/cli_state.rs).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use crate::domain::config::{self, Overrides};
use crate::platform::sim::SimBackend;
use crate::runtime::plugin::GENERATION_ANNOTATION;
use crate::runtime::supervisor::{ConfigLoader, ReloadSettings, RunSettings, SHUTDOWN_DEADLINE};
use crate::runtime::triggers::{Cause, TriggerSettings};
use crate::testkit::fixtures::file_loader;
use crate::testkit::kubelet::KubeletEmulator;
use crate::testkit::{Node, STEP, spec_device_names as spec_devices, temp_dir, wait_until, within};

const GPU3: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03";
const SPEC: &str = "gpu-slicer.io-gpu.yaml";

/// 4 replicas per GPU, device list as env var.
const ENV4: &str = "version: v1\nflags: {migStrategy: mixed, plugin: {deviceListStrategy: envvar}}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n";
/// 2 replicas per GPU, device list in the CDI annotation only.
const ANN2: &str = "version: v1\nflags: {migStrategy: mixed, plugin: {deviceListStrategy: cdi-annotations}}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n";
/// GPU 3 split four ways with enforced memory: 3 replicas are the `-share-3` CDI device.
const SHARES: &str = "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.shared, devices: [3], replicas: 4, isolation: memory}\n";

type Daemon = Node;

/// A daemon on `mixed-a100` whose config comes from `load`, with its held-device checkpoint
/// in `dir/state`; reloads only when asked.
async fn start(dir: TempDir, load: ConfigLoader) -> Daemon {
    start_with(dir, load, false).await
}

/// As [`start`]; with `ledger`, the emulator serves PodResources and the daemon's ledger
/// reads it every 50 ms.
async fn start_with(dir: TempDir, load: ConfigLoader, ledger: bool) -> Daemon {
    let plugin_dir = dir.path().join("dp");
    let emulator = KubeletEmulator::start(&plugin_dir).await.expect("emulator");
    let pod_resources = dir.path().join("pod-resources").join("kubelet.sock");
    if ledger {
        emulator
            .serve_pod_resources(&pod_resources)
            .expect("pod resources");
    }
    let config = load().expect("initial config");
    let backend = Arc::new(SimBackend::open("mixed-a100").expect("node"));
    let mut settings = RunSettings::new(config, &plugin_dir, dir.path().join("cdi"));
    settings.state_dir = Some(dir.path().join("state"));
    settings.reload = ReloadSettings {
        load: Some(load),
        triggers: TriggerSettings::default(),
    };
    if ledger {
        settings.ledger = Some(crate::runtime::ledger::LedgerSettings {
            socket: pod_resources,
            interval: Duration::from_millis(50),
        });
    }
    Node::launch(dir, emulator, settings, backend)
        .await
        .expect("daemon started")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_allocate_never_mixes_two_generations() {
    let dir = temp_dir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, ENV4).unwrap();
    let d = start(dir, file_loader(&file)).await;
    let stop = CancellationToken::new();
    // Flip the config between ENV4 and ANN2 as fast as reloads go.
    let flipper = {
        let (reload, stop, file) = (d.running.probe().reload.clone(), stop.clone(), file.clone());
        let mut reloads = d.running.reloads.clone();
        tokio::spawn(async move {
            let mut flips = 0u32;
            while !stop.is_cancelled() && flips < 40 {
                flips += 1;
                let text = if flips % 2 == 1 { ANN2 } else { ENV4 };
                std::fs::write(&file, text).unwrap();
                let before = reloads.borrow_and_update().applied;
                reload.send(Cause::Request).await.unwrap();
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    reloads.wait_for(|s| s.applied > before),
                )
                .await;
            }
            flips
        })
    };
    // Replicas ::0 and ::1 of GPU 3 exist under both configs.
    let ids = vec![format!("{GPU3}::0"), format!("{GPU3}::1")];
    let (mut answers, mut env_answers, mut ann_answers) = (0, 0, 0);
    let mut last_generation = 0u64;
    let started = Instant::now();
    while !flipper.is_finished() && started.elapsed() < Duration::from_secs(20) {
        let a = match d.emulator.allocate_ids("nvidia.com/gpu", &ids).await {
            Ok(a) => a,
            // Between a server stop and start there is nothing to call; not an answer.
            Err(_) => continue,
        };
        answers += 1;
        let generation: u64 = a
            .annotations
            .get(GENERATION_ANNOTATION)
            .expect("every answer names its generation")
            .parse()
            .unwrap();
        assert!(generation >= last_generation, "generations go forward");
        last_generation = generation;
        // Config and plan of one generation: the env list comes with ENV4's 4-way split
        // (20 GiB per replica), never with ANN2's 2-way split (40 GiB), and vice versa.
        let per_replica: u64 = a.envs["GPU_SLICER_MEMORY_BYTES"].parse::<u64>().unwrap() / 2;
        let has_env = a.envs.contains_key("NVIDIA_VISIBLE_DEVICES");
        let four_way = per_replica == (80u64 << 30) / 4;
        assert_eq!(
            has_env, four_way,
            "generation {generation} mixed config and plan: env list {has_env}, {per_replica} bytes per replica"
        );
        if has_env {
            env_answers += 1;
        } else {
            ann_answers += 1;
        }
    }
    stop.cancel();
    let flips = flipper.await.unwrap();
    assert!(flips >= 4, "only {flips} reloads");
    assert!(
        env_answers > 0 && ann_answers > 0,
        "both configs answered: {env_answers} env, {ann_answers} annotation of {answers}"
    );
    d.stop().await.expect("clean stop");
}

#[tokio::test]
async fn held_devices_stay_in_the_spec_across_three_reloads_until_released() {
    let dir = temp_dir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, SHARES).unwrap();
    let d = start_with(dir, file_loader(&file), true).await;
    // Three held devices: a 3-of-4 memory share, a MIG slice, a whole GPU.
    let share = d
        .emulator
        .allocate("nvidia.com/gpu.shared", 3)
        .await
        .unwrap();
    let mig = d
        .emulator
        .allocate("nvidia.com/mig-1g.10gb", 1)
        .await
        .unwrap();
    let whole = d.emulator.allocate("nvidia.com/gpu", 1).await.unwrap();
    let held: BTreeSet<String> = [&share, &mig, &whole]
        .iter()
        .flat_map(|a| a.response.cdi_devices.iter())
        .map(|q| q.trim_start_matches("gpu-slicer.io/gpu=").to_string())
        .collect();
    assert!(held.iter().any(|n| n.ends_with("-share-3")), "{held:?}");
    assert_eq!(held.len(), 3, "{held:?}");
    // Three reloads in a row, each dropping what the previous config offered.
    let configs = [
        "version: v1\nflags: {migStrategy: none}\n",
        "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n",
        "version: v1\nflags: {migStrategy: none}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 8}\n",
    ];
    for text in configs {
        let before = d.running.reloads.borrow().clone();
        std::fs::write(&file, text).unwrap();
        d.running.probe().reload.send(Cause::Request).await.unwrap();
        let status = d.next_reload(&before).await;
        assert_eq!(status.last_error, None);
        let have = spec_devices(&d.cdi_spec());
        let lost: Vec<&String> = held.difference(&have).collect();
        assert!(lost.is_empty(), "lost after reload to {text:?}: {lost:?}");
    }
    // The checkpoint names them too.
    let checkpoint = std::fs::read_to_string(d.dir.path().join("state/held.json")).unwrap();
    for name in &held {
        assert!(
            checkpoint.contains(name.as_str()),
            "{name} not in {checkpoint}"
        );
    }
    // The holders go away: the ledger releases them and the spec drops what only they kept.
    for a in [&share, &mig, &whole] {
        d.emulator.release(&a.pod.namespace, &a.pod.name);
    }
    let spec_file = d.dir.path().join("cdi").join(SPEC);
    wait_until(STEP, || async {
        let have = spec_devices(&std::fs::read_to_string(&spec_file).unwrap());
        // Whole GPUs and MIG slices are in every spec (the inventory has them); the
        // share device exists only in the first plan and was kept for its holder.
        (!have.iter().any(|n| n.ends_with("-share-3"))).then_some(())
    })
    .await
    .expect("released devices leave the spec");
    let checkpoint = std::fs::read_to_string(d.dir.path().join("state/held.json")).unwrap();
    assert!(!checkpoint.contains("-share-3"), "{checkpoint}");
    d.stop().await.expect("clean stop");
}

/// A config loader that blocks until the test lets it go (a hung NFS mount, a stuck
/// filesystem): the reload it serves never finishes by itself.
#[tokio::test]
async fn sigterm_during_a_slow_reload_exits_within_the_deadline() {
    let dir = temp_dir();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
    let entered_tx = std::sync::Mutex::new(entered_tx);
    let load: ConfigLoader = {
        let calls = calls.clone();
        Arc::new(move || {
            if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                let _ = entered_tx.lock().unwrap().send(());
                let _ = release_rx.lock().unwrap().recv();
            }
            config::parse(SHARES, "slow.yaml", &Overrides::default())
        })
    };
    let d = start(dir, load).await;
    d.running.probe().reload.send(Cause::Request).await.unwrap();
    // The reload is now stuck inside the loader.
    tokio::task::spawn_blocking(move || entered_rx.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("reload started");
    let t = Instant::now();
    d.shutdown.cancel();
    let stopped = tokio::time::timeout(SHUTDOWN_DEADLINE, d.app).await;
    let took = t.elapsed();
    let _ = release_tx.send(());
    stopped
        .expect("shutdown waited behind the reload")
        .expect("join")
        .expect("clean stop");
    assert!(took < SHUTDOWN_DEADLINE, "{took:?}");
    d.emulator.shutdown().await;
}

/// Open ListAndWatch streams are bounded per resource and give their slot back when they
/// close: a local client cannot make the agent hold streams without end.
#[tokio::test]
async fn list_and_watch_streams_are_bounded_and_freed_on_close() {
    use crate::proto::deviceplugin as pb;
    use crate::runtime::plugin::{MAX_STREAMS_PER_RESOURCE, socket_name};
    let dir = temp_dir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, ENV4).unwrap();
    let d = start(dir, file_loader(&file)).await;
    let socket = d
        .dir
        .path()
        .join("dp")
        .join(socket_name("nvidia.com/mig-1g.10gb"));
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = pb::device_plugin_client::DevicePluginClient::new(channel);
    // The kubelet emulator holds one stream already.
    let mut open = Vec::new();
    loop {
        match client.list_and_watch(pb::Empty {}).await {
            Ok(s) => {
                let mut s = s.into_inner();
                within("first frame", s.message()).await.unwrap().unwrap();
                open.push(s);
                assert!(open.len() <= MAX_STREAMS_PER_RESOURCE, "no bound");
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
                break;
            }
        }
    }
    assert_eq!(
        open.len(),
        MAX_STREAMS_PER_RESOURCE - 1,
        "the emulator's stream counts too"
    );
    // Closing streams frees their slots: new ones are accepted again.
    open.truncate(open.len() - 2);
    let freed = wait_until(STEP, || {
        let mut client = client.clone();
        async move { client.list_and_watch(pb::Empty {}).await.ok() }
    })
    .await
    .expect("slots freed");
    open.push(freed.into_inner());
    drop(open);
    d.stop().await.expect("clean stop");
}
