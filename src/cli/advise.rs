//! `gpu-slicer advise`: read a window of usage (an export file, or Prometheus through
//! `platform::prometheus`), run the pure `domain::advise`, and write what it says: the
//! summary on stdout (text or JSON), the plan as code under `--output`, the HTML report and
//! the summary JSON. Same input, same bytes out.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::domain::advise::input::Export;
use crate::domain::advise::promql::{self, Family};
use crate::domain::advise::workload::Overrides;
use crate::domain::advise::{self, AdviseError, Settings, emit, report};
use crate::platform::prometheus::{self, Endpoint, PrometheusError};

/// Errors of `gpu-slicer advise`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdviseCliError {
    /// The export, the overrides or a flag is wrong.
    #[error(transparent)]
    Input(#[from] AdviseError),
    /// An input file could not be read.
    #[error("cannot read {flag} file {path}: {source}")]
    Read {
        flag: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Neither or both of `--from-file` and `--prometheus`.
    #[error("give exactly one of --from-file and --prometheus")]
    Source,
    /// A flag's value does not parse.
    #[error("invalid {flag} = {value}: {message}")]
    Flag {
        flag: &'static str,
        value: String,
        message: String,
    },
    /// Prometheus.
    #[error(transparent)]
    Prometheus(#[from] PrometheusError),
    /// Writing an output file.
    #[error("cannot write {path}: {message}")]
    Write { path: String, message: String },
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// Stdout.
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

impl AdviseCliError {
    /// Whether the user's input is to blame (exit 2) rather than the machine (exit 1).
    pub(crate) fn is_input(&self) -> bool {
        match self {
            AdviseCliError::Input(_)
            | AdviseCliError::Read { .. }
            | AdviseCliError::Source
            | AdviseCliError::Flag { .. } => true,
            AdviseCliError::Prometheus(e) => matches!(e, PrometheusError::Url { .. }),
            _ => false,
        }
    }
}

/// Metric families of `--metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Metrics {
    /// gpu-slicer's own (`gpu_slicer_*`).
    GpuSlicer,
    /// dcgm-exporter's (`DCGM_FI_*`).
    Dcgm,
}

/// Output formats of the terminal summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// A short table (`text`, its first name, still works).
    #[value(alias = "text")]
    Table,
    /// The summary JSON.
    Json,
}

/// Flags of `gpu-slicer advise`.
#[derive(Debug, Args)]
pub(crate) struct AdviseArgs {
    /// Prometheus HTTP API base URL (`http://host:9090`).
    #[arg(long, value_name = "URL")]
    pub(crate) prometheus: Option<String>,
    /// A usage export (JSON, docs/src/advise.md) instead of Prometheus.
    #[arg(long, value_name = "FILE")]
    pub(crate) from_file: Option<PathBuf>,
    /// Which metrics Prometheus has.
    #[arg(long, value_enum, default_value_t = Metrics::GpuSlicer)]
    pub(crate) metrics: Metrics,
    /// How far back to look.
    #[arg(long, default_value = "7d")]
    pub(crate) window: String,
    /// End of the window, unix seconds (default: now).
    #[arg(long, value_name = "UNIX_SECONDS")]
    pub(crate) at: Option<f64>,
    /// A file holding the bearer token for Prometheus.
    #[arg(long, value_name = "FILE")]
    pub(crate) bearer_token_file: Option<PathBuf>,
    /// Deadline per Prometheus query.
    #[arg(long, default_value = "60s")]
    pub(crate) query_timeout: String,
    /// Write what was read from Prometheus as an export file (for `--from-file` later).
    #[arg(long, value_name = "FILE")]
    pub(crate) save_export: Option<PathBuf>,
    /// Memory added to each workload's peak: `15%` or `0.15`.
    #[arg(long, default_value = "15%")]
    pub(crate) memory_headroom: String,
    /// Workloads with less history are kept at their current size.
    #[arg(long, default_value = "24h")]
    pub(crate) min_history: String,
    /// Classification overrides (YAML or JSON).
    #[arg(long, value_name = "FILE")]
    pub(crate) overrides: Option<PathBuf>,
    /// Price of one GPU-hour, for money saved per month.
    #[arg(long, value_name = "PRICE")]
    pub(crate) gpu_hour_price: Option<f64>,
    /// Sharing candidates get DRA capacity claims (a ResourceClaimTemplate each). Named
    /// apart from `run --dra` (serve through DRA), which means another thing; `--dra`, its
    /// first name, still works.
    #[arg(long = "dra-claims", alias = "dra")]
    pub(crate) dra: bool,
    /// Write the plan as code into this directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) output: Option<PathBuf>,
    /// Write the HTML report to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) report: Option<PathBuf>,
    /// Write the summary JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) summary_json: Option<PathBuf>,
    /// Terminal output.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub(crate) format: Format,
}

fn flag(flag: &'static str, value: &str, message: impl Into<String>) -> AdviseCliError {
    AdviseCliError::Flag {
        flag,
        value: value.to_string(),
        message: message.into(),
    }
}

/// `15%` or `0.15`.
fn parse_fraction(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 100.0),
        None => (t, 1.0),
    };
    num.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .map(|v| v / scale)
        .ok_or_else(|| "not a number or percentage (15% or 0.15)".to_string())
}

/// A duration with day units too (`7d`, `24h`, `90m`).
fn parse_window(name: &'static str, text: &str) -> Result<Duration, AdviseCliError> {
    let d = crate::cli::args::parse_duration(text).map_err(|m| flag(name, text, m))?;
    if d.is_zero() {
        return Err(flag(name, text, "must be positive"));
    }
    Ok(d)
}

fn read(flag: &'static str, path: &Path) -> Result<String, AdviseCliError> {
    std::fs::read_to_string(path).map_err(|source| AdviseCliError::Read {
        flag,
        path: path.display().to_string(),
        source,
    })
}

fn write_file(path: &Path, contents: &[u8]) -> Result<(), AdviseCliError> {
    let fail = |message: String| AdviseCliError::Write {
        path: path.display().to_string(),
        message,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail(e.to_string()))?;
    if crate::platform::atomic_file::same_content(path, contents)
        .map_err(|e| fail(e.source.to_string()))?
    {
        return Ok(());
    }
    crate::platform::atomic_file::replace(&dir, path, contents, 0o644)
        .map_err(|e| fail(e.source.to_string()))
}

/// The settings from the flags.
fn settings(args: &AdviseArgs) -> Result<Settings, AdviseCliError> {
    let memory_headroom = parse_fraction(&args.memory_headroom)
        .map_err(|m| flag("--memory-headroom", &args.memory_headroom, m))?;
    let min_history = parse_window("--min-history", &args.min_history)?;
    let overrides = match &args.overrides {
        Some(p) => Overrides::parse(&read("--overrides", p)?, &p.display().to_string())?,
        None => Overrides::default(),
    };
    let s = Settings {
        memory_headroom,
        min_history_seconds: min_history.as_secs_f64(),
        overrides,
        gpu_hour_price: args.gpu_hour_price,
        dra: args.dra,
        ..Settings::default()
    };
    advise::check_settings(&s)?;
    Ok(s)
}

/// Collect the export from Prometheus: one instant query per aggregate.
async fn collect(args: &AdviseArgs, url: &str) -> Result<Export, AdviseCliError> {
    let window = parse_window("--window", &args.window)?;
    let timeout = parse_window("--query-timeout", &args.query_timeout)?;
    let token = match &args.bearer_token_file {
        Some(p) => Some(read("--bearer-token-file", p)?.trim().to_string()),
        None => None,
    };
    let ep = Endpoint::parse(url, token, timeout)?;
    let family = match args.metrics {
        Metrics::GpuSlicer => Family::GpuSlicer,
        Metrics::Dcgm => Family::Dcgm,
    };
    let secs = window.as_secs();
    // History to about 1/200 of the window (50 min over 7 days; `--min-history` is 24 h by
    // default), never finer than 15 s. The two history subqueries cost series × steps, far
    // more than the other queries: at 1/2000 of a week they took 75 of 76 s on 100 GPUs and
    // passed Prometheus's 2-minute query timeout at 1000 (hack/advise-prom-bench.sh).
    let step = (secs / 200).max(15);
    let mut answers = BTreeMap::new();
    for (key, q) in promql::queries(family, secs, step) {
        tracing::debug!(query = %q, "prometheus query");
        answers.insert(key, prometheus::query(&ep, &q, args.at).await?);
    }
    Ok(promql::assemble(family, secs, &answers))
}

/// Run `gpu-slicer advise`.
pub(crate) fn run(args: &AdviseArgs, out: &mut impl Write) -> Result<(), AdviseCliError> {
    let settings = settings(args)?;
    let export = match (&args.from_file, &args.prometheus) {
        (Some(path), None) => {
            Export::parse(&read("--from-file", path)?, &path.display().to_string())?
        }
        (None, Some(url)) => {
            let rt = crate::cli::runtime().map_err(AdviseCliError::Runtime)?;
            let export = rt.block_on(collect(args, url));
            rt.shutdown_timeout(Duration::from_millis(50));
            let export = export?;
            export.check(url)?;
            export
        }
        _ => return Err(AdviseCliError::Source),
    };
    if let Some(p) = &args.save_export {
        let mut text = serde_json::to_string_pretty(&export).map_err(std::io::Error::other)?;
        text.push('\n');
        write_file(p, text.as_bytes())?;
    }
    let advice = advise::advise(&export, &settings);
    tracing::debug!(
        workloads = advice.workloads.len(),
        gpus_before = advice.gpus_before(),
        gpus_after = advice.gpus_after(),
        lower_bound = advice.lower_bound(),
        "advice ready"
    );
    let summary = report::summary(&advice);
    if let Some(dir) = &args.output {
        for (rel, text) in emit::files(&advice) {
            write_file(&dir.join(rel), text.as_bytes())?;
        }
    }
    if let Some(p) = &args.report {
        write_file(p, report::html(&advice, &summary).as_bytes())?;
    }
    let mut json = serde_json::to_string_pretty(&summary).map_err(std::io::Error::other)?;
    json.push('\n');
    if let Some(p) = &args.summary_json {
        write_file(p, json.as_bytes())?;
    }
    match args.format {
        Format::Table => out.write_all(report::text(&summary).as_bytes())?,
        Format::Json => out.write_all(json.as_bytes())?,
    }
    Ok(())
}
