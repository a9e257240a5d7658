//! `gpu-slicer emulate --kubelet` (the kubelet of `hack/advise-fleet.sh`) with a real
//! `gpu-slicer run` on the built-in `dgx-h100` sim node: the agent registers with it, a pod
//! gets GPUs through Allocate, the checkpoint names the pod's UID, the agent learns the
//! holder through the emulator's PodResources socket (its `pod_device_allocation` series),
//! and forgets it after `release`; bad commands are answers, not exits.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use common::{STEP, run_command, short_tempdir, wait_until};
use gpu_slicer::testkit::free_port;

struct Emulator {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Emulator {
    fn ask(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").expect("write command");
        self.stdin.flush().expect("flush command");
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).expect("read answer");
        answer.trim_end().to_string()
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent's `/metrics` (empty while it does not answer).
async fn metrics(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return String::new();
    };
    let request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    let mut body = Vec::new();
    if s.write_all(request.as_bytes()).await.is_err() || s.read_to_end(&mut body).await.is_err() {
        return String::new();
    }
    String::from_utf8_lossy(&body).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emulated_kubelet_allocates_reports_holders_and_releases() {
    let dir = short_tempdir();
    let dp = dir.path().join("dp");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["emulate", "--kubelet", "--dir"])
        .arg(&dp)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn emulate --kubelet");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut kubelet = Emulator {
        child,
        stdin,
        stdout,
    };
    let mut ready = String::new();
    kubelet.stdout.read_line(&mut ready).expect("ready line");
    assert_eq!(ready.trim_end(), format!("ready {}", dp.display()));

    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "version: v1\n").expect("config");
    let port = free_port();
    let _agent = run_command(dir.path(), "sim:dgx-h100", &config)
        .arg(format!("--http-listen=127.0.0.1:{port}"))
        .arg("--pod-resources-socket")
        .arg(dp.join("pod-resources.sock"))
        .args(["--ledger-interval", "200ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn gpu-slicer run");

    // Registered, with the node's 8 GPUs streamed.
    let listed = wait_until(STEP, || {
        let answer = kubelet.ask("resources");
        async move { (answer == "ok nvidia.com/gpu=8").then_some(answer) }
    })
    .await;
    assert!(listed.is_some(), "the agent never registered its 8 GPUs");

    let answer = kubelet.ask("allocate nvidia.com/gpu serving chat-0 main 2");
    let words: Vec<&str> = answer.split_whitespace().collect();
    assert_eq!(words.len(), 4, "{answer}");
    assert_eq!(words[0], "ok", "{answer}");
    let (uid, ids) = (words[1], &words[2..]);
    assert!(ids.iter().all(|id| id.starts_with("GPU-")), "{answer}");
    let checkpoint =
        std::fs::read_to_string(dp.join("kubelet_internal_checkpoint")).expect("checkpoint");
    assert!(
        checkpoint.contains(uid) && checkpoint.contains(ids[0]),
        "{checkpoint}"
    );

    // The agent sees the holder through PodResources.
    let series = format!(
        "gpu_slicer_pod_device_allocation{{namespace=\"serving\",pod=\"chat-0\",container=\"main\",resource=\"nvidia.com/gpu\",device=\"{}\"}} 1",
        ids[0]
    );
    let seen = wait_until(STEP, || {
        let series = series.clone();
        async move { metrics(port).await.contains(&series).then_some(()) }
    })
    .await;
    assert!(seen.is_some(), "no {series}");

    assert_eq!(kubelet.ask("release serving chat-0"), "ok");
    let gone = wait_until(STEP, || async {
        (!metrics(port)
            .await
            .contains("gpu_slicer_pod_device_allocation{"))
        .then_some(())
    })
    .await;
    assert!(gone.is_some(), "the released pod is still reported");

    assert_eq!(
        kubelet.ask("allocate nvidia.com/gpu serving chat-1 main two"),
        "error count `two` is not a number"
    );
    assert_eq!(
        kubelet.ask("prepare ml claim"),
        "error unknown command `prepare ml claim`"
    );
    assert_eq!(kubelet.ask("quit"), "");
    let status = kubelet.child.wait().expect("emulator exits");
    assert!(status.success(), "{status}");
}
