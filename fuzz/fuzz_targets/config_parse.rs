//! The config parser (`gpu_slicer::domain::config::parse`): any text, YAML or JSON, gives a config
//! or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let overrides = gpu_slicer::domain::config::Overrides::default();
    if let Ok(cfg) = gpu_slicer::domain::config::parse(text, "fuzz.yaml", &overrides) {
        // A config that loads must also plan on a real node shape without panicking.
        let inv = gpu_slicer::domain::inventory::Backend::discover(
            &gpu_slicer::platform::sim::SimBackend::open("mixed-a100").expect("built-in"),
        )
        .expect("built-in node");
        let _ = gpu_slicer::domain::plan::build(&inv, &cfg);
    }
});
