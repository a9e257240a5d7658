//! The devices a node publishes: one per physical device the plan serves (a whole GPU or a
//! MIG device), and for a dynamic MIG GPU the whole GPU and every placement; their
//! attributes, capacities, sharing and taints, from the inventory, the plan and health.
//! Pure; the parent module packs them into ResourceSlices, [`crate::domain::dra::claim`]
//! resolves claim results against them.

use std::collections::BTreeMap;

use crate::domain::config::{DeviceSelector, Isolation};
use crate::domain::dra::capacity::{self, ATTR_ISOLATION};
use crate::domain::dra::model::{
    Attribute, Capacity, CounterSet, Device, Taint, bytes_quantity, semver,
};
use crate::domain::dra::partition::{self, Placement};
use crate::domain::inventory::{Gpu, Health, Inventory, MigDevice};
use crate::domain::plan::Plan;
use crate::domain::topology::{PlacementAttributes, placement_attributes};
use crate::domain::view::Overlay;

/// Taint key of a device with a critical XID.
pub(crate) const TAINT_XID: &str = "gpu-slicer.io/xid";
/// Taint key of a device that fell off the bus.
pub(crate) const TAINT_GPU_LOST: &str = "gpu-slicer.io/gpu-lost";
/// Taint key of a device unhealthy for another reason (discovery, a drain).
pub(crate) const TAINT_UNHEALTHY: &str = "gpu-slicer.io/unhealthy";
/// Standard attribute of the PCI address.
pub(crate) const ATTR_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// Standard attribute: the GPU's PCIe root complex (`pci<domain>:<bus>`), from the topology
/// (`crate::domain::topology::placement_attributes`); MIG devices carry their parent's.
pub(crate) const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// The NVLink-connected group a GPU belongs to (equal for all GPUs of one NVSwitch board or
/// one bridged pair), so a claim for several GPUs can `matchAttribute` on it. GPUs without
/// NVLink peers have none (and so never match such a claim).
pub(crate) const ATTR_NVLINK_DOMAIN: &str = "gpu-slicer.io/nvlinkDomain";

/// Whole GPU or MIG device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceType {
    /// A whole GPU.
    Gpu,
    /// A MIG device.
    Mig,
}

impl DeviceType {
    /// The `type` attribute value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DeviceType::Gpu => "gpu",
            DeviceType::Mig => "mig",
        }
    }
}

/// One device the node publishes, with what the kubelet side needs to prepare it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeDevice {
    /// Published name (`gpu-0`, `gpu-0-mig-1g10gb-19-3`).
    pub(crate) name: String,
    /// Whole GPU or MIG.
    pub(crate) kind: DeviceType,
    /// `GPU-…` or `MIG-…`: the device's name in the node's CDI spec.
    pub(crate) uuid: String,
    /// UUID of the GPU (the parent, for MIG).
    pub(crate) gpu_uuid: String,
    /// Its memory in bytes (the `memory` capacity).
    pub(crate) memory_bytes: u64,
    /// Why it is unhealthy, when it is.
    pub(crate) unhealthy: Option<String>,
    /// The published device.
    pub(crate) device: Device,
    /// Set when the config shares the device: claims hold shares of its capacity.
    pub(crate) shared: Option<SharedDevice>,
    /// Set for a device made per claim on a dynamic MIG GPU (`uuid` is then empty, or the
    /// GPU's for the whole GPU): the GPU instance Prepare creates.
    pub(crate) placement: Option<Placement>,
}

/// How the config shares a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedDevice {
    /// The isolation level its sharing rule sets.
    pub(crate) isolation: Isolation,
    /// The device's memory (the `memory` capacity).
    pub(crate) memory_bytes: u64,
    /// The rule, for messages: `sharing.mps (nvidia.com/gpu)`.
    pub(crate) rule: String,
}

/// The node's devices by published name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeDevices {
    /// By name, in name order.
    pub(crate) devices: BTreeMap<String, NodeDevice>,
    /// The counter sets of dynamic MIG GPUs, by GPU index.
    pub(crate) counter_sets: Vec<CounterSet>,
    /// Why GPUs `flags.dra.dynamicMig` names are not dynamic (for the caller to log).
    pub(crate) warnings: Vec<String>,
}

impl NodeDevices {
    /// Look a device up by published name.
    pub(crate) fn get(&self, name: &str) -> Option<&NodeDevice> {
        self.devices.get(name)
    }
}

/// Unhealthy physical devices (UUID → reason) from the plan and the health overlay: a
/// device is unhealthy when any planned device it backs is, and a GPU when the overlay
/// says so of the GPU itself, whether or not the plan serves any of its devices (what a
/// dynamic MIG GPU publishes is planned by no one: its placements read their GPU's entry).
pub(crate) fn health_map(
    inv: &Inventory,
    plan: &Plan,
    overlay: &Overlay,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (_, d) in plan.devices() {
        let h = overlay.health_of(d);
        if h.health == Health::Unhealthy {
            let reason = h.reason.as_deref().unwrap_or("unhealthy").to_string();
            out.entry(d.physical.uuid.clone()).or_insert(reason);
        }
    }
    for gpu in &inv.gpus {
        if let Some(reason) = overlay.gpu_health(&gpu.uuid) {
            out.entry(gpu.uuid.clone())
                .or_insert_with(|| reason.to_string());
        }
    }
    out
}

/// The devices the node publishes: every physical device the plan serves, GPUs by index,
/// each GPU's MIG devices after it; no dynamic MIG GPUs.
pub(crate) fn node_devices(
    inv: &Inventory,
    plan: &Plan,
    health: &BTreeMap<String, String>,
) -> NodeDevices {
    node_devices_with(inv, plan, health, None)
}

/// The devices of a snapshot, with its health and its config's `flags.dra.dynamicMig`.
pub(crate) fn snapshot_devices(snapshot: &crate::domain::snapshot::Snapshot) -> NodeDevices {
    let health = health_map(&snapshot.inventory, &snapshot.plan, &snapshot.overlay);
    node_devices_with(
        &snapshot.inventory,
        &snapshot.plan,
        &health,
        snapshot.config.dra.dynamic_mig.as_ref(),
    )
}

/// [`node_devices`], with the GPUs `dynamic` (`flags.dra.dynamicMig`) selects published as
/// partitionable ([`crate::domain::dra::partition`]) instead of as the plan has them.
pub(crate) fn node_devices_with(
    inv: &Inventory,
    plan: &Plan,
    health: &BTreeMap<String, String>,
    dynamic: Option<&DeviceSelector>,
) -> NodeDevices {
    let served: std::collections::BTreeSet<&str> = plan
        .devices()
        .map(|(_, d)| d.physical.uuid.as_str())
        .collect();
    let shared = shared_devices(inv, plan);
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
        let ctx = GpuContext {
            gpu,
            driver_version: driver_version.as_deref(),
            health,
            place,
        };
        if dynamic.is_some_and(|sel| partition::selects(sel, gpu)) {
            match partition::dynamic_product(gpu) {
                Ok((product, profiles)) => {
                    let (set, devices) = dynamic_devices(&ctx, product, profiles);
                    out.counter_sets.push(set);
                    out.devices
                        .extend(devices.into_iter().map(|d| (d.name.clone(), d)));
                    continue;
                }
                Err(why) => out.warnings.push(why.to_string()),
            }
        }
        if served.contains(gpu.uuid.as_str()) {
            let mut nd = gpu_device(gpu, ctx.driver_version, health);
            add_placement(&mut nd.device.attributes, place, true);
            share(&mut nd, shared.get(&gpu.uuid));
            out.devices.insert(nd.name.clone(), nd);
        }
        let starts = placements(gpu);
        for mig in &gpu.mig_devices {
            if served.contains(mig.uuid.as_str()) {
                let mut nd = mig_device(gpu, mig, &starts, ctx.driver_version, health);
                // A MIG slice is not NVLink-placed on its own: only the PCIe root.
                add_placement(&mut nd.device.attributes, place, false);
                share(&mut nd, shared.get(&mig.uuid));
                out.devices.insert(nd.name.clone(), nd);
            }
        }
    }
    // Every device says whether it is made for its claim, so a claim can insist on (or
    // rule out) a slice made on demand without a CEL lookup of a missing attribute.
    for d in out.devices.values_mut() {
        d.device.attributes.insert(
            partition::ATTR_ON_DEMAND.into(),
            Attribute::Bool(d.placement.is_some()),
        );
    }
    out
}

/// What every device of one GPU is built from.
struct GpuContext<'a> {
    gpu: &'a Gpu,
    driver_version: Option<&'a str>,
    health: &'a BTreeMap<String, String>,
    place: Option<&'a PlacementAttributes>,
}

/// The physical devices the plan shares, with their rule (UUID → how).
fn shared_devices(inv: &Inventory, plan: &Plan) -> BTreeMap<String, SharedDevice> {
    let mut out = BTreeMap::new();
    for (resource, d) in plan.devices() {
        let Some(sharing) = &resource.sharing else {
            continue;
        };
        let memory_bytes = match inv.mig(&d.physical.uuid) {
            Some((_, m)) => m.memory_bytes,
            None => inv
                .gpu(&d.physical.uuid)
                .map_or(d.share.memory_bytes, |g| g.memory_bytes),
        };
        out.entry(d.physical.uuid.clone())
            .or_insert_with(|| SharedDevice {
                isolation: sharing.isolation,
                memory_bytes,
                rule: format!("{} ({})", sharing.kind.field(), resource.name),
            });
    }
    out
}

/// Turn a published device into a shared one: several allocations, consumable `memory`
/// and `compute`, and its isolation level as an attribute.
fn share(nd: &mut NodeDevice, shared: Option<&SharedDevice>) {
    let Some(s) = shared else { return };
    nd.device.allow_multiple_allocations = Some(true);
    nd.device
        .capacity
        .extend(capacity::shared_capacity(s.memory_bytes));
    nd.device.attributes.insert(
        ATTR_ISOLATION.into(),
        Attribute::String(s.isolation.as_str().into()),
    );
    nd.shared = Some(s.clone());
}

/// A dynamic GPU's counter set and devices: the whole GPU and every placement of every
/// profile.
fn dynamic_devices(
    ctx: &GpuContext<'_>,
    product: &'static node_spec::Product,
    profiles: &'static [node_spec::GiProfile],
) -> (CounterSet, Vec<NodeDevice>) {
    let gpu = ctx.gpu;
    let set = partition::counter_set(gpu, product, profiles);
    let mut out = Vec::new();
    let mut whole = gpu_device(gpu, ctx.driver_version, ctx.health);
    add_placement(&mut whole.device.attributes, ctx.place, true);
    whole.device.consumes_counters = vec![partition::whole_consumption(&set)];
    whole.placement = partition::full_profile(product, profiles)
        .map(|p| partition::placement(gpu, product, p, 0));
    out.push(whole);
    for p in profiles {
        for &start in p.starts {
            let at = partition::placement(gpu, product, p, start);
            let name = format!(
                "gpu-{}-mig-{}-{}-{start}",
                gpu.index,
                profile_label(p.name),
                p.id
            );
            let (mut attributes, capacity) = mig_description(
                gpu,
                p.name,
                at.memory_bytes,
                p.compute_slices,
                ctx.driver_version,
            );
            add_placement(&mut attributes, ctx.place, false);
            let unhealthy = ctx.health.get(&gpu.uuid).cloned();
            out.push(NodeDevice {
                device: Device {
                    name: name.clone(),
                    attributes,
                    capacity,
                    taints: unhealthy.as_deref().map(taint).into_iter().collect(),
                    allow_multiple_allocations: None,
                    consumes_counters: vec![partition::consumption(gpu, p, start)],
                },
                name,
                kind: DeviceType::Mig,
                uuid: String::new(),
                gpu_uuid: gpu.uuid.clone(),
                memory_bytes: at.memory_bytes,
                unhealthy,
                shared: None,
                placement: Some(at),
            });
        }
    }
    (set, out)
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
            allow_multiple_allocations: None,
            consumes_counters: Vec::new(),
        },
        name,
        kind: DeviceType::Gpu,
        uuid: gpu.uuid.clone(),
        gpu_uuid: gpu.uuid.clone(),
        memory_bytes: gpu.memory_bytes,
        unhealthy,
        shared: None,
        placement: None,
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
    let (mut attributes, capacity) = mig_description(
        gpu,
        &mig.profile,
        mig.memory_bytes,
        mig.compute_slices,
        driver_version,
    );
    attributes.insert("uuid".into(), Attribute::String(clip(&mig.uuid)));
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
            allow_multiple_allocations: None,
            consumes_counters: Vec::new(),
        },
        name,
        kind: DeviceType::Mig,
        uuid: mig.uuid.clone(),
        gpu_uuid: gpu.uuid.clone(),
        memory_bytes: mig.memory_bytes,
        unhealthy,
        shared: None,
        placement: None,
    }
}

/// Attributes (all but `uuid`) and capacities of a MIG device of `profile` on `gpu`.
fn mig_description(
    gpu: &Gpu,
    profile: &str,
    memory_bytes: u64,
    compute_slices: u32,
    driver_version: Option<&str>,
) -> (BTreeMap<String, Attribute>, BTreeMap<String, Capacity>) {
    let mut attributes = common_attributes(gpu, driver_version);
    attributes.insert(
        "type".into(),
        Attribute::String(DeviceType::Mig.as_str().into()),
    );
    attributes.insert("parentUUID".into(), Attribute::String(clip(&gpu.uuid)));
    attributes.insert("profile".into(), Attribute::String(clip(profile)));
    let mut capacity = BTreeMap::new();
    capacity.insert("memory".into(), quantity(memory_bytes));
    capacity.insert("computeSlices".into(), count(compute_slices));
    if let Some(p) = node_spec::gi_profile(&gpu.product, profile) {
        capacity.insert("memorySlices".into(), count(p.memory_slices));
    }
    // NVIDIA's capacity names, so CEL written for its driver ports; left out where the
    // product's figures are not known rather than guessed.
    if let Some(e) = node_spec::mig_engines(&gpu.product, profile) {
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
    (attributes, capacity)
}

/// Placement start of each GPU instance id of `gpu`.
fn placements(gpu: &Gpu) -> BTreeMap<u32, u32> {
    crate::domain::miglayout::current::instances(gpu)
        .into_iter()
        .map(|g| (g.id, g.start))
        .collect()
}

/// A MIG profile as a DNS-label fragment: `1g.10gb` → `1g10gb`, `1g.10gb+me` → `1g10gb-me`.
pub(crate) fn profile_label(profile: &str) -> String {
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
pub(crate) fn taint(reason: &str) -> Taint {
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
    Capacity::of(bytes_quantity(bytes))
}

fn count(n: u32) -> Capacity {
    Capacity::of(n.to_string())
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
