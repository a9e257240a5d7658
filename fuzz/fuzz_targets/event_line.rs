//! The health event-line parser (`node_spec::EventLine`, through
//! `gpu_slicer::fuzz::event_line`) shared by the fake NVML and the health monitor: one JSON
//! event per line.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpu_slicer::fuzz::event_line(data));
