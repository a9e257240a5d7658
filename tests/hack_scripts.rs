//! The test command talks: `hack/phase.sh` (each phase of `hack/test.sh` with its time and
//! the running total, a table at the end even when a phase fails) and `hack/fuzz.sh`'s
//! build progress, run with a stand-in `cargo` so no nightly toolchain is needed.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn bash(script: &str) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(root())
        .output()
        .expect("run bash")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn phases_report_start_time_and_total_and_a_table_at_the_end() {
    let out = bash(
        "set -euo pipefail; . hack/phase.sh; trap phase_summary EXIT; \
         phase 'first step' echo working; phase 'second step' env X=1 sh -c 'echo X=$X'",
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for needle in [
        // Times are whole seconds since the script began (0s or 1s here).
        "] first step: echo working\nworking\n<== first step: ok in ",
        "==> [",
        "X=1\n<== second step: ok in",
        "==> phases:\n    first step ",
        "    second step ",
        "    total ",
    ] {
        assert!(t.contains(needle), "missing {needle:?} in:\n{t}");
    }
}

#[test]
fn a_failing_phase_stops_the_script_with_its_code_and_still_prints_the_table() {
    let out = bash(
        "set -euo pipefail; . hack/phase.sh; trap phase_summary EXIT; \
         phase 'breaks' sh -c 'exit 3'; echo the-next-command-ran",
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(3), "{t}");
    assert!(t.contains("<== breaks: FAILED (exit 3)"), "{t}");
    assert!(
        t.contains("breaks") && t.contains("FAILED\n    total"),
        "{t}"
    );
    assert!(!t.contains("the-next-command-ran"), "{t}");
}

#[test]
fn fuzz_smoke_reports_build_progress_and_each_target() {
    let dir = common::short_tempdir();
    // The calls hack/fuzz.sh makes of `cargo +nightly fuzz`, answered without a toolchain:
    // a build that takes 3 s and says what it compiles, as cargo does on stderr.
    let cargo = dir.path().join("cargo");
    std::fs::write(
        &cargo,
        r##"#!/usr/bin/env bash
case "$*" in
  "+nightly --version"|"+nightly fuzz --version") echo stub ;;
  "+nightly fuzz list --fuzz-dir fuzz") printf 'alpha\nbeta\n' ;;
  "+nightly fuzz build --fuzz-dir fuzz --sanitizer none")
    for c in serde tokio gpu-slicer; do echo "   Compiling $c v1.0.0" >&2; sleep 1; done ;;
  "+nightly fuzz run"*) echo "stat::number_of_executed_units: 42"; echo "#9 cov: 7" ;;
  *) echo "unexpected: $*" >&2; exit 3 ;;
esac
"##,
    )
    .unwrap();
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("hack/fuzz.sh")
        .arg("1")
        .current_dir(root())
        .env("PATH", path)
        .env("FUZZ_PROGRESS_SECONDS", "1")
        .output()
        .expect("run hack/fuzz.sh");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("fuzz: building 2 targets"), "{t}");
    // At least one progress line while the build runs, naming a crate it compiled.
    assert!(
        t.lines()
            .any(|l| l.starts_with("fuzz: building for ") && l.contains("crates compiled, now ")),
        "{t}"
    );
    assert!(t.contains("fuzz: built in "), "{t}");
    assert!(t.contains("PASS alpha: 42 executions in 1s, cov: 7"), "{t}");
    assert!(t.contains("fuzz: 2 passed, 0 failed"), "{t}");
}

/// `hack/check-docs.sh` on this tree: every link and anchor of the README and the book
/// resolves and no document names a minimum Rust version other than Cargo.toml's. Its
/// self-test shows the same checker refusing a missing file, a missing anchor, a chapter left
/// out of SUMMARY.md and another MSRV, each in a scratch tree. (The book build itself needs
/// mdbook and is the `docs` phase of hack/test.sh.)
#[test]
fn docs_links_resolve_and_the_msrv_is_declared_once() {
    let out = bash("DOCS_SKIP_BOOK=1 hack/check-docs.sh");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("their links and anchors resolve"), "{t}");
    let out = bash("hack/check-docs.sh --self-test");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("check-docs self-test: ok"), "{t}");
}

/// `hack/cluster.sh` refuses bad input with exit 2 and the value as given, before it checks
/// for root or touches the machine.
#[test]
fn cluster_script_refuses_a_bad_mode_component_or_command() {
    for (script, want) in [
        (
            "CLUSTER_MODE=bogus hack/cluster.sh up",
            "cluster: CLUSTER_MODE must be dra, device-plugin or label-configs, not 'bogus'",
        ),
        (
            "hack/cluster.sh restart nope",
            "cluster: restart: name one of etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet, not 'nope'",
        ),
        (
            "hack/cluster.sh upp",
            "cluster: usage: hack/cluster.sh up|down|status|env|deploy|restart COMPONENT",
        ),
    ] {
        let out = bash(script);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{script}: {t}");
        assert_eq!(t.trim_end(), want, "{script}");
    }
}

/// Without a nightly toolchain the smoke runs cargo-fuzz on stable with RUSTC_BOOTSTRAP=1;
/// without cargo-fuzz it fails (exit 1) and says how to install it, rather than skipping.
#[test]
fn fuzz_smoke_falls_back_to_stable_and_never_skips() {
    let dir = common::short_tempdir();
    let cargo = dir.path().join("cargo");
    let stub = |fuzz_installed: bool| {
        let script = format!(
            r##"#!/usr/bin/env bash
case "$*" in
  "+nightly --version") echo "no nightly" >&2; exit 1 ;;
  "fuzz --version") {installed} ;;
  fuzz*) [ "$RUSTC_BOOTSTRAP" = 1 ] || {{ echo "no RUSTC_BOOTSTRAP: $*" >&2; exit 4; }}
    case "$*" in
      "fuzz list --fuzz-dir fuzz") echo alpha ;;
      "fuzz build --fuzz-dir fuzz --sanitizer none") ;;
      "fuzz run"*) echo "stat::number_of_executed_units: 5"; echo "#1 cov: 2" ;;
      *) echo "unexpected: $*" >&2; exit 3 ;;
    esac ;;
  *) echo "unexpected: $*" >&2; exit 3 ;;
esac
"##,
            installed = if fuzz_installed {
                "echo stub"
            } else {
                "exit 101"
            }
        );
        std::fs::write(&cargo, script).unwrap();
        std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!(
            "{}:{}",
            dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new("hack/fuzz.sh")
            .arg("1")
            .current_dir(root())
            .env("PATH", path)
            .env_remove("RUSTC_BOOTSTRAP")
            .output()
            .expect("run hack/fuzz.sh")
    };
    let out = stub(true);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("fuzz: building 1 targets on stable with RUSTC_BOOTSTRAP=1"),
        "{t}"
    );
    assert!(t.contains("PASS alpha: 5 executions in 1s, cov: 2"), "{t}");
    let out = stub(false);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("fuzz: cargo-fuzz is not installed (hack/install-deps.sh, or cargo install --locked cargo-fuzz)"),
        "{t}"
    );
}

/// `hack/docs-commands.py` (the README's and the book's commands, run as shown): a command
/// that prints what the docs show passes; a shown line it does not print, an output block
/// naming no command, and a command no rule runs or skips each fail the check.
#[test]
fn docs_commands_run_as_shown_and_their_output_is_checked() {
    let dir = common::short_tempdir();
    let page = |name: &str, body: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, body).expect("write page");
        path
    };
    let check = |path: &Path| {
        Command::new("python3")
            .arg(root().join("hack/docs-commands.py"))
            .arg(path)
            .env("GPU_SLICER_BIN", env!("CARGO_BIN_EXE_gpu-slicer"))
            .env("FAKE_SMI_BIN", "/bin/true")
            .output()
            .expect("run docs-commands.py")
    };
    let good = page(
        "good.md",
        "```sh\n\
         cargo run -q -- inventory --backend sim:mixed-a100 --config hack/configs/per-gpu.yaml\n\
         gpu-slicer cdi generate --backend sim:mixed-a100 --output /tmp/spec.yaml   # a file\n\
         kubectl apply -k deploy/dra/\n\
         ```\n\n\
         <!-- output of: inventory --backend sim:mixed-a100 --config hack/configs/per-gpu.yaml -->\n\
         ```\n\
         nvidia.com/gpu                           1       1  -                            GPU 2\n\
         ```\n",
    );
    let out = check(&good);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("RESULT: 3 passed, 0 failed, 1 skipped"), "{t}");

    let wrong_output = page(
        "wrong.md",
        "```sh\n\
         gpu-slicer inventory --backend sim:mixed-a100\n\
         nvidia.com/gpu    9    9  -    GPU 7\n\
         ```\n",
    );
    let out = check(&wrong_output);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("the docs show a line it did not print: nvidia.com/gpu    9    9  -    GPU 7"),
        "{t}"
    );

    let orphan = page(
        "orphan.md",
        "<!-- output of: labels --backend sim:mixed-a100 -->\n```\nanything\n```\n",
    );
    let t = text(&check(&orphan));
    assert!(t.contains("names no command that ran"), "{t}");

    let unknown = page("unknown.md", "```sh\nhack/new-tool.sh --all\n```\n");
    let out = check(&unknown);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("no rule runs or skips `hack/new-tool.sh --all`"),
        "{t}"
    );
}
