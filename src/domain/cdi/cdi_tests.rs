//! The CDI provider: golden specs in `cdi-specs/`, the official JSON schema (as the
//! `container-device-interface` crate ships it), that crate's own parser and validator as a
//! second, independent check of every spec we emit, the rules learnt from the 51 Podman 4.3.1
//! cases, and the invalid examples in `tests/fixtures/cdi/`. Nothing outside the repository
//! and its dependencies is read. (`cdi generate / list / validate / remove` through the
//! built binary: tests/cli_cdi.rs.)

use std::fs;
use std::path::{Path, PathBuf};

use crate::domain::cdi::{
    self, Format, GenerateOptions, NoProbe, Spec, qualified_name, spec_file_name,
};
use crate::domain::inventory::Backend;
use crate::platform::cdi_host::validate_file;
use crate::platform::sim::{BUILTIN_PROFILES, SimBackend};
use crate::testkit::fixtures::{CDI_FIXTURES as FIXTURES, cdi_must_reject as must_reject};

const KIND: &str = "gpu-slicer.io/gpu";

fn spec_for(profile: &str) -> Spec {
    let inv = SimBackend::open(profile)
        .and_then(|b| b.discover())
        .expect("built-in profile");
    cdi::generate(&inv, &GenerateOptions::new(KIND), &NoProbe).expect("generate")
}

/// The official CDI schema, compiled by our own `jsonschema`: the copy the
/// `container-device-interface` crate ships (its `src/schema/`), with `defs.json` merged in
/// by the crate's own helper.
fn schema_validator() -> jsonschema::Validator {
    let schema = container_device_interface::schema::builtin_schema_value()
        .expect("the crate's CDI schema parses");
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft7)
        .build(&schema)
        .expect("official CDI schema compiles")
}

/// The second validator: CDI-RS, the reference Rust implementation, loading `bytes` the way a
/// runtime loads a spec file (strict typed parse, schema, names, edits, version fields).
fn cdi_rs_check(bytes: &[u8], file_name: &str) -> Result<(), String> {
    container_device_interface::schema::validate_builtin(bytes).map_err(|e| format!("{e:#}"))?;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(file_name);
    fs::write(&path, bytes).expect("write spec");
    container_device_interface::spec::read_spec(&path, 0)
        .map(drop)
        .map_err(|e| format!("{e:#}"))
}

fn assert_cdi_rs_accepts(bytes: &[u8], file_name: &str, what: &str) {
    if let Err(e) = cdi_rs_check(bytes, file_name) {
        panic!("{what}: CDI-RS rejects it: {e}");
    }
}

fn assert_schema_valid(v: &jsonschema::Validator, doc: &serde_json::Value, what: &str) {
    let errors: Vec<String> = v.iter_errors(doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{what} fails the CDI schema: {errors:?}");
}

/// Specs of every built-in profile, in both encodings and with/without a dev root.
fn all_generated() -> Vec<(String, Spec)> {
    let mut out = Vec::new();
    for (name, _) in BUILTIN_PROFILES {
        out.push((name.to_string(), spec_for(name)));
        let inv = SimBackend::open(name)
            .and_then(|b| b.discover())
            .expect("profile");
        let opts = GenerateOptions {
            kind: "example-vendor.com/gpu_x".into(),
            dev_root: Some(PathBuf::from("/run/nvidia/driver")),
            shares: None,
            driver: None,
        };
        let spec = cdi::generate(&inv, &opts, &NoProbe).expect("generate with dev root");
        out.push((format!("{name} (dev root)"), spec));
    }
    out.push(("mixed-a100 (shares)".into(), shares_spec()));
    out.push(("mixed-a100 (driver)".into(), driver_spec()));
    out
}

/// A host driver as `driver::discover` reports it on a typical node, built by hand so the
/// golden spec does not depend on this machine.
fn driver_spec() -> Spec {
    use crate::platform::driver::{Driver, DriverFile, Library, container_edits};
    let v = "570.124.06";
    let file = |p: String| DriverFile {
        container_path: p.clone(),
        host_path: p,
    };
    let lib = |name: &str, soname: Option<&str>| Library {
        file: file(format!("/usr/lib/x86_64-linux-gnu/{name}.so.{v}")),
        soname: soname.map(str::to_string),
    };
    let driver = Driver {
        version: v.into(),
        host_root: "/".into(),
        libraries: vec![
            lib("libcuda", Some("libcuda.so.1")),
            lib("libcudadebugger", Some("libcudadebugger.so.1")),
            lib(
                "libnvidia-gpucomp",
                Some(&format!("libnvidia-gpucomp.so.{v}")),
            ),
            lib("libnvidia-ml", Some("libnvidia-ml.so.1")),
            lib("libnvidia-nvvm", Some("libnvidia-nvvm.so.4")),
            lib(
                "libnvidia-ptxjitcompiler",
                Some("libnvidia-ptxjitcompiler.so.1"),
            ),
        ],
        firmware: vec![
            file(format!("/lib/firmware/nvidia/{v}/gsp_ga10x.bin")),
            file(format!("/lib/firmware/nvidia/{v}/gsp_tu10x.bin")),
        ],
        binaries: [
            "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server",
            "nvidia-smi",
        ]
        .iter()
        .map(|b| file(format!("/usr/bin/{b}")))
        .collect(),
        ipc_sockets: vec![file("/run/nvidia-persistenced/socket".into())],
        ldconfig: "/sbin/ldconfig".into(),
        searched: vec!["/etc/ld.so.cache".into()],
    };
    let inv = SimBackend::open("mixed-a100")
        .and_then(|b| b.discover())
        .expect("profile");
    let opts = GenerateOptions {
        driver: Some(container_edits(
            &driver,
            Path::new("/usr/local/bin/gpu-slicer"),
        )),
        ..GenerateOptions::new(KIND)
    };
    cdi::generate(&inv, &opts, &NoProbe).expect("generate with driver")
}

#[test]
fn share_devices_carry_the_limits_of_k_shares() {
    let spec = shares_spec();
    let inv = SimBackend::open("mixed-a100")
        .and_then(|b| b.discover())
        .expect("profile");
    let dev = |name: &str| {
        spec.devices
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let gpu3 = &inv.gpus[3];
    let per = gpu3.memory_bytes / 4;
    for k in 1..=4u64 {
        let by_index = dev(&format!("3-share-{k}"));
        let by_uuid = dev(&format!("{}-share-{k}", gpu3.uuid));
        assert_eq!(by_index.container_edits, by_uuid.container_edits);
        let e = &by_index.container_edits;
        // The parent's node, the hook with k/4 of the memory, MPS env and mounts.
        assert_eq!(e.device_nodes, dev("3").container_edits.device_nodes);
        assert_eq!(e.hooks.len(), 1);
        let hook = &e.hooks[0];
        assert_eq!(hook.hook_name, "createRuntime");
        assert_eq!(hook.path, "/usr/local/bin/gpu-slicer");
        let bytes = (k * per).to_string();
        assert!(
            hook.args
                .windows(2)
                .any(|w| w[0] == "--bytes" && w[1] == bytes)
                && hook
                    .args
                    .windows(2)
                    .any(|w| w[0] == "--device" && w[1] == gpu3.uuid),
            "{:?}",
            hook.args
        );
        assert!(
            e.env
                .contains(&format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={}", k * 25)),
            "{:?}",
            e.env
        );
        assert!(
            e.env
                .contains(&format!("CUDA_MPS_PIPE_DIRECTORY=/mps/{}/pipe", gpu3.uuid))
        );
        let mounts: Vec<_> = e
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
            .collect();
        let pipe = format!("/run/nvidia/mps/{}/pipe", gpu3.uuid);
        assert!(mounts.contains(&(pipe.as_str(), format!("/mps/{}/pipe", gpu3.uuid).as_str())));
        // GPU 3's own daemon's /dev/shm, no other.
        let shm = format!("/run/nvidia/mps/{}/shm", gpu3.uuid);
        assert_eq!(shm_of(e), vec![shm.as_str()]);
    }
    assert!(spec.devices.iter().all(|d| d.name != "3-share-5"));
    // GPU 2: memory only (no MPS env), 2 ways.
    let e = &dev("2-share-2").container_edits;
    assert!(e.env.is_empty() && e.mounts.is_empty(), "{e:?}");
    assert!(
        e.hooks[0]
            .args
            .contains(&(inv.gpus[2].memory_bytes / 2 * 2).to_string())
    );
    // MIG 3g.40gb (MPS only): MPS env, no memory hook (the driver has none for MIG).
    let mig = inv
        .migs()
        .find(|(_, m)| m.profile == "3g.40gb")
        .map(|(_, m)| m.clone())
        .expect("a 3g.40gb slice");
    let e = &dev(&format!("{}-share-2", mig.uuid)).container_edits;
    assert!(e.hooks.is_empty());
    assert!(
        e.env
            .contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100".to_string())
    );
    assert_eq!(e.device_nodes.len(), 3, "GPU node and the slice's two caps");
    // Issue 13 item 11: shares of different devices never share a /dev/shm (it was one
    // `<mpsRoot>/shm` for all).
    let mig_shm = format!("/run/nvidia/mps/{}/shm", mig.uuid);
    assert_eq!(shm_of(e), vec![mig_shm.as_str()]);
    assert_ne!(shm_of(e), shm_of(&dev("3-share-1").container_edits));
    // Whole devices are untouched and still present; the spec stays loadable by 0.5.0.
    assert!(dev("2").container_edits.hooks.is_empty());
    assert_eq!(spec.cdi_version, "0.5.0");
}

/// Host paths bind-mounted at `/dev/shm` by these edits.
fn shm_of(e: &crate::domain::cdi::ContainerEdits) -> Vec<&str> {
    e.mounts
        .iter()
        .filter(|m| m.container_path == "/dev/shm")
        .map(|m| m.host_path.as_str())
        .collect()
}

/// mixed-a100 with `hack/configs/shares.yaml`: per-share devices with the hook at a fixed
/// host path, so the golden is machine-independent.
fn shares_spec() -> Spec {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cfg = crate::platform::config_file::load(
        Some(&root.join("hack/configs/shares.yaml")),
        &crate::domain::config::Overrides::default(),
    )
    .expect("shares.yaml");
    let inv = SimBackend::open("mixed-a100")
        .and_then(|b| b.discover())
        .expect("profile");
    let plan = crate::domain::plan::build(&inv, &cfg).expect("plan");
    let opts = GenerateOptions {
        kind: KIND.into(),
        dev_root: None,
        shares: Some(cdi::shares::ShareOptions {
            plan: plan.into(),
            mps_root: cfg.mps_root.clone(),
            hook: cdi::shares::HookSettings {
                path: "/usr/local/bin/gpu-slicer".into(),
                nvml_lib: None,
                env: Vec::new(),
            },
        }),
        driver: None,
    };
    cdi::generate(&inv, &opts, &NoProbe).expect("generate with shares")
}

#[test]
fn cdi_specs_dir_matches_generator() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cdi-specs");
    let goldens = BUILTIN_PROFILES
        .iter()
        .map(|(name, _)| (name.to_string(), spec_for(name)))
        .chain([
            ("mixed-a100-shares".to_string(), shares_spec()),
            ("mixed-a100-driver".to_string(), driver_spec()),
        ]);
    for (name, spec) in goldens {
        let bytes = spec.to_bytes(Format::Yaml).expect("yaml");
        let path = dir.join(format!("{name}.yaml"));
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            fs::create_dir_all(&dir).expect("mkdir cdi-specs");
            fs::write(&path, &bytes).expect("write golden");
        }
        let want = fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
        assert!(
            want == bytes,
            "{} drifted; run `UPDATE_GOLDEN=1 cargo test --lib domain::cdi` and review the diff",
            path.display()
        );
        // The checked-in file is itself a valid spec.
        validate_file(&path).expect("golden spec validates");
        assert_cdi_rs_accepts(&want, &format!("{name}.yaml"), &path.display().to_string());
    }
}

#[test]
fn generated_specs_pass_the_official_schema_in_both_encodings() {
    let v = schema_validator();
    for (what, spec) in all_generated() {
        for format in [Format::Json, Format::Yaml] {
            let bytes = spec.to_bytes(format).expect("serialise");
            let text = String::from_utf8(bytes).expect("utf8");
            let doc: serde_json::Value = match format {
                Format::Json => serde_json::from_str(&text).expect("json"),
                Format::Yaml => serde_yaml_ng::from_str(&text).expect("yaml"),
            };
            assert_schema_valid(&v, &doc, &format!("{what} as {format}"));
            assert_cdi_rs_accepts(
                text.as_bytes(),
                &spec_file_name(&spec.kind, format),
                &format!("{what} as {format}"),
            );
            let back = Spec::parse(&text, Path::new("x.yaml")).expect("parse back");
            assert_eq!(back, spec, "{what} round-trips through {format}");
        }
    }
}

#[test]
fn schema_check_catches_what_it_should() {
    // Guard against a schema that silently accepts everything (e.g. an unresolved $ref).
    let v = schema_validator();
    let bad = serde_json::json!({"cdiVersion": "0.5.0", "kind": "a.com/bb",
        "devices": [{"name": "d", "containerEdits": {"deviceNodes": [{"hostPath": "/x"}]}}]});
    assert!(!v.is_valid(&bad), "deviceNode without path must fail");
    assert!(!v.is_valid(&serde_json::json!({})));
}

#[test]
fn cdi_rs_check_catches_what_it_should() {
    // The second validator must be able to fail: a spec without devices, an unknown key,
    // a device name with a space.
    for (name, text) in [
        (
            "a.yaml",
            "cdiVersion: \"0.5.0\"\nkind: example.org/card\ndevices: []\n",
        ),
        (
            "b.yaml",
            "cdiVersion: \"0.5.0\"\nkind: example.org/card\nfoo: 1\ndevices:\n- name: d\n  containerEdits: {env: [A=1]}\n",
        ),
        (
            "c.yaml",
            "cdiVersion: \"0.5.0\"\nkind: example.org/card\ndevices:\n- name: \"bad name!\"\n  containerEdits: {env: [A=1]}\n",
        ),
    ] {
        assert!(cdi_rs_check(text.as_bytes(), name).is_err(), "{text}");
    }
    let ok = "cdiVersion: \"0.5.0\"\nkind: example.org/card\ndevices:\n- name: d\n  containerEdits: {env: [A=1]}\n";
    cdi_rs_check(ok.as_bytes(), "ok.yaml").expect("a valid spec passes");
}

/// What the 51 Podman 4.3.1 cases taught, asserted on everything we emit.
#[test]
fn generated_specs_avoid_every_pattern_podman_rejected() {
    for (what, spec) in all_generated() {
        let json = String::from_utf8(spec.to_bytes(Format::Json).expect("json")).expect("utf8");
        let yaml = String::from_utf8(spec.to_bytes(Format::Yaml).expect("yaml")).expect("utf8");
        // Versions: exactly one Podman 4.3.1 loads, no `v` prefix, no newer than 0.5.0.
        assert!(
            ["0.3.0", "0.4.0", "0.5.0"].contains(&spec.cdi_version.as_str()),
            "{what}"
        );
        assert_eq!(
            spec.cdi_version,
            cdi::minimum_version(&spec),
            "{what}: lowest version"
        );
        assert!(yaml.starts_with(&format!("cdiVersion: \"{}\"\n", spec.cdi_version)));
        // Fields Podman 4.3.1's strict parser does not know.
        for key in [
            "annotations",
            "additionalGids",
            "additionalGIDs",
            "intelRdt",
            "netDevices",
            "enableCMT",
            "enableMBM",
            "schemata",
            "enableMonitoring",
            "\"permissions\"",
        ] {
            assert!(!json.contains(key), "{what} emits {key}");
        }
        // Kind: vendor and class at least 2 chars, class without dots, no extra `/`.
        let (vendor, class) = spec.kind.split_once('/').expect("kind has a slash");
        assert!(
            vendor.len() >= 2 && class.len() >= 2,
            "{what}: {}",
            spec.kind
        );
        assert!(!class.contains('.') && !class.contains('/'), "{what}");
        // Devices: at least one, unique names, no empty edits, `all` defined explicitly.
        assert!(!spec.devices.is_empty());
        let mut names: Vec<_> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert!(names.contains(&"all"), "{what}");
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "{what}: duplicate device names");
        for d in &spec.devices {
            assert!(
                !d.container_edits.is_empty(),
                "{what}: {} has no edits",
                d.name
            );
            for n in &d.container_edits.device_nodes {
                assert!(n.path.starts_with("/dev/"), "{what}: {}", n.path);
            }
        }
        // Env: KEY=VALUE, and the void guard is there.
        for e in &spec.container_edits.env {
            assert!(e.find('=').is_some_and(|i| i > 0), "{what}: {e}");
        }
        assert!(
            spec.container_edits
                .env
                .contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string())
        );
        // File names runtimes scan.
        for f in [Format::Yaml, Format::Json] {
            let n = spec_file_name(&spec.kind, f);
            assert!(n.ends_with(".yaml") || n.ends_with(".json"), "{n}");
        }
        // The default kind must not collide with NVIDIA's.
        assert_ne!(KIND, "nvidia.com/gpu");
        assert_ne!(KIND, "k8s.device-plugin.nvidia.com/gpu");
    }
}

#[test]
fn every_uuid_has_a_stable_device_name() {
    let inv = SimBackend::open("dgx-h100")
        .and_then(|b| b.discover())
        .expect("profile");
    let spec = spec_for("dgx-h100");
    let names = spec.qualified_names();
    for g in &inv.gpus {
        assert!(names.contains(&qualified_name(KIND, &g.uuid)), "{}", g.uuid);
        for m in &g.mig_devices {
            assert!(names.contains(&qualified_name(KIND, &m.uuid)), "{}", m.uuid);
        }
    }
    assert_eq!(
        qualified_name(KIND, "GPU-1"),
        "gpu-slicer.io/gpu=GPU-1".to_string()
    );
}

#[test]
fn validate_rejects_every_invalid_example() {
    let files = must_reject();
    assert!(files.len() >= 30, "{files:?}");
    for f in &files {
        assert!(f.exists(), "{} missing", f.display());
        let err = validate_file(f).expect_err(&f.display().to_string());
        assert!(!err.to_string().is_empty());
    }
    // Through the binary (non-zero exit, one reason per file): tests/cli_cdi.rs.
}

#[test]
fn validate_accepts_what_podman_loaded() {
    let ex = Path::new(FIXTURES);
    let cases = ex.join("podman-4.3.1");
    let mut files = vec![ex.join("valid/minimal.json")];
    for rel in [
        "ver-0.3.0/etc/t.json",
        "ver-0.5.0/etc/t.json",
        "f-hostpath-0.5.0/etc/t.json",
        "f-devnode-full/etc/t.json",
        "f-hooks/etc/t.json",
        "f-mount-type-0.4.0/etc/t.json",
        "f-spec-level-edits/etc/t.json",
        "n-device-digit/etc/t.json",
        "n-device-colon/etc/t.json",
        "n-vendor-mixed/etc/t.json",
        "file-yaml/etc/t.yaml",
        "file-yaml-unquoted-version/etc/t.yaml",
        "file-yaml-content-in-json-ext/etc/t.json",
    ] {
        files.push(cases.join(rel));
    }
    for f in files {
        validate_file(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
}

#[test]
fn the_driver_goes_into_a_real_nodes_spec_and_into_a_sim_nodes_only_with_a_driver_root() {
    use crate::domain::inventory::{Inventory, NVML_SOURCE};
    let node = |source: &str| Inventory {
        source: source.to_string(),
        ..Inventory::default()
    };
    let root = Path::new("/");
    let fake = Path::new("/tmp/fake-driver");
    assert!(crate::domain::cdi::equips_driver(&node(NVML_SOURCE), root));
    assert!(crate::domain::cdi::equips_driver(&node(NVML_SOURCE), fake));
    assert!(!crate::domain::cdi::equips_driver(
        &node("sim:mixed-a100"),
        root
    ));
    assert!(crate::domain::cdi::equips_driver(
        &node("sim:mixed-a100"),
        fake
    ));
}
