//! `run`'s fleets-as-code flags (book: docs/src/fleets.md, "Pools by label"): a directory of named configs and
//! the Node label that picks one. The MIG layout label (`nvidia.com/mig.config`) and the
//! state labels are fixed names, as mig-manager's tools expect them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;

use crate::cli::args::ConfigArgs;
use crate::domain::fleet::CONFIG_LABEL;
use crate::runtime::fleet::Selection;

/// `--config-dir`, `--config-label`, `--config-default`.
#[derive(Debug, Clone, Args)]
pub(crate) struct FleetArgs {
    /// Directory of named configs (a ConfigMap mounted as a directory: one config file per
    /// key). The Node's `--config-label` picks the key; needs `--node-name` / `NODE_NAME`.
    /// Replaces `--config`.
    #[arg(long, env = "CONFIG_DIR", conflicts_with = "config")]
    pub(crate) config_dir: Option<PathBuf>,
    /// The Node label whose value names the key of `--config-dir`.
    #[arg(long, env = "CONFIG_LABEL", default_value = CONFIG_LABEL)]
    pub(crate) config_label: String,
    /// The key used while the label is absent (unset: a key named `default`, else the only
    /// key).
    #[arg(long, env = "CONFIG_DEFAULT")]
    pub(crate) config_default: Option<String>,
}

impl FleetArgs {
    /// The selection `--config-dir` describes (`None` without it); `state_dir` holds the
    /// name applied before a restart.
    pub(crate) fn selection(
        &self,
        config: &ConfigArgs,
        state_dir: Option<&Path>,
    ) -> Option<Selection> {
        let dir = self.config_dir.clone()?;
        let recorded = state_dir.and_then(crate::platform::fleet_state::read);
        let flags = config.clone();
        Some(Selection::new(
            dir,
            self.config_label.clone(),
            self.config_default.clone(),
            recorded,
            Arc::new(move |path| flags.load_path(Some(path))),
        ))
    }
}
