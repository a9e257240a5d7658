//! The node file's `usage` section: what the GPUs are doing, so every usage figure of the
//! agent (utilisation, memory used, processes and who they belong to) can be tested
//! without a GPU.
//!
//! Read by the sim backend's usage source (`gpu-slicer`'s `platform::usage`) and by the fake
//! NVML library (`nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetMemoryInfo(_v2)` used bytes,
//! `nvmlDeviceGetComputeRunningProcesses_v3`). Keyed by device UUID rather than position, so
//! the section survives the fake's device-node view (which drops and renumbers devices).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::{NodeSpec, NodeSpecError};

/// Per-device usage, keyed by GPU or MIG UUID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UsageSpec {
    /// `GPU-…` or `MIG-…` → what the device is doing. Devices not listed are idle.
    #[serde(default)]
    pub devices: BTreeMap<String, DeviceUsageSpec>,
}

impl UsageSpec {
    /// Nothing declared (the section is omitted when written back).
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The usage of `uuid`, if declared.
    pub fn device(&self, uuid: &str) -> Option<&DeviceUsageSpec> {
        self.devices.get(uuid)
    }
}

/// What one GPU or MIG device is doing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceUsageSpec {
    /// GPU utilisation in percent (0–100), as `nvmlDeviceGetUtilizationRates` reports it.
    /// GPUs not in MIG mode only: NVML reports no utilisation for MIG devices or for a GPU
    /// in MIG mode.
    #[serde(default)]
    pub utilization_percent: Option<u32>,
    /// Memory in use, MiB; defaults to the sum of the processes' memory.
    #[serde(default, rename = "memoryUsedMiB")]
    pub memory_used_mib: Option<u64>,
    /// Processes with a compute context on the device.
    #[serde(default)]
    pub processes: Vec<ProcessSpec>,
}

impl DeviceUsageSpec {
    /// Memory in use in MiB (declared, else the processes' sum).
    pub fn memory_used_mib(&self) -> u64 {
        self.memory_used_mib
            .unwrap_or_else(|| self.processes.iter().map(|p| p.memory_mib).sum())
    }
}

/// One process with a compute context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessSpec {
    /// Host pid (what NVML reports): the agent reads `<proc-root>/<pid>/cgroup`.
    pub pid: u32,
    /// GPU memory the process uses, MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
}

/// Check the section against the node: every UUID exists, figures fit the device.
pub(crate) fn validate(node: &NodeSpec, origin: &str) -> Result<(), NodeSpecError> {
    let invalid = |field: String, message: String| NodeSpecError::Invalid {
        path: origin.to_string(),
        field,
        message,
    };
    for (uuid, usage) in &node.usage.devices {
        let f = |name: &str| format!("usage.devices.{uuid}.{name}");
        // (total MiB, whether NVML can report utilisation, whether processes belong here)
        let (total, utilisation_ok, processes_ok) =
            if let Some(gpu) = node.gpus.iter().find(|g| &g.uuid == uuid) {
                let mig = gpu.mig_enabled();
                (gpu.memory_mib(), !mig, !mig)
            } else if let Some((gpu, dev)) = node.gpus.iter().find_map(|g| {
                g.mig_devices()
                    .into_iter()
                    .find(|(_, d)| &d.uuid == uuid)
                    .map(|(_, d)| (g, d))
            }) {
                (gpu.mig_memory_mib(dev), false, true)
            } else {
                return Err(invalid(
                    format!("usage.devices.{uuid}"),
                    format!("`{uuid}` is not a GPU or MIG device of this node"),
                ));
            };
        if let Some(p) = usage.utilization_percent {
            if !utilisation_ok {
                return Err(invalid(
                    f("utilizationPercent"),
                    "NVML reports no utilisation for MIG devices or GPUs in MIG mode".into(),
                ));
            }
            if p > 100 {
                return Err(invalid(
                    f("utilizationPercent"),
                    format!("{p} is above 100"),
                ));
            }
        }
        if !processes_ok && !usage.processes.is_empty() {
            return Err(invalid(
                f("processes"),
                "the GPU is in MIG mode: list processes under their MIG device".into(),
            ));
        }
        let mut pids = BTreeSet::new();
        for (i, p) in usage.processes.iter().enumerate() {
            if p.pid == 0 {
                return Err(invalid(
                    format!("usage.devices.{uuid}.processes[{i}].pid"),
                    "pid 0 is not a process".into(),
                ));
            }
            if !pids.insert(p.pid) {
                return Err(invalid(
                    format!("usage.devices.{uuid}.processes[{i}].pid"),
                    format!("duplicate pid {}", p.pid),
                ));
            }
        }
        let summed: u64 = usage.processes.iter().map(|p| p.memory_mib).sum();
        let used = usage.memory_used_mib();
        if used > total {
            return Err(invalid(
                f("memoryUsedMiB"),
                format!("{used} MiB used is more than the device's {total} MiB"),
            ));
        }
        if summed > used {
            return Err(invalid(
                f("memoryUsedMiB"),
                format!("{used} MiB used is less than its processes' {summed} MiB"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::NodeSpec;

    const NODE: &str = r#"
gpus:
- index: 0
  uuid: GPU-00000000-0000-4000-8000-000000000000
  product: NVIDIA A100-SXM4-80GB
  pciBusId: "0000:07:00.0"
- index: 1
  uuid: GPU-00000000-0000-4000-8000-000000000001
  product: NVIDIA A100-SXM4-80GB
  pciBusId: "0000:08:00.0"
  mig:
    enabled: true
    devices:
    - {uuid: MIG-00000000-0000-4000-8000-000000000010, profile: 1g.10gb, gpuInstanceId: 7}
"#;

    fn with(usage: &str) -> Result<NodeSpec, String> {
        NodeSpec::parse(&format!("{NODE}usage:\n  devices:\n{usage}"), "n.yaml")
            .map_err(|e| e.to_string())
    }

    #[test]
    fn usage_defaults_memory_to_the_processes() {
        let n = with(
            "    GPU-00000000-0000-4000-8000-000000000000:\n      utilizationPercent: 40\n      processes: [{pid: 10, memoryMiB: 100}, {pid: 11, memoryMiB: 50}]\n    MIG-00000000-0000-4000-8000-000000000010: {memoryUsedMiB: 9000}\n",
        )
        .expect("valid");
        let gpu = n
            .usage
            .device("GPU-00000000-0000-4000-8000-000000000000")
            .expect("gpu");
        assert_eq!(gpu.memory_used_mib(), 150);
        assert_eq!(gpu.utilization_percent, Some(40));
    }

    #[test]
    fn usage_errors_name_the_field() {
        for (usage, field, why) in [
            (
                "    GPU-00000000-0000-4000-8000-00000000000f: {}\n",
                "usage.devices.GPU-00000000-0000-4000-8000-00000000000f",
                "not a GPU or MIG device",
            ),
            (
                "    GPU-00000000-0000-4000-8000-000000000000: {utilizationPercent: 101}\n",
                "utilizationPercent",
                "above 100",
            ),
            (
                "    MIG-00000000-0000-4000-8000-000000000010: {utilizationPercent: 5}\n",
                "utilizationPercent",
                "no utilisation",
            ),
            (
                "    GPU-00000000-0000-4000-8000-000000000001: {processes: [{pid: 3, memoryMiB: 1}]}\n",
                "processes",
                "MIG mode",
            ),
            (
                "    GPU-00000000-0000-4000-8000-000000000000: {processes: [{pid: 3, memoryMiB: 1}, {pid: 3, memoryMiB: 1}]}\n",
                "processes[1].pid",
                "duplicate pid 3",
            ),
            (
                "    MIG-00000000-0000-4000-8000-000000000010: {memoryUsedMiB: 20000}\n",
                "memoryUsedMiB",
                "more than the device's",
            ),
            (
                "    GPU-00000000-0000-4000-8000-000000000000: {memoryUsedMiB: 1, processes: [{pid: 3, memoryMiB: 2}]}\n",
                "memoryUsedMiB",
                "less than its processes'",
            ),
        ] {
            let e = with(usage).expect_err(usage);
            assert!(e.contains(field) && e.contains(why), "{usage}: {e}");
        }
    }
}
