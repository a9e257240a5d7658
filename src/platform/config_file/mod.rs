//! Reading the config file: the I/O around the pure [`crate::domain::config::parse`].
//!
//! [`load`] reads the file, checks who may change it ([`perms`]), parses it and logs what
//! the domain returned as warnings. Called by the CLI commands and by the reloader's load
//! closure on every reload.

use std::path::Path;

use crate::domain::config::{self, Config, ConfigError, ConfigWarning, Overrides};

pub(crate) mod dir;
pub(crate) mod perms;

/// Load a config file (or defaults when `path` is `None`) and apply overrides.
pub(crate) fn load(path: Option<&Path>, overrides: &Overrides) -> config::Result<Config> {
    let Some(path) = path else {
        return config::defaults(overrides);
    };
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: origin.clone(),
        source,
    })?;
    for w in perms::world_writable(path) {
        tracing::warn!(
            config = %origin,
            path = %w.path.display(),
            mode = format_args!("{:04o}", w.mode),
            "config is world-writable: any local user can change it, and it decides host paths mounted into containers (mpsRoot); make it writable by root only"
        );
    }
    let (cfg, warnings) = config::parse_reporting(&text, &origin, overrides)?;
    for w in &warnings {
        log_warning(w);
    }
    Ok(cfg)
}

/// Log one warning the domain returned, with its fields.
fn log_warning(w: &ConfigWarning) {
    match w {
        ConfigWarning::IgnoredResources { config } | ConfigWarning::Empty { config } => {
            tracing::warn!(config = %config, "{w}");
        }
    }
}
