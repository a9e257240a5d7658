//! The config parser (`gpu_slicer::config::parse`): any text, YAML or JSON, gives a config
//! or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let overrides = gpu_slicer::config::Overrides::default();
    if let Ok(cfg) = gpu_slicer::config::parse(text, "fuzz.yaml", &overrides) {
        // A config that loads must also plan on a real node shape without panicking.
        let inv = gpu_slicer::inventory::Backend::discover(
            &gpu_slicer::inventory::sim::SimBackend::open("mixed-a100").expect("built-in"),
        )
        .expect("built-in node");
        let _ = gpu_slicer::plan::build(&inv, &cfg);
    }
});
