//! Argument groups shared by several subcommands (backend, config overrides, health, MPS)
//! and the duration parser. The top-level [`crate::cli::Cli`] lives in `cli`; each
//! subcommand's own arguments live beside the code that runs them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::given::{self, IntoSlot};
use super::nvidia;

use crate::domain::cdi::CdiError;
use crate::domain::cdi::shares::HookSettings;
use crate::domain::config::{Given, Overrides};
use crate::domain::health::XidFilter;
use crate::domain::inventory::InventoryError;
use crate::runtime::health::{HealthSettings, NVML_WAIT_TIMEOUT, SIM_POLL_INTERVAL, Source};

/// Where the inventory comes from.
#[derive(Debug, Clone, Args)]
pub(crate) struct BackendArgs {
    /// `nvml`, `sim:<built-in profile>` (dgx-h100, mixed-a100) or `sim:<node file>`.
    #[arg(long, env = "GPU_SLICER_BACKEND", default_value = "nvml",
          value_parser = super::backend::BackendKind::parse)]
    pub(crate) backend: super::backend::BackendKind,
    /// NVML library to load (default: the system's libnvidia-ml.so.1).
    #[arg(long, env = "NVML_LIB")]
    pub(crate) nvml_lib: Option<PathBuf>,
    /// Root of /proc (for /proc/driver/nvidia-caps/mig-minors).
    #[arg(long, env = "PROC_ROOT", default_value = "/proc")]
    pub(crate) proc_root: PathBuf,
}

/// `--config`: the config file, read the same way by every command that plans or writes a
/// spec (NVIDIA k8s-device-plugin `version: v1` format, YAML or JSON).
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ConfigFileArgs {
    /// Config file (NVIDIA k8s-device-plugin `version: v1` format, YAML or JSON).
    #[arg(long = "config", visible_alias = "config-file", env = "CONFIG_FILE")]
    pub(crate) config: Option<PathBuf>,
}

/// The config file and the settings that act in a one-shot command that plans the node
/// (`inventory`, `labels`, `dra slices`): the daemon's settings are `run`'s alone
/// ([`ConfigArgs`]), so these commands do not list flags that would change nothing.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct PlanConfigArgs {
    /// `--config`.
    #[command(flatten)]
    pub(crate) file: ConfigFileArgs,
    /// The file's settings that change the plan.
    #[command(flatten)]
    pub(crate) plan: PlanSettingArgs,
}

impl PlanConfigArgs {
    /// The overrides these flags express.
    pub(crate) fn overrides(&self) -> Overrides {
        let mut o = Overrides::default();
        self.plan.apply(&mut o);
        o
    }

    /// Load and validate the config.
    pub(crate) fn load(
        &self,
    ) -> Result<crate::domain::config::Config, crate::domain::config::ConfigError> {
        crate::platform::config_file::load(self.file.config.as_deref(), &self.overrides())
    }
}

/// The config file and every flag that overrides it (flag > env > file > default): `run`'s.
#[derive(Debug, Clone, Args)]
pub(crate) struct ConfigArgs {
    /// `--config` and the settings that change the plan.
    #[command(flatten)]
    pub(crate) base: PlanConfigArgs,
    /// The CDI kind.
    #[command(flatten)]
    pub(crate) kind: KindSettingArgs,
    /// The settings that shape the CDI spec.
    #[command(flatten)]
    pub(crate) spec: SpecSettingArgs,
    /// The settings only the daemon acts on.
    #[command(flatten)]
    pub(crate) daemon: DaemonSettingArgs,
    /// NVIDIA plugin flags without a gpu-slicer counterpart (accepted for drop-in use).
    #[command(flatten)]
    pub(crate) nvidia: nvidia::NvidiaArgs,
}

/// Declares one group of settings from a list of clap fields, each named as the setting's
/// slot in [`Overrides`] (the settings table, `domain::config::settings`): a setting's flag
/// and variable are written once, in the group of the commands it acts in, and the group's
/// `apply` follows the list.
macro_rules! setting_args {
    ($(#[$smeta:meta])* $name:ident { $( $(#[$meta:meta])* $field:ident: $ty:ty, )* }) => {
        $(#[$smeta])*
        #[derive(Debug, Clone, Default, Args)]
        pub(crate) struct $name {
            $( $(#[$meta])* pub(crate) $field: $ty, )*
        }

        impl $name {
            /// Put the overrides these flags express into `o`, each naming the flag or
            /// variable that set it.
            pub(crate) fn apply(&self, o: &mut Overrides) {
                $( o.$field = IntoSlot::into_slot(self.$field.clone()); )*
            }
        }
    };
}

setting_args! {
    /// The settings that change the plan: every command that plans the node takes them.
    PlanSettingArgs {
        /// `none`, `single` or `mixed`.
        #[arg(long, env = "MIG_STRATEGY", value_parser = given::text())]
        mig_strategy: Option<Given<String>>,
    }
}

setting_args! {
    /// The CDI kind: names the spec (`cdi generate`, `cdi remove`, `run`).
    KindSettingArgs {
        /// CDI kind (`vendor/class`) of the generated spec.
        #[arg(long, alias = "kind", env = "CDI_KIND", value_parser = given::text())]
        cdi_kind: Option<Given<String>>,
    }
}

setting_args! {
    /// The settings that shape the CDI spec's edits (`cdi generate`, `run`).
    SpecSettingArgs {
        /// Root of the MPS pipe and log directories.
        #[arg(long, env = "MPS_ROOT", value_parser = given::text())]
        mps_root: Option<Given<String>>,
        /// HOST path of the driver root: `/` for a host-installed driver, `/run/nvidia/driver`
        /// for a containerised one. Its libraries, firmware, binaries and sockets go into
        /// the spec's container edits.
        #[arg(long = "driver-root", visible_alias = "nvidia-driver-root", env = "NVIDIA_DRIVER_ROOT",
              value_parser = given::text())]
        driver_root: Option<Given<String>>,
        /// Host root of `/dev` (default: the driver root), NVIDIA's `--nvidia-dev-root`:
        /// device nodes found there get their type and numbers, missing control nodes are
        /// left out.
        #[arg(long = "dev-root", visible_alias = "nvidia-dev-root", env = "NVIDIA_DEV_ROOT",
              value_parser = given::text())]
        dev_root: Option<Given<String>>,
        /// Where this process sees the driver root when it runs in a container, e.g.
        /// `/host` (`flags.plugin.containerDriverRoot`): the agent reads the driver's files
        /// there and writes their host paths into the spec. NVIDIA calls it
        /// `--driver-root-ctr-path`.
        #[arg(long = "container-driver-root", alias = "driver-root-ctr-path",
              env = "DRIVER_ROOT_CTR_PATH", value_parser = given::text())]
        container_driver_root: Option<Given<String>>,
    }
}

setting_args! {
    /// The settings only the daemon (`run`) acts on.
    DaemonSettingArgs {
        /// mig-parted config file whose `--mig-layout` the daemon applies to idle GPUs
        /// (`flags.migLayouts.file`).
        #[arg(long, env = "MIG_LAYOUT_FILE", value_parser = given::text())]
        mig_layout_file: Option<Given<String>>,
        /// The layout of `--mig-layout-file` to apply (`flags.migLayouts.layout`).
        #[arg(long, env = "MIG_LAYOUT", value_parser = given::text())]
        mig_layout: Option<Given<String>>,
        /// Exit if the backend cannot start (false: run with no devices). A bare
        /// `--fail-on-init-error` means true, as in NVIDIA's CLI.
        #[arg(long, env = "FAIL_ON_INIT_ERROR", num_args = 0..=1,
              default_missing_value = "true", value_parser = given::boolish())]
        fail_on_init_error: Option<Given<bool>>,
        /// Allocate response formats: envvar, volume-mounts, cdi-annotations, cdi-cri (comma list).
        #[arg(long, env = "DEVICE_LIST_STRATEGY", value_delimiter = ',', value_parser = given::text())]
        device_list_strategy: Option<Vec<Given<String>>>,
        /// `uuid` or `index`: how devices are named in env/mount responses.
        #[arg(long, env = "DEVICE_ID_STRATEGY", value_parser = given::text())]
        device_id_strategy: Option<Given<String>>,
        /// `distributed` or `packed` placement of replicas and MIG devices.
        #[arg(long = "shared-devices-allocation-policy", env = "SHARED_DEVICES_ALLOCATION_POLICY",
              value_name = "SHARED_DEVICES_ALLOCATION_POLICY", value_parser = given::text())]
        allocation_policy: Option<Given<String>>,
        /// Also return DeviceSpecs in Allocate responses (bare `--pass-device-specs` = true).
        #[arg(long, env = "PASS_DEVICE_SPECS", num_args = 0..=1,
              default_missing_value = "true", value_parser = given::boolish())]
        pass_device_specs: Option<Given<bool>>,
        /// Prefix of CDI container annotations.
        #[arg(long, env = "CDI_ANNOTATION_PREFIX", value_parser = given::text())]
        cdi_annotation_prefix: Option<Given<String>>,
    }
}

impl ConfigArgs {
    /// The config file `--config` names.
    pub(crate) fn path(&self) -> Option<&Path> {
        self.base.file.config.as_deref()
    }

    /// The overrides these flags express.
    pub(crate) fn overrides(&self) -> Overrides {
        let mut o = self.base.overrides();
        self.kind.apply(&mut o);
        self.spec.apply(&mut o);
        self.daemon.apply(&mut o);
        o
    }

    /// Load and validate the config. NVIDIA flags gpu-slicer cannot honour are refused;
    /// those it accepts and ignores are named in one warning.
    pub(crate) fn load(
        &self,
    ) -> Result<crate::domain::config::Config, crate::domain::config::ConfigError> {
        self.load_path(self.path())
    }

    /// [`Self::load`] of another file (`--config-dir`: the key the Node's label chose),
    /// with the same flags over it.
    pub(crate) fn load_path(
        &self,
        path: Option<&std::path::Path>,
    ) -> Result<crate::domain::config::Config, crate::domain::config::ConfigError> {
        let ignored = self.nvidia.check()?;
        if !ignored.is_empty() {
            tracing::warn!(
                flags = %ignored.join(", "),
                "NVIDIA device-plugin flags accepted and ignored: gpu-slicer writes its own CDI spec and hooks"
            );
        }
        crate::platform::config_file::load(path, &self.overrides())
    }
}

/// `inventory` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct InventoryArgs {
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    #[command(flatten)]
    pub(crate) config: PlanConfigArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) format: OutputFormat,
    /// Print only the GPU-pair topology: the matrix as `nvidia-smi topo -m` writes it (NV#,
    /// PIX, PXB, PHB, NODE, SYS) with the NUMA node of each GPU, or its JSON with `--format json`.
    #[arg(long)]
    pub(crate) topology: bool,
    /// Refuse (exit 2) a config that names resources or devices this node lacks, instead of
    /// skipping them as a mixed cluster's shared config needs: for checking a ConfigMap in CI.
    #[arg(long)]
    pub(crate) strict: bool,
}

/// `inventory` output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    /// Aligned text for people.
    Table,
    /// Stable, sorted JSON for scripts.
    Json,
}

/// Where the `set-memory-limit` CDI hook is on the host, and what it is told. Shared by
/// `cdi generate` and `run`.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct HookArgs {
    /// Absolute HOST path of the gpu-slicer binary the runtime runs as the CDI hook
    /// (default: this executable). In a DaemonSet, the host path the binary is copied to.
    #[arg(long, env = "CDI_HOOK_PATH")]
    pub(crate) cdi_hook_path: Option<PathBuf>,
    /// NVML library the hook loads (default: `--nvml-lib` when given, else the system's
    /// libnvidia-ml.so.1).
    #[arg(long, env = "CDI_HOOK_NVML_LIB")]
    pub(crate) cdi_hook_nvml_lib: Option<PathBuf>,
    /// `KEY=VALUE` environment of the hook process (repeat the flag; comma list in the env).
    #[arg(long, env = "CDI_HOOK_ENV", value_delimiter = ',')]
    pub(crate) cdi_hook_env: Vec<String>,
}

impl HookArgs {
    /// The hook settings, `nvml_lib` being the backend's `--nvml-lib`. The path must be
    /// absolute: runtimes execute it from their own working directory.
    pub(crate) fn settings(&self, nvml_lib: Option<&Path>) -> Result<HookSettings, CdiError> {
        let path = match &self.cdi_hook_path {
            Some(p) => p.clone(),
            None => crate::platform::cdi_host::current_exe_hook(None)?.path,
        };
        if !path.is_absolute() {
            return Err(CdiError::HookPath {
                path,
                rule: "must be absolute (the runtime runs the hook from its own directory)".into(),
            });
        }
        if let Some(bad) = self
            .cdi_hook_env
            .iter()
            .find(|e| e.find('=').is_none_or(|i| i == 0))
        {
            return Err(CdiError::HookPath {
                path,
                rule: format!("hook env `{bad}` is not KEY=VALUE"),
            });
        }
        Ok(HookSettings {
            path,
            nvml_lib: self
                .cdi_hook_nvml_lib
                .clone()
                .or_else(|| nvml_lib.map(Path::to_path_buf)),
            env: self.cdi_hook_env.clone(),
        })
    }
}

/// Parse a duration flag the way NVIDIA's Go configs write them (`1m30s`, `500ms`, `90s`,
/// `5m`, `1h`), or a bare number of seconds (`90`, accepted since the first release). `0`
/// means off where a flag allows it. The units are `humantime`'s, whose `m` is minutes as
/// in Go.
pub(crate) fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
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

/// Parse the interval flag: a duration as every other flag takes it
/// ([`parse_duration`]: `500ms`, `10s`, `1m`), but never zero (the ledger
/// cannot be "off" by interval; an empty socket path disables it).
pub(crate) fn parse_interval(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err(format!("`{text}`: the ledger interval must be positive"));
    }
    Ok(d)
}

#[cfg(test)]
mod size_tests {
    #[test]
    fn shm_size_parses_like_config_memory_and_defaults_to_the_supervisor_default() {
        assert_eq!(super::parse_size("512Mi"), Ok(512 << 20));
        assert_eq!(super::parse_size("4096"), Ok(4096));
        for bad in ["", "0", "1Xi", "-1"] {
            assert!(super::parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(
            super::parse_size(crate::domain::mps::DEFAULT_SHM_SIZE),
            Ok(crate::runtime::mps::daemon::SupervisorConfig::default().shm_size_bytes)
        );
    }
}

#[cfg(test)]
mod duration_tests {
    use super::{parse_duration, parse_interval};

    #[test]
    fn intervals_parse_with_units_and_refuse_the_rest() {
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_interval("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_interval("1h"), Ok(Duration::from_secs(3600)));
        // Go-style fractions and compounds, as NVIDIA's configs write durations.
        assert_eq!(parse_interval("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_interval("1m30s"), Ok(Duration::from_secs(90)));
        for bad in ["", "s", "0s", "0", "-1s", "10x"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }

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

/// Command-line settings of the MPS manager, to be flattened into `run`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct MpsArgs {
    /// MPS control binary (`nvidia-cuda-mps-control`): run as the daemon (`-f`) and as the
    /// client that sends control commands.
    #[arg(long, env = "MPS_CONTROL_BIN", default_value = crate::domain::mps::DEFAULT_CONTROL_BIN)]
    pub(crate) mps_control_bin: PathBuf,
    /// `nvidia-smi` used to set the compute mode to EXCLUSIVE_PROCESS while a daemon runs;
    /// the step is skipped (and logged) when unset or absent.
    #[arg(long, env = "MPS_NVIDIA_SMI")]
    pub(crate) mps_nvidia_smi: Option<PathBuf>,
    /// First restart delay of a crashed daemon, in milliseconds (doubles up to the max).
    #[arg(long, env = "MPS_RESTART_BACKOFF_MS", default_value_t = 1000)]
    pub(crate) mps_restart_backoff_ms: u64,
    /// Longest restart delay, in milliseconds.
    #[arg(long, env = "MPS_RESTART_BACKOFF_MAX_MS", default_value_t = 60_000)]
    pub(crate) mps_restart_backoff_max_ms: u64,
    /// Size bound of each daemon's `/dev/shm`: a tmpfs at `<mpsRoot>/<uuid>/shm`, shared by
    /// the daemon and the tenants of its device only (`512Mi`, `2Gi`, bytes).
    #[arg(long, env = "MPS_SHM_SIZE", value_parser = parse_size, default_value = crate::domain::mps::DEFAULT_SHM_SIZE)]
    pub(crate) mps_shm_size: u64,
}

/// Parse a size flag as the config file writes memory (`512Mi`, `2Gi`, bytes), never zero.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    crate::domain::config::parse_quantity_text(text).map_err(|e| format!("`{text}`: {e}"))
}

impl MpsArgs {
    /// Supervisor settings these flags express (timeouts keep their defaults).
    pub(crate) fn supervisor_config(&self) -> crate::runtime::mps::daemon::SupervisorConfig {
        crate::runtime::mps::daemon::SupervisorConfig {
            control_bin: self.mps_control_bin.clone(),
            nvidia_smi: self.mps_nvidia_smi.clone(),
            backoff_base: Duration::from_millis(self.mps_restart_backoff_ms),
            backoff_max: Duration::from_millis(self.mps_restart_backoff_max_ms),
            shm_size_bytes: self.mps_shm_size,
            ..crate::runtime::mps::daemon::SupervisorConfig::default()
        }
    }
}

/// Errors building the health settings from flags.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MonitorError {
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
pub(crate) struct HealthArgs {
    /// How long a device must see no new event before a successful re-probe of its GPU makes
    /// it healthy again (`90s`, `500ms`, `2m`; a bare number is seconds).
    #[arg(long, env = "HEALTH_QUIET_PERIOD", value_parser = crate::cli::args::parse_duration, default_value = "60s")]
    pub(crate) health_quiet_period: Duration,
    /// Sim backend only: JSON-lines file of health events to inject, one event per line
    /// (`{"gpu":0,"kind":"xid","xid":79}`), read and removed on every poll.
    #[arg(long, env = "HEALTH_EVENTS_FILE")]
    pub(crate) health_events_file: Option<PathBuf>,
    /// NVIDIA plugin semantics: `all`/`xids` turns health checks off; a comma list of XIDs
    /// adds to the ignored ones (13, 31, 43, 45, 68, 109).
    #[arg(long, env = "DP_DISABLE_HEALTHCHECKS")]
    pub(crate) disable_healthchecks: Option<String>,
    /// NVIDIA plugin semantics: XIDs that count whatever is disabled; `all` counts every XID.
    #[arg(long, env = "DP_ENABLE_HEALTHCHECKS")]
    pub(crate) enable_healthchecks: Option<String>,
}

impl HealthArgs {
    /// The health settings for this backend: NVML events for `nvml`, the node file's timeline
    /// and the events file for `sim:*`.
    pub(crate) fn settings(&self, backend: &BackendArgs) -> Result<HealthSettings, MonitorError> {
        let filter = XidFilter::from_env(
            self.disable_healthchecks.as_deref(),
            self.enable_healthchecks.as_deref(),
        );
        let source = match backend.backend.sim() {
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
