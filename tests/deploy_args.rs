//! The DaemonSet in `deploy/` runs flags that exist: its container args parse as a
//! `gpu-slicer` command line, and its probes and port match the HTTP endpoint `run` starts.

use clap::Parser;
use gpu_slicer::cli::args::{Cli, Command};

#[test]
fn daemonset_args_are_real_run_flags() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/daemonset.yaml");
    let text = std::fs::read_to_string(path).expect("daemonset");
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("yaml");
    let container = &doc["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<String> = container["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect();
    let argv = std::iter::once("gpu-slicer".to_string()).chain(args);
    let cli = match Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => panic!("{path}: args do not parse: {e}"),
    };
    let Command::Run(run) = cli.command else {
        panic!("{path}: the container does not run `run`");
    };
    // The hook path in specs is where the init container installs the binary, on the host.
    let init = &doc["spec"]["template"]["spec"]["initContainers"][0];
    let init_args: Vec<String> = init["args"]
        .as_sequence()
        .expect("init args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect();
    let init_cli =
        match Cli::try_parse_from(std::iter::once("gpu-slicer".to_string()).chain(init_args)) {
            Ok(c) => c,
            Err(e) => panic!("{path}: init container args do not parse: {e}"),
        };
    let Command::CdiHook(gpu_slicer::cli::cdi_hook::CdiHookCommand::Install(install)) =
        init_cli.command
    else {
        panic!("{path}: the init container does not run `cdi-hook install`");
    };
    assert_eq!(
        run.hook.cdi_hook_path.as_deref(),
        Some(install.to.join("gpu-slicer").as_path()),
        "--cdi-hook-path is the installed binary"
    );
    let volumes = doc["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .expect("volumes");
    let mount = init["volumeMounts"]
        .as_sequence()
        .expect("init mounts")
        .iter()
        .find(|m| m["mountPath"].as_str() == install.to.to_str())
        .expect("the install directory is a mount");
    let volume = volumes
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("mounted volume");
    assert_eq!(
        volume["hostPath"]["path"].as_str(),
        install.to.to_str(),
        "the install directory is the same path on the host"
    );
    assert_eq!(
        run.pod_resources_socket,
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    );
    let port = run
        .http_listen
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u64>().ok())
        .expect("--http-listen has a port");
    let ports = container["ports"].as_sequence().expect("ports");
    assert!(
        ports.iter().any(
            |p| p["name"].as_str() == Some("http") && p["containerPort"].as_u64() == Some(port)
        ),
        "the `http` port is the --http-listen port {port}"
    );
    assert_eq!(
        container["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(
            container[probe]["httpGet"]["port"].as_str(),
            Some("http"),
            "{probe}"
        );
    }
}

#[test]
fn mps_overlay_mounts_what_the_config_names() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/mps");
    let cm: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(format!("{dir}/configmap.yaml")).unwrap())
            .unwrap();
    let text = cm["data"]["config.yaml"].as_str().expect("config.yaml");
    let cfg = gpu_slicer::domain::config::parse(
        text,
        "deploy/mps/configmap.yaml",
        &gpu_slicer::domain::config::Overrides::default(),
    )
    .expect("the overlay's config is valid");
    let root = cfg.mps_root.clone().expect("flags.mpsRoot set");
    // It plans MPS daemons on a real node shape.
    let inv = gpu_slicer::domain::inventory::Backend::discover(
        &gpu_slicer::platform::sim::SimBackend::open("dgx-h100").unwrap(),
    )
    .unwrap();
    let plan = gpu_slicer::domain::plan::build(&inv, &cfg).expect("plan");
    assert_eq!(
        gpu_slicer::domain::mps::daemons_for(&plan, &cfg)
            .unwrap()
            .len(),
        8,
        "one daemon per GPU"
    );
    let ds: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(format!("{dir}/daemonset.yaml")).unwrap())
            .unwrap();
    let spec = &ds["spec"]["template"]["spec"];
    let mounts = spec["containers"][0]["volumeMounts"].as_sequence().unwrap();
    let volumes = spec["volumes"].as_sequence().unwrap();
    let host_path_of = |mount_path: &str| -> String {
        let m = mounts
            .iter()
            .find(|m| m["mountPath"].as_str() == Some(mount_path))
            .unwrap_or_else(|| panic!("no mount at {mount_path}"));
        let v = volumes
            .iter()
            .find(|v| v["name"] == m["name"])
            .expect("mounted volume");
        v["hostPath"]["path"]
            .as_str()
            .expect("hostPath")
            .to_string()
    };
    // Same path inside and out: CDI specs name host paths for tenants' bind mounts.
    assert_eq!(host_path_of(root.to_str().unwrap()), root.to_str().unwrap());
    assert_eq!(
        std::path::PathBuf::from(host_path_of("/dev/shm")),
        gpu_slicer::domain::mps::shm_dir(&root),
        "the daemons' /dev/shm is the directory tenants get"
    );
}
