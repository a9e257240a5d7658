//! NVIDIA k8s-device-plugin command-line names, so a DaemonSet written for NVIDIA's plugin
//! runs gpu-slicer with its args unchanged.
//!
//! Flags whose NVIDIA name differs from ours are aliases on our own flags (in
//! `crate::cli::args`, `--driver-root-ctr-path` among them); this module holds NVIDIA's
//! flags that have no gpu-slicer counterpart.
//! Each is accepted with NVIDIA's spelling, environment variable and bare-boolean form;
//! [`NvidiaArgs::check`] refuses values gpu-slicer cannot honour and names, for the log,
//! those it accepts but does not act on. Read by `ConfigArgs::load`; no IO.

use clap::Args;

use super::given;
use crate::domain::config::{ConfigError, Given};

/// NVIDIA plugin flags with no gpu-slicer equivalent.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct NvidiaArgs {
    /// NVIDIA's device discovery: `auto` and `nvml` both mean NVML here; `tegra` is not
    /// supported.
    #[arg(long, env = "DEVICE_DISCOVERY_STRATEGY", hide = true, value_parser = given::text())]
    pub(crate) device_discovery_strategy: Option<Given<String>>,
    /// NVIDIA's GDRCopy switch (not supported: must be false).
    #[arg(long, env = "GDRCOPY_ENABLED", num_args = 0..=1,
          default_missing_value = "true", value_parser = given::boolish(), hide = true)]
    pub(crate) gdrcopy_enabled: Option<Given<bool>>,
    /// NVIDIA's GPUDirect Storage switch (not supported: must be false).
    #[arg(long, env = "GDS_ENABLED", num_args = 0..=1,
          default_missing_value = "true", value_parser = given::boolish(), hide = true)]
    pub(crate) gds_enabled: Option<Given<bool>>,
    /// NVIDIA's MOFED switch (not supported: must be false).
    #[arg(long, env = "MOFED_ENABLED", num_args = 0..=1,
          default_missing_value = "true", value_parser = given::boolish(), hide = true)]
    pub(crate) mofed_enabled: Option<Given<bool>>,
    /// Path of nvidia-ctk written into NVIDIA's CDI hooks; gpu-slicer writes its own hooks,
    /// so this is accepted and ignored.
    #[arg(
        long = "nvidia-cdi-hook-path",
        visible_alias = "nvidia-ctk-path",
        env = "NVIDIA_CDI_HOOK_PATH",
        hide = true
    )]
    pub(crate) nvidia_cdi_hook_path: Option<String>,
    /// IMEX channels: only none or channel 0, as NVIDIA allows; gpu-slicer serves none.
    #[arg(long, env = "IMEX_CHANNEL_IDS", value_delimiter = ',', hide = true,
          value_parser = given::text())]
    pub(crate) imex_channel_ids: Option<Vec<Given<String>>>,
    /// Fail when IMEX channels are missing (not supported: must be false).
    #[arg(long, env = "IMEX_REQUIRED", num_args = 0..=1,
          default_missing_value = "true", value_parser = given::boolish(), hide = true)]
    pub(crate) imex_required: Option<Given<bool>>,
    /// nvidia-ctk CDI feature flags; accepted and ignored (gpu-slicer writes its own spec).
    #[arg(long, env = "CDI_FEATURE_FLAGS", value_delimiter = ',', hide = true)]
    pub(crate) cdi_feature_flags: Option<Vec<String>>,
    /// nvidia-ctk hooks to leave out; accepted and ignored (gpu-slicer writes its own hooks).
    #[arg(long, env = "CDI_DISABLE_HOOKS", value_delimiter = ',', hide = true)]
    pub(crate) cdi_disable_hooks: Option<Vec<String>>,
}

impl NvidiaArgs {
    /// Refuse what gpu-slicer cannot do, blamed on the flag or variable that asked for it;
    /// return the names of flags it accepts and ignores (for one warning).
    pub(crate) fn check(&self) -> Result<Vec<&'static str>, ConfigError> {
        if let Some(s) = &self.device_discovery_strategy
            && !matches!(s.value.as_str(), "auto" | "nvml")
        {
            return Err(s.origin.invalid(
                &s.value,
                "gpu-slicer discovers GPUs with NVML only: use auto or nvml (tegra and wsl are not supported)",
            ));
        }
        for on in [
            &self.gdrcopy_enabled,
            &self.gds_enabled,
            &self.mofed_enabled,
            &self.imex_required,
        ]
        .into_iter()
        .flatten()
        {
            if on.value {
                return Err(on.origin.invalid(
                    true,
                    "not supported by gpu-slicer: drop it or set it to false",
                ));
            }
        }
        if let Some(ids) = &self.imex_channel_ids {
            let written: Vec<&str> = ids
                .iter()
                .map(|s| s.value.trim())
                .filter(|s| !s.is_empty())
                .collect();
            if let Some(first) = ids.first()
                && !(written.is_empty() || written == ["0"])
            {
                return Err(first.origin.invalid(
                    written.join(","),
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
