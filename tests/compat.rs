//! Drop-in use in place of NVIDIA's plugin, and what an operator reads: NVIDIA's DaemonSet
//! argument forms and environment, one ConfigMap for a mixed cluster, errors that name the
//! flag or variable the user set, logs fit for a log pipeline. The binary is run as an
//! operator runs it, where the process boundary matters (environment, stdout, stderr). (The
//! parsed command line: `cli::run` unit tests; the metrics of a fresh daemon:
//! `runtime::metrics` unit tests.)

use std::path::Path;
use std::process::{Command, Output, Stdio};

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

// --- item 17: NVIDIA's DaemonSet args (parsed: `cli::run` unit tests) -------------------

/// The daemon's flags are `run`'s alone: `run` on a sim node file that does not exist
/// loads the config with every flag over it and stops at the node file (exit 2), so an
/// error naming that file means the flags and the config were taken.
const NO_NODE: &str = "sim:/nonexistent/compat-node.yaml";

fn took_flags_then_stopped_at_the_node(out: &Output) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("/nonexistent/compat-node.yaml"), "{err}");
}

#[test]
fn bare_booleans_and_env_vars_work_through_the_binary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write(dir.path(), "c.yaml", "version: v1\n");
    took_flags_then_stopped_at_the_node(&run(gpu_slicer(&[
        "run",
        "--backend",
        NO_NODE,
        "--config-file",
        &cfg,
        "--fail-on-init-error",
        "--pass-device-specs",
    ])));
    // Env vars as NVIDIA's chart sets them, Go boolean spellings included.
    took_flags_then_stopped_at_the_node(&run(gpu_slicer(&["run", "--backend", NO_NODE])
        .env("CONFIG_FILE", &cfg)
        .env("FAIL_ON_INIT_ERROR", "False")
        .env("PASS_DEVICE_SPECS", "true")
        .env("DEVICE_DISCOVERY_STRATEGY", "auto")));
    // A one-shot command reads the config file the same way, from the flag or the variable.
    let ok = run(gpu_slicer(&["inventory", "--backend", "sim:dgx-h100"]).env("CONFIG_FILE", &cfg));
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
        "run",
        "--backend",
        NO_NODE,
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
