//! The node-file parser and validator (`node_spec::NodeSpec`), the sim backend's input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(spec) = node_spec::NodeSpec::parse(text, "fuzz.yaml") {
        // Accessors of a validated node must hold for every GPU it describes.
        for g in &spec.gpus {
            let _ = (
                g.minor(),
                g.memory_mib(),
                g.bus_id(),
                g.compute_capability(),
            );
            for (_, d) in g.mig_devices() {
                let _ = g.mig_memory_mib(d);
            }
        }
    }
});
