//! The memory-limit hook's input parsers (`gpu_slicer::fuzz::oci_state_cgroup`): the OCI
//! state the runtime writes on stdin and the process's `/proc/<pid>/cgroup`, then the cgroup
//! directory choice. The input is split at the first NUL: state before, cgroup file after.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpu_slicer::fuzz::oci_state_cgroup(data));
