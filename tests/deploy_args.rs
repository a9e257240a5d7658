//! The manifests in `deploy/` as `kubectl kustomize` renders them, run the way the kubelet
//! would: the built DaemonSet's own `gpu-slicer run` args on a host-like layout of its
//! volumes register every planned resource and write a spec that isolates each MIG device;
//! the mig-layouts overlay's layout plans on an 80 GB A100 node; the node selector is
//! documented and replaceable. (The container args parsed as a command line, the MPS and
//! label-configs overlays: `cli::run` unit tests.)

mod common;

use std::path::Path;

use common::fake_lib;
use gpu_slicer::testkit::read_cdi_spec;
use gpu_slicer::testkit::{kustomize, object, strings};

/// `gpu-slicer <args>` in the repository root; its JSON output.
///
/// # Panics
/// When the command fails or prints no JSON.
fn json_of(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run gpu-slicer");
    assert!(out.status.success(), "{args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// `deploy/mig-layouts`: the config names a mig-parted file in the same ConfigMap, at the path
/// the config volume mounts it; the layout exists and fits an 80 GB A100 node (a dry run of
/// `mig apply` plans it); the container asks the NVIDIA runtime for the MIG config capability.
#[test]
fn mig_layouts_overlay_names_a_mounted_layout_that_fits() {
    let objs = kustomize("deploy/mig-layouts");
    let cm = object(&objs, "ConfigMap", "gpu-slicer-config");
    let text = cm["data"]["config.yaml"].as_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // The agent takes the config (it plans on the node the layout is for).
    let config_file = tmp.path().join("config.yaml");
    std::fs::write(&config_file, text).unwrap();
    json_of(&[
        "inventory",
        "--backend",
        "sim:hack/nodes/mixed-a100.yaml",
        "--config",
        config_file.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let cfg: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).expect("config");
    let layouts = &cfg["flags"]["migLayouts"];
    assert!(!layouts.is_null(), "flags.migLayouts");
    let layouts_file = Path::new(layouts["file"].as_str().expect("flags.migLayouts.file"));
    let layout = layouts["layout"].as_str().expect("flags.migLayouts.layout");
    let ds = object(&objs, "DaemonSet", "gpu-slicer");
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    let config_mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("config"))
        .expect("config mount");
    let dir = std::path::Path::new(config_mount["mountPath"].as_str().unwrap());
    let key = layouts_file
        .strip_prefix(dir)
        .unwrap_or_else(|_| panic!("{} is not under {}", layouts_file.display(), dir.display()));
    let text = cm["data"][key.to_str().unwrap()]
        .as_str()
        .unwrap_or_else(|| panic!("the ConfigMap has no key {}", key.display()));
    let file = tmp.path().join("mig-parted.yaml");
    std::fs::write(&file, text).unwrap();
    let report = json_of(&[
        "mig",
        "apply",
        "--backend",
        "sim:hack/nodes/mixed-a100.yaml",
        "--config-file",
        file.to_str().unwrap(),
        "--layout",
        layout,
        "--dry-run",
        "--format",
        "json",
    ]);
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
    let emulator =
        gpu_slicer::testkit::KubeletEmulator::start(host.join("var/lib/kubelet/device-plugins"))
            .await
            .expect("kubelet emulator");
    emulator
        .serve_pod_resources(&host.join("var/lib/kubelet/pod-resources/kubelet.sock"))
        .expect("pod resources");
    layout.mount(pod, container, &objs);

    // What the daemon should serve: the ConfigMap's config planned on the same node (as
    // `gpu-slicer inventory` reports it).
    let cm = object(&objs, "ConfigMap", "gpu-slicer-config");
    let config_file = layout.dir.path().join("configmap-config.yaml");
    std::fs::write(&config_file, cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    let backend = format!("sim:{}", layout.node_file.display());
    let inv = json_of(&[
        "inventory",
        "--backend",
        &backend,
        "--config",
        config_file.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let names: Vec<String> = inv["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r["name"].as_str().expect("name").to_string())
        .collect();
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
    let each = |v: &serde_json::Value| v.as_array().cloned().unwrap_or_default();
    for e in std::fs::read_dir(&cdi_dir).expect("cdi dir") {
        let spec = read_cdi_spec(&e.unwrap().path());
        for d in each(&spec["devices"]) {
            nodes.extend(
                each(&d["containerEdits"]["deviceNodes"])
                    .iter()
                    .map(|n| n["path"].as_str().expect("path").to_string()),
            );
        }
    }
    // The host's driver rides along with every device, by its host path, read through the
    // host-root volume (`--container-driver-root`).
    let spec_path = cdi_dir.join("gpu-slicer.io-gpu.yaml");
    let spec = read_cdi_spec(&spec_path);
    let libcuda = format!(
        "/usr/lib/x86_64-linux-gnu/libcuda.so.{}",
        inv["driverVersion"].as_str().unwrap_or_default()
    );
    let mounts = each(&spec["containerEdits"]["mounts"]);
    assert!(
        mounts.iter().any(|m| m["hostPath"] == libcuda.as_str()),
        "{dir}: the spec does not mount {libcuda}: {mounts:?}"
    );
    for g in each(&inv["gpus"]) {
        for m in each(&g["migDevices"]) {
            let gi = m["giCapMinor"].as_u64().expect("sim minors");
            assert!(
                nodes.contains(&format!("/dev/nvidia-caps/nvidia-cap{gi}")),
                "{dir}: {} lacks its GI capability node",
                m["uuid"]
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
