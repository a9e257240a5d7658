//! `gpu-slicer dra slices`: what a node's DRA driver would publish, checked with the real
//! `kubernetes-validate --strict` (hack/install-deps.sh puts it in the repository's venv)
//! for every Kubernetes minor with `resource.k8s.io/v1` (1.34 … 1.37), and the bad-input
//! exits.

mod common;

use std::path::Path;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
}

fn slices(profile: &str, extra: &[&str]) -> std::process::Output {
    bin()
        .args(["dra", "slices", "--backend", &format!("sim:{profile}")])
        .args(["--node-name", "gpu-node-7", "--mig-strategy", "mixed"])
        .args(extra)
        .env_remove("NODE_NAME")
        .env_remove("DRA_DRIVER_NAME")
        .output()
        .expect("run gpu-slicer")
}

#[test]
fn slices_and_classes_validate_strictly_for_every_dra_v1_release() {
    let dir = tempfile::tempdir().unwrap();
    for profile in ["mixed-a100", "dgx-h100"] {
        let out = slices(profile, &["--classes"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file = dir.path().join(format!("{profile}.yaml"));
        std::fs::write(&file, &out.stdout).unwrap();
        common::validate_strictly(&file);
    }
}

#[test]
fn yaml_and_json_carry_the_same_objects_and_the_contract_names() {
    use serde::Deserialize;
    let yaml = slices("mixed-a100", &["--classes"]);
    let text = String::from_utf8(yaml.stdout).unwrap();
    let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .collect();
    let json = slices("mixed-a100", &["--classes", "--format", "json"]);
    let list: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().unwrap(), &docs);

    let classes: Vec<&serde_json::Value> =
        docs.iter().filter(|d| d["kind"] == "DeviceClass").collect();
    assert_eq!(classes[0]["metadata"]["name"], "gpu.gpu-slicer.io");
    assert_eq!(classes[0]["spec"]["extendedResourceName"], "nvidia.com/gpu");
    assert_eq!(classes[1]["metadata"]["name"], "mig.gpu-slicer.io");
    let slice = docs.iter().find(|d| d["kind"] == "ResourceSlice").unwrap();
    assert_eq!(slice["spec"]["driver"], "gpu-slicer.io");
    assert_eq!(slice["spec"]["nodeName"], "gpu-node-7");
    assert_eq!(slice["spec"]["pool"]["name"], "gpu-node-7");
    let devices = slice["spec"]["devices"].as_array().unwrap();
    let gpu2 = devices.iter().find(|d| d["name"] == "gpu-2").unwrap();
    assert_eq!(gpu2["attributes"]["driverVersion"]["version"], "570.124.6");
    assert_eq!(
        gpu2["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
        "0000:47:00.0"
    );
    assert_eq!(gpu2["attributes"]["type"]["string"], "gpu");
    let mig = devices.iter().find(|d| d["name"] == "gpu-1-mig-3g40gb-9-4");
    assert!(
        mig.is_some(),
        "{:?}",
        devices.iter().map(|d| &d["name"]).collect::<Vec<_>>()
    );
    // The PCI address stays a string for YAML 1.1 readers too (base-60 otherwise).
    assert!(text.contains("string: '0000:47:00.0'"), "{text}");
}

#[test]
fn a_bad_driver_or_node_name_exits_2_naming_it() {
    let out = slices("mixed-a100", &["--dra-driver-name", "GPU_Slicer"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("GPU_Slicer"));
    let out = bin()
        .args([
            "dra",
            "slices",
            "--backend",
            "sim:mixed-a100",
            "--node-name",
            "Node_1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Node_1") && err.contains("--node-name"),
        "{err}"
    );
}

#[test]
fn gpus_carry_pcie_root_and_nvlink_domain_and_the_example_claim_validates() {
    use serde::Deserialize;
    let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/nodes/topo-bridged-pairs.yaml");
    let out = slices(&node.display().to_string(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("slices.yaml");
    std::fs::write(&file, &out.stdout).unwrap();
    common::validate_strictly(&file);
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .collect();
    let devices: Vec<&serde_json::Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ResourceSlice")
        .flat_map(|d| d["spec"]["devices"].as_array().unwrap())
        .collect();
    let attr = |name: &str, key: &str| -> Option<String> {
        let d = devices.iter().find(|d| d["name"] == name)?;
        d["attributes"][key]["string"].as_str().map(str::to_string)
    };
    let domain = |n: &str| attr(n, "gpu-slicer.io/nvlinkDomain");
    // Bridged pairs 0-2, 1-3, 4-5, 6-7 (#546): one domain per pair, named after its lowest bus ID.
    assert_eq!(domain("gpu-0").as_deref(), Some("nvl-0000:10:00.0"));
    assert_eq!(domain("gpu-0"), domain("gpu-2"));
    assert_eq!(domain("gpu-1"), domain("gpu-3"));
    assert_ne!(domain("gpu-0"), domain("gpu-1"));
    assert_eq!(domain("gpu-6"), domain("gpu-7"));
    for i in 0..8 {
        let root = attr(&format!("gpu-{i}"), "resource.kubernetes.io/pcieRoot");
        assert!(root.is_some_and(|r| r.starts_with("pci0000:")), "gpu-{i}");
    }
    common::validate_strictly(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples/dra-nvlink-pair.yaml"),
    );
}

#[test]
fn a_mixed_node_with_shares_and_dynamic_mig_validates_in_the_1_34_and_1_35_layouts() {
    use serde::Deserialize;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    // GPU 0 made on demand, GPU 1 static MIG, GPU 2 shared (memory + MPS), GPU 3 whole.
    std::fs::write(
        &config,
        "version: v1\nflags:\n  dra: {dynamicMig: [0]}\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.mps, replicas: 4, devices: [2], isolation: memory+mps}\n",
    )
    .unwrap();
    for (version, combined) in [("1.34", true), ("v1.35.0", false)] {
        let out = slices(
            "mixed-a100",
            &[
                "--config",
                config.to_str().unwrap(),
                "--server-version",
                version,
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file = dir.path().join(format!("slices-{version}.yaml"));
        std::fs::write(&file, &out.stdout).unwrap();
        common::validate_strictly(&file);
        let text = String::from_utf8(out.stdout).unwrap();
        let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| serde_json::Value::deserialize(d).unwrap())
            .collect();
        let with_counters = docs
            .iter()
            .filter(|d| d["spec"]["sharedCounters"].is_array())
            .collect::<Vec<_>>();
        assert_eq!(with_counters.len(), 1, "{version}");
        let set = &with_counters[0]["spec"]["sharedCounters"][0];
        assert_eq!(set["name"], "gpu-0-counter-set");
        assert_eq!(set["counters"]["compute-slices"]["value"], "7");
        // 1.34: the GPU's devices are in its counters' slice; 1.35+: never.
        assert_eq!(
            with_counters[0]["spec"]["devices"].is_array(),
            combined,
            "{version}"
        );
        let devices: Vec<&serde_json::Value> = docs
            .iter()
            .flat_map(|d| d["spec"]["devices"].as_array().into_iter().flatten())
            .collect();
        let get = |n: &str| devices.iter().find(|d| d["name"] == n).copied();
        let placement = get("gpu-0-mig-3g40gb-9-4").expect("a dynamic placement");
        assert_eq!(
            placement["consumesCounters"][0]["counters"]["memory-slice-7"]["value"],
            "1"
        );
        assert!(get("gpu-0").unwrap()["consumesCounters"].is_array());
        assert!(get("gpu-1-mig-3g40gb-9-4").unwrap()["consumesCounters"].is_null());
        let shared = get("gpu-2").unwrap();
        assert_eq!(shared["allowMultipleAllocations"], true);
        assert_eq!(
            shared["capacity"]["memory"]["requestPolicy"]["validRange"]["step"],
            "2Mi"
        );
        assert!(get("gpu-3").unwrap()["allowMultipleAllocations"].is_null());
    }
    let out = slices("mixed-a100", &["--server-version", "latest"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--server-version `latest`"));
}

/// The devices of `dra slices` output as CEL sees them (`device.driver`,
/// `device.attributes['gpu-slicer.io'].x`, `device.allowMultipleAllocations`).
fn cel_devices(text: &str) -> Vec<(String, serde_json::Value)> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .filter(|d| d["kind"] == "ResourceSlice")
        .flat_map(|d| d["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| {
            let attrs: serde_json::Map<String, serde_json::Value> = d["attributes"]
                .as_object()
                .unwrap()
                .iter()
                .filter(|(k, _)| !k.contains('/'))
                .map(|(k, v)| (k.clone(), v.as_object().unwrap().values().next().unwrap().clone()))
                .collect();
            let capacity: Vec<&String> = d["capacity"].as_object().unwrap().keys().collect();
            let device = serde_json::json!({"driver": "gpu-slicer.io",
                "attributes": {"gpu-slicer.io": attrs},
                "capacity": capacity,
                "allowMultipleAllocations": d["allowMultipleAllocations"].as_bool().unwrap_or(false)});
            (d["name"].as_str().unwrap().to_string(), device)
        })
        .collect()
}

/// The devices an example claim template's request can be given: its class's selectors and
/// its own, and a device that has every capacity it requests.
fn matching(example: &str, text: &str) -> Vec<String> {
    use serde::Deserialize;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let docs = |t: &str| -> Vec<serde_json::Value> {
        serde_yaml_ng::Deserializer::from_str(t)
            .map(|d| serde_json::Value::deserialize(d).unwrap())
            .collect()
    };
    let template = docs(&read(example))
        .into_iter()
        .find(|d| d["kind"] == "ResourceClaimTemplate")
        .unwrap();
    let request = &template["spec"]["spec"]["devices"]["requests"][0]["exactly"];
    let class = docs(&read("deploy/dra/deviceclasses.yaml"))
        .into_iter()
        .find(|d| d["metadata"]["name"] == request["deviceClassName"])
        .unwrap();
    let exprs: Vec<cel::Program> = class["spec"]["selectors"]
        .as_array()
        .into_iter()
        .chain(request["selectors"].as_array())
        .flatten()
        .map(|s| cel::Program::compile(s["cel"]["expression"].as_str().unwrap()).unwrap())
        .collect();
    let wants_capacity = request["capacity"]["requests"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    cel_devices(text)
        .into_iter()
        .filter(|(_, device)| {
            let mut ctx = cel::Context::default();
            ctx.add_variable("device", device.clone()).unwrap();
            exprs
                .iter()
                .all(|p| matches!(p.execute(&ctx), Ok(cel::Value::Bool(true))))
        })
        // A capacity request needs the capacity on the device (the amount is the scheduler's).
        .filter(|(_, device)| {
            let has = device["capacity"].as_array().unwrap();
            wants_capacity.keys().all(|k| has.iter().any(|c| c == k))
        })
        .map(|(name, _)| name)
        .collect()
}

#[test]
fn the_example_claims_select_the_devices_they_say() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    // An H100 node whose GPUs 0 and 1 are shared with driver-enforced memory.
    std::fs::write(
        &config,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.mem, replicas: 8, devices: [0, 1], isolation: memory}\n",
    )
    .unwrap();
    let out = slices("dgx-h100", &["--config", config.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        matching("deploy/dra/examples/share-10gi-25pct.yaml", &text),
        ["gpu-0", "gpu-1"]
    );
    // An A100 node whose GPU 0 is made on demand; GPU 1's 1g.10gb exist already.
    std::fs::write(&config, "version: v1\nflags:\n  dra: {dynamicMig: [0]}\n").unwrap();
    let out = slices("mixed-a100", &["--config", config.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    let on_demand = matching("deploy/dra/examples/mig-on-demand.yaml", &text);
    assert_eq!(
        on_demand,
        (0..7)
            .map(|s| format!("gpu-0-mig-1g10gb-19-{s}"))
            .collect::<Vec<_>>()
    );
    let premade = matching("deploy/dra/examples/mig-1g10gb.yaml", &text);
    assert!(
        premade.contains(&"gpu-1-mig-1g10gb-19-2".to_string()),
        "{premade:?}"
    );
}

/// deploy/dra/deviceclasses.yaml says it is what `dra slices --classes` prints: the same
/// objects, field for field (its comments aside).
#[test]
fn the_shipped_classes_are_what_classes_prints() {
    use serde::Deserialize;
    let docs = |t: &str| -> Vec<serde_json::Value> {
        serde_yaml_ng::Deserializer::from_str(t)
            .map(|d| serde_json::Value::deserialize(d).unwrap())
            .filter(|d| d["kind"] == "DeviceClass")
            .collect()
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = std::fs::read_to_string(root.join("deploy/dra/deviceclasses.yaml")).unwrap();
    let out = slices("mixed-a100", &["--classes"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = docs(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(printed.len(), 2, "{printed:?}");
    assert_eq!(docs(&shipped), printed);
}
