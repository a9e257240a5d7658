//! The state store seen from outside: one Allocate never mixes two generations, held
//! devices stay in the CDI spec across reloads and restarts until released, and shutdown
//! never waits behind a reload. In-process daemons over real sockets, plus spawned
//! `gpu-slicer run` processes killed and restarted as an operator would.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{short_tempdir, within};
use gpu_slicer::domain::config::{self, Overrides};
use gpu_slicer::platform::sim::SimBackend;
use gpu_slicer::runtime::plugin::GENERATION_ANNOTATION;
use gpu_slicer::runtime::supervisor::{
    ConfigLoader, ReloadSettings, RunSettings, SHUTDOWN_DEADLINE,
};
use gpu_slicer::runtime::triggers::{Cause, TriggerSettings};
use gpu_slicer::testkit::kubelet::KubeletEmulator;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

const GPU3: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03";
const SPEC: &str = "gpu-slicer.io-gpu.yaml";

/// 4 replicas per GPU, device list as env var.
const ENV4: &str = "version: v1\nflags: {migStrategy: mixed, plugin: {deviceListStrategy: envvar}}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n";
/// 2 replicas per GPU, device list in the CDI annotation only.
const ANN2: &str = "version: v1\nflags: {migStrategy: mixed, plugin: {deviceListStrategy: cdi-annotations}}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n";
/// GPU 3 split four ways with enforced memory: 3 replicas are the `-share-3` CDI device.
const SHARES: &str = "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.shared, devices: [3], replicas: 4, isolation: memory}\n";

type Daemon = common::Harness;

fn read_spec(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("cdi").join(SPEC)).expect("spec written")
}

/// Every CDI device name in the spec text.
fn spec_devices(spec: &str) -> BTreeSet<String> {
    spec.lines()
        .filter_map(|l| l.trim().strip_prefix("- name: "))
        .map(|n| n.trim_matches(['\'', '"']).to_string())
        .collect()
}

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
        settings.ledger = Some(gpu_slicer::runtime::ledger::LedgerSettings {
            socket: pod_resources,
            interval: Duration::from_millis(50),
        });
    }
    common::launch(dir, emulator, settings, backend).await
}

/// A loader reading `file` as `run` does.
fn file_loader(file: PathBuf) -> ConfigLoader {
    Arc::new(move || gpu_slicer::platform::config_file::load(Some(&file), &Overrides::default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_allocate_never_mixes_two_generations() {
    let dir = short_tempdir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, ENV4).unwrap();
    let d = start(dir, file_loader(file.clone())).await;
    let stop = CancellationToken::new();
    // Flip the config between ENV4 and ANN2 as fast as reloads go.
    let flipper = {
        let (reload, stop, file) = (d.running.reload.clone(), stop.clone(), file.clone());
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
    let dir = short_tempdir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, SHARES).unwrap();
    let d = start_with(dir, file_loader(file.clone()), true).await;
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
        d.running.reload.send(Cause::Request).await.unwrap();
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
    within("released devices leave the spec", async {
        loop {
            let have = spec_devices(&std::fs::read_to_string(&spec_file).unwrap());
            // Whole GPUs and MIG slices are in every spec (the inventory has them); the
            // share device exists only in the first plan and was kept for its holder.
            if !have.iter().any(|n| n.ends_with("-share-3")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let checkpoint = std::fs::read_to_string(d.dir.path().join("state/held.json")).unwrap();
    assert!(!checkpoint.contains("-share-3"), "{checkpoint}");
    d.stop().await.expect("clean stop");
}

/// A config loader that blocks until the test lets it go (a hung NFS mount, a stuck
/// filesystem): the reload it serves never finishes by itself.
#[tokio::test]
async fn sigterm_during_a_slow_reload_exits_within_the_deadline() {
    let dir = short_tempdir();
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
    d.running.reload.send(Cause::Request).await.unwrap();
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

/// A stand-in MPS control binary that never comes up: it neither writes a pid file nor
/// answers, it just sleeps.
fn never_up_mps(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("never-up-mps");
    std::fs::write(&path, "#!/bin/sh\nexec sleep 600\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn sigterm_while_mps_daemons_never_come_up_exits_promptly() {
    let dir = short_tempdir();
    let emulator = KubeletEmulator::start(dir.path().join("dp")).await.unwrap();
    let config = dir.path().join("config.yaml");
    let mps_root = dir.path().join("mps");
    std::fs::write(&config, "version: v1\nflags: {migStrategy: mixed}\n").unwrap();
    let log = dir.path().join("run.log");
    let mut child = common::run_command(dir.path(), "sim:mixed-a100", &config)
        .arg("--mps-control-bin")
        .arg(never_up_mps(dir.path()))
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let names: Vec<String> = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]
        .map(String::from)
        .to_vec();
    within("registration", emulator.wait_registered(&names, 1)).await;
    // A reload that adds an MPS share whose daemon never comes up.
    std::fs::write(
        &config,
        format!(
            "version: v1\nflags: {{migStrategy: mixed, mpsRoot: {}}}\nsharing:\n  mps:\n    resources:\n    - {{name: nvidia.com/mig-1g.10gb, replicas: 2}}\n",
            mps_root.display()
        ),
    )
    .unwrap();
    let mut devices = emulator.devices("nvidia.com/mig-1g.10gb").unwrap();
    within(
        "MPS replicas advertised (Unhealthy: starting)",
        devices.wait_for(|d| d.len() == 18 && d.iter().all(|d| !d.healthy)),
    )
    .await
    .unwrap();
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = within("exit after SIGTERM", child.wait()).await.unwrap();
    let took = t.elapsed();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status:?}\n{log}");
    assert!(took < SHUTDOWN_DEADLINE, "{took:?}\n{log}");
    emulator.shutdown().await;
}

/// Spawn `run` on the SHARES-style config at `config` in `dir` (sockets, spec, checkpoint).
fn spawn_run(dir: &Path, config: &Path) -> tokio::process::Child {
    common::run_command(dir, "sim:mixed-a100", config)
        .env("CDI_HOOK_PATH", "/opt/gpu-slicer/bin/gpu-slicer")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

async fn restart_keeps_held_devices(signal: nix::sys::signal::Signal) {
    let dir = short_tempdir();
    let emulator = KubeletEmulator::start(dir.path().join("dp")).await.unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, SHARES).unwrap();
    let mut child = spawn_run(dir.path(), &config);
    let names: Vec<String> = [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.10gb",
    ]
    .map(String::from)
    .to_vec();
    within("registration", emulator.wait_registered(&names, 1)).await;
    let mut held = BTreeSet::new();
    for (resource, n) in [
        ("nvidia.com/gpu.shared", 3),
        ("nvidia.com/mig-1g.10gb", 1),
        ("nvidia.com/gpu", 1),
    ] {
        let a = emulator.allocate(resource, n).await.unwrap();
        held.extend(
            a.response
                .cdi_devices
                .iter()
                .map(|q| q.trim_start_matches("gpu-slicer.io/gpu=").to_string()),
        );
    }
    assert_eq!(held.len(), 3, "{held:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()),
        signal,
    )
    .unwrap();
    within("old daemon gone", child.wait()).await.unwrap();
    // The operator changes the config while the agent is down: none of the held devices is
    // in the new plan.
    std::fs::write(&config, "version: v1\nflags: {migStrategy: none}\n").unwrap();
    let mut child = spawn_run(dir.path(), &config);
    within(
        "re-registration",
        emulator.wait_registered(&["nvidia.com/gpu".to_string()], 2),
    )
    .await;
    let have = spec_devices(&read_spec(dir.path()));
    // The reduced config serves only nvidia.com/gpu: the old sockets of the other
    // resources are gone (a SIGKILLed run could not remove them itself).
    let mut sockets: Vec<String> = std::fs::read_dir(dir.path().join("dp"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("gpu-slicer-"))
        .collect();
    sockets.sort();
    assert_eq!(sockets, vec!["gpu-slicer-nvidia.com-gpu.sock".to_string()]);
    let lost: Vec<&String> = held.difference(&have).collect();
    assert!(
        lost.is_empty(),
        "lost after {signal:?} and restart: {lost:?} (spec has {have:?})"
    );
    child.kill().await.unwrap();
    emulator.shutdown().await;
}

#[tokio::test]
async fn sigkill_and_a_changed_config_lose_no_held_device() {
    restart_keeps_held_devices(nix::sys::signal::Signal::SIGKILL).await;
}

#[tokio::test]
async fn sigterm_and_a_changed_config_lose_no_held_device() {
    restart_keeps_held_devices(nix::sys::signal::Signal::SIGTERM).await;
}

/// Open ListAndWatch streams are bounded per resource and give their slot back when they
/// close: a local client cannot make the agent hold streams without end.
#[tokio::test]
async fn list_and_watch_streams_are_bounded_and_freed_on_close() {
    use gpu_slicer::proto::deviceplugin as pb;
    use gpu_slicer::runtime::plugin::{MAX_STREAMS_PER_RESOURCE, socket_name};
    let dir = short_tempdir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, ENV4).unwrap();
    let d = start(dir, file_loader(file)).await;
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
    within("slots freed", async {
        loop {
            if let Ok(s) = client.list_and_watch(pb::Empty {}).await {
                open.push(s.into_inner());
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    drop(open);
    d.stop().await.expect("clean stop");
}

/// A checkpoint that is not one (a truncated write from another tool, a planted file) stops
/// the agent before it writes any spec: exit 1 (the machine's state, not the user's input),
/// naming the file; nothing held is silently forgotten.
#[tokio::test]
async fn a_corrupt_checkpoint_is_refused_naming_the_file() {
    let dir = short_tempdir();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, SHARES).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("held.json"), "{\"resources\": [").unwrap();
    let out = common::run_command(dir.path(), "sim:mixed-a100", &config)
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("held-device checkpoint")
            && err.contains(&*state.join("held.json").to_string_lossy()),
        "{err}"
    );
    assert!(
        !dir.path().join("cdi").join(SPEC).exists(),
        "a spec was written anyway"
    );
}

/// A checkpoint naming devices this node does not have (left by a run on another node
/// file under the same `--state-dir`): the start-up reload writes the spec once, says in
/// one line which held devices it cannot keep, and does not claim a device was handed out.
#[tokio::test]
async fn a_checkpoint_naming_devices_the_node_lacks_is_reported_once_and_not_retried() {
    const GONE: &str = "GPU-00000000-dead-beef-0000-000000000099";
    let dir = short_tempdir();
    let emulator = KubeletEmulator::start(dir.path().join("dp")).await.unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "version: v1\nflags: {migStrategy: mixed}\n").unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(
        state.join("held.json"),
        format!(r#"{{"resources": {{"nvidia.com/gpu": {{"{GONE}": {{"cdi": ["{GONE}"]}}}}}}}}"#),
    )
    .unwrap();
    let log = dir.path().join("run.log");
    let mut child = common::run_command(dir.path(), "sim:mixed-a100", &config)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let names: Vec<String> = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]
        .map(String::from)
        .to_vec();
    within("registration", emulator.wait_registered(&names, 1)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = within("exit after SIGTERM", child.wait()).await.unwrap();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status:?}\n{log}");
    let lines = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(
        lines("a device was handed out during the reload"),
        0,
        "nothing was handed out:\n{log}"
    );
    assert_eq!(lines("CDI spec dir="), 1, "one spec write:\n{log}");
    let reported: Vec<&str> = log.lines().filter(|l| l.contains(GONE)).collect();
    assert_eq!(reported.len(), 1, "one line names the device:\n{log}");
    assert!(
        reported[0].contains("neither on this node nor in the previous CDI spec"),
        "{log}"
    );
    assert!(!read_spec(dir.path()).contains(GONE));
    emulator.shutdown().await;
}
