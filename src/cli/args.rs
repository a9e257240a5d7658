//! Command-line surface (clap). Each subcommand's arguments live here or beside the code
//! that runs them in `commands`; `main` parses and dispatches, nothing else.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::domain::config::Overrides;
use crate::domain::health::XidFilter;
use crate::domain::inventory::InventoryError;
use crate::runtime::health::{HealthSettings, NVML_WAIT_TIMEOUT, SIM_POLL_INTERVAL, Source};

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
    Cdi(crate::cli::cdi::CdiCommand),
    /// Run the node daemon: serve every resource to the kubelet until SIGTERM/SIGINT.
    Run(Box<crate::cli::run::RunArgs>),
    /// Show the device plugin at work against an in-process kubelet emulator.
    Demo,
    /// Hooks the container runtime runs from CDI specs (on the host, OCI state on stdin).
    #[command(subcommand)]
    CdiHook(crate::cli::cdi_hook::CdiHookCommand),
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
            pass_device_specs: self.pass_device_specs,
            device_list_strategy: self.device_list_strategy.clone(),
            device_id_strategy: self.device_id_strategy.clone(),
            cdi_annotation_prefix: self.cdi_annotation_prefix.clone(),
            allocation_policy: self.shared_devices_allocation_policy.clone(),
            cdi_kind: self.cdi_kind.clone(),
        }
    }

    /// Load and validate the config.
    pub fn load(
        &self,
    ) -> Result<crate::domain::config::Config, crate::domain::config::ConfigError> {
        crate::domain::config::load(self.config.as_deref(), &self.overrides())
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
    use super::MpsArgs;
    use std::time::Duration;

    #[test]
    fn mps_args_flatten_and_defaults() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            mps: MpsArgs,
        }
        <Cli as clap::CommandFactory>::command().debug_assert();
        let cli = Cli::try_parse_from([
            "x",
            "--mps-control-bin",
            "/opt/fake",
            "--mps-restart-backoff-ms",
            "5",
        ])
        .unwrap();
        let sc = cli.mps.supervisor_config();
        assert_eq!(sc.control_bin, std::path::Path::new("/opt/fake"));
        assert_eq!(sc.backoff_base, Duration::from_millis(5));
        assert_eq!(sc.backoff_max, Duration::from_secs(60));
        assert!(sc.nvidia_smi.is_none());
    }

    use super::parse_duration;

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

/// Command-line settings of the MPS manager, to be flattened into `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct MpsArgs {
    /// MPS control binary (`nvidia-cuda-mps-control`): run as the daemon (`-f`) and as the
    /// client that sends control commands.
    #[arg(long, env = "MPS_CONTROL_BIN", default_value = crate::domain::mps::DEFAULT_CONTROL_BIN)]
    pub mps_control_bin: PathBuf,
    /// `nvidia-smi` used to set the compute mode to EXCLUSIVE_PROCESS while a daemon runs;
    /// the step is skipped (and logged) when unset or absent.
    #[arg(long, env = "MPS_NVIDIA_SMI")]
    pub mps_nvidia_smi: Option<PathBuf>,
    /// First restart delay of a crashed daemon, in milliseconds (doubles up to the max).
    #[arg(long, env = "MPS_RESTART_BACKOFF_MS", default_value_t = 1000)]
    pub mps_restart_backoff_ms: u64,
    /// Longest restart delay, in milliseconds.
    #[arg(long, env = "MPS_RESTART_BACKOFF_MAX_MS", default_value_t = 60_000)]
    pub mps_restart_backoff_max_ms: u64,
}

impl MpsArgs {
    /// Supervisor settings these flags express (timeouts keep their defaults).
    pub fn supervisor_config(&self) -> crate::runtime::mps::daemon::SupervisorConfig {
        crate::runtime::mps::daemon::SupervisorConfig {
            control_bin: self.mps_control_bin.clone(),
            nvidia_smi: self.mps_nvidia_smi.clone(),
            backoff_base: Duration::from_millis(self.mps_restart_backoff_ms),
            backoff_max: Duration::from_millis(self.mps_restart_backoff_max_ms),
            ..crate::runtime::mps::daemon::SupervisorConfig::default()
        }
    }
}

/// Errors building the health settings from flags.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// The sim node file could not be read for its `events`.
    #[error(transparent)]
    Backend(#[from] InventoryError),
    /// `--health-events-file` was given with a backend that cannot inject events.
    #[error(
        "--health-events-file {path}: only `--backend sim:*` injects events (with NVML the driver reports them)"
    )]
    EventsFileNeedsSim { path: String },
}

/// Health flags of `gpu-slicer run` (each also an environment variable).
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// How long a device must see no new event before a successful re-probe of its GPU makes
    /// it healthy again (`90s`, `500ms`, `2m`; a bare number is seconds).
    #[arg(long, env = "HEALTH_QUIET_PERIOD", value_parser = crate::cli::args::parse_duration, default_value = "60s")]
    pub health_quiet_period: Duration,
    /// Sim backend only: JSON-lines file of health events to inject, one event per line
    /// (`{"gpu":0,"kind":"xid","xid":79}`), read and removed on every poll.
    #[arg(long, env = "HEALTH_EVENTS_FILE")]
    pub health_events_file: Option<PathBuf>,
    /// NVIDIA plugin semantics: `all`/`xids` turns health checks off; a comma list of XIDs
    /// adds to the ignored ones (13, 31, 43, 45, 68, 109).
    #[arg(long, env = "DP_DISABLE_HEALTHCHECKS")]
    pub disable_healthchecks: Option<String>,
    /// NVIDIA plugin semantics: XIDs that count whatever is disabled; `all` counts every XID.
    #[arg(long, env = "DP_ENABLE_HEALTHCHECKS")]
    pub enable_healthchecks: Option<String>,
}

impl HealthArgs {
    /// The health settings for this backend: NVML events for `nvml`, the node file's timeline
    /// and the events file for `sim:*`.
    pub fn settings(&self, backend: &BackendArgs) -> Result<HealthSettings, MonitorError> {
        let filter = XidFilter::from_env(
            self.disable_healthchecks.as_deref(),
            self.enable_healthchecks.as_deref(),
        );
        let source = match backend.backend.strip_prefix("sim:") {
            Some(profile) => Source::Sim {
                timeline: crate::platform::sim::SimBackend::open(profile)?
                    .spec()
                    .events
                    .clone(),
                events_file: self.health_events_file.clone(),
                poll: SIM_POLL_INTERVAL,
            },
            None => {
                if let Some(path) = &self.health_events_file {
                    return Err(MonitorError::EventsFileNeedsSim {
                        path: path.display().to_string(),
                    });
                }
                Source::Nvml {
                    lib_path: backend.nvml_lib.clone(),
                    wait_timeout: NVML_WAIT_TIMEOUT,
                }
            }
        };
        Ok(HealthSettings {
            source,
            filter,
            quiet_period: self.health_quiet_period,
        })
    }
}
