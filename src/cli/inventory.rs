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
    let plan = crate::runtime::report::plan_logged(&inventory, &config)?;
    match args.format {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &Report::new(&inventory, &plan))?;
            writeln!(out)?;
        }
        OutputFormat::Table => write_table(out, &inventory, &config, &plan)?,
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
        }
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
