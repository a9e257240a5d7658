//! An agent whose API server does not answer logs one WARN per retry, with the backoff and
//! the client's error in it, and nothing from kube-client itself: the built binary in fleet
//! mode against a closed port, its JSON log lines counted once it has retried a few times.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

/// Retries to watch before counting.
const RETRIES: usize = 4;

#[tokio::test]
async fn one_warn_per_retry_and_no_kube_client_lines() {
    let dir = tempfile::tempdir().unwrap();
    let configs = dir.path().join("configs");
    std::fs::create_dir_all(&configs).unwrap();
    std::fs::write(configs.join("default"), "version: v1\n").unwrap();
    // A port nothing listens on: bound, then dropped.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"http://127.0.0.1:{port}\"}}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["run", "--log-format", "json", "--backend", "sim:mixed-a100"])
        .arg("--config-dir")
        .arg(&configs)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--node-name", "gpu-node-1", "--device-plugin-dir"])
        .arg(dir.path().join("dp"))
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
        .env_remove("RUST_LOG")
        .env_remove("CONFIG_FILE")
        .env_remove("CONFIG_DEFAULT")
        .env_remove("CONFIG_LABEL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen: Vec<serde_json::Value> = Vec::new();
    let retries = |seen: &[serde_json::Value]| {
        seen.iter()
            .filter(|l| l["target"] == "gpu_slicer::runtime::node_watch" && l["level"] == "WARN")
            .count()
    };
    tokio::time::timeout(Duration::from_secs(60), async {
        while retries(&seen) < RETRIES {
            let line = lines.next_line().await.unwrap().expect("the agent exited");
            seen.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}")));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("fewer than {RETRIES} retries in 60 s: {seen:#?}"));
    child.kill().await.unwrap();

    let kube: Vec<_> = seen
        .iter()
        .filter(|l| l["target"].as_str().unwrap_or_default().starts_with("kube"))
        .collect();
    assert!(kube.is_empty(), "kube-client's own lines: {kube:#?}");
    assert!(seen.iter().all(|l| l["level"] != "ERROR"), "{seen:#?}");
    // The watcher's retries: exactly one line each, attempts 0, 1, 2, ..., each with its
    // backoff and the client's error.
    let watch: Vec<_> = seen
        .iter()
        .filter(|l| l["target"] == "gpu_slicer::runtime::node_watch")
        .collect();
    assert_eq!(watch.len(), RETRIES, "{watch:#?}");
    for (i, l) in watch.iter().enumerate() {
        let f = &l["fields"];
        assert_eq!(f["attempt"], i, "{l}");
        assert!(f["retry_in"].is_string(), "{l}");
        assert!(
            f["error"]
                .as_str()
                .unwrap()
                .contains("cannot read own Node"),
            "{l}"
        );
    }
    // Every other WARN is a retry of its own (the Node reports), with its backoff.
    for l in seen.iter().filter(|l| l["level"] == "WARN") {
        assert!(
            l["fields"]["retry_in"].is_string(),
            "a WARN without its backoff: {l}"
        );
    }
}
