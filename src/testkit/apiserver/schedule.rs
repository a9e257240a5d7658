//! What the scheduler writes when it gives a claim's request one named device:
//! [`super::ApiServer::allocate_share`] reads the request (its `capacity.requests` and
//! `tolerations`) from the stored claim and the device from the stored ResourceSlices (the
//! pool's highest generation), and decides as the scheduler's allocator
//! (`k8s.io/dynamic-resource-allocation/structured` v0.37.2 with the 1.37 defaults) decides
//! for that device: a NoSchedule/NoExecute taint not tolerated, a result without a `shareID`
//! already holding it, or a requested capacity it does not publish rules it out; each
//! capacity's amount is the request rounded by its `requestPolicy` (`validRange` min / step,
//! `validValues`; in milli units, so fractional capacities work) or, when not asked, the
//! policy's `default` (not range-checked) or the whole value; an amount above `validRange.max`
//! or off `validValues`, or more than the shares already allocated leave free, rules it out.
//! A device with `allowMultipleAllocations` gets a result with a `shareID` and the
//! `consumedCapacity`; any other device is taken whole (neither field), once.
//! `tests/allocator_cases.rs` holds this to the real allocator's answers
//! (`tests/fixtures/allocator/capacity-cases.json`, written by `hack/allocator`).
//! [`ShareRequest::overcommit`] skips the free-capacity check, as a buggy scheduler (or two
//! racing ones) would, so the node's own check can be tested.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::store::{Key, Kind};
use super::{ApiServer, ApiServerError};

/// One device to give a claim's request.
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
    /// Requested capacities (`memory` → `10Gi`, `compute` → `25`), over the claim
    /// request's own `capacity.requests`.
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

    /// Ask for `amount` of capacity `name` (over what the claim's request asks).
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
    /// `shareID` of the result; `None` for a device taken whole (no
    /// `allowMultipleAllocations`).
    pub share_id: Option<String>,
    /// `consumedCapacity` of the result (empty for a device taken whole).
    pub consumed: BTreeMap<String, String>,
}

impl ApiServer {
    /// Give `share.device` to request `share.request` of claim `namespace/name` (see the
    /// module header).
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
        let claim = Kind::of::<k8s_openapi::api::resource::v1::ResourceClaim>()
            .and_then(|kind| {
                store.objects.get(&Key {
                    kind,
                    namespace: namespace.into(),
                    name: name.into(),
                })
            })
            .cloned()
            .ok_or_else(|| ApiServerError::Missing {
                kind: "ResourceClaim",
                namespace: namespace.into(),
                name: name.into(),
            })?;
        let device = find_device(&store.objects, share)
            .ok_or_else(|| refuse("no such device in the pool's newest ResourceSlices".into()))?;
        let held = held_now(&store.objects, share);
        let share_id = format!("5a4e0000-0000-4000-8000-{:012x}", store.rv + 1);
        drop(store);

        let request = claim_request(&claim, &share.request).ok_or_else(|| {
            refuse(format!(
                "claim {namespace}/{name} has no request {}",
                share.request
            ))
        })?;
        let mut asked: BTreeMap<String, String> = request
            .pointer("/capacity/requests")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        asked.extend(share.capacity.clone());
        if let Some(taint) = untolerated_taint(&device, request) {
            return Err(refuse(format!("taint {taint} not tolerated")));
        }
        if held.whole {
            return Err(refuse(
                "already allocated whole (a result without a shareID)".into(),
            ));
        }
        let capacities = device
            .get("capacity")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if let Some(missing) = asked.keys().find(|k| !capacities.contains_key(*k)) {
            return Err(refuse(format!(
                "capacity {missing} asked but not published"
            )));
        }
        let mut consumed = BTreeMap::new();
        for (cap, spec) in &capacities {
            let value = milli_of(spec.get("value")).map_err(&refuse)?;
            let amount = rounded(asked.get(cap), spec, value).map_err(&refuse)?;
            let taken = held.consumed.get(cap).copied().unwrap_or(0);
            if !share.overcommit && taken + amount > value {
                return Err(refuse(format!(
                    "{cap}: {} asked, {} of {} free",
                    milli_quantity(amount),
                    milli_quantity(value.saturating_sub(taken)),
                    milli_quantity(value)
                )));
            }
            consumed.insert(cap.clone(), milli_quantity(amount));
        }
        let multiple = device
            .get("allowMultipleAllocations")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut result = json!({"request": share.request, "driver": share.driver,
            "pool": share.pool, "device": share.device});
        let allocated = if multiple {
            result["shareID"] = json!(share_id);
            result["consumedCapacity"] = json!(consumed);
            ShareAllocated {
                share_id: Some(share_id),
                consumed,
            }
        } else {
            ShareAllocated {
                share_id: None,
                consumed: BTreeMap::new(),
            }
        };
        let allocation = json!({"devices": {"results": [result]}});
        self.modify::<k8s_openapi::api::resource::v1::ResourceClaim>(namespace, name, |v| {
            super::store::merge_patch(v, &json!({"status": {"allocation": Value::Null}}));
            super::store::merge_patch(v, &json!({"status": {"allocation": allocation}}));
        })?;
        Ok(allocated)
    }
}

/// The claim's request `name` (`exactly` of a top-level request, or a `firstAvailable`
/// subrequest named `<request>/<subrequest>`).
fn claim_request<'a>(claim: &'a Value, name: &str) -> Option<&'a Value> {
    let requests = claim.pointer("/spec/devices/requests")?.as_array()?;
    let (top, sub) = match name.split_once('/') {
        Some((t, s)) => (t, Some(s)),
        None => (name, None),
    };
    let r = requests
        .iter()
        .find(|r| r.get("name").and_then(Value::as_str) == Some(top))?;
    match sub {
        None => r.get("exactly"),
        Some(sub) => r
            .get("firstAvailable")?
            .as_array()?
            .iter()
            .find(|s| s.get("name").and_then(Value::as_str) == Some(sub)),
    }
}

/// The first NoSchedule or NoExecute taint of `device` that `request` does not tolerate, as
/// `key=value:effect`.
fn untolerated_taint(device: &Value, request: &Value) -> Option<String> {
    let text = |v: &Value, f: &str| v.get(f).and_then(Value::as_str).unwrap_or("").to_string();
    let tolerations = request
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    device
        .get("taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|t| matches!(text(t, "effect").as_str(), "NoSchedule" | "NoExecute"))
        .find(|t| {
            !tolerations.iter().any(|tol| {
                let key_ok = text(tol, "key").is_empty() || text(tol, "key") == text(t, "key");
                let value_ok = match text(tol, "operator").as_str() {
                    "Exists" => true,
                    // Equal is the default operator.
                    _ => !text(tol, "key").is_empty() && text(tol, "value") == text(t, "value"),
                };
                let effect_ok =
                    text(tol, "effect").is_empty() || text(tol, "effect") == text(t, "effect");
                key_ok && value_ok && effect_ok
            })
        })
        .map(|t| {
            format!(
                "{}={}:{}",
                text(t, "key"),
                text(t, "value"),
                text(t, "effect")
            )
        })
}

fn milli_of(v: Option<&Value>) -> Result<i128, String> {
    milli_value(v.and_then(Value::as_str).unwrap_or("0"))
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

/// How the device is held now, over every claim's allocation.
#[derive(Debug, Default)]
struct Held {
    /// A result without a `shareID` (admin access aside) holds the whole device.
    whole: bool,
    /// What the shares (results with a `shareID`) consume, by capacity, in milli units.
    consumed: BTreeMap<String, i128>,
}

fn held_now(objects: &BTreeMap<Key, Value>, share: &ShareRequest) -> Held {
    let mut out = Held::default();
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
            || r.get("adminAccess").and_then(Value::as_bool) == Some(true)
        {
            continue;
        }
        if field("shareID").is_none() {
            out.whole = true;
            continue;
        }
        for (cap, q) in r
            .get("consumedCapacity")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            *out.consumed.entry(cap.clone()).or_default() += milli_of(Some(q)).unwrap_or(0);
        }
    }
    out
}

/// The amount a request takes, in milli units, as the allocator's `calculateConsumedCapacity`
/// and `violatesPolicy` work it out: not asked, the policy's `default` (taken as it is) or the
/// whole value; asked without a policy, as asked; with `validRange`, raised to `min`, rounded
/// up to `min + n × step`, refused above `max`; with `validValues`, the first value not below
/// it, refused when there is none.
fn rounded(asked: Option<&String>, spec: &Value, value: i128) -> Result<i128, String> {
    let policy = spec.get("requestPolicy");
    let Some(asked) = asked else {
        return match policy.and_then(|p| p.get("default")) {
            Some(d) => milli_of(Some(d)),
            None => Ok(value),
        };
    };
    let asked = milli_value(asked)?;
    let Some(policy) = policy else {
        return Ok(asked);
    };
    if let Some(range) = policy.get("validRange")
        && let Some(min) = range.get("min")
    {
        let min = milli_of(Some(min))?;
        let mut amount = asked.max(min);
        if asked > min
            && let Some(step) = range.get("step").map(|s| milli_of(Some(s))).transpose()?
            && step > 0
        {
            amount = min + (asked - min + step - 1) / step * step;
        }
        if let Some(max) = range.get("max").map(|m| milli_of(Some(m))).transpose()?
            && amount > max
        {
            return Err(format!(
                "{} is above the policy's max {}",
                milli_quantity(amount),
                milli_quantity(max)
            ));
        }
        return Ok(amount);
    }
    if let Some(values) = policy.get("validValues").and_then(Value::as_array) {
        for v in values {
            let v = milli_of(Some(v))?;
            if asked <= v {
                return Ok(v);
            }
        }
        return Err(format!(
            "{} is above every one of the policy's validValues",
            milli_quantity(asked)
        ));
    }
    Ok(asked)
}

/// A Kubernetes quantity (`10Gi`, `25`, `500m`, `1.5`, `2k`, `1e3`) in milli units.
/// Amounts finer than a milli are refused: the allocator cannot represent them either.
pub(crate) fn milli_value(text: &str) -> Result<i128, String> {
    let t = text.trim();
    let bad = || format!("`{text}` is not a quantity");
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let negative = int.starts_with('-');
    let int = int.trim_start_matches(['+', '-']);
    if (int.is_empty() && frac.is_empty()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    // The number as an integer count of 10^-scale.
    let digits = format!("{int}{frac}");
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| bad())?
    };
    let mut scale = i32::try_from(frac.len()).map_err(|_| bad())?;
    let (multiplier, exp10): (i128, i32) = match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        s if s.starts_with(['e', 'E']) => (1, s[1..].parse().map_err(|_| bad())?),
        _ => return Err(bad()),
    };
    // value × 1000 = mantissa × multiplier × 10^(exp10 + 3 − scale)
    scale -= exp10 + 3;
    let mut v = mantissa.checked_mul(multiplier).ok_or_else(bad)?;
    while scale < 0 {
        v = v.checked_mul(10).ok_or_else(bad)?;
        scale += 1;
    }
    while scale > 0 {
        if v % 10 != 0 {
            return Err(format!("`{text}` is finer than a milli"));
        }
        v /= 10;
        scale -= 1;
    }
    Ok(if negative { -v } else { v })
}

/// A milli amount as a quantity: `10Gi`, `30Mi`, `25` for whole numbers, `300m` otherwise.
pub(crate) fn milli_quantity(milli: i128) -> String {
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    let v = milli / 1000;
    match u64::try_from(v) {
        Ok(bytes) => crate::domain::dra::model::bytes_quantity(bytes),
        Err(_) => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_milli_units() {
        for (text, milli) in [
            ("0", 0),
            ("25", 25_000),
            ("10Gi", 10 * (1 << 30) * 1000),
            ("500m", 500),
            ("1.5", 1500),
            ("2k", 2_000_000),
            ("1e3", 1_000_000),
            ("100m", 100),
        ] {
            assert_eq!(milli_value(text), Ok(milli), "{text}");
        }
        assert!(milli_value("1n").is_err());
        assert!(milli_value("ten").is_err());
        assert!(milli_value("1Xi").is_err());
        assert_eq!(milli_quantity(300), "300m");
        assert_eq!(milli_quantity(25_000), "25");
        assert_eq!(milli_quantity(2 * (1 << 20) * 1000), "2Mi");
    }
}
