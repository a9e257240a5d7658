//! `gpu-slicer run`: the node daemon. Parses its flags (each also an environment
//! variable), loads the config, opens the backend and hands over to [`crate::runtime::supervisor::run`];
//! SIGTERM / SIGINT cancel it (a second signal is not needed: shutdown has a deadline).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cli::args::{BackendArgs, ConfigArgs};
use crate::domain::config::ConfigError;
use crate::domain::inventory::InventoryError;
use crate::runtime::supervisor::{self as app, AppError, RunSettings};
use crate::runtime::triggers::TriggerSettings;

/// Errors of `gpu-slicer run` before or while the daemon runs.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    /// Config file or flags.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `--backend` could not be opened.
    #[error(transparent)]
    Backend(#[from] InventoryError),
    /// Signal handlers could not be installed.
    #[error("cannot install signal handler: {0}")]
    Signal(#[source] std::io::Error),
    /// The daemon failed.
    #[error(transparent)]
    App(#[from] AppError),
    /// `--cdi-hook-*` flags.
    #[error(transparent)]
    Hook(#[from] crate::domain::cdi::CdiError),
    /// Health flags.
    #[error(transparent)]
    Health(#[from] crate::cli::args::MonitorError),
    /// DRA flags (`--dra`, `--dra-driver-name`, `flags.dra`).
    #[error(transparent)]
    Dra(#[from] crate::domain::dra::DraError),
    /// The Kubernetes API setup (DRA mode, `--config-dir`).
    #[error(transparent)]
    Kube(#[from] crate::platform::kube::KubeError),
    /// DRA mode without a state directory.
    #[error(
        "DRA mode needs --state-dir / STATE_DIR: prepared claims are persisted there (dra-prepared.json)"
    )]
    DraStateDir,
}

/// Flags of `gpu-slicer run` (each also an environment variable). `--log-format` /
/// `LOG_FORMAT` is global on the command line.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RunArgs {
    /// Test-only fault point, built with the `fault-injection` feature only (the tests'
    /// builds): `dra-after-mig-create` SIGKILLs the daemon between a claim's MIG instances
    /// and its checkpoint, so the restart's clean-up can be tested.
    #[cfg(feature = "fault-injection")]
    #[arg(long, env = "GPU_SLICER_FAULT", value_enum, hide = true)]
    pub(crate) fault: Option<Fault>,
    /// `--backend` and NVML settings.
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// `--config` and the flags that override it.
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
    /// `--config-dir`: the Node's labels choose the config (docs/src/fleets.md, "Pools by label").
    #[command(flatten)]
    pub(crate) fleet: crate::cli::fleet_args::FleetArgs,
    /// How to reach the Kubernetes API and which Node this is (`--kubeconfig`, `--node-name`).
    #[command(flatten)]
    pub(crate) kube: crate::cli::kube_args::KubeArgs,
    /// Directory of device-plugin sockets.
    #[arg(long, env = "DEVICE_PLUGIN_DIR", default_value = crate::proto::DEFAULT_DEVICE_PLUGIN_DIR)]
    pub(crate) device_plugin_dir: PathBuf,
    /// The kubelet's registration socket (default: `<device-plugin-dir>/kubelet.sock`).
    #[arg(long, env = "KUBELET_SOCKET")]
    pub(crate) kubelet_socket: Option<PathBuf>,
    /// Directory the CDI spec is written to.
    #[arg(long, env = "CDI_DIR", default_value = "/var/run/cdi")]
    pub(crate) cdi_dir: PathBuf,
    /// Re-discover the inventory this often (MIG layout changes); `0` turns the timer off.
    /// SIGHUP always reloads the config and re-scans.
    #[arg(long, env = "RESCAN_INTERVAL", default_value = "5m", value_parser = crate::cli::args::parse_duration)]
    pub(crate) rescan_interval: std::time::Duration,
    /// Do not watch the config file for changes (SIGHUP still reloads).
    #[arg(long, env = "NO_CONFIG_WATCH")]
    pub(crate) no_config_watch: bool,
    /// MPS control daemon binary and restart timing.
    #[command(flatten)]
    pub(crate) mps: crate::cli::args::MpsArgs,
    /// The memory-limit hook written into per-share CDI devices.
    #[command(flatten)]
    pub(crate) hook: crate::cli::args::HookArgs,
    /// Health monitoring flags.
    #[command(flatten)]
    pub(crate) health: crate::cli::args::HealthArgs,
    /// HTTP endpoint (`/metrics`, `/healthz`, `/readyz`): `:9400`, `127.0.0.1:9400`; empty
    /// disables it.
    #[arg(long, env = "HTTP_LISTEN", default_value = ":9400")]
    pub(crate) http_listen: String,
    /// The kubelet's PodResources socket, for the allocation ledger; empty disables it.
    // A string, not a path: clap's path parser refuses the empty value that disables it.
    #[arg(long, env = "POD_RESOURCES_SOCKET", default_value = crate::runtime::ledger::DEFAULT_POD_RESOURCES_SOCKET)]
    pub(crate) pod_resources_socket: String,
    /// How often the ledger reconciles with the kubelet (`10s`, `500ms`, `1m`).
    #[arg(long, env = "LEDGER_INTERVAL", default_value = "10s", value_parser = crate::cli::args::parse_interval)]
    pub(crate) ledger_interval: std::time::Duration,
    /// Directory of gpu-slicer's own state: the checkpoint of held devices (`held.json`),
    /// read before the first spec is written so a restart keeps them. Not the device-plugin
    /// directory (the kubelet deletes files there). Empty: held devices are not persisted.
    #[arg(long, env = "STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub(crate) state_dir: String,
    /// Node Feature Discovery feature file the node labels (GPU Feature Discovery's names)
    /// are written to, rewritten whenever they change; empty writes no labels.
    #[arg(long, env = "LABELS_FILE", default_value = crate::runtime::labels::DEFAULT_LABELS_FILE)]
    pub(crate) labels_file: String,
    /// Also put those labels straight onto the agent's own Node (for clusters without NFD):
    /// keys it no longer owns are removed, keys it never wrote are never touched. Needs
    /// `--node-name` / `NODE_NAME` and API access (docs/src/fleets.md, "Pools by label").
    #[arg(long, env = "LABELS_TO_NODE")]
    pub(crate) labels_to_node: bool,
    /// How often usage is sampled (utilisation, memory, processes → shares); `0` turns
    /// sampling, the usage metrics and `/v1/state` off.
    #[arg(long, env = "USAGE_INTERVAL", default_value = "10s", value_parser = crate::cli::args::parse_duration)]
    pub(crate) usage_interval: std::time::Duration,
    /// A held share whose container used no GPU memory and no compute for this long counts
    /// in `gpu_slicer_idle_shares`.
    #[arg(long, env = "IDLE_WINDOW", default_value = "15m", value_parser = crate::cli::args::parse_duration)]
    pub(crate) idle_window: std::time::Duration,
    /// DRA mode (`--dra`, `--dra-driver-name`, the kubelet's plugin directories).
    #[command(flatten)]
    pub(crate) dra: crate::cli::dra_args::DraArgs,
}

/// Default of `--state-dir`.
pub(crate) const DEFAULT_STATE_DIR: &str = "/var/lib/gpu-slicer";

impl RunArgs {
    /// The flags in `argv` (without the program and subcommand names), environment variables
    /// included, as `gpu-slicer run` parses them: for a daemon started in process
    /// ([`crate::testkit::Node::run`]).
    pub(crate) fn parse(argv: &[String]) -> Result<Self, clap::Error> {
        #[derive(clap::Parser)]
        #[command(name = "gpu-slicer run")]
        struct Run {
            #[command(flatten)]
            args: RunArgs,
        }
        use clap::Parser;
        Run::try_parse_from(std::iter::once("run").chain(argv.iter().map(String::as_str)))
            .map(|r| r.args)
    }

    /// The daemon settings these flags describe (config loaded and validated).
    pub(crate) fn settings(&self) -> Result<RunSettings, RunError> {
        let state_dir = (!self.state_dir.is_empty()).then(|| PathBuf::from(&self.state_dir));
        let selection = self.fleet.selection(&self.config, state_dir.as_deref());
        let config = match &selection {
            Some(s) => s.load()?,
            None => self.config.load()?,
        };
        let mut settings = RunSettings::new(config, &self.device_plugin_dir, &self.cdi_dir);
        if let Some(socket) = &self.kubelet_socket {
            settings.kubelet_socket.clone_from(socket);
        }
        let flags = self.config.clone();
        let load: app::ConfigLoader = match selection.clone() {
            Some(s) => Arc::new(move || s.load()),
            None => Arc::new(move || flags.load()),
        };
        settings.reload = app::ReloadSettings {
            load: Some(load),
            triggers: TriggerSettings {
                config_file: self
                    .config
                    .path()
                    .map(Path::to_path_buf)
                    .filter(|_| !self.no_config_watch),
                config_dir: self
                    .fleet
                    .config_dir
                    .clone()
                    .filter(|_| !self.no_config_watch),
                sighup: true,
                rescan_interval: Some(self.rescan_interval),
            },
        };
        settings.fleet = selection.map(|s| {
            let mut fleet = crate::runtime::fleet::FleetSettings::new(s, None);
            fleet.state_dir.clone_from(&state_dir);
            fleet
        });
        settings.mps = self.mps.supervisor_config();
        let hook = self.hook.settings(self.backend.nvml_lib.as_deref())?;
        settings.hook = Some(hook);
        settings.state_dir = state_dir;
        settings.health_monitor = Some(self.health.settings(&self.backend)?);
        settings.http_listen = (!self.http_listen.is_empty()).then(|| self.http_listen.clone());
        settings.mig_layouts =
            self.backend
                .backend
                .is_nvml()
                .then(|| crate::runtime::miglayout::MigLayoutSettings {
                    nvml_lib: self.backend.nvml_lib.clone(),
                    interval: self.rescan_interval.max(std::time::Duration::from_secs(1)),
                });
        settings.ledger = (!self.pod_resources_socket.is_empty()).then(|| {
            crate::runtime::ledger::LedgerSettings {
                socket: PathBuf::from(&self.pod_resources_socket),
                interval: self.ledger_interval,
            }
        });
        settings.labels = (!self.labels_file.is_empty())
            .then(|| crate::runtime::labels::LabelsSettings::new(&self.labels_file));
        settings.usage = self.usage_settings()?;
        Ok(settings)
    }

    /// The DRA front-end when DRA mode is on (the API client is built here: nothing is sent
    /// until the driver's first call, so an API that is down does not stop the start).
    pub(crate) async fn dra_settings(
        &self,
        config: &crate::domain::config::Config,
    ) -> Result<Option<crate::runtime::dra::DraModeSettings>, RunError> {
        use crate::platform::kube::{KubeClaims, NodeApi, SliceApi};
        use crate::runtime::dra::{DraModeSettings, DraSettings, publish::PublishSettings};
        let Some(driver) = self.dra.mode(config)? else {
            return Ok(None);
        };
        let node = crate::cli::dra_args::node_name(Some(&self.kube.node_name()?))?;
        if self.state_dir.is_empty() {
            return Err(RunError::DraStateDir);
        }
        let client = crate::platform::kube::connect(&self.kube.source()?).await?;
        let publish = PublishSettings::new(
            SliceApi::new(client.clone(), &driver, &node),
            NodeApi::new(client.clone(), node.clone()),
        );
        Ok(Some(DraModeSettings {
            driver: DraSettings {
                driver,
                node,
                registry_dir: self.dra.kubelet_registry_dir.clone(),
                plugins_dir: self.dra.kubelet_plugins_dir.clone(),
                cdi_dir: self.cdi_dir.clone(),
                state_dir: PathBuf::from(&self.state_dir),
                proc_root: self.backend.proc_root.clone(),
                health_resend: crate::runtime::dra::service::HEALTH_RESEND,
                socket_check: std::time::Duration::from_secs(1),
                extras: self.dra_extras()?,
            },
            claims: std::sync::Arc::new(KubeClaims::new(client)),
            publish: Some(publish),
        }))
    }

    /// What binds DRA shares and makes dynamic MIG devices: the memory-limit hook, MIG
    /// instance operations through NVML (the `nvml` backend only), and the test-only fault
    /// point `--fault dra-after-mig-create` (the `fault-injection` feature).
    fn dra_extras(&self) -> Result<crate::runtime::dra::DriverExtras, RunError> {
        use crate::platform::dra_mig::{InstanceOps, NvmlInstances};
        let instances = self.backend.backend.is_nvml().then(|| {
            std::sync::Arc::new(NvmlInstances {
                lib: self.backend.nvml_lib.clone(),
                proc_root: self.backend.proc_root.clone(),
            }) as std::sync::Arc<dyn InstanceOps>
        });
        Ok(crate::runtime::dra::DriverExtras {
            hook: Some(self.hook.settings(self.backend.nvml_lib.as_deref())?),
            instances,
            kill_after_mig_create: self.kills_after_mig_create(),
            #[cfg(test)]
            gate: None,
        })
    }

    /// Whether the `dra-after-mig-create` fault point is armed (never without the
    /// `fault-injection` feature).
    fn kills_after_mig_create(&self) -> bool {
        #[cfg(feature = "fault-injection")]
        return self.fault == Some(Fault::DraAfterMigCreate);
        #[cfg(not(feature = "fault-injection"))]
        false
    }

    /// The usage sampler's settings: NVML figures for `nvml`, the node file's `usage`
    /// section for `sim:*`; `None` when `--usage-interval` is 0.
    fn usage_settings(&self) -> Result<Option<crate::runtime::usage::UsageSettings>, RunError> {
        if self.usage_interval.is_zero() {
            return Ok(None);
        }
        let source: Box<dyn crate::platform::usage::UsageSource> = match self.backend.backend.sim()
        {
            Some(profile) => {
                let sim = crate::platform::sim::SimBackend::open(profile)?;
                Box::new(crate::platform::usage::SimUsage::new(
                    sim.spec().clone(),
                    sim.path().map(std::path::Path::to_path_buf),
                ))
            }
            None => Box::new(crate::platform::usage::NvmlUsage::new(
                self.backend.nvml_lib.clone(),
            )),
        };
        Ok(Some(crate::runtime::usage::UsageSettings {
            source,
            interval: self.usage_interval,
            idle_window: self.idle_window,
            proc_root: self.backend.proc_root.clone(),
            checkpoint: self
                .device_plugin_dir
                .join(crate::platform::usage::CHECKPOINT_FILE),
        }))
    }
}

/// Test-only fault points of `run --fault` (the `fault-injection` feature).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Fault {
    /// SIGKILL right after a DRA claim's MIG instances are made, before its spec and
    /// checkpoint are written.
    DraAfterMigCreate,
}

/// Run the daemon until SIGTERM or SIGINT.
pub(crate) async fn run(args: &RunArgs) -> Result<(), RunError> {
    let mut settings = args.settings()?;
    settings.dra = args.dra_settings(&settings.config).await?;
    if let Some(dra) = &settings.dra {
        tracing::info!(driver = %dra.driver.driver, node = %dra.driver.node,
            "DRA mode: GPUs served through DRA, no device-plugin servers");
    }
    if settings.fleet.is_some() || args.labels_to_node {
        // Only a client is built here: an API server that is down shows (and is retried)
        // in the Node watcher and labeller, while the config chosen at start serves.
        let client = crate::platform::kube::connect(&args.kube.source()?).await?;
        let api = crate::platform::kube::NodeApi::new(client, args.kube.node_name()?);
        if args.labels_to_node {
            settings.node_labels = Some(crate::runtime::node_labels::NodeLabelsSettings::new(
                api.clone(),
            ));
        }
        if let Some(fleet) = settings.fleet.as_mut() {
            fleet.node = Some(crate::runtime::node_watch::NodeWatchSettings::new(api));
        }
    }
    // Another spec of our kind beside the one the daemon writes takes devices away
    // silently (runtimes drop what two files of one directory define): said once at start.
    crate::platform::cdi_host::warn_same_kind_specs(
        &args.cdi_dir,
        &settings.config.cdi_kind,
        &crate::domain::cdi::spec_file_name(
            &settings.config.cdi_kind,
            crate::domain::cdi::Format::Yaml,
        ),
        None,
    );
    let backend = super::backend::open_backend(&args.backend)?;
    let shutdown = CancellationToken::new();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(RunError::Signal)?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(RunError::Signal)?;
    let daemon = app::run(settings, backend, shutdown.clone());
    tokio::pin!(daemon);
    tokio::select! {
        result = &mut daemon => return Ok(result?),
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "stopping"),
        _ = int.recv() => tracing::info!(signal = "SIGINT", "stopping"),
    }
    shutdown.cancel();
    Ok(daemon.await?)
}

mod node;

#[cfg(test)]
mod compat_tests;
#[cfg(test)]
mod deploy_tests;
