//! Health end to end: the built binary runs `gpu-slicer run --backend nvml` on a private copy
//! of the fake `libnvidia-ml` (node `hack/nodes/mixed-a100.yaml`, events injected through
//! `FAKE_NVML_EVENT_FILE`), registers with the kubelet emulator over real unix sockets, and
//! every health change is checked in the ListAndWatch frames the emulator receives. Plus the
//! driver-missing paths and the sim backend's event injection.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use common::{SHARED_CONFIG, fake_lib, short_tempdir, wait_until, within};
use gpu_slicer::testkit::write_mig_minors;
use gpu_slicer::testkit::{DeviceInfo, EmulatorError, KubeletEmulator};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;

const GPU0: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e00";
const GPU2: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02";
const GPU3: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03";
/// GPU 1's 1g.10gb slices (GPU instances 9 and 10).
const GPU1_GI9: &str = "MIG-2c3d4e5f-0000-4b00-8000-000000000009";
const GPU1_GI10: &str = "MIG-2c3d4e5f-0000-4b00-8000-00000000000a";

const RESOURCES: [&str; 4] = [
    "nvidia.com/gpu",
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-2g.20gb",
    "nvidia.com/mig-3g.40gb",
];

fn node_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/nodes/mixed-a100.yaml")
}

/// The daemon's stderr, line by line, with a counter to wait on.
#[derive(Clone)]
struct Logs {
    lines: Arc<Mutex<Vec<String>>>,
    count: watch::Receiver<usize>,
}

impl Logs {
    fn capture(stderr: tokio::process::ChildStderr) -> Self {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, count) = watch::channel(0);
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let mut v = sink.lock().unwrap();
                v.push(line);
                tx.send_replace(v.len());
            }
        });
        Self { lines, count }
    }

    fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    fn contains(&self, needle: &str) -> bool {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
    }

    async fn wait_for(&self, needle: &str) {
        let mut count = self.count.clone();
        let found =
            tokio::time::timeout(common::STEP, count.wait_for(|_| self.contains(needle))).await;
        assert!(
            matches!(found, Ok(Ok(_))),
            "no log line containing {needle:?}; log:\n{}",
            self.text()
        );
    }
}

/// A spawned `gpu-slicer run` and the kubelet emulator it registers with.
struct Daemon {
    dir: TempDir,
    emulator: KubeletEmulator,
    child: tokio::process::Child,
    logs: Logs,
}

/// How to start the daemon.
struct Start<'a> {
    backend: &'a str,
    extra: &'a [&'a str],
    env: &'a [(&'a str, &'a str)],
    config: &'a str,
}

impl Start<'_> {
    fn nvml(extra: &'static [&'static str]) -> Start<'static> {
        Start {
            backend: "nvml",
            extra,
            env: &[],
            config: SHARED_CONFIG,
        }
    }
}

impl Daemon {
    async fn spawn(opts: Start<'_>) -> Self {
        let dir = short_tempdir();
        let plugin_dir = dir.path().join("dp");
        let emulator = KubeletEmulator::start(&plugin_dir).await.expect("emulator");
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, opts.config).expect("config");
        let lib = dir.path().join("libnvidia-ml.so.1");
        std::fs::copy(fake_lib(), &lib).expect("copy fake");
        write_mig_minors(&dir.path().join("proc"), &[0, 1, 2, 3]);
        let mut cmd = common::run_command(dir.path(), opts.backend, &config);
        cmd.arg("--proc-root").arg(dir.path().join("proc"));
        if opts.backend == "nvml" && !opts.extra.contains(&"--nvml-lib") {
            cmd.arg("--nvml-lib").arg(&lib);
        }
        if opts.backend == "nvml" {
            // The node file's driver, for the spec's driver edits.
            cmd.arg("--container-driver-root")
                .arg(common::fake_driver_root(dir.path(), "570.124.06"));
        }
        cmd.args(opts.extra)
            .env("FAKE_NVML_NODE", node_file())
            .env("FAKE_NVML_EVENT_FILE", dir.path().join("events.jsonl"))
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .env_remove("DP_DISABLE_HEALTHCHECKS")
            .env_remove("DP_ENABLE_HEALTHCHECKS")
            .env_remove("HEALTH_QUIET_PERIOD")
            .env_remove("HEALTH_EVENTS_FILE");
        for (k, v) in opts.env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn gpu-slicer");
        let logs = Logs::capture(child.stderr.take().expect("stderr"));
        Self {
            dir,
            emulator,
            child,
            logs,
        }
    }

    /// Spawn and wait until every resource of mixed-a100 registered.
    async fn serving(opts: Start<'_>) -> Self {
        let d = Self::spawn(opts).await;
        let names: Vec<String> = RESOURCES.map(String::from).to_vec();
        if tokio::time::timeout(common::STEP, d.emulator.wait_registered(&names, 1))
            .await
            .is_err()
        {
            panic!("not registered; log:\n{}", d.logs.text());
        }
        d
    }

    fn events_file(&self) -> PathBuf {
        self.dir.path().join("events.jsonl")
    }

    /// Hand `lines` to the event source, whole (temp file + rename), after the previous
    /// batch was consumed (the reader removes the file).
    async fn inject(&self, path: &Path, lines: &[&str]) {
        wait_until(common::STEP, || async { (!path.exists()).then_some(()) })
            .await
            .expect("previous events consumed");
        let tmp = self.dir.path().join("events.tmp");
        std::fs::write(&tmp, lines.join("\n") + "\n").expect("write events");
        std::fs::rename(&tmp, path).expect("rename events");
    }

    fn frames(&self, resource: &str) -> watch::Receiver<Vec<DeviceInfo>> {
        self.emulator.devices(resource).expect("resource seen")
    }

    /// Wait for a frame of `resource` satisfying `pred`; returns it.
    async fn frame(
        &self,
        resource: &str,
        what: &str,
        pred: impl FnMut(&Vec<DeviceInfo>) -> bool,
    ) -> Vec<DeviceInfo> {
        let mut rx = self.frames(resource);
        let found = match tokio::time::timeout(common::STEP, rx.wait_for(pred)).await {
            Ok(Ok(frame)) => Some(frame.clone()),
            _ => None,
        };
        found.unwrap_or_else(|| {
            panic!(
                "{resource}: no frame where {what}; last {:?}; log:\n{}",
                *rx.borrow(),
                self.logs.text()
            )
        })
    }

    fn assert_running(&mut self) {
        let status = self.child.try_wait().expect("try_wait");
        assert!(
            status.is_none(),
            "daemon exited: {status:?}; log:\n{}",
            self.logs.text()
        );
    }

    /// SIGTERM and expect a clean exit (the NVML thread joined within the deadline).
    async fn stop(mut self) {
        self.assert_running();
        let pid = Pid::from_raw(i32::try_from(self.child.id().expect("pid")).expect("pid"));
        kill(pid, Signal::SIGTERM).expect("kill");
        let status = within("exit", self.child.wait()).await.expect("wait");
        assert!(status.success(), "{status}; log:\n{}", self.logs.text());
        self.emulator.shutdown().await;
    }
}

fn unhealthy(frame: &[DeviceInfo]) -> Vec<&str> {
    frame
        .iter()
        .filter(|d| !d.healthy)
        .map(|d| d.id.as_str())
        .collect()
}

#[tokio::test]
async fn xid_marks_every_device_of_the_gpu_then_recovers() {
    let d = Daemon::serving(Start::nvml(&["--health-quiet-period", "2s"])).await;
    // GPU 2 is whole (4 replicas), GPU 0 is split into 7 × 1g.10gb.
    d.inject(
        &d.events_file(),
        &[
            r#"{"gpu":2,"kind":"xid","xid":79}"#,
            r#"{"gpu":0,"kind":"xid","xid":48}"#,
        ],
    )
    .await;
    let gpu = d
        .frame("nvidia.com/gpu", "GPU 2's replicas are unhealthy", |f| {
            !unhealthy(f).is_empty()
        })
        .await;
    let down = unhealthy(&gpu);
    assert_eq!(down.len(), 4, "{down:?}");
    assert!(down.iter().all(|id| id.starts_with(GPU2)), "{down:?}");
    let mig = d
        .frame(
            "nvidia.com/mig-1g.10gb",
            "GPU 0's slices are unhealthy",
            |f| unhealthy(f).len() >= 7,
        )
        .await;
    assert_eq!(unhealthy(&mig).len(), 7, "GPU 1's 1g slices stay healthy");
    assert!(!unhealthy(&mig).contains(&GPU1_GI9));
    d.logs.wait_for("reason=\"xid-79\"").await;
    // Quiet period over, re-probe succeeds: everything is back.
    d.frame("nvidia.com/gpu", "all healthy again", |f| {
        unhealthy(f).is_empty()
    })
    .await;
    d.frame("nvidia.com/mig-1g.10gb", "all healthy again", |f| {
        unhealthy(f).is_empty()
    })
    .await;
    d.logs.wait_for("reason=\"recovered\"").await;
    assert!(d.logs.contains(GPU0));
    d.stop().await;
}

#[tokio::test]
async fn mig_attributed_xid_marks_only_that_slice() {
    let d = Daemon::serving(Start::nvml(&[])).await;
    d.inject(
        &d.events_file(),
        &[r#"{"gpu":1,"kind":"xid","xid":94,"gpuInstanceId":9,"computeInstanceId":0}"#],
    )
    .await;
    let frame = d
        .frame("nvidia.com/mig-1g.10gb", "one slice is unhealthy", |f| {
            !unhealthy(f).is_empty()
        })
        .await;
    // A GPU-wide mark would have taken GPU 1's other 1g slice down in the same frame.
    assert_eq!(unhealthy(&frame), vec![GPU1_GI9]);
    assert!(frame.iter().any(|d| d.id == GPU1_GI10 && d.healthy));
    for r in ["nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"] {
        assert!(unhealthy(&d.frames(r).borrow()).is_empty(), "{r}");
    }
    d.stop().await;
}

#[tokio::test]
async fn ignored_xid_changes_nothing() {
    let d = Daemon::serving(Start::nvml(&[])).await;
    // XID 13 (an application error) first, then a critical XID on another GPU of the same
    // resource as a marker: frames are ordered, so GPU 2 would be down by the marker's frame.
    d.inject(
        &d.events_file(),
        &[
            r#"{"gpu":2,"kind":"xid","xid":13}"#,
            r#"{"gpu":3,"kind":"xid","xid":79}"#,
        ],
    )
    .await;
    let frame = d
        .frame("nvidia.com/gpu", "the marker GPU is unhealthy", |f| {
            !unhealthy(f).is_empty()
        })
        .await;
    let down = unhealthy(&frame);
    assert_eq!(down.len(), 4, "{down:?}");
    assert!(down.iter().all(|id| id.starts_with(GPU3)), "{down:?}");
    d.stop().await;
}

#[tokio::test]
async fn gpu_lost_is_unhealthy_refused_and_recovers_once_it_answers() {
    let mut d = Daemon::serving(Start::nvml(&["--health-quiet-period", "500ms"])).await;
    d.inject(&d.events_file(), &[r#"{"gpu":3,"kind":"gpuLost"}"#])
        .await;
    let frame = d
        .frame("nvidia.com/gpu", "GPU 3 is unhealthy", |f| {
            !unhealthy(f).is_empty()
        })
        .await;
    assert!(unhealthy(&frame).iter().all(|id| id.starts_with(GPU3)));
    // Allocate of an unhealthy device is refused over the socket.
    let err = d
        .emulator
        .allocate_ids("nvidia.com/gpu", &[format!("{GPU3}::0")])
        .await
        .expect_err("unhealthy device allocated");
    let EmulatorError::Rpc { message, .. } = err else {
        panic!("expected an RPC error, got {err}");
    };
    assert!(
        message.contains("unhealthy") && message.contains("gpu-lost"),
        "{message}"
    );
    // Re-probes fail while the GPU is lost; the daemon keeps serving.
    d.logs.wait_for("re-probe failed").await;
    d.assert_running();
    assert_eq!(unhealthy(&d.frames("nvidia.com/gpu").borrow()).len(), 4);
    d.inject(&d.events_file(), &[r#"{"gpu":3,"kind":"recover"}"#])
        .await;
    d.frame("nvidia.com/gpu", "GPU 3 recovered", |f| {
        unhealthy(f).is_empty()
    })
    .await;
    d.emulator
        .allocate_ids("nvidia.com/gpu", &[format!("{GPU3}::0")])
        .await
        .expect("healthy again: allocatable");
    d.stop().await;
}

#[tokio::test]
async fn disabled_healthchecks_start_no_watcher() {
    let d = Daemon::serving(Start {
        env: &[("DP_DISABLE_HEALTHCHECKS", "all")],
        ..Start::nvml(&[])
    })
    .await;
    d.logs.wait_for("health checks disabled").await;
    assert!(!d.logs.contains("NVML event watcher started"));
    d.stop().await;
}

#[tokio::test]
async fn driver_missing_is_a_clear_error() {
    let mut d = Daemon::spawn(Start::nvml(&[
        "--nvml-lib",
        "/nonexistent/libnvidia-ml.so.1",
    ]))
    .await;
    let status = within("exit", d.child.wait()).await.expect("wait");
    assert_eq!(status.code(), Some(1), "log:\n{}", d.logs.text());
    d.logs
        .wait_for("gpu-slicer: error: NVML: cannot initialise /nonexistent")
        .await;
    d.emulator.shutdown().await;
}

#[tokio::test]
async fn fail_on_init_error_false_runs_without_devices() {
    let d = Daemon::spawn(Start::nvml(&[
        "--nvml-lib",
        "/nonexistent/libnvidia-ml.so.1",
        "--fail-on-init-error",
        "false",
    ]))
    .await;
    d.logs.wait_for("running with no devices").await;
    d.logs.wait_for("no GPUs; no health watcher started").await;
    assert!(d.emulator.registrations().borrow().is_empty());
    d.stop().await;
}

#[tokio::test]
async fn sim_injects_node_file_timeline_and_events_file() {
    let dir = short_tempdir();
    let node = dir.path().join("node.yaml");
    let text = std::fs::read_to_string(node_file()).expect("node file");
    std::fs::write(
        &node,
        text + "events:\n  - {gpu: 3, kind: xid, xid: 48, afterMs: 0}\n",
    )
    .expect("write node");
    let events = dir.path().join("sim-events.jsonl");
    let backend = format!("sim:{}", node.display());
    let events_arg = events.display().to_string();
    let d = Daemon::serving(Start {
        backend: &backend,
        extra: &["--health-events-file", &events_arg],
        env: &[],
        config: SHARED_CONFIG,
    })
    .await;
    let frame = d
        .frame(
            "nvidia.com/gpu",
            "the timeline's GPU 3 event applied",
            |f| unhealthy(f).len() == 4,
        )
        .await;
    assert!(unhealthy(&frame).iter().all(|id| id.starts_with(GPU3)));
    d.inject(&events, &["not json", r#"{"gpu":2,"kind":"xid","xid":79}"#])
        .await;
    d.frame("nvidia.com/gpu", "the file's GPU 2 event applied", |f| {
        unhealthy(f).len() == 8
    })
    .await;
    d.logs.wait_for("health event line skipped").await;
    assert!(
        d.logs.contains("line=1"),
        "bad line named:\n{}",
        d.logs.text()
    );
    d.stop().await;
}

#[tokio::test]
async fn sim_lost_gpu_recovers_only_after_a_recover_line() {
    let dir = short_tempdir();
    let events = dir.path().join("sim-events.jsonl");
    let events_arg = events.display().to_string();
    let mut d = Daemon::serving(Start {
        backend: "sim:mixed-a100",
        extra: &[
            "--health-events-file",
            &events_arg,
            "--health-quiet-period",
            "300ms",
        ],
        env: &[],
        config: SHARED_CONFIG,
    })
    .await;
    d.inject(&events, &[r#"{"gpu":2,"kind":"gpuLost"}"#]).await;
    d.frame("nvidia.com/gpu", "GPU 2 is lost", |f| {
        unhealthy(f).len() == 4
    })
    .await;
    d.logs.wait_for("re-probe failed").await;
    d.assert_running();
    assert_eq!(unhealthy(&d.frames("nvidia.com/gpu").borrow()).len(), 4);
    d.inject(&events, &[r#"{"gpu":2,"kind":"recover"}"#]).await;
    d.frame("nvidia.com/gpu", "GPU 2 recovered", |f| {
        unhealthy(f).is_empty()
    })
    .await;
    d.stop().await;
}

#[tokio::test]
async fn events_file_with_nvml_is_refused() {
    let mut d = Daemon::spawn(Start::nvml(&["--health-events-file", "/tmp/x.jsonl"])).await;
    let status = within("exit", d.child.wait()).await.expect("wait");
    assert_eq!(status.code(), Some(2));
    d.logs
        .wait_for("only `--backend sim:*` injects events")
        .await;
    d.emulator.shutdown().await;
}

#[tokio::test]
async fn a_re_scanned_mig_layout_is_what_events_map_to() {
    let dir = short_tempdir();
    let node = dir.path().join("node.yaml");
    let text = std::fs::read_to_string(node_file()).expect("node file");
    std::fs::write(&node, &text).expect("write node");
    let events = dir.path().join("sim-events.jsonl");
    let backend = format!("sim:{}", node.display());
    let events_arg = events.display().to_string();
    let d = Daemon::serving(Start {
        backend: &backend,
        extra: &["--health-events-file", &events_arg],
        env: &[],
        config: SHARED_CONFIG,
    })
    .await;
    // GPU 1's GPU instance 9 is re-created: same instance id, new MIG UUID.
    const NEW: &str = "MIG-2c3d4e5f-0000-4b00-8000-0000000000f9";
    std::fs::write(&node, text.replace(GPU1_GI9, NEW)).expect("edit node");
    let pid = Pid::from_raw(i32::try_from(d.child.id().expect("pid")).expect("pid"));
    kill(pid, Signal::SIGHUP).expect("SIGHUP");
    d.frame(
        "nvidia.com/mig-1g.10gb",
        "the re-created slice advertised",
        |f| f.iter().any(|x| x.id == NEW),
    )
    .await;
    d.inject(
        &events,
        &[r#"{"gpu":1,"kind":"xid","xid":79,"gpuInstanceId":9,"computeInstanceId":0}"#],
    )
    .await;
    let frame = d
        .frame(
            "nvidia.com/mig-1g.10gb",
            "the event marks the new slice",
            |f| !unhealthy(f).is_empty(),
        )
        .await;
    assert_eq!(unhealthy(&frame), vec![NEW.to_string()]);
    assert!(frame.iter().any(|x| x.id == GPU1_GI10 && x.healthy));
    d.stop().await;
}
