//! CDI spec generation and serialisation of synthetic A100 nodes, split into MIG slices or
//! time-sliced with `isolation: memory+mps`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::domain::cdi::{self, Format, GenerateOptions, NoProbe};
use crate::domain::inventory::{Gpu, Inventory, MigDevice, MigMode};

/// A node with `gpus` A100s, each split into `migs` 1g.10gb slices.
fn synthetic_inventory(gpus: u32, migs: u32) -> Inventory {
    let gpus = (0..gpus)
        .map(|i| Gpu {
            index: i,
            uuid: format!("GPU-00000000-0000-4000-8000-{i:012x}"),
            product: "NVIDIA A100-SXM4-80GB".into(),
            memory_bytes: 80 << 30,
            minor: i,
            pci_bus_id: format!("0000:{i:02x}:00.0"),
            numa_node: Some(0),
            compute_capability: "8.0".into(),
            mig_mode: MigMode {
                current: migs > 0,
                pending: migs > 0,
            },
            mig_compute_slices: 7,
            fabric_clique: None,
            mig_devices: (0..migs)
                .map(|j| {
                    let gi = 7 + j;
                    MigDevice {
                        uuid: format!("MIG-00000000-0000-4000-8000-{i:06x}{j:06x}"),
                        parent_uuid: format!("GPU-00000000-0000-4000-8000-{i:012x}"),
                        parent_index: i,
                        index: j,
                        profile: "1g.10gb".into(),
                        gpu_instance_id: gi,
                        compute_instance_id: 0,
                        memory_bytes: 10 << 30,
                        compute_slices: 1,
                        gi_cap_minor: Some(node_spec::gi_cap_minor(i, gi)),
                        ci_cap_minor: Some(node_spec::ci_cap_minor(i, gi, 0)),
                    }
                })
                .collect(),
        })
        .collect();
    Inventory {
        source: "bench".into(),
        driver_version: None,
        cuda_driver_version: None,
        gpus,
        topology: None,
    }
}

/// The spec of `gpus` A100-80GB (kind `gpu-slicer.io/gpu`): each split into `migs` 1g.10gb
/// slices, or, with `replicas`, each whole GPU split that many ways with
/// `isolation: memory+mps` (48 share devices per GPU at 48: by UUID and by index, with the
/// memory hook and the MPS edits). One call of the closure generates the spec and
/// serialises it as `format`, and returns the time that took (what it made is freed after
/// the clock is read) and the number of CDI devices.
///
/// # Panics
/// When the config or plan fails, or (in the closure) generation or serialisation does.
pub fn cdi_spec(
    gpus: u32,
    migs: u32,
    replicas: Option<u32>,
    format: Format,
) -> impl FnMut() -> (Duration, usize) {
    let inv = synthetic_inventory(gpus, migs);
    let opts = match replicas {
        None => GenerateOptions::new("gpu-slicer.io/gpu"),
        Some(replicas) => share_options(&inv, replicas),
    };
    move || generate_once(&inv, &opts, format)
}

/// Options adding `replicas` share devices per GPU with `memory+mps`.
fn share_options(inv: &Inventory, replicas: u32) -> GenerateOptions {
    let text = format!(
        "flags: {{mpsRoot: /run/nvidia/mps}}\nsharing:\n  timeSlicing:\n    resources:\n    - {{name: gpu, replicas: {replicas}, isolation: memory+mps}}\n"
    );
    let cfg = crate::domain::config::parse(&text, "bench", &Default::default())
        .unwrap_or_else(|e| panic!("config: {e}"));
    let plan = crate::domain::plan::build(inv, &cfg).unwrap_or_else(|e| panic!("plan: {e}"));
    GenerateOptions {
        shares: Some(cdi::shares::ShareOptions {
            plan: plan.into(),
            mps_root: cfg.mps_root.clone(),
            hook: cdi::shares::HookSettings {
                path: "/usr/local/bin/gpu-slicer".into(),
                nvml_lib: None,
                env: Vec::new(),
            },
        }),
        ..GenerateOptions::new("gpu-slicer.io/gpu")
    }
}

/// Generate `inv`'s spec with `opts` and serialise it as `format`: the time that took, and
/// the CDI device count.
pub(super) fn generate_once(
    inv: &Inventory,
    opts: &GenerateOptions,
    format: Format,
) -> (Duration, usize) {
    let start = Instant::now();
    let spec =
        cdi::generate(black_box(inv), opts, &NoProbe).unwrap_or_else(|e| panic!("generate: {e}"));
    let bytes = spec
        .to_bytes(format)
        .unwrap_or_else(|e| panic!("serialise: {e}"));
    black_box(&bytes);
    (start.elapsed(), spec.devices.len())
}
