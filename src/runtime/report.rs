//! Log lines for what the pure domain returns as values: config entries the plan skipped
//! on this node. Called by the reloader on every reload and by the one-shot CLI commands
//! (`inventory`, `cdi generate`, `labels`) that plan without a daemon.

use crate::domain::plan::Skipped;

/// One warning per skipped entry, naming the config, the field and what the node has.
pub(crate) fn log_skipped(config: &str, skipped: &[Skipped]) {
    for s in skipped {
        tracing::warn!(
            config = %config,
            field = %s.field,
            value = %s.value,
            reason = %s.reason,
            node_has = %s.node_has,
            "config entry skipped: nothing on this node matches it"
        );
    }
}

/// [`crate::domain::plan::build_reporting`] with the skipped entries logged: the plan of a
/// one-shot command.
pub(crate) fn plan_logged(
    inventory: &crate::domain::inventory::Inventory,
    config: &crate::domain::config::Config,
) -> crate::domain::plan::Result<crate::domain::plan::Plan> {
    let planned = crate::domain::plan::build_reporting(inventory, config)?;
    log_skipped(&config.source, &planned.skipped);
    Ok(planned.plan)
}
