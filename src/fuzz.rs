//! The fuzzing surface: one entry per cargo-fuzz target (`fuzz/fuzz_targets/<name>.rs` is
//! `fuzz_target!(|data: &[u8]| gpu_slicer::fuzz::<name>(data))`). Each takes the fuzzer's
//! bytes, feeds them to the parsers behind one input the agent reads from outside (a file, a
//! pipe, the kubelet) and exercises what a parsed value goes on to; none may panic, whatever
//! the bytes. Inputs that are not UTF-8 are dropped (every parser here reads text). The
//! targets reach nothing else in the crate.

use std::path::Path;

use crate::domain::cdi::{self, Spec};
use crate::domain::config::{self, Overrides};
use crate::domain::inventory::{Backend, Inventory};
use crate::domain::miglayout::MigPartedFile;
use crate::domain::usage;
use crate::platform::enforce;
use crate::platform::mig::{from_inventory, plan_all};
use crate::platform::sim::SimBackend;

/// The built-in `mixed-a100` node, the shape parsed configs and layouts are planned on.
fn mixed_a100() -> Option<Inventory> {
    SimBackend::open("mixed-a100")
        .and_then(|b| b.discover())
        .ok()
}

/// `data` up to its first NUL, and what follows it: targets that read two inputs.
fn split_at_nul(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    }
}

/// The CDI spec parser and validator behind `cdi validate` and the spec writer's re-read of
/// the previous spec, as YAML and as JSON; a spec that parses is validated and given its
/// minimum version.
pub fn cdi_spec(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for name in ["fuzz.yaml", "fuzz.json"] {
        if let Ok(spec) = Spec::parse(text, Path::new(name)) {
            let _ = cdi::validate::validate(&spec);
            let _ = cdi::minimum_version(&spec);
        }
    }
}

/// The config parser, YAML or JSON: any text gives a config or an error; a config that
/// loads is planned on a real node shape.
pub fn config_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let (Ok(cfg), Some(inv)) = (
        config::parse(text, "fuzz.yaml", &Overrides::default()),
        mixed_a100(),
    ) {
        let _ = crate::domain::plan::build(&inv, &cfg);
    }
}

/// The health event-line parser (`node_spec::EventLine`) shared by the fake NVML and the
/// health monitor: one JSON event per line.
pub fn event_line(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for line in text.lines() {
        let _ = node_spec::EventLine::parse(line);
    }
}

/// What usage attribution reads from the host: a process's `/proc/<pid>/cgroup` before the
/// first NUL, the kubelet's `kubelet_internal_checkpoint` after it. Any text gives a pod or
/// nothing, entries or an error.
pub fn kubelet_usage(data: &[u8]) {
    let (cgroup, checkpoint) = split_at_nul(data);
    if let Ok(c) = std::str::from_utf8(cgroup) {
        let _ = usage::parse_cgroup(c);
    }
    if let Ok(c) = std::str::from_utf8(checkpoint) {
        let _ = usage::parse_checkpoint(c, "fuzz");
    }
}

/// mig-parted layout files: any text gives a file or an error; every layout of a file that
/// parses is planned on the built-in `mixed-a100` node (fitting or not).
pub fn mig_parted(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (Ok(file), Some(inventory)) = (MigPartedFile::parse(text, "fuzz.yaml"), mixed_a100())
    else {
        return;
    };
    let gpus = from_inventory(&inventory);
    for layout in file.layouts.keys() {
        let _ = plan_all(&file, layout, &gpus);
    }
}

/// The node-file parser and validator (`node_spec::NodeSpec`), the sim backend's input; the
/// accessors of a validated node must hold for every GPU it describes.
pub fn node_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(spec) = node_spec::NodeSpec::parse(text, "fuzz.yaml") {
        for g in &spec.gpus {
            let _ = (
                g.minor(),
                g.memory_mib(),
                g.bus_id(),
                g.compute_capability(),
            );
            for (_, d) in g.mig_devices() {
                let _ = g.mig_memory_mib(d);
            }
        }
    }
}

/// The memory-limit hook's inputs: the OCI state the runtime writes on stdin before the
/// first NUL, the process's `/proc/<pid>/cgroup` after it, then the cgroup directory choice
/// (every candidate present, then none).
pub fn oci_state_cgroup(data: &[u8]) {
    let (state, cgroup) = split_at_nul(data);
    if let Ok(s) = std::str::from_utf8(state) {
        let _ = enforce::parse_oci_state(s);
    }
    if let Ok(c) = std::str::from_utf8(cgroup)
        && let Ok(cg) = enforce::parse_proc_cgroup(c, "fuzz")
    {
        let root = Path::new("/sys/fs/cgroup");
        let _ = enforce::resolve_cgroup_dir(&cg, root, 1, |_| true);
        let _ = enforce::resolve_cgroup_dir(&cg, root, 1, |_| false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry takes the seed corpus of its target (`fuzz/corpus/<name>/`) without a
    /// panic: the targets' inputs, run as a unit test where no nightly toolchain is.
    #[test]
    fn every_entry_takes_its_seed_corpus() {
        type Entry = (&'static str, fn(&[u8]));
        let entries: [Entry; 7] = [
            ("cdi_spec", cdi_spec),
            ("config_parse", config_parse),
            ("event_line", event_line),
            ("kubelet_usage", kubelet_usage),
            ("mig_parted", mig_parted),
            ("node_file", node_file),
            ("oci_state_cgroup", oci_state_cgroup),
        ];
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        for (name, entry) in entries {
            let dir = corpus.join(name);
            let mut seeds = 0;
            for e in std::fs::read_dir(&dir).expect("seed corpus") {
                let path = e.expect("seed").path();
                // The checked-in seeds; a local fuzz run adds its finds beside them.
                if path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
                {
                    entry(&std::fs::read(&path).expect("read seed"));
                    seeds += 1;
                }
            }
            assert!(seeds > 0, "{} has no seeds", dir.display());
        }
        // Bytes that are not text, and an empty input.
        for (_, entry) in entries {
            entry(&[0xff, 0xfe, 0x00, 0xc3]);
            entry(b"");
        }
    }
}
