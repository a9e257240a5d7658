//! One usage round on the NVML path as the sampler runs it, on the fake NVML: 8 × A100 each
//! split into 7 × 1g.10gb, one process per MIG device (56), each in a pod holding that MIG
//! device (cgroup files shaped like a kubelet's, a device-manager checkpoint, PodResources
//! holders).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::domain::snapshot::Snapshot;
use crate::domain::usage::{self, Holder, IdleTracker, Inputs, ReportInputs};
use crate::platform::usage::{NvmlUsage, UsageSource, read_cgroups, read_checkpoint};
use crate::runtime::metrics::Metrics;
use crate::testkit::PrivateFake;
use crate::testkit::fixtures;
use crate::testkit::kubelet::{Allocation, PodRef, checkpoint_json, pod_uid};

const GPUS: u32 = 8;
const SLICES: u32 = 7;
const RESOURCE: &str = "nvidia.com/mig-1g.10gb";

fn mig_uuid(g: u32, gi: u32) -> String {
    format!("MIG-00000000-0000-4000-8000-0000000{g:02x}{gi:03x}")
}

/// The node: GPU instances 7..13 of each GPU, one 512 MiB process on each MIG device.
fn node_yaml() -> String {
    let mut s = String::from("name: bench-8x7\ngpus:\n");
    for g in 0..GPUS {
        s += &format!(
            "  - index: {g}\n    uuid: GPU-00000000-0000-4000-8000-0000000000{g:02x}\n    product: NVIDIA A100-SXM4-80GB\n    pciBusId: \"00000000:{:02X}:00.0\"\n    mig:\n      enabled: true\n      devices:\n",
            0x10 + g * 8,
        );
        for gi in 7..7 + SLICES {
            s += &format!(
                "        - {{uuid: {}, profile: 1g.10gb, gpuInstanceId: {gi}}}\n",
                mig_uuid(g, gi)
            );
        }
    }
    s += "usage:\n  devices:\n";
    for g in 0..GPUS {
        for gi in 7..7 + SLICES {
            s += &format!(
                "    {}: {{processes: [{{pid: {}, memoryMiB: 512}}]}}\n",
                mig_uuid(g, gi),
                10_000 + g * 100 + gi
            );
        }
    }
    s
}

/// The usage sampler's inputs of one node, ready for timed rounds.
#[derive(Debug)]
pub struct Usage {
    source: NvmlUsage,
    snapshot: Snapshot,
    proc_root: PathBuf,
    checkpoint: PathBuf,
    holders: BTreeMap<String, BTreeMap<String, Holder>>,
    metrics: Metrics,
    idle: IdleTracker,
    allocated: BTreeMap<String, BTreeSet<String>>,
    /// The fake the source opens, kept loaded with its node.
    _fake: PrivateFake,
    _dir: TempDir,
}

impl Usage {
    /// The 8 × 7 node on a private copy of the fake NVML, its plan, one pod per MIG device
    /// with its cgroup file, the kubelet's checkpoint and the holders; one sample taken
    /// already (NVML opened).
    ///
    /// # Panics
    /// When a file cannot be written or the first sample fails.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let node = node_yaml();
        let node_path = dir.path().join("node.yaml");
        std::fs::write(&node_path, &node).unwrap_or_else(|e| panic!("node: {e}"));
        let fake = PrivateFake::new(dir.path());
        fake.set_node(&node);
        let (inventory, config, plan) = fixtures::planned(
            node_path.to_str().unwrap_or_else(|| panic!("not UTF-8")),
            "flags: {migStrategy: mixed}\n",
        );
        let snapshot = Snapshot::serving(config, inventory, plan);
        let proc_root = dir.path().join("proc");
        let mut allocations = Vec::new();
        let mut holders: BTreeMap<String, BTreeMap<String, Holder>> = BTreeMap::new();
        for g in 0..GPUS {
            for gi in 7..7 + SLICES {
                let pod = PodRef {
                    namespace: "ml".into(),
                    name: format!("p-{g}-{gi}"),
                    container: "main".into(),
                };
                let pid = 10_000 + g * 100 + gi;
                let pid_dir = proc_root.join(pid.to_string());
                std::fs::create_dir_all(&pid_dir).unwrap_or_else(|e| panic!("mkdir: {e}"));
                std::fs::write(
                    pid_dir.join("cgroup"),
                    format!(
                        "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{:064x}.scope\n",
                        pod_uid(&pod).replace('-', "_"),
                        pid
                    ),
                )
                .unwrap_or_else(|e| panic!("cgroup: {e}"));
                let id = mig_uuid(g, gi);
                holders.entry(RESOURCE.into()).or_default().insert(
                    id.clone(),
                    Holder {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: pod.container.clone(),
                    },
                );
                allocations.push(Allocation {
                    pod,
                    resource: RESOURCE.into(),
                    device_ids: vec![id],
                    response: Default::default(),
                });
            }
        }
        let checkpoint = dir.path().join("kubelet_internal_checkpoint");
        std::fs::write(&checkpoint, checkpoint_json(&allocations, &BTreeMap::new()))
            .unwrap_or_else(|e| panic!("checkpoint: {e}"));
        let mut source = NvmlUsage::new(Some(fake.path.clone()));
        source
            .sample()
            .unwrap_or_else(|e| panic!("first sample: {e}"));
        Self {
            source,
            snapshot,
            proc_root,
            checkpoint,
            holders,
            metrics: Metrics::new(),
            idle: IdleTracker::default(),
            allocated: BTreeMap::new(),
            _fake: fake,
            _dir: dir,
        }
    }

    /// The NVML sample alone: the time it took (the sample is freed after the clock is
    /// read) and the processes it found.
    ///
    /// # Panics
    /// When the sample fails.
    pub fn sample(&mut self) -> (Duration, usize) {
        let start = Instant::now();
        let sample = self
            .source
            .sample()
            .unwrap_or_else(|e| panic!("sample: {e}"));
        (start.elapsed(), sample.processes.len())
    }

    /// A whole round as the sampler runs it: sample, the cgroup file of each process, the
    /// checkpoint, attribution, the idle window, the report, its JSON and the metrics. The
    /// time it took (what it made is freed after the clock is read).
    ///
    /// # Panics
    /// When a read fails or a process is not attributed to its pod.
    pub fn round(&mut self) -> Duration {
        let t = Instant::now();
        let sample = self
            .source
            .sample()
            .unwrap_or_else(|e| panic!("sample: {e}"));
        let cgroups = read_cgroups(&self.proc_root, sample.processes.iter().map(|p| p.pid));
        let checkpoint =
            read_checkpoint(&self.checkpoint).unwrap_or_else(|e| panic!("checkpoint: {e}"));
        let attribution = usage::attribute(&Inputs {
            sample: &sample,
            cgroups: &cgroups,
            checkpoint: &checkpoint,
            holders: &self.holders,
            views: &self.snapshot.views,
        });
        assert!(
            attribution.unattributed.is_empty(),
            "{:?}",
            attribution.unattributed
        );
        let idle_now = self.idle.observe(
            &attribution.shares,
            Instant::now(),
            Duration::from_secs(900),
        );
        let report = usage::report(&ReportInputs {
            generation: self.snapshot.generation,
            sampled_at_ms: 1,
            interval: Duration::from_secs(10),
            idle_window: Duration::from_secs(900),
            inventory: &self.snapshot.inventory,
            views: &self.snapshot.views,
            sample: &sample,
            attribution: &attribution,
            idle: &idle_now,
            allocated: &self.allocated,
        });
        self.metrics.usage.publish(&report);
        let json = serde_json::to_vec(&report).unwrap_or_else(|e| panic!("json: {e}"));
        std::hint::black_box(json);
        t.elapsed()
    }
}

impl Default for Usage {
    fn default() -> Self {
        Self::new()
    }
}
