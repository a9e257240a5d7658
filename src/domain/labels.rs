//! Node labels for workload-aware scheduling, under GPU Feature Discovery's names.
//!
//! A pure function of the inventory, the config and the plan: [`build`] returns the label
//! set NVIDIA's GPU Feature Discovery (GFD) would publish for the same node and config, so
//! node selectors written for GFD keep working, plus gpu-slicer's own
//! `gpu-slicer.io/isolation`. The runtime's labels writer (`crate::runtime::labels`) puts it
//! into a Node Feature Discovery feature file through `crate::platform::labels_file`;
//! `gpu-slicer labels` prints it.
//!
//! GFD's rules, as observed in NVIDIA/k8s-device-plugin v0.20.0 `internal/lm`:
//! - `nvidia.com/gpu.product` is the NVML product name with characters outside
//!   `[A-Za-z0-9-_. ]` dropped and runs of blanks turned into one `-`; `-SHARED` is appended
//!   when the resource has replicas > 1 and is not renamed; under `migStrategy: single` it is
//!   `<product>-MIG-<profile>` (`<product>-MIG-INVALID` when the node does not fit the
//!   strategy). Per product, MIG-enabled GPUs are labelled without sharing and whole GPUs
//!   override them; `gpu.count` counts every GPU of the product.
//! - `gpu.replicas` is 0 for a MIG-enabled-only product, the sharing entry's replicas when
//!   one names the resource, else 1; `gpu.sharing-strategy` is `none` unless replicas > 1,
//!   then `time-slicing` or `mps`.
//! - `gpu.family` from the compute capability (8.0 → ampere, 9.0 → hopper, …).
//! - `cuda.driver.*` split the *driver* version `X.Y[.Z]` (deprecated names GFD still
//!   writes, next to `cuda.driver-version.*`); `cuda.runtime.*` are the CUDA version.
//! - `nvidia.com/gpu.present=true` on any node with a GPU (the GPU Operator's selector).
//! - `nvidia.com/gpu.clique` when the GPUs are attached to a multi-node NVLink fabric
//!   (registration completed, SUCCESS, non-zero cluster UUID) and all share one clique.
//! - `mig.capable` when any GPU can do MIG; `mig.strategy` unless the strategy is `none`;
//!   under `mixed` every profile present gets `nvidia.com/mig-<profile>.{count,memory,…}`.
//!
//! Label values must be valid Kubernetes label values: [`label_value`] sanitises as GFD
//! does, then bounds the result to 63 characters starting and ending alphanumeric.

use std::collections::{BTreeMap, BTreeSet};

use crate::domain::config::{Config, Isolation, MigStrategy, SharingKind};
use crate::domain::inventory::{Gpu, Inventory, MigDevice};
use crate::domain::plan::{Plan, mig_resource_name};

/// The resource whole GPUs are advertised as (and MIG devices under `single`).
const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// gpu-slicer's own label: the isolation every share on the node gets.
pub(crate) const ISOLATION_LABEL: &str = "gpu-slicer.io/isolation";

/// GFD's multi-node NVLink clique label (`<cluster UUID>.<clique ID>`).
pub(crate) const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";

/// Longest label value Kubernetes accepts.
pub(crate) const MAX_VALUE_LEN: usize = 63;

/// Labels in key order, and what was odd about the node while computing them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct NodeLabels {
    /// `key -> value`, sorted by key.
    pub(crate) labels: BTreeMap<String, String>,
    /// Conditions worth a warning (several products, an invalid single-strategy layout,
    /// an unparsable driver version). Not part of the label set.
    pub(crate) warnings: Vec<String>,
}

impl NodeLabels {
    /// The feature-file form NFD reads: one `key=value` line per label, in key order.
    pub(crate) fn to_feature_file(&self) -> String {
        self.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect()
    }

    /// Whether there is nothing to label (no GPUs).
    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    fn set(&mut self, key: impl Into<String>, value: impl ToString) {
        self.labels.insert(key.into(), value.to_string());
    }
}

/// The labels of a node: its inventory under a config, with the plan for what is shared.
pub(crate) fn build(inv: &Inventory, cfg: &Config, plan: &Plan) -> NodeLabels {
    let mut out = NodeLabels::default();
    if inv.gpus.is_empty() {
        return out;
    }
    // The GPU Operator's node-selection label (its NFD rule sets it from the PCI vendor).
    out.set("nvidia.com/gpu.present", true);
    versions(inv, &mut out);
    let mig_capable = inv
        .gpus
        .iter()
        .any(|g| g.mig_compute_slices > 0 || g.mig_mode.current || g.mig_mode.pending);
    out.set("nvidia.com/mig.capable", mig_capable);
    out.set("nvidia.com/mps.capable", mps_capable(inv, cfg));
    full_gpus(inv, cfg, &mut out);
    match cfg.mig_strategy {
        MigStrategy::None => {}
        MigStrategy::Single => {
            out.set("nvidia.com/mig.strategy", "single");
            mig_single(inv, cfg, &mut out);
        }
        MigStrategy::Mixed => {
            out.set("nvidia.com/mig.strategy", "mixed");
            mig_mixed(inv, cfg, &mut out);
        }
    }
    clique(inv, &mut out);
    out.set(ISOLATION_LABEL, isolation_value(node_isolation(plan)));
    for v in out.labels.values_mut() {
        // Every value above is built from sanitised parts; this only guards the invariant.
        if !is_valid_label_value(v) {
            *v = label_value(v);
        }
    }
    out
}

/// `nvidia.com/gpu.clique` (GFD `internal/lm/imex.go`): the one clique every fabric-attached
/// GPU shares; none when no GPU is attached, a warning and none when they disagree.
fn clique(inv: &Inventory, out: &mut NodeLabels) {
    let cliques: BTreeSet<&str> = inv
        .gpus
        .iter()
        .filter_map(|g| g.fabric_clique.as_deref())
        .collect();
    match cliques.len() {
        0 => {}
        1 => {
            if let Some(c) = cliques.first() {
                out.set(CLIQUE_LABEL, c);
            }
        }
        _ => out.warnings.push(format!(
            "fabric-attached GPUs are in {} cliques ({}): no {CLIQUE_LABEL} label",
            cliques.len(),
            cliques.iter().copied().collect::<Vec<_>>().join(", ")
        )),
    }
}

/// Driver and CUDA version labels (old and new GFD names).
fn versions(inv: &Inventory, out: &mut NodeLabels) {
    if let Some(driver) = inv.driver_version.as_deref() {
        let parts: Vec<&str> = driver.split('.').collect();
        let well_formed = (2..=3).contains(&parts.len())
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if well_formed {
            let rev = parts.get(2).copied().unwrap_or("");
            for (old, new, v) in [
                ("major", "major", parts[0]),
                ("minor", "minor", parts[1]),
                ("rev", "revision", rev),
            ] {
                out.set(format!("nvidia.com/cuda.driver.{old}"), v);
                out.set(format!("nvidia.com/cuda.driver-version.{new}"), v);
            }
            out.set("nvidia.com/cuda.driver-version.full", driver);
        } else {
            out.warnings.push(format!(
                "driver version `{driver}` is not X.Y[.Z]: no nvidia.com/cuda.driver.* labels"
            ));
        }
    }
    if let Some(cuda) = inv.cuda_driver_version {
        let (major, minor) = (cuda / 1000, cuda % 1000 / 10);
        out.set("nvidia.com/cuda.runtime.major", major);
        out.set("nvidia.com/cuda.runtime.minor", minor);
        out.set("nvidia.com/cuda.runtime-version.major", major);
        out.set("nvidia.com/cuda.runtime-version.minor", minor);
        out.set(
            "nvidia.com/cuda.runtime-version.full",
            format!("{major}.{minor}"),
        );
    }
}

/// GFD: `true` only when MPS sharing is configured and no GPU has MIG on.
fn mps_capable(inv: &Inventory, cfg: &Config) -> bool {
    let mps = cfg
        .sharing
        .iter()
        .any(|s| s.kind == SharingKind::Mps && s.replicas > 1);
    mps && !inv.gpus.iter().any(|g| g.mig_mode.current)
}

/// How a resource is replicated, as the labels see it.
#[derive(Debug, Clone, Copy)]
struct Replication {
    /// `gpu.replicas`.
    replicas: u32,
    /// `gpu.sharing-strategy`.
    strategy: &'static str,
    /// Append `-SHARED` to the product.
    shared_suffix: bool,
}

impl Replication {
    /// MIG-enabled GPUs under the whole-GPU name: GFD labels them with sharing off.
    const OFF: Self = Self {
        replicas: 0,
        strategy: "none",
        shared_suffix: false,
    };

    /// The first sharing entry naming `resource` decides (GFD looks entries up by name).
    fn of(cfg: &Config, resource: &str) -> Self {
        match cfg.sharing.iter().find(|s| s.name == resource) {
            Some(s) if s.replicas > 1 => Self {
                replicas: s.replicas,
                strategy: match s.kind {
                    SharingKind::TimeSlicing => "time-slicing",
                    SharingKind::Mps => "mps",
                },
                shared_suffix: s.advertised_name == s.name,
            },
            Some(s) => Self {
                replicas: s.replicas,
                strategy: "none",
                shared_suffix: false,
            },
            None => Self {
                replicas: 1,
                strategy: "none",
                shared_suffix: false,
            },
        }
    }
}

/// `<resource>.{product,count,replicas,sharing-strategy}`.
fn base(out: &mut NodeLabels, resource: &str, parts: &[&str], count: usize, r: Replication) {
    out.set(
        format!("{resource}.product"),
        product(parts, r.shared_suffix),
    );
    out.set(format!("{resource}.count"), count);
    out.set(format!("{resource}.replicas"), r.replicas);
    out.set(format!("{resource}.sharing-strategy"), r.strategy);
}

/// The product value: sanitised parts joined by `-`, `-SHARED` when shared and not renamed.
fn product(parts: &[&str], shared_suffix: bool) -> String {
    let mut parts: Vec<String> = parts
        .iter()
        .map(|p| sanitise(p))
        .filter(|p| !p.is_empty())
        .collect();
    if shared_suffix && !parts.is_empty() {
        parts.push("SHARED".into());
    }
    label_value(&parts.join("-"))
}

/// `nvidia.com/gpu.*` from the whole GPUs, MIG-enabled ones first so whole ones override.
fn full_gpus(inv: &Inventory, cfg: &Config, out: &mut NodeLabels) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for g in &inv.gpus {
        *counts.entry(g.product.as_str()).or_default() += 1;
    }
    if counts.len() > 1 {
        let names: Vec<&str> = counts.keys().copied().collect();
        out.warnings.push(format!(
            "several GPU products on one node ({}): nvidia.com/gpu.* describe one of them",
            names.join(", ")
        ));
    }
    // One representative per product and MIG mode, the lowest index: GFD's pick is a map
    // iteration order, ours is stable.
    let pick = |mig: bool| {
        inv.gpus
            .iter()
            .filter(move |g| g.mig_mode.current == mig)
            .fold(Vec::<&Gpu>::new(), |mut seen, g| {
                if !seen.iter().any(|s| s.product == g.product) {
                    seen.push(g);
                }
                seen
            })
    };
    let sharing = Replication::of(cfg, GPU_RESOURCE);
    for (gpus, r) in [(pick(true), Replication::OFF), (pick(false), sharing)] {
        // The lowest-index product of each group wins within it (applied last).
        for g in gpus.iter().rev() {
            base(
                out,
                GPU_RESOURCE,
                &[&g.product],
                counts[g.product.as_str()],
                r,
            );
            out.set("nvidia.com/gpu.memory", g.memory_bytes >> 20);
            architecture(g, out);
        }
    }
}

/// `gpu.family`, `gpu.compute.major|minor` from `major.minor`.
fn architecture(g: &Gpu, out: &mut NodeLabels) {
    let mut it = g.compute_capability.split('.');
    let (Some(Ok(major)), Some(Ok(minor))) = (
        it.next().map(str::parse::<u32>),
        it.next().map(str::parse::<u32>),
    ) else {
        return;
    };
    if major == 0 {
        return;
    }
    out.set("nvidia.com/gpu.family", family(major, minor));
    out.set("nvidia.com/gpu.compute.major", major);
    out.set("nvidia.com/gpu.compute.minor", minor);
}

/// GFD's architecture family of a compute capability.
pub(crate) fn family(major: u32, minor: u32) -> &'static str {
    match (major, minor) {
        (1, _) => "tesla",
        (2, _) => "fermi",
        (3, _) => "kepler",
        (5, _) => "maxwell",
        (6, _) => "pascal",
        (7, m) if m < 5 => "volta",
        (7, _) => "turing",
        (8, m) if m < 9 => "ampere",
        (8, _) => "ada-lovelace",
        (9, _) => "hopper",
        (10 | 12, _) => "blackwell",
        (13, _) => "rubin",
        _ => "undefined",
    }
}

/// The profile as it appears in resource names and products: `+` becomes `.`.
fn profile_name(m: &MigDevice) -> String {
    m.profile.replace('+', ".")
}

/// MIG attribute labels GFD derives from the device: memory (MiB) and slices.
fn mig_attributes(out: &mut NodeLabels, resource: &str, m: &MigDevice) {
    out.set(format!("{resource}.memory"), m.memory_bytes >> 20);
    out.set(format!("{resource}.slices.gi"), m.compute_slices);
    // Every MIG device gpu-slicer plans has one compute instance spanning its GPU instance.
    out.set(format!("{resource}.slices.ci"), m.compute_slices);
}

/// `migStrategy: single`: the MIG devices are `nvidia.com/gpu`, so `gpu.*` describe them.
fn mig_single(inv: &Inventory, cfg: &Config, out: &mut NodeLabels) {
    let enabled: Vec<&Gpu> = inv.gpus.iter().filter(|g| g.mig_mode.current).collect();
    let Some(first) = enabled.first() else {
        return;
    };
    let profiles: BTreeSet<String> = inv.migs().map(|(_, m)| profile_name(m)).collect();
    let invalid = if enabled.iter().any(|g| g.mig_devices.is_empty()) {
        Some("at least one MIG-enabled GPU has no MIG devices")
    } else if enabled.len() != inv.gpus.len() {
        Some("GPUs with MIG enabled and disabled")
    } else if profiles.len() != 1 {
        Some("more than one MIG profile on the node")
    } else {
        None
    };
    if let Some(reason) = invalid {
        out.warnings.push(format!(
            "migStrategy single does not fit this node: {reason}"
        ));
        out.set(
            "nvidia.com/gpu.product",
            product(&[&first.product, "MIG", "INVALID"], false),
        );
        out.set("nvidia.com/gpu.count", 0);
        out.set("nvidia.com/gpu.replicas", 0);
        out.set("nvidia.com/gpu.sharing-strategy", "");
        out.set("nvidia.com/gpu.memory", 0);
        return;
    }
    let migs: Vec<(&Gpu, &MigDevice)> = inv.migs().collect();
    let (parent, m) = migs[0];
    let r = Replication::of(cfg, GPU_RESOURCE);
    base(
        out,
        GPU_RESOURCE,
        &[&parent.product, "MIG", &profile_name(m)],
        migs.len(),
        r,
    );
    mig_attributes(out, GPU_RESOURCE, m);
}

/// `migStrategy: mixed`: `nvidia.com/mig-<profile>.*` for every profile present.
fn mig_mixed(inv: &Inventory, cfg: &Config, out: &mut NodeLabels) {
    let mut by_profile: BTreeMap<String, (usize, &Gpu, &MigDevice)> = BTreeMap::new();
    for (g, m) in inv.migs() {
        by_profile
            .entry(profile_name(m))
            .and_modify(|e| e.0 += 1)
            .or_insert((1, g, m));
    }
    for (name, (count, parent, m)) in by_profile {
        let resource = mig_resource_name(&m.profile);
        let r = Replication::of(cfg, &resource);
        base(out, &resource, &[&parent.product, "MIG", &name], count, r);
        mig_attributes(out, &resource, m);
    }
}

/// What every share on the node binds: the isolation common to all shared resources
/// (memory limit, MPS, both), `none` when nothing is shared or they have nothing in common.
pub(crate) fn node_isolation(plan: &Plan) -> Isolation {
    let mut memory = true;
    let mut mps = true;
    let mut any = false;
    for s in plan.resources.iter().filter_map(|r| r.sharing.as_ref()) {
        any = true;
        memory &= s.isolation.uses_memory_limit();
        mps &= s.isolation.uses_mps();
    }
    match (any, memory, mps) {
        (false, _, _) | (true, false, false) => Isolation::None,
        (true, true, false) => Isolation::Memory,
        (true, false, true) => Isolation::Mps,
        (true, true, true) => Isolation::MemoryMps,
    }
}

/// The label value of an isolation level: the config spelling with `+` turned into `.`
/// (`memory+mps` → `memory.mps`), the rule NVIDIA uses for `+` in MIG profile resource
/// names, because `+` is not allowed in a label value.
pub(crate) fn isolation_value(i: Isolation) -> String {
    i.as_str().replace('+', ".")
}

/// GFD's sanitising: drop characters outside `[A-Za-z0-9-_. ]`, join blank-separated words
/// with `-`.
pub(crate) fn sanitise(input: &str) -> String {
    let kept: String = input
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
        .collect();
    kept.split_whitespace().collect::<Vec<_>>().join("-")
}

/// A valid label value for any input: sanitised as GFD does, cut to 63 characters, and
/// trimmed so it starts and ends with an alphanumeric character.
pub(crate) fn label_value(input: &str) -> String {
    let s = sanitise(input);
    let s: String = s.chars().take(MAX_VALUE_LEN).collect();
    s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Whether `v` is a valid Kubernetes label value: empty, or at most 63 characters of
/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`.
pub(crate) fn is_valid_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    if b.is_empty() {
        return true;
    }
    b.len() <= MAX_VALUE_LEN
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests;
