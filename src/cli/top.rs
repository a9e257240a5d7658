//! `gpu-slicer top`: a terminal view of the node — GPUs → MIG devices / shares → holders →
//! memory used / granted, utilisation, idle flag — read from the daemon's `GET /v1/state`
//! (`crate::runtime::http`) and refreshed every sampling interval.
//!
//! Colour and screen clearing only on a terminal (never with `NO_COLOR`); `--once` prints
//! one frame for scripts. HTTP is a plain `http://` GET over hyper's client connection; the
//! response is capped in size.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use crate::domain::usage::{ShareReport, UsageReport};

/// Largest `/v1/state` document accepted.
const MAX_BODY: usize = 16 << 20;
/// Connect + request deadline.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of `gpu-slicer top`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TopError {
    /// `--endpoint` is not an `http://host:port` URL.
    #[error("invalid flag `--endpoint` = `{url}`: {why}")]
    Endpoint { url: String, why: String },
    /// The daemon could not be reached or answered badly.
    #[error("cannot read {url}: {why}")]
    Fetch { url: String, why: String },
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// Writing the frame.
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

/// Flags of `gpu-slicer top`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TopArgs {
    /// The daemon's HTTP endpoint (`--http-listen` of `run`).
    #[arg(
        long,
        env = "GPU_SLICER_ENDPOINT",
        default_value = "http://127.0.0.1:9400"
    )]
    pub(crate) endpoint: String,
    /// Print one frame and exit.
    #[arg(long)]
    pub(crate) once: bool,
}

fn authority(endpoint: &str) -> Result<(String, String), TopError> {
    let bad = |why: &str| TopError::Endpoint {
        url: endpoint.to_string(),
        why: why.to_string(),
    };
    let uri: hyper::Uri = endpoint.parse().map_err(|_| bad("not a URL"))?;
    if uri.scheme_str() != Some("http") {
        return Err(bad("only http:// is supported"));
    }
    let auth = uri.authority().ok_or_else(|| bad("no host"))?;
    let port = auth.port_u16().unwrap_or(80);
    let url = format!(
        "http://{}:{port}{}",
        auth.host(),
        crate::runtime::http::STATE_PATH
    );
    Ok((format!("{}:{port}", auth.host()), url))
}

async fn fetch(addr: &str, url: &str) -> Result<UsageReport, TopError> {
    let fail = |why: String| TopError::Fetch {
        url: url.to_string(),
        why,
    };
    let answer = crate::platform::http_get::get(
        addr,
        crate::runtime::http::STATE_PATH,
        None,
        MAX_BODY,
        FETCH_TIMEOUT,
    )
    .await
    .map_err(|e| fail(e.to_string()))?;
    if !answer.status.is_success() {
        return Err(fail(format!(
            "HTTP {}: {}",
            answer.status,
            String::from_utf8_lossy(&answer.body).trim()
        )));
    }
    serde_json::from_slice(&answer.body).map_err(|e| fail(format!("not a state document: {e}")))
}

/// Human bytes: binary units, one decimal.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

struct Style {
    colour: bool,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

fn share_line(out: &mut String, s: &ShareReport, indent: &str, style: &Style) {
    let holder = format!(
        "{}/{}/{}",
        s.holder.namespace, s.holder.pod, s.holder.container
    );
    let idle = if s.idle {
        style.paint("33", "idle")
    } else {
        "busy".to_string()
    };
    let pids = if s.pids.is_empty() {
        "-".to_string()
    } else {
        s.pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    out.push_str(&format!(
        "{indent}{:<28} {:<40} {:>10} / {:<10} {:<4} x{} pids {pids}\n",
        s.resource,
        holder,
        bytes(s.memory_used_bytes),
        bytes(s.memory_granted_bytes),
        idle,
        s.devices.len(),
    ));
}

/// One frame of the view.
pub(crate) fn render(r: &UsageReport, colour: bool) -> String {
    let style = Style { colour };
    let mut out = String::new();
    let every = humantime::format_duration(Duration::from_secs_f64(r.interval_seconds.max(0.0)));
    let window =
        humantime::format_duration(Duration::from_secs_f64(r.idle_window_seconds.max(0.0)));
    out.push_str(&style.paint(
        "1",
        &format!(
            "gpu-slicer top: generation {}, sampled every {every}, idle window {window}",
            r.generation
        ),
    ));
    out.push('\n');
    if let Some(e) = &r.error {
        out.push_str(&style.paint("31", &format!("last sample failed: {e}")));
        out.push('\n');
    }
    if r.sampled_at_ms == 0 {
        out.push_str("no sample yet\n");
    }
    out.push_str(&format!(
        "  {:<28} {:<40} {:>10} / {:<10} {:<4} devices, processes\n",
        "RESOURCE", "HOLDER (namespace/pod/container)", "USED", "GRANTED", "IDLE"
    ));
    for g in &r.gpus {
        let util = g
            .utilization
            .map_or_else(|| "n/a".to_string(), |u| format!("{:.0}%", u * 100.0));
        let mem = g.memory.as_ref().map_or_else(
            || "-".to_string(),
            |m| format!("{} / {}", bytes(m.used_bytes), bytes(m.total_bytes)),
        );
        out.push_str(&style.paint("1", &format!("GPU {} {} {}", g.index, g.uuid, g.product)));
        out.push_str(&format!("  util {util}  mem {mem}\n"));
        for s in &g.shares {
            share_line(&mut out, s, "  ", &style);
        }
        for m in &g.mig_devices {
            let mem = m.memory.as_ref().map_or_else(
                || "-".to_string(),
                |m| format!("{} / {}", bytes(m.used_bytes), bytes(m.total_bytes)),
            );
            out.push_str(&format!(
                "  MIG {} {}  util n/a (not reported per MIG device)  mem {mem}\n",
                m.profile, m.uuid
            ));
            for s in &m.shares {
                share_line(&mut out, s, "    ", &style);
            }
        }
    }
    let mut by_resource: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for p in &r.placeable {
        by_resource
            .entry(p.resource.as_str())
            .or_default()
            .push(format!("{}:{}", p.size, p.count));
    }
    if !by_resource.is_empty() {
        out.push_str("placeable requests (size:count)\n");
        for (resource, sizes) in by_resource {
            let idle = r.idle_shares.get(resource).copied().unwrap_or(0);
            out.push_str(&format!(
                "  {resource:<28} {}  idle shares {idle}\n",
                sizes.join(" ")
            ));
        }
    }
    let unattributed: u64 = r.unattributed_processes.values().sum();
    let reasons: Vec<String> = r
        .unattributed_processes
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    out.push_str(&format!("unattributed processes: {unattributed}"));
    if !reasons.is_empty() {
        out.push_str(&format!(" ({})", reasons.join(", ")));
    }
    out.push('\n');
    out
}

/// Run `top` until interrupted (or one frame with `--once`).
pub(crate) fn run(args: &TopArgs, out: &mut impl Write) -> Result<(), TopError> {
    let (addr, url) = authority(&args.endpoint)?;
    let terminal = std::io::stdout().is_terminal();
    let colour = terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(TopError::Runtime)?;
    loop {
        let report = rt.block_on(fetch(&addr, &url))?;
        let frame = render(&report, colour);
        if terminal && !args.once {
            // Home and clear, then the frame: a full redraw per interval.
            write!(out, "\x1b[H\x1b[2J{frame}")?;
        } else {
            write!(out, "{frame}")?;
        }
        out.flush()?;
        if args.once {
            return Ok(());
        }
        if !terminal {
            writeln!(out)?;
        }
        std::thread::sleep(Duration::from_secs_f64(report.interval_seconds.max(1.0)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_must_be_http_with_a_host() {
        assert_eq!(
            authority("http://127.0.0.1:9400").expect("ok"),
            (
                "127.0.0.1:9400".to_string(),
                "http://127.0.0.1:9400/v1/state".to_string()
            )
        );
        assert_eq!(authority("http://node").expect("ok").0, "node:80");
        for bad in ["https://x:1", "127.0.0.1:9400", "::"] {
            let e = authority(bad).expect_err(bad).to_string();
            assert!(e.contains("`--endpoint`") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(bytes(1536 << 20), "1.5 GiB");
    }
}
