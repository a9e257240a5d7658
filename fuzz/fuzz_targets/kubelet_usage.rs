//! What usage attribution reads from the host (`gpu_slicer::fuzz::kubelet_usage`): a
//! process's `/proc/<pid>/cgroup` and the kubelet's `kubelet_internal_checkpoint`. Any text
//! gives a pod or nothing, entries or an error, never a panic. The input is split at the
//! first NUL: cgroup file before, checkpoint after.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpu_slicer::fuzz::kubelet_usage(data));
