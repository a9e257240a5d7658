//! What the integration tests share beyond the library's test kit: `gpu-slicer run` as a
//! child process ([`run_command`]; only these tests have the built binary), and the kit's
//! fixtures under short names. Every wait is bounded (`within`, `wait_until`) and waits on
//! channels where one exists.

#![allow(dead_code, unused_imports)]

pub(crate) use gpu_slicer::testkit::SHARED_CONFIG;
pub(crate) use gpu_slicer::testkit::{
    STEP, fake_driver_root, fake_lib, temp_dir as short_tempdir, wait_until, within,
};

/// `gpu-slicer run` on `backend` with `config`, everything it writes in `dir` (`dp/`
/// sockets, `cdi/` spec, `state/` checkpoint, `features.d/gpu-slicer` labels), HTTP on an
/// ephemeral loopback port (never the default :9400: tests run in parallel) and no ledger.
/// Callers add flags and spawn.
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
    limit: std::time::Duration,
) -> gpu_slicer::testkit::DraPluginConn {
    wait_until(limit, || async {
        gpu_slicer::testkit::DraPluginConn::register(socket)
            .await
            .ok()
    })
    .await
    .unwrap_or_else(|| panic!("no registration on {}", socket.display()))
}

/// The Kubernetes minors that serve `resource.k8s.io/v1`, as `kubernetes-validate -k` takes them.
pub(crate) const DRA_V1_RELEASES: [&str; 4] = ["1.34.0", "1.35.0", "1.36.0", "1.37.0"];

/// A tool of the repository's venv (hack/install-deps.sh), else from PATH.
pub(crate) fn tool(name: &str) -> std::path::PathBuf {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".venv/bin")
        .join(name);
    if venv.exists() { venv } else { name.into() }
}

/// `kubernetes-validate --strict` of `file` for every release in [`DRA_V1_RELEASES`].
pub(crate) fn validate_strictly(file: &std::path::Path) {
    for v in DRA_V1_RELEASES {
        let check = std::process::Command::new(tool("kubernetes-validate"))
            .args(["--strict", "-k", v])
            .arg(file)
            .output()
            .unwrap_or_else(|e| panic!("kubernetes-validate ({e}): run hack/install-deps.sh"));
        assert!(
            check.status.success(),
            "{} against {v}: {}{}",
            file.display(),
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }
}
