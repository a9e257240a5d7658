//! NVIDIA k8s-device-plugin command-line names, so a DaemonSet written for NVIDIA's plugin
//! runs gpu-slicer with its args unchanged.
//!
//! Flags whose NVIDIA name differs from ours are aliases on our own flags (in
//! `crate::cli`); this module holds NVIDIA's flags that have no gpu-slicer counterpart.
//! Each is accepted with NVIDIA's spelling, environment variable and bare-boolean form;
//! [`NvidiaArgs::check`] refuses values gpu-slicer cannot honour and names, for the log,
//! those it accepts but does not act on. Read by `ConfigArgs::load`; no IO.

use clap::Args;
use clap::builder::BoolishValueParser;

use crate::domain::config::ConfigError;

/// NVIDIA plugin flags with no gpu-slicer equivalent.
#[derive(Debug, Clone, Default, Args)]
pub struct NvidiaArgs {
    /// NVIDIA's device discovery: `auto` and `nvml` both mean NVML here; `tegra` is not
    /// supported.
    #[arg(long, env = "DEVICE_DISCOVERY_STRATEGY", hide = true)]
    pub device_discovery_strategy: Option<String>,
    /// NVIDIA's GDRCopy switch (not supported: must be false).
    #[arg(long, env = "GDRCOPY_ENABLED", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new(), hide = true)]
    pub gdrcopy_enabled: Option<bool>,
    /// NVIDIA's GPUDirect Storage switch (not supported: must be false).
    #[arg(long, env = "GDS_ENABLED", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new(), hide = true)]
    pub gds_enabled: Option<bool>,
    /// NVIDIA's MOFED switch (not supported: must be false).
    #[arg(long, env = "MOFED_ENABLED", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new(), hide = true)]
    pub mofed_enabled: Option<bool>,
    /// Path of nvidia-ctk written into NVIDIA's CDI hooks; gpu-slicer writes its own hooks,
    /// so this is accepted and ignored.
    #[arg(
        long = "nvidia-cdi-hook-path",
        visible_alias = "nvidia-ctk-path",
        env = "NVIDIA_CDI_HOOK_PATH",
        hide = true
    )]
    pub nvidia_cdi_hook_path: Option<String>,
    /// Where this container sees the driver root (`flags.plugin.containerDriverRoot`): the
    /// agent reads the driver's files there and writes their host paths into the spec.
    #[arg(
        long = "driver-root-ctr-path",
        visible_alias = "container-driver-root",
        env = "DRIVER_ROOT_CTR_PATH",
        hide = true
    )]
    pub driver_root_ctr_path: Option<String>,
    /// IMEX channels: only none or channel 0, as NVIDIA allows; gpu-slicer serves none.
    #[arg(long, env = "IMEX_CHANNEL_IDS", value_delimiter = ',', hide = true)]
    pub imex_channel_ids: Option<Vec<String>>,
    /// Fail when IMEX channels are missing (not supported: must be false).
    #[arg(long, env = "IMEX_REQUIRED", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new(), hide = true)]
    pub imex_required: Option<bool>,
    /// nvidia-ctk CDI feature flags; accepted and ignored (gpu-slicer writes its own spec).
    #[arg(long, env = "CDI_FEATURE_FLAGS", value_delimiter = ',', hide = true)]
    pub cdi_feature_flags: Option<Vec<String>>,
    /// nvidia-ctk hooks to leave out; accepted and ignored (gpu-slicer writes its own hooks).
    #[arg(long, env = "CDI_DISABLE_HOOKS", value_delimiter = ',', hide = true)]
    pub cdi_disable_hooks: Option<Vec<String>>,
}

/// Name an NVIDIA flag as the user set it: the environment variable when it holds this
/// value, else the flag (clap gives a flag precedence over its variable, so a differing
/// variable cannot be the source).
pub(crate) fn source_of(flag: &str, env: &str, matches_env: impl Fn(&str) -> bool) -> String {
    match std::env::var(env) {
        Ok(v) if matches_env(&v) => format!("env var `{env}`"),
        _ => format!("flag `--{flag}`"),
    }
}

/// The boolean spellings clap's `BoolishValueParser` accepts (and Go's `ParseBool` mostly).
pub(crate) fn boolish(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" | "t" | "true" | "on" | "1" => Some(true),
        "n" | "no" | "f" | "false" | "off" | "0" => Some(false),
        _ => None,
    }
}

fn setting(flag: &str, env: &str, value: &str, message: &str) -> ConfigError {
    ConfigError::Setting {
        setting: source_of(flag, env, |v| v.trim() == value),
        value: format!("`{value}`"),
        message: message.to_string(),
    }
}

impl NvidiaArgs {
    /// Refuse what gpu-slicer cannot do; return the names of flags it accepts and ignores
    /// (for one warning).
    pub fn check(&self) -> Result<Vec<&'static str>, ConfigError> {
        if let Some(s) = &self.device_discovery_strategy
            && !matches!(s.as_str(), "auto" | "nvml")
        {
            return Err(setting(
                "device-discovery-strategy",
                "DEVICE_DISCOVERY_STRATEGY",
                s,
                "gpu-slicer discovers GPUs with NVML only: use auto or nvml (tegra and wsl are not supported)",
            ));
        }
        for (on, flag, env) in [
            (self.gdrcopy_enabled, "gdrcopy-enabled", "GDRCOPY_ENABLED"),
            (self.gds_enabled, "gds-enabled", "GDS_ENABLED"),
            (self.mofed_enabled, "mofed-enabled", "MOFED_ENABLED"),
            (self.imex_required, "imex-required", "IMEX_REQUIRED"),
        ] {
            if on == Some(true) {
                return Err(ConfigError::Setting {
                    setting: source_of(flag, env, |v| boolish(v) == Some(true)),
                    value: "`true`".into(),
                    message: "not supported by gpu-slicer: drop it or set it to false".into(),
                });
            }
        }
        if let Some(ids) = &self.imex_channel_ids {
            let ids: Vec<&str> = ids
                .iter()
                .map(|s| s.trim())
                .filter(|s| !s.is_empty())
                .collect();
            if !(ids.is_empty() || ids == ["0"]) {
                return Err(setting(
                    "imex-channel-ids",
                    "IMEX_CHANNEL_IDS",
                    &ids.join(","),
                    "only none or 0 are valid, and gpu-slicer serves no IMEX channels",
                ));
            }
        }
        let mut ignored = Vec::new();
        if self.nvidia_cdi_hook_path.is_some() {
            ignored.push("--nvidia-cdi-hook-path");
        }
        if self.cdi_feature_flags.is_some() {
            ignored.push("--cdi-feature-flags");
        }
        if self.cdi_disable_hooks.is_some() {
            ignored.push("--cdi-disable-hooks");
        }
        Ok(ignored)
    }
}
