//! Shared fixtures: a built-in sim node, a config parsed from text, the plan of both, and a
//! state store serving it. One copy for unit tests, integration tests, benches and the demo.

use crate::domain::config::{self, Config, Overrides};
use crate::domain::inventory::{Backend, Inventory};
use crate::domain::plan::{self, Plan};
use crate::domain::snapshot::Snapshot;
use crate::platform::sim::SimBackend;
use crate::state::Store;

/// `mixed-a100`'s whole GPUs time-sliced 4 ways, its MIG devices served one by one.
pub const SHARED_CONFIG: &str = "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n";

/// The inventory of a built-in sim profile (`mixed-a100`, `dgx-h100`) or node file.
///
/// # Panics
/// When the profile does not load: fixtures are for tests.
pub fn inventory(profile: &str) -> Inventory {
    SimBackend::open(profile)
        .and_then(|b| b.discover())
        .unwrap_or_else(|e| panic!("sim profile {profile}: {e}"))
}

/// A config parsed from YAML text, with no flags or environment.
///
/// # Panics
/// When the text is not a valid config.
pub fn config(text: &str) -> Config {
    config::parse(text, "test.yaml", &Overrides::default())
        .unwrap_or_else(|e| panic!("config: {e}"))
}

/// Inventory, config and plan of a profile under a config text.
///
/// # Panics
/// When the config does not fit the profile.
pub fn planned(profile: &str, config_text: &str) -> (Inventory, Config, Plan) {
    let inventory = inventory(profile);
    let config = config(config_text);
    let plan = plan::build(&inventory, &config).unwrap_or_else(|e| panic!("plan: {e}"));
    (inventory, config, plan)
}

/// The plan of a profile under a config text.
pub fn plan(profile: &str, config_text: &str) -> Plan {
    planned(profile, config_text).2
}

/// A store serving the plan of a profile under a config text.
pub fn store(profile: &str, config_text: &str) -> Store {
    let (inventory, config, plan) = planned(profile, config_text);
    Store::new(Snapshot::serving(config, inventory, plan))
}
