//! Sim backend: an inventory read from a node description file or a built-in profile.
//!
//! Built-in profiles are the files in `hack/nodes/`, compiled in so `--backend sim:<name>`
//! works from any directory. Used by the demo, the tests and Podman development hosts; the
//! fake NVML library serves the same files through the NVML ABI.

use std::path::{Path, PathBuf};

use node_spec::{NodeSpec, TopoCell};

use crate::domain::topology::{PcieLevel, RawGpu, RawPair, Topology, fabric_clique};

use crate::domain::inventory::{
    Backend, Gpu, Inventory, InventoryError, MigDevice, MigMode, Result,
};

/// Built-in node profiles: (name, file contents).
pub(crate) const BUILTIN_PROFILES: &[(&str, &str)] = &[
    ("dgx-h100", include_str!("../../hack/nodes/dgx-h100.yaml")),
    (
        "mixed-a100",
        include_str!("../../hack/nodes/mixed-a100.yaml"),
    ),
];

/// Names of the built-in profiles.
pub(crate) fn builtin_names() -> Vec<&'static str> {
    BUILTIN_PROFILES.iter().map(|(n, _)| *n).collect()
}

/// Whether `--backend sim:<value>` was meant as a file: a directory part or a file
/// extension (built-in profile names have neither), so a missing file is reported as one.
fn looks_like_path(value: &str) -> bool {
    value.contains('/')
        || Path::new(value)
            .extension()
            .is_some_and(|e| matches!(e.to_str(), Some("yaml" | "yml" | "json")))
}

/// The sim backend: a parsed node description.
#[derive(Debug, Clone)]
pub(crate) struct SimBackend {
    source: String,
    spec: NodeSpec,
    /// Set for a node file: every discovery reads it again, so editing the file is how a
    /// sim node changes its MIG layout under a running daemon (re-scan, SIGHUP).
    path: Option<PathBuf>,
}

impl SimBackend {
    /// Resolve `profile` as a built-in profile name, else as a file path.
    pub(crate) fn open(profile: &str) -> Result<Self> {
        if let Some((name, text)) = BUILTIN_PROFILES.iter().find(|(n, _)| *n == profile) {
            let spec = NodeSpec::parse(text, &format!("built-in profile {name}"))?;
            return Ok(Self {
                source: format!("sim:{name}"),
                spec,
                path: None,
            });
        }
        let path = PathBuf::from(profile);
        if !path.exists() && looks_like_path(profile) {
            return Err(InventoryError::NodeFileMissing {
                path: profile.to_string(),
                builtin: builtin_names().join(", "),
            });
        }
        if !path.exists() {
            return Err(InventoryError::UnknownProfile {
                name: profile.to_string(),
                builtin: builtin_names().join(", "),
            });
        }
        Self::from_file(&path)
    }

    /// Load a node file.
    pub(crate) fn from_file(path: &Path) -> Result<Self> {
        let spec = NodeSpec::load(path)?;
        Ok(Self {
            source: format!("sim:{}", path.display()),
            spec,
            path: Some(path.to_path_buf()),
        })
    }

    /// The node description as first loaded.
    pub(crate) fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// The node file, when the node came from one (read again on every discovery).
    pub(crate) fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

impl Backend for SimBackend {
    fn discover(&self) -> Result<Inventory> {
        match &self.path {
            Some(path) => Ok(inventory_from_spec(&NodeSpec::load(path)?, &self.source)),
            None => Ok(inventory_from_spec(&self.spec, &self.source)),
        }
    }
}

/// Build the domain inventory a node description stands for.
pub(crate) fn inventory_from_spec(spec: &NodeSpec, source: &str) -> Inventory {
    let gpus = spec
        .gpus
        .iter()
        .map(|g| {
            let memory_bytes = g.memory_mib() << 20;
            let product = node_spec::lookup_product(&g.product);
            let mut mig_devices: Vec<MigDevice> = g
                .mig_devices()
                .into_iter()
                .map(|(_, d)| {
                    let compute_slices = product
                        .and_then(|p| p.profile(&d.profile))
                        .map_or(0, |i| i.compute_slices);
                    MigDevice {
                        uuid: d.uuid.clone(),
                        parent_uuid: g.uuid.clone(),
                        parent_index: g.index,
                        index: 0,
                        profile: d.profile.clone(),
                        gpu_instance_id: d.gpu_instance_id,
                        compute_instance_id: d.compute_instance_id,
                        memory_bytes: g.mig_memory_mib(d) << 20,
                        compute_slices,
                        gi_cap_minor: Some(node_spec::gi_cap_minor(g.minor(), d.gpu_instance_id)),
                        ci_cap_minor: Some(node_spec::ci_cap_minor(
                            g.minor(),
                            d.gpu_instance_id,
                            d.compute_instance_id,
                        )),
                    }
                })
                .collect();
            sort_migs(&mut mig_devices);
            let (maj, min) = g.compute_capability();
            Gpu {
                index: g.index,
                uuid: g.uuid.clone(),
                product: g.product.clone(),
                memory_bytes,
                minor: g.minor(),
                pci_bus_id: g.bus_id(),
                numa_node: g.numa_node,
                compute_capability: format!("{maj}.{min}"),
                mig_mode: MigMode {
                    current: g.mig_enabled(),
                    pending: g.mig_pending(),
                },
                mig_compute_slices: product.map_or(0, |p| p.compute_slices),
                mig_devices,
                fabric_clique: g.fabric.as_ref().and_then(|f| {
                    fabric_clique(
                        f.cluster_uuid_bytes()?,
                        f.clique_id,
                        f.state_code()?,
                        f.status,
                    )
                }),
            }
        })
        .collect();
    Inventory {
        source: source.to_string(),
        driver_version: Some(spec.driver_version.clone()),
        cuda_driver_version: u32::try_from(spec.cuda_driver_version)
            .ok()
            .filter(|v| *v > 0),
        // A matrix whose every call is marked unsupported is a driver that answers no
        // topology call: no topology, as the NVML backend concludes from the same answers.
        topology: spec
            .topology
            .as_ref()
            .filter(|t| !(t.is_unsupported("nvlink") && t.is_unsupported("commonAncestor")))
            .map(|t| topology_from_spec(spec, t)),
        gpus,
    }
}

/// The node file's matrix as a domain topology; the warnings were checked for by the node
/// file's validation (shape) or are what an asymmetric matrix means to model.
fn topology_from_spec(spec: &NodeSpec, t: &node_spec::TopologySpec) -> Topology {
    let raw: Vec<RawGpu> = spec
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| RawGpu {
            pci_bus_id: g.bus_id(),
            index: g.index,
            numa_node: g.numa_node,
            switch_links: if t.nvswitch && !t.is_unsupported("nvlink") {
                t.switch_links(i)
            } else {
                0
            },
        })
        .collect();
    let (topology, warnings) = Topology::from_raw(&raw, |a, b| raw_pair(t, a, b));
    for w in warnings {
        tracing::warn!(warning = ?w, "node file topology");
    }
    topology
}

/// What the fake NVML would answer for (a, b), from the matrix.
fn raw_pair(t: &node_spec::TopologySpec, a: usize, b: usize) -> RawPair {
    let ancestor = (!t.is_unsupported("commonAncestor")).then(|| match t.cell(a, b) {
        Some(TopoCell::Pcie(level)) => level,
        _ => PcieLevel::Sys.to_nvml(),
    });
    let direct_nvlinks = match t.cell(a, b) {
        Some(TopoCell::NvLink(k)) if !t.nvswitch && !t.is_unsupported("nvlink") => k,
        _ => 0,
    };
    RawPair {
        ancestor,
        direct_nvlinks,
    }
}

/// Sort MIG devices by (GPU instance, compute instance) and number them `0..` so the
/// `i:j` index is stable whatever order the backend enumerated them in.
pub(crate) fn sort_migs(migs: &mut [MigDevice]) {
    migs.sort_by_key(|m| (m.gpu_instance_id, m.compute_instance_id));
    for (j, m) in migs.iter_mut().enumerate() {
        m.index = j as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse_and_hold_expected_devices() {
        let inv = SimBackend::open("mixed-a100").unwrap().discover().unwrap();
        assert_eq!(inv.gpus.len(), 4);
        assert_eq!(inv.gpus[0].mig_devices.len(), 7);
        assert_eq!(inv.gpus[1].mig_devices.len(), 4);
        assert_eq!(inv.gpus[1].mig_devices[0].profile, "3g.40gb");
        assert_eq!(inv.gpus[1].mig_devices[0].gi_cap_minor, Some(3 + 135 + 18));
        let inv = SimBackend::open("dgx-h100").unwrap().discover().unwrap();
        assert_eq!(inv.gpus.len(), 8);
        assert_eq!(inv.gpus[7].pci_bus_id, "0000:db:00.0");
    }

    #[test]
    fn unknown_profile_names_builtins() {
        let err = SimBackend::open("no-such-node").unwrap_err().to_string();
        assert!(
            err.contains("dgx-h100") && err.contains("no-such-node"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_node_file_is_reported_as_a_file_not_a_profile() {
        for value in ["/path/missing.yaml", "nodes/missing", "missing.json"] {
            let err = SimBackend::open(value).unwrap_err();
            assert!(
                matches!(err, InventoryError::NodeFileMissing { .. }),
                "{value}: {err}"
            );
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("node file {value}")) && msg.contains("does not exist"),
                "{msg}"
            );
            assert!(!msg.contains("unknown sim profile"), "{msg}");
        }
    }
}
