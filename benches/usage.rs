//! Cost of one usage round on the NVML path (fake `libnvidia-ml`, crates/fake-nvml), node:
//! 8 × A100 each split into 7 × 1g.10gb, one process per MIG device (56), each in a pod
//! holding that MIG device (cgroup files shaped like a kubelet's, a device-manager checkpoint,
//! PodResources holders): the NVML sample alone, and the whole round as the sampler runs it
//! (sample, cgroup reads, checkpoint read, attribution, idle window, report, JSON, metrics).
//! Time per round, p50 / p99 over 300 rounds. BENCH_QUICK=1 runs 50.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CString, c_char, c_int};
use std::time::{Duration, Instant};

use common::fake_lib;
use gpu_slicer::domain::snapshot::Snapshot;
use gpu_slicer::domain::usage::{self, Holder, IdleTracker, Inputs, ReportInputs};
use gpu_slicer::platform::usage::{NvmlUsage, UsageSource, read_cgroups, read_checkpoint};
use gpu_slicer::runtime::metrics::Metrics;
use gpu_slicer::testkit::fixtures;
use gpu_slicer::testkit::kubelet::{Allocation, PodRef, checkpoint_json, pod_uid};

const GPUS: u32 = 8;
const SLICES: u32 = 7;

fn mig_uuid(g: u32, gi: u32) -> String {
    format!("MIG-00000000-0000-4000-8000-0000000{g:02x}{gi:03x}")
}

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

use gpu_slicer::testkit::stats::percentile;

fn show(name: &str, mut times: Vec<Duration>) {
    times.sort();
    let (p50, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
    println!("{name}: p50 {p50:?} / p99 {p99:?} (n={})", times.len());
    println!("FIGURE|{name}|p50 {p50:.2?} / p99 {p99:.2?}");
}

fn main() {
    let rounds = if std::env::var_os("BENCH_QUICK").is_some() {
        50
    } else {
        300
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let node = node_yaml();
    let node_path = dir.path().join("node.yaml");
    std::fs::write(&node_path, &node).expect("node");
    let lib_path = dir.path().join("libnvidia-ml.so.1");
    std::fs::copy(fake_lib(), &lib_path).expect("copy fake");
    // SAFETY: loading our own fake library; it runs no initialisers with side effects.
    let lib = unsafe { libloading::Library::new(&lib_path) }.expect("dlopen fake");
    let text = CString::new(node.as_str()).expect("no NUL");
    // SAFETY: the control symbol is `int (const char*)`; `text` lives across the call.
    let rc = unsafe {
        let set: libloading::Symbol<unsafe extern "C" fn(*const c_char) -> c_int> =
            lib.get(b"fakeNvmlSetNodeJson").expect("control symbol");
        set(text.as_ptr())
    };
    assert_eq!(rc, 0, "fake rejected the node");

    // The plan, one pod per MIG device, their cgroup files, the checkpoint, the holders.
    let (inventory, config, plan) = fixtures::planned(
        node_path.to_str().expect("utf-8 path"),
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
            std::fs::create_dir_all(&pid_dir).expect("mkdir");
            std::fs::write(
                pid_dir.join("cgroup"),
                format!(
                    "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{:064x}.scope\n",
                    pod_uid(&pod).replace('-', "_"),
                    pid
                ),
            )
            .expect("cgroup");
            let id = mig_uuid(g, gi);
            holders
                .entry("nvidia.com/mig-1g.10gb".into())
                .or_default()
                .insert(
                    id.clone(),
                    Holder {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: pod.container.clone(),
                    },
                );
            allocations.push(Allocation {
                pod,
                resource: "nvidia.com/mig-1g.10gb".into(),
                device_ids: vec![id],
                response: Default::default(),
            });
        }
    }
    let checkpoint_path = dir.path().join("kubelet_internal_checkpoint");
    std::fs::write(
        &checkpoint_path,
        checkpoint_json(&allocations, &BTreeMap::new()),
    )
    .expect("checkpoint");

    let mut source = NvmlUsage::new(Some(lib_path.clone()));
    source.sample().expect("first sample");
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let sample = source.sample().expect("sample");
        times.push(t.elapsed());
        assert_eq!(sample.processes.len(), (GPUS * SLICES) as usize);
    }
    show(
        "usage: NVML sample, 8 GPUs x 7 MIG, 56 processes (fake NVML)",
        times,
    );

    let metrics = Metrics::new();
    let mut idle = IdleTracker::default();
    let allocated: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let sample = source.sample().expect("sample");
        let cgroups = read_cgroups(&proc_root, sample.processes.iter().map(|p| p.pid));
        let checkpoint = read_checkpoint(&checkpoint_path).expect("checkpoint");
        let attribution = usage::attribute(&Inputs {
            sample: &sample,
            cgroups: &cgroups,
            checkpoint: &checkpoint,
            holders: &holders,
            views: &snapshot.views,
        });
        assert!(
            attribution.unattributed.is_empty(),
            "{:?}",
            attribution.unattributed
        );
        let idle_now = idle.observe(
            &attribution.shares,
            Instant::now(),
            Duration::from_secs(900),
        );
        let report = usage::report(&ReportInputs {
            generation: snapshot.generation,
            sampled_at_ms: 1,
            interval: Duration::from_secs(10),
            idle_window: Duration::from_secs(900),
            inventory: &snapshot.inventory,
            views: &snapshot.views,
            sample: &sample,
            attribution: &attribution,
            idle: &idle_now,
            allocated: &allocated,
        });
        metrics.usage.publish(&report);
        let json = serde_json::to_vec(&report).expect("json");
        std::hint::black_box(json);
        times.push(t.elapsed());
    }
    show(
        "usage: whole round (sample, 56 cgroup reads, checkpoint, attribution, report, JSON, metrics)",
        times,
    );
    drop(lib);
}
