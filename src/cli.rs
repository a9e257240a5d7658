//! Command-line surface (clap). Each subcommand's arguments live here or beside the code
//! that runs them in `commands`; `main` parses and dispatches, nothing else.

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::Overrides;

pub mod logging;
pub mod nvidia;

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
    Inventory(Box<InventoryArgs>),
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
    #[arg(long = "config", visible_alias = "config-file", env = "CONFIG_FILE")]
    pub config: Option<PathBuf>,
    /// `none`, `single` or `mixed`.
    #[arg(long, env = "MIG_STRATEGY")]
    pub mig_strategy: Option<String>,
    /// Exit if the backend cannot start (false: run with no devices). A bare
    /// `--fail-on-init-error` means true, as in NVIDIA's CLI.
    #[arg(long, env = "FAIL_ON_INIT_ERROR", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
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
    /// Host root of `/dev` (default: the driver root), NVIDIA's `--nvidia-dev-root`.
    #[arg(
        long = "dev-root",
        visible_alias = "nvidia-dev-root",
        env = "NVIDIA_DEV_ROOT"
    )]
    pub dev_root: Option<String>,
    /// Also return DeviceSpecs in Allocate responses (bare `--pass-device-specs` = true).
    #[arg(long, env = "PASS_DEVICE_SPECS", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub pass_device_specs: Option<bool>,
    /// Prefix of CDI container annotations.
    #[arg(long, env = "CDI_ANNOTATION_PREFIX")]
    pub cdi_annotation_prefix: Option<String>,
    /// CDI kind (`vendor/class`) of the generated spec.
    #[arg(long, env = "CDI_KIND")]
    pub cdi_kind: Option<String>,
    /// NVIDIA plugin flags without a gpu-slicer counterpart (accepted for drop-in use).
    #[command(flatten)]
    pub nvidia: nvidia::NvidiaArgs,
}

impl ConfigArgs {
    /// The overrides these flags express.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            mig_strategy: self.mig_strategy.clone(),
            fail_on_init_error: self.fail_on_init_error,
            mps_root: self.mps_root.clone(),
            driver_root: self.driver_root.clone(),
            dev_root: self.dev_root.clone(),
            pass_device_specs: self.pass_device_specs,
            device_list_strategy: self.device_list_strategy.clone(),
            device_id_strategy: self.device_id_strategy.clone(),
            cdi_annotation_prefix: self.cdi_annotation_prefix.clone(),
            allocation_policy: self.shared_devices_allocation_policy.clone(),
            cdi_kind: self.cdi_kind.clone(),
            sources: self.sources(),
        }
    }

    /// Which flag or environment variable set each override, by config field path.
    fn sources(&self) -> std::collections::BTreeMap<String, String> {
        use nvidia::{boolish, source_of};
        let text = |v: &Option<String>| v.clone();
        let list = |v: &Option<Vec<String>>| v.as_ref().map(|l| l.join(","));
        let flag = |v: &Option<bool>| v.map(|b| b.to_string());
        let entries: [(&str, &str, &str, Option<String>, bool); 10] = [
            (
                "flags.migStrategy",
                "mig-strategy",
                "MIG_STRATEGY",
                text(&self.mig_strategy),
                false,
            ),
            (
                "flags.failOnInitError",
                "fail-on-init-error",
                "FAIL_ON_INIT_ERROR",
                flag(&self.fail_on_init_error),
                true,
            ),
            (
                "flags.mpsRoot",
                "mps-root",
                "MPS_ROOT",
                text(&self.mps_root),
                false,
            ),
            (
                "flags.nvidiaDriverRoot",
                "driver-root",
                "NVIDIA_DRIVER_ROOT",
                text(&self.driver_root),
                false,
            ),
            (
                "flags.plugin.passDeviceSpecs",
                "pass-device-specs",
                "PASS_DEVICE_SPECS",
                flag(&self.pass_device_specs),
                true,
            ),
            (
                "flags.plugin.deviceListStrategy",
                "device-list-strategy",
                "DEVICE_LIST_STRATEGY",
                list(&self.device_list_strategy),
                false,
            ),
            (
                "flags.plugin.deviceIDStrategy",
                "device-id-strategy",
                "DEVICE_ID_STRATEGY",
                text(&self.device_id_strategy),
                false,
            ),
            (
                "flags.plugin.cdiAnnotationPrefix",
                "cdi-annotation-prefix",
                "CDI_ANNOTATION_PREFIX",
                text(&self.cdi_annotation_prefix),
                false,
            ),
            (
                "flags.plugin.sharedDevicesAllocationPolicy",
                "shared-devices-allocation-policy",
                "SHARED_DEVICES_ALLOCATION_POLICY",
                text(&self.shared_devices_allocation_policy),
                false,
            ),
            (
                "flags.plugin.cdiKind",
                "cdi-kind",
                "CDI_KIND",
                text(&self.cdi_kind),
                false,
            ),
        ];
        entries
            .into_iter()
            .filter_map(|(field, flag, env, value, is_bool)| {
                let value = value?;
                let from_env = |v: &str| {
                    if is_bool {
                        boolish(v).map(|b| b.to_string()).as_deref() == Some(value.as_str())
                    } else {
                        v.split(',').map(str::trim).collect::<Vec<_>>().join(",") == value
                    }
                };
                Some((field.to_string(), source_of(flag, env, from_env)))
            })
            .collect()
    }

    /// Load and validate the config. NVIDIA flags gpu-slicer cannot honour are refused;
    /// those it accepts and ignores are named in one warning.
    pub fn load(&self) -> Result<crate::config::Config, crate::config::ConfigError> {
        let ignored = self.nvidia.check()?;
        if !ignored.is_empty() {
            tracing::warn!(
                flags = %ignored.join(", "),
                "NVIDIA device-plugin flags accepted and ignored: gpu-slicer writes its own CDI spec and hooks"
            );
        }
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

/// Parse a duration flag the way NVIDIA's Go configs write them (`1m30s`, `500ms`, `90s`,
/// `5m`, `1h`), or a bare number of seconds (`90`, accepted since the first release). `0`
/// means off where a flag allows it. The units are `humantime`'s, whose `m` is minutes as
/// in Go.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse::<u64>()
            .map(std::time::Duration::from_secs)
            .map_err(|_| format!("`{text}` is too large a number of seconds"));
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("`{text}` is not a duration: {e} (examples: 500ms, 30s, 1m30s, 1h)"))
}

#[cfg(test)]
mod duration_tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn formats_that_worked_before_still_work() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn go_style_compound_durations_parse() {
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h2m3s"), Ok(Duration::from_secs(3723)));
        assert_eq!(parse_duration("2s500ms"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("750us"), Ok(Duration::from_micros(750)));
    }

    #[test]
    fn bad_durations_name_the_value_as_written() {
        let e = parse_duration("5 parsecs").unwrap_err();
        assert!(e.starts_with("`5 parsecs` is not a duration"), "{e}");
        let e = parse_duration("soon").unwrap_err();
        assert!(e.contains("`soon`") && e.contains("1m30s"), "{e}");
        assert!(parse_duration("").is_err());
    }
}
