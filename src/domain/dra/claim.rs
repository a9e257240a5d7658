//! The ResourceClaim fields this driver reads, and the resolution of a claim's allocation
//! to this node's devices.
//!
//! The kubelet names a claim only by namespace, name and UID; the runtime GETs the object
//! from the API and hands it here. [`resolve`] checks that the object is the one the kubelet
//! meant (same UID: a deleted and re-created claim is refused), that it is allocated, that
//! our driver's results come from this node's pool, and that every device exists, is healthy
//! and is not prepared for another claim (exclusive devices are never handed out twice,
//! whatever the API says; admin-access results are exempt). A shared device (consumable
//! capacity) is the exception: each result's `consumedCapacity` is checked against what the
//! node has already prepared on it ([`super::capacity::check_fits`]), so the shares never add
//! up to more than the device, whatever the scheduler wrote. Other drivers' results and
//! config are ignored. Our opaque config (class entries first, then the claim's, the later
//! winning) is parsed strictly per request. Pure.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::capacity::{self, Consumed, Holding};
use super::claim_error::ClaimError;
use super::opaque::{self, ConfigKind, DeviceConfig};
use super::partition::Placement;
use super::slices::{DeviceType, NodeDevices, SharedDevice};

/// A ResourceClaim as read from the API (unknown fields ignored: the API adds them).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct ResourceClaim {
    /// Metadata.
    pub(crate) metadata: ClaimMeta,
    /// Status.
    #[serde(default)]
    pub(crate) status: Option<ClaimStatus>,
}

/// The claim's identity.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub(crate) struct ClaimMeta {
    /// Name.
    #[serde(default)]
    pub(crate) name: String,
    /// Namespace.
    #[serde(default)]
    pub(crate) namespace: String,
    /// UID.
    #[serde(default)]
    pub(crate) uid: String,
}

/// `status`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub(crate) struct ClaimStatus {
    /// Set by the scheduler.
    #[serde(default)]
    pub(crate) allocation: Option<Allocation>,
}

/// `status.allocation`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub(crate) struct Allocation {
    /// Device results and config.
    #[serde(default)]
    pub(crate) devices: Option<DeviceAllocation>,
}

/// `status.allocation.devices`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub(crate) struct DeviceAllocation {
    /// One per allocated device, every driver's.
    #[serde(default)]
    pub(crate) results: Vec<AllocationResult>,
    /// Class and claim config, every driver's.
    #[serde(default)]
    pub(crate) config: Vec<AllocationConfig>,
}

/// One allocated device.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AllocationResult {
    /// Request (`<request>` or `<request>/<subrequest>`).
    pub(crate) request: String,
    /// Driver.
    pub(crate) driver: String,
    /// Pool.
    pub(crate) pool: String,
    /// Device name in the pool.
    pub(crate) device: String,
    /// Admin access: the device may also be in use by other claims.
    #[serde(default)]
    pub(crate) admin_access: Option<bool>,
    /// This allocation's share of a device several claims hold.
    #[serde(default, rename = "shareID")]
    pub(crate) share_id: Option<String>,
    /// What the share takes of the device's capacities (quantities by capacity name).
    #[serde(default)]
    pub(crate) consumed_capacity: Option<BTreeMap<String, String>>,
}

/// One config entry of the allocation.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub(crate) struct AllocationConfig {
    /// `FromClass` or `FromClaim`.
    #[serde(default)]
    pub(crate) source: String,
    /// Requests it applies to; empty: all.
    #[serde(default)]
    pub(crate) requests: Vec<String>,
    /// Opaque parameters.
    #[serde(default)]
    pub(crate) opaque: Option<OpaqueConfig>,
}

/// `opaque`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct OpaqueConfig {
    /// Driver the parameters are for.
    pub(crate) driver: String,
    /// Parameters, the driver's own format.
    #[serde(default)]
    pub(crate) parameters: serde_json::Value,
}

/// What the kubelet said about a claim.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct ClaimRef {
    /// Namespace.
    pub(crate) namespace: String,
    /// UID.
    pub(crate) uid: String,
    /// Name.
    pub(crate) name: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// What a claim is resolved against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeContext<'a> {
    /// Our driver name.
    pub(crate) driver: &'a str,
    /// Our pool (the node name).
    pub(crate) pool: &'a str,
    /// The node's devices.
    pub(crate) devices: &'a NodeDevices,
    /// Device name → what is prepared on it (one holding for an exclusive device, one per
    /// share for a shared one).
    pub(crate) prepared: &'a BTreeMap<String, Vec<Holding>>,
}

/// One device of a resolved claim.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResolvedDevice {
    /// The request it serves, without a subrequest (what the kubelet matches containers on).
    pub(crate) request: String,
    /// Published device name.
    pub(crate) device: String,
    /// Whole GPU or MIG.
    pub(crate) kind: DeviceType,
    /// UUID of the device (its name in the node's CDI spec).
    pub(crate) uuid: String,
    /// UUID of its GPU.
    pub(crate) gpu_uuid: String,
    /// Its memory in bytes.
    pub(crate) memory_bytes: u64,
    /// Admin access (not exclusive).
    pub(crate) admin_access: bool,
    /// Our config for it, when any.
    pub(crate) config: Option<DeviceConfig>,
    /// Its share, when the device is shared.
    pub(crate) share: Option<ClaimShare>,
    /// The GPU instance to create, for a dynamic MIG device.
    pub(crate) placement: Option<Placement>,
}

/// A claim's share of a shared device.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClaimShare {
    /// The scheduler's share ID (`None`: the device was allocated whole).
    pub(crate) share_id: Option<String>,
    /// What it takes.
    pub(crate) consumed: Consumed,
    /// How the config shares the device.
    pub(crate) device: SharedDevice,
}

/// A claim ready to prepare.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resolved {
    /// The claim.
    pub(crate) claim: ClaimRef,
    /// Its devices on this node, in allocation order.
    pub(crate) devices: Vec<ResolvedDevice>,
}

/// Resolve `claim` (as read from the API) for the kubelet's `want`.
pub(crate) fn resolve(
    want: &ClaimRef,
    claim: &ResourceClaim,
    ctx: &NodeContext<'_>,
) -> Result<Resolved, ClaimError> {
    if claim.metadata.uid != want.uid {
        return Err(ClaimError::UidChanged {
            claim: want.to_string(),
            api_uid: claim.metadata.uid.clone(),
        });
    }
    let alloc = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .ok_or_else(|| ClaimError::NotAllocated {
            claim: want.to_string(),
        })?;
    let ours: Vec<&AllocationResult> = alloc
        .results
        .iter()
        .filter(|r| r.driver == ctx.driver)
        .collect();
    if ours.is_empty() {
        return Err(ClaimError::OtherDriver {
            claim: want.to_string(),
            driver: ctx.driver.to_string(),
        });
    }
    let mut devices: Vec<ResolvedDevice> = Vec::with_capacity(ours.len());
    for r in ours {
        // Shares this claim takes of the same device in an earlier result count too.
        let own: Vec<Holding> = devices
            .iter()
            .filter(|d| d.device == r.device)
            .filter_map(|d| d.share.as_ref())
            .map(|s| Holding {
                claim: want.uid.clone(),
                share_id: s.share_id.clone(),
                consumed: Some(s.consumed),
            })
            .collect();
        devices.push(resolve_result(want, r, alloc, ctx, &own)?);
    }
    Ok(Resolved {
        claim: want.clone(),
        devices,
    })
}

fn resolve_result(
    want: &ClaimRef,
    r: &AllocationResult,
    alloc: &DeviceAllocation,
    ctx: &NodeContext<'_>,
    own: &[Holding],
) -> Result<ResolvedDevice, ClaimError> {
    let (claim, request, device) = (want.to_string(), r.request.clone(), r.device.clone());
    if r.pool != ctx.pool {
        return Err(ClaimError::NotThisNode {
            claim,
            request,
            device,
            pool: r.pool.clone(),
            node_pool: ctx.pool.to_string(),
        });
    }
    let Some(dev) = ctx.devices.get(&r.device) else {
        return Err(ClaimError::DeviceUnknown {
            claim,
            request,
            device,
        });
    };
    if let Some(reason) = &dev.unhealthy {
        return Err(ClaimError::DeviceUnhealthy {
            claim,
            request,
            device,
            reason: reason.clone(),
        });
    }
    let admin_access = r.admin_access.unwrap_or(false);
    let others: Vec<&Holding> = ctx
        .prepared
        .get(&r.device)
        .into_iter()
        .flatten()
        .filter(|h| h.claim != want.uid)
        .collect();
    let share = match &dev.shared {
        None => {
            exclusive(want, r, &others, admin_access)?;
            None
        }
        Some(shared) => Some(claim_share(want, r, shared, &others, own, admin_access)?),
    };
    let config = config_for(want, &r.request, dev.kind, alloc, ctx.driver)?;
    Ok(ResolvedDevice {
        request: r
            .request
            .split('/')
            .next()
            .unwrap_or(&r.request)
            .to_string(),
        device: r.device.clone(),
        kind: dev.kind,
        uuid: dev.uuid.clone(),
        gpu_uuid: dev.gpu_uuid.clone(),
        memory_bytes: dev.memory_bytes,
        admin_access,
        config,
        share,
        placement: dev.placement.clone(),
    })
}

/// An exclusive device: no share, and no other claim holding it (admin access aside).
fn exclusive(
    want: &ClaimRef,
    r: &AllocationResult,
    others: &[&Holding],
    admin_access: bool,
) -> Result<(), ClaimError> {
    if let Some(id) = &r.share_id {
        return Err(ClaimError::DeviceNotShared {
            claim: want.to_string(),
            request: r.request.clone(),
            device: r.device.clone(),
            share_id: id.clone(),
        });
    }
    match others.first() {
        Some(h) if !admin_access => Err(ClaimError::DeviceHeld {
            claim: want.to_string(),
            request: r.request.clone(),
            device: r.device.clone(),
            holder: h.claim.clone(),
        }),
        _ => Ok(()),
    }
}

/// A shared device: the result's share, checked against what is prepared on it already.
fn claim_share(
    want: &ClaimRef,
    r: &AllocationResult,
    shared: &SharedDevice,
    others: &[&Holding],
    own: &[Holding],
    admin_access: bool,
) -> Result<ClaimShare, ClaimError> {
    if let Some(id) = r
        .share_id
        .as_deref()
        .filter(|id| !capacity::valid_share_id(id))
    {
        return Err(ClaimError::ShareIdInvalid {
            claim: want.to_string(),
            request: r.request.clone(),
            device: r.device.clone(),
            share_id: id.chars().take(80).collect(),
        });
    }
    let consumed =
        capacity::consumed(r.consumed_capacity.as_ref(), shared.memory_bytes).map_err(|error| {
            ClaimError::ConsumedCapacity {
                claim: want.to_string(),
                request: r.request.clone(),
                device: r.device.clone(),
                error: Box::new(error),
            }
        })?;
    // Admin access looks at a device without taking any of it.
    let consumed = if admin_access {
        Consumed::default()
    } else {
        consumed
    };
    let held: Vec<Holding> = others
        .iter()
        .map(|h| (*h).clone())
        .chain(own.iter().cloned())
        .collect();
    capacity::check_fits(&r.device, shared.memory_bytes, &held, consumed).map_err(|error| {
        ClaimError::OverCapacity {
            claim: want.to_string(),
            request: r.request.clone(),
            error: Box::new(error),
        }
    })?;
    Ok(ClaimShare {
        share_id: r.share_id.clone(),
        consumed,
        device: shared.clone(),
    })
}

/// Our config for `request`: class entries first, then claim entries, the last matching
/// one winning. Every entry of ours is parsed (a bad one is the claim's error even when a
/// later one overrides it), and its kind must fit the device.
fn config_for(
    want: &ClaimRef,
    request: &str,
    kind: DeviceType,
    alloc: &DeviceAllocation,
    driver: &str,
) -> Result<Option<DeviceConfig>, ClaimError> {
    let parent = request.split('/').next().unwrap_or(request);
    let mut entries: Vec<&AllocationConfig> = alloc
        .config
        .iter()
        .filter(|c| c.source == "FromClass")
        .collect();
    entries.extend(alloc.config.iter().filter(|c| c.source != "FromClass"));
    let mut out = None;
    for c in entries {
        let Some(o) = c.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let applies =
            c.requests.is_empty() || c.requests.iter().any(|q| q == request || q == parent);
        if !applies {
            continue;
        }
        let parsed = opaque::parse(&o.parameters, &c.requests).map_err(|error| {
            ClaimError::OpaqueConfig {
                claim: want.to_string(),
                error: Box::new(error),
            }
        })?;
        let expected = match kind {
            DeviceType::Gpu => ConfigKind::Gpu,
            DeviceType::Mig => ConfigKind::Mig,
        };
        if parsed.kind != expected {
            return Err(ClaimError::OpaqueConfig {
                claim: want.to_string(),
                error: Box::new(opaque::ConfigError {
                    requests: format!("request {request}"),
                    field: "parameters.kind".into(),
                    message: format!(
                        "`{}` configures {}, but the request was given {}: expected `{}`",
                        parsed.kind.name(),
                        parsed.kind.devices(),
                        expected.devices(),
                        expected.name()
                    ),
                }),
            });
        }
        out = Some(parsed);
    }
    Ok(out)
}

#[cfg(test)]
#[path = "claim_tests.rs"]
mod tests;
