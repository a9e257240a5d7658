//! The CDI spec parser and validator behind `cdi validate` and the spec writer's re-read of
//! the previous spec (`gpu_slicer::domain::cdi::Spec::parse` + `cdi::validate::validate`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for name in ["fuzz.yaml", "fuzz.json"] {
        if let Ok(spec) = gpu_slicer::domain::cdi::Spec::parse(text, std::path::Path::new(name)) {
            let _ = gpu_slicer::domain::cdi::validate::validate(&spec);
            let _ = gpu_slicer::domain::cdi::minimum_version(&spec);
        }
    }
});
