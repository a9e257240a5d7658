//! The DaemonSet in `deploy/` runs flags that exist: its container args parse as a
//! `gpu-slicer` command line (the base, the label-configs overlay) and name what the config
//! and the mounts provide (the MPS overlay). (The built manifests run on a host-like layout:
//! tests/deploy_args.rs.)

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::testkit::manifests::{kustomize, object, strings};

#[test]
fn daemonset_args_are_real_run_flags() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/base/daemonset.yaml");
    let text = std::fs::read_to_string(path).expect("daemonset");
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("yaml");
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
    // NVML names GPU processes by pids of the caller's PID namespace: usage attribution
    // (and MPS) need the host's.
    assert_eq!(
        doc["spec"]["template"]["spec"]["hostPID"].as_bool(),
        Some(true),
        "{path}: hostPID"
    );
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
    let Command::CdiHook(crate::cli::cdi_hook::CdiHookCommand::Install(install)) = init_cli.command
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
    // The labels file lies in a mounted directory that is the same path on the host, where
    // NFD's worker reads its features.d.
    let labels = std::path::Path::new(&run.labels_file);
    assert_eq!(
        labels,
        std::path::Path::new(crate::runtime::labels::DEFAULT_LABELS_FILE)
    );
    let labels_dir = labels.parent().expect("labels dir").to_str().unwrap();
    let mounts = container["volumeMounts"].as_sequence().expect("mounts");
    let mount = mounts
        .iter()
        .find(|m| m["mountPath"].as_str() == Some(labels_dir))
        .unwrap_or_else(|| panic!("{labels_dir} is not mounted"));
    assert_ne!(
        mount["readOnly"].as_bool(),
        Some(true),
        "labels dir writable"
    );
    let volume = volumes
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("labels volume");
    assert_eq!(volume["hostPath"]["path"].as_str(), Some(labels_dir));
    assert_eq!(
        volume["hostPath"]["type"].as_str(),
        Some("DirectoryOrCreate")
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
    let cm: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(format!("{dir}/configmap.yaml")).unwrap())
            .unwrap();
    let text = cm["data"]["config.yaml"].as_str().expect("config.yaml");
    let cfg = crate::domain::config::parse(
        text,
        "deploy/mps/configmap.yaml",
        &crate::domain::config::Overrides::default(),
    )
    .expect("the overlay's config is valid");
    let root = cfg.mps_root.clone().expect("flags.mpsRoot set");
    // It plans MPS daemons on a real node shape.
    let inv = crate::domain::inventory::Backend::discover(
        &crate::platform::sim::SimBackend::open("dgx-h100").unwrap(),
    )
    .unwrap();
    let plan = crate::domain::plan::build(&inv, &cfg).expect("plan");
    assert_eq!(
        crate::domain::mps::daemons_for(&plan, &cfg).unwrap().len(),
        8,
        "one daemon per GPU"
    );
    let ds: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(format!("{dir}/daemonset.yaml")).unwrap())
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
    // Issue 13 item 11: no one shared /dev/shm. Each daemon's is a tmpfs the agent mounts
    // under the root, which must reach the host (tenants bind the host path), and the
    // daemons get it as /dev/shm in mount namespaces of their own (CAP_SYS_ADMIN; mount
    // and Bidirectional propagation take a privileged container).
    assert!(
        mounts
            .iter()
            .all(|m| m["mountPath"].as_str() != Some("/dev/shm")),
        "the daemon container mounts nothing at /dev/shm"
    );
    assert!(
        volumes
            .iter()
            .all(|v| v["hostPath"]["path"]
                .as_str()
                .is_none_or(
                    |p| !std::path::Path::new(p).starts_with(&root) || p == root.to_str().unwrap()
                )),
        "no volume of a directory inside the MPS root"
    );
    for d in crate::domain::mps::daemons_for(&plan, &cfg).unwrap() {
        assert_eq!(d.shm_dir, root.join(&d.uuid).join("shm"));
    }
    let root_mount = mounts
        .iter()
        .find(|m| m["mountPath"].as_str() == root.to_str())
        .unwrap();
    assert_eq!(
        root_mount["mountPropagation"].as_str(),
        Some("Bidirectional"),
        "the shm mounts under the MPS root reach the host"
    );
    let merged = kustomize("deploy/mps");
    let sc = &object(&merged, "DaemonSet", "gpu-slicer")["spec"]["template"]["spec"]["containers"]
        [0]["securityContext"];
    assert_eq!(sc["privileged"].as_bool(), Some(true), "{sc:?}");
    // The API server refuses privileged with allowPrivilegeEscalation false (the base's).
    assert_eq!(
        sc["allowPrivilegeEscalation"].as_bool(),
        Some(true),
        "{sc:?}"
    );
    assert!(
        strings(&sc["capabilities"]["add"]).contains(&"SYS_ADMIN".to_string()),
        "{sc:?}"
    );
}

#[test]
fn label_configs_overlay_runs_the_config_dir_on_its_configmap() {
    let objs = kustomize("deploy/label-configs");
    let ds = object(&objs, "DaemonSet", "gpu-slicer");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(true));
    let container = &pod["containers"][0];
    let args = strings(&container["args"]);
    let argv = std::iter::once("gpu-slicer".to_string()).chain(args.clone());
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("args do not parse: {e}"));
    let Command::Run(run) = cli.command else {
        panic!("the container does not run `run`");
    };
    assert!(
        run.config.path().is_none(),
        "--config is replaced: {args:?}"
    );
    let dir = run.fleet.config_dir.expect("--config-dir");
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"].as_str() == dir.to_str())
        .expect("--config-dir is mounted");
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mount's volume");
    let cm_name = volume["configMap"]["name"]
        .as_str()
        .expect("a ConfigMap volume");
    let cm = object(&objs, "ConfigMap", cm_name);
    let data = cm["data"].as_mapping().expect("data");
    for key in ["default", "training", "inference"] {
        let text = data
            .get(key)
            .and_then(|v| v.as_str())
            .unwrap_or_else(|| panic!("no key {key}"));
        crate::domain::config::parse(text, key, &crate::domain::config::Overrides::default())
            .unwrap_or_else(|e| panic!("key {key}: {e}"));
    }
    let node_name = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"].as_str() == Some("NODE_NAME"))
        .expect("NODE_NAME");
    assert_eq!(
        node_name["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("spec.nodeName")
    );
}
