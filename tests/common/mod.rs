//! Shared harness: a kubelet emulator and the daemon in a short temp dir, over real unix
//! sockets. Every wait is bounded by `tokio::time::timeout` and waits on channels.

#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gpu_slicer::domain::config::{self, Overrides};
use gpu_slicer::runtime::supervisor::RunSettings;
use gpu_slicer::testkit::Node;
use gpu_slicer::testkit::kubelet::KubeletEmulator;
use tempfile::TempDir;

pub(crate) const STEP: Duration = Duration::from_secs(10);

pub(crate) const SHARED_CONFIG: &str = "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n";

/// Bound any wait.
pub(crate) async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(STEP, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out: {what}"),
    }
}

/// One HTTP/1.1 request on a fresh connection to the daemon's listener: status and body.
pub(crate) async fn http(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.expect("read");
    let status = buf
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {buf:?}"));
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Short temp dir under /tmp (unix socket paths are limited to 108 bytes).
pub(crate) fn short_tempdir() -> TempDir {
    gpu_slicer::testkit::node::short_tempdir("gs").expect("tempdir")
}

/// A daemon and its kubelet emulator (see `gpu_slicer::testkit::Node`).
pub(crate) type Harness = Node;

/// Start the emulator and the daemon on `profile` with `config_text`; wait until every
/// resource has registered.
pub(crate) async fn start(profile: &str, config_text: &str) -> Harness {
    let config = config::parse(config_text, "test.yaml", &Overrides::default()).expect("config");
    Node::start(profile, config, |_, _| {})
        .await
        .unwrap_or_else(|e| panic!("daemon did not start: {e}"))
}

/// Run the daemon with `settings` (sockets in `dir/dp`, where `emulator` serves) on
/// `backend`, with fast registration retries; wait until it is ready and every planned
/// resource has registered.
pub(crate) async fn launch(
    dir: TempDir,
    emulator: KubeletEmulator,
    settings: RunSettings,
    backend: Arc<dyn gpu_slicer::domain::inventory::Backend>,
) -> Harness {
    Node::launch(dir, emulator, settings, backend)
        .await
        .unwrap_or_else(|e| panic!("daemon did not start: {e}"))
}

/// The fake `libnvidia-ml` cargo builds as a dev-dependency, found next to the running test
/// or bench binary (`target/<profile>/deps` or its parent).
pub(crate) fn fake_lib() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("exe dir");
    for dir in [deps, deps.parent().expect("target dir")] {
        let p = dir.join("libnvidia_ml.so");
        if p.exists() {
            return p;
        }
    }
    panic!("libnvidia_ml.so not found near {}", exe.display());
}

/// A private copy of the fake NVML library: its own state, configured through its control
/// symbols, and opened by `path` by the backend under test (another copy's state is not
/// shared).
pub(crate) struct PrivateFake {
    pub(crate) path: std::path::PathBuf,
    lib: libloading::Library,
}

impl PrivateFake {
    pub(crate) fn new(dir: &std::path::Path) -> Self {
        let path = dir.join("libnvidia-ml.so.1");
        std::fs::copy(fake_lib(), &path).expect("copy fake");
        // SAFETY: loading our own fake library; it runs no initialisers with side effects.
        let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen fake");
        Self { path, lib }
    }

    /// Serve the node `text` (a node file, YAML or JSON).
    pub(crate) fn set_node(&self, text: &str) {
        let text = std::ffi::CString::new(text).expect("no NUL");
        type SetNode = unsafe extern "C" fn(*const std::ffi::c_char) -> std::ffi::c_int;
        // SAFETY: the control symbol's signature is `int (const char*)`; `text` lives across
        // the call.
        let rc = unsafe {
            let set: libloading::Symbol<SetNode> = self
                .lib
                .get(b"fakeNvmlSetNodeJson")
                .expect("control symbol");
            set(text.as_ptr())
        };
        assert_eq!(rc, 0, "fake rejected the node");
    }

    /// Topology calls this copy answered so far.
    pub(crate) fn topology_calls(&self) -> u64 {
        // SAFETY: the control symbol's signature is `unsigned long long (void)`.
        unsafe {
            let calls: libloading::Symbol<unsafe extern "C" fn() -> u64> = self
                .lib
                .get(b"fakeNvmlTopologyCalls")
                .expect("control symbol");
            calls()
        }
    }
}

/// `gpu-slicer run` on `backend` with `config`, everything it writes in `dir` (`dp/`
/// sockets, `cdi/` spec, `state/` checkpoint, `features.d/gpu-slicer` labels), HTTP on an ephemeral loopback port (never
/// the default :9400: tests run in parallel) and no ledger. Callers add flags and spawn.
pub(crate) fn run_command(
    dir: &std::path::Path,
    backend: &str,
    config: &std::path::Path,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"));
    cmd.arg("run")
        .arg("--backend")
        .arg(backend)
        .arg("--config")
        .arg(config)
        .arg("--device-plugin-dir")
        .arg(dir.join("dp"))
        .arg("--cdi-dir")
        .arg(dir.join("cdi"))
        .env("STATE_DIR", dir.join("state"))
        .env("HTTP_LISTEN", "127.0.0.1:0")
        .env("POD_RESOURCES_SOCKET", "")
        .env("LABELS_FILE", dir.join("features.d").join("gpu-slicer"))
        .kill_on_drop(true);
    cmd
}

/// A host driver root as the NVIDIA installer leaves one, as far as discovery needs it: the
/// CUDA and NVML libraries at `version` in the standard library folder (no ld.so.cache, so
/// discovery scans the folder). Returns the root; pass it as `--container-driver-root` (the
/// agent reads the files there, the spec names them under the host root `/`).
pub(crate) fn fake_driver_root(dir: &std::path::Path, version: &str) -> std::path::PathBuf {
    let root = dir.join("driver-root");
    let libs = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&libs).expect("driver root");
    for lib in ["libcuda.so", "libnvidia-ml.so"] {
        std::fs::write(libs.join(format!("{lib}.{version}")), "").expect("driver library");
    }
    root
}

/// `gpu-slicer run --dra` on `backend` with `config` (see [`run_command`]) as node `node`,
/// the API through `dir/kubeconfig`, the kubelet's registry and plugins folders in
/// `dir/reg` and `dir/plugins`. Callers add flags and spawn.
pub(crate) fn dra_command(
    dir: &std::path::Path,
    backend: &str,
    config: &std::path::Path,
    node: &str,
) -> tokio::process::Command {
    let mut cmd = run_command(dir, backend, config);
    cmd.args(["--dra", "--node-name", node, "--usage-interval", "0"])
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .arg("--kubelet-registry-dir")
        .arg(dir.join("reg"))
        .arg("--kubelet-plugins-dir")
        .arg(dir.join("plugins"));
    cmd
}

/// Register the DRA driver behind `socket` as the plugin watcher does, once the agent has
/// bound it (bounded by `limit`).
pub(crate) async fn dra_registered(
    socket: &std::path::Path,
    limit: Duration,
) -> gpu_slicer::testkit::kubelet::dra::DraPluginConn {
    gpu_slicer::testkit::node::wait_until(limit, || async {
        gpu_slicer::testkit::kubelet::dra::register(socket)
            .await
            .ok()
    })
    .await
    .unwrap_or_else(|| panic!("no registration on {}", socket.display()))
}
