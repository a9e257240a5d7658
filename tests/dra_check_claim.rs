//! `gpu-slicer dra check-claim FILE`: the shipped example claims pass against the local
//! cluster's node (hack/cluster/node.yaml) under the DRA overlay's own config; a bad opaque config, a kind that does not fit its class
//! and a selector naming an attribute the node does not publish exit 2 naming the file, the
//! document, the field and the value.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// deploy/dra's own config (the ConfigMap patch), written to `dir`.
fn overlay_config(dir: &Path) -> PathBuf {
    use serde::Deserialize;
    let text = std::fs::read_to_string(root().join("deploy/dra/config.yaml")).unwrap();
    let cm = serde_json::Value::deserialize(serde_yaml_ng::Deserializer::from_str(&text)).unwrap();
    let path = dir.join("config.yaml");
    std::fs::write(&path, cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    path
}

fn check(file: &Path, config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(["dra", "check-claim"])
        .arg(file)
        .arg("--backend")
        .arg(format!(
            "sim:{}",
            root().join("hack/cluster/node.yaml").display()
        ))
        .arg("--config")
        .arg(config)
        .env_remove("DRA_DRIVER_NAME")
        .env_remove("GPU_SLICER_BACKEND")
        .output()
        .expect("run gpu-slicer")
}

#[test]
fn every_shipped_example_passes_against_the_overlays_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = overlay_config(dir.path());
    let examples = root().join("deploy/dra/examples");
    let mut templates = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name == "kustomization.yaml" || name == "namespace.yaml" {
            continue;
        }
        let out = check(&path, &config);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        templates += stdout
            .lines()
            .filter(|l| l.contains("(ResourceClaimTemplate ") && l.contains("): ok:"))
            .count();
        assert!(stdout.contains(&name), "{stdout}");
    }
    // Every example but the extended-resource pod brings its template.
    assert_eq!(templates, 5);
}

#[test]
fn problems_exit_2_naming_file_document_field_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let config = overlay_config(dir.path());
    let file = dir.path().join("claims.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: v1
kind: Namespace
metadata: {name: ml}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: mig-ts, namespace: ml}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.gpu-slicer.io
          selectors:
          - cel:
              expression: device.attributes['gpu-slicer.io'].profil == '1g.10gb'
      config:
      - requests: ["mig"]
        opaque:
          driver: gpu-slicer.io
          parameters:
            apiVersion: gpu-slicer.io/v1alpha1
            kind: GpuConfig
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: shared, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.gpu-slicer.io
    config:
    - opaque:
        driver: gpu-slicer.io
        parameters:
          apiVersion: gpu-slicer.io/v1alpha1
          kind: GpuConfig
          sharing: {strategy: Spatial}
"#,
    )
    .unwrap();
    let out = check(&file, &config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let f = file.display().to_string();
    assert!(err.contains(&format!("claim file {f}")), "{err}");
    assert!(
        err.contains("document 1 (ResourceClaimTemplate ml/mig-ts): field `spec.spec.devices.requests[0].exactly.selectors[0].cel.expression`: `gpu-slicer.io/profil`: the node publishes no such attribute"),
        "{err}"
    );
    assert!(
        err.contains("document 1 (ResourceClaimTemplate ml/mig-ts): field `spec.spec.devices.config[0].opaque.parameters.kind`: `GpuConfig` configures whole GPUs, but request mig asks for MIG devices (class mig.gpu-slicer.io): expected `MigDeviceConfig`"),
        "{err}"
    );
    assert!(
        err.contains("document 2 (ResourceClaim ml/shared): field `spec.devices.config[0].opaque.parameters.sharing.strategy`")
            && err.contains("Spatial"),
        "{err}"
    );
    // Nothing on stdout: no claim of the file is called good when any is not.
    assert!(out.stdout.is_empty());
}

#[test]
fn a_missing_file_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = overlay_config(dir.path());
    let missing = dir.path().join("nope.yaml");
    let out = check(&missing, &config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("claim file {}", missing.display())),
        "{err}"
    );
}
