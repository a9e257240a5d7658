//! The DeviceClasses of this driver: `gpu.<driver>` (whole GPUs; it also serves the plain
//! `nvidia.com/gpu` extended resource through KEP-5004's `extendedResourceName`) and
//! `mig.<driver>` (MIG devices). Both select on our `type` attribute, as NVIDIA's classes do
//! on theirs. Printed by `gpu-slicer dra slices --classes` and shipped in `deploy/dra/`.

use super::model::{CelSelector, DeviceClass, DeviceClassSpec, DeviceSelector, ObjectMeta};
use super::slices::DeviceType;

/// Label of every class: the name `deploy/` gives every object of the agent's, so
/// `kubectl delete -l` and the shipped file take the same classes as `--classes` prints.
const NAME_LABEL: (&str, &str) = ("app.kubernetes.io/name", "gpu-slicer");

/// The extended resource the whole-GPU class serves.
pub(crate) const EXTENDED_RESOURCE: &str = crate::domain::plan::GPU_RESOURCE;

/// The classes of `driver`.
pub(crate) fn build(driver: &str) -> Vec<DeviceClass> {
    vec![
        class(driver, DeviceType::Gpu, Some(EXTENDED_RESOURCE)),
        class(driver, DeviceType::Mig, None),
    ]
}

/// Name of the class of `kind` for `driver`: `gpu.gpu-slicer.io`, `mig.gpu-slicer.io`.
pub(crate) fn class_name(driver: &str, kind: DeviceType) -> String {
    format!("{}.{driver}", kind.as_str())
}

fn class(driver: &str, kind: DeviceType, extended: Option<&str>) -> DeviceClass {
    let expression = format!(
        "device.driver == '{driver}' && device.attributes['{driver}'].type == '{}'",
        kind.as_str()
    );
    DeviceClass {
        api_version: super::API_VERSION.into(),
        kind: "DeviceClass".into(),
        metadata: ObjectMeta {
            name: class_name(driver, kind),
            labels: [(NAME_LABEL.0.to_string(), NAME_LABEL.1.to_string())].into(),
            ..ObjectMeta::default()
        },
        spec: DeviceClassSpec {
            selectors: vec![DeviceSelector {
                cel: CelSelector { expression },
            }],
            extended_resource_name: extended.map(str::to_string),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_class_serves_nvidia_gpu_and_mig_class_does_not() {
        let classes = build("gpu-slicer.io");
        assert_eq!(classes[0].metadata.name, "gpu.gpu-slicer.io");
        assert_eq!(
            classes[0].spec.extended_resource_name.as_deref(),
            Some("nvidia.com/gpu")
        );
        assert_eq!(
            classes[0].spec.selectors[0].cel.expression,
            "device.driver == 'gpu-slicer.io' && device.attributes['gpu-slicer.io'].type == 'gpu'"
        );
        assert_eq!(classes[1].metadata.name, "mig.gpu-slicer.io");
        assert_eq!(
            classes[1].metadata.labels["app.kubernetes.io/name"],
            "gpu-slicer"
        );
        assert_eq!(classes[1].spec.extended_resource_name, None);
        let json = serde_json::to_value(&classes[1]).unwrap();
        assert!(json["spec"].get("extendedResourceName").is_none());
    }
}
