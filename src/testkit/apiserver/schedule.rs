//! What the scheduler writes for a share of a device that allows multiple allocations:
//! [`super::ApiServer::allocate_share`] reads the device's capacities and request policies
//! from the stored ResourceSlices (the pool's highest generation), rounds the requested
//! amounts the way the scheduler's allocator does (`default` for what is not asked,
//! `validRange` min / step / max), checks them against what every claim's allocation
//! already consumes of the device, and writes `status.allocation` with a `shareID` and the
//! `consumedCapacity`. [`ShareRequest::overcommit`] skips the check, as a buggy scheduler
//! (or two racing ones) would, so the node's own check can be tested.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::store::{Key, Kind};
use super::{ApiServer, ApiServerError};
use crate::domain::dra::capacity::quantity_value;
use crate::domain::dra::model::bytes_quantity;

/// One share to allocate.
#[derive(Debug, Clone, Default)]
pub struct ShareRequest {
    /// The claim's request name.
    pub(crate) request: String,
    /// Driver of the device.
    pub(crate) driver: String,
    /// Pool (node) of the device.
    pub(crate) pool: String,
    /// Device name in the pool.
    pub(crate) device: String,
    /// Requested capacities (`memory` → `10Gi`, `compute` → `25`).
    pub(crate) capacity: BTreeMap<String, String>,
    /// Write the allocation even when the device does not have the capacity left.
    pub(crate) overcommit: bool,
}

impl ShareRequest {
    /// A share of `device` of `driver` in pool `pool`, for request `request`.
    pub fn new(request: &str, driver: &str, pool: &str, device: &str) -> Self {
        Self {
            request: request.into(),
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
            ..Self::default()
        }
    }

    /// Ask for `amount` of capacity `name`.
    pub fn with(mut self, name: &str, amount: &str) -> Self {
        self.capacity.insert(name.into(), amount.into());
        self
    }

    /// Skip the free-capacity check.
    pub fn overcommit(mut self) -> Self {
        self.overcommit = true;
        self
    }
}

/// The allocation written: its share ID and what it consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareAllocated {
    /// `shareID` of the result.
    pub share_id: String,
    /// `consumedCapacity` of the result.
    pub consumed: BTreeMap<String, String>,
}

impl ApiServer {
    /// Allocate `share` to claim `namespace/name` (see the module header).
    pub fn allocate_share(
        &self,
        namespace: &str,
        name: &str,
        share: &ShareRequest,
    ) -> Result<ShareAllocated, ApiServerError> {
        let refuse = |message: String| ApiServerError::Unschedulable {
            device: share.device.clone(),
            message,
        };
        let store = self.shared.store();
        let device = find_device(&store.objects, share)
            .ok_or_else(|| refuse("no such device in the pool's newest ResourceSlices".into()))?;
        let used = consumed_now(&store.objects, share);
        let share_id = format!("5a4e0000-0000-4000-8000-{:012x}", store.rv + 1);
        drop(store);
        let mut consumed = BTreeMap::new();
        let capacities = device
            .get("capacity")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for (cap, spec) in &capacities {
            let value = quantity(spec.get("value")).map_err(&refuse)?;
            let amount = rounded(share.capacity.get(cap), spec, value).map_err(&refuse)?;
            let taken = used.get(cap).copied().unwrap_or(0);
            if !share.overcommit && taken + amount > value {
                return Err(refuse(format!(
                    "{cap}: {amount} asked, {} of {value} free",
                    value.saturating_sub(taken)
                )));
            }
            consumed.insert(cap.clone(), bytes_quantity(amount));
        }
        let result = json!({"request": share.request, "driver": share.driver, "pool": share.pool,
            "device": share.device, "shareID": share_id, "consumedCapacity": consumed});
        let allocation = json!({"devices": {"results": [result]}});
        self.modify::<k8s_openapi::api::resource::v1::ResourceClaim>(namespace, name, |v| {
            super::store::merge_patch(v, &json!({"status": {"allocation": Value::Null}}));
            super::store::merge_patch(v, &json!({"status": {"allocation": allocation}}));
        })?;
        Ok(ShareAllocated { share_id, consumed })
    }
}

fn quantity(v: Option<&Value>) -> Result<u64, String> {
    let text = v.and_then(Value::as_str).unwrap_or("0");
    quantity_value(text)
}

/// The device in the pool's highest generation of stored slices.
fn find_device(objects: &BTreeMap<Key, Value>, share: &ShareRequest) -> Option<Value> {
    let kind = Kind::of::<k8s_openapi::api::resource::v1::ResourceSlice>()?;
    let slices: Vec<&Value> = objects
        .iter()
        .filter(|(k, v)| {
            k.kind == kind
                && v.pointer("/spec/driver").and_then(Value::as_str) == Some(&share.driver)
                && v.pointer("/spec/pool/name").and_then(Value::as_str) == Some(&share.pool)
        })
        .map(|(_, v)| v)
        .collect();
    let generation = |s: &Value| s.pointer("/spec/pool/generation").and_then(Value::as_i64);
    let newest = slices.iter().filter_map(|s| generation(s)).max()?;
    slices
        .into_iter()
        .filter(|s| generation(s) == Some(newest))
        .flat_map(|s| {
            s.pointer("/spec/devices")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .find(|d| d.get("name").and_then(Value::as_str) == Some(&share.device))
        .cloned()
}

/// What the allocations of every claim consume of the device now, by capacity.
fn consumed_now(objects: &BTreeMap<Key, Value>, share: &ShareRequest) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(kind) = Kind::of::<k8s_openapi::api::resource::v1::ResourceClaim>() else {
        return out;
    };
    let results = objects
        .iter()
        .filter(|(k, _)| k.kind == kind)
        .filter_map(|(_, v)| v.pointer("/status/allocation/devices/results")?.as_array())
        .flatten();
    for r in results {
        let field = |f: &str| r.get(f).and_then(Value::as_str);
        if field("driver") != Some(&share.driver)
            || field("pool") != Some(&share.pool)
            || field("device") != Some(&share.device)
        {
            continue;
        }
        for (cap, q) in r
            .get("consumedCapacity")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            *out.entry(cap.clone()).or_default() += quantity(Some(q)).unwrap_or(0);
        }
    }
    out
}

/// The amount a request takes: asked or the policy's default (the whole capacity without a
/// policy), raised to `min`, rounded up to `min + n × step`, refused above `max`.
fn rounded(asked: Option<&String>, spec: &Value, value: u64) -> Result<u64, String> {
    let policy = spec.get("requestPolicy");
    let asked = match asked {
        Some(q) => quantity_value(q)?,
        None => match policy.and_then(|p| p.get("default")) {
            Some(d) => quantity(Some(d))?,
            None => value,
        },
    };
    let Some(range) = policy.and_then(|p| p.get("validRange")) else {
        return Ok(asked);
    };
    let min = quantity(range.get("min"))?;
    let max = match range.get("max") {
        Some(m) => quantity(Some(m))?,
        None => value,
    };
    let mut amount = asked.max(min);
    if let Some(step) = range.get("step").map(|s| quantity(Some(s))).transpose()?
        && step > 0
    {
        amount = min + (amount - min).div_ceil(step) * step;
    }
    if amount > max {
        return Err(format!("{amount} is above the policy's max {max}"));
    }
    Ok(amount)
}
