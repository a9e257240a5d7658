//! What tests read from a running daemon: one request on a fresh connection to its HTTP
//! endpoint ([`http`]; [`free_port`] for a daemon in another process), `promtool check
//! metrics` on a scrape (`promtool_check`), the CDI spec it wrote ([`read_cdi_spec`],
//! [`spec_device_names`]). And `rerun_alone`: one test in a fresh process, for settings
//! only a new process takes (the environment the fake driver reads when loaded).

use std::collections::BTreeSet;
#[cfg(test)]
use std::net::SocketAddr;
use std::path::Path;

#[cfg(test)]
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A loopback TCP port free a moment ago, for a child process's `--http-listen` (a port it
/// binds itself, where `127.0.0.1:0` would leave the test without the address).
///
/// # Panics
/// When no port can be bound.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("free port: {e}"))
        .port()
}

#[cfg(test)]
/// One HTTP/1.1 request on a fresh connection to the daemon's listener: status and body.
///
/// # Panics
/// When the connection fails or the answer is not HTTP: the probe is for tests.
pub(crate) async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap_or_else(|e| panic!("write to {addr}: {e}"));
    let mut buf = String::new();
    s.read_to_string(&mut buf)
        .await
        .unwrap_or_else(|e| panic!("read from {addr}: {e}"));
    let status = buf
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {buf:?}"));
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[cfg(test)]
/// `promtool check metrics` on a scrape: the exposition is valid and lint-free.
///
/// # Panics
/// When promtool finds a problem, or is not installed (Debian package `prometheus`:
/// hack/install-deps.sh installs it).
pub(crate) fn promtool_check(body: &str) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let scrape = dir.path().join("scrape.txt");
    std::fs::write(&scrape, body).unwrap_or_else(|e| panic!("write scrape: {e}"));
    let input = std::fs::File::open(&scrape).unwrap_or_else(|e| panic!("open scrape: {e}"));
    let out = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(input)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "promtool ({e}; Debian package `prometheus`) must be installed: run hack/install-deps.sh"
            )
        });
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The CDI spec file at `path` as the agent's own reader loads it (file name, parse, the
/// checks a runtime makes: `cdi validate`), as a JSON document in the spec's field names
/// (`devices[].containerEdits.deviceNodes[].path`, ...).
///
/// # Panics
/// When the file is missing or not a valid spec.
pub fn read_cdi_spec(path: &Path) -> serde_json::Value {
    let spec = crate::platform::cdi_host::validate_file(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::to_value(&spec).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every CDI device name in a spec's YAML text (`- name: <device>` lines).
pub fn spec_device_names(spec: &str) -> BTreeSet<String> {
    spec.lines()
        .filter_map(|l| l.trim().strip_prefix("- name: "))
        .map(|n| n.trim_matches(['\'', '"']).to_string())
        .collect()
}

#[cfg(test)]
/// Run this test binary again for the test at `path` alone (its full module path, as
/// `--exact` wants it), in a fresh process whose environment `configure` sets; the child test
/// is a no-op unless it finds the variable its parent sets.
///
/// # Panics
/// When the child cannot run, fails, or did not run exactly that one test (its output is in
/// the message).
pub(crate) fn rerun_alone(path: &str, configure: impl FnOnce(&mut std::process::Command)) {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current exe: {e}"));
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--exact", path, "--nocapture", "--test-threads=1"]);
    configure(&mut cmd);
    let out = cmd.output().unwrap_or_else(|e| panic!("spawn child: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}
