//! `gpu-slicer top` against a running `gpu-slicer run` (the built-in `mixed-a100` sim node,
//! sampled every 100 ms): `--once` in a pipe draws the node without colour; the interactive
//! view in a real terminal (tmux, when installed) clears the screen and draws every GPU;
//! `top` against nothing or with a bad `--endpoint` is refused naming it. (Attribution,
//! metrics and `/v1/state`: the `runtime::usage` unit tests.)

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{STEP, run_command, short_tempdir, wait_until, within};
use gpu_slicer::testkit::free_port;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const GPU0: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e00";
const GPU1: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e01";

/// `gpu-slicer top --once` against `addr`, as a pipe reads it.
fn top_once(addr: SocketAddr) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["top", "--once", "--endpoint", &format!("http://{addr}")])
        .env("NO_COLOR", "1")
        .output()
        .expect("top")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_draws_a_running_daemon_in_a_pipe_and_in_a_terminal() {
    let dir = short_tempdir();
    std::fs::create_dir_all(dir.path().join("dp")).expect("plugin dir");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "version: v1\n").expect("config");
    let port = free_port();
    let mut child = run_command(dir.path(), "sim:mixed-a100", &config)
        .arg("--usage-interval=100ms")
        .arg(format!("--http-listen=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn gpu-slicer run");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // The endpoint answers once the daemon is up and has sampled.
    let frame = wait_until(STEP, || async {
        let out = top_once(addr);
        let frame = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && frame.contains(&format!("GPU 1 {GPU1}"))).then_some(frame)
    })
    .await
    .expect("top --once draws the daemon");
    eprintln!("top --once:\n{frame}");
    for line in [
        format!("GPU 0 {GPU0} NVIDIA A100-SXM4-80GB"),
        "unattributed processes: 0".to_string(),
    ] {
        assert!(frame.contains(&line), "{line:?} not in:\n{frame}");
    }
    assert!(
        !frame.contains('\x1b'),
        "no colour off a terminal:\n{frame}"
    );
    tmux_view(addr, dir.path()).await;

    let pid = Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid fits"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let status = within("exit", child.wait()).await.expect("wait");
    assert!(status.success(), "{status}");
}

/// The interactive view in a real terminal: tmux runs `top`, the pane is captured.
async fn tmux_view(addr: SocketAddr, dir: &Path) {
    if std::process::Command::new("tmux")
        .arg("-V")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED tmux capture (tmux not installed; hack/install-deps.sh installs it)");
        return;
    }
    let socket = dir.join("tmux.sock");
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .args(args)
            .output()
            .expect("tmux")
    };
    let cmd = format!(
        "{} top --endpoint http://{addr}",
        env!("CARGO_BIN_EXE_gpu-slicer")
    );
    let started = tmux(&[
        "new-session",
        "-d",
        "-x",
        "200",
        "-y",
        "50",
        "-s",
        "top",
        &cmd,
    ]);
    assert!(
        started.status.success(),
        "tmux: {}",
        String::from_utf8_lossy(&started.stderr)
    );
    let pane = wait_until(Duration::from_secs(10), || async {
        let cap = tmux(&["capture-pane", "-p", "-t", "top"]);
        let text = String::from_utf8_lossy(&cap.stdout).to_string();
        text.contains("unattributed processes").then_some(text)
    })
    .await;
    let last = tmux(&["capture-pane", "-p", "-t", "top"]);
    tmux(&["kill-server"]);
    let pane = pane
        .unwrap_or_else(|| panic!("top never drew:\n{}", String::from_utf8_lossy(&last.stdout)));
    assert!(pane.contains(&format!("GPU 1 {GPU1}")), "{pane}");
    // The screen was cleared: the frame starts at the top line.
    assert!(pane.starts_with("gpu-slicer top:"), "{pane}");
}

/// `top` against nothing: exit 1 naming the URL; a bad `--endpoint`: exit 2 naming the flag.
#[test]
fn top_errors_name_the_endpoint() {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["top", "--once", "--endpoint", &format!("http://{addr}")])
        .output()
        .expect("top");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("http://{addr}/v1/state")), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["top", "--once", "--endpoint", "https://node:9400"])
        .output()
        .expect("top");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("`--endpoint` = `https://node:9400`"), "{err}");
}
