//! mig-parted layout files (`gpu_slicer::domain::miglayout`): any text gives a file or an
//! error, never a panic; every layout of a file that parses is selected and planned on the
//! built-in mixed-a100 node (planning must not panic on any layout, fitting or not).
#![no_main]

use gpu_slicer::domain::inventory::Backend;
use gpu_slicer::domain::miglayout::MigPartedFile;
use gpu_slicer::platform::mig::{from_inventory, plan_all};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(file) = MigPartedFile::parse(text, "fuzz.yaml") else {
        return;
    };
    let inventory = gpu_slicer::platform::sim::SimBackend::open("mixed-a100")
        .expect("built-in")
        .discover()
        .expect("built-in node");
    let gpus = from_inventory(&inventory);
    for layout in file.layouts.keys() {
        let _ = plan_all(&file, layout, &gpus);
    }
});
