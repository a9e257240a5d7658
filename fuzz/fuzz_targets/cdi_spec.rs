//! The CDI spec parser and validator behind `cdi validate` and the spec writer's re-read of
//! the previous spec (`gpu_slicer::fuzz::cdi_spec`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpu_slicer::fuzz::cdi_spec(data));
