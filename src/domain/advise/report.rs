//! What people and scripts read: the terminal summary ([`text`]), the `--summary-json`
//! contract ([`summary`]) and the self-contained HTML report ([`html`]: inline SVG and CSS,
//! no script, nothing fetched from the network).

use std::fmt::Write as _;

use serde::Serialize;

use super::emit::describe;
use super::pack::{GpuShape, ShareKind};
use super::workload::Class;
use super::{Advice, Share};

const GIB: f64 = (1u64 << 30) as f64;
/// Hours in a month for `--gpu-hour-price` (365.25 × 24 / 12).
const HOURS_PER_MONTH: f64 = 730.5;

/// The `--summary-json` document (a contract: keys are camelCase and only ever added).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Summary {
    /// Metric family the figures came from.
    pub(crate) source: String,
    /// Window length, seconds.
    pub(crate) window_seconds: f64,
    /// GPUs held by some pod in the window.
    pub(crate) gpus_before: usize,
    /// GPUs the plan uses.
    pub(crate) gpus_after: usize,
    /// Lower bound on `gpusAfter`.
    pub(crate) lower_bound: usize,
    /// `gpusBefore - gpusAfter`.
    pub(crate) gpus_freed: i64,
    /// Whether every packing was solved exactly.
    pub(crate) exact: bool,
    /// Mean utilisation of the GPUs held before, 0–1.
    pub(crate) utilization_before: f64,
    /// Projected mean utilisation of the GPUs the plan uses, 0–1.
    pub(crate) utilization_after: f64,
    /// Peak memory used over memory granted, before (whole GPUs).
    pub(crate) memory_used_over_granted_before: f64,
    /// The same over the plan's grants.
    pub(crate) memory_used_over_granted_after: f64,
    /// Freed GPUs × `--gpu-hour-price` × hours per month.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) savings_per_month: Option<f64>,
    /// Per GPU model.
    pub(crate) models: Vec<ModelSummary>,
    /// Sharing pools.
    pub(crate) pools: Vec<PoolSummary>,
    /// Per workload.
    pub(crate) workloads: Vec<WorkloadSummary>,
    /// Warnings.
    pub(crate) warnings: Vec<String>,
}

/// One model.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ModelSummary {
    /// NVML product name.
    pub(crate) model: String,
    /// GPUs in the export.
    pub(crate) gpus_total: usize,
    /// Held before.
    pub(crate) gpus_before: usize,
    /// Used by the plan.
    pub(crate) gpus_after: usize,
    /// Lower bound.
    pub(crate) lower_bound: usize,
    /// Solved exactly.
    pub(crate) exact: bool,
}

/// One pool.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PoolSummary {
    /// Pool (config key, layout name).
    pub(crate) name: String,
    /// Nodes in it.
    pub(crate) nodes: usize,
    /// Shape of each GPU index, in words.
    pub(crate) gpus: Vec<String>,
}

/// One workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WorkloadSummary {
    /// Namespace.
    pub(crate) namespace: String,
    /// Owner name.
    pub(crate) name: String,
    /// `training` | `shared` | `kept`.
    pub(crate) class: Class,
    /// NVML product name.
    pub(crate) gpu_model: String,
    /// Pods seen.
    pub(crate) pods: usize,
    /// GPUs per pod.
    pub(crate) gpus_per_pod: usize,
    /// Peak memory, bytes.
    pub(crate) peak_memory_bytes: u64,
    /// p99 memory, bytes.
    pub(crate) p99_memory_bytes: u64,
    /// p95 compute, 0–1.
    pub(crate) compute_p95: f64,
    /// Mean compute, 0–1.
    pub(crate) compute_mean: f64,
    /// History, seconds.
    pub(crate) history_seconds: f64,
    /// Memory the share holds, bytes (per GPU for whole GPUs).
    pub(crate) grant_memory_bytes: u64,
    /// The MIG profile, replica share or claim it gets.
    pub(crate) share: String,
    /// Resource and count each pod asks for.
    pub(crate) resource: String,
    /// Why.
    pub(crate) reason: String,
}

fn share_words(a: &Advice, i: usize) -> String {
    let w = &a.workloads[i];
    match &a.grants[i].share {
        Share::Whole(1) => "whole GPU".into(),
        Share::Whole(n) => format!("{n} whole GPUs"),
        Share::Shared(_) if a.settings.dra => {
            let grant = super::grant_bytes(w, a.settings.memory_headroom);
            format!(
                "claim memory: {}Mi, compute: {}",
                grant.div_ceil(2 << 20) * 2,
                (w.compute_p95 * 100.0).ceil().clamp(1.0, 100.0)
            )
        }
        Share::Shared(ShareKind::Mig(p)) => format!("mig-{p}"),
        Share::Shared(ShareKind::Replicas(k)) => format!(
            "replica 1/{k} ({:.1} GiB, memory-enforced)",
            a.grants[i].memory_bytes as f64 / GIB
        ),
    }
}

/// The summary of an advice.
pub(crate) fn summary(a: &Advice) -> Summary {
    let held: Vec<_> = a.gpus_before.iter().filter(|g| g.4).collect();
    let utilization_before = if held.is_empty() {
        0.0
    } else {
        held.iter().map(|g| g.3).sum::<f64>() / held.len() as f64
    };
    let bins: Vec<_> = a.models.iter().flat_map(|m| &m.bins).collect();
    let utilization_after = if bins.is_empty() {
        0.0
    } else {
        bins.iter().map(|b| b.utilization).sum::<f64>() / bins.len() as f64
    };
    let used: f64 = a
        .workloads
        .iter()
        .map(|w| w.peak_bytes as f64 * (w.pods * w.gpus_per_pod) as f64)
        .sum();
    let granted_before: f64 = a
        .models
        .iter()
        .map(|m| m.memory_bytes as f64 * m.gpus_before as f64)
        .sum();
    let granted_after: f64 = a
        .workloads
        .iter()
        .zip(&a.grants)
        .map(|(w, g)| g.memory_bytes as f64 * (w.pods * g.resource.1) as f64)
        .sum();
    let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
    let freed = a.gpus_before() as i64 - a.gpus_after() as i64;
    Summary {
        source: a.source.clone(),
        window_seconds: a.window_seconds,
        gpus_before: a.gpus_before(),
        gpus_after: a.gpus_after(),
        lower_bound: a.lower_bound(),
        gpus_freed: freed,
        exact: a.models.iter().all(|m| m.exact),
        utilization_before,
        utilization_after,
        memory_used_over_granted_before: ratio(used, granted_before),
        memory_used_over_granted_after: ratio(used, granted_after),
        savings_per_month: a
            .settings
            .gpu_hour_price
            .map(|p| freed as f64 * p * HOURS_PER_MONTH),
        models: a
            .models
            .iter()
            .map(|m| ModelSummary {
                model: m.model.clone(),
                gpus_total: m.gpus_total,
                gpus_before: m.gpus_before,
                gpus_after: m.gpus_after,
                lower_bound: m.lower_bound,
                exact: m.exact,
            })
            .collect(),
        pools: a
            .fleet
            .pools
            .iter()
            .map(|p| PoolSummary {
                name: p.name.clone(),
                nodes: p.nodes,
                gpus: p.shapes.iter().map(describe).collect(),
            })
            .collect(),
        workloads: a
            .workloads
            .iter()
            .enumerate()
            .map(|(i, w)| WorkloadSummary {
                namespace: w.namespace.clone(),
                name: w.name.clone(),
                class: w.class,
                gpu_model: w.model.clone(),
                pods: w.pods,
                gpus_per_pod: w.gpus_per_pod,
                peak_memory_bytes: w.peak_bytes,
                p99_memory_bytes: w.p99_bytes,
                compute_p95: w.compute_p95,
                compute_mean: w.compute_mean,
                history_seconds: w.history_seconds,
                grant_memory_bytes: a.grants[i].memory_bytes,
                share: share_words(a, i),
                resource: format!("{}: {}", a.grants[i].resource.0, a.grants[i].resource.1),
                reason: w.reason.clone(),
            })
            .collect(),
        warnings: a.warnings.clone(),
    }
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// The short terminal summary.
pub(crate) fn text(s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "GPUs: {} held before, {} after (lower bound {}{}), {} freed",
        s.gpus_before,
        s.gpus_after,
        s.lower_bound,
        if s.exact { ", packed exactly" } else { "" },
        s.gpus_freed
    );
    let _ = writeln!(
        out,
        "utilisation: {} -> {} (projected); memory used / granted: {} -> {}",
        pct(s.utilization_before),
        pct(s.utilization_after),
        pct(s.memory_used_over_granted_before),
        pct(s.memory_used_over_granted_after)
    );
    if let Some(m) = s.savings_per_month {
        let _ = writeln!(out, "savings: {m:.0} per month");
    }
    let _ = writeln!(
        out,
        "{:<32} {:>6} {:>7} {:>6} {:>6}",
        "MODEL", "GPUS", "BEFORE", "AFTER", "BOUND"
    );
    for m in &s.models {
        let _ = writeln!(
            out,
            "{:<32} {:>6} {:>7} {:>6} {:>6}",
            m.model, m.gpus_total, m.gpus_before, m.gpus_after, m.lower_bound
        );
    }
    let count = |c: Class| s.workloads.iter().filter(|w| w.class == c).count();
    let _ = writeln!(
        out,
        "workloads: {} shared, {} training, {} kept; {} warning(s)",
        count(Class::Shared),
        count(Class::Training),
        count(Class::Kept),
        s.warnings.len()
    );
    for p in &s.pools {
        let _ = writeln!(
            out,
            "pool {} ({} node{}): {}",
            p.name,
            p.nodes,
            if p.nodes == 1 { "" } else { "s" },
            p.gpus.join(" | ")
        );
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Colour of a 0–1 utilisation: grey-blue (idle) to orange (busy).
fn heat(u: f64) -> String {
    let u = u.clamp(0.0, 1.0);
    let r = (220.0 * u + 30.0) as u8;
    let g = (120.0 - 40.0 * u) as u8;
    let b = (200.0 * (1.0 - u) + 30.0) as u8;
    format!("#{r:02x}{g:02x}{b:02x}")
}

const CELL: usize = 14;
const PER_ROW: usize = 64;

fn grid_svg(cells: &[(String, String)], title: &str) -> String {
    let rows = cells.len().div_ceil(PER_ROW).max(1);
    let width = PER_ROW * CELL;
    let height = rows * CELL;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"{}\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\">",
        esc(title)
    );
    for (i, (fill, tip)) in cells.iter().enumerate() {
        let x = (i % PER_ROW) * CELL;
        let y = (i / PER_ROW) * CELL;
        let _ = write!(
            svg,
            "<rect x=\"{x}\" y=\"{y}\" width=\"{}\" height=\"{}\" fill=\"{fill}\"><title>{}</title></rect>",
            CELL - 2,
            CELL - 2,
            esc(tip)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// The HTML report.
pub(crate) fn html(a: &Advice, s: &Summary) -> String {
    let mut h = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>gpu-slicer advise</title>\n<style>body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left}th{background:#f0f0f0}.n{text-align:right}.warn{color:#a40}h2{margin-top:1.5em}</style></head><body>\n<h1>gpu-slicer advise</h1>\n",
    );
    let _ = writeln!(
        h,
        "<p>Source: {} metrics over {:.1} days; headroom {:.0} % over each peak.</p>",
        esc(&s.source),
        s.window_seconds / 86400.0,
        a.settings.memory_headroom * 100.0
    );
    h.push_str("<h2>Before and after</h2>\n<table><tr><th></th><th class=\"n\">before</th><th class=\"n\">after</th></tr>\n");
    let _ = write!(
        h,
        "<tr><td>GPUs busy</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n<tr><td>mean utilisation</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n<tr><td>memory used / granted</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n<tr><td>GPUs freed</td><td></td><td class=\"n\">{}</td></tr>\n<tr><td>lower bound</td><td></td><td class=\"n\">{}{}</td></tr>\n",
        s.gpus_before,
        s.gpus_after,
        pct(s.utilization_before),
        pct(s.utilization_after),
        pct(s.memory_used_over_granted_before),
        pct(s.memory_used_over_granted_after),
        s.gpus_freed,
        s.lower_bound,
        if s.exact { " (packed exactly)" } else { "" }
    );
    if let (Some(m), Some(p)) = (s.savings_per_month, a.settings.gpu_hour_price) {
        let _ = writeln!(
            h,
            "<tr><td>saved per month at {p} per GPU-hour</td><td></td><td class=\"n\">{m:.0}</td></tr>"
        );
    }
    h.push_str("</table>\n");

    h.push_str("<h2>Utilisation per GPU, before</h2>\n<p>One square per GPU, by node; grey-blue is idle, orange busy; GPUs held by no pod are pale.</p>\n");
    let before: Vec<(String, String)> = a
        .gpus_before
        .iter()
        .map(|(uuid, node, model, u, held)| {
            let fill = if *held { heat(*u) } else { "#e4e8ee".into() };
            (
                fill,
                format!(
                    "{node} {uuid} {model}: {}{}",
                    pct(*u),
                    if *held { "" } else { " (not held)" }
                ),
            )
        })
        .collect();
    h.push_str(&grid_svg(&before, "utilisation per GPU before"));

    h.push_str("\n<h2>Packed layout, after</h2>\n<p>One bar per packed GPU: MIG instances and replicas as segments (width: their share of the GPU), coloured by the projected utilisation of the workload on them; white is free.</p>\n");
    let bins: Vec<(&super::ModelPlan, &super::PackedGpu)> = a
        .models
        .iter()
        .flat_map(|m| m.bins.iter().map(move |b| (m, b)))
        .collect();
    let bar_w = 120usize;
    let per_row = 8usize;
    let rows = bins.len().div_ceil(per_row).max(1);
    let (width, height) = (per_row * (bar_w + 8), rows * 22);
    let _ = write!(
        h,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"packed layout after\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\">"
    );
    for (i, (m, b)) in bins.iter().enumerate() {
        let x0 = (i % per_row) * (bar_w + 8);
        let y = (i / per_row) * 22;
        let _ = write!(
            h,
            "<rect x=\"{x0}\" y=\"{y}\" width=\"{bar_w}\" height=\"18\" fill=\"#fff\" stroke=\"#888\"><title>{}</title></rect>",
            esc(&format!(
                "{} {}: {}",
                m.slug,
                describe(&b.shape),
                pct(b.utilization)
            ))
        );
        let segs: Vec<(f64, usize)> = match &b.shape {
            GpuShape::Whole => b.workloads.iter().map(|&w| (1.0, w)).collect(),
            GpuShape::Mig(_) => b
                .workloads
                .iter()
                .map(|&w| {
                    let frac = match &a.grants[w].share {
                        Share::Shared(ShareKind::Mig(p)) => node_spec::gi_profile(&m.model, p)
                            .map_or(0.0, |g| f64::from(g.memory_slices) / 8.0),
                        _ => 0.0,
                    };
                    (frac, w)
                })
                .collect(),
            GpuShape::Replicas { replicas, .. } => b
                .workloads
                .iter()
                .map(|&w| (1.0 / *replicas as f64, w))
                .collect(),
        };
        let mut x = x0 as f64;
        for (frac, w) in segs {
            let wl = &a.workloads[w];
            let sw = frac * bar_w as f64;
            let _ = write!(
                h,
                "<rect x=\"{x:.1}\" y=\"{}\" width=\"{:.1}\" height=\"16\" fill=\"{}\" stroke=\"#fff\"><title>{}</title></rect>",
                y + 1,
                sw.max(1.0),
                heat(wl.compute_mean),
                esc(&format!(
                    "{}/{} ({})",
                    wl.namespace,
                    wl.name,
                    share_words(a, w)
                ))
            );
            x += sw;
        }
    }
    h.push_str("</svg>\n");

    h.push_str("<h2>Workloads: peak and p99 memory against the share</h2>\n<table><tr><th>workload</th><th>class</th><th>share</th><th class=\"n\">peak</th><th class=\"n\">p99</th><th class=\"n\">grant</th><th>memory (bar: grant; dark: peak; line: p99)</th><th>why</th></tr>\n");
    for w in &s.workloads {
        let scale = 160.0 / w.grant_memory_bytes.max(w.peak_memory_bytes).max(1) as f64;
        let gw = w.grant_memory_bytes as f64 * scale;
        let pw = w.peak_memory_bytes as f64 * scale;
        let p99 = w.p99_memory_bytes as f64 * scale;
        let _ = writeln!(
            h,
            "<tr><td>{}/{}</td><td>{}</td><td>{}</td><td class=\"n\">{:.1} GiB</td><td class=\"n\">{:.1} GiB</td><td class=\"n\">{:.1} GiB</td><td><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"164\" height=\"14\" viewBox=\"0 0 164 14\"><rect x=\"0\" y=\"1\" width=\"{gw:.1}\" height=\"12\" fill=\"#cfe0f5\"/><rect x=\"0\" y=\"4\" width=\"{pw:.1}\" height=\"6\" fill=\"#27548a\"/><line x1=\"{p99:.1}\" y1=\"0\" x2=\"{p99:.1}\" y2=\"14\" stroke=\"#c33\" stroke-width=\"2\"/></svg></td><td>{}</td></tr>",
            esc(&w.namespace),
            esc(&w.name),
            w.class.as_str(),
            esc(&w.share),
            w.peak_memory_bytes as f64 / GIB,
            w.p99_memory_bytes as f64 / GIB,
            w.grant_memory_bytes as f64 / GIB,
            esc(&w.reason)
        );
    }
    h.push_str("</table>\n<h2>Warnings</h2>\n");
    if s.warnings.is_empty() {
        h.push_str("<p>None.</p>\n");
    } else {
        h.push_str("<ul>\n");
        for w in &s.warnings {
            let _ = writeln!(h, "<li class=\"warn\">{}</li>", esc(w));
        }
        h.push_str("</ul>\n");
    }
    h.push_str("</body></html>\n");
    h
}
