//! Consumable capacity of shared devices: what a shared GPU (or MIG device) publishes, what
//! one claim's share takes of it, and the node's own check that the shares it has prepared
//! on a device never add up to more than the device has, whatever the API says.
//!
//! A device the config shares (time-slicing, MPS or an `isolation` level) is published with
//! `allowMultipleAllocations: true` and two consumable capacities:
//!
//! - `memory` (bytes): `requestPolicy.default` is the whole device (rounded down to the
//!   step), so a claim that names no memory takes all of it and stays exclusive in effect;
//!   `validRange` runs from one step to that default in steps of [`MEMORY_STEP`]. 2 MiB is the
//!   finest amount both enforcement paths state exactly: the MPS pinned-memory limit is given
//!   in whole MiB, and the GPU hands out device memory in 2 MiB pages, so a limit between two
//!   pages could never be used; a coarser step would only strand memory.
//! - `compute` (percent of the device's SMs, `value` 100): `validRange` 0–100 in steps of 1,
//!   default 0. A claim that asks for `compute: 25` reserves 25 % (under MPS its clients get
//!   `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25`); one that does not reserves none and time-slices
//!   with the others, so a plain `memory: 10Gi` request is not turned into an exclusive one.
//!
//! Pure: [`super::slices`] publishes [`shared_capacity`], [`super::claim`] reads each
//! result's `consumedCapacity` with [`consumed`] and checks it with [`check_fits`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::{Capacity, RequestPolicy, ValidRange, bytes_quantity};

/// Capacity name of a device's memory (bytes).
pub(crate) const MEMORY: &str = "memory";
/// Capacity name of a shared device's compute share (percent of its SMs).
pub(crate) const COMPUTE: &str = "compute";
/// Attribute naming a shared device's isolation level (`none`, `memory`, `mps`,
/// `memory+mps`), so a claim can select on what is enforced.
pub(crate) const ATTR_ISOLATION: &str = "isolation";
/// Granularity of a memory share (see the module header for why 2 MiB).
pub(crate) const MEMORY_STEP: u64 = 2 << 20;
/// The whole of a device's compute, in percent.
pub(crate) const FULL_COMPUTE: u32 = 100;

/// The capacities of a device shared among claims, whose memory is `memory_bytes`.
pub(crate) fn shared_capacity(memory_bytes: u64) -> BTreeMap<String, Capacity> {
    let whole = memory_bytes - memory_bytes % MEMORY_STEP;
    let mut out = BTreeMap::new();
    out.insert(
        MEMORY.to_string(),
        Capacity {
            value: bytes_quantity(memory_bytes),
            request_policy: Some(RequestPolicy {
                default: bytes_quantity(whole),
                valid_range: ValidRange {
                    min: bytes_quantity(MEMORY_STEP),
                    max: bytes_quantity(whole),
                    step: bytes_quantity(MEMORY_STEP),
                },
            }),
        },
    );
    out.insert(
        COMPUTE.to_string(),
        Capacity {
            value: FULL_COMPUTE.to_string(),
            request_policy: Some(RequestPolicy {
                default: "0".into(),
                valid_range: ValidRange {
                    min: "0".into(),
                    max: FULL_COMPUTE.to_string(),
                    step: "1".into(),
                },
            }),
        },
    );
    out
}

/// What one share takes of its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Consumed {
    /// Memory in bytes.
    pub(crate) memory_bytes: u64,
    /// Percent of the device's SMs (0: none reserved).
    pub(crate) compute_percent: u32,
}

impl Consumed {
    /// All of a device of `memory_bytes`: what a result without `consumedCapacity` takes
    /// (an API server without `DRAConsumableCapacity` allocates shared devices whole).
    pub(crate) fn whole(memory_bytes: u64) -> Self {
        Self {
            memory_bytes,
            compute_percent: FULL_COMPUTE,
        }
    }
}

/// A share's `consumedCapacity` that cannot be one of the device, or a share that does not
/// fit beside the ones prepared (with what is free).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CapacityError {
    /// A quantity that is not an integer amount.
    #[error("consumedCapacity.{name} `{text}`: {message}")]
    Quantity {
        name: &'static str,
        text: String,
        message: String,
    },
    /// More memory than the device has.
    #[error("consumedCapacity.{MEMORY} {} is more than the device's {}", bytes_quantity(*.want), bytes_quantity(*.total))]
    MemoryAboveDevice { want: u64, total: u64 },
    /// A compute share that is not a percentage.
    #[error("consumedCapacity.{COMPUTE} {value} is not between 0 and 100")]
    ComputeRange { value: u64 },
    /// Not enough memory left on the device.
    #[error(
        "device {device} is over-committed: the claim takes {} of memory but only {} of its {} {} free ({others} other share{} prepared)",
        bytes_quantity(*.want),
        bytes_quantity(*.free),
        bytes_quantity(*.total),
        if *.free == 1 { "is" } else { "are" },
        plural(*.others)
    )]
    MemoryShort {
        device: String,
        want: u64,
        free: u64,
        total: u64,
        others: usize,
    },
    /// Not enough compute left on the device.
    #[error(
        "device {device} is over-committed: the claim takes {want} % of compute but only {free} % of 100 % is free ({others} other share{} prepared)",
        plural(*.others)
    )]
    ComputeShort {
        device: String,
        want: u32,
        free: u32,
        others: usize,
    },
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// A quantity as the API writes one (`10Gi`, `30720Mi`, `25`, `0`, `1k`) as an integer, for
/// the capacity `name`. Fractions (`500m`) and exponents are refused: neither memory nor a
/// percentage comes in them from a `validRange` with integer steps.
fn quantity_value(name: &'static str, text: &str) -> Result<u64, CapacityError> {
    if text.trim() == "0" {
        return Ok(0);
    }
    crate::domain::config::parse_quantity_text(text).map_err(|e| CapacityError::Quantity {
        name,
        text: text.to_string(),
        message: e.to_string(),
    })
}

/// The share a result's `consumedCapacity` describes on a device of `memory_bytes`; `None`
/// (no `consumedCapacity`) is the whole device. Unknown capacity names are ignored (a newer
/// scheduler may add some); a memory share above the device or a compute share above 100 is
/// an error naming the value.
pub(crate) fn consumed(
    capacity: Option<&BTreeMap<String, String>>,
    memory_bytes: u64,
) -> Result<Consumed, CapacityError> {
    let Some(capacity) = capacity else {
        return Ok(Consumed::whole(memory_bytes));
    };
    let memory = match capacity.get(MEMORY) {
        Some(q) => quantity_value(MEMORY, q)?,
        None => memory_bytes,
    };
    if memory > memory_bytes {
        return Err(CapacityError::MemoryAboveDevice {
            want: memory,
            total: memory_bytes,
        });
    }
    let compute = match capacity.get(COMPUTE) {
        Some(q) => quantity_value(COMPUTE, q)?,
        None => 0,
    };
    let compute_percent = u32::try_from(compute)
        .ok()
        .filter(|c| *c <= FULL_COMPUTE)
        .ok_or(CapacityError::ComputeRange { value: compute })?;
    Ok(Consumed {
        memory_bytes: memory,
        compute_percent,
    })
}

/// A share already prepared on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holding {
    /// UID of the claim holding it.
    pub(crate) claim: String,
    /// Its share ID (`None` for a whole-device allocation).
    pub(crate) share_id: Option<String>,
    /// What it takes; `None`: the whole device (prepared exclusively, e.g. before a config
    /// change made the device shared).
    pub(crate) consumed: Option<Consumed>,
}

/// Whether `want` still fits on `device` (of `memory_bytes`) next to `held`. The error names
/// the device, what is claimed and what is free, for memory or compute (whichever is short).
pub(crate) fn check_fits(
    device: &str,
    memory_bytes: u64,
    held: &[Holding],
    want: Consumed,
) -> Result<(), CapacityError> {
    let taken = |h: &Holding| h.consumed.unwrap_or(Consumed::whole(memory_bytes));
    let used_memory: u64 = held.iter().map(|h| taken(h).memory_bytes).sum();
    let used_compute: u32 = held.iter().map(|h| taken(h).compute_percent).sum();
    let free_memory = memory_bytes.saturating_sub(used_memory);
    let free_compute = FULL_COMPUTE.saturating_sub(used_compute);
    let others = held.len();
    if want.memory_bytes > free_memory {
        return Err(CapacityError::MemoryShort {
            device: device.to_string(),
            want: want.memory_bytes,
            free: free_memory,
            total: memory_bytes,
            others,
        });
    }
    if want.compute_percent > free_compute {
        return Err(CapacityError::ComputeShort {
            device: device.to_string(),
            want: want.compute_percent,
            free: free_compute,
            others,
        });
    }
    Ok(())
}

/// Whether a share ID is usable in a CDI device name and a file: 1–64 of `a-z0-9-`, as the
/// scheduler's UUIDs are. Anything else is refused rather than escaped.
pub(crate) fn valid_share_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(claim: &str, gib: u64, compute: u32) -> Holding {
        Holding {
            claim: claim.into(),
            share_id: Some(format!("s-{claim}")),
            consumed: Some(Consumed {
                memory_bytes: gib << 30,
                compute_percent: compute,
            }),
        }
    }

    #[test]
    fn the_published_policy_keeps_a_plain_request_whole_and_steps_in_2_mib() {
        // H100 80GB HBM3 reports 81559 MiB: the default and max are the whole device
        // rounded down to the step; what is left over is less than one step.
        let caps = shared_capacity(81559 << 20);
        let memory = &caps[MEMORY];
        assert_eq!(memory.value, "81559Mi");
        let p = memory.request_policy.as_ref().unwrap();
        assert_eq!(p.default, "81558Mi");
        assert_eq!(p.valid_range.max, "81558Mi");
        assert_eq!(p.valid_range.min, "2Mi");
        assert_eq!(p.valid_range.step, "2Mi");
        let compute = caps[COMPUTE].request_policy.as_ref().unwrap();
        assert_eq!(
            (caps[COMPUTE].value.as_str(), compute.default.as_str()),
            ("100", "0")
        );
        assert_eq!(
            (
                compute.valid_range.min.as_str(),
                compute.valid_range.max.as_str()
            ),
            ("0", "100")
        );
    }

    #[test]
    fn consumed_capacity_reads_quantities_and_refuses_what_cannot_be() {
        let m = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let c = consumed(Some(&m(&[("memory", "10Gi"), ("compute", "25")])), 80 << 30).unwrap();
        assert_eq!((c.memory_bytes, c.compute_percent), (10 << 30, 25));
        let c = consumed(
            Some(&m(&[("memory", "30720Mi"), ("compute", "0")])),
            80 << 30,
        )
        .unwrap();
        assert_eq!((c.memory_bytes, c.compute_percent), (30 << 30, 0));
        assert_eq!(consumed(None, 80 << 30).unwrap(), Consumed::whole(80 << 30));
        let e = consumed(Some(&m(&[("memory", "90Gi")])), 80 << 30)
            .unwrap_err()
            .to_string();
        assert!(e.contains("90Gi") && e.contains("80Gi"), "{e}");
        let e = consumed(Some(&m(&[("compute", "101")])), 80 << 30)
            .unwrap_err()
            .to_string();
        assert!(e.contains("101"), "{e}");
        let e = consumed(Some(&m(&[("memory", "500m")])), 80 << 30)
            .unwrap_err()
            .to_string();
        assert!(e.contains("500m"), "{e}");
    }

    #[test]
    fn an_over_commit_names_the_device_the_claim_and_the_free_figure() {
        let held = [share("a", 10, 25), share("b", 30, 50)];
        let want = |gib, compute| share("c", gib, compute).consumed.unwrap();
        assert!(check_fits("gpu-0", 80 << 30, &held, want(40, 25)).is_ok());
        let e = check_fits("gpu-0", 80 << 30, &held, want(50, 0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gpu-0") && e.contains("50Gi") && e.contains("40Gi") && e.contains("80Gi"),
            "{e}"
        );
        let e = check_fits("gpu-0", 80 << 30, &held, want(1, 30))
            .unwrap_err()
            .to_string();
        assert!(e.contains("30 %") && e.contains("25 %"), "{e}");
        // A device held whole (prepared before it was shared) has nothing free.
        let whole = Holding {
            claim: "old".into(),
            share_id: None,
            consumed: None,
        };
        let e = check_fits("gpu-0", 80 << 30, &[whole], want(1, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("only 0 of its 80Gi"), "{e}");
    }

    #[test]
    fn share_ids_are_dns_label_characters() {
        assert!(valid_share_id("0f5c3a64-1f51-4a4b-9e0c-0d7b6a0c1e2f"));
        assert!(!valid_share_id(""));
        assert!(!valid_share_id("../x"));
        assert!(!valid_share_id("A"));
        assert!(!valid_share_id(&"a".repeat(65)));
    }
}
