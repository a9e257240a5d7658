//! mig-parted layout files (`gpu_slicer::fuzz::mig_parted`): any text gives a file or an
//! error, never a panic; every layout of a file that parses is selected and planned on the
//! built-in mixed-a100 node (planning must not panic on any layout, fitting or not).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpu_slicer::fuzz::mig_parted(data));
