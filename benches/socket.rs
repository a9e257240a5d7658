//! End-to-end figures of the built `gpu-slicer run` as the kubelet sees them, on the NVML
//! backend with the fake `libnvidia-ml` (crates/fake-nvml) describing a DGX H100 (8 × H100),
//! time-sliced into 64 replicas per GPU (512 devices of `nvidia.com/gpu`), usage sampling off:
//!
//! - process start → first `Register` on this bench's own `kubelet.sock` (a fresh daemon and
//!   fresh directories each time), with the CDI spec on a tmpfs as `/var/run/cdi` is on a
//!   node, and again with it on disk, where the spec and its directory are fsync'ed first;
//! - over the real plugin socket, one client connection (tonic, as the kubelet's gRPC-Go
//!   client does), calls interleaved so each sees the same noise: a no-op RPC
//!   (`GetDevicePluginOptions`), Allocate of 1 and of 4 replicas of one GPU (devices already
//!   held: the steady state), GetPreferredAllocation (4 of 512), and Allocate of a device not
//!   yet held (the held-device checkpoint is written before the answer);
//!   "own cost" = p50(Allocate) − p50(no-op), and the daemon's CPU per call (its threads'
//!   `schedstat` run time over a batch, which machine noise hardly moves);
//! - XID 79 written to the fake's event file → the first ListAndWatch frame with that GPU's
//!   replicas Unhealthy (recovery after a 20 ms quiet period before the next event);
//! - the in-process cost of the same Allocate answer (no transport), for comparison.
//!
//! The client runs on one current-thread runtime: no second multi-threaded runtime competes
//! with the daemon for the cores. `BENCH_QUICK=1` runs fewer iterations.
//!
//! `BENCH_CALLGRIND=<dir>` instead runs the daemon under `valgrind --tool=callgrind`: counted
//! from exec to the first `Register` (dump `start`), then with instrumentation off except
//! around a batch of Allocates of 1 and of 4 replicas, a batch of no-ops and 8 XID rounds
//! (event, Unhealthy frame, recovery frame; one dump each),
//! and leaves the profiles in `<dir>` (`callgrind_annotate` shows where the instructions go).
//!
//! `BENCH_BASELINE=<another gpu-slicer build>` measures that build too, alternating with this
//! one (start by start, run by run), and prints both with their ratio in one table;
//! `BENCH_RUNS=<n>` sets the runs per build (default 3, 1 with `BENCH_QUICK`).
//!
//! `BENCH_NVIDIA=<nvidia-device-plugin binary>` (NVIDIA's k8s-device-plugin, built apart
//! from this project) adds it as a further column of the same interleaved run, on the same
//! fake library (found as `libnvidia-ml.so.1` through `LD_LIBRARY_PATH`), node and config
//! (`--config-file`: the same `sharing.timeSlicing` file), with `--kubelet-socket` on this
//! bench's `kubelet.sock`. Its plugin socket's directory is fixed at
//! `/var/lib/kubelet/device-plugins`, so the child makes itself a private mount namespace
//! before `exec` (a tmpfs on `/var/lib`, the daemon's own plugin directory bound there; root
//! only), with no wrapper process in its start. It writes no CDI spec (no on-disk start
//! row), and it never marks a device healthy again, so its XID rounds are one per GPU on each
//! daemon (8 per run, no recovery wait), each waiting for the first frame with any of that
//! GPU's replicas Unhealthy (it marks one replica per event, where gpu-slicer marks all 64).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_slicer::proto::deviceplugin as pb;
use pb::device_plugin_client::DevicePluginClient;
use pb::registration_server::{Registration, RegistrationServer};
use tokio::sync::Notify;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

const RESOURCE: &str = "nvidia.com/gpu";
const REPLICAS: usize = 64;
const GPUS: usize = 8;
const CONFIG: &str =
    "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 64}\n";
const NODE: &str = include_str!("../hack/nodes/dgx-h100.yaml");
/// The node file's `driverVersion`.
const DRIVER: &str = "570.124.06";

use gpu_slicer::testkit::percentile as pct;

fn report(name: &str, v: &[Duration], target: &str) {
    println!(
        "{name:<52} n={:<5} p50={:>9.1?} p90={:>9.1?} p99={:>9.1?} max={:>9.1?}  (target {target})",
        v.len(),
        pct(v, 0.5),
        pct(v, 0.9),
        pct(v, 0.99),
        pct(v, 1.0),
    );
    // Collected by hack/bench.sh into its figure table.
    println!(
        "FIGURE|{name}|p50 {:.1?} / p99 {:.1?}",
        pct(v, 0.5),
        pct(v, 0.99)
    );
}

/// `VmRSS` (KiB) and `Threads` of `pid`, from `/proc/<pid>/status`.
fn rss_threads(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("Threads:"))
}

fn figure(name: &str, value: String) {
    println!("{name:<52} {value}");
    println!("FIGURE|{name}|{value}");
}

/// The fake library, the node file and the config, shared by every daemon of the bench.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    /// Where the daemons' CDI specs go: a tmpfs (`/dev/shm`), as `/var/run/cdi` is on a
    /// node; `None` where there is none (then the temp dir, on disk).
    tmpfs: Option<tempfile::TempDir>,
    lib: PathBuf,
    node: PathBuf,
    config: PathBuf,
    driver: PathBuf,
    /// The daemon: this build's, or `BENCH_GPU_SLICER` (another build, to compare).
    exe: String,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("gss")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let root = dir.path().to_path_buf();
        let lib = root.join("libnvidia-ml.so.1");
        std::fs::copy(fake_lib(), &lib).expect("copy fake");
        let node = root.join("node.yaml");
        std::fs::write(&node, NODE).expect("node");
        let config = root.join("config.yaml");
        std::fs::write(&config, CONFIG).expect("config");
        // The driver's user-space libraries (empty files: only their names matter here).
        let driver = root.join("driver-root");
        let libs = driver.join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&libs).expect("driver root");
        for lib in ["libcuda.so", "libnvidia-ml.so"] {
            std::fs::write(libs.join(format!("{lib}.{DRIVER}")), "").expect("driver library");
        }
        let tmpfs = tempfile::Builder::new()
            .prefix("gss")
            .tempdir_in("/dev/shm")
            .ok();
        Self {
            _dir: dir,
            root,
            tmpfs,
            lib,
            node,
            config,
            driver,
            exe: std::env::var("BENCH_GPU_SLICER")
                .unwrap_or_else(|_| env!("CARGO_BIN_EXE_gpu-slicer").to_string()),
        }
    }

    /// `gpu-slicer run` with everything it writes under `dir`, as deployed apart from the
    /// paths: HTTP on (ephemeral port), labels on, checkpoint on, no ledger, no usage.
    /// The CDI directory of daemon `name`: on the tmpfs unless `on_disk`.
    fn cdi_dir(&self, name: &str, on_disk: bool) -> PathBuf {
        match &self.tmpfs {
            Some(t) if !on_disk => t.path().join(name),
            _ => self.root.join(name).join("cdi"),
        }
    }

    fn command(
        &self,
        program: &[&str],
        exe: &str,
        dir: &Path,
        cdi: &Path,
    ) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(program.first().copied().unwrap_or(exe));
        if !program.is_empty() {
            cmd.args(&program[1..]).arg(exe);
        }
        cmd.args(["run", "--backend", "nvml", "--nvml-lib"])
            .arg(&self.lib)
            .arg("--config")
            .arg(&self.config)
            .arg("--device-plugin-dir")
            .arg(dir.join("dp"))
            .arg("--cdi-dir")
            .arg(cdi)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--labels-file")
            .arg(dir.join("labels"))
            .arg("--driver-root")
            .arg(&self.driver)
            .args([
                "--http-listen=127.0.0.1:0",
                "--pod-resources-socket=",
                "--usage-interval=0",
                "--health-quiet-period=20ms",
            ])
            .env("FAKE_NVML_NODE", &self.node)
            .env("FAKE_NVML_EVENT_FILE", dir.join("events"))
            .env("FAKE_NVML_WAIT_LOG", wait_log(dir))
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        cmd
    }
}

/// Where the fake logs its wait returns: a folder of its own, since the fake watches the
/// event file's folder and a log line written there would wake its next wait at once, a
/// spurious round of the fake's own work on the NVML thread that lands in the agent's part.
fn wait_log(dir: &Path) -> PathBuf {
    let logs = dir.join("fake-log");
    std::fs::create_dir_all(&logs).expect("fake log dir");
    logs.join("wait.log")
}

/// `libnvidia_ml.so` built beside this bench.
fn fake_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("exe dir");
    [deps, deps.parent().expect("target dir")]
        .iter()
        .map(|d| d.join("libnvidia_ml.so"))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("libnvidia_ml.so not found near {}", exe.display()))
}

/// One column of the table: a daemon binary and which agent it is.
#[derive(Clone)]
struct Build {
    exe: String,
    /// NVIDIA's k8s-device-plugin (`BENCH_NVIDIA`) rather than a gpu-slicer build.
    nvidia: bool,
}

impl Fixture {
    /// NVIDIA's plugin on the same fake library, node and config, its plugin directory
    /// (`/var/lib/kubelet/device-plugins`, fixed in its code) bound to `dir/dp` in a private
    /// mount namespace made in the child before `exec`: no wrapper process (`unshare`, `sh`,
    /// `mount` would add ~14 ms of exec to its start here).
    fn nvidia_command(&self, exe: &str, dir: &Path) -> tokio::process::Command {
        use std::os::unix::ffi::OsStrExt;
        let dp = dir.join("dp");
        let bound =
            std::ffi::CString::new(dp.as_os_str().as_bytes()).expect("no NUL in a temp path");
        let mut cmd = tokio::process::Command::new(exe);
        // Relative, from its working directory: gRPC-Go sends the dialled path as the
        // `:authority`, and this bench's (hyper) server refuses one with a `/` in it.
        cmd.args(["--kubelet-socket", "kubelet.sock", "--config-file"])
            .arg(&self.config)
            .current_dir(&dp)
            .env("LD_LIBRARY_PATH", &self.root)
            .env("FAKE_NVML_NODE", &self.node)
            .env("FAKE_NVML_EVENT_FILE", dir.join("events"))
            .env("FAKE_NVML_WAIT_LOG", wait_log(dir))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        // SAFETY: `private_plugin_dir` runs between fork and exec and only makes system
        // calls on C strings made before the fork (no allocation, no locks).
        unsafe {
            cmd.pre_exec(move || private_plugin_dir(&bound));
        }
        cmd
    }
}

/// In the child before `exec`: a mount namespace of its own (private, so nothing propagates
/// back), a tmpfs on `/var/lib` and `dp` bound to `/var/lib/kubelet/device-plugins`. Root only.
fn private_plugin_dir(dp: &std::ffi::CStr) -> std::io::Result<()> {
    use nix::mount::{MsFlags, mount};
    use nix::sys::stat::Mode;
    let none = None::<&std::ffi::CStr>;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
    mount(
        none,
        c"/",
        none,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        none,
    )?;
    mount(
        Some(c"tmpfs"),
        c"/var/lib",
        Some(c"tmpfs"),
        MsFlags::empty(),
        none,
    )?;
    nix::unistd::mkdir(c"/var/lib/kubelet", Mode::from_bits_truncate(0o755))?;
    nix::unistd::mkdir(
        c"/var/lib/kubelet/device-plugins",
        Mode::from_bits_truncate(0o755),
    )?;
    mount(
        Some(dp),
        c"/var/lib/kubelet/device-plugins",
        none,
        MsFlags::MS_BIND,
        none,
    )?;
    Ok(())
}

/// This bench's kubelet: records when each Register arrives, and nothing else.
#[derive(Clone, Default)]
struct Kubelet {
    registered: Arc<Mutex<Vec<(Instant, String)>>>,
    notify: Arc<Notify>,
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(
        &self,
        request: tonic::Request<pb::RegisterRequest>,
    ) -> Result<tonic::Response<pb::Empty>, tonic::Status> {
        let at = Instant::now();
        let endpoint = request.into_inner().endpoint;
        self.registered.lock().expect("lock").push((at, endpoint));
        self.notify.notify_waiters();
        Ok(tonic::Response::new(pb::Empty {}))
    }
}

impl Kubelet {
    fn serve(&self, dir: &Path, token: &CancellationToken) {
        std::fs::create_dir_all(dir).expect("plugin dir");
        let listener =
            tokio::net::UnixListener::bind(dir.join("kubelet.sock")).expect("bind kubelet.sock");
        let server = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(self.clone()))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                token.clone().cancelled_owned(),
            );
        tokio::spawn(server);
    }

    /// The first registration: when it arrived and the endpoint it named.
    async fn first(&self) -> (Instant, String) {
        loop {
            let notified = self.notify.notified();
            if let Some(r) = self.registered.lock().expect("lock").first() {
                return r.clone();
            }
            tokio::time::timeout(Duration::from_secs(120), notified)
                .await
                .expect("registered in time");
        }
    }
}

/// A running daemon with this bench as its kubelet.
struct Daemon {
    dir: PathBuf,
    child: tokio::process::Child,
    kubelet: Kubelet,
    token: CancellationToken,
    started: Instant,
}

impl Daemon {
    async fn start(fx: &Fixture, name: &str, program: &[&str]) -> Self {
        Self::start_with(fx, name, program, &fx.exe, false).await
    }

    /// `on_disk`: the CDI spec goes to the temp dir's filesystem instead of the tmpfs.
    async fn start_with(
        fx: &Fixture,
        name: &str,
        program: &[&str],
        exe: &str,
        on_disk: bool,
    ) -> Self {
        let dir = fx.root.join(name);
        let cmd = fx.command(program, exe, &dir, &fx.cdi_dir(name, on_disk));
        Self::spawn(dir, cmd)
    }

    /// A daemon of `build` (NVIDIA's plugin writes no spec: `on_disk` is gpu-slicer's).
    async fn start_build(fx: &Fixture, name: &str, build: &Build, on_disk: bool) -> Self {
        if build.nvidia {
            let dir = fx.root.join(name);
            let cmd = fx.nvidia_command(&build.exe, &dir);
            Self::spawn(dir, cmd)
        } else {
            Self::start_with(fx, name, &[], &build.exe, on_disk).await
        }
    }

    /// Serves the kubelet socket under `dir/dp`, then spawns `cmd`.
    fn spawn(dir: PathBuf, mut cmd: tokio::process::Command) -> Self {
        let kubelet = Kubelet::default();
        let token = CancellationToken::new();
        kubelet.serve(&dir.join("dp"), &token);
        let started = Instant::now();
        let child = cmd.spawn().expect("spawn the daemon");
        Self {
            dir,
            child,
            kubelet,
            token,
            started,
        }
    }

    async fn client(&self) -> DevicePluginClient<Channel> {
        let (_, endpoint) = self.kubelet.first().await;
        let path = self.dir.join("dp").join(endpoint);
        let channel = Endpoint::from_shared(format!("unix://{}", path.display()))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect to the plugin");
        DevicePluginClient::new(channel)
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("pid")
    }

    async fn stop(mut self) {
        self.token.cancel();
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// CPU time of each thread of `pid` so far (`schedstat`: nanoseconds on a CPU), by thread id.
fn cpu_ns(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Default::default();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let s = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            let ns = s.split_whitespace().next()?.parse::<u64>().ok()?;
            Some((t.file_name().to_string_lossy().into_owned(), ns))
        })
        .collect()
}

/// CPU time spent since `before` by the threads alive now (a blocking thread that exited
/// meanwhile takes its share with it: slightly under, never negative).
fn cpu_since(pid: u32, before: &std::collections::BTreeMap<String, u64>) -> u64 {
    cpu_ns(pid)
        .iter()
        .map(|(tid, ns)| ns.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .sum()
}

fn allocate_request(ids: &[String]) -> pb::AllocateRequest {
    pb::AllocateRequest {
        container_requests: vec![pb::ContainerAllocateRequest {
            devices_ids: ids.to_vec(),
        }],
    }
}

async fn allocate(client: &mut DevicePluginClient<Channel>, ids: &[String]) -> Duration {
    let t = Instant::now();
    let r = client
        .allocate(allocate_request(ids))
        .await
        .expect("allocate");
    let d = t.elapsed();
    assert_eq!(r.get_ref().container_responses.len(), 1);
    d
}

async fn noop(client: &mut DevicePluginClient<Channel>) -> Duration {
    let t = Instant::now();
    client
        .get_device_plugin_options(pb::Empty {})
        .await
        .expect("options");
    t.elapsed()
}

async fn preferred(client: &mut DevicePluginClient<Channel>, devices: &[String]) -> Duration {
    let request = pb::PreferredAllocationRequest {
        container_requests: vec![pb::ContainerPreferredAllocationRequest {
            available_device_i_ds: devices.to_vec(),
            must_include_device_i_ds: Vec::new(),
            allocation_size: 4,
        }],
    };
    let t = Instant::now();
    let r = client
        .get_preferred_allocation(request)
        .await
        .expect("preferred");
    let d = t.elapsed();
    assert_eq!(r.get_ref().container_responses[0].device_i_ds.len(), 4);
    d
}

/// Four replicas of GPU `i % 8` (IDs sort by GPU: 64 per GPU), a different four each round.
fn four(devices: &[String], i: usize) -> &[String] {
    let base = (i % GPUS) * REPLICAS + ((i / GPUS) % (REPLICAS / 4)) * 4;
    &devices[base..base + 4]
}

/// When a frame arrived: monotonic, and wall-clock µs (to compare with the fake's wait log).
#[derive(Clone, Copy)]
struct Arrival {
    at: Instant,
    wall_us: u128,
}

fn wall_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros()
}

/// The latest ListAndWatch frame's arrival and unhealthy IDs.
type Frames = tokio::sync::watch::Receiver<(Arrival, BTreeSet<String>)>;

/// Follows the ListAndWatch stream; the latest frame's arrival and unhealthy IDs.
fn follow(mut stream: tonic::Streaming<pb::ListAndWatchResponse>) -> Frames {
    let now = Arrival {
        at: Instant::now(),
        wall_us: wall_us(),
    };
    let (tx, rx) = tokio::sync::watch::channel((now, BTreeSet::new()));
    tokio::spawn(async move {
        while let Ok(Some(frame)) = stream.message().await {
            let at = Arrival {
                at: Instant::now(),
                wall_us: wall_us(),
            };
            let down = frame
                .devices()
                .expect("a valid frame")
                .into_iter()
                .filter(|d| d.health != gpu_slicer::proto::HEALTHY)
                .map(|d| d.id)
                .collect();
            if tx.send((at, down)).is_err() {
                return;
            }
        }
    });
    rx
}

struct Rpcs {
    noop: Vec<Duration>,
    alloc1: Vec<Duration>,
    alloc4: Vec<Duration>,
    pref: Vec<Duration>,
    grow: Vec<Duration>,
    cpu_alloc1: f64,
    cpu_alloc4: f64,
    cpu_noop: f64,
}

async fn rpcs(
    client: &mut DevicePluginClient<Channel>,
    devices: &[String],
    pid: u32,
    calls: usize,
) -> Rpcs {
    // The first Allocate of each device grows the held set: checkpoint written first.
    let mut grow = Vec::with_capacity(devices.len());
    for id in devices {
        grow.push(allocate(client, std::slice::from_ref(id)).await);
    }
    let (mut n, mut a1, mut a4, mut p) = (vec![], vec![], vec![], vec![]);
    for i in 0..calls {
        n.push(noop(client).await);
        a1.push(allocate(client, std::slice::from_ref(&devices[i % devices.len()])).await);
        a4.push(allocate(client, four(devices, i)).await);
        p.push(preferred(client, devices).await);
    }
    // Daemon CPU per call, batch by batch.
    let batch = calls.max(1000);
    let per_call = |before| cpu_since(pid, &before) as f64 / batch as f64 / 1000.0;
    let before = cpu_ns(pid);
    for _ in 0..batch {
        noop(client).await;
    }
    let cpu_noop = per_call(before);
    let before = cpu_ns(pid);
    for i in 0..batch {
        allocate(client, std::slice::from_ref(&devices[i % devices.len()])).await;
    }
    let cpu_alloc1 = per_call(before);
    let before = cpu_ns(pid);
    for i in 0..batch {
        allocate(client, four(devices, i)).await;
    }
    let cpu_alloc4 = per_call(before);
    Rpcs {
        noop: n,
        alloc1: a1,
        alloc4: a4,
        pref: p,
        grow,
        cpu_alloc1,
        cpu_alloc4,
        cpu_noop,
    }
}

/// XID 79 on GPU `round % 8` written to the fake's event file (temp file + rename) → the
/// first frame with all its replicas Unhealthy; then wait for the recovery frame. Returns the
/// whole latency and the agent's own part: from the fake's `nvmlEventSetWait` handing out the
/// event (its `FAKE_NVML_WAIT_LOG`, wall clock) to the frame's arrival.
///
/// `nvidia`: NVIDIA's plugin marks one replica per event and never recovers, so a round
/// waits for the first frame with any of the GPU's replicas Unhealthy and no recovery (the
/// caller keeps to one round per GPU). Also returns how many of the GPU's replicas that
/// frame showed Unhealthy. `held`: a stream already followed past its first frame, else one
/// is opened here.
async fn xid_latency(
    daemon: &Daemon,
    held: Option<Frames>,
    devices: &[String],
    rounds: usize,
    nvidia: bool,
) -> (Vec<Duration>, Vec<Duration>, Vec<usize>) {
    let mut frames = match held {
        Some(frames) => frames,
        None => {
            let mut client = daemon.client().await;
            let stream = client
                .list_and_watch(pb::Empty {})
                .await
                .expect("list-and-watch")
                .into_inner();
            let mut frames = follow(stream);
            frames.changed().await.expect("first frame");
            frames
        }
    };
    let events = daemon.dir.join("events");
    let tmp = daemon.dir.join("events.tmp");
    let wait_log = wait_log(&daemon.dir);
    let mut out = Vec::with_capacity(rounds);
    let mut own = Vec::with_capacity(rounds);
    let mut marked = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let gpu = round % GPUS;
        let ids: BTreeSet<String> = devices[gpu * REPLICAS..(gpu + 1) * REPLICAS]
            .iter()
            .cloned()
            .collect();
        std::fs::write(
            &tmp,
            format!("{{\"gpu\":{gpu},\"kind\":\"xid\",\"xid\":79}}\n"),
        )
        .expect("event");
        let t = Instant::now();
        std::fs::rename(&tmp, &events).expect("rename event");
        let wait = frames.wait_for(|(_, down)| {
            if nvidia {
                !ids.is_disjoint(down)
            } else {
                ids.is_subset(down)
            }
        });
        let (at, count) = {
            let frame = tokio::time::timeout(Duration::from_secs(30), wait)
                .await
                .expect("unhealthy frame in time")
                .expect("stream open");
            (frame.0, ids.intersection(&frame.1).count())
        };
        out.push(at.at - t);
        marked.push(count);
        let log = std::fs::read_to_string(&wait_log).expect("the fake's wait log");
        let returned: u128 = log
            .lines()
            .nth(round)
            .and_then(|l| l.trim().parse().ok())
            .expect("one wait-log line per event");
        own.push(Duration::from_micros(
            u64::try_from(at.wall_us.saturating_sub(returned)).unwrap_or(u64::MAX),
        ));
        if nvidia {
            continue;
        }
        let recovered = frames.wait_for(|(_, down)| down.is_empty());
        tokio::time::timeout(Duration::from_secs(30), recovered)
            .await
            .expect("recovery frame in time")
            .expect("stream open");
    }
    (out, own, marked)
}

/// Driver discovery on this host's root (`/`, its whole `ld.so.cache`), as start-up runs it
/// when the driver lives there; no NVIDIA driver is installed here, so every entry is looked
/// at and none is taken. Returns the timings and the number of cache entries.
fn host_driver_discovery(runs: usize) -> Vec<Duration> {
    let mut discover = gpu_slicer::bench::driver_discovery(Path::new("/"), DRIVER);
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            let found = discover();
            let d = t.elapsed();
            std::hint::black_box(found);
            d
        })
        .collect()
}

/// The in-process Allocate answer of the same node (no transport): what the handler does
/// (one snapshot, the domain answer with every check, record what it holds).
fn in_process(devices: &[String], calls: usize) -> (Vec<Duration>, Vec<Duration>) {
    let served = gpu_slicer::bench::Served::new("dgx-h100", CONFIG, RESOURCE);
    // The steady state: every device held already (the handler's first hand-out of a
    // device also grows and copies the held set, which `grow` measures over the socket).
    for id in devices {
        served.allocate(&[vec![id.clone()]]);
    }
    let run = |ids: &dyn Fn(usize) -> Vec<String>| -> Vec<Duration> {
        (0..calls)
            .map(|i| {
                let request = vec![ids(i)];
                let t = Instant::now();
                let answer = served.allocate(&request);
                let d = t.elapsed();
                std::hint::black_box(answer);
                d
            })
            .collect()
    };
    let one = run(&|i| vec![devices[i % devices.len()].clone()]);
    let four = run(&|i| four(devices, i).to_vec());
    (one, four)
}

async fn device_ids(client: &mut DevicePluginClient<Channel>) -> Vec<String> {
    first_frame(client).await.0
}

/// The device IDs of a new ListAndWatch stream's first frame, sorted, and the stream.
async fn first_frame(
    client: &mut DevicePluginClient<Channel>,
) -> (Vec<String>, tonic::Streaming<pb::ListAndWatchResponse>) {
    let mut stream = client
        .list_and_watch(pb::Empty {})
        .await
        .expect("list-and-watch")
        .into_inner();
    let frame = stream.message().await.expect("frame").expect("a frame");
    let mut ids: Vec<String> = frame
        .devices()
        .expect("a valid frame")
        .into_iter()
        .map(|d| d.id)
        .collect();
    ids.sort();
    assert_eq!(ids.len(), GPUS * REPLICAS);
    (ids, stream)
}

/// Instructions per Allocate and per no-op in the daemon, under callgrind.
async fn callgrind(fx: &Fixture, out: &Path, calls: usize) {
    std::fs::create_dir_all(out).expect("callgrind dir");
    let file = out.join("callgrind.out.%p");
    let file_arg = format!("--callgrind-out-file={}", file.display());
    let daemon = Daemon::start(
        fx,
        "callgrind",
        &[
            "valgrind",
            "--tool=callgrind",
            // Counted from exec: the first dump is the start path up to the first Register.
            "--instr-atstart=yes",
            &file_arg,
        ],
    )
    .await;
    let pid = daemon.pid().to_string();
    let control = |args: &[&str]| {
        let ok = std::process::Command::new("callgrind_control")
            .args(args)
            .arg(&pid)
            .stdout(Stdio::null())
            .status()
            .expect("callgrind_control")
            .success();
        assert!(ok, "callgrind_control {args:?}");
    };
    daemon.kubelet.first().await;
    control(&["--dump", "start"]);
    control(&["-i", "off"]);
    let mut client = daemon.client().await;
    let devices = device_ids(&mut client).await;
    for id in &devices {
        allocate(&mut client, std::slice::from_ref(id)).await;
    }
    for (name, four_replicas) in [("allocate1", false), ("allocate4", true), ("noop", false)] {
        control(&["-z"]);
        control(&["-i", "on"]);
        for i in 0..calls {
            match (name, four_replicas) {
                ("noop", _) => {
                    noop(&mut client).await;
                }
                (_, true) => {
                    allocate(&mut client, four(&devices, i)).await;
                }
                _ => {
                    allocate(
                        &mut client,
                        std::slice::from_ref(&devices[i % devices.len()]),
                    )
                    .await;
                }
            }
        }
        control(&["-i", "off"]);
        control(&["--dump", name]);
    }
    // XID rounds: the agent's path from the event wait's return to the frame (and back).
    control(&["-z"]);
    control(&["-i", "on"]);
    xid_latency(&daemon, None, &devices, GPUS, false).await;
    control(&["-i", "off"]);
    control(&["--dump", "xid"]);
    daemon.stop().await;
    println!(
        "callgrind profiles in {} (one file per dump; `callgrind_annotate --inclusive=yes <file>`)",
        out.display()
    );
}

/// Everything one daemon measured over its socket, from start-up to its last XID.
struct RunFigures {
    rpcs: Rpcs,
    xid: Vec<Duration>,
    xid_own: Vec<Duration>,
    /// The XID's GPU's replicas shown Unhealthy in the frame each round waited for.
    xid_marked: Vec<usize>,
    rss: u64,
    threads: u64,
    /// The device IDs it listed, sorted.
    devices: Vec<String>,
}

/// One daemon of `build`: idle RSS once registered, the RPC rounds, then the XID rounds
/// (NVIDIA's plugin: one per GPU, as it never recovers).
async fn measure_run(
    fx: &Fixture,
    build: &Build,
    name: &str,
    calls: usize,
    rounds: usize,
) -> RunFigures {
    let daemon = Daemon::start_build(fx, name, build, false).await;
    let mut client = daemon.client().await;
    // NVIDIA's plugin hands each health change to one of its ListAndWatch streams, a closed
    // one included (it notices only when its send fails): it keeps the one stream it lists
    // the devices on, as the kubelet does.
    let (devices, held) = if build.nvidia {
        let (devices, stream) = first_frame(&mut client).await;
        (devices, Some(follow(stream)))
    } else {
        (device_ids(&mut client).await, None)
    };
    // Idle: registered, one ListAndWatch open, blocking threads past their 1 s keep-alive.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (rss, threads) = rss_threads(daemon.pid());
    let rpcs = rpcs(&mut client, &devices, daemon.pid(), calls).await;
    let rounds = if build.nvidia {
        rounds.min(GPUS)
    } else {
        rounds
    };
    let (xid, xid_own, xid_marked) =
        xid_latency(&daemon, held, &devices, rounds, build.nvidia).await;
    daemon.stop().await;
    RunFigures {
        rpcs,
        xid,
        xid_own,
        xid_marked,
        rss,
        threads,
        devices,
    }
}

/// Start-up of one build: wall time and the daemon's CPU time (all its threads) from spawn
/// to the first Register.
#[derive(Default)]
struct Starts {
    wall: Vec<Duration>,
    cpu: Vec<Duration>,
    /// Wall time with the CDI spec written to the temp dir's filesystem (a disk here): the
    /// spec's and its directory's fsync before registration.
    wall_disk: Vec<Duration>,
}

/// `starts` fresh daemons of each build, alternating, so both see the same machine noise
/// (NVIDIA's plugin writes no CDI spec: no on-disk starts).
async fn measure_starts(fx: &Fixture, builds: &[Build], starts: usize) -> Vec<Starts> {
    let mut out: Vec<Starts> = builds.iter().map(|_| Starts::default()).collect();
    for k in 0..starts {
        for (which, build) in builds.iter().enumerate() {
            for on_disk in [false, true] {
                if on_disk && build.nvidia {
                    continue;
                }
                let name = format!("start{k}-{which}-{on_disk}");
                let daemon = Daemon::start_build(fx, &name, build, on_disk).await;
                let (at, _) = daemon.kubelet.first().await;
                let cpu = cpu_since(daemon.pid(), &Default::default());
                if on_disk {
                    out[which].wall_disk.push(at - daemon.started);
                } else {
                    out[which].wall.push(at - daemon.started);
                    out[which].cpu.push(Duration::from_nanos(cpu));
                }
                daemon.stop().await;
            }
        }
    }
    out
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The median of per-run values.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One row of the table for every build: (name, unit, value per build, target).
struct Row {
    name: &'static str,
    unit: &'static str,
    values: Vec<String>,
    /// The figure per build that the ratios divide: this build's by each other build's.
    basis: Vec<f64>,
    target: &'static str,
}

/// A figure with one decimal, or `-` where a build has none (NVIDIA's on-disk start).
fn one_decimal(x: f64) -> String {
    if x.is_nan() {
        "-".to_string()
    } else {
        format!("{x:.1}")
    }
}

fn row(name: &'static str, unit: &'static str, target: &'static str, v: &[f64]) -> Row {
    Row {
        name,
        unit,
        values: v.iter().copied().map(one_decimal).collect(),
        basis: v.to_vec(),
        target,
    }
}

fn pair_row(name: &'static str, unit: &'static str, target: &'static str, v: &[(f64, f64)]) -> Row {
    Row {
        name,
        unit,
        values: v.iter().map(|(a, b)| format!("{a:.0} / {b:.0}")).collect(),
        basis: v.iter().map(|(a, _)| *a).collect(),
        target,
    }
}

/// The table: medians over the runs of each build (and the ratio this / baseline).
/// `nvidia`: NVIDIA's plugin is a column; adds the rows only that comparison needs.
fn table(runs: &[Vec<RunFigures>], starts: &[Starts], nvidia: bool) -> Vec<Row> {
    let per = |f: &dyn Fn(&RunFigures) -> f64| -> Vec<f64> {
        runs.iter()
            .map(|r| median(r.iter().map(f).collect()))
            .collect()
    };
    let own = |r: &RunFigures, v: &[Duration]| us(pct(v, 0.5)) - us(pct(&r.rpcs.noop, 0.5));
    let p50_p99: Vec<(f64, f64)> = per(&|r| us(pct(&r.rpcs.alloc1, 0.5)))
        .into_iter()
        .zip(per(&|r| us(pct(&r.rpcs.alloc1, 0.99))))
        .collect();
    let four_p50_p99: Vec<(f64, f64)> = per(&|r| us(pct(&r.rpcs.alloc4, 0.5)))
        .into_iter()
        .zip(per(&|r| us(pct(&r.rpcs.alloc4, 0.99))))
        .collect();
    let disk_ms = |s: &Starts| {
        if s.wall_disk.is_empty() {
            f64::NAN
        } else {
            us(pct(&s.wall_disk, 0.5)) / 1e3
        }
    };
    let mut rows = vec![
        pair_row(
            "Allocate, 1 replica of 512: p50 / p99 over the socket",
            "µs",
            "p99 <= 1836 (NVIDIA)",
            &p50_p99,
        ),
        row(
            "Allocate own cost (p50 - no-op p50), 1 replica",
            "µs",
            "<= 20",
            &per(&|r| own(r, &r.rpcs.alloc1)),
        ),
        row(
            "Allocate own cost (p50 - no-op p50), 4 replicas",
            "µs",
            "<= 20",
            &per(&|r| own(r, &r.rpcs.alloc4)),
        ),
        row(
            "daemon CPU per Allocate minus per no-op, 1 replica",
            "µs",
            "-",
            &per(&|r| r.rpcs.cpu_alloc1 - r.rpcs.cpu_noop),
        ),
        row(
            "daemon CPU per Allocate minus per no-op, 4 replicas",
            "µs",
            "-",
            &per(&|r| r.rpcs.cpu_alloc4 - r.rpcs.cpu_noop),
        ),
        row(
            "daemon CPU per no-op RPC",
            "µs",
            "-",
            &per(&|r| r.rpcs.cpu_noop),
        ),
        row(
            "no-op RPC p50 over the socket",
            "µs",
            "-",
            &per(&|r| us(pct(&r.rpcs.noop, 0.5))),
        ),
        row(
            "GetPreferredAllocation (4 of 512) p50",
            "µs",
            "-",
            &per(&|r| us(pct(&r.rpcs.pref, 0.5))),
        ),
        row(
            "process start -> first Register p50 (CDI dir on tmpfs)",
            "ms",
            "<= 10",
            &starts
                .iter()
                .map(|s| us(pct(&s.wall, 0.5)) / 1e3)
                .collect::<Vec<_>>(),
        ),
        row(
            "  same, CDI dir on disk (spec and dir fsync'ed first)",
            "ms",
            "-",
            &starts.iter().map(disk_ms).collect::<Vec<_>>(),
        ),
        row(
            "daemon CPU from spawn to first Register p50",
            "ms",
            "-",
            &starts
                .iter()
                .map(|s| us(pct(&s.cpu, 0.5)) / 1e3)
                .collect::<Vec<_>>(),
        ),
        row(
            "XID 79 -> first Unhealthy frame p50",
            "ms",
            "-",
            &per(&|r| us(pct(&r.xid, 0.5)) / 1e3),
        ),
        row(
            "  agent's own part (NVML wait returns -> frame) p50",
            "ms",
            "<= 1",
            &per(&|r| us(pct(&r.xid_own, 0.5)) / 1e3),
        ),
        row(
            "idle RSS (registered, one stream open)",
            "MiB",
            "-",
            &per(&|r| r.rss as f64 / 1024.0),
        ),
    ];
    if nvidia {
        rows.insert(
            1,
            pair_row(
                "Allocate, 4 replicas of one GPU: p50 / p99",
                "µs",
                "-",
                &four_p50_p99,
            ),
        );
        rows.push(row(
            "replicas of the XID's GPU Unhealthy in that frame",
            "of 64",
            "-",
            &per(&|r| {
                let mut v = r.xid_marked.clone();
                v.sort_unstable();
                v.get(v.len() / 2).map_or(f64::NAN, |&n| n as f64)
            }),
        ));
    }
    rows
}

/// The table, with one ratio column (this build / that one) per other build: headed
/// `ratio` when there is at most one, else `/` and the build's short name.
fn print_table(rows: &[Row], builds: &[(&str, &str)]) {
    let others = builds.len().saturating_sub(1).max(1);
    let heads: String = (0..others)
        .map(|j| match builds.get(j + 1) {
            Some((_, short)) if builds.len() > 2 => format!("  {:>7}", format!("/{short}")),
            _ => "  ratio".to_string(),
        })
        .collect();
    println!();
    println!(
        "{:<56} {:>5} {}{heads}  target",
        "figure (medians of the runs)",
        "unit",
        builds
            .iter()
            .map(|(b, _)| format!("{b:>16}"))
            .collect::<String>()
    );
    let width = if builds.len() > 2 { 7 } else { 5 };
    for r in rows {
        let ratios: Vec<String> = (0..others)
            .map(|j| match r.basis.get(j + 1) {
                Some(other) if (r.basis[0] / other).is_finite() => {
                    format!("{:.2}", r.basis[0] / other)
                }
                _ => "-".to_string(),
            })
            .collect();
        println!(
            "{:<56} {:>5} {}{}  {}",
            r.name,
            r.unit,
            r.values
                .iter()
                .map(|v| format!("{v:>16}"))
                .collect::<String>(),
            ratios
                .iter()
                .map(|x| format!("  {x:>width$}"))
                .collect::<String>(),
            r.target
        );
        // Collected by hack/bench.sh into its figure table.
        let mut value = format!("{} {}", r.values[0], r.unit);
        for ((other, (name, _)), ratio) in r.values.iter().zip(builds).skip(1).zip(&ratios) {
            value = format!("{value} ({name} {other}, ratio {ratio})");
        }
        println!("FIGURE|{}|{value}", r.name);
    }
}

fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let (starts, calls, rounds) = if quick { (5, 500, 16) } else { (20, 3000, 64) };
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 3 });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let fx = Fixture::new();
    rt.block_on(async {
        if let Some(dir) = std::env::var_os("BENCH_CALLGRIND") {
            callgrind(&fx, Path::new(&dir), if quick { 200 } else { 1000 }).await;
            return;
        }
        println!(
            "gpu-slicer socket bench: run --backend nvml (fake, dgx-h100), {GPUS} GPUs x {REPLICAS} replicas = {} devices of {RESOURCE}; client: one current-thread runtime, one connection",
            GPUS * REPLICAS
        );
        // With BENCH_BASELINE=<another build>, every measurement alternates the two builds
        // (starts one by one, RPC and XID rounds run by run), so both see the same noise.
        // BENCH_NVIDIA=<NVIDIA's plugin> joins the same alternation as a further column.
        let baseline = std::env::var("BENCH_BASELINE").ok();
        let nvidia = std::env::var("BENCH_NVIDIA").ok();
        let gpu_slicer = |exe: &str| Build { exe: exe.to_string(), nvidia: false };
        let builds: Vec<Build> = std::iter::once(gpu_slicer(&fx.exe))
            .chain(baseline.as_deref().map(gpu_slicer))
            .chain(nvidia.iter().map(|exe| Build { exe: exe.clone(), nvidia: true }))
            .collect();
        let start = measure_starts(&fx, &builds, starts).await;
        let mut runs_of: Vec<Vec<RunFigures>> = builds.iter().map(|_| Vec::new()).collect();
        for k in 0..runs {
            // Alternate which build goes first, so neither always runs on a warmer machine.
            let order: Vec<usize> = if k % 2 == 0 { (0..builds.len()).collect() } else { (0..builds.len()).rev().collect() };
            for which in order {
                let figures = measure_run(&fx, &builds[which], &format!("rpc{k}-{which}"), calls, rounds).await;
                runs_of[which].push(figures);
            }
        }
        let (in1, in4) = in_process(&runs_of[0][0].devices, calls);
        let host = host_driver_discovery(if quick { 5 } else { 20 });
        println!();
        for line in [
            format!("socket: `run --backend nvml` on the fake libnvidia-ml (dgx-h100, {GPUS} x {REPLICAS} replicas), usage off, labels/HTTP/checkpoint on; a Rust client on one current-thread runtime"),
            format!("start: spawn -> first Register on the bench's kubelet.sock, {starts} fresh daemons and directories per build, builds alternating (p50 = median); CPU = the daemon's threads' schedstat run time when Register arrives; the CDI dir on a tmpfs (/dev/shm), as /var/run/cdi is on a node, and once more each on the temp dir's filesystem ({})", if fx.tmpfs.is_some() { "disk" } else { "no /dev/shm here: both on disk" }),
            format!("RPCs: {runs} run(s) per build (a fresh daemon each, builds alternating run by run), one connection, no-op / Allocate 1 / Allocate 4 / GetPreferredAllocation interleaved, {calls} rounds; own cost = p50(Allocate) - p50(no-op); CPU = daemon threads' schedstat over a batch of max({calls}, 1000) calls; table values are medians over the runs"),
            format!("XID: event line renamed into the fake's event file -> first frame with the GPU's replicas Unhealthy, {rounds} rounds per run; agent's part from the fake's wait return (FAKE_NVML_WAIT_LOG, wall clock)"),
        ] {
            println!("METHOD|{line}");
        }
        if let Some(exe) = &nvidia {
            println!("METHOD|NVIDIA's plugin ({exe}): same fake library (LD_LIBRARY_PATH), node and config file, --kubelet-socket on the bench's kubelet.sock, its defaults otherwise (device-list-strategy envvar, no device specs, no CDI spec: no on-disk start); in a private mount namespace made by the child before exec (a tmpfs on /var/lib, the daemon's plugin dir bound to /var/lib/kubelet/device-plugins), no wrapper process; it never marks a device healthy again, so its XID rounds are {} per run, one per GPU on the same daemon, each to the first frame with any of that GPU's replicas Unhealthy, no recovery wait", rounds.min(GPUS));
        }
        let this = &runs_of[0];
        let pooled = |f: &dyn Fn(&RunFigures) -> &Vec<Duration>| -> Vec<Duration> { this.iter().flat_map(|r| f(r).iter().copied()).collect() };
        report("start -> first Register (process spawn)", &start[0].wall, "<= 10 ms");
        report("no-op RPC (GetDevicePluginOptions)", &pooled(&|r| &r.rpcs.noop), "-");
        report("Allocate, 1 replica", &pooled(&|r| &r.rpcs.alloc1), "own cost <= 20 µs");
        report("Allocate, 4 replicas of one GPU", &pooled(&|r| &r.rpcs.alloc4), "own cost <= 20 µs");
        report("Allocate, held set grows (checkpoint)", &pooled(&|r| &r.rpcs.grow), "-");
        report("GetPreferredAllocation (4 of 512)", &pooled(&|r| &r.rpcs.pref), "-");
        report("XID 79 -> first Unhealthy ListAndWatch frame", &pooled(&|r| &r.xid), "-");
        report("  agent's part: NVML wait returns -> frame", &pooled(&|r| &r.xid_own), "<= 1 ms");
        let last = this.last().expect("one run");
        figure(
            "idle run RSS / threads (nvml fake, 512 devices, 1 stream)",
            format!("{} KiB / {}", last.rss, last.threads),
        );
        report("  driver discovery on / (whole ld.so.cache, in-process)", &host, "-");
        report("  in-process Allocate answer, 1 replica", &in1, "-");
        report("  in-process Allocate answer, 4 replicas", &in4, "-");
        let names: Vec<(&str, &str)> = std::iter::once(("this build", "this"))
            .chain(baseline.as_ref().map(|_| ("baseline", "base")))
            .chain(nvidia.as_ref().map(|_| ("NVIDIA plugin", "nvidia")))
            .collect();
        print_table(&table(&runs_of, &start, nvidia.is_some()), &names);
    });
}
