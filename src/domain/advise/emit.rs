//! The plan as code: the files `advise --output DIR` writes, as (relative path, text) in a
//! sorted map, so that the same advice always gives the same bytes.
//!
//! - `configs/<pool>.yaml`, `configs/default.yaml`: NVIDIA `version: v1` configs, one per pool
//!   (Pools by label reads them as the keys of the `gpu-slicer-configs` ConfigMap); replicas are
//!   `sharing.timeSlicing` entries with the `isolation: memory` and `memory` extensions;
//! - `mig-parted.yaml`: mig-parted's format, one layout per pool with MIG GPUs (the same
//!   ConfigMap, key `mig-parted.yaml`, named by each config's `flags.migLayouts.file`);
//! - `node-labels.yaml` and `label-nodes.sh`: each node's `nvidia.com/device-plugin.config` and
//!   `nvidia.com/mig.config`;
//! - `requests.yaml`: the resources each workload's pods ask for;
//! - `claim-templates.yaml` (with `--dra`): a ResourceClaimTemplate per sharing candidate;
//! - `kustomization.yaml`: the ConfigMap generator and the claim templates.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::fleet::{DEFAULT_POOL, Pool, replica_resource};
use super::pack::GpuShape;
use super::workload::Class;
use super::{Advice, Share};

/// Where the agent of `deploy/label-configs/` sees the `gpu-slicer-configs` ConfigMap.
pub(crate) const CONFIG_DIR: &str = "/etc/gpu-slicer-configs";
/// The MIG layout file's key in that ConfigMap.
pub(crate) const MIG_FILE: &str = "mig-parted.yaml";
/// The label choosing a node's config.
pub(crate) const CONFIG_LABEL: &str = "nvidia.com/device-plugin.config";
/// The label choosing a node's MIG layout.
pub(crate) const MIG_LABEL: &str = "nvidia.com/mig.config";

const MIB: u64 = 1 << 20;

/// A shape in words: `MIG 1g.10gb×7`, `4 replicas of 19.9 GiB`, `whole`.
pub(crate) fn describe(shape: &GpuShape) -> String {
    match shape {
        GpuShape::Whole => "whole".into(),
        GpuShape::Mig(names) => {
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for n in names {
                *counts.entry(n).or_default() += 1;
            }
            let parts: Vec<String> = counts.iter().map(|(n, c)| format!("{n}×{c}")).collect();
            format!("MIG {}", parts.join(" "))
        }
        GpuShape::Replicas {
            replicas,
            memory_bytes,
        } => format!(
            "{replicas} replicas of {:.1} GiB",
            *memory_bytes as f64 / (1u64 << 30) as f64
        ),
    }
}

/// Indices with each distinct shape, in order of first index.
fn groups(shapes: &[GpuShape]) -> Vec<(&GpuShape, Vec<usize>)> {
    let mut out: Vec<(&GpuShape, Vec<usize>)> = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        match out.iter_mut().find(|(x, _)| *x == s) {
            Some((_, v)) => v.push(i),
            None => out.push((s, vec![i])),
        }
    }
    out
}

fn list(ix: &[usize]) -> String {
    let v: Vec<String> = ix.iter().map(usize::to_string).collect();
    format!("[{}]", v.join(", "))
}

fn has_mig(pool: &Pool) -> bool {
    pool.shapes.iter().any(|s| matches!(s, GpuShape::Mig(_)))
}

/// The config of a pool (`None`: the default config).
pub(crate) fn config(pool: Option<&Pool>) -> String {
    let mut out = String::new();
    match pool {
        None => out.push_str(
            "# gpu-slicer advise: nodes without sharing (training, kept and freed GPUs).\n",
        ),
        Some(p) => {
            let _ = writeln!(
                out,
                "# gpu-slicer advise: pool {}, {} node(s).",
                p.name, p.nodes
            );
            for (shape, ix) in groups(&p.shapes) {
                let _ = writeln!(out, "# GPUs {}: {}", list(&ix), describe(shape));
            }
        }
    }
    out.push_str("version: v1\nflags:\n  migStrategy: mixed\n");
    if let Some(p) = pool.filter(|p| has_mig(p)) {
        let _ = write!(
            out,
            "  migLayouts:\n    file: {CONFIG_DIR}/{MIG_FILE}\n    layout: {}\n",
            p.name
        );
    }
    out.push_str("  plugin:\n    deviceListStrategy: cdi-cri\n");
    let Some(p) = pool else {
        return out;
    };
    let replicas: Vec<(&GpuShape, Vec<usize>)> = groups(&p.shapes)
        .into_iter()
        .filter(|(s, _)| matches!(s, GpuShape::Replicas { .. }))
        .collect();
    if replicas.is_empty() {
        return out;
    }
    out.push_str("sharing:\n  timeSlicing:\n    resources:\n");
    for (shape, ix) in replicas {
        if let GpuShape::Replicas {
            replicas,
            memory_bytes,
        } = shape
        {
            let _ = write!(
                out,
                "    - name: nvidia.com/gpu\n      rename: {}\n      devices: {}\n      replicas: {replicas}\n      isolation: memory\n      memory: {}Mi\n",
                replica_resource(&p.slug, *replicas),
                list(&ix),
                memory_bytes / MIB
            );
        }
    }
    out
}

/// The mig-parted file: one layout per pool with MIG GPUs (`None` when no pool has any).
pub(crate) fn mig_parted(pools: &[Pool]) -> Option<String> {
    let mig: Vec<&Pool> = pools.iter().filter(|p| has_mig(p)).collect();
    if mig.is_empty() {
        return None;
    }
    let mut out = String::from(
        "# gpu-slicer advise: one layout per pool (nvidia.com/mig.config names it).\nversion: v1\nmig-configs:\n",
    );
    for p in mig {
        let _ = writeln!(out, "  {}:", p.name);
        let mut plain = Vec::new();
        for (shape, ix) in groups(&p.shapes) {
            let GpuShape::Mig(names) = shape else {
                plain.extend(ix);
                continue;
            };
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for n in names {
                *counts.entry(n).or_default() += 1;
            }
            let devs: Vec<String> = counts
                .iter()
                .map(|(n, c)| format!("\"{n}\": {c}"))
                .collect();
            let _ = write!(
                out,
                "    - devices: {}\n      mig-enabled: true\n      mig-devices: {{{}}}\n",
                list(&ix),
                devs.join(", ")
            );
        }
        if !plain.is_empty() {
            plain.sort_unstable();
            let _ = write!(
                out,
                "    - devices: {}\n      mig-enabled: false\n      mig-devices: {{}}\n",
                list(&plain)
            );
        }
    }
    Some(out)
}

/// A label value or node name as a single-quoted shell word.
fn sh(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A YAML double-quoted scalar.
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

/// Every file of the plan.
pub(crate) fn files(a: &Advice) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    files.insert(format!("configs/{DEFAULT_POOL}.yaml"), config(None));
    for p in &a.fleet.pools {
        files.insert(format!("configs/{}.yaml", p.name), config(Some(p)));
    }
    let mig = mig_parted(&a.fleet.pools);
    let mig_pools: Vec<&str> = a
        .fleet
        .pools
        .iter()
        .filter(|p| has_mig(p))
        .map(|p| p.name.as_str())
        .collect();

    let mut labels = String::from(
        "# gpu-slicer advise: the labels that put each node in its pool (Pools by label).\n",
    );
    let mut script = String::from(
        "#!/bin/sh\n# gpu-slicer advise: label each node into its pool (Pools by label).\nset -eu\n",
    );
    for n in &a.fleet.nodes {
        let _ = writeln!(labels, "{}:", q(&n.node));
        let _ = writeln!(labels, "  {CONFIG_LABEL}: {}", q(&n.pool));
        let _ = write!(
            script,
            "kubectl label node {} {CONFIG_LABEL}={}",
            sh(&n.node),
            sh(&n.pool)
        );
        if mig_pools.contains(&n.pool.as_str()) {
            let _ = writeln!(labels, "  {MIG_LABEL}: {}", q(&n.pool));
            let _ = write!(script, " {MIG_LABEL}={}", sh(&n.pool));
        } else {
            let _ = write!(script, " {MIG_LABEL}-");
        }
        script.push_str(" --overwrite\n");
    }
    files.insert("node-labels.yaml".into(), labels);
    files.insert("label-nodes.sh".into(), script);

    let mut requests = String::from(
        "# gpu-slicer advise: what each workload's pods ask for (resources.limits per pod).\n",
    );
    let mut claims = String::new();
    for (w, g) in a.workloads.iter().zip(&a.grants) {
        let _ = write!(
            requests,
            "- namespace: {}\n  name: {}\n  class: {}\n  limits:\n    {}: {}\n",
            q(&w.namespace),
            q(&w.name),
            w.class.as_str(),
            g.resource.0,
            g.resource.1
        );
        if a.settings.dra && w.class == Class::Shared && matches!(g.share, Share::Shared(_)) {
            let grant = super::grant_bytes(w, a.settings.memory_headroom);
            // The DRA memory capacity steps by 2 MiB.
            let mib = grant.div_ceil(2 * MIB) * 2;
            let compute = (w.compute_p95 * 100.0).ceil().clamp(1.0, 100.0) as u64;
            let _ = write!(
                claims,
                "---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata:\n  name: {}\n  namespace: {}\nspec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        exactly:\n          deviceClassName: gpu.gpu-slicer.io\n          selectors:\n          - cel:\n              expression: {}\n          capacity:\n            requests:\n              memory: {mib}Mi\n              compute: \"{compute}\"\n",
                q(&format!("{}-gpu", w.name)),
                q(&w.namespace),
                q(&format!(
                    "device.allowMultipleAllocations && device.attributes['gpu-slicer.io'].productName == '{}'",
                    w.model.replace('\'', "")
                )),
            );
        }
    }
    files.insert("requests.yaml".into(), requests);

    let mut kust = String::from(
        "# gpu-slicer advise: the pool configs and MIG layouts as the ConfigMap of\n# deploy/label-configs/, and the claim templates.\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\ngeneratorOptions:\n  disableNameSuffixHash: true\nconfigMapGenerator:\n- name: gpu-slicer-configs\n  namespace: gpu-slicer\n  files:\n",
    );
    let _ = writeln!(kust, "  - {DEFAULT_POOL}=configs/{DEFAULT_POOL}.yaml");
    for p in &a.fleet.pools {
        let _ = writeln!(kust, "  - {0}=configs/{0}.yaml", p.name);
    }
    if let Some(mig) = mig {
        let _ = writeln!(kust, "  - {MIG_FILE}");
        files.insert(MIG_FILE.into(), mig);
    }
    if !claims.is_empty() {
        kust.push_str("resources:\n- claim-templates.yaml\n");
        files.insert("claim-templates.yaml".into(), claims);
    }
    files.insert("kustomization.yaml".into(), kust);
    files
}
