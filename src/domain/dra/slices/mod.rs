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
//! the same [`NodeDevices`]. The devices are built in `devices`; this module packs them.

use super::model::{
    CounterSet, Device, ObjectMeta, OwnerReference, ResourcePool, ResourceSlice, ResourceSliceSpec,
};

mod devices;

#[cfg(test)]
pub(crate) use devices::{ATTR_PCI_BUS_ID, TAINT_GPU_LOST, TAINT_UNHEALTHY, TAINT_XID, taint};
pub(crate) use devices::{
    DeviceType, NodeDevice, NodeDevices, SharedDevice, health_map, node_devices, node_devices_with,
    profile_label, snapshot_devices,
};

/// Most devices in one slice.
pub(crate) const MAX_DEVICES: usize = 128;
/// Most devices in one slice when any device has taints or consumes counters (1.35+).
pub(crate) const MAX_DEVICES_WITH_TAINTS: usize = 64;
/// Most counter sets in one slice.
pub(crate) const MAX_COUNTER_SETS: usize = 8;
/// Most counters in one slice, all its sets together (the 1.34 rule; kept on 1.35+ too,
/// where it is the limit of one set, so no server refuses what is published).
pub(crate) const MAX_COUNTERS: usize = 32;
/// What a slice set is built for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SliceTarget<'a> {
    /// Driver name.
    pub(crate) driver: &'a str,
    /// Node name (also the pool name).
    pub(crate) node_name: &'a str,
    /// The Node's UID, for the owner reference (`None`: no owner reference, e.g. offline).
    pub(crate) node_uid: Option<&'a str>,
    /// Pool generation.
    pub(crate) generation: i64,
}

/// How a pool with counter sets is laid out: the API changed between 1.34 and 1.35.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SliceFormat {
    /// 1.34: a slice holds counter sets and the devices consuming them together.
    Combined,
    /// 1.35 and later: a slice holds devices or counter sets, never both.
    #[default]
    Split,
}

impl SliceFormat {
    /// The format of an API server of version `major.minor` (`minor` as `/version` says it,
    /// `35+` on some providers): combined up to 1.34.
    pub(crate) fn for_server(major: &str, minor: &str) -> Self {
        let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
        match (major.trim(), digits.parse::<u32>()) {
            ("1", Ok(m)) if m <= 34 => SliceFormat::Combined,
            _ => SliceFormat::Split,
        }
    }
}

#[cfg(test)]
/// The slices of `devices` for `target` in the 1.35+ layout ([`build_for`]).
pub(crate) fn build(target: &SliceTarget<'_>, devices: &NodeDevices) -> Vec<ResourceSlice> {
    build_for(target, devices, SliceFormat::Split)
}

/// The slices of `devices` for `target`. Devices that consume no counters are split at
/// [`MAX_DEVICES`], or [`MAX_DEVICES_WITH_TAINTS`] once any has taints. Dynamic MIG GPUs'
/// devices (64 per slice) and counter sets ([`MAX_COUNTER_SETS`], [`MAX_COUNTERS`] per
/// slice) go in slices of their own ([`SliceFormat::Split`]), or together, whole GPUs per
/// slice ([`SliceFormat::Combined`]). An empty pool still gets one (empty) slice, so
/// consumers see that the node has nothing rather than nothing known.
pub(crate) fn build_for(
    target: &SliceTarget<'_>,
    devices: &NodeDevices,
    format: SliceFormat,
) -> Vec<ResourceSlice> {
    let (plain, counted): (Vec<&Device>, Vec<&Device>) = devices
        .devices
        .values()
        .map(|d| &d.device)
        .partition(|d| d.consumes_counters.is_empty());
    let per = if plain.iter().any(|d| !d.taints.is_empty()) {
        MAX_DEVICES_WITH_TAINTS
    } else {
        MAX_DEVICES
    };
    let mut contents: Vec<(Vec<&Device>, Vec<&CounterSet>)> = plain
        .chunks(per)
        .map(|c| (c.to_vec(), Vec::new()))
        .collect();
    match format {
        SliceFormat::Split => {
            contents.extend(
                counted
                    .chunks(MAX_DEVICES_WITH_TAINTS)
                    .map(|c| (c.to_vec(), Vec::new())),
            );
            let groups: Vec<(Vec<&Device>, &CounterSet)> = devices
                .counter_sets
                .iter()
                .map(|s| (Vec::new(), s))
                .collect();
            contents.extend(pack(groups));
        }
        SliceFormat::Combined => {
            let groups: Vec<(Vec<&Device>, &CounterSet)> = devices
                .counter_sets
                .iter()
                .map(|s| {
                    let of_set = counted
                        .iter()
                        .copied()
                        .filter(|d| d.consumes_counters.iter().any(|c| c.counter_set == s.name))
                        .collect();
                    (of_set, s)
                })
                .collect();
            contents.extend(pack(groups));
        }
    }
    if contents.is_empty() {
        contents.push((Vec::new(), Vec::new()));
    }
    let count = i64::try_from(contents.len()).unwrap_or(i64::MAX);
    contents
        .into_iter()
        .enumerate()
        .map(|(i, (devices, sets))| slice(target, i, count, &devices, &sets))
        .collect()
}

/// Counter sets, each with the devices that go with it, packed into as few slices as the
/// limits allow (in order; a group is never split).
fn pack<'a>(
    groups: Vec<(Vec<&'a Device>, &'a CounterSet)>,
) -> Vec<(Vec<&'a Device>, Vec<&'a CounterSet>)> {
    let mut out: Vec<(Vec<&Device>, Vec<&CounterSet>)> = Vec::new();
    for (devices, set) in groups {
        let fits = out.last().is_some_and(|(d, s)| {
            let counters: usize = s.iter().map(|s| s.counters.len()).sum();
            s.len() < MAX_COUNTER_SETS
                && counters + set.counters.len() <= MAX_COUNTERS
                && d.len() + devices.len() <= MAX_DEVICES_WITH_TAINTS
        });
        match out.last_mut() {
            Some((d, s)) if fits => {
                d.extend(devices);
                s.push(set);
            }
            _ => out.push((devices, vec![set])),
        }
    }
    out
}

fn slice(
    target: &SliceTarget<'_>,
    i: usize,
    count: i64,
    devices: &[&Device],
    sets: &[&CounterSet],
) -> ResourceSlice {
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
            shared_counters: sets.iter().map(|s| (*s).clone()).collect(),
        },
    }
}

/// `<node>-<driver>-<i>`, cut to the 253 characters of a name (node names are
/// subdomains, so the result is one).
pub(crate) fn slice_name(target: &SliceTarget<'_>, i: usize) -> String {
    let suffix = format!("-{}-{i}", target.driver);
    let keep = 253usize.saturating_sub(suffix.len());
    let node: String = target.node_name.chars().take(keep).collect();
    format!("{}{suffix}", node.trim_end_matches(['-', '.']))
}

#[cfg(test)]
mod tests;
