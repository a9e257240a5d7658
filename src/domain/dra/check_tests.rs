use serde_json::json;

use super::*;

const D: &str = "gpu-slicer.io";

fn published() -> Published {
    Published {
        attributes: [
            "gpu-slicer.io/productName",
            "gpu-slicer.io/profile",
            "gpu-slicer.io/onDemand",
            "gpu-slicer.io/type",
            "resource.kubernetes.io/pcieRoot",
        ]
        .map(String::from)
        .into(),
        capacity: ["gpu-slicer.io/memory", "gpu-slicer.io/compute"]
            .map(String::from)
            .into(),
    }
}

fn template(requests: serde_json::Value, config: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": requests, "config": config}}}})
}

fn mig_request(cel: &str) -> serde_json::Value {
    json!([{"name": "mig", "exactly": {"deviceClassName": "mig.gpu-slicer.io",
        "selectors": [{"cel": {"expression": cel}}]}}])
}

fn params(kind: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut p = json!({"apiVersion": "gpu-slicer.io/v1alpha1", "kind": kind});
    p.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    p
}

#[test]
fn a_good_template_is_checked_and_other_kinds_are_skipped() {
    let docs = [
        template(
            mig_request(
                "device.attributes['gpu-slicer.io'].profile == '1g.10gb' && device.attributes[\"gpu-slicer.io\"]['onDemand']",
            ),
            json!([{"requests": ["mig"], "opaque": {"driver": D,
                "parameters": params("MigDeviceConfig", json!({"sharing": {"strategy": "TimeSlicing"}}))}}]),
        ),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
    ];
    let checked = check(&docs, D, &published()).unwrap();
    assert_eq!(
        checked,
        [Checked {
            doc: 0,
            kind: "ResourceClaimTemplate".into(),
            name: "ml/t".into(),
            requests: 1,
            configs: 1,
            selectors: 1,
        }]
    );
}

#[test]
fn a_kind_that_does_not_fit_the_class_says_which_was_expected() {
    let docs = [template(
        mig_request("true"),
        json!([{"opaque": {"driver": D, "parameters": params("GpuConfig", json!({}))}}]),
    )];
    let p = check(&docs, D, &published()).unwrap_err();
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(
        p[0].field,
        "spec.spec.devices.config[0].opaque.parameters.kind"
    );
    assert_eq!(
        p[0].to_string(),
        "document 0 (ResourceClaimTemplate ml/t): field `spec.spec.devices.config[0].opaque.parameters.kind`: \
         `GpuConfig` configures whole GPUs, but request mig asks for MIG devices (class mig.gpu-slicer.io): expected `MigDeviceConfig`"
    );
}

#[test]
fn a_bad_opaque_field_is_named_with_prepares_words() {
    let docs = [template(
        mig_request("true"),
        json!([{"requests": ["mig"], "opaque": {"driver": D,
            "parameters": params("MigDeviceConfig", json!({"sharing": {"strategy": "Sometimes"}}))}}]),
    )];
    let p = check(&docs, D, &published()).unwrap_err();
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].field
            .starts_with("spec.spec.devices.config[0].opaque.parameters.sharing"),
        "{p:?}"
    );
    assert!(p[0].message.contains("Sometimes"), "{p:?}");
    // Another driver's config is not ours to judge.
    let docs = [template(
        mig_request("true"),
        json!([{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "Anything"}}}]),
    )];
    assert!(check(&docs, D, &published()).is_ok());
}

#[test]
fn unpublished_names_unknown_requests_and_classes_are_each_reported() {
    let docs = [
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu-slicer.io",
                    "selectors": [{"cel": {"expression":
                        "device.attributes['gpu-slicer.io'].productname.startsWith('NVIDIA') && device.attributes['other.io'].x"}}],
                    "capacity": {"requests": {"memry": "10Gi"}}}},
                {"name": "x", "exactly": {"deviceClassName": "vgpu.gpu-slicer.io"}}],
            "constraints": [{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieroot"}],
            "config": [{"requests": ["gpus"], "opaque": {"driver": D,
                "parameters": params("GpuConfig", json!({}))}}]}}}),
    ];
    let p = check(&docs, D, &published()).unwrap_err();
    let fields: Vec<&str> = p.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.devices.requests[0].exactly.selectors[0].cel.expression",
            "spec.devices.requests[0].exactly.capacity.requests",
            "spec.devices.requests[1].exactly.deviceClassName",
            "spec.devices.constraints[0].matchAttribute",
            "spec.devices.config[0].requests[0]",
        ],
        "{p:#?}"
    );
    assert!(
        p[0].message
            .starts_with("`gpu-slicer.io/productname`: the node publishes no such attribute (it has onDemand, productName, profile, type)"),
        "{}",
        p[0].message
    );
    assert!(p[1].message.contains("`memry`") && p[1].message.contains("compute, memory"));
    assert!(p[2].message.contains("`vgpu.gpu-slicer.io`"));
    assert!(
        p[3].message.contains("(it has pcieRoot)"),
        "{}",
        p[3].message
    );
    assert!(p[4].message.contains("`gpus` names no request"));
}

#[test]
fn references_read_both_forms_and_skip_what_they_cannot() {
    let r = references(
        "device.attributes['a.io'].x && device.capacity[\"a.io\"]['mem'].compareTo(quantity('1Gi')) > 0 \
         && 'y' in device.attributes['a.io'] && device.attributes[d].z",
    );
    assert_eq!(
        r,
        [
            (Names::Attributes, "a.io".into(), "x".into()),
            (Names::Capacity, "a.io".into(), "mem".into()),
        ]
    );
}
