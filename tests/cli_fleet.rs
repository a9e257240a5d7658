//! The built binary follows its Node's labels: `gpu-slicer run --config-dir` with a
//! kubeconfig for the API-server emulator switches its config when the Node is relabelled,
//! and says so in its state labels. (The fleet logic in-process: `runtime::fleet` unit
//! tests.)

mod common;

use std::time::Duration;

use common::within;
use gpu_slicer::testkit::ApiServer;
use gpu_slicer::testkit::KubeletEmulator;
use gpu_slicer::testkit::node as node_named;
use gpu_slicer::testkit::temp_dir;
use gpu_slicer::testkit::write_pool_configs as write_configs;
use k8s_openapi::api::core::v1::Node;

const NODE: &str = "gpu-node-1";
const T: Duration = Duration::from_secs(20);

/// NVIDIA's label choosing the config; the agent's own labels saying how it went.
const CONFIG_LABEL: &str = "nvidia.com/device-plugin.config";
const CONFIG_STATE_LABEL: &str = "gpu-slicer.io/config.state";
const CONFIG_APPLIED_LABEL: &str = "gpu-slicer.io/config.applied";

fn node(labels: &[(&str, &str)]) -> Node {
    node_named(NODE, labels)
}

/// Wait until the Node carries every `(key, value)` of `want`.
async fn until_labels(api: &ApiServer, want: &[(&str, &str)]) {
    gpu_slicer::testkit::until_labels(api, NODE, want, T).await;
}

#[tokio::test]
async fn the_binary_follows_its_node_labels() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node(&[])).unwrap();
    let dir = temp_dir();
    let configs = dir.path().join("configs");
    write_configs(&configs);
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig(None)).unwrap();
    let plugin_dir = dir.path().join("dp");
    let emulator = KubeletEmulator::start(&plugin_dir).await.unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["run", "--backend", "sim:mixed-a100", "--config-dir"])
        .arg(&configs)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--node-name", NODE, "--device-plugin-dir"])
        .arg(&plugin_dir)
        .arg("--cdi-dir")
        .arg(dir.path().join("cdi"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args([
            "--http-listen=",
            "--pod-resources-socket=",
            "--labels-file=",
        ])
        .args(["--usage-interval=0", "--rescan-interval=0"])
        .env_remove("CONFIG_FILE")
        .env_remove("CONFIG_DEFAULT")
        .env_remove("CONFIG_LABEL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    within(
        "registration",
        emulator.wait_registered(&["nvidia.com/gpu".to_string()], 1),
    )
    .await;
    until_labels(&api, &[(CONFIG_APPLIED_LABEL, "default")]).await;
    let mut gpu = emulator.devices("nvidia.com/gpu").expect("nvidia.com/gpu");
    api.label_node(NODE, &[(CONFIG_LABEL, Some("inference"))])
        .unwrap();
    within("8 shares", gpu.wait_for(|d| d.len() == 8))
        .await
        .unwrap();
    until_labels(
        &api,
        &[
            (CONFIG_STATE_LABEL, "success"),
            (CONFIG_APPLIED_LABEL, "inference"),
        ],
    )
    .await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = within("exit", child.wait()).await.unwrap();
    assert!(status.success(), "{status}");
    emulator.shutdown().await;
    api.stop().await;
}
