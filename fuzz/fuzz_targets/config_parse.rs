//! The config parser (`gpu_slicer::fuzz::config_parse`): any text, YAML or JSON, gives a
//! config or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpu_slicer::fuzz::config_parse(data));
