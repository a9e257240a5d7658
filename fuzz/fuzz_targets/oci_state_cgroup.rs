//! The memory-limit hook's input parsers (`gpu_slicer::platform::enforce`): the OCI state the runtime
//! writes on stdin and the process's `/proc/<pid>/cgroup`, then the cgroup directory choice.
//! The input is split at the first NUL: state before, cgroup file after.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (state, cgroup) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    if let Ok(s) = std::str::from_utf8(state) {
        let _ = gpu_slicer::platform::enforce::parse_oci_state(s);
    }
    if let Ok(c) = std::str::from_utf8(cgroup)
        && let Ok(cg) = gpu_slicer::platform::enforce::parse_proc_cgroup(c, "fuzz")
    {
        let root = std::path::Path::new("/sys/fs/cgroup");
        // Every candidate "exists", then none: both paths through the resolver.
        let _ = gpu_slicer::platform::enforce::resolve_cgroup_dir(&cg, root, 1, |_| true);
        let _ = gpu_slicer::platform::enforce::resolve_cgroup_dir(&cg, root, 1, |_| false);
    }
});
