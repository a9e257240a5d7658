//! The health event-line parser (`node_spec::EventLine`) shared by the fake NVML and the
//! health monitor: one JSON event per line.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for line in text.lines() {
        let _ = node_spec::EventLine::parse(line);
    }
});
