//! `gpu-slicer dra …`.
//!
//! `dra slices` prints the ResourceSlices (and with `--classes` the DeviceClasses) this node
//! would publish, without an API server: discover, plan, build through
//! [`crate::domain::dra`], print YAML (documents separated by `---`) or JSON (a `v1` List).
//! For operators, and for checking the objects with `kubernetes-validate --strict` in CI.
//!
//! `dra check-claim FILE` checks the ResourceClaims and ResourceClaimTemplates of a YAML file
//! before they are applied ([`crate::domain::dra::check`]): opaque configs with Prepare's
//! parser, and the names their selectors use against the slices `dra slices` would print for
//! the same `--backend` and `--config`. Exit 2 names the file, document, field and value.
//! The DRA flags of `run` are in [`super::dra_args`].

use std::io::Write;

use crate::cli::args::{BackendArgs, PlanConfigArgs};
use crate::cli::error::Result;
use crate::domain::dra::{self, check, classes, slices};
use crate::domain::plan;
use crate::domain::view::Overlay;

/// `gpu-slicer dra` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum DraCommand {
    /// Print the ResourceSlices this node would publish (and DeviceClasses with --classes).
    Slices(Box<SlicesArgs>),
    /// Check the ResourceClaims and ResourceClaimTemplates of a YAML file against this node
    /// (opaque config, selector names) before applying them.
    CheckClaim(Box<CheckClaimArgs>),
}

/// Arguments of `dra check-claim`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CheckClaimArgs {
    /// The YAML file (one or more documents; kinds other than ResourceClaim and
    /// ResourceClaimTemplate are skipped).
    #[arg(value_name = "FILE")]
    pub(crate) file: std::path::PathBuf,
    /// `--backend` and NVML settings: the node whose published names selectors must use.
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// `--config` and the flags that override it.
    #[command(flatten)]
    pub(crate) config: PlanConfigArgs,
    /// The DRA driver name.
    #[arg(long = "dra-driver-name", env = "DRA_DRIVER_NAME", default_value = dra::DEFAULT_DRIVER_NAME)]
    pub(crate) driver_name: String,
}

/// Output of `dra slices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SliceFormat {
    /// YAML documents separated by `---`.
    Yaml,
    /// One JSON `v1` List.
    Json,
}

/// Arguments of `dra slices`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SlicesArgs {
    /// `--backend` and NVML settings.
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// `--config` and the flags that override it here (those that change the plan).
    #[command(flatten)]
    pub(crate) config: PlanConfigArgs,
    /// The node (and pool) name (default: the host name).
    #[arg(long, env = "NODE_NAME")]
    pub(crate) node_name: Option<String>,
    /// The DRA driver name.
    #[arg(long = "dra-driver-name", env = "DRA_DRIVER_NAME", default_value = dra::DEFAULT_DRIVER_NAME)]
    pub(crate) driver_name: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = SliceFormat::Yaml)]
    pub(crate) format: SliceFormat,
    /// Also print the driver's DeviceClasses.
    #[arg(long)]
    pub(crate) classes: bool,
    /// The Kubernetes version the slices are for (`1.34`, `v1.35.2`): dynamic MIG counter
    /// sets share slices with their devices up to 1.34 and have slices of their own from 1.35.
    #[arg(long, value_name = "MAJOR.MINOR", default_value = "1.36")]
    pub(crate) server_version: String,
}

/// The slice layout of `--server-version` (`1.34`, `v1.35.2`).
fn server_format(version: &str) -> Result<slices::SliceFormat> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split('.');
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor))
            if !major.is_empty()
                && major.bytes().all(|b| b.is_ascii_digit())
                && minor.bytes().all(|b| b.is_ascii_digit())
                && !minor.is_empty() =>
        {
            // resource.k8s.io/v1, the only DRA API this driver speaks, is served from 1.34.
            let too_old = match major.parse::<u32>() {
                Ok(0) => true,
                Ok(1) => minor
                    .parse::<u32>()
                    .is_ok_and(|m| m < dra::MIN_SERVER_MINOR),
                _ => false,
            };
            if too_old {
                return Err(dra::DraError::ServerTooOld {
                    value: version.to_string(),
                }
                .into());
            }
            Ok(slices::SliceFormat::for_server(major, minor))
        }
        _ => Err(dra::DraError::ServerVersion {
            value: version.to_string(),
        }
        .into()),
    }
}

/// Run a `dra` subcommand.
pub(crate) fn run(cmd: &DraCommand, out: &mut dyn Write) -> Result<()> {
    match cmd {
        DraCommand::Slices(args) => slices_cmd(args, out),
        DraCommand::CheckClaim(args) => check_claim_cmd(args, out),
    }
}

fn check_claim_cmd(args: &CheckClaimArgs, out: &mut dyn Write) -> Result<()> {
    use serde::Deserialize;
    dra::check_driver_name(&args.driver_name)?;
    let file = args.file.display().to_string();
    let bad = |message: String| dra::DraError::ClaimFile {
        file: file.clone(),
        message,
    };
    let text = std::fs::read_to_string(&args.file).map_err(|e| bad(e.to_string()))?;
    let mut docs = Vec::new();
    for (i, d) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
        let v = serde_json::Value::deserialize(d)
            .map_err(|e| bad(format!("document {i}: not YAML: {e}")))?;
        docs.push(v);
    }
    // Any node name does: the names published do not depend on it.
    let devices = node_devices(&args.backend, &args.config)?;
    let target = slices::SliceTarget {
        driver: &args.driver_name,
        node_name: "check-claim",
        node_uid: None,
        generation: 1,
    };
    let built = slices::build_for(&target, &devices, slices::SliceFormat::Split);
    let published = check::Published::of(
        built.iter().flat_map(|s| s.spec.devices.iter()),
        &args.driver_name,
    );
    let checked = check::check(&docs, &args.driver_name, &published).map_err(|problems| {
        dra::DraError::Claims {
            file: file.clone(),
            problems,
        }
    })?;
    for c in &checked {
        writeln!(
            out,
            "{file}: document {} ({} {}): ok: {} request(s), {} opaque config(s) of {}, {} selector(s) and constraint(s)",
            c.doc, c.kind, c.name, c.requests, c.configs, args.driver_name, c.selectors
        )?;
    }
    if checked.is_empty() {
        writeln!(
            out,
            "{file}: no ResourceClaim or ResourceClaimTemplate in it"
        )?;
    }
    Ok(())
}

/// Discover, plan and list the devices a node publishes (with its dynamic-MIG warnings
/// logged).
fn node_devices(backend: &BackendArgs, config: &PlanConfigArgs) -> Result<slices::NodeDevices> {
    let config = config.load()?;
    let backend = super::backend::open_backend(backend)?;
    let inventory = backend.discover()?;
    let plan = plan::build(&inventory, &config)?;
    // Offline there are no health events: only what discovery found unhealthy is tainted.
    let health = slices::health_map(&inventory, &plan, &Overlay::default());
    let devices =
        slices::node_devices_with(&inventory, &plan, &health, config.dra.dynamic_mig.as_ref());
    for w in &devices.warnings {
        tracing::warn!(warning = %w, "dynamic MIG");
    }
    Ok(devices)
}

fn slices_cmd(args: &SlicesArgs, out: &mut dyn Write) -> Result<()> {
    dra::check_driver_name(&args.driver_name)?;
    let node = super::dra_args::node_name(args.node_name.as_deref())?;
    let format = server_format(&args.server_version)?;
    let devices = node_devices(&args.backend, &args.config)?;
    let target = slices::SliceTarget {
        driver: &args.driver_name,
        node_name: &node,
        node_uid: None,
        generation: 1,
    };
    let mut objects: Vec<serde_json::Value> = Vec::new();
    if args.classes {
        for c in classes::build(&args.driver_name) {
            objects.push(serde_json::to_value(c)?);
        }
    }
    for s in slices::build_for(&target, &devices, format) {
        objects.push(serde_json::to_value(s)?);
    }
    match args.format {
        SliceFormat::Json => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
            serde_json::to_writer_pretty(&mut *out, &list)?;
            writeln!(out)?;
        }
        SliceFormat::Yaml => {
            for o in &objects {
                writeln!(out, "---")?;
                out.write_all(crate::domain::cdi::yaml::emit_value(o).as_bytes())?;
            }
        }
    }
    Ok(())
}
