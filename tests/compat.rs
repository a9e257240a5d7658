//! Drop-in use in place of NVIDIA's plugin, and what an operator reads: NVIDIA's DaemonSet
//! argument forms, one ConfigMap for a mixed cluster, errors that name the flag or
//! variable the user set, logs fit for a log pipeline, and the metrics of a fresh daemon
//! (checked by `promtool`). The binary is run as an operator runs it, where the process
//! boundary matters (environment, stdout, stderr).

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use common::{short_tempdir, within};
use gpu_slicer::cli::{Cli, Command as Sub};
use gpu_slicer::domain::config::{self, Overrides};
use gpu_slicer::platform::sim::SimBackend;
use gpu_slicer::runtime::supervisor::{self as app, RunSettings};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

const BIN: &str = env!("CARGO_BIN_EXE_gpu-slicer");

/// The binary with a clean environment for the settings under test.
fn gpu_slicer(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args);
    for var in [
        "MIG_STRATEGY",
        "FAIL_ON_INIT_ERROR",
        "PASS_DEVICE_SPECS",
        "CONFIG_FILE",
        "LOG_FORMAT",
        "NO_COLOR",
        "RUST_LOG",
        "DEVICE_DISCOVERY_STRATEGY",
    ] {
        c.env_remove(var);
    }
    c
}

fn run(mut c: impl std::borrow::BorrowMut<Command>) -> Output {
    let c = c.borrow_mut();
    c.stdin(Stdio::null()).output().expect("run gpu-slicer")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.display().to_string()
}

fn run_args(argv: &[&str]) -> Box<gpu_slicer::cli::run::RunArgs> {
    match Cli::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
        .command
    {
        Sub::Run(a) => a,
        other => panic!("not run: {other:?}"),
    }
}

// --- item 17: NVIDIA's DaemonSet args -------------------------------------------------

#[test]
fn nvidia_daemonset_args_parse_and_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write(
        dir.path(),
        "config.yaml",
        "version: v1\nflags:\n  migStrategy: none\n",
    );
    let config_file = format!("--config-file={cfg}");
    // The forms NVIDIA's static DaemonSet and Helm chart pass (urfave/cli: bare booleans,
    // `--flag=value`).
    let args = run_args(&[
        "gpu-slicer",
        "run",
        &config_file,
        "--fail-on-init-error",
        "--pass-device-specs",
        "--mig-strategy=mixed",
        "--device-list-strategy=envvar,cdi-cri",
        "--device-id-strategy=uuid",
        "--device-discovery-strategy=auto",
        "--nvidia-ctk-path=/usr/bin/nvidia-ctk",
        "--container-driver-root=/driver-root",
        "--cdi-annotation-prefix=cdi.k8s.io/",
        "--mps-root=/run/nvidia/mps",
        "--nvidia-dev-root=/host",
        "--imex-channel-ids=0",
        "--gds-enabled=false",
        "--mofed-enabled=false",
        "--gdrcopy-enabled=false",
    ]);
    assert_eq!(args.config.config.as_deref(), Some(Path::new(&cfg)));
    let loaded = args.config.load().expect("load");
    assert!(loaded.fail_on_init_error);
    assert!(loaded.pass_device_specs);
    assert_eq!(
        loaded.mig_strategy,
        config::MigStrategy::Mixed,
        "flag beats file"
    );
    assert_eq!(loaded.source, cfg);
    assert_eq!(loaded.dev_root, Path::new("/host"));

    // `=false` still works, and NVIDIA's aliases of the hook path.
    let args = run_args(&[
        "gpu-slicer",
        "run",
        "--fail-on-init-error=false",
        "--pass-device-specs=false",
        "--nvidia-cdi-hook-path=/usr/bin/nvidia-cdi-hook",
        "--driver-root-ctr-path=/driver-root",
    ]);
    let loaded = args.config.load().expect("load");
    assert!(!loaded.fail_on_init_error);
    assert!(!loaded.pass_device_specs);
    // The space-separated form gpu-slicer took before keeps working.
    let args = run_args(&["gpu-slicer", "run", "--fail-on-init-error", "false"]);
    assert!(!args.config.load().expect("load").fail_on_init_error);
}

#[test]
fn nvidia_flags_gpu_slicer_cannot_honour_are_refused_by_name() {
    for (flag, named) in [
        (
            "--device-discovery-strategy=tegra",
            "flag `--device-discovery-strategy` = `tegra`",
        ),
        ("--gds-enabled", "flag `--gds-enabled` = `true`"),
        (
            "--imex-channel-ids=1,2",
            "flag `--imex-channel-ids` = `1,2`",
        ),
    ] {
        let err = run_args(&["gpu-slicer", "run", flag])
            .config
            .load()
            .unwrap_err();
        assert!(err.to_string().contains(named), "{flag}: {err}");
    }
}

#[test]
fn bare_booleans_and_env_vars_work_through_the_binary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write(dir.path(), "c.yaml", "version: v1\n");
    let ok = run(gpu_slicer(&[
        "inventory",
        "--backend",
        "sim:dgx-h100",
        "--format",
        "json",
        "--config-file",
        &cfg,
        "--fail-on-init-error",
        "--pass-device-specs",
    ]));
    assert!(ok.status.success(), "{}", stderr(&ok));
    // Env vars as NVIDIA's chart sets them, Go boolean spellings included.
    let ok = run(gpu_slicer(&["inventory", "--backend", "sim:dgx-h100"])
        .env("CONFIG_FILE", &cfg)
        .env("FAIL_ON_INIT_ERROR", "False")
        .env("PASS_DEVICE_SPECS", "true")
        .env("DEVICE_DISCOVERY_STRATEGY", "auto"));
    assert!(ok.status.success(), "{}", stderr(&ok));
}

// --- item 16: one ConfigMap for a mixed cluster ---------------------------------------

#[test]
fn a_mixed_cluster_configmap_runs_on_a_node_without_mig() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write(
        dir.path(),
        "c.yaml",
        "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n    - {name: nvidia.com/gpu, replicas: 2}\n",
    );
    let out = run(gpu_slicer(&[
        "inventory",
        "--backend",
        "sim:dgx-h100",
        "--format",
        "json",
        "--config",
        &cfg,
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("config entry skipped"), "{err}");
    assert!(
        err.contains("sharing.timeSlicing.resources[0].name"),
        "{err}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = report["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, ["nvidia.com/gpu"]);
}

// --- item 19: errors name their real source -------------------------------------------

#[test]
fn a_bad_flag_or_env_value_is_blamed_on_the_flag_or_variable() {
    let out = run(gpu_slicer(&[
        "inventory",
        "--backend",
        "sim:dgx-h100",
        "--mig-strategy=bogus",
    ]));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("invalid flag `--mig-strategy` = `bogus`: expected none, single or mixed"),
        "{err}"
    );
    assert!(!err.contains("built-in defaults"), "{err}");

    let out =
        run(gpu_slicer(&["inventory", "--backend", "sim:dgx-h100"]).env("MIG_STRATEGY", "bogus"));
    let err = stderr(&out);
    assert!(
        err.contains("invalid env var `MIG_STRATEGY` = `bogus`"),
        "{err}"
    );

    let out = run(gpu_slicer(&[
        "inventory",
        "--backend",
        "sim:dgx-h100",
        "--device-list-strategy=envvar,bogus",
    ]));
    let err = stderr(&out);
    assert!(
        err.contains("invalid flag `--device-list-strategy` = `bogus`"),
        "{err}"
    );

    // A bad file value is still blamed on the file and its field, once.
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write(dir.path(), "c.yaml", "flags:\n  migStrategy: bogus\n");
    let out = run(gpu_slicer(&[
        "inventory",
        "--backend",
        "sim:dgx-h100",
        "--config",
        &cfg,
    ]));
    let err = stderr(&out);
    assert!(
        err.contains(&cfg) && err.contains("field `flags.migStrategy` = `bogus`"),
        "{err}"
    );
    assert_eq!(err.matches("flags.migStrategy").count(), 1, "{err}");
}

// --- item 20: logs --------------------------------------------------------------------

#[test]
fn text_logs_carry_no_colour_codes_when_stderr_is_a_pipe() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The `resources` section is accepted with a warning: a log line to look at.
    let cfg = write(
        dir.path(),
        "c.yaml",
        "resources:\n  gpus:\n  - {pattern: \"*\", name: gpu}\n",
    );
    let out = run(gpu_slicer(&[
        "inventory",
        "--backend",
        "sim:dgx-h100",
        "--config",
        &cfg,
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("WARN"), "a warning was logged: {err}");
    assert!(
        !err.contains('\u{1b}'),
        "ANSI escape in piped stderr: {err:?}"
    );
}

#[test]
fn fatal_errors_are_json_under_log_format_json() {
    let out = run(gpu_slicer(&[
        "--log-format",
        "json",
        "inventory",
        "--backend",
        "sim:no-such-profile",
    ]));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    let fatal = lines
        .iter()
        .find(|l| l["level"] == "ERROR")
        .unwrap_or_else(|| panic!("no ERROR event: {err}"));
    assert!(
        fatal["fields"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("no-such-profile")),
        "{fatal}"
    );
}

#[test]
fn a_closed_stdout_is_not_an_error() {
    // The reader is gone before the first byte is written, as with `| head -0`.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = gpu_slicer(&["inventory", "--backend", "sim:dgx-h100", "--format", "json"])
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run");
    assert!(out.status.success(), "{:?}: {}", out.status, stderr(&out));
    assert!(!stderr(&out).contains("error"), "{}", stderr(&out));
}

// --- item 22: Go-style durations ------------------------------------------------------

#[test]
fn duration_flags_take_go_style_values() {
    let args = run_args(&[
        "gpu-slicer",
        "run",
        "--rescan-interval=1m30s",
        "--ledger-interval=2s500ms",
    ]);
    assert_eq!(args.rescan_interval, Duration::from_secs(90));
    assert_eq!(args.ledger_interval, Duration::from_millis(2500));
    let args = run_args(&["gpu-slicer", "run", "--rescan-interval=300"]);
    assert_eq!(args.rescan_interval, Duration::from_secs(300));
}

// --- item 21: metrics of a fresh daemon -----------------------------------------------

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    common::http(addr, "GET", path).await.1
}

#[tokio::test]
async fn a_fresh_daemon_exposes_every_family_and_passes_promtool() {
    let dir = short_tempdir();
    let config = config::parse(
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n",
        "test.yaml",
        &Overrides::default(),
    )
    .expect("config");
    let backend = Arc::new(SimBackend::open("dgx-h100").expect("profile"));
    let mut settings = RunSettings::new(config, dir.path().join("dp"), dir.path().join("cdi"));
    settings.http_listen = Some("127.0.0.1:0".into());
    let (tx, rx) = oneshot::channel();
    settings.on_ready = Some(tx);
    let shutdown = CancellationToken::new();
    let app = tokio::spawn(app::run(settings, backend, shutdown.clone()));
    let running = within("daemon ready", rx).await.expect("ready");
    let addr = running.http_addr.expect("http");
    // Per-resource series follow the first publication, asynchronously.
    let body = within("per-resource series", async {
        loop {
            let body = get(addr, "/metrics").await;
            if body.contains("gpu_slicer_device_healthy{") {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    for sample in [
        "gpu_slicer_build_info{version=\"",
        "gpu_slicer_config_reloads_total{outcome=\"ok\"} 0",
        "gpu_slicer_config_reloads_total{outcome=\"failed\"} 0",
        "gpu_slicer_config_entries_skipped{reason=\"resource-not-on-node\"} 0",
        "gpu_slicer_config_entries_skipped{reason=\"no-matching-devices\"} 0",
        "gpu_slicer_ledger_up ",
        "gpu_slicer_ledger_drift_devices ",
        "gpu_slicer_allocatable_devices{resource=\"nvidia.com/gpu\"} 16",
        "gpu_slicer_unhealthy_devices{resource=\"nvidia.com/gpu\"} 0",
        "gpu_slicer_kubelet_registrations_total{resource=\"nvidia.com/gpu\"} 0",
        "gpu_slicer_allocate_rejections_total{resource=\"nvidia.com/gpu\",rule=\"unknown-device\"} 0",
        "gpu_slicer_allocate_duration_seconds_count{resource=\"nvidia.com/gpu\"} 0",
        "gpu_slicer_preferred_allocation_duration_seconds_count{resource=\"nvidia.com/gpu\"} 0",
    ] {
        assert!(body.contains(sample), "missing {sample:?} in:\n{body}");
    }
    let scrape = dir.path().join("scrape.txt");
    std::fs::write(&scrape, &body).expect("write scrape");
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&scrape).expect("open"))
        .output()
        .expect("promtool (Debian package `prometheus`): run hack/install-deps.sh");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    shutdown.cancel();
    within("stop", app)
        .await
        .expect("join")
        .expect("clean stop");
}
