//! Shared fixtures: a built-in sim node, a config parsed from text, the plan of both, and a
//! state store serving it; configs and node texts several tests use; the CDI examples in
//! `tests/fixtures/cdi/`. One copy for unit tests, integration tests, benches and the demo.

use std::path::{Path, PathBuf};
#[cfg(test)]
use std::sync::Arc;

use crate::domain::config::{self, Config, Overrides};
use crate::domain::inventory::{Backend, Inventory};
use crate::domain::plan::{self, Plan};
#[cfg(test)]
use crate::domain::snapshot::Snapshot;
use crate::platform::sim::SimBackend;
#[cfg(test)]
use crate::runtime::reloader::ConfigLoader;
#[cfg(test)]
use crate::state::Store;

/// `mixed-a100`'s whole GPUs time-sliced 4 ways, its MIG devices served one by one.
pub const SHARED_CONFIG: &str = "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n";

/// A config time-slicing every whole GPU `replicas` ways, MIG devices served one by one.
pub(crate) fn time_sliced(replicas: u32) -> String {
    format!(
        "version: v1\nflags: {{migStrategy: mixed}}\nsharing:\n  timeSlicing:\n    resources:\n    - {{name: nvidia.com/gpu, replicas: {replicas}}}\n"
    )
}

/// A `--config-dir` of three pool configs, one file per key: `default` ([`time_sliced`] 2),
/// `inference` (4) and `training` (whole GPUs).
///
/// # Panics
/// When the files cannot be written.
pub fn write_pool_configs(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for (key, text) in [
        ("default", time_sliced(2)),
        ("inference", time_sliced(4)),
        (
            "training",
            "version: v1\nflags: {migStrategy: mixed}\n".to_string(),
        ),
    ] {
        std::fs::write(dir.join(key), text).unwrap_or_else(|e| panic!("{key}: {e}"));
    }
}

#[cfg(test)]
/// A node file for the fake NVML driver: two A100-40GB with MIG on, GPU 0
/// (`GPU-40400000-0000-4000-8000-0000000000a0`) with two 3g.20gb (GPU instances 1 and 2),
/// GPU 1 (`...00a1`) with three 2g.10gb (3 to 5); for the live MIG layout tests.
pub(crate) const MIG_A100_40GB: &str = r#"
gpus:
  - index: 0
    uuid: GPU-40400000-0000-4000-8000-0000000000a0
    product: NVIDIA A100-SXM4-40GB
    pciBusId: "0000:10:00.0"
    mig:
      enabled: true
      devices:
        - {uuid: MIG-40400000-0000-4000-8000-0000000a0001, profile: 3g.20gb, gpuInstanceId: 1}
        - {uuid: MIG-40400000-0000-4000-8000-0000000a0002, profile: 3g.20gb, gpuInstanceId: 2}
  - index: 1
    uuid: GPU-40400000-0000-4000-8000-0000000000a1
    product: NVIDIA A100-SXM4-40GB
    pciBusId: "0000:11:00.0"
    mig:
      enabled: true
      devices:
        - {uuid: MIG-40400000-0000-4000-8000-0000000a1001, profile: 2g.10gb, gpuInstanceId: 3}
        - {uuid: MIG-40400000-0000-4000-8000-0000000a1002, profile: 2g.10gb, gpuInstanceId: 4}
        - {uuid: MIG-40400000-0000-4000-8000-0000000a1003, profile: 2g.10gb, gpuInstanceId: 5}
"#;

/// The inventory of a built-in sim profile (`mixed-a100`, `dgx-h100`) or node file.
///
/// # Panics
/// When the profile does not load: fixtures are for tests.
pub(crate) fn inventory(profile: &str) -> Inventory {
    SimBackend::open(profile)
        .and_then(|b| b.discover())
        .unwrap_or_else(|e| panic!("sim profile {profile}: {e}"))
}

/// A config parsed from YAML text, with no flags or environment.
///
/// # Panics
/// When the text is not a valid config.
pub(crate) fn config(text: &str) -> Config {
    config::parse(text, "test.yaml", &Overrides::default())
        .unwrap_or_else(|e| panic!("config: {e}"))
}

/// Inventory, config and plan of a profile under a config text.
///
/// # Panics
/// When the config does not fit the profile.
pub(crate) fn planned(profile: &str, config_text: &str) -> (Inventory, Config, Plan) {
    let inventory = inventory(profile);
    let config = config(config_text);
    let plan = plan::build(&inventory, &config).unwrap_or_else(|e| panic!("plan: {e}"));
    (inventory, config, plan)
}

#[cfg(test)]
/// A config loader reading `file` as `gpu-slicer run --config <file>` does (no flags or
/// environment), for a daemon whose reloads read the file again.
pub(crate) fn file_loader(file: &Path) -> ConfigLoader {
    let file = file.to_path_buf();
    Arc::new(move || crate::platform::config_file::load(Some(&file), &Overrides::default()))
}

#[cfg(test)]
/// A store serving the plan of a profile under a config text.
pub(crate) fn store(profile: &str, config_text: &str) -> Store {
    let (inventory, config, plan) = planned(profile, config_text);
    Store::new(Snapshot::serving(config, inventory, plan))
}

/// The CDI examples: `valid/`, `invalid/`, and the 51 Podman 4.3.1 cases with what Podman did.
pub(crate) const CDI_FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cdi");

/// Files that `cdi validate` must reject: `tests/fixtures/cdi/invalid/` (including the cases
/// CDI-RS's own fixtures reject), and every Podman case file Podman rejected for a
/// reason inside the file (not for host state such as a missing /dev node or a conflict
/// between two files).
///
/// # Panics
/// When `tests/fixtures/cdi/invalid/` cannot be read.
pub fn cdi_must_reject() -> Vec<PathBuf> {
    let ex = Path::new(CDI_FIXTURES);
    let invalid = ex.join("invalid");
    let mut files = Vec::new();
    for e in std::fs::read_dir(&invalid).unwrap_or_else(|e| panic!("{}: {e}", invalid.display())) {
        files.push(
            e.unwrap_or_else(|e| panic!("{}: {e}", invalid.display()))
                .path(),
        );
    }
    let cases = ex.join("podman-4.3.1");
    for rel in [
        "ver-0.6.0/etc/t.json",
        "ver-0.7.0/etc/t.json",
        "ver-0.8.0/etc/t.json",
        "ver-1.0.0/etc/t.json",
        "ver-1.1.0/etc/t.json",
        "ver-v0.5.0/etc/t.json",
        "ver-0.5/etc/t.json",
        "ver-empty/etc/t.json",
        "f-perm-none/etc/t.json",
        "f-hook-badname/etc/t.json",
        "f-env-invalid/etc/t.json",
        "f-empty-device-edits/etc/t.json",
        "f-annotations-0.5.0/etc/t.json",
        "f-annotations-0.6.0/etc/t.json",
        "f-additionalgids-0.5.0/etc/t.json",
        "f-unknown-field/etc/t.json",
        "dup-in-file/etc/t.json",
        "n-class-dot/etc/t.json",
        "n-vendor-single-char/etc/t.json",
        "n-class-single-char/etc/t.json",
        "n-single-char-class-in-other-file/etc/bad.json",
        "broken-file-isolated/etc/bad.json",
        "file-yml/etc/t.yml",
        "file-noext/etc/t",
    ] {
        files.push(cases.join(rel));
    }
    files
}

/// The names in `dir`, sorted.
///
/// # Panics
/// When `dir` cannot be read.
pub fn file_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}
