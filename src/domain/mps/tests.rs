//! Daemon derivation on the built-in sim nodes.

use std::path::Path;

use super::*;
use crate::domain::config::{self, Overrides};
use crate::domain::inventory::{Backend, Inventory};
use crate::domain::plan;
use crate::platform::sim::SimBackend;

fn inv(profile: &str) -> Inventory {
    SimBackend::open(profile).unwrap().discover().unwrap()
}

fn cfg(text: &str) -> Config {
    config::parse(text, "cfg.yaml", &Overrides::default()).unwrap()
}

const MIXED: &str = "flags: {migStrategy: mixed, mpsRoot: /run/mps}
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/mig-1g.10gb, replicas: 2}
  mps:
    resources:
    - {name: nvidia.com/mig-3g.40gb, replicas: 3}
    - {name: nvidia.com/gpu, replicas: 4}
";

#[test]
fn mixed_a100_mps_on_mig_and_gpu_time_slicing_elsewhere() {
    let config = cfg(MIXED);
    let plan = plan::build(&inv("mixed-a100"), &config).unwrap();
    let ds = daemons_for(&plan, &config).unwrap();
    let uuids: Vec<&str> = ds.iter().map(|d| d.uuid.as_str()).collect();
    // Whole GPUs 2 and 3 and the one 3g.40gb; none for the time-sliced 1g.10gb devices.
    assert_eq!(
        uuids,
        vec![
            "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02",
            "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03",
            "MIG-2c3d4e5f-0000-4b00-8000-000000000002",
        ]
    );

    let mig = &ds[2];
    assert_eq!(mig.gpu_uuid, "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e01");
    assert_eq!(mig.resource, "nvidia.com/mig-3g.40gb");
    assert_eq!(mig.replicas, 3);
    // Relative to the MIG device, not the GPU (whose share would be 42 / 3).
    assert_eq!(mig.active_thread_percentage, 33);
    assert_eq!(mig.pinned_mem_limit_mib, (40u64 << 10) / 3);
    assert_eq!(
        mig.pipe_dir,
        Path::new("/run/mps/MIG-2c3d4e5f-0000-4b00-8000-000000000002/pipe")
    );
    assert_eq!(
        mig.env(),
        vec![
            (
                "CUDA_VISIBLE_DEVICES".to_string(),
                "MIG-2c3d4e5f-0000-4b00-8000-000000000002".to_string()
            ),
            (
                "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                "/run/mps/MIG-2c3d4e5f-0000-4b00-8000-000000000002/pipe".to_string()
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".to_string(),
                "/run/mps/MIG-2c3d4e5f-0000-4b00-8000-000000000002/log".to_string()
            ),
        ]
    );
    assert_eq!(
        mig.default_limit_commands(),
        vec![
            "set_default_device_pinned_mem_limit 0 13653M".to_string(),
            "set_default_active_thread_percentage 33".to_string(),
        ]
    );

    let gpu = &ds[0];
    assert_eq!(gpu.gpu_uuid, gpu.uuid);
    assert_eq!(gpu.active_thread_percentage, 25);
    assert_eq!(gpu.pinned_mem_limit_mib, 20480);
    assert_eq!(
        gpu.default_limit_commands(),
        vec![
            "set_default_device_pinned_mem_limit 0 20480M".to_string(),
            "set_default_active_thread_percentage 25".to_string(),
        ]
    );
}

#[test]
fn explicit_memory_per_replica_is_the_pinned_limit() {
    let config = cfg("flags: {migStrategy: mixed}
sharing:
  mps:
    resources:
    - {name: nvidia.com/gpu, replicas: 2, memory: 10Gi}
");
    let plan = plan::build(&inv("mixed-a100"), &config).unwrap();
    let ds = daemons_for(&plan, &config).unwrap();
    assert_eq!(ds.len(), 2);
    assert!(ds.iter().all(|d| d.pinned_mem_limit_mib == 10240));
    assert!(ds.iter().all(|d| d.active_thread_percentage == 50));
    // Config loading supplies the default root when MPS is used.
    assert!(ds[0].pipe_dir.starts_with("/run/nvidia/mps"));
}

#[test]
fn no_daemons_without_mps() {
    let config = cfg("flags: {migStrategy: mixed}
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/gpu, replicas: 4}
");
    let plan = plan::build(&inv("mixed-a100"), &config).unwrap();
    assert!(daemons_for(&plan, &config).unwrap().is_empty());
    let plan = plan::build(&inv("dgx-h100"), &Config::default()).unwrap();
    assert!(daemons_for(&plan, &Config::default()).unwrap().is_empty());
}

#[test]
fn dgx_h100_one_daemon_per_gpu() {
    let config = cfg("sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 3}\n");
    let plan = plan::build(&inv("dgx-h100"), &config).unwrap();
    let ds = daemons_for(&plan, &config).unwrap();
    assert_eq!(ds.len(), 8);
    assert!(ds.iter().all(|d| d.active_thread_percentage == 33));
    assert!(ds.iter().all(|d| d.uuid.starts_with("GPU-")));
}

#[test]
fn missing_root_is_an_error() {
    let mut config = cfg(MIXED);
    let plan = plan::build(&inv("mixed-a100"), &config).unwrap();
    config.mps_root = None;
    let err = daemons_for(&plan, &config).unwrap_err();
    assert!(matches!(err, MpsError::NoMpsRoot { .. }), "{err}");
}

#[test]
fn client_edits_mount_pipe_and_shm() {
    let config = cfg(MIXED);
    let plan = plan::build(&inv("mixed-a100"), &config).unwrap();
    let ds = daemons_for(&plan, &config).unwrap();
    let root = config.mps_root.clone().unwrap();
    let edits = ds[2].client_edits();
    let pipe = "/mps/MIG-2c3d4e5f-0000-4b00-8000-000000000002/pipe".to_string();
    assert_eq!(
        edits.env,
        vec![("CUDA_MPS_PIPE_DIRECTORY".to_string(), pipe.clone())]
    );
    assert_eq!(
        edits.mounts,
        vec![
            (ds[2].pipe_dir.clone(), pipe),
            (
                root.join("MIG-2c3d4e5f-0000-4b00-8000-000000000002/shm"),
                "/dev/shm".to_string()
            ),
        ]
    );
    // No thread-percentage variable: see the module header.
    assert!(
        edits
            .env
            .iter()
            .all(|(k, _)| k != "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    );
}

/// Issue 13 item 11: every daemon has its own `/dev/shm`, under its own directory, and
/// a share of one device is handed only its own daemon's (it was one `<mpsRoot>/shm` for
/// every tenant of every device).
#[test]
fn every_daemon_has_its_own_shm_and_clients_get_only_theirs() {
    let config = cfg(MIXED);
    let plan = plan::build(&inv("mixed-a100"), &config).unwrap();
    let ds = daemons_for(&plan, &config).unwrap();
    let root = config.mps_root.clone().unwrap();
    let shms: std::collections::BTreeSet<&Path> = ds.iter().map(|d| d.shm_dir.as_path()).collect();
    assert_eq!(
        shms.len(),
        ds.len(),
        "one shm directory per daemon: {shms:?}"
    );
    for d in &ds {
        assert_eq!(d.shm_dir, root.join(&d.uuid).join("shm"));
        let shm: Vec<PathBuf> = d
            .client_edits()
            .mounts
            .into_iter()
            .filter(|(_, ct)| ct == "/dev/shm")
            .map(|(host, _)| host)
            .collect();
        assert_eq!(shm, vec![d.shm_dir.clone()], "{}", d.uuid);
    }
}

#[test]
fn uuids_cannot_escape_the_root() {
    assert!(check_uuid("GPU-1234-abcd").is_ok());
    assert!(check_uuid("..").is_err());
    assert!(check_uuid("MIG-GPU-x/1/0").is_err());
    assert!(check_uuid("").is_err());
}
