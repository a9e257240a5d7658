//! Config parser tests on real NVIDIA-format files.

use std::path::PathBuf;

use super::*;

fn parse_ok(text: &str) -> Config {
    parse(text, "test.yaml", &Overrides::default()).unwrap()
}

fn parse_err(text: &str) -> String {
    parse(text, "test.yaml", &Overrides::default())
        .unwrap_err()
        .to_string()
}

#[test]
fn nvidia_time_slicing_example() {
    // The shape of NVIDIA's documented time-slicing ConfigMap.
    let cfg = parse_ok(
        r#"
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  nvidiaDriverRoot: /
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
  gfd:
    oneshot: false
    noTimestamp: false
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    sleepInterval: 60s
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"#,
    );
    assert_eq!(cfg.sharing.len(), 1);
    let s = &cfg.sharing[0];
    assert_eq!(s.name, "nvidia.com/gpu");
    assert_eq!(s.advertised_name, "nvidia.com/gpu");
    assert_eq!(s.replicas, 10);
    assert!(!s.fail_requests_greater_than_one);
    assert_eq!(s.isolation, Isolation::None);
    assert_eq!(cfg.device_list_strategy, vec![DeviceListStrategy::Envvar]);
}

#[test]
fn json_and_rename_by_default_and_mps_defaults() {
    let cfg = parse_ok(
        r#"{"version":"v1","flags":{"migStrategy":"mixed","mpsRoot":"/run/nvidia/mps"},
            "sharing":{"mps":{"renameByDefault":true,"resources":[{"name":"gpu","replicas":4}]}}}"#,
    );
    assert_eq!(cfg.mig_strategy, MigStrategy::Mixed);
    let s = &cfg.sharing[0];
    assert_eq!(s.advertised_name, "nvidia.com/gpu.shared");
    assert!(s.fail_requests_greater_than_one, "MPS defaults to true");
    assert_eq!(s.isolation, Isolation::Mps);
}

#[test]
fn device_list_strategy_string_or_list() {
    let cfg = parse_ok("flags:\n  plugin:\n    deviceListStrategy: [cdi-cri, envvar, cdi-cri]\n");
    assert_eq!(
        cfg.device_list_strategy,
        vec![DeviceListStrategy::Envvar, DeviceListStrategy::CdiCri]
    );
}

#[test]
fn per_gpu_devices_and_extensions() {
    let cfg = parse_ok(
        r#"
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      rename: gpu.shared
      devices: [3, "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02", "0:1"]
      replicas: 4
      isolation: memory
      memory: 10Gi
"#,
    );
    let s = &cfg.sharing[0];
    assert_eq!(s.advertised_name, "nvidia.com/gpu.shared");
    assert_eq!(
        s.devices,
        DeviceSelector::List(vec![
            DeviceRef::Index(3),
            DeviceRef::Uuid("GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02".into()),
            DeviceRef::MigIndex(0, 1),
        ])
    );
    assert_eq!(s.memory_per_replica, Some(10 << 30));
    assert_eq!(s.isolation, Isolation::Memory);
}

#[test]
fn unknown_key_names_field_and_file() {
    let err = parse_err("flags:\n  migStrategyy: mixed\n");
    assert!(err.contains("test.yaml"), "{err}");
    assert!(err.contains("migStrategyy"), "{err}");
    assert!(err.contains("flags"), "{err}");
}

#[test]
fn wrong_type_names_field() {
    let err = parse_err(
        "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: lots\n",
    );
    assert!(
        err.contains("sharing.timeSlicing.resources[0].replicas"),
        "{err}"
    );
}

#[test]
fn replicas_below_two_rejected() {
    let err =
        parse_err("sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 1\n");
    assert!(
        err.contains("sharing.timeSlicing.resources[0].replicas"),
        "{err}"
    );
    assert!(err.contains(">= 2"), "{err}");
    assert!(err.contains("`1`") || err.contains("= 1"), "{err}");
}

#[test]
fn empty_sharing_section_rejected() {
    let err = parse_err("sharing:\n  timeSlicing: {}\n");
    assert!(err.contains("no resources specified"), "{err}");
}

#[test]
fn bad_enum_values_rejected() {
    let err = parse_err("flags:\n  migStrategy: half\n");
    assert!(
        err.contains("flags.migStrategy") && err.contains("half"),
        "{err}"
    );
    let err = parse_err("version: v2\n");
    assert!(err.contains("version"), "{err}");
    let err = parse_err("flags:\n  plugin:\n    cdiKind: x/gpu\n");
    assert!(
        err.contains("cdiKind") && err.contains("2 characters"),
        "{err}"
    );
}

#[test]
fn overrides_beat_file() {
    let ov = Overrides {
        mig_strategy: Some("single".into()),
        ..Overrides::default()
    };
    let cfg = parse("flags:\n  migStrategy: mixed\n", "t", &ov).unwrap();
    assert_eq!(cfg.mig_strategy, MigStrategy::Single);
    let cfg = parse("flags:\n  migStrategy: mixed\n", "t", &Overrides::default()).unwrap();
    assert_eq!(cfg.mig_strategy, MigStrategy::Mixed);
}

#[test]
fn quantities() {
    assert_eq!(
        parse_quantity(&file::Quantity::Text("512Mi".into())),
        Ok(512 << 20)
    );
    assert_eq!(
        parse_quantity(&file::Quantity::Text("2G".into())),
        Ok(2_000_000_000)
    );
    assert!(parse_quantity(&file::Quantity::Text("2GB".into())).is_err());
    assert!(parse_quantity(&file::Quantity::Bytes(0)).is_err());
}

#[test]
fn nothing_panics_on_garbage() {
    for text in [
        "[",
        "- a\n- b",
        "flags: 3",
        "sharing:\n  mps:\n    resources: 7",
        "\u{0}",
    ] {
        let _ = parse(text, "t", &Overrides::default());
    }
}

#[test]
fn a_tab_in_yaml_is_a_syntax_error_with_a_position_not_a_field() {
    let err = parse(
        "flags:\n\tmigStrategy: mixed\n",
        "t.yaml",
        &Overrides::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with("invalid config file t.yaml: not valid YAML: "),
        "{text}"
    );
    assert!(text.contains("line 2"), "{text}");
    assert!(!text.contains("field"), "{text}");
}

#[test]
fn a_parse_error_names_the_field_once() {
    let err = parse(
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: two}\n",
        "t.yaml",
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err.matches("sharing.timeSlicing.resources[0].replicas")
            .count(),
        1,
        "{err}"
    );
    assert!(err.contains("line 4"), "{err}");
}

#[test]
fn bad_override_values_are_blamed_on_their_flag_not_the_file() {
    let mut ov = Overrides {
        device_id_strategy: Some("serial".into()),
        ..Overrides::default()
    };
    let err = parse("version: v1\n", "cm.yaml", &ov)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "invalid command-line setting = `serial`: expected uuid or index"
    );
    ov.device_id_strategy = Some(Given::new(
        "serial",
        Origin::Env("DEVICE_ID_STRATEGY".into()),
    ));
    let err = defaults(&ov).unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid env var `DEVICE_ID_STRATEGY` = `serial`: expected uuid or index"
    );
    assert!(!err.contains("built-in defaults"));
}

#[test]
fn device_and_memory_values_are_printed_as_written() {
    let err = parse(
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2, devices: [\"0\", \"x:y\"]}\n",
        "t.yaml",
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("= `x:y`"), "{err}");
    assert!(!err.contains("Text("), "{err}");
    let err = parse(
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2, memory: 5Zi}\n",
        "t.yaml",
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("= `5Zi`"), "{err}");
}

#[test]
fn mig_layouts_from_file_flags_and_env() {
    let cfg =
        parse_ok("version: v1\nflags:\n  migLayouts: {file: /etc/l.yaml, layout: all-balanced}\n");
    assert_eq!(
        cfg.mig_layouts,
        Some(MigLayouts {
            file: PathBuf::from("/etc/l.yaml"),
            layout: "all-balanced".into()
        })
    );
    assert_eq!(parse_ok("version: v1\n").mig_layouts, None);
    // A flag wins over the file, field by field.
    let ov = Overrides {
        mig_layout: Some("all-1g.5gb".into()),
        ..Overrides::default()
    };
    let cfg = parse(
        "version: v1\nflags:\n  migLayouts: {file: /etc/l.yaml, layout: all-balanced}\n",
        "t.yaml",
        &ov,
    )
    .unwrap();
    assert_eq!(cfg.mig_layouts.unwrap().layout, "all-1g.5gb");
    // Both or neither, and unknown keys are errors naming the field.
    let e = parse_err("version: v1\nflags:\n  migLayouts: {file: /etc/l.yaml}\n");
    assert!(
        e.contains("flags.migLayouts.layout") && e.contains("/etc/l.yaml"),
        "{e}"
    );
    let mut ov = Overrides {
        mig_layout: Some("x".into()),
        ..Overrides::default()
    };
    ov.mig_layout = Some(Given::new("x", Origin::Flag("mig-layout".into())));
    let e = parse("version: v1\n", "t.yaml", &ov)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("flags.migLayouts.file") || e.contains("--mig-layout"),
        "{e}"
    );
    let e = parse_err("version: v1\nflags:\n  migLayouts: {file: /l, layout: a, colour: red}\n");
    assert!(e.contains("colour"), "{e}");
}

#[test]
fn dra_flags_are_read_as_written() {
    let cfg =
        parse_ok("version: v1\nflags:\n  dra: {enabled: true, driverName: gpu.example.com}\n");
    assert_eq!(cfg.dra.enabled, Some(true));
    assert_eq!(cfg.dra.driver_name.as_deref(), Some("gpu.example.com"));
    assert!(parse_ok("version: v1\n").dra.is_unset());
    let e = parse_err("version: v1\nflags:\n  dra: {enabled: true, driver: x}\n");
    assert!(e.contains("flags.dra") && e.contains("driver"), "{e}");
}

#[test]
fn dra_dynamic_mig_takes_gpus_like_devices_and_refuses_mig_devices() {
    let cfg = parse_ok("version: v1\nflags:\n  dra: {dynamicMig: all}\n");
    assert_eq!(cfg.dra.dynamic_mig, Some(DeviceSelector::All));
    assert!(!cfg.dra.is_unset());
    let cfg = parse_ok("version: v1\nflags:\n  dra: {dynamicMig: [0, \"GPU-1\"]}\n");
    assert_eq!(
        cfg.dra.dynamic_mig,
        Some(DeviceSelector::List(vec![
            DeviceRef::Index(0),
            DeviceRef::Uuid("GPU-1".into())
        ]))
    );
    let e = parse_err("version: v1\nflags:\n  dra: {dynamicMig: [\"0:1\"]}\n");
    assert!(
        e.contains("flags.dra.dynamicMig[0]") && e.contains("0:1") && e.contains("MIG device"),
        "{e}"
    );
    let e = parse_err("version: v1\nflags:\n  dra: {dynamicMig: []}\n");
    assert!(e.contains("flags.dra.dynamicMig"), "{e}");
}

#[test]
fn a_config_without_settings_warns_and_serves_the_defaults() {
    for text in ["", "\n  \n", "# sharing comes later\n---\n"] {
        let (cfg, warnings) = parse_reporting(text, "cfg.yaml", &Overrides::default()).unwrap();
        assert_eq!(
            warnings,
            vec![ConfigWarning::Empty {
                config: "cfg.yaml".into()
            }],
            "{text:?}"
        );
        assert!(cfg.sharing.is_empty(), "{text:?}");
    }
    let (_, warnings) =
        parse_reporting("version: v1\n", "cfg.yaml", &Overrides::default()).unwrap();
    assert_eq!(warnings, vec![]);
}
