//! Command-line surface (clap). Each subcommand's arguments live here or beside the code
//! that runs them in `commands`; `main` parses and dispatches, nothing else.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::Overrides;

/// gpu-slicer: hand out exactly the GPU share a workload asks for.
#[derive(Debug, Parser)]
#[command(name = "gpu-slicer", version, about)]
pub struct Cli {
    /// Log output format.
    #[arg(long, global = true, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the node's GPUs, MIG slices and the resources the config turns them into.
    Inventory(InventoryArgs),
    /// Generate, check, list and remove CDI specs.
    #[command(subcommand)]
    Cdi(crate::commands::cdi::CdiCommand),
    /// Run the node daemon: serve every resource to the kubelet until SIGTERM/SIGINT.
    Run(Box<crate::commands::run::RunArgs>),
    /// Show the device plugin at work against an in-process kubelet emulator.
    Demo,
    /// Hooks the container runtime runs from CDI specs (on the host, OCI state on stdin).
    #[command(subcommand)]
    CdiHook(crate::commands::cdi_hook::CdiHookCommand),
}

/// Where the inventory comes from.
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// `nvml`, `sim:<built-in profile>` (dgx-h100, mixed-a100) or `sim:<node file>`.
    #[arg(long, env = "GPU_SLICER_BACKEND", default_value = "nvml")]
    pub backend: String,
    /// NVML library to load (default: the system's libnvidia-ml.so.1).
    #[arg(long, env = "NVML_LIB")]
    pub nvml_lib: Option<PathBuf>,
    /// Root of /proc (for /proc/driver/nvidia-caps/mig-minors).
    #[arg(long, env = "PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,
}

/// The config file and the flags that override it (flag > env > file > default).
#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// Config file (NVIDIA k8s-device-plugin `version: v1` format, YAML or JSON).
    #[arg(long = "config", env = "CONFIG_FILE")]
    pub config: Option<PathBuf>,
    /// `none`, `single` or `mixed`.
    #[arg(long, env = "MIG_STRATEGY")]
    pub mig_strategy: Option<String>,
    /// Exit if the backend cannot start (false: run with no devices).
    #[arg(long, env = "FAIL_ON_INIT_ERROR")]
    pub fail_on_init_error: Option<bool>,
    /// Allocate response formats: envvar, volume-mounts, cdi-annotations, cdi-cri (comma list).
    #[arg(long, env = "DEVICE_LIST_STRATEGY", value_delimiter = ',')]
    pub device_list_strategy: Option<Vec<String>>,
    /// `uuid` or `index`: how devices are named in env/mount responses.
    #[arg(long, env = "DEVICE_ID_STRATEGY")]
    pub device_id_strategy: Option<String>,
    /// `distributed` or `packed` placement of replicas and MIG devices.
    #[arg(long, env = "SHARED_DEVICES_ALLOCATION_POLICY")]
    pub shared_devices_allocation_policy: Option<String>,
    /// Root of the MPS pipe and log directories.
    #[arg(long, env = "MPS_ROOT")]
    pub mps_root: Option<String>,
    /// Host driver root.
    #[arg(long = "driver-root", env = "NVIDIA_DRIVER_ROOT")]
    pub driver_root: Option<String>,
    /// Also return DeviceSpecs in Allocate responses.
    #[arg(long, env = "PASS_DEVICE_SPECS")]
    pub pass_device_specs: Option<bool>,
    /// Prefix of CDI container annotations.
    #[arg(long, env = "CDI_ANNOTATION_PREFIX")]
    pub cdi_annotation_prefix: Option<String>,
    /// CDI kind (`vendor/class`) of the generated spec.
    #[arg(long, env = "CDI_KIND")]
    pub cdi_kind: Option<String>,
}

impl ConfigArgs {
    /// The overrides these flags express.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            mig_strategy: self.mig_strategy.clone(),
            fail_on_init_error: self.fail_on_init_error,
            mps_root: self.mps_root.clone(),
            driver_root: self.driver_root.clone(),
            dev_root: None,
            container_driver_root: None,
            pass_device_specs: self.pass_device_specs,
            device_list_strategy: self.device_list_strategy.clone(),
            device_id_strategy: self.device_id_strategy.clone(),
            cdi_annotation_prefix: self.cdi_annotation_prefix.clone(),
            allocation_policy: self.shared_devices_allocation_policy.clone(),
            cdi_kind: self.cdi_kind.clone(),
        }
    }

    /// Load and validate the config.
    pub fn load(&self) -> Result<crate::config::Config, crate::config::ConfigError> {
        crate::config::load(self.config.as_deref(), &self.overrides())
    }
}

/// `inventory` arguments.
#[derive(Debug, Clone, Args)]
pub struct InventoryArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub format: OutputFormat,
}

/// `inventory` output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned text for people.
    Table,
    /// Stable, sorted JSON for scripts.
    Json,
}

/// Parse a duration flag: a number with a unit `ms`, `s`, `m` or `h` (`90s`, `5m`), or a
/// bare number of seconds. `0` means off where a flag allows it.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (examples: 500ms, 30s, 5m, 1h)"))?;
    let d = match unit {
        "" | "s" => std::time::Duration::from_secs(n),
        "ms" => std::time::Duration::from_millis(n),
        "m" => std::time::Duration::from_secs(n.saturating_mul(60)),
        "h" => std::time::Duration::from_secs(n.saturating_mul(3600)),
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use ms, s, m or h)"
            ));
        }
    };
    Ok(d)
}

#[cfg(test)]
mod duration_tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn units() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(
            parse_duration("5 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("not a duration")
        );
    }
}
