//! What usage attribution reads from the host (`gpu_slicer::domain::usage`): a process's
//! `/proc/<pid>/cgroup` and the kubelet's `kubelet_internal_checkpoint`. Any text gives a
//! pod or nothing, entries or an error, never a panic. The input is split at the first NUL:
//! cgroup file before, checkpoint after.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (cgroup, checkpoint) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    if let Ok(c) = std::str::from_utf8(cgroup) {
        let _ = gpu_slicer::domain::usage::parse_cgroup(c);
    }
    if let Ok(c) = std::str::from_utf8(checkpoint) {
        let _ = gpu_slicer::domain::usage::parse_checkpoint(c, "fuzz");
    }
});
