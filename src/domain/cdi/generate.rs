//! Inventory → CDI spec, as a pure function of the inventory, the options and a probe.
//!
//! Reads [`Inventory`] values from `crate::domain::inventory`; host device nodes are looked up only
//! through a [`NodeProbe`] the caller injects (`crate::platform::cdi_host::HostProbe` stats a dev root, [`NoProbe`]
//! answers nothing), so golden tests and `cdi-specs/` are deterministic. The result is
//! checked with [`super::validate`](fn@super::validate) before it is returned: callers never see a spec a
//! runtime would reject.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::{CdiError, ContainerEdits, Device, DeviceNode, Result, Spec, VISIBLE_DEVICES_VOID};
use crate::domain::devnodes::{CONTROL_NODES, cap_minors};
pub(crate) use crate::domain::devnodes::{cap_node_path, gpu_node_path};
use crate::domain::inventory::{Gpu, Inventory, MigDevice};

/// What the generator needs to know besides the inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GenerateOptions {
    /// `vendor/class` of the spec.
    pub(crate) kind: String,
    /// Host root under which `/dev` is found; `hostPath` = dev root + container path. `None`:
    /// emit container paths only and probe nothing.
    pub(crate) dev_root: Option<PathBuf>,
    /// Add `<device>-share-<k>` devices for the plan's enforced shares
    /// ([`super::shares`]); `None`: whole devices only.
    pub(crate) shares: Option<super::shares::ShareOptions>,
    /// Spec-level edits that bring the host's user-space driver into the container
    /// (the platform's driver discovery); `None`: device nodes only.
    pub(crate) driver: Option<ContainerEdits>,
}

impl GenerateOptions {
    /// Options for `kind` without a dev root (tests and bench support).
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) fn new(kind: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            dev_root: None,
            shares: None,
            driver: None,
        }
    }
}

/// Type and numbers of a host device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeInfo {
    /// `c` or `b`.
    pub(crate) node_type: char,
    /// Major number.
    pub(crate) major: u32,
    /// Minor number.
    pub(crate) minor: u32,
}

/// Looks up host device nodes; injected so generation stays pure.
pub(crate) trait NodeProbe: fmt::Debug {
    /// The node at `host_path`, or `None` when there is none (or it is not a device).
    fn probe(&self, host_path: &Path) -> Option<NodeInfo>;
}

/// A probe that finds nothing: nodes are emitted with their paths only.
#[derive(Debug, Clone, Copy, Default)]
#[cfg(any(test, feature = "testkit"))]
pub(crate) struct NoProbe;

#[cfg(any(test, feature = "testkit"))]
impl NodeProbe for NoProbe {
    fn probe(&self, _host_path: &Path) -> Option<NodeInfo> {
        None
    }
}

/// A probe answering from a fixed map (tests, or a pre-pass that stat'ed everything).
impl NodeProbe for BTreeMap<PathBuf, NodeInfo> {
    fn probe(&self, host_path: &Path) -> Option<NodeInfo> {
        self.get(host_path).copied()
    }
}

/// Readable index name of a MIG device: `<gpu index>:<mig index>`, as in `nvidia-smi -L`.
pub(crate) fn mig_index_name(mig: &MigDevice) -> String {
    format!("{}:{}", mig.parent_index, mig.index)
}

/// Build the spec for `inv`.
///
/// Devices: per GPU its UUID and its index; per MIG device its UUID and `<i>:<j>`; `all`;
/// with [`GenerateOptions::shares`], `<name>-share-<k>` for every enforced share.
/// Spec-level edits: the control nodes, [`VISIBLE_DEVICES_VOID`], and the driver's edits
/// when [`GenerateOptions::driver`] has them. `cdiVersion` is the
/// lowest version the content needs. Fails (naming the device and rule) instead of
/// returning a spec a runtime would reject.
pub(crate) fn generate(
    inv: &Inventory,
    opts: &GenerateOptions,
    probe: &dyn NodeProbe,
) -> Result<Spec> {
    crate::domain::cdi_kind::check_syntax(&opts.kind).map_err(|rule| CdiError::Kind {
        kind: opts.kind.clone(),
        rule,
    })?;
    if inv.gpus.is_empty() {
        return Err(CdiError::NoDevices);
    }
    let nodes = NodeMaker { opts, probe };
    let mut named = Named::default();
    for gpu in &inv.gpus {
        named.gpu(gpu, &nodes)?;
    }
    let all = named.all();
    let mut devices = named.devices;
    if let Some(shares) = &opts.shares {
        let extra = super::shares::share_devices(shares, &devices)?;
        devices.extend(extra);
    }
    devices.push(all);
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    let mut spec = Spec {
        cdi_version: super::SUPPORTED_VERSIONS[0].to_string(),
        kind: opts.kind.clone(),
        devices,
        container_edits: spec_edits(&nodes, opts.driver.as_ref()),
    };
    spec.cdi_version = super::minimum_version(&spec).to_string();
    super::validate(&spec)?;
    Ok(spec)
}

/// The devices named after GPUs and MIG devices (each by UUID and by index), and the nodes
/// `all` takes, by minor.
#[derive(Default)]
struct Named {
    devices: Vec<Device>,
    gpu_nodes: Vec<(u32, DeviceNode)>,
    cap_nodes: Vec<(u32, DeviceNode)>,
}

impl Named {
    /// A GPU's devices (its node), then its MIG devices'.
    fn gpu(&mut self, gpu: &Gpu, nodes: &NodeMaker<'_>) -> Result<()> {
        let gpu_node = nodes.required(&gpu_node_path(gpu));
        self.push(
            [gpu.uuid.clone(), gpu.index.to_string()],
            vec![gpu_node.clone()],
        );
        self.gpu_nodes.push((gpu.minor, gpu_node.clone()));
        for mig in &gpu.mig_devices {
            self.mig(mig, &gpu_node, nodes)?;
        }
        Ok(())
    }

    /// A MIG device's devices: its GPU's node and its two capability nodes.
    fn mig(&mut self, mig: &MigDevice, gpu_node: &DeviceNode, nodes: &NodeMaker<'_>) -> Result<()> {
        let caps = cap_minors(mig).map_err(|e| CdiError::MissingCapMinor {
            device: e.device,
            which: e.which,
        })?;
        let mut device_nodes = vec![gpu_node.clone()];
        for cap in caps {
            let node = nodes.required(&cap_node_path(cap));
            self.cap_nodes.push((cap, node.clone()));
            device_nodes.push(node);
        }
        self.push([mig.uuid.clone(), mig_index_name(mig)], device_nodes);
        Ok(())
    }

    /// One device per name, each with `device_nodes`.
    fn push(&mut self, names: [String; 2], device_nodes: Vec<DeviceNode>) {
        let edits = ContainerEdits {
            device_nodes,
            ..ContainerEdits::default()
        };
        for name in names {
            self.devices.push(Device {
                name,
                container_edits: edits.clone(),
            });
        }
    }

    /// `all` is not implicit in CDI: it resolves only because we define it. GPU nodes
    /// first, then capability nodes, each by minor, so the order is stable.
    fn all(&self) -> Device {
        let by_minor = |nodes: &[(u32, DeviceNode)]| {
            let mut nodes = nodes.to_vec();
            nodes.sort_by_key(|(m, _)| *m);
            nodes.dedup_by_key(|(m, _)| *m);
            nodes.into_iter().map(|(_, n)| n)
        };
        Device {
            name: "all".into(),
            container_edits: ContainerEdits {
                device_nodes: by_minor(&self.gpu_nodes)
                    .chain(by_minor(&self.cap_nodes))
                    .collect(),
                ..ContainerEdits::default()
            },
        }
    }
}

/// The spec-level edits: [`VISIBLE_DEVICES_VOID`], the control nodes, and the driver's
/// edits when discovery found one.
fn spec_edits(nodes: &NodeMaker<'_>, driver: Option<&ContainerEdits>) -> ContainerEdits {
    let mut edits = ContainerEdits {
        env: vec![VISIBLE_DEVICES_VOID.to_string()],
        device_nodes: CONTROL_NODES
            .iter()
            .filter_map(|p| nodes.optional(p))
            .collect(),
        ..ContainerEdits::default()
    };
    if let Some(driver) = driver {
        // The `void` entry stays first: the legacy NVIDIA hook must never widen access.
        edits.env.extend(driver.env.iter().cloned());
        edits
            .device_nodes
            .extend(driver.device_nodes.iter().cloned());
        edits.mounts.extend(driver.mounts.iter().cloned());
        edits.hooks.extend(driver.hooks.iter().cloned());
    }
    edits
}

/// Turns container paths into device nodes under the options' dev root.
struct NodeMaker<'a> {
    opts: &'a GenerateOptions,
    probe: &'a dyn NodeProbe,
}

impl NodeMaker<'_> {
    /// The host path for `path`, `None` when it equals the container path (no dev root, or
    /// dev root `/`): leaving `hostPath` out keeps the spec readable by 0.3.0/0.4.0 parsers.
    fn host_path(&self, path: &str) -> Option<PathBuf> {
        let root = self.opts.dev_root.as_ref()?;
        let host = root.join(path.trim_start_matches('/'));
        (host != Path::new(path)).then_some(host)
    }

    /// A GPU or MIG node: always emitted; type and numbers filled when the host has it.
    fn required(&self, path: &str) -> DeviceNode {
        let mut node = DeviceNode::at(path);
        if self.opts.dev_root.is_none() {
            return node;
        }
        let host = self.host_path(path);
        let probed = self.probe.probe(host.as_deref().unwrap_or(Path::new(path)));
        node.host_path = host.map(|h| h.display().to_string());
        if let Some(info) = probed {
            node.node_type = Some(info.node_type.to_string());
            node.major = Some(i64::from(info.major));
            node.minor = Some(i64::from(info.minor));
        }
        node
    }

    /// A control node: without a dev root always emitted by path; with one, only when the
    /// host has it (a missing node the runtime must stat fails the whole container start).
    fn optional(&self, path: &str) -> Option<DeviceNode> {
        if self.opts.dev_root.is_none() {
            return Some(DeviceNode::at(path));
        }
        let node = self.required(path);
        node.node_type.is_some().then_some(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::inventory::Backend;
    use crate::platform::sim::SimBackend;

    fn mixed() -> Inventory {
        SimBackend::open("mixed-a100")
            .and_then(|b| b.discover())
            .expect("built-in profile")
    }

    #[test]
    fn uuid_index_and_all_devices_exist() -> Result<()> {
        let spec = generate(
            &mixed(),
            &GenerateOptions::new("gpu-slicer.io/gpu"),
            &NoProbe,
        )?;
        let names: Vec<_> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        // 4 GPUs + 11 MIG devices, each twice, plus `all`.
        assert_eq!(names.len(), 2 * (4 + 11) + 1);
        for n in ["0", "3", "0:0", "0:6", "1:3", "all"] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        assert!(names.contains(&"GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02"));
        assert!(names.contains(&"MIG-2c3d4e5f-0000-4b00-8000-000000000003"));
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        assert_eq!(spec.cdi_version, "0.5.0", "digit-first names need 0.5.0");
        assert_eq!(spec.container_edits.env, vec![VISIBLE_DEVICES_VOID]);
        assert_eq!(spec.container_edits.device_nodes.len(), 3);
        Ok(())
    }

    #[test]
    fn mig_device_exposes_parent_and_its_own_caps_only() -> Result<()> {
        let inv = mixed();
        let spec = generate(&inv, &GenerateOptions::new("gpu-slicer.io/gpu"), &NoProbe)?;
        let mig = &inv.gpus[1].mig_devices[1];
        let dev = spec
            .devices
            .iter()
            .find(|d| d.name == mig.uuid)
            .expect("MIG device by UUID");
        let paths: Vec<_> = dev
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.clone())
            .collect();
        assert_eq!(
            paths,
            vec![
                format!("/dev/nvidia{}", inv.gpus[1].minor),
                cap_node_path(mig.gi_cap_minor.expect("gi")),
                cap_node_path(mig.ci_cap_minor.expect("ci")),
            ]
        );
        let by_index = spec.devices.iter().find(|d| d.name == "1:1").expect("1:1");
        assert_eq!(by_index.container_edits, dev.container_edits);
        Ok(())
    }

    #[test]
    fn dev_root_sets_host_path_fills_numbers_and_drops_missing_control_nodes() -> Result<()> {
        let root = PathBuf::from("/tmp/devroot");
        let info = NodeInfo {
            node_type: 'c',
            major: 195,
            minor: 0,
        };
        let mut probe = BTreeMap::new();
        probe.insert(root.join("dev/nvidia0"), info);
        probe.insert(root.join("dev/nvidiactl"), info);
        let opts = GenerateOptions {
            kind: "gpu-slicer.io/gpu".into(),
            dev_root: Some(root.clone()),
            shares: None,
            driver: None,
        };
        let spec = generate(&mixed(), &opts, &probe)?;
        let ctl: Vec<_> = spec
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(ctl, vec!["/dev/nvidiactl"]);
        let gpu0 = spec.devices.iter().find(|d| d.name == "0").expect("0");
        let n = &gpu0.container_edits.device_nodes[0];
        assert_eq!(n.host_path.as_deref(), Some("/tmp/devroot/dev/nvidia0"));
        assert_eq!(
            (n.node_type.as_deref(), n.major, n.minor),
            (Some("c"), Some(195), Some(0))
        );
        let gpu2 = spec.devices.iter().find(|d| d.name == "2").expect("2");
        let n = &gpu2.container_edits.device_nodes[0];
        assert_eq!(n.host_path.as_deref(), Some("/tmp/devroot/dev/nvidia2"));
        assert_eq!(n.node_type, None);
        Ok(())
    }

    #[test]
    fn bad_kind_and_missing_caps_are_refused_with_the_culprit_named() {
        let err = generate(&mixed(), &GenerateOptions::new("x/gpu"), &NoProbe)
            .expect_err("one-char vendor");
        assert!(err.to_string().contains("x/gpu"), "{err}");
        let mut inv = mixed();
        inv.gpus[0].mig_devices[2].ci_cap_minor = None;
        let err = generate(&inv, &GenerateOptions::new("gpu-slicer.io/gpu"), &NoProbe)
            .expect_err("no caps");
        assert!(
            err.to_string().contains(&inv.gpus[0].mig_devices[2].uuid),
            "{err}"
        );
        let err = generate(
            &Inventory::default(),
            &GenerateOptions::new("gpu-slicer.io/gpu"),
            &NoProbe,
        )
        .expect_err("no gpus");
        assert!(matches!(err, CdiError::NoDevices));
    }
}
