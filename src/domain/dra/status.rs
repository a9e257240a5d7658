//! What the driver reports in a prepared claim's `status.devices` (ResourceClaim device
//! status: `DRAResourceClaimDeviceStatus`, beta and on by default since 1.33, GA in 1.37), so
//! that `kubectl get resourceclaim -o yaml` shows which physical device a claim holds: per
//! device of ours, its `data` names the GPU or MIG device behind the published name (UUID,
//! type, product, index; parent GPU and profile for MIG) and the CDI IDs handed to the
//! kubelet. The runtime writes it through the API after the prepare has been answered and
//! removes it at Unprepare. Pure.

use serde_json::{Map, Value};

use super::model::Attribute;
use super::slices::NodeDevice;

/// The attributes of a published device copied into `data`, in this order.
const DATA_ATTRIBUTES: [&str; 6] = [
    "uuid",
    "type",
    "productName",
    "index",
    "parentUUID",
    "profile",
];

/// One device's entry, without the driver (the writer's) and the Ready condition (the
/// writer stamps its time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceStatus {
    /// Pool.
    pub(crate) pool: String,
    /// Published device name.
    pub(crate) device: String,
    /// The share of a shared device (the allocation result's `shareID`).
    pub(crate) share_id: Option<String>,
    /// `data`: the physical device and the CDI IDs (well under the API's 10 KiB).
    pub(crate) data: Value,
}

impl DeviceStatus {
    /// The entry of a share (`share_id`) and of a device made for the claim (`made`: the
    /// MIG device's UUID, which the published device has none of).
    pub(crate) fn prepared_as(mut self, share_id: Option<String>, made: Option<&str>) -> Self {
        self.share_id = share_id;
        if let (Some(uuid), Value::Object(data)) = (made, &mut self.data) {
            data.insert("uuid".into(), Value::from(uuid));
        }
        self
    }
}

/// The entry of `device` (as published on this node) prepared with `cdi_ids`.
pub(crate) fn device_status(pool: &str, device: &NodeDevice, cdi_ids: &[String]) -> DeviceStatus {
    let mut data = Map::new();
    for key in DATA_ATTRIBUTES {
        let value = match device.device.attributes.get(key) {
            Some(Attribute::String(s) | Attribute::Version(s)) => Value::from(s.as_str()),
            Some(Attribute::Int(i)) => Value::from(*i),
            Some(Attribute::Bool(b)) => Value::from(*b),
            None => continue,
        };
        data.insert(key.to_string(), value);
    }
    data.insert("cdiDeviceIDs".into(), Value::from(cdi_ids.to_vec()));
    DeviceStatus {
        pool: pool.to_string(),
        device: device.name.clone(),
        share_id: None,
        data: Value::Object(data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::dra::slices;
    use crate::domain::view::Overlay;

    #[test]
    fn a_mig_device_names_its_uuid_parent_and_profile() {
        let (inv, _, plan) = crate::testkit::fixtures::planned(
            "mixed-a100",
            "version: v1\nflags:\n  migStrategy: mixed\n",
        );
        let health = slices::health_map(&inv, &plan, &Overlay::default());
        let devices = slices::node_devices(&inv, &plan, &health);
        let mig = devices.get("gpu-0-mig-1g10gb-19-1").expect("a MIG device");
        let s = device_status("node-a", mig, &["k8s.gpu-slicer.io/claim=u-x".into()]);
        assert_eq!(s.device, "gpu-0-mig-1g10gb-19-1");
        assert_eq!(s.data["uuid"], "MIG-1b2c3d4e-0000-4a00-8000-000000000008");
        assert_eq!(s.data["type"], "mig");
        assert_eq!(s.data["profile"], "1g.10gb");
        assert_eq!(s.data["parentUUID"], mig.gpu_uuid.as_str());
        assert_eq!(s.data["cdiDeviceIDs"][0], "k8s.gpu-slicer.io/claim=u-x");
        let gpu = device_status("node-a", devices.get("gpu-2").expect("GPU 2"), &[]);
        assert_eq!(gpu.data["index"], 2);
        assert!(gpu.data.get("parentUUID").is_none());
    }
}
