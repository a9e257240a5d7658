//! Exactly the share a claim asks for, end to end with the built binary (`run --dra`), the
//! API-server emulator (its scheduler helper writing `shareID` and `consumedCapacity`, and
//! an over-committing allocation as a buggy scheduler would), the kubelet's DRA side over
//! the real sockets, and the fakes:
//!
//! - shares of one 80 GiB GPU: 10 GiB and 30 GiB are prepared, each container's cgroup gets
//!   its exact limit from the memory-limit hook in its claim's spec (run as the runtime
//!   would, the fake NVML recording it), MPS thread percentages follow `compute`; a third
//!   claim the emulator over-commits is refused with the free figure, and fits once a share
//!   is released;
//! - MIG on demand on the fake NVML driver: a claim for a placement creates the instance,
//!   the container's devices show that instance only, Unprepare destroys it; a SIGKILL
//!   between the create and the checkpoint (fault point) leaves no orphan once the agent
//!   restarts, while the instance of a recorded claim is kept.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use gpu_slicer::testkit::{ApiServer, ShareRequest};
use gpu_slicer::testkit::{DraPluginConn, KubeletClaim};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceSlice,
};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

const DRIVER: &str = "gpu-slicer.io";
const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(60);
const GPU2: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02";

/// A node agent against a fresh API-server emulator.
struct Cluster {
    dir: tempfile::TempDir,
    server: ApiServer,
}

impl Cluster {
    async fn start() -> Self {
        let dir = common::short_tempdir();
        let server = ApiServer::start().await.unwrap();
        let node: Node = serde_json::from_value(
            json!({"metadata": {"name": NODE, "uid": "5e1f6c2a-0000-4000-8000-0000000000c1"}}),
        )
        .unwrap();
        server.insert(&node).unwrap();
        std::fs::write(dir.path().join("kubeconfig"), server.kubeconfig(None)).unwrap();
        Self { dir, server }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    async fn registered(&self) -> DraPluginConn {
        let socket = self.path("reg").join(format!("{DRIVER}-reg.sock"));
        common::dra_registered(&socket, WAIT).await
    }

    /// The stored device `name` once the pool shows it and `check` holds for it.
    async fn device(&self, name: &str, check: impl Fn(&Value) -> bool) -> Value {
        let find = |all: &[ResourceSlice]| {
            all.iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .map(|d| serde_json::to_value(d).unwrap())
                .find(|d| d["name"] == name && check(d))
        };
        let ok = self
            .server
            .wait_for::<ResourceSlice, _>(WAIT, |all| find(all).is_some())
            .await;
        assert!(ok, "{name}: {:#?}", self.server.list::<ResourceSlice>());
        find(&self.server.list::<ResourceSlice>()).unwrap()
    }

    /// A claim `ml/<name>` for one device of `class`; its UID.
    async fn claim(&self, name: &str, class: &str) -> KubeletClaim {
        let claims: Api<ResourceClaim> = Api::namespaced(self.server.client().unwrap(), "ml");
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}
        }))
        .unwrap();
        let uid = claims
            .create(&PostParams::default(), &claim)
            .await
            .unwrap()
            .metadata
            .uid
            .unwrap();
        KubeletClaim {
            namespace: "ml".into(),
            uid,
            name: name.into(),
        }
    }

    /// The per-claim spec of `claim`.
    fn spec(&self, claim: &KubeletClaim) -> Value {
        let path = self
            .path("cdi")
            .join(format!("k8s.{DRIVER}-claim_{}.json", claim.uid));
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }
}

async fn stop(mut agent: tokio::process::Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(agent.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(WAIT, agent.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// Run the `createRuntime` hook of a claim's device as the runtime would: the OCI state of a
/// container whose process (pid 77 under `host/proc`) is in cgroup `host/cg/<cgroup>`.
fn run_hook(hook: &Value, host: &Path, cgroup: &str, limits: &Path) {
    std::fs::create_dir_all(host.join("proc/77")).unwrap();
    std::fs::write(host.join("proc/77/cgroup"), format!("0::/{cgroup}\n")).unwrap();
    std::fs::create_dir_all(host.join("cg").join(cgroup)).unwrap();
    std::fs::write(host.join("cg/cgroup.controllers"), "").unwrap();
    let args: Vec<String> = hook["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let mut child = std::process::Command::new(&args[0])
        .args(&args[1..])
        .arg("--proc-root")
        .arg(host.join("proc"))
        .arg("--cgroup-root")
        .arg(host.join("cg"))
        .env(
            "FAKE_NVML_NODE",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/nodes/mixed-a100.yaml"),
        )
        .env("FAKE_NVML_LIMITS_FILE", limits)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"ociVersion":"1.0.2","id":"c","status":"creating","pid":77,"bundle":"/b"}"#)
        .unwrap();
    assert!(child.wait().unwrap().success(), "hook {args:?}");
}

/// The hard limit the fake driver recorded for `cgroup` on `gpu`.
fn limit_of(limits: &Path, gpu: &str, cgroup: &str) -> Option<u64> {
    let all: Value = serde_json::from_str(&std::fs::read_to_string(limits).ok()?).ok()?;
    all[gpu]
        .as_object()?
        .iter()
        .find(|(path, _)| path.ends_with(cgroup))
        .and_then(|(_, l)| l["hardLimit"].as_u64())
}

fn share(memory: &str, compute: &str) -> ShareRequest {
    ShareRequest::new("gpu", DRIVER, NODE, "gpu-2")
        .with("memory", memory)
        .with("compute", compute)
}

#[tokio::test]
async fn shares_get_their_exact_limits_and_an_over_committed_one_is_refused() {
    let c = Cluster::start().await;
    let config = c.path("config.yaml");
    std::fs::write(
        &config,
        format!(
            "flags: {{migStrategy: mixed, mpsRoot: {}}}\nsharing:\n  mps:\n    resources:\n    - {{name: nvidia.com/gpu, rename: nvidia.com/gpu.mps, replicas: 4, devices: [2], isolation: memory+mps}}\n",
            c.path("mps").display()
        ),
    )
    .unwrap();
    let agent = common::dra_command(c.dir.path(), "sim:mixed-a100", &config, NODE)
        .arg("--mps-control-bin")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/fake-mps-control"))
        .arg("--cdi-hook-nvml-lib")
        .arg(common::fake_lib())
        .env("CDI_HOOK_PATH", env!("CARGO_BIN_EXE_gpu-slicer"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Shared, with consumable memory and compute, and healthy (its MPS daemon is up).
    let gpu2 = c
        .device("gpu-2", |d| {
            d.get("taints").is_none() && d["allowMultipleAllocations"] == true
        })
        .await;
    assert_eq!(
        gpu2["capacity"]["memory"]["requestPolicy"]["default"],
        "80Gi"
    );
    assert_eq!(gpu2["capacity"]["compute"]["value"], "100");
    assert_eq!(gpu2["attributes"]["isolation"]["string"], "memory+mps");

    let (a, b, over) = (
        c.claim("a", "gpu.gpu-slicer.io").await,
        c.claim("b", "gpu.gpu-slicer.io").await,
        c.claim("c", "gpu.gpu-slicer.io").await,
    );
    let sa = c
        .server
        .allocate_share("ml", "a", &share("10Gi", "25"))
        .unwrap();
    c.server
        .allocate_share("ml", "b", &share("30Gi", "30"))
        .unwrap();
    assert_eq!(sa.consumed["memory"], "10Gi");
    // A scheduler does not place 50 GiB where 40 GiB are free; a buggy one does.
    let refused = c.server.allocate_share("ml", "c", &share("50Gi", "0"));
    assert!(refused.is_err(), "{refused:?}");
    c.server
        .allocate_share("ml", "c", &share("50Gi", "0").overcommit())
        .unwrap();

    let kubelet = c.registered().await;
    let answer = kubelet
        .prepare(&[a.clone(), b.clone(), over.clone()], None)
        .await
        .unwrap();
    let (device, ids) = answer[&a.uid].clone().unwrap().remove(0);
    assert_eq!(device, "gpu-2");
    assert_eq!(
        ids,
        [format!(
            "k8s.{DRIVER}/claim={}-gpu-2-{}",
            a.uid,
            sa.share_id.as_deref().unwrap_or_default()
        )]
    );
    assert!(answer[&b.uid].is_ok(), "{answer:?}");
    let e = answer[&over.uid].clone().unwrap_err();
    assert!(
        e.contains("gpu-2") && e.contains("50Gi") && e.contains("only 40Gi of its 80Gi"),
        "{e}"
    );

    // Each container gets its own exact limit from its hook; MPS follows `compute`.
    let limits = c.path("limits.json");
    for (claim, cgroup, bytes, threads) in [
        (&a, "pods/a", 10u64 << 30, 25),
        (&b, "pods/b", 30 << 30, 30),
    ] {
        let spec = c.spec(claim);
        let edits = &spec["devices"][0]["containerEdits"];
        run_hook(&edits["hooks"][0], &c.path("host"), cgroup, &limits);
        assert_eq!(limit_of(&limits, GPU2, cgroup), Some(bytes), "{cgroup}");
        let env: Vec<&str> = edits["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert!(
            env.contains(&format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads}").as_str()),
            "{env:?}"
        );
        assert!(
            env.contains(&format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}M", bytes >> 20).as_str()),
            "{env:?}"
        );
    }

    // Released: the over-committed claim fits now (80 - 30 >= 50).
    assert_eq!(
        kubelet.unprepare(std::slice::from_ref(&a)).await.unwrap()[&a.uid],
        ""
    );
    let again = kubelet
        .prepare(std::slice::from_ref(&over), None)
        .await
        .unwrap();
    assert!(again[&over.uid].is_ok(), "{again:?}");
    stop(agent).await;
    c.server.stop().await;
}

// ---- MIG on demand ---------------------------------------------------------------------

const MIG_NODE: &str = "tests/fixtures/mig/a100-40gb.yaml";

/// The fake driver's view for this cluster: its library copy, node file and state file.
fn nvml_env(c: &Cluster, cmd: &mut tokio::process::Command) {
    cmd.env(
        "FAKE_NVML_NODE",
        Path::new(env!("CARGO_MANIFEST_DIR")).join(MIG_NODE),
    )
    .env("FAKE_NVML_STATE", c.path("nvml-state.json"))
    .env_remove("FAKE_GPU_DEV_ROOT");
}

fn mig_agent(c: &Cluster, fault: bool) -> tokio::process::Child {
    let mut cmd = common::dra_command(c.dir.path(), "nvml", &c.path("config.yaml"), NODE);
    cmd.arg("--nvml-lib")
        .arg(c.path("libnvidia-ml.so.1"))
        .arg("--proc-root")
        .arg(c.path("proc"))
        .arg("--container-driver-root")
        .arg(common::fake_driver_root(c.dir.path(), "570.124.06"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    nvml_env(c, &mut cmd);
    if fault {
        cmd.env("GPU_SLICER_FAULT", "dra-after-mig-create");
    }
    cmd.spawn().unwrap()
}

/// `gpu-slicer inventory --backend nvml` through the fake: GPU index → its MIG UUIDs and
/// profiles, seen from `dev_root` (a container's devices) when given.
fn migs(c: &Cluster, dev_root: Option<&Path>) -> BTreeMap<u64, Vec<(String, String)>> {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-slicer"));
    cmd.args([
        "inventory",
        "--backend",
        "nvml",
        "--format",
        "json",
        "--nvml-lib",
    ])
    .arg(c.path("libnvidia-ml.so.1"))
    .arg("--proc-root")
    .arg(c.path("proc"))
    .env(
        "FAKE_NVML_NODE",
        Path::new(env!("CARGO_MANIFEST_DIR")).join(MIG_NODE),
    )
    .env("FAKE_NVML_STATE", c.path("nvml-state.json"));
    match dev_root {
        Some(root) => cmd.env("FAKE_GPU_DEV_ROOT", root),
        None => cmd.env_remove("FAKE_GPU_DEV_ROOT"),
    };
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let m = g["migDevices"].as_array().unwrap().iter();
            let m = m.map(|m| {
                (
                    m["uuid"].as_str().unwrap().into(),
                    m["profile"].as_str().unwrap().into(),
                )
            });
            (g["index"].as_u64().unwrap(), m.collect())
        })
        .collect()
}

fn allocated(device: &str) -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(vec![DeviceRequestAllocationResult {
                request: "gpu".into(),
                driver: DRIVER.into(),
                pool: NODE.into(),
                device: device.into(),
                ..Default::default()
            }]),
            config: None,
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_mig_slice_is_made_for_its_claim_and_nothing_outlives_a_crash() {
    let c = Cluster::start().await;
    std::fs::copy(common::fake_lib(), c.path("libnvidia-ml.so.1")).unwrap();
    std::fs::create_dir_all(c.path("proc/driver/nvidia-caps")).unwrap();
    std::fs::write(
        c.path("proc/driver/nvidia-caps/mig-minors"),
        node_spec::mig_minors_file(&[0, 1, 2, 3, 4, 5, 6, 7]),
    )
    .unwrap();
    // GPUs 4 and 5 (MIG on, empty) are made on demand; GPU 6 keeps its static 3g.20gb pair.
    std::fs::write(
        c.path("config.yaml"),
        "flags: {migStrategy: mixed, dra: {dynamicMig: [4, 5]}}\n",
    )
    .unwrap();
    let agent = mig_agent(&c, false);
    let one = c.device("gpu-4-mig-1g5gb-19-3", |_| true).await;
    assert_eq!(
        one["consumesCounters"][0]["counterSet"],
        "gpu-4-counter-set"
    );
    c.device("gpu-6-mig-3g20gb-9-0", |_| true).await;

    // A claim for the 1g.5gb at placement 3: made in Prepare, the only MIG device there.
    let small = c.claim("small", "mig.gpu-slicer.io").await;
    c.server
        .allocate_claim("ml", "small", &allocated("gpu-4-mig-1g5gb-19-3"))
        .unwrap();
    let kubelet = c.registered().await;
    let answer = kubelet
        .prepare(std::slice::from_ref(&small), None)
        .await
        .unwrap();
    assert!(answer[&small.uid].is_ok(), "{answer:?}");
    let made = migs(&c, None);
    assert_eq!(made[&4].len(), 1, "{made:?}");
    let (uuid, profile) = made[&4][0].clone();
    assert_eq!(profile, "1g.5gb");
    // The container gets the GPU's node and the instance's two capability nodes; a process
    // with exactly those sees one GPU holding exactly that MIG device.
    let spec = c.spec(&small);
    let nodes: Vec<String> = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert_eq!(nodes[0], "/dev/nvidia4");
    let root = c.path("container");
    for n in nodes.iter().map(String::as_str).chain(["/dev/nvidiactl"]) {
        let p = root.join(n.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "").unwrap();
    }
    let seen = migs(&c, Some(&root));
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[&0], [(uuid.clone(), profile)]);

    // Unprepare destroys it.
    assert_eq!(
        kubelet
            .unprepare(std::slice::from_ref(&small))
            .await
            .unwrap()[&small.uid],
        ""
    );
    assert!(migs(&c, None)[&4].is_empty());

    // A claim that stays prepared keeps its instance across a restart …
    let kept = c.claim("kept", "mig.gpu-slicer.io").await;
    c.server
        .allocate_claim("ml", "kept", &allocated("gpu-4-mig-3g20gb-9-4"))
        .unwrap();
    assert!(
        kubelet
            .prepare(std::slice::from_ref(&kept), None)
            .await
            .unwrap()[&kept.uid]
            .is_ok()
    );
    stop(agent).await;

    // … and one killed between its create and its checkpoint leaves no orphan.
    let agent = mig_agent(&c, true);
    let lost = c.claim("lost", "mig.gpu-slicer.io").await;
    c.server
        .allocate_claim("ml", "lost", &allocated("gpu-5-mig-2g10gb-14-2"))
        .unwrap();
    let kubelet = c.registered().await;
    assert!(
        kubelet
            .prepare(std::slice::from_ref(&lost), None)
            .await
            .is_err(),
        "the agent died mid-call"
    );
    let mut agent = agent;
    let status = tokio::time::timeout(WAIT, agent.wait())
        .await
        .unwrap()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    assert_eq!(migs(&c, None)[&5].len(), 1, "made before the kill");
    let agent = mig_agent(&c, false);
    let kubelet = c.registered().await;
    let after = migs(&c, None);
    assert!(after[&5].is_empty(), "orphan left: {after:?}");
    assert_eq!(
        after[&4].len(),
        1,
        "the recorded claim's instance is kept: {after:?}"
    );
    // The kubelet's retry makes it again.
    assert!(
        kubelet
            .prepare(std::slice::from_ref(&lost), None)
            .await
            .unwrap()[&lost.uid]
            .is_ok()
    );
    assert_eq!(migs(&c, None)[&5].len(), 1);
    assert_eq!(
        kubelet
            .unprepare(&[kept.clone(), lost.clone()])
            .await
            .unwrap()
            .values()
            .filter(|e| !e.is_empty())
            .count(),
        0
    );
    let end = migs(&c, None);
    assert!(end[&4].is_empty() && end[&5].is_empty(), "{end:?}");
    assert_eq!(end[&6].len(), 2, "the static GPU is untouched: {end:?}");
    stop(agent).await;
    c.server.stop().await;
}
