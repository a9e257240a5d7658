//! Inventory × Plan × health → the node's ResourceSlices.
//!
//! One device per physical device the plan serves (a whole GPU, or a MIG device): replicas
//! of the device-plugin path are not devices here, sharing is a claim's opaque config. Names
//! are DNS labels that stay the same across restarts and reloads: `gpu-<index>` and
//! `gpu-<index>-mig-<profile>-<giProfileId>-<placementStart>` (NVIDIA's form; the profile with
//! its dots dropped and `+` as `-`). Unhealthy devices stay listed and carry a NoSchedule
//! taint (`gpu-slicer.io/xid`, `gpu-slicer.io/gpu-lost`, `gpu-slicer.io/unhealthy`), so a
//! recovered device keeps its name and claims. The pool is split at 128 devices per slice,
//! 64 once any device carries taints. Pure; [`super::claim`] resolves claim results against
//! the same [`NodeDevices`].

use std::collections::BTreeMap;

use super::model::{
    Attribute, Capacity, Device, ObjectMeta, OwnerReference, ResourcePool, ResourceSlice,
    ResourceSliceSpec, Taint, bytes_quantity, semver,
};
use crate::domain::inventory::{Gpu, Health, Inventory, MigDevice};
use crate::domain::plan::Plan;
use crate::domain::topology::{PlacementAttributes, placement_attributes};
use crate::domain::view::Overlay;

/// Most devices in one slice.
pub const MAX_DEVICES: usize = 128;
/// Most devices in one slice when any device has taints or consumes counters (1.35+).
pub const MAX_DEVICES_WITH_TAINTS: usize = 64;
/// Taint key of a device with a critical XID.
pub const TAINT_XID: &str = "gpu-slicer.io/xid";
/// Taint key of a device that fell off the bus.
pub const TAINT_GPU_LOST: &str = "gpu-slicer.io/gpu-lost";
/// Taint key of a device unhealthy for another reason (discovery, a drain).
pub const TAINT_UNHEALTHY: &str = "gpu-slicer.io/unhealthy";
/// Standard attribute of the PCI address.
pub const ATTR_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// Standard attribute: the GPU's PCIe root complex (`pci<domain>:<bus>`), from the topology
/// (`crate::domain::topology::placement_attributes`); MIG devices carry their parent's.
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// The NVLink-connected group a GPU belongs to (equal for all GPUs of one NVSwitch board or
/// one bridged pair), so a claim for several GPUs can `matchAttribute` on it. GPUs without
/// NVLink peers have none (and so never match such a claim).
pub const ATTR_NVLINK_DOMAIN: &str = "gpu-slicer.io/nvlinkDomain";

/// Whole GPU or MIG device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceType {
    /// A whole GPU.
    Gpu,
    /// A MIG device.
    Mig,
}

impl DeviceType {
    /// The `type` attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::Gpu => "gpu",
            DeviceType::Mig => "mig",
        }
    }
}

/// One device the node publishes, with what the kubelet side needs to prepare it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDevice {
    /// Published name (`gpu-0`, `gpu-0-mig-1g10gb-19-3`).
    pub name: String,
    /// Whole GPU or MIG.
    pub kind: DeviceType,
    /// `GPU-…` or `MIG-…`: the device's name in the node's CDI spec.
    pub uuid: String,
    /// UUID of the GPU (the parent, for MIG).
    pub gpu_uuid: String,
    /// Why it is unhealthy, when it is.
    pub unhealthy: Option<String>,
    /// The published device.
    pub device: Device,
}

/// The node's devices by published name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDevices {
    /// By name, in name order.
    pub devices: BTreeMap<String, NodeDevice>,
}

impl NodeDevices {
    /// Look a device up by published name.
    pub fn get(&self, name: &str) -> Option<&NodeDevice> {
        self.devices.get(name)
    }
}

/// Unhealthy physical devices (UUID → reason) from the plan and the health overlay: a
/// device is unhealthy when any planned device it backs is.
pub fn health_map(plan: &Plan, overlay: &Overlay) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (_, d) in plan.devices() {
        let h = overlay.health_of(d);
        if h.health == Health::Unhealthy {
            let reason = h.reason.as_deref().unwrap_or("unhealthy").to_string();
            out.entry(d.physical.uuid.clone()).or_insert(reason);
        }
    }
    out
}

/// The devices the node publishes: every physical device the plan serves, GPUs by index,
/// each GPU's MIG devices after it.
pub fn node_devices(
    inv: &Inventory,
    plan: &Plan,
    health: &BTreeMap<String, String>,
) -> NodeDevices {
    let served: std::collections::BTreeSet<&str> = plan
        .devices()
        .map(|(_, d)| d.physical.uuid.as_str())
        .collect();
    let mut out = NodeDevices::default();
    let driver_version = inv.driver_version.as_deref().and_then(semver);
    let placement: BTreeMap<String, PlacementAttributes> = inv
        .topology
        .as_ref()
        .map(|t| {
            placement_attributes(t)
                .into_iter()
                .map(|p| (p.pci_bus_id.clone(), p))
                .collect()
        })
        .unwrap_or_default();
    for gpu in &inv.gpus {
        let place = placement.get(&gpu.pci_bus_id);
        if served.contains(gpu.uuid.as_str()) {
            let mut nd = gpu_device(gpu, driver_version.as_deref(), health);
            add_placement(&mut nd.device.attributes, place, true);
            out.devices.insert(nd.name.clone(), nd);
        }
        let starts = placements(gpu);
        for mig in &gpu.mig_devices {
            if served.contains(mig.uuid.as_str()) {
                let mut nd = mig_device(gpu, mig, &starts, driver_version.as_deref(), health);
                // A MIG slice is not NVLink-placed on its own: only the PCIe root.
                add_placement(&mut nd.device.attributes, place, false);
                out.devices.insert(nd.name.clone(), nd);
            }
        }
    }
    out
}

/// The topology attributes of a device on the GPU placed at `place`.
fn add_placement(
    attributes: &mut BTreeMap<String, Attribute>,
    place: Option<&PlacementAttributes>,
    nvlink: bool,
) {
    let Some(p) = place else { return };
    attributes.insert(ATTR_PCIE_ROOT.into(), Attribute::String(clip(&p.pcie_root)));
    if let Some(domain) = p.nvlink_domain.as_deref().filter(|_| nvlink) {
        attributes.insert(ATTR_NVLINK_DOMAIN.into(), Attribute::String(clip(domain)));
    }
}

fn common_attributes(gpu: &Gpu, driver_version: Option<&str>) -> BTreeMap<String, Attribute> {
    let mut a = BTreeMap::new();
    a.insert("productName".into(), Attribute::String(clip(&gpu.product)));
    a.insert("index".into(), Attribute::Int(i64::from(gpu.index)));
    if let Some(b) = brand(&gpu.product) {
        a.insert("brand".into(), Attribute::String(b.into()));
    }
    let cc = gpu.compute_capability.split_once('.');
    if let Some((Ok(major), Ok(minor))) = cc.map(|(a, b)| (a.parse::<u32>(), b.parse::<u32>())) {
        let family = crate::domain::labels::family(major, minor);
        a.insert("architecture".into(), Attribute::String(title(family)));
    }
    if let Some(v) = semver(&gpu.compute_capability) {
        a.insert("cudaComputeCapability".into(), Attribute::Version(v));
    }
    if let Some(v) = driver_version {
        a.insert("driverVersion".into(), Attribute::Version(v.to_string()));
    }
    a
}

fn gpu_device(
    gpu: &Gpu,
    driver_version: Option<&str>,
    health: &BTreeMap<String, String>,
) -> NodeDevice {
    let name = format!("gpu-{}", gpu.index);
    let mut attributes = common_attributes(gpu, driver_version);
    attributes.insert(
        "type".into(),
        Attribute::String(DeviceType::Gpu.as_str().into()),
    );
    attributes.insert("uuid".into(), Attribute::String(clip(&gpu.uuid)));
    if !gpu.pci_bus_id.is_empty() {
        attributes.insert(
            ATTR_PCI_BUS_ID.into(),
            Attribute::String(gpu.pci_bus_id.to_lowercase()),
        );
    }
    let mut capacity = BTreeMap::new();
    capacity.insert("memory".into(), quantity(gpu.memory_bytes));
    let unhealthy = health.get(&gpu.uuid).cloned();
    NodeDevice {
        device: Device {
            name: name.clone(),
            attributes,
            capacity,
            taints: unhealthy.as_deref().map(taint).into_iter().collect(),
        },
        name,
        kind: DeviceType::Gpu,
        uuid: gpu.uuid.clone(),
        gpu_uuid: gpu.uuid.clone(),
        unhealthy,
    }
}

fn mig_device(
    gpu: &Gpu,
    mig: &MigDevice,
    starts: &BTreeMap<u32, u32>,
    driver_version: Option<&str>,
    health: &BTreeMap<String, String>,
) -> NodeDevice {
    let gi_profile = node_spec::gi_profile(&gpu.product, &mig.profile);
    let gi_part = gi_profile.map_or(mig.gpu_instance_id, |p| p.id);
    let start = starts
        .get(&mig.gpu_instance_id)
        .copied()
        .unwrap_or(mig.gpu_instance_id);
    let name = format!(
        "gpu-{}-mig-{}-{gi_part}-{start}",
        gpu.index,
        profile_label(&mig.profile)
    );
    let mut attributes = common_attributes(gpu, driver_version);
    attributes.insert(
        "type".into(),
        Attribute::String(DeviceType::Mig.as_str().into()),
    );
    attributes.insert("uuid".into(), Attribute::String(clip(&mig.uuid)));
    attributes.insert("parentUUID".into(), Attribute::String(clip(&gpu.uuid)));
    attributes.insert("profile".into(), Attribute::String(clip(&mig.profile)));
    let mut capacity = BTreeMap::new();
    capacity.insert("memory".into(), quantity(mig.memory_bytes));
    capacity.insert("computeSlices".into(), count(mig.compute_slices));
    if let Some(p) = gi_profile {
        capacity.insert("memorySlices".into(), count(p.memory_slices));
    }
    // NVIDIA's capacity names, so CEL written for its driver ports; left out where the
    // product's figures are not known rather than guessed.
    if let Some(e) = node_spec::mig_engines(&gpu.product, &mig.profile) {
        for (name, n) in [
            ("multiprocessors", e.multiprocessors),
            ("copyEngines", e.copy_engines),
            ("decoders", e.decoders),
            ("encoders", e.encoders),
            ("jpegEngines", e.jpeg_engines),
            ("ofaEngines", e.ofa_engines),
        ] {
            capacity.insert(name.into(), count(n));
        }
    }
    // A sick parent makes every MIG device on it unusable.
    let unhealthy = health
        .get(&mig.uuid)
        .or_else(|| health.get(&gpu.uuid))
        .cloned();
    NodeDevice {
        device: Device {
            name: name.clone(),
            attributes,
            capacity,
            taints: unhealthy.as_deref().map(taint).into_iter().collect(),
        },
        name,
        kind: DeviceType::Mig,
        uuid: mig.uuid.clone(),
        gpu_uuid: gpu.uuid.clone(),
        unhealthy,
    }
}

/// Placement start of each GPU instance id of `gpu`.
fn placements(gpu: &Gpu) -> BTreeMap<u32, u32> {
    crate::domain::miglayout::current::instances(gpu)
        .into_iter()
        .map(|g| (g.id, g.start))
        .collect()
}

/// A MIG profile as a DNS-label fragment: `1g.10gb` → `1g10gb`, `1g.10gb+me` → `1g10gb-me`.
pub fn profile_label(profile: &str) -> String {
    profile
        .to_ascii_lowercase()
        .chars()
        .filter_map(|c| match c {
            '.' => None,
            'a'..='z' | '0'..='9' => Some(c),
            _ => Some('-'),
        })
        .collect()
}

/// The taint for an unhealthy reason: `xid-79` → `gpu-slicer.io/xid=79`, `gpu-lost` →
/// `gpu-slicer.io/gpu-lost`, anything else → `gpu-slicer.io/unhealthy=<reason as a label
/// value>`. Always NoSchedule: running pods are not evicted by us.
pub fn taint(reason: &str) -> Taint {
    let (key, value) = if let Some(xid) = reason.strip_prefix("xid-") {
        (TAINT_XID, label_value(xid))
    } else if reason == "gpu-lost" || reason.ends_with(": gpu-lost") {
        (TAINT_GPU_LOST, String::new())
    } else if let Some((_, xid)) = reason.split_once(": xid-") {
        (TAINT_XID, label_value(xid))
    } else {
        (TAINT_UNHEALTHY, label_value(reason))
    };
    Taint {
        key: key.into(),
        value,
        effect: "NoSchedule".into(),
    }
}

/// `s` cut down to a label value: `[A-Za-z0-9_.-]`, at most 63, alphanumeric at both ends.
fn label_value(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Attribute strings are at most 64 characters.
fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

fn quantity(bytes: u64) -> Capacity {
    Capacity {
        value: bytes_quantity(bytes),
    }
}

fn count(n: u32) -> Capacity {
    Capacity {
        value: n.to_string(),
    }
}

/// NVIDIA's capitalised architecture names (`hopper` → `Hopper`, `ada-lovelace` →
/// `Ada Lovelace`).
fn title(family: &str) -> String {
    family
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The product brand as NVML's `nvmlDeviceGetBrand` names it, read off the product name
/// (the inventory does not carry the brand): `Tesla`, `Quadro`, `GeForce`, else `Nvidia`
/// for the `NVIDIA …` data-centre boards.
fn brand(product: &str) -> Option<&'static str> {
    let p = product.to_ascii_lowercase();
    if p.contains("tesla") {
        Some("Tesla")
    } else if p.contains("quadro") {
        Some("Quadro")
    } else if p.contains("geforce") {
        Some("GeForce")
    } else if p.starts_with("nvidia") {
        Some("Nvidia")
    } else {
        None
    }
}

/// What a slice set is built for.
#[derive(Debug, Clone, Copy)]
pub struct SliceTarget<'a> {
    /// Driver name.
    pub driver: &'a str,
    /// Node name (also the pool name).
    pub node_name: &'a str,
    /// The Node's UID, for the owner reference (`None`: no owner reference, e.g. offline).
    pub node_uid: Option<&'a str>,
    /// Pool generation.
    pub generation: i64,
}

/// The slices of `devices` for `target`: split at [`MAX_DEVICES`], or
/// [`MAX_DEVICES_WITH_TAINTS`] once any device has taints. An empty pool still gets one
/// (empty) slice, so consumers see that the node has nothing rather than nothing known.
pub fn build(target: &SliceTarget<'_>, devices: &NodeDevices) -> Vec<ResourceSlice> {
    let all: Vec<&Device> = devices.devices.values().map(|d| &d.device).collect();
    let per = if all.iter().any(|d| !d.taints.is_empty()) {
        MAX_DEVICES_WITH_TAINTS
    } else {
        MAX_DEVICES
    };
    let chunks: Vec<&[&Device]> = if all.is_empty() {
        vec![&[]]
    } else {
        all.chunks(per).collect()
    };
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| slice(target, i, count, chunk))
        .collect()
}

fn slice(target: &SliceTarget<'_>, i: usize, count: i64, devices: &[&Device]) -> ResourceSlice {
    let mut metadata = ObjectMeta {
        name: slice_name(target, i),
        ..ObjectMeta::default()
    };
    metadata
        .labels
        .insert("app.kubernetes.io/managed-by".into(), "gpu-slicer".into());
    if let Some(uid) = target.node_uid {
        metadata.owner_references.push(OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: target.node_name.into(),
            uid: uid.into(),
            controller: true,
        });
    }
    ResourceSlice {
        api_version: super::API_VERSION.into(),
        kind: "ResourceSlice".into(),
        metadata,
        spec: ResourceSliceSpec {
            driver: target.driver.into(),
            pool: ResourcePool {
                name: target.node_name.into(),
                generation: target.generation,
                resource_slice_count: count,
            },
            node_name: target.node_name.into(),
            devices: devices.iter().map(|d| (*d).clone()).collect(),
        },
    }
}

/// `<node>-<driver>-<i>`, cut to the 253 characters of a name (node names are
/// subdomains, so the result is one).
pub fn slice_name(target: &SliceTarget<'_>, i: usize) -> String {
    let suffix = format!("-{}-{i}", target.driver);
    let keep = 253usize.saturating_sub(suffix.len());
    let node: String = target.node_name.chars().take(keep).collect();
    format!("{}{suffix}", node.trim_end_matches(['-', '.']))
}

#[cfg(test)]
#[path = "slices_tests.rs"]
mod tests;
