//! Process-level output policy for the binary: log set-up, how a fatal error is reported,
//! and which write failures are not failures. `main` calls these; they live in the
//! library so tests can check them.

use std::io::IsTerminal;

use super::LogFormat;

/// Whether log lines may carry ANSI colour codes: only when stderr is a terminal and
/// `NO_COLOR` (no-color.org) is unset or empty. A log file, journald or a container
/// runtime's log then gets plain text.
pub(crate) fn use_colour(stderr_is_terminal: bool, no_color: Option<&str>) -> bool {
    stderr_is_terminal && no_color.is_none_or(str::is_empty)
}

/// kube-client's HTTP trace layer logs an ERROR of its own for every failed request; our
/// retry loops log the same error once, with the backoff, so its line is off unless
/// `RUST_LOG` names `kube_client`.
const KUBE_CLIENT_FAILURES: &str = "kube_client::client::builder=off";

/// The filter: `rust_log` (`RUST_LOG`) or `default_filter`, with kube-client's own failure
/// lines off unless `rust_log` asks for kube_client.
pub(crate) fn log_filter(
    rust_log: Option<&str>,
    default_filter: &str,
) -> tracing_subscriber::EnvFilter {
    let given = rust_log.filter(|v| !v.trim().is_empty());
    let mut filter = given
        .and_then(|v| tracing_subscriber::EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default_filter));
    if !given.is_some_and(|v| v.contains("kube_client"))
        && let Ok(d) = KUBE_CLIENT_FAILURES.parse()
    {
        filter = filter.add_directive(d);
    }
    filter
}

/// Install the global subscriber writing to stderr in `format`. `RUST_LOG` filters
/// (default `default_filter`: [`super::Cli::default_log_filter`]); see [`log_filter`].
pub(crate) fn init_tracing(format: LogFormat, default_filter: &str) {
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref(), default_filter);
    let no_color = std::env::var("NO_COLOR").ok();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(use_colour(
            std::io::stderr().is_terminal(),
            no_color.as_deref(),
        ));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Report the error a command ended with: the plain `gpu-slicer: error: …` line for
/// people, or, under `--log-format json`, one JSON log event like every other line, so a
/// log pipeline that parses every line does not lose the one that matters most.
pub(crate) fn report_fatal(format: LogFormat, error: &dyn std::fmt::Display) {
    match format {
        LogFormat::Text => eprintln!("{}{error}", super::ERROR_PREFIX),
        LogFormat::Json => tracing::error!(error = %error, "fatal"),
    }
}

/// Whether an error (or any error it wraps) is a write to a closed pipe: `gpu-slicer
/// inventory | head` closing stdout early is the reader's choice, not a failure.
pub(crate) fn is_broken_pipe(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::BrokenPipe
        {
            return true;
        }
        if let Some(json) = e.downcast_ref::<serde_json::Error>()
            && json.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_clients_own_failure_lines_are_off_unless_asked_for() {
        let off = "kube_client::client::builder=off";
        for rust_log in [None, Some(""), Some("debug"), Some("gpu_slicer=trace")] {
            let f = log_filter(rust_log, "info").to_string();
            assert!(f.contains(off), "{rust_log:?}: {f}");
        }
        let f = log_filter(Some("kube_client=debug"), "info").to_string();
        assert!(!f.contains(off), "{f}");
        assert!(f.contains("kube_client=debug"), "{f}");
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some("")));
        assert!(!use_colour(true, Some("1")));
        assert!(!use_colour(false, None));
    }

    #[test]
    fn broken_pipes_are_found_through_wrapping_errors() {
        let pipe = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let wrapped = crate::cli::error::Error::Output(pipe);
        assert!(is_broken_pipe(&wrapped));
        let other = crate::cli::error::Error::Output(std::io::Error::from(
            std::io::ErrorKind::PermissionDenied,
        ));
        assert!(!is_broken_pipe(&other));
    }
}
