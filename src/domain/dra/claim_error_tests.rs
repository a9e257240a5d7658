use std::collections::BTreeSet;

use super::*;

/// One of every variant (and every [`EditsError`] rule), as the driver builds them.
fn one_of_each() -> Vec<ClaimError> {
    let c = || "ml/train (u-1)".to_string();
    let (r, d) = (|| "gpu".to_string(), || "gpu-0".to_string());
    let edits = |error| ClaimError::Edits {
        claim: c(),
        request: r(),
        error: Box::new(error),
    };
    vec![
        ClaimError::UidChanged {
            claim: c(),
            api_uid: "u-2".into(),
        },
        ClaimError::NotAllocated { claim: c() },
        ClaimError::OtherDriver {
            claim: c(),
            driver: "gpu-slicer.io".into(),
        },
        ClaimError::NotThisNode {
            claim: c(),
            request: r(),
            device: d(),
            pool: "node-b".into(),
            node_pool: "node-a".into(),
        },
        ClaimError::DeviceUnknown {
            claim: c(),
            request: r(),
            device: d(),
        },
        ClaimError::DeviceUnhealthy {
            claim: c(),
            request: r(),
            device: d(),
            reason: "xid-79".into(),
        },
        ClaimError::DeviceNotShared {
            claim: c(),
            request: r(),
            device: d(),
            share_id: "s-1".into(),
        },
        ClaimError::DeviceHeld {
            claim: c(),
            request: r(),
            device: d(),
            holder: "u-9".into(),
        },
        ClaimError::ShareIdInvalid {
            claim: c(),
            request: r(),
            device: d(),
            share_id: "S_1".into(),
        },
        ClaimError::ConsumedCapacity {
            claim: c(),
            request: r(),
            device: d(),
            error: Box::new(CapacityError::ComputeRange { value: 101 }),
        },
        ClaimError::OverCapacity {
            claim: c(),
            request: r(),
            error: Box::new(CapacityError::MemoryShort {
                device: d(),
                want: 50 << 30,
                free: 40 << 30,
                total: 80 << 30,
                others: 1,
            }),
        },
        ClaimError::OpaqueConfig {
            claim: c(),
            error: Box::new(ConfigError {
                requests: "request gpu".into(),
                field: "parameters.kind".into(),
                message: "`GpuConfig` configures whole GPUs, but the request was given MIG devices: expected `MigDeviceConfig`".into(),
            }),
        },
        edits(EditsError::NotInNodeSpec {
            device: d(),
            uuid: "GPU-0".into(),
        }),
        edits(EditsError::NoHook { device: d() }),
        edits(EditsError::NoMpsDaemon { device: d() }),
        edits(EditsError::TimeSlicingOnMps {
            device: d(),
            isolation: "mps",
            rule: "sharing.mps".into(),
        }),
        ClaimError::SpecInvalid {
            claim: c(),
            message: "bad".into(),
        },
        ClaimError::SpecNotWritten { claim: c() },
        ClaimError::ClaimNotFound {
            claim: c(),
            message: "claim ml/train not found in the API".into(),
        },
        ClaimError::ClaimUnreadable {
            claim: c(),
            message: "cannot read claim ml/train from the API: 403".into(),
        },
        ClaimError::MigNeedsNvml {
            claim: c(),
            request: r(),
            device: d(),
        },
        ClaimError::MigCreate {
            claim: c(),
            message: "no space".into(),
        },
        ClaimError::MigDestroy {
            claim: c(),
            message: "busy".into(),
        },
        ClaimError::Persistence {
            claim: c(),
            message: "disk full".into(),
        },
        ClaimError::Task {
            claim: c(),
            what: "prepare",
            message: "panicked".into(),
        },
    ]
}

#[test]
fn every_rule_is_listed_once_and_every_listed_rule_has_a_variant() {
    let listed: BTreeSet<&str> = ClaimError::RULES.iter().copied().collect();
    assert_eq!(
        listed.len(),
        ClaimError::RULES.len(),
        "a rule is listed twice"
    );
    let used: BTreeSet<&str> = one_of_each().iter().map(ClaimError::rule).collect();
    assert_eq!(used, listed);
    for rule in &listed {
        let snake = rule.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
        assert!(snake, "{rule} is not snake_case");
    }
}

#[test]
fn classes_say_whose_move_it_is() {
    let class = |rule: &str| {
        one_of_each()
            .into_iter()
            .find(|e| e.rule() == rule)
            .map(|e| e.class().as_str())
    };
    assert_eq!(class("not_allocated"), Some("input"));
    assert_eq!(class("opaque_config"), Some("input"));
    assert_eq!(class("isolation_conflict"), Some("input"));
    assert_eq!(class("device_held"), Some("conflict"));
    assert_eq!(class("share_over_capacity"), Some("conflict"));
    assert_eq!(class("uid_changed"), Some("conflict"));
    assert_eq!(class("spec_not_written"), Some("unavailable"));
    assert_eq!(class("claim_unreadable"), Some("unavailable"));
    assert_eq!(class("hook_missing"), Some("internal"));
    assert_eq!(class("persistence_failed"), Some("internal"));
    assert_eq!(class("mig_create_failed"), Some("internal"));
}

#[test]
fn the_text_names_the_claim_and_the_free_figure() {
    let over = one_of_each()
        .into_iter()
        .find(|e| e.rule() == "share_over_capacity")
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        over,
        "claim ml/train (u-1): request gpu: device gpu-0 is over-committed: the claim takes 50Gi of memory but only 40Gi of its 80Gi are free (1 other share prepared)"
    );
    let held = one_of_each()
        .into_iter()
        .find(|e| e.rule() == "device_held")
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        held,
        "claim ml/train (u-1): request gpu: device gpu-0 is already prepared for claim u-9"
    );
}
