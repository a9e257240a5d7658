//! The DaemonSet in `deploy/` runs flags that exist: its container args parse as a
//! `gpu-slicer` command line, and its probes and port match the HTTP endpoint `run` starts.

use clap::Parser;
mod common;

use common::fake_lib;
use gpu_slicer::cli::{Cli, Command};

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
    // The labels file lies in a mounted directory that is the same path on the host, where
    // NFD's worker reads its features.d.
    let labels = std::path::Path::new(&run.labels_file);
    assert_eq!(
        labels,
        std::path::Path::new(gpu_slicer::runtime::labels::DEFAULT_LABELS_FILE)
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
    for d in gpu_slicer::domain::mps::daemons_for(&plan, &cfg).unwrap() {
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

/// `deploy/mig-layouts`: the config names a mig-parted file in the same ConfigMap, at the path
/// the config volume mounts it; the layout exists and fits an 80 GB A100 node (a dry run of
/// `mig apply` plans it); the container asks the NVIDIA runtime for the MIG config capability.
#[test]
fn mig_layouts_overlay_names_a_mounted_layout_that_fits() {
    let objs = kustomize("deploy/mig-layouts");
    let cm = object(&objs, "ConfigMap", "gpu-slicer-config");
    let cfg = gpu_slicer::domain::config::parse(
        cm["data"]["config.yaml"].as_str().unwrap(),
        "configmap",
        &gpu_slicer::domain::config::Overrides::default(),
    )
    .expect("config");
    let layouts = cfg.mig_layouts.expect("flags.migLayouts");
    let ds = object(&objs, "DaemonSet", "gpu-slicer");
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    let config_mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("config"))
        .expect("config mount");
    let dir = std::path::Path::new(config_mount["mountPath"].as_str().unwrap());
    let key = layouts
        .file
        .strip_prefix(dir)
        .unwrap_or_else(|_| panic!("{} is not under {}", layouts.file.display(), dir.display()));
    let text = cm["data"][key.to_str().unwrap()]
        .as_str()
        .unwrap_or_else(|| panic!("the ConfigMap has no key {}", key.display()));
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("mig-parted.yaml");
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args([
            "mig",
            "apply",
            "--backend",
            "sim:hack/nodes/mixed-a100.yaml",
        ])
        .arg("--config-file")
        .arg(&file)
        .args(["--layout", &layouts.layout, "--dry-run", "--format", "json"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let statuses: Vec<&str> = report["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["status"].as_str().unwrap())
        .collect();
    assert!(statuses.contains(&"changed"), "{report}");
    let env: Vec<(String, String)> = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(
        env.contains(&("NVIDIA_MIG_CONFIG_DEVICES".into(), "all".into())),
        "{env:?}"
    );
}

// ------------------------------------------------- the built manifests on a host-like layout

/// `kubectl` as hack/install-deps.sh provides it: the repository's venv first, else PATH.
fn kubectl() -> std::path::PathBuf {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/kubectl");
    if venv.exists() {
        venv
    } else {
        "kubectl".into()
    }
}

/// Every object `kubectl kustomize deploy/<dir>` prints (what `kubectl apply -k` sends).
fn kustomize(dir: &str) -> Vec<serde_yaml_ng::Value> {
    use serde::Deserialize;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let out = std::process::Command::new(kubectl())
        .arg("kustomize")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("kubectl ({e}): run hack/install-deps.sh"));
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf8");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde_yaml_ng::Value::deserialize(d).expect("kustomize output is YAML"))
        .collect()
}

fn object<'a>(
    objs: &'a [serde_yaml_ng::Value],
    kind: &str,
    name: &str,
) -> &'a serde_yaml_ng::Value {
    objs.iter()
        .find(|o| o["kind"].as_str() == Some(kind) && o["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in the kustomize output"))
}

fn strings(v: &serde_yaml_ng::Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .map(|a| a.as_str().expect("string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A node as the DaemonSet's hostPath volumes see it, built under `host/`: the driver's
/// `/proc/driver/nvidia{,-caps}` (with `mig-minors`), `/dev/nvidia*`, the kubelet's
/// device-plugin and pod-resources directories. The container's view is `ct/`: one symlink
/// per volumeMount, at the mount path, to the volume's host path (configMap volumes: a
/// directory with the ConfigMap's keys). Every absolute path in the args then resolves
/// through `ct/` exactly as it would through the mounts, and only through them.
struct NodeLayout {
    dir: tempfile::TempDir,
    node_file: std::path::PathBuf,
}

impl NodeLayout {
    fn host(&self) -> std::path::PathBuf {
        self.dir.path().join("host")
    }
    fn ct(&self) -> std::path::PathBuf {
        self.dir.path().join("ct")
    }

    fn new(node_file: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("gs")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let node_file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(node_file);
        let node = node_spec::NodeSpec::load(&node_file).expect("node file");
        let layout = Self { dir, node_file };
        let host = layout.host();
        let minors: Vec<u32> = node.gpus.iter().map(|g| g.minor()).collect();
        let caps = host.join("proc/driver/nvidia-caps");
        std::fs::create_dir_all(&caps).unwrap();
        std::fs::write(caps.join("mig-minors"), node_spec::mig_minors_file(&minors)).unwrap();
        // Stand-ins for the device nodes (plain files: mknod needs privileges the tests do
        // not assume); they give the `/dev` volume its shape.
        std::fs::create_dir_all(host.join("dev/nvidia-caps")).unwrap();
        for m in &minors {
            std::fs::create_dir_all(host.join(format!("proc/driver/nvidia/gpus/{m}"))).unwrap();
            std::fs::write(host.join(format!("dev/nvidia{m}")), "").unwrap();
        }
        std::fs::write(host.join("dev/nvidiactl"), "").unwrap();
        // The host's user-space driver at the node's version, where the installer puts it
        // (no ld.so.cache: discovery scans the standard folders), for the spec's driver edits.
        let libs = host.join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&libs).unwrap();
        for lib in ["libcuda.so", "libnvidia-ml.so"] {
            std::fs::write(libs.join(format!("{lib}.{}", node.driver_version)), "").unwrap();
        }
        std::fs::create_dir_all(host.join("usr/bin")).unwrap();
        std::fs::write(host.join("usr/bin/nvidia-smi"), "").unwrap();
        for d in [
            "var/lib/kubelet/device-plugins",
            "var/lib/kubelet/pod-resources",
        ] {
            std::fs::create_dir_all(host.join(d)).unwrap();
        }
        std::fs::create_dir_all(layout.ct()).unwrap();
        layout
    }

    /// Apply the pod's volumes: hostPath `Directory` volumes must exist on the node (as the
    /// kubelet checks), `DirectoryOrCreate` ones are created; mounts are applied shortest
    /// path first so nested mounts (`/dev/shm` under `/dev`) land inside their parent.
    fn mount(
        &self,
        pod: &serde_yaml_ng::Value,
        container: &serde_yaml_ng::Value,
        objs: &[serde_yaml_ng::Value],
    ) {
        let volumes = pod["volumes"].as_sequence().expect("volumes");
        let mut mounts: Vec<&serde_yaml_ng::Value> = container["volumeMounts"]
            .as_sequence()
            .expect("volumeMounts")
            .iter()
            .collect();
        mounts.sort_by_key(|m| m["mountPath"].as_str().map(str::len));
        for m in mounts {
            let mount_path = m["mountPath"].as_str().expect("mountPath");
            let v = volumes
                .iter()
                .find(|v| v["name"] == m["name"])
                .unwrap_or_else(|| panic!("mount {mount_path}: no volume"));
            let source = if let Some(hp) = v["hostPath"]["path"].as_str() {
                let p = self.host().join(hp.trim_start_matches('/'));
                match v["hostPath"]["type"].as_str() {
                    Some("DirectoryOrCreate") => std::fs::create_dir_all(&p).unwrap(),
                    Some("Directory") => assert!(
                        p.is_dir(),
                        "hostPath {hp} (type Directory) does not exist on the node"
                    ),
                    other => panic!("hostPath {hp}: type {other:?} not modelled"),
                }
                p
            } else if let Some(cm) = v["configMap"]["name"].as_str() {
                let p = self.dir.path().join("configmaps").join(cm);
                std::fs::create_dir_all(&p).unwrap();
                let data = object(objs, "ConfigMap", cm)["data"]
                    .as_mapping()
                    .expect("configmap data");
                for (k, text) in data {
                    // Paths inside the config are container paths too: route them through
                    // the container view like the args.
                    let text = text
                        .as_str()
                        .unwrap()
                        .replace("mpsRoot: /", &format!("mpsRoot: {}/", self.ct().display()));
                    std::fs::write(p.join(k.as_str().unwrap()), text).unwrap();
                }
                p
            } else {
                panic!("volume {:?}: kind not modelled", v["name"]);
            };
            let at = self.ct().join(mount_path.trim_start_matches('/'));
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(&source, &at)
                .unwrap_or_else(|e| panic!("mount {mount_path}: {e}"));
        }
    }

    /// The container's args with every absolute path routed through the container view.
    /// `--cdi-hook-path` names a host path the daemon only writes into specs, and the
    /// HTTP port is made ephemeral so tests can run side by side.
    fn args(&self, args: &[String]) -> Vec<String> {
        args.iter()
            .map(|a| match a.split_once('=') {
                Some(("--http-listen", _)) => "--http-listen=127.0.0.1:0".into(),
                Some(("--cdi-hook-path", _)) => a.clone(),
                Some((flag, v)) if v.starts_with('/') => {
                    format!("{flag}={}{v}", self.ct().display())
                }
                _ => a.clone(),
            })
            .collect()
    }
}

/// Run the built DaemonSet's own `gpu-slicer run` args on the MIG node `mixed-a100` (fake
/// NVML, as the NVIDIA runtime would inject the driver's library) with the volumes mapped as
/// above; every planned resource registers with the kubelet and the CDI spec names the
/// MIG capability nodes.
async fn manifest_runs_on_mig_node(dir: &str) {
    let objs = kustomize(dir);
    let ds = object(&objs, "DaemonSet", "gpu-slicer");
    let pod = &ds["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let layout = NodeLayout::new("hack/nodes/mixed-a100.yaml");
    let host = layout.host();
    let emulator = gpu_slicer::testkit::kubelet::KubeletEmulator::start(
        host.join("var/lib/kubelet/device-plugins"),
    )
    .await
    .expect("kubelet emulator");
    emulator
        .serve_pod_resources(&host.join("var/lib/kubelet/pod-resources/kubelet.sock"))
        .expect("pod resources");
    layout.mount(pod, container, &objs);

    // What the daemon should serve: the ConfigMap's config planned on the same node.
    let cm = object(&objs, "ConfigMap", "gpu-slicer-config");
    let cfg = gpu_slicer::domain::config::parse(
        cm["data"]["config.yaml"].as_str().unwrap(),
        "configmap",
        &gpu_slicer::domain::config::Overrides::default(),
    )
    .expect("config");
    let sim =
        gpu_slicer::platform::sim::SimBackend::open(layout.node_file.to_str().unwrap()).unwrap();
    let inv = gpu_slicer::domain::inventory::Backend::discover(&sim).unwrap();
    let plan = gpu_slicer::domain::plan::build(&inv, &cfg).expect("plan");
    let names: Vec<String> = plan.resources.iter().map(|r| r.name.clone()).collect();
    assert!(
        names.iter().any(|n| n.starts_with("nvidia.com/mig-")),
        "{names:?}"
    );

    let lib = layout.dir.path().join("libnvidia-ml.so.1");
    std::fs::copy(fake_lib(), &lib).expect("copy fake NVML");
    let log = layout.dir.path().join("stderr.log");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"));
    cmd.args(layout.args(&strings(&container["args"])))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("NVML_LIB", &lib)
        .env("FAKE_NVML_NODE", &layout.node_file)
        .env(
            "MPS_CONTROL_BIN",
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/fake-mps-control"),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true);
    for e in container["env"].as_sequence().into_iter().flatten() {
        cmd.env(e["name"].as_str().unwrap(), e["value"].as_str().unwrap());
    }
    let mut child = cmd.spawn().expect("spawn gpu-slicer");
    let stderr = || std::fs::read_to_string(&log).unwrap_or_default();
    tokio::select! {
        () = emulator.wait_registered(&names, 1) => {}
        status = child.wait() => panic!("{dir}: gpu-slicer exited ({}) before registering:\n{}", status.expect("wait"), stderr()),
        () = tokio::time::sleep(std::time::Duration::from_secs(30)) => panic!("{dir}: not registered in 30 s:\n{}", stderr()),
    }
    // The spec the runtime reads (the `/var/run/cdi` volume) isolates every MIG device.
    let cdi_dir = host.join("var/run/cdi");
    let mut nodes = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(&cdi_dir).expect("cdi dir") {
        let p = e.unwrap().path();
        let spec = gpu_slicer::domain::cdi::Spec::parse(&std::fs::read_to_string(&p).unwrap(), &p)
            .unwrap();
        for d in &spec.devices {
            nodes.extend(
                d.container_edits
                    .device_nodes
                    .iter()
                    .map(|n| n.path.clone()),
            );
        }
    }
    // The host's driver rides along with every device, by its host path, read through the
    // host-root volume (`--container-driver-root`).
    let spec_path = cdi_dir.join("gpu-slicer.io-gpu.yaml");
    let spec = gpu_slicer::domain::cdi::Spec::parse(
        &std::fs::read_to_string(&spec_path).unwrap(),
        &spec_path,
    )
    .unwrap();
    let libcuda = format!(
        "/usr/lib/x86_64-linux-gnu/libcuda.so.{}",
        inv.driver_version.as_deref().unwrap_or_default()
    );
    assert!(
        spec.container_edits
            .mounts
            .iter()
            .any(|m| m.host_path == libcuda),
        "{dir}: the spec does not mount {libcuda}: {:?}",
        spec.container_edits.mounts
    );
    for g in &inv.gpus {
        for m in &g.mig_devices {
            let gi = m.gi_cap_minor.expect("sim minors");
            assert!(
                nodes.contains(&format!("/dev/nvidia-caps/nvidia-cap{gi}")),
                "{dir}: {} lacks its GI capability node",
                m.uuid
            );
        }
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(std::time::Duration::from_secs(10), child.wait())
        .await
        .expect("exit after SIGTERM")
        .unwrap();
    assert!(status.success(), "{dir}: {status}\n{}", stderr());
    emulator.shutdown().await;
}

#[tokio::test]
async fn built_base_daemonset_runs_on_a_mig_node() {
    manifest_runs_on_mig_node("deploy").await;
}

#[tokio::test]
async fn built_mps_overlay_runs_on_a_mig_node() {
    manifest_runs_on_mig_node("deploy/mps").await;
}

/// `nvidia.com/gpu.present` exists only where NVIDIA's GFD runs: the base says so, and the
/// node-selector component (used by deploy/own-node-label) replaces the whole selector.
#[test]
fn node_selector_is_documented_and_replaceable() {
    let base = kustomize("deploy");
    let sel = &object(&base, "DaemonSet", "gpu-slicer")["spec"]["template"]["spec"]["nodeSelector"];
    assert_eq!(sel["nvidia.com/gpu.present"].as_str(), Some("true"));
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/base/daemonset.yaml"
    ))
    .unwrap();
    assert!(
        text.contains("GPU Feature Discovery"),
        "the base explains the label"
    );
    let own = kustomize("deploy/own-node-label");
    let sel = &object(&own, "DaemonSet", "gpu-slicer")["spec"]["template"]["spec"]["nodeSelector"];
    let want: serde_yaml_ng::Value =
        serde_yaml_ng::from_str("{gpu-slicer.io/gpu: \"true\"}").unwrap();
    assert_eq!(sel, &want, "the component replaces the NVIDIA label");
    // Everything else is the base: same objects, same container args.
    assert_eq!(own.len(), base.len());
    let args = |objs: &[serde_yaml_ng::Value]| {
        strings(
            &object(objs, "DaemonSet", "gpu-slicer")["spec"]["template"]["spec"]["containers"][0]["args"],
        )
    };
    assert_eq!(args(&own), args(&base));
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
        run.config.config.is_none(),
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
        gpu_slicer::domain::config::parse(
            text,
            key,
            &gpu_slicer::domain::config::Overrides::default(),
        )
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
