//! The whole reload as one pure function: from the current [`Snapshot`] and a (re)loaded
//! config and inventory, compute the next snapshot, the CDI spec to write (with every
//! device still held) and the per-resource diff. The MPS daemon set is part of the
//! snapshot; [`mps_change`] says how the running set must change (the MPS reconciler
//! applies it against the daemons it actually runs).
//!
//! Startup is a transition from the empty snapshot (whose `spec` is the one an earlier run
//! left on disk and whose held set is the checkpoint), so start and reload share one code
//! path. The runtime's reloader does the I/O around it: load and discover before, write the
//! spec and commit the snapshot to the store after.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::domain::cdi::generate::{GenerateOptions, NodeInfo};
use crate::domain::cdi::shares::{HookSettings, ShareOptions};
use crate::domain::cdi::{self, CdiError, ContainerEdits, Spec};
use crate::domain::config::Config;
use crate::domain::devnodes::{DeviceNodes, MissingCapMinor};
use crate::domain::inventory::Inventory;
use crate::domain::mps::{DaemonSpec, MpsError};
use crate::domain::plan::{self, Plan, PlanDiff, PlanError};
use crate::domain::snapshot::{Computed, Snapshot};

/// Why a transition was refused (the current snapshot keeps serving).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TransitionError {
    /// The config does not fit this node.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The spec could not be built.
    #[error(transparent)]
    Cdi(#[from] CdiError),
    /// The MPS daemons could not be derived.
    #[error(transparent)]
    Mps(#[from] MpsError),
    /// A MIG device has no capability nodes.
    #[error(transparent)]
    Nodes(#[from] MissingCapMinor),
}

/// Facts about the host the platform gathered for this transition.
#[derive(Debug, Clone, Default)]
pub(crate) struct Host {
    /// Device nodes found under the dev root, by host path (see
    /// [`DeviceNodes::all_paths`]).
    pub(crate) nodes: BTreeMap<PathBuf, NodeInfo>,
    /// The hook the share devices run (`None`: the spec has no share devices).
    pub(crate) hook: Option<HookSettings>,
    /// Spec-level edits carrying the host's user-space driver, when discovered.
    pub(crate) driver: Option<ContainerEdits>,
    /// No working driver (`failOnInitError: false`): serve nothing, write no spec.
    pub(crate) no_driver: bool,
}

/// How the MPS daemon set changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MpsChange {
    /// Daemons to start (new, or changed: stop the old one first).
    pub(crate) start: Vec<DaemonSpec>,
    /// UUIDs of daemons to stop (gone, or changed).
    pub(crate) stop: Vec<String>,
    /// UUIDs of daemons that stay as they are.
    pub(crate) keep: Vec<String>,
}

/// What a transition computed: the computed part of the next snapshot (commit it with
/// `Store::commit`, which adds the generation, health overlay, views and held set of the
/// moment) and the diff.
#[derive(Debug, Clone)]
pub(crate) struct Next {
    /// The spec to write before committing is `state.spec`; `state.kept` are the CDI
    /// devices carried over from the previous spec because they are still held.
    pub(crate) state: Computed,
    /// Per-resource changes against the current plan.
    pub(crate) diff: PlanDiff,
}

/// The device nodes of `inventory`, derived once per reload: the platform probes their
/// paths and [`next`] serves them. None without a working driver.
pub(crate) fn device_nodes(
    inventory: &Inventory,
    no_driver: bool,
) -> Result<DeviceNodes, TransitionError> {
    if no_driver {
        return Ok(DeviceNodes::default());
    }
    Ok(DeviceNodes::new(inventory)?)
}

/// Compute the next state. Pure: every fact about the host arrives in `host`; `nodes` are
/// [`device_nodes`] of `inventory`.
pub(crate) fn next(
    current: &Snapshot,
    config: Arc<Config>,
    inventory: Arc<Inventory>,
    nodes: Arc<DeviceNodes>,
    host: &Host,
) -> Result<Next, TransitionError> {
    // No devices: the config's resources cannot be checked against this node, so serve none.
    let (plan, skipped) = if host.no_driver {
        (Plan::default(), Vec::new())
    } else {
        let planned = plan::build_reporting(&inventory, &config)?;
        (planned.plan, planned.skipped)
    };
    let daemons = crate::domain::mps::daemons_for(&plan, &config)?;
    let plan = Arc::new(plan);
    let (spec, kept) = if host.no_driver || inventory.gpus.is_empty() {
        (None, Vec::new())
    } else {
        let spec = build_spec(&inventory, &plan, &config, host)?;
        let held = current.held.cdi_names();
        let (spec, kept) = keep_held(spec, current.spec.as_deref(), &held)?;
        (Some(spec), kept)
    };
    let diff = plan::diff(&current.plan, &plan);
    let state = Computed {
        config,
        inventory,
        plan,
        nodes,
        spec: spec.map(Arc::new),
        kept: Arc::new(kept),
        skipped: Arc::new(skipped),
        mps: Arc::new(daemons),
    };
    Ok(Next { state, diff })
}

/// The spec of the inventory and the plan's shares (before held devices are carried over).
fn build_spec(
    inventory: &Inventory,
    plan: &Arc<Plan>,
    config: &Config,
    host: &Host,
) -> Result<Spec, CdiError> {
    let dev_root = (config.dev_root != Path::new("/")).then(|| config.dev_root.clone());
    let opts = GenerateOptions {
        kind: config.cdi_kind.clone(),
        dev_root,
        shares: host.hook.clone().map(|hook| ShareOptions {
            plan: Arc::clone(plan),
            mps_root: config.mps_root.clone(),
            hook,
        }),
        // The driver's edits are merged below (from `host.driver`).
        driver: None,
    };
    let mut spec = cdi::generate::generate(inventory, &opts, &host.nodes)?;
    if let Some(driver) = &host.driver {
        merge_edits(&mut spec.container_edits, driver);
        spec.cdi_version = cdi::minimum_version(&spec).to_string();
        cdi::validate(&spec)?;
    }
    Ok(spec)
}

/// Append `extra` to `edits` (the driver's mounts, hooks and env after the device edits).
fn merge_edits(edits: &mut ContainerEdits, extra: &ContainerEdits) {
    edits.env.extend(extra.env.iter().cloned());
    edits
        .device_nodes
        .extend(extra.device_nodes.iter().cloned());
    edits.mounts.extend(extra.mounts.iter().cloned());
    edits.hooks.extend(extra.hooks.iter().cloned());
}

/// Carry every device of `previous` that `held` names and `spec` lacks into `spec`, so a
/// container holding it can restart. Returns the merged spec and the names carried.
pub(crate) fn keep_held(
    mut spec: Spec,
    previous: Option<&Spec>,
    held: &BTreeSet<String>,
) -> Result<(Spec, Vec<String>), CdiError> {
    let mut kept = Vec::new();
    if let Some(previous) = previous.filter(|p| p.kind == spec.kind && !held.is_empty()) {
        let have: BTreeSet<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        let carried: Vec<cdi::Device> = previous
            .devices
            .iter()
            .filter(|d| held.contains(&d.name) && !have.contains(d.name.as_str()))
            .cloned()
            .collect();
        for device in carried {
            kept.push(device.name.clone());
            spec.devices.push(device);
        }
    }
    if !kept.is_empty() {
        spec.devices.sort_by(|a, b| a.name.cmp(&b.name));
        // A kept device may use a newer spec feature than the generated ones.
        spec.cdi_version = cdi::minimum_version(&spec).to_string();
        cdi::validate(&spec)?;
    }
    Ok((spec, kept))
}

/// Which daemons start, stop or stay, by UUID: only changed daemons restart.
pub(crate) fn mps_change(current: &[DaemonSpec], next: &[DaemonSpec]) -> MpsChange {
    let old: BTreeMap<&str, &DaemonSpec> = current.iter().map(|d| (d.uuid.as_str(), d)).collect();
    let new: BTreeMap<&str, &DaemonSpec> = next.iter().map(|d| (d.uuid.as_str(), d)).collect();
    let mut change = MpsChange::default();
    for (uuid, spec) in &new {
        match old.get(uuid) {
            Some(o) if o == spec => change.keep.push((*uuid).to_string()),
            Some(_) => {
                change.stop.push((*uuid).to_string());
                change.start.push((*spec).clone());
            }
            None => change.start.push((*spec).clone()),
        }
    }
    change.stop.extend(
        old.keys()
            .filter(|u| !new.contains_key(*u))
            .map(|u| (*u).to_string()),
    );
    change.stop.sort();
    change
}

#[cfg(test)]
mod transition_tests;
