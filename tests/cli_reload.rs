//! Reload flags of the built binary: a bad `--rescan-interval` is refused naming the flag.
//! (The reloads themselves are unit tests of `runtime::reloader`.)

#[test]
fn a_bad_rescan_interval_is_refused_naming_the_flag() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args([
            "run",
            "--backend=sim:mixed-a100",
            "--rescan-interval",
            "5parsecs",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--rescan-interval")
            && stderr.contains("`5parsecs` is not a duration")
            && stderr.contains("\"parsecs\""),
        "{stderr}"
    );
}
