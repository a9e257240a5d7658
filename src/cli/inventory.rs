//! `gpu-slicer inventory`: discover, plan, and print GPU → MIG slices → resources.
//!
//! The JSON form is a contract for scripts: an object with `gpus` (the inventory) and
//! `resources` (`name`, `devices[]` with `id`, `health`, `gpu`, …), sorted and stable.
//! `--topology` prints the GPU-pair matrix instead (`nvidia-smi topo -m` cells).

use std::io::Write;

use serde::Serialize;

use crate::cli::args::{InventoryArgs, OutputFormat};
use crate::cli::error::Result;
use crate::domain::inventory::{Gpu, Health, Inventory};
use crate::domain::plan::{self, Plan};

/// Run `inventory`.
pub(crate) fn run(args: &InventoryArgs, out: &mut dyn Write) -> Result<()> {
    let config = args.config.load()?;
    let backend = super::backend::open_backend(&args.backend)?;
    let inventory = backend.discover()?;
    if args.topology {
        return write_topology(out, &inventory, args.format);
    }
    // The skipped entries are logged as every command logs them (the mixed-cluster rule)
    // and also go in the output itself: a config that names a GPU the node lacks is the
    // mistake a newcomer must see.
    let planned = plan::build_reporting(&inventory, &config)?;
    crate::runtime::report::log_skipped(&config.source, &planned.skipped);
    let skipped = planned.skipped.clone();
    let plan = if args.strict {
        planned.strict(&config.source)?
    } else {
        planned.plan
    };
    match args.format {
        OutputFormat::Json => {
            let report = Report::new(&inventory, &plan).with_skipped(&skipped);
            serde_json::to_writer_pretty(&mut *out, &report)?;
            writeln!(out)?;
        }
        OutputFormat::Table => {
            write_table(out, &inventory, &config, &plan)?;
            write_skipped(out, &skipped)?;
        }
    }
    Ok(())
}

/// The config entries skipped on this node, after the resources table.
fn write_skipped(out: &mut dyn Write, skipped: &[plan::Skipped]) -> std::io::Result<()> {
    if skipped.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(
        out,
        "SKIPPED CONFIG ENTRIES (kept for other nodes of a mixed cluster; --strict refuses them)"
    )?;
    for s in skipped {
        writeln!(out, "  {} = {}", s.field, s.value)?;
        writeln!(
            out,
            "      {} (node has {})",
            s.reason.explain(),
            s.node_has
        )?;
    }
    Ok(())
}

/// `--topology`: the matrix, or its JSON (`null` without a topology).
fn write_topology(out: &mut dyn Write, inv: &Inventory, format: OutputFormat) -> Result<()> {
    let report = inv
        .topology
        .as_ref()
        .map(crate::domain::usage::TopologyReport::new);
    match (format, &inv.topology) {
        (OutputFormat::Json, _) => {
            serde_json::to_writer_pretty(&mut *out, &report)?;
            writeln!(out)?;
        }
        (OutputFormat::Table, Some(t)) => write!(out, "{}", t.render())?,
        (OutputFormat::Table, None) => writeln!(
            out,
            "no topology: {} reports no GPU-pair links (node file without a `topology` section, or a driver that answers no topology call)",
            inv.source
        )?,
    }
    Ok(())
}

/// The JSON document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Report<'a> {
    source: &'a str,
    driver_version: Option<&'a str>,
    gpus: &'a [Gpu],
    resources: Vec<ResourceReport<'a>>,
    /// Config entries this node has nothing for (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    skipped: Vec<SkippedReport<'a>>,
}

/// One skipped config entry or device reference.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SkippedReport<'a> {
    /// Config path, e.g. `sharing.timeSlicing.resources[0].devices[0]`.
    field: &'a str,
    /// The value as the config wrote it.
    value: &'a str,
    /// Short code (`device-not-on-node`, …), as the metric labels it.
    reason: plan::SkipReason,
    /// What the node has instead.
    node_has: &'a str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceReport<'a> {
    name: &'a str,
    kind: plan::ResourceKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    sharing: Option<&'a plan::Sharing>,
    devices: Vec<DeviceReport<'a>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DeviceReport<'a> {
    id: &'a str,
    health: Health,
    /// Parent GPU UUID.
    gpu: &'a str,
    /// The physical device (GPU or MIG UUID).
    physical: &'a str,
    /// NVIDIA's index name, `i` or `i:j`.
    index: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    replica: Option<u32>,
    memory_bytes: u64,
    compute_percent: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    numa_node: Option<i64>,
}

impl<'a> Report<'a> {
    /// Build the report of an inventory and its plan.
    pub(crate) fn new(inventory: &'a Inventory, plan: &'a Plan) -> Self {
        Self {
            source: &inventory.source,
            driver_version: inventory.driver_version.as_deref(),
            gpus: &inventory.gpus,
            resources: plan
                .resources
                .iter()
                .map(|r| ResourceReport {
                    name: &r.name,
                    kind: r.kind,
                    sharing: r.sharing.as_ref(),
                    devices: r
                        .devices
                        .iter()
                        .map(|d| DeviceReport {
                            id: &d.id,
                            health: d.health,
                            gpu: &d.physical.gpu_uuid,
                            physical: &d.physical.uuid,
                            index: d.physical.index_name(),
                            replica: d.replica.map(|r| r.index),
                            memory_bytes: d.share.memory_bytes,
                            compute_percent: d.share.compute_percent,
                            numa_node: d.numa_node,
                        })
                        .collect(),
                })
                .collect(),
            skipped: Vec::new(),
        }
    }

    /// The report with the config entries this node skipped.
    fn with_skipped(mut self, skipped: &'a [plan::Skipped]) -> Self {
        self.skipped = skipped
            .iter()
            .map(|s| SkippedReport {
                field: &s.field,
                value: &s.value,
                reason: s.reason,
                node_has: &s.node_has,
            })
            .collect();
        self
    }
}

fn gib(bytes: u64) -> String {
    let g = bytes as f64 / (1u64 << 30) as f64;
    if (g - g.round()).abs() < 0.05 {
        format!("{g:.0} GiB")
    } else {
        format!("{g:.1} GiB")
    }
}

fn write_table(
    out: &mut dyn Write,
    inv: &Inventory,
    cfg: &crate::domain::config::Config,
    plan: &Plan,
) -> std::io::Result<()> {
    writeln!(
        out,
        "node {}  driver {}  config {}  migStrategy {}",
        inv.source,
        inv.driver_version.as_deref().unwrap_or("?"),
        cfg.source,
        serde_json::to_value(cfg.mig_strategy)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<6} {:<44} {:<24} {:>9} {:>5}  MIG",
        "GPU", "UUID", "PRODUCT", "MEMORY", "NUMA"
    )?;
    for g in &inv.gpus {
        let mig = match (g.mig_mode.current, g.mig_mode.pending) {
            (true, true) => format!("on, {} devices", g.mig_devices.len()),
            (true, false) => format!("on (off after reset), {} devices", g.mig_devices.len()),
            (false, true) => "off (on after reset)".into(),
            (false, false) => "off".into(),
        };
        writeln!(
            out,
            "{:<6} {:<44} {:<24} {:>9} {:>5}  {mig}",
            g.index,
            g.uuid,
            g.product,
            gib(g.memory_bytes),
            g.numa_node.map_or("-".into(), |n| n.to_string()),
        )?;
        for m in &g.mig_devices {
            writeln!(
                out,
                "  {:<4} {:<44} {:<24} {:>9} {:>5}  gi {} ci {}",
                format!("{}:{}", g.index, m.index),
                m.uuid,
                m.profile,
                gib(m.memory_bytes),
                "",
                m.gpu_instance_id,
                m.compute_instance_id,
            )?;
        }
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<34} {:>7} {:>7}  {:<28} BACKED BY",
        "RESOURCE", "DEVICES", "HEALTHY", "SHARING"
    )?;
    for r in &plan.resources {
        let healthy = r
            .devices
            .iter()
            .filter(|d| d.health == Health::Healthy)
            .count();
        let sharing = match &r.sharing {
            None => "-".to_string(),
            Some(s) => {
                let per = r
                    .devices
                    .first()
                    .and_then(|d| d.replica)
                    .map_or(0, |x| x.of);
                format!(
                    "{} x{per} isolation={}",
                    match s.kind {
                        crate::domain::config::SharingKind::TimeSlicing => "timeSlicing",
                        crate::domain::config::SharingKind::Mps => "mps",
                    },
                    s.isolation.as_str()
                )
            }
        };
        let mut backing: Vec<String> = r.devices.iter().map(|d| d.physical.index_name()).collect();
        backing.dedup();
        writeln!(
            out,
            "{:<34} {:>7} {:>7}  {:<28} GPU {}",
            r.name,
            r.devices.len(),
            healthy,
            sharing,
            backing.join(", ")
        )?;
    }
    Ok(())
}
