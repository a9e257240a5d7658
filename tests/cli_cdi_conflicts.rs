//! Two specs of one kind in one CDI directory: runtimes drop every device both define, so
//! `cdi generate` warns naming the other file and how many devices both define, and `run`
//! warns at start (issue 33: the README's own example once left two such specs).

mod common;

use std::process::{Command, Stdio};

use tokio::io::{AsyncBufReadExt, BufReader};

fn generate(output: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["cdi", "generate", "--backend", "sim:mixed-a100", "--output"])
        .arg(output)
        .env_remove("CONFIG_FILE")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .output()
        .expect("run gpu-slicer")
}

#[test]
fn generate_warns_about_another_spec_of_its_kind_in_the_directory() {
    let dir = common::short_tempdir();
    let cdi = dir.path().join("cdi");
    std::fs::create_dir(&cdi).unwrap();
    // Alone in the directory: nothing to say.
    let first = generate(&cdi.join("mine.yaml"));
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{err}");
    assert!(!err.contains("another spec"), "{err}");
    // The daemon's name beside it: the same 31 devices twice.
    let second = generate(&cdi);
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{err}");
    assert!(
        err.contains("WARN")
            && err.contains("another spec in the same CDI directory defines the same devices"),
        "{err}"
    );
    assert!(
        err.contains(&cdi.join("mine.yaml").display().to_string()),
        "{err}"
    );
    assert!(err.contains("devices=31"), "{err}");
    // Writing the same file again is no conflict with itself.
    let again = generate(&cdi.join("gpu-slicer.io-gpu.yaml"));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("mine.yaml"), "{err}");
    assert_eq!(err.matches("another spec").count(), 1, "{err}");
}

#[tokio::test]
async fn run_warns_at_start_about_another_spec_of_its_kind() {
    let dir = common::short_tempdir();
    let cdi = dir.path().join("cdi");
    std::fs::create_dir(&cdi).unwrap();
    let other = cdi.join("left-over.yaml");
    let made = generate(&other);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "version: v1\n").unwrap();
    let mut child = common::run_command(dir.path(), "sim:mixed-a100", &config)
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let warning = common::within("the start-up warning", async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("another spec of the same kind in the same CDI directory") {
                return line;
            }
        }
        panic!("stderr closed without the warning");
    })
    .await;
    assert!(warning.contains(&other.display().to_string()), "{warning}");
    assert!(warning.contains("gpu-slicer.io/gpu"), "{warning}");
    child.kill().await.unwrap();
}
