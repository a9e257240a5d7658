//! The node-file parser and validator (`node_spec::NodeSpec`, through
//! `gpu_slicer::fuzz::node_file`), the sim backend's input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpu_slicer::fuzz::node_file(data));
