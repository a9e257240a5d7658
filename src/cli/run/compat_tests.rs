//! `gpu-slicer run`'s command line as NVIDIA's DaemonSet and Helm chart write it (urfave/cli
//! bare booleans, `--flag=value`, aliases), flags gpu-slicer cannot honour refused by name,
//! Go-style durations, the labels-file default and `--config-dir` replacing `--config`.
//! (The same flags and variables through the built binary: tests/compat.rs.)

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

use crate::cli::{Cli, Command as Sub};
use crate::domain::config;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.display().to_string()
}

fn run_args(argv: &[&str]) -> Box<crate::cli::run::RunArgs> {
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
    assert_eq!(args.config.path(), Some(Path::new(&cfg)));
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

#[test]
fn labels_file_flag_default_path_and_empty_disables() {
    use crate::cli::{Cli, Command};
    use clap::Parser;
    let settings = |extra: &[&str]| {
        let argv = ["gpu-slicer", "run", "--backend", "sim:mixed-a100"]
            .iter()
            .chain(extra)
            .copied();
        let Command::Run(run) = Cli::try_parse_from(argv).expect("parse").command else {
            panic!("not run");
        };
        run.settings().expect("settings").labels.map(|l| l.path)
    };
    assert_eq!(
        settings(&[]),
        Some(PathBuf::from(
            "/etc/kubernetes/node-feature-discovery/features.d/gpu-slicer"
        ))
    );
    assert_eq!(settings(&["--labels-file="]), None);
    assert_eq!(
        settings(&["--labels-file", "/tmp/x/labels"]),
        Some(PathBuf::from("/tmp/x/labels"))
    );
}

#[test]
fn config_dir_replaces_config() {
    use clap::Parser;
    let Err(e) = crate::cli::Cli::try_parse_from([
        "gpu-slicer",
        "run",
        "--config-dir",
        "/etc/c",
        "--config",
        "/etc/c.yaml",
    ]) else {
        panic!("--config-dir with --config accepted");
    };
    assert!(e.to_string().contains("--config-dir"), "{e}");
}
