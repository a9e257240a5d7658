//! The demo's words: pure text built from the node's inventory, the plan the daemon serves
//! and the CDI spec it wrote, so `gpu-slicer demo` ([`super`]) reads as a story a newcomer
//! can follow (what the node has, why each resource has the devices it has, what a
//! container on a device receives). Nothing here does I/O.

use std::collections::BTreeMap;

use crate::domain::cdi::{ContainerEdits, Spec};
use crate::domain::inventory::{Gpu, Inventory};
use crate::domain::plan::Plan;

/// `1 device`, `2 devices`: a count with its noun in the right number.
pub(super) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `7 × 1g.10gb`, `3g.40gb, 2g.20gb, 2 × 1g.10gb`: a GPU's MIG slices, profiles in the
/// order they first appear, repeats counted.
fn slices(gpu: &Gpu) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for m in &gpu.mig_devices {
        let c = counts.entry(m.profile.as_str()).or_default();
        if *c == 0 {
            order.push(&m.profile);
        }
        *c += 1;
    }
    order
        .iter()
        .map(|p| match counts[p] {
            1 => (*p).to_string(),
            n => format!("{n} × {p}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The resources that GPU `index`'s devices are served under, in plan order, each with
/// how many of its devices sit on that GPU.
fn served_on(plan: &Plan, index: u32) -> Vec<(String, usize)> {
    plan.resources
        .iter()
        .filter_map(|r| {
            let n = r
                .devices
                .iter()
                .filter(|d| d.physical.gpu_index == index)
                .count();
            (n > 0).then(|| (r.name.clone(), n))
        })
        .collect()
}

/// The node first: one line per GPU with its MIG slices and the resources they become, so
/// the counts the kubelet sees next (9 devices of `mig-1g.10gb`) can be traced to GPUs.
pub(super) fn node_table(inv: &Inventory, plan: &Plan) -> String {
    let mut products: Vec<&str> = inv.gpus.iter().map(|g| g.product.as_str()).collect();
    products.dedup();
    let mut text = format!(
        "node {}: {} ({}), driver {}\n\n",
        inv.source,
        count(inv.gpus.len(), "GPU"),
        products.join(", "),
        inv.driver_version.as_deref().unwrap_or("unknown"),
    );
    text.push_str(&format!(
        "  {:<4} {:<4} {:<32} SERVED AS\n",
        "GPU", "MIG", "SLICES"
    ));
    for g in &inv.gpus {
        let (mig, what) = if g.mig_mode.current {
            ("on", slices(g))
        } else {
            ("off", "whole GPU".to_string())
        };
        let served: Vec<String> = served_on(plan, g.index)
            .into_iter()
            .map(|(name, n)| match (n, name.ends_with(".shared")) {
                (n, true) => format!("{name} ({})", count(n, "replica")),
                (1, false) => name,
                (n, false) => format!("{name} ({n})"),
            })
            .collect();
        text.push_str(&format!(
            "  {:<4} {:<4} {:<32} {}\n",
            g.index,
            mig,
            what,
            if served.is_empty() {
                "-".to_string()
            } else {
                served.join(", ")
            }
        ));
    }
    text
}

/// Where a resource's devices are: `7 on GPU 0, 2 on GPU 1`.
pub(super) fn backing(plan: &Plan, resource: &str) -> String {
    let mut per_gpu: BTreeMap<u32, usize> = BTreeMap::new();
    for d in plan
        .resources
        .iter()
        .filter(|r| r.name == resource)
        .flat_map(|r| &r.devices)
    {
        *per_gpu.entry(d.physical.gpu_index).or_default() += 1;
    }
    per_gpu
        .iter()
        .map(|(gpu, n)| format!("{n} on GPU {gpu}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a container started with CDI device `qualified` (`kind=name`) receives from `spec`:
/// the spec's common edits plus the device's own, as the runtime merges them.
pub(super) fn container_view(spec: &Spec, qualified: &str) -> Option<String> {
    let device = spec
        .devices
        .iter()
        .find(|d| qualified == crate::domain::cdi::qualified_name(&spec.kind, &d.name))?;
    let own = &device.container_edits;
    let common = &spec.container_edits;
    let mut text = format!("what a container started with {qualified} receives (CDI spec):\n");
    let nodes = |e: &ContainerEdits| -> Vec<String> {
        e.device_nodes.iter().map(|n| n.path.clone()).collect()
    };
    text.push_str(&format!(
        "  device nodes  {}  (this device)\n",
        nodes(own).join(" ")
    ));
    if !common.device_nodes.is_empty() {
        text.push_str(&format!(
            "                {}  (every device of the spec)\n",
            nodes(common).join(" ")
        ));
    }
    let mounts: Vec<String> = common
        .mounts
        .iter()
        .chain(&own.mounts)
        .map(|m| m.container_path.clone())
        .collect();
    match mounts.len() {
        0 => text.push_str(
            "  mounts        none: this simulated node has no driver files (with `--driver-root` on a real node, the driver's libraries, firmware and binaries are mounted)\n",
        ),
        n => text.push_str(&format!(
            "  mounts        {}: {}{}\n",
            count(n, "mount"),
            mounts.iter().take(3).cloned().collect::<Vec<_>>().join(" "),
            if n > 3 { " …" } else { "" }
        )),
    }
    for env in common.env.iter().chain(&own.env) {
        let why = if env == crate::domain::cdi::VISIBLE_DEVICES_VOID {
            "  (a legacy NVIDIA hook, if installed, adds no GPU)"
        } else {
            ""
        };
        text.push_str(&format!("  env           {env}{why}\n"));
    }
    for hook in common.hooks.iter().chain(&own.hooks) {
        text.push_str(&format!(
            "  hook          {} {}\n",
            hook.hook_name,
            hook.args.join(" ")
        ));
    }
    text.push_str("  plus the env of the Allocate answer above (the kubelet adds it)\n");
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> (Inventory, Plan) {
        let (inv, _, plan) = crate::testkit::fixtures::planned(
            "mixed-a100",
            &crate::cli::demo::DEMO_CONFIG.replace("version: v1\n", ""),
        );
        (inv, plan)
    }

    #[test]
    fn counts_read_in_correct_english() {
        assert_eq!(count(1, "device"), "1 device");
        assert_eq!(count(0, "device"), "0 devices");
        assert_eq!(count(9, "device"), "9 devices");
    }

    #[test]
    fn the_node_table_explains_where_each_resources_devices_come_from() {
        let (inv, plan) = node();
        let table = node_table(&inv, &plan);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "node sim:mixed-a100: 4 GPUs (NVIDIA A100-SXM4-80GB), driver 570.124.06"
        );
        // One row per GPU: index, MIG mode, slices, then what they are served as.
        let row = |gpu: &str, parts: &[&str]| {
            let line = lines
                .iter()
                .find(|l| l.starts_with(&format!("  {gpu}    ")))
                .unwrap_or_else(|| panic!("no row for GPU {gpu} in:\n{table}"));
            for p in parts {
                assert!(line.contains(p), "GPU {gpu}: missing {p:?} in {line:?}");
            }
        };
        row("0", &["on   7 × 1g.10gb", "nvidia.com/mig-1g.10gb (7)"]);
        row(
            "1",
            &[
                "on   3g.40gb, 2g.20gb, 2 × 1g.10gb",
                "nvidia.com/mig-1g.10gb (2)",
                "nvidia.com/mig-2g.20gb",
                "nvidia.com/mig-3g.40gb",
            ],
        );
        row("2", &["off  whole GPU", "nvidia.com/gpu"]);
        row(
            "3",
            &["off  whole GPU", "nvidia.com/gpu.shared (4 replicas)"],
        );
        assert_eq!(
            backing(&plan, "nvidia.com/mig-1g.10gb"),
            "7 on GPU 0, 2 on GPU 1"
        );
        assert_eq!(backing(&plan, "nvidia.com/gpu"), "1 on GPU 2");
    }

    #[test]
    fn a_container_view_merges_the_specs_common_edits_with_the_devices() {
        let (inv, _) = node();
        let spec = crate::domain::cdi::generate(
            &inv,
            &crate::domain::cdi::GenerateOptions::new(crate::domain::config::DEFAULT_CDI_KIND),
            &crate::domain::cdi::NoProbe,
        )
        .expect("generate");
        let mig = &inv.gpus[0].mig_devices[0].uuid;
        let view = container_view(&spec, &format!("{}={mig}", spec.kind)).expect("device");
        assert!(
            view.contains("device nodes  /dev/nvidia0 /dev/nvidia-caps/"),
            "{view}"
        );
        assert!(view.contains("/dev/nvidiactl"), "{view}");
        assert!(view.contains("mounts        none"), "{view}");
        assert!(
            view.contains("env           NVIDIA_VISIBLE_DEVICES=void"),
            "{view}"
        );
        assert!(container_view(&spec, "gpu-slicer.io/gpu=nope").is_none());
    }
}
