//! A claim's `status.devices` through the API: this driver's entries replaced as a whole,
//! other drivers' entries kept, by GET of the claim and PUT of `resourceclaims/<name>/status`
//! with its resourceVersion (a 409 reads it again, a few times). RBAC: `get` on
//! `resourceclaims` and `update` on `resourceclaims/status`, plus, on 1.36+ servers
//! (`DRAResourceClaimGranularStatusAuthorization`), `associated-node:update` on
//! `resourceclaims/driver` for this driver's name. A claim that is gone (404) or was
//! re-created (another UID) is left alone. Each entry carries a `Ready` condition.

use std::time::Duration;

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim as ApiClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Api;
use kube::api::PostParams;

use crate::domain::dra::claim::ClaimRef;
use crate::domain::dra::status::DeviceStatus;
use crate::platform::claims::ClaimSourceError;

/// How long one GET or PUT may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times a write that lost a race (409) is tried again on a fresh read.
const CONFLICT_RETRIES: usize = 5;

/// Make `driver`'s entries of `claim`'s `status.devices` exactly `devices` (see the module
/// header).
pub(super) async fn set_device_status(
    client: &kube::Client,
    claim: &ClaimRef,
    driver: &str,
    devices: &[DeviceStatus],
) -> Result<(), ClaimSourceError> {
    let fail = |code: Option<u16>, message: String| ClaimSourceError::Status {
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
        code,
        message,
    };
    let api: Api<ApiClaim> = Api::namespaced(client.clone(), &claim.namespace);
    let ours = entries(driver, devices);
    for _ in 0..=CONFLICT_RETRIES {
        let current = match call(api.get(&claim.name)).await {
            Ok(c) => c,
            Err((Some(404), _)) => return Ok(()),
            Err((code, message)) => return Err(fail(code, message)),
        };
        if current.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Ok(());
        }
        let Some(next) = with_entries(current, driver, &ours) else {
            return Ok(());
        };
        match call(api.replace_status(&claim.name, &PostParams::default(), &next)).await {
            Ok(_) | Err((Some(404), _)) => return Ok(()),
            Err((Some(409), _)) => {}
            Err((code, message)) => return Err(fail(code, message)),
        }
    }
    Err(fail(
        Some(409),
        format!("still conflicting after {CONFLICT_RETRIES} fresh reads"),
    ))
}

/// One call with its timeout: the object, or (HTTP status if any, message).
async fn call<T>(
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, (Option<u16>, String)> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Err(_) => Err((None, format!("no answer within {CALL_TIMEOUT:?}"))),
        Ok(Err(kube::Error::Api(s))) => Err((
            Some(s.code),
            format!("{} {}: {}", s.code, s.reason, s.message),
        )),
        Ok(Err(e)) => Err((None, e.to_string())),
        Ok(Ok(v)) => Ok(v),
    }
}

/// The API's entries for `devices`, each with a `Ready` condition stamped now.
fn entries(driver: &str, devices: &[DeviceStatus]) -> Vec<AllocatedDeviceStatus> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    devices
        .iter()
        .map(|d| AllocatedDeviceStatus {
            driver: driver.to_string(),
            pool: d.pool.clone(),
            device: d.device.clone(),
            conditions: Some(vec![Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "Prepared".into(),
                message: "prepared on the node: CDI spec written".into(),
                last_transition_time: now.clone(),
                observed_generation: None,
            }]),
            data: Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(
                d.data.clone(),
            )),
            share_id: d.share_id.clone(),
            ..AllocatedDeviceStatus::default()
        })
        .collect()
}

/// `claim` with `driver`'s entries replaced by `ours`; `None` when that changes nothing (an
/// entry counts as the same when its device, data and condition status are, so a repeated
/// write with a new timestamp is not made).
fn with_entries(
    mut claim: ApiClaim,
    driver: &str,
    ours: &[AllocatedDeviceStatus],
) -> Option<ApiClaim> {
    let status = claim.status.get_or_insert_with(Default::default);
    let all = status.devices.take().unwrap_or_default();
    let (mine, mut others): (Vec<_>, Vec<_>) = all.into_iter().partition(|d| d.driver == driver);
    let key = |d: &AllocatedDeviceStatus| {
        let ready = d.conditions.iter().flatten().map(|c| c.status.clone());
        (
            d.pool.clone(),
            d.device.clone(),
            d.share_id.clone(),
            d.data.as_ref().map(|r| r.0.clone()),
            ready.collect::<Vec<_>>(),
        )
    };
    let same = mine.len() == ours.len() && mine.iter().zip(ours).all(|(a, b)| key(a) == key(b));
    if same {
        return None;
    }
    others.extend(ours.iter().cloned());
    status.devices = (!others.is_empty()).then_some(others);
    Some(claim)
}
