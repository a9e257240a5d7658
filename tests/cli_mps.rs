//! `gpu-slicer run` without `CAP_SYS_ADMIN` and MPS shares configured: no daemon starts on
//! a shared `/dev/shm`, each says why. (The MPS supervisor in-process: `runtime::mps` unit
//! tests.)

mod common;

use std::path::Path;
use std::time::Duration;

use common::wait_until;

const WAIT: Duration = Duration::from_secs(20);

/// The devices `mixed-a100` shares through MPS under the config below: GPU 2 and GPU 3
/// (whole, 4 replicas each) and GPU 1's 3g.40gb slice, each with its daemon's directory
/// `<mpsRoot>/<uuid>/` (`pipe/`, `shm/`).
const DAEMONS: [&str; 3] = [
    "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02",
    "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03",
    "MIG-2c3d4e5f-0000-4b00-8000-000000000002",
];

fn fake() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/fake-mps-control")
}

/// Whether anything is mounted at `dir` (`/proc/self/mountinfo`'s mount point field).
fn mounted(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let dir = dir.to_str().expect("utf-8");
    info.lines().any(|l| l.split(' ').nth(4) == Some(dir))
}

/// Without `CAP_SYS_ADMIN` (as root: dropped from the bounding set with util-linux
/// `setpriv`; unprivileged: not held anyway) `gpu-slicer run` starts no daemon on a shared
/// `/dev/shm`: each stays down with an error naming the daemon, its shm directory and the
/// capability, and nothing is mounted.
#[tokio::test]
async fn without_cap_sys_admin_no_daemon_starts_and_the_log_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "flags: {{migStrategy: mixed, mpsRoot: {}}}
sharing:
  mps:
    resources:
    - {{name: nvidia.com/mig-3g.40gb, replicas: 2}}
    - {{name: nvidia.com/gpu, replicas: 4}}
",
            dir.path().join("mps").display()
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_gpu-slicer");
    let mut cmd = if nix::unistd::geteuid().is_root() {
        let mut c = tokio::process::Command::new("setpriv");
        c.args([
            "--bounding-set=-sys_admin",
            "--inh-caps=-sys_admin",
            "--",
            bin,
        ]);
        c
    } else {
        tokio::process::Command::new(bin)
    };
    let log = dir.path().join("run.log");
    cmd.arg("run")
        .args(["--backend", "sim:mixed-a100", "--config"])
        .arg(&cfg)
        .arg("--device-plugin-dir")
        .arg(dir.path().join("dp"))
        .arg("--cdi-dir")
        .arg(dir.path().join("cdi"))
        .arg("--mps-control-bin")
        .arg(fake())
        .env("STATE_DIR", dir.path().join("state"))
        .env("HTTP_LISTEN", "127.0.0.1:0")
        .env("POD_RESOURCES_SOCKET", "")
        .env("LABELS_FILE", dir.path().join("labels"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true);
    std::fs::create_dir_all(dir.path().join("dp")).unwrap();
    let mut child = cmd.spawn().expect("setpriv (util-linux) and gpu-slicer");
    let said_why = |text: &str, uuid: &str| {
        text.lines().any(|l| {
            l.contains("MPS control daemon failed to start")
                && l.contains(uuid)
                && l.contains(&root.join(uuid).join("shm").display().to_string())
                && l.contains("CAP_SYS_ADMIN")
        })
    };
    let said = wait_until(WAIT, || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(status) = child.try_wait().unwrap() {
            panic!("gpu-slicer exited ({status}):\n{text}");
        }
        let all = DAEMONS.iter().all(|uuid| said_why(&text, uuid));
        async move { all.then_some(()) }
    })
    .await;
    assert!(
        said.is_some(),
        "no CAP_SYS_ADMIN error for every daemon:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    for uuid in DAEMONS {
        assert!(
            !mounted(&root.join(uuid).join("shm")),
            "{uuid}: shm mounted"
        );
        assert!(
            !root
                .join(uuid)
                .join("pipe/nvidia-cuda-mps-control.pid")
                .exists()
        );
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}
