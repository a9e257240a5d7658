//! The DRA flags of `gpu-slicer run` (`--dra`, `--dra-driver-name`, the kubelet's plugin
//! directories) and the node name the driver's pool is called by: one flattened struct so
//! the settings redesign can take them over whole. Apart from `cli::dra` (the `dra`
//! subcommands) so that `run` names flags only, not another command.

use std::path::PathBuf;

use crate::domain::config::{Config, Given, Origin};
use crate::domain::dra::{self, DraError};

/// Default of `--kubelet-registry-dir`: the kubelet's plugin watcher directory.
pub(crate) const DEFAULT_KUBELET_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Default of `--kubelet-plugins-dir`: DRA service sockets go to `<dir>/<driver>/dra.sock`.
pub(crate) const DEFAULT_KUBELET_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

/// The DRA flags of `gpu-slicer run`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DraArgs {
    /// Serve the node's GPUs through DRA instead of the device-plugin API
    /// (`flags.dra.enabled`).
    #[arg(long = "dra", env = "DRA_ENABLED", num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) enabled: Option<bool>,
    /// The DRA driver name (`flags.dra.driverName`; default `gpu-slicer.io`).
    #[arg(long = "dra-driver-name", env = "DRA_DRIVER_NAME", value_parser = crate::cli::given::text())]
    pub(crate) driver_name: Option<Given<String>>,
    /// The kubelet's plugin watcher directory; the registration socket is
    /// `<dir>/<driver>-reg.sock`.
    #[arg(long, env = "KUBELET_REGISTRY_DIR", default_value = DEFAULT_KUBELET_REGISTRY_DIR)]
    pub(crate) kubelet_registry_dir: PathBuf,
    /// The kubelet's plugins directory; the DRA service is `<dir>/<driver>/dra.sock`.
    #[arg(long, env = "KUBELET_PLUGINS_DIR", default_value = DEFAULT_KUBELET_PLUGINS_DIR)]
    pub(crate) kubelet_plugins_dir: PathBuf,
}

impl DraArgs {
    /// The driver name when DRA mode is on, `None` in device-plugin mode: `--dra` /
    /// `DRA_ENABLED` over `flags.dra.enabled`, `--dra-driver-name` / `DRA_DRIVER_NAME` over
    /// `flags.dra.driverName`, default [`dra::DEFAULT_DRIVER_NAME`]. Resolved once at start:
    /// switching front-ends needs a restart. A bad name is blamed on what set it.
    pub(crate) fn mode(&self, config: &Config) -> Result<Option<String>, DraError> {
        if !self.enabled.or(config.dra.enabled).unwrap_or(false) {
            return Ok(None);
        }
        let (name, source) = match (&self.driver_name, &config.dra.driver_name) {
            (Some(n), _) => (n.value.clone(), n.origin.clone()),
            (None, Some(n)) => (
                n.clone(),
                Origin::file(&config.source, "flags.dra.driverName"),
            ),
            (None, None) => (dra::DEFAULT_DRIVER_NAME.to_string(), Origin::Default),
        };
        dra::check_driver_name(&name).map_err(|e| match e {
            DraError::DriverName { name, rule } => DraError::DriverName {
                name,
                rule: format!("{rule} (set by {source})"),
            },
            other => other,
        })?;
        Ok(Some(name))
    }
}

/// The node name: `--node-name` / `NODE_NAME`, else the host name; it must be a DNS
/// subdomain (it names the pool and the slices).
pub(crate) fn node_name(flag: Option<&str>) -> Result<String, DraError> {
    let name = match flag {
        Some(n) => n.to_string(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_err(|e| DraError::NodeName {
                name: String::new(),
                rule: format!(
                    "no --node-name / NODE_NAME and /proc/sys/kernel/hostname is unreadable ({e})"
                ),
            })?
            .trim()
            .to_lowercase(),
    };
    if !dra::model::is_dns_subdomain(&name) || name.is_empty() {
        return Err(DraError::NodeName {
            name,
            rule: "--node-name / NODE_NAME must be a DNS subdomain (lowercase a-z, 0-9, '-', '.')"
                .into(),
        });
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(enabled: Option<bool>, name: Option<&str>) -> DraArgs {
        DraArgs {
            enabled,
            driver_name: name.map(Given::from),
            kubelet_registry_dir: DEFAULT_KUBELET_REGISTRY_DIR.into(),
            kubelet_plugins_dir: DEFAULT_KUBELET_PLUGINS_DIR.into(),
        }
    }

    fn config(enabled: Option<bool>, name: Option<&str>) -> Config {
        let mut c = Config {
            source: "/etc/gpu-slicer/config.yaml".into(),
            ..Config::default()
        };
        c.dra.enabled = enabled;
        c.dra.driver_name = name.map(str::to_string);
        c
    }

    #[test]
    fn flags_win_over_the_file_and_the_default_name_applies() {
        assert_eq!(args(None, None).mode(&config(None, None)).unwrap(), None);
        assert_eq!(
            args(None, None).mode(&config(Some(true), None)).unwrap(),
            Some(dra::DEFAULT_DRIVER_NAME.into())
        );
        assert_eq!(
            args(Some(false), None)
                .mode(&config(Some(true), None))
                .unwrap(),
            None
        );
        assert_eq!(
            args(Some(true), Some("a.example.com"))
                .mode(&config(None, Some("b.example.com")))
                .unwrap(),
            Some("a.example.com".into())
        );
    }

    #[test]
    fn a_bad_driver_name_is_blamed_on_what_set_it() {
        let e = args(Some(true), None)
            .mode(&config(None, Some("Bad_Name")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("Bad_Name") && e.contains("config.yaml: flags.dra.driverName"),
            "{e}"
        );
    }
}
