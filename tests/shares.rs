//! Shares that bind, through the built `gpu-slicer run` against the kubelet emulator and
//! `hack/fake-mps-control`: a 3-replica request on a GPU split 4 ways lands on one GPU and
//! is answered with the `-share-3` CDI device (memory hook of 3/4, 75 % of the threads);
//! one MPS daemon per MPS-shared GPU and MIG device with the right environment; a killed
//! daemon turns its devices Unhealthy in ListAndWatch until the supervisor restarts it;
//! a config reload replaces the daemon set with the new defaults; SIGTERM stops every daemon.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::{STEP, short_tempdir, wait_until, within};
use gpu_slicer::testkit::read_cdi_spec;
use gpu_slicer::testkit::{DeviceInfo, KubeletEmulator};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const GPU3: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03";
const MIG_3G: &str = "MIG-2c3d4e5f-0000-4b00-8000-000000000002";
const MIG_2G: &str = "MIG-2c3d4e5f-0000-4b00-8000-000000000003";
const KIND: &str = "gpu-slicer.io/gpu";

fn config(mps_root: &Path) -> String {
    format!(
        "version: v1
flags: {{migStrategy: mixed, mpsRoot: {}}}
sharing:
  timeSlicing:
    resources:
    - {{name: nvidia.com/gpu, rename: nvidia.com/gpu.shared, devices: [3], replicas: 4, isolation: memory+mps}}
  mps:
    resources:
    - {{name: nvidia.com/mig-3g.40gb, replicas: 2}}
    - {{name: nvidia.com/mig-2g.20gb, replicas: 2}}
",
        mps_root.display()
    )
}

fn daemon_pid(mps_root: &Path, uuid: &str) -> Option<i32> {
    let text =
        std::fs::read_to_string(mps_root.join(uuid).join("pipe/nvidia-cuda-mps-control.pid"))
            .ok()?;
    text.trim().parse().ok()
}

fn alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
}

async fn wait_devices(
    emulator: &KubeletEmulator,
    resource: &str,
    what: &str,
    f: impl FnMut(&Vec<DeviceInfo>) -> bool,
) {
    let mut rx = emulator.devices(resource).expect("resource registered");
    within(what, rx.wait_for(f)).await.expect("frames");
}

#[tokio::test]
async fn run_binds_shares_and_supervises_mps_daemons() {
    let dir = short_tempdir();
    let plugin_dir = dir.path().join("dp");
    let cdi_dir = dir.path().join("cdi");
    let mps_root = dir.path().join("mps");
    let emulator = KubeletEmulator::start(&plugin_dir).await.unwrap();
    let config_path = dir.path().join("config.yaml");
    std::fs::write(&config_path, config(&mps_root)).unwrap();
    let fake = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("hack/fake-mps-control");
    let log = std::fs::File::create(dir.path().join("run.log")).unwrap();
    let mut child = common::run_command(dir.path(), "sim:mixed-a100", &config_path)
        .arg("--mps-control-bin")
        .arg(&fake)
        // Long enough that the Unhealthy frame is seen before the restart clears it.
        .arg("--mps-restart-backoff-ms=1000")
        .env("CDI_HOOK_PATH", "/opt/gpu-slicer/bin/gpu-slicer")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let names: Vec<String> = [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
    ]
    .map(String::from)
    .to_vec();
    within("registration", emulator.wait_registered(&names, 1)).await;
    // Resources are served at once, their MPS replicas Unhealthy until the daemons are up.
    within("MPS replicas healthy", async {
        for name in &names {
            let mut rx = emulator.devices(name).expect("devices");
            rx.wait_for(|d| !d.is_empty() && d.iter().all(|d| d.healthy))
                .await
                .expect("device list");
        }
    })
    .await;

    // One daemon per MPS-shared device, each seeing only its device, limits sent.
    for (uuid, threads) in [(GPU3, "25"), (MIG_3G, "50"), (MIG_2G, "50")] {
        let env = std::fs::read_to_string(mps_root.join(uuid).join("log/daemon.env")).unwrap();
        assert!(
            env.contains(&format!("CUDA_VISIBLE_DEVICES={uuid}")),
            "{env}"
        );
        assert!(
            env.contains(&format!(
                "CUDA_MPS_PIPE_DIRECTORY={}",
                mps_root.join(uuid).join("pipe").display()
            )),
            "{env}"
        );
        let commands =
            std::fs::read_to_string(mps_root.join(uuid).join("log/commands.log")).unwrap();
        assert!(
            commands.contains(&format!("set_default_active_thread_percentage {threads}")),
            "{uuid}: {commands}"
        );
        // Its /dev/shm is its own directory (the fake daemon leaves a marker there).
        let marker =
            std::fs::read_to_string(mps_root.join(uuid).join("shm/fake-mps-daemon")).unwrap();
        assert!(marker.ends_with(&format!(" {uuid}\n")), "{uuid}: {marker}");
    }
    assert_eq!(
        std::fs::read_dir(&mps_root).unwrap().count(),
        3,
        "exactly one daemon directory per MPS-shared device"
    );
    wait_devices(&emulator, "nvidia.com/gpu.shared", "healthy", |d| {
        d.len() == 4 && d.iter().all(|d| d.healthy)
    })
    .await;

    // 3 of 4 replicas, the kubelet way: one GPU, answered with the 3-share device.
    let a = emulator.allocate("nvidia.com/gpu.shared", 3).await.unwrap();
    assert!(a.device_ids.iter().all(|id| id.starts_with(GPU3)));
    let share = format!("{KIND}={GPU3}-share-3");
    assert_eq!(a.response.cdi_devices, vec![share.clone()]);
    // The spec written, as a runtime loads it.
    let spec = read_cdi_spec(&cdi_dir.join("gpu-slicer.io-gpu.yaml"));
    let dev = spec["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| format!("{KIND}={}", d["name"].as_str().unwrap_or_default()) == share)
        .expect("share device in the spec");
    let hook = &dev["containerEdits"]["hooks"][0];
    assert_eq!(hook["path"], "/opt/gpu-slicer/bin/gpu-slicer");
    let three_quarters = (3 * ((80u64 << 30) / 4)).to_string();
    let args: Vec<&str> = hook["args"]
        .as_array()
        .expect("hook args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(args.contains(&three_quarters.as_str()), "{args:?}");
    assert!(
        dev["containerEdits"]["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e == "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=75")
    );

    // Kill GPU 3's daemon: its 4 replicas go Unhealthy, then recover after the restart.
    let pid = daemon_pid(&mps_root, GPU3).expect("daemon pid");
    let mig_pid = daemon_pid(&mps_root, MIG_3G).expect("MIG daemon pid");
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    wait_devices(&emulator, "nvidia.com/gpu.shared", "unhealthy", |d| {
        d.len() == 4 && d.iter().all(|d| !d.healthy)
    })
    .await;
    // Other daemons' devices are untouched.
    let mig = emulator.devices("nvidia.com/mig-3g.40gb").unwrap();
    assert!(mig.borrow().iter().all(|d| d.healthy));
    wait_devices(&emulator, "nvidia.com/gpu.shared", "recovered", |d| {
        d.len() == 4 && d.iter().all(|d| d.healthy)
    })
    .await;
    let restarted = daemon_pid(&mps_root, GPU3).expect("restarted daemon pid");
    assert_ne!(restarted, pid);
    assert!(alive(restarted));

    // Live reload: GPU 3 split 2 ways instead of 4. Only GPU 3's daemon is replaced (the
    // new one starts with 50 % defaults) and the resource shrinks; the MIG devices' daemons,
    // whose settings did not change, keep running and their replicas stay Healthy.
    std::fs::write(
        &config_path,
        config(&mps_root).replace("devices: [3], replicas: 4", "devices: [3], replicas: 2"),
    )
    .unwrap();
    wait_devices(
        &emulator,
        "nvidia.com/gpu.shared",
        "2 replicas after reload",
        |d| d.len() == 2 && d.iter().all(|d| d.healthy),
    )
    .await;
    let commands =
        || std::fs::read_to_string(mps_root.join(GPU3).join("log/commands.log")).unwrap();
    let gpu3_new = wait_until(STEP, || async {
        let replaced = daemon_pid(&mps_root, GPU3).filter(|p| *p != restarted && alive(*p));
        match (
            commands().contains("set_default_active_thread_percentage 50"),
            replaced,
        ) {
            (true, Some(g)) => Some(g),
            _ => None,
        }
    })
    .await
    .unwrap_or_else(|| panic!("daemons not replaced after reload: {}", commands()));
    assert!(
        !alive(restarted),
        "GPU 3's old daemon still running after reload"
    );
    assert_eq!(
        daemon_pid(&mps_root, MIG_3G),
        Some(mig_pid),
        "the unchanged MIG daemon was restarted"
    );
    assert!(alive(mig_pid));
    let mig_new = mig_pid;
    let mig = emulator.devices("nvidia.com/mig-3g.40gb").unwrap();
    assert!(
        mig.borrow().iter().all(|d| d.healthy),
        "MIG replicas stayed Healthy"
    );

    // SIGTERM: clean exit, every daemon asked to quit and gone.
    let run_pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(run_pid, Signal::SIGTERM).unwrap();
    let status = within("exit", child.wait()).await.unwrap();
    let log = std::fs::read_to_string(dir.path().join("run.log")).unwrap_or_default();
    assert!(status.success(), "{status}: {log}");
    for p in [gpu3_new, mig_new] {
        assert!(!alive(p), "daemon {p} still running");
    }
    let commands = std::fs::read_to_string(mps_root.join(GPU3).join("log/commands.log")).unwrap();
    assert!(commands.lines().any(|l| l == "quit"), "{commands}");
    emulator.shutdown().await;
}
