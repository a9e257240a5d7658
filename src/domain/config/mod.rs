//! Config: what the operator asked for, in NVIDIA k8s-device-plugin `version: v1` form.
//!
//! [`parse`] takes the text of a YAML or JSON file ([`file`] holds the raw shape; reading it is
//! `platform::config_file::load`), applies CLI/env
//! [`Overrides`] with the incumbent's precedence (flag > env > file > default) and returns a
//! validated [`Config`]. Checks that need the inventory (does `devices: [7]` exist?) happen
//! in the planner, which names the same file and field. Pure: warnings come back as
//! [`ConfigWarning`] values for the caller to log.

use std::path::PathBuf;

use serde::Serialize;

pub mod file;

use file::{DeviceRefValue, FileConfig, FileDevices, FileReplicas, Quantity, StringOrList};

pub use crate::domain::cdi_kind::DEFAULT_CDI_KIND;

/// Default prefix of CDI container annotations.
pub const DEFAULT_CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// Errors loading or validating a config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse (syntax, unknown key, wrong type).
    #[error("invalid config file {path}: field `{field}`: {message}")]
    Parse {
        path: String,
        field: String,
        message: String,
    },
    /// A value is out of range or contradicts another.
    #[error("invalid config {path}: field `{field}` = {value}: {message}")]
    Invalid {
        path: String,
        field: String,
        value: String,
        message: String,
    },
    /// The file is not YAML at all (a tab in the indentation, an unclosed quote): no field
    /// is to blame, the position is.
    #[error("invalid config file {path}: not valid YAML: {message}")]
    Syntax { path: String, message: String },
    /// A flag or environment variable has a bad value.
    /// `setting` names it as the user set it (flag `--mig-strategy`, env var
    /// `MIG_STRATEGY`), not the config file.
    #[error("invalid {setting} = {value}: {message}")]
    Setting {
        setting: String,
        value: String,
        message: String,
    },
    /// `--config-dir`: the Node's label (or `--config-default`) names no key of the
    /// directory.
    #[error(transparent)]
    Selection(#[from] crate::domain::fleet::FleetError),
}

/// Result alias for this module.
pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// How MIG devices are exposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    /// MIG-enabled GPUs are exposed as whole GPUs.
    #[default]
    None,
    /// All MIG devices identical and exposed as `nvidia.com/gpu`.
    Single,
    /// One `nvidia.com/mig-<profile>` resource per profile.
    Mixed,
}

/// What Allocate puts in the container response besides the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES=<ids>`.
    Envvar,
    /// Per-device mounts under `/var/run/nvidia-container-devices`.
    VolumeMounts,
    /// `cdi.k8s.io/…` container annotations.
    CdiAnnotations,
    /// `cdi_devices` in the response (CRI field).
    CdiCri,
}

/// How devices are named to the runtime in envvar / volume-mounts responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeviceIdStrategy {
    /// UUIDs.
    #[default]
    Uuid,
    /// Indices (`i` or `i:j`).
    Index,
}

/// Preferred-allocation policy for replicas and MIG devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AllocationPolicy {
    /// One replica per GPU where possible.
    #[default]
    Distributed,
    /// Fill one GPU before the next.
    Packed,
}

/// Isolation level of a shared resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default, PartialOrd, Ord, Hash)]
pub enum Isolation {
    /// Plain time-slicing: nothing enforced.
    #[default]
    #[serde(rename = "none")]
    None,
    /// Driver-enforced memory limit per container.
    #[serde(rename = "memory")]
    Memory,
    /// MPS compute share and pinned-memory limit.
    #[serde(rename = "mps")]
    Mps,
    /// Both.
    #[serde(rename = "memory+mps")]
    MemoryMps,
}

impl Isolation {
    /// Parse the config spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => Self::None,
            "memory" => Self::Memory,
            "mps" => Self::Mps,
            "memory+mps" => Self::MemoryMps,
            _ => return None,
        })
    }

    /// Whether MPS control daemons are involved.
    pub fn uses_mps(self) -> bool {
        matches!(self, Self::Mps | Self::MemoryMps)
    }

    /// Whether the driver memory limit is set per container.
    pub fn uses_memory_limit(self) -> bool {
        matches!(self, Self::Memory | Self::MemoryMps)
    }

    /// Config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Memory => "memory",
            Self::Mps => "mps",
            Self::MemoryMps => "memory+mps",
        }
    }
}

/// Which sharing section an entry came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SharingKind {
    /// `sharing.timeSlicing`.
    TimeSlicing,
    /// `sharing.mps`.
    Mps,
}

impl SharingKind {
    /// Config path of the section.
    pub fn field(self) -> &'static str {
        match self {
            Self::TimeSlicing => "sharing.timeSlicing",
            Self::Mps => "sharing.mps",
        }
    }
}

/// A reference to a device in `devices:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "by", content = "value")]
pub enum DeviceRef {
    /// GPU index `i`.
    Index(u32),
    /// MIG device `i:j`.
    MigIndex(u32, u32),
    /// `GPU-…` or `MIG-…` UUID, or legacy `MIG-GPU-…/gi/ci`.
    Uuid(String),
}

impl std::fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceRef::Index(i) => write!(f, "{i}"),
            DeviceRef::MigIndex(i, j) => write!(f, "{i}:{j}"),
            DeviceRef::Uuid(u) => f.write_str(u),
        }
    }
}

/// Which devices of a resource a sharing entry applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum DeviceSelector {
    /// Every device of the resource.
    All,
    /// Devices whose GPU index is below N.
    Count(u32),
    /// Explicit references.
    List(Vec<DeviceRef>),
}

impl std::fmt::Display for DeviceSelector {
    /// As a config would write it: `all`, a count, or `[0, 1:2, GPU-…]`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSelector::All => f.write_str("all"),
            DeviceSelector::Count(n) => write!(f, "{n}"),
            DeviceSelector::List(refs) => {
                let refs: Vec<String> = refs.iter().map(ToString::to_string).collect();
                write!(f, "[{}]", refs.join(", "))
            }
        }
    }
}

/// One validated `sharing.*.resources[]` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedResource {
    /// Section it came from.
    pub kind: SharingKind,
    /// Position in that section's list (for error messages).
    pub position: usize,
    /// Resource whose devices are replicated, with `nvidia.com/` added.
    pub name: String,
    /// Name of the replicated resource (rename, `.shared` by default rules, or `name`).
    pub advertised_name: String,
    /// Devices replicated.
    pub devices: DeviceSelector,
    /// Replicas per device (≥ 2).
    pub replicas: u32,
    /// Isolation level.
    pub isolation: Isolation,
    /// Memory per replica in bytes (default: an even split).
    pub memory_per_replica: Option<u64>,
    /// Reject requests for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// Let one request take replicas on several GPUs.
    pub allow_multi_gpu: bool,
}

impl SharedResource {
    /// Config path of this entry, e.g. `sharing.timeSlicing.resources[0]`.
    pub fn field(&self) -> String {
        format!("{}.resources[{}]", self.kind.field(), self.position)
    }
}

/// A validated config.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// Where it came from (file path, or `built-in defaults`).
    pub source: String,
    /// MIG strategy.
    pub mig_strategy: MigStrategy,
    /// Exit when the backend cannot start (false: run with no devices).
    pub fail_on_init_error: bool,
    /// Root of MPS pipe/log directories.
    pub mps_root: Option<PathBuf>,
    /// Host driver root.
    pub driver_root: PathBuf,
    /// Host root of `/dev` (CDI `hostPath` prefix).
    pub dev_root: PathBuf,
    /// Where this process sees `driver_root` when it runs in a container
    /// (`flags.plugin.containerDriverRoot`, e.g. `/host`); `None`: at `driver_root`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_driver_root: Option<PathBuf>,
    /// Also return DeviceSpecs in Allocate.
    pub pass_device_specs: bool,
    /// Allocate response formats.
    pub device_list_strategy: Vec<DeviceListStrategy>,
    /// IDs shown to the runtime in env/mounts.
    pub device_id_strategy: DeviceIdStrategy,
    /// Prefix of CDI annotations.
    pub cdi_annotation_prefix: String,
    /// Preferred-allocation policy for replicas and MIG.
    pub allocation_policy: AllocationPolicy,
    /// CDI kind of the generated spec.
    pub cdi_kind: String,
    /// Sharing entries in file order (time-slicing first, then MPS).
    pub sharing: Vec<SharedResource>,
    /// The MIG layout the daemon takes idle GPUs to (`flags.migLayouts`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_layouts: Option<MigLayouts>,
    /// `flags.dra` as the file says it; `run` resolves it with `--dra` /
    /// `--dra-driver-name` once at start (a front-end switch needs a restart).
    #[serde(skip_serializing_if = "DraFlags::is_unset")]
    pub dra: DraFlags,
}

/// `flags.dra`: the file's DRA mode settings (unvalidated: the driver name is checked where
/// the mode is resolved, with the flags that override it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DraFlags {
    /// `flags.dra.enabled`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `flags.dra.driverName`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_name: Option<String>,
    /// `flags.dra.dynamicMig`: the GPUs (`all` or a `devices`-style list of GPU indices and
    /// UUIDs) whose MIG instances the DRA driver creates per claim; `None`: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_mig: Option<DeviceSelector>,
}

impl DraFlags {
    /// Nothing set in the file.
    pub fn is_unset(&self) -> bool {
        self.enabled.is_none() && self.driver_name.is_none() && self.dynamic_mig.is_none()
    }
}

/// `flags.dra.dynamicMig` as a GPU selector: like a sharing entry's `devices`, but GPUs
/// only (a MIG index names a slice, not a GPU whose slices are made on demand).
fn dynamic_mig(
    value: Option<&FileDevices>,
) -> std::result::Result<Option<DeviceSelector>, (String, String, String)> {
    const FIELD: &str = "flags.dra.dynamicMig";
    let Some(value) = value else { return Ok(None) };
    let selector = device_selector(Some(value), FIELD)?;
    if let DeviceSelector::List(refs) = &selector {
        for (i, r) in refs.iter().enumerate() {
            let mig = matches!(r, DeviceRef::MigIndex(..))
                || matches!(r, DeviceRef::Uuid(u) if u.starts_with("MIG-"));
            if mig {
                return Err((
                    format!("{FIELD}[{i}]"),
                    format!("`{r}`"),
                    "names a MIG device; list GPUs (index or GPU UUID)".into(),
                ));
            }
        }
    }
    Ok(Some(selector))
}

/// `flags.migLayouts`: a mig-parted config file and the layout of it to apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigLayouts {
    /// The mig-parted file.
    pub file: PathBuf,
    /// A key of its `mig-configs`.
    pub layout: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            source: "built-in defaults".to_string(),
            mig_strategy: MigStrategy::None,
            fail_on_init_error: true,
            mps_root: None,
            driver_root: PathBuf::from("/"),
            dev_root: PathBuf::from("/"),
            container_driver_root: None,
            pass_device_specs: false,
            device_list_strategy: vec![DeviceListStrategy::Envvar],
            device_id_strategy: DeviceIdStrategy::Uuid,
            cdi_annotation_prefix: DEFAULT_CDI_ANNOTATION_PREFIX.to_string(),
            allocation_policy: AllocationPolicy::Distributed,
            cdi_kind: DEFAULT_CDI_KIND.to_string(),
            sharing: Vec::new(),
            mig_layouts: None,
            dra: DraFlags::default(),
        }
    }
}

/// Settings given on the command line or in the environment; `Some` wins over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub mig_strategy: Option<String>,
    pub fail_on_init_error: Option<bool>,
    pub mps_root: Option<String>,
    pub driver_root: Option<String>,
    pub dev_root: Option<String>,
    pub container_driver_root: Option<String>,
    pub pass_device_specs: Option<bool>,
    pub device_list_strategy: Option<Vec<String>>,
    pub device_id_strategy: Option<String>,
    pub cdi_annotation_prefix: Option<String>,
    pub allocation_policy: Option<String>,
    pub cdi_kind: Option<String>,
    /// `--mig-layout-file` / `MIG_LAYOUT_FILE`.
    pub mig_layout_file: Option<String>,
    /// `--mig-layout` / `MIG_LAYOUT`.
    pub mig_layout: Option<String>,
    /// Where each set override came from, by config field path (`flags.migStrategy` →
    /// ``flag `--mig-strategy` ``), so a bad value is blamed on the flag or environment
    /// variable the user set rather than on the file. A set override with no entry is
    /// blamed on "command-line setting".
    pub sources: std::collections::BTreeMap<String, String>,
}

impl Overrides {
    /// Whether the override for the config field `field` is set (it then wins over the
    /// file, so a bad value of that field came from it).
    fn is_set(&self, field: &str) -> bool {
        match field {
            "flags.migStrategy" => self.mig_strategy.is_some(),
            "flags.failOnInitError" => self.fail_on_init_error.is_some(),
            "flags.mpsRoot" => self.mps_root.is_some(),
            "flags.nvidiaDriverRoot" => self.driver_root.is_some(),
            "flags.nvidiaDevRoot" => self.dev_root.is_some(),
            "flags.plugin.passDeviceSpecs" => self.pass_device_specs.is_some(),
            "flags.plugin.deviceListStrategy" => self.device_list_strategy.is_some(),
            "flags.plugin.deviceIDStrategy" => self.device_id_strategy.is_some(),
            "flags.plugin.cdiAnnotationPrefix" => self.cdi_annotation_prefix.is_some(),
            "flags.plugin.sharedDevicesAllocationPolicy" => self.allocation_policy.is_some(),
            "flags.plugin.cdiKind" => self.cdi_kind.is_some(),
            "flags.migLayouts.file" => self.mig_layout_file.is_some(),
            "flags.migLayouts.layout" => self.mig_layout.is_some(),
            _ => false,
        }
    }

    /// The name of whatever set `field`, for an error message.
    fn source(&self, field: &str) -> String {
        self.sources
            .get(field)
            .cloned()
            .unwrap_or_else(|| "command-line setting".to_string())
    }
}

/// Something in a config worth a warning that does not stop the load; the caller logs it
/// (the domain does no logging).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigWarning {
    /// The `resources` field (pattern-based naming) is set: accepted but ignored.
    IgnoredResources {
        /// The config's origin (file path).
        config: String,
    },
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigWarning::IgnoredResources { .. } => f.write_str(
                "the `resources` field (pattern-based naming) is accepted but ignored, as by NVIDIA's plugin; use sharing.*.resources[].rename",
            ),
        }
    }
}

/// The defaults with overrides applied (no file given).
pub fn defaults(overrides: &Overrides) -> Result<Config> {
    from_file_config(FileConfig::default(), "built-in defaults", overrides).map(|(c, _)| c)
}

/// [`parse`], also returning the warnings for the caller to log.
pub fn parse_reporting(
    text: &str,
    origin: &str,
    overrides: &Overrides,
) -> Result<(Config, Vec<ConfigWarning>)> {
    let raw = parse_file(text, origin)?;
    from_file_config(raw, origin, overrides)
}

/// Parse config text. `origin` names the source in errors.
pub fn parse(text: &str, origin: &str, overrides: &Overrides) -> Result<Config> {
    parse_reporting(text, origin, overrides).map(|(c, _)| c)
}

/// Parse the raw file shape, reporting the dotted path of the offending field.
pub fn parse_file(text: &str, origin: &str) -> Result<FileConfig> {
    let parse_err = |field: String, message: String| ConfigError::Parse {
        path: origin.to_string(),
        field,
        message,
    };
    if text.trim().is_empty() {
        return Ok(FileConfig::default());
    }
    // Syntax first: a scanner error (a tab in the indentation) happens wherever the
    // deserializer happens to be, so the field path it would carry is meaningless.
    if let Err(e) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) {
        return Err(ConfigError::Syntax {
            path: origin.to_string(),
            message: e.to_string(),
        });
    }
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize::<_, FileConfig>(de).map_err(|e| {
        let field = e.path().to_string();
        let message = e.into_inner().to_string();
        // The YAML library prefixes its message with the same path: say it once.
        let message = message
            .strip_prefix(&format!("{field}: "))
            .map_or(message.clone(), str::to_string);
        let field = if field == "." {
            "(top level)".into()
        } else {
            field
        };
        parse_err(field, message)
    })
}

fn from_file_config(
    raw: FileConfig,
    origin: &str,
    ov: &Overrides,
) -> Result<(Config, Vec<ConfigWarning>)> {
    let mut warnings = Vec::new();
    let invalid = |field: &str, value: &dyn std::fmt::Display, message: &str| {
        if ov.is_set(field) {
            ConfigError::Setting {
                setting: ov.source(field),
                value: format!("`{value}`"),
                message: message.to_string(),
            }
        } else {
            ConfigError::Invalid {
                path: origin.to_string(),
                field: field.to_string(),
                value: format!("`{value}`"),
                message: message.to_string(),
            }
        }
    };
    let mut cfg = Config {
        source: origin.to_string(),
        ..Config::default()
    };
    match raw.version.as_deref() {
        None | Some("") | Some("v1") => {}
        Some(v) => return Err(invalid("version", &v, "unknown version (expected `v1`)")),
    }
    let flags = &raw.flags;

    // Precedence: flag/env (already merged by clap) > file > default.
    if let Some(s) = ov.mig_strategy.as_ref().or(flags.mig_strategy.as_ref()) {
        cfg.mig_strategy = match s.as_str() {
            "none" => MigStrategy::None,
            "single" => MigStrategy::Single,
            "mixed" => MigStrategy::Mixed,
            other => {
                return Err(invalid(
                    "flags.migStrategy",
                    &other,
                    "expected none, single or mixed",
                ));
            }
        };
    }
    if let Some(b) = ov.fail_on_init_error.or(flags.fail_on_init_error) {
        cfg.fail_on_init_error = b;
    }
    if let Some(dra) = &flags.dra {
        cfg.dra = DraFlags {
            enabled: dra.enabled,
            driver_name: dra.driver_name.clone().filter(|s| !s.is_empty()),
            dynamic_mig: dynamic_mig(dra.dynamic_mig.as_ref())
                .map_err(|(f, v, m)| invalid(&f, &v.trim_matches('`'), &m))?,
        };
    }
    let file_layouts = flags.mig_layouts.clone().unwrap_or_default();
    let layout_file = ov
        .mig_layout_file
        .clone()
        .or(file_layouts.file)
        .filter(|s| !s.is_empty());
    let layout = ov
        .mig_layout
        .clone()
        .or(file_layouts.layout)
        .filter(|s| !s.is_empty());
    cfg.mig_layouts = match (layout_file, layout) {
        (None, None) => None,
        (Some(file), Some(layout)) => Some(MigLayouts {
            file: PathBuf::from(file),
            layout,
        }),
        (Some(file), None) => {
            return Err(invalid(
                "flags.migLayouts.layout",
                &"(unset)",
                &format!("required with the layout file {file}"),
            ));
        }
        (None, Some(layout)) => {
            return Err(invalid(
                "flags.migLayouts.file",
                &"(unset)",
                &format!("required with the layout `{layout}`"),
            ));
        }
    };
    if let Some(s) = ov.mps_root.as_ref().or(flags.mps_root.as_ref())
        && !s.is_empty()
    {
        if !s.starts_with('/') {
            return Err(invalid("flags.mpsRoot", s, "must be an absolute path"));
        }
        cfg.mps_root = Some(PathBuf::from(s));
    }
    if let Some(s) = ov
        .driver_root
        .as_ref()
        .or(flags.nvidia_driver_root.as_ref())
    {
        cfg.driver_root = PathBuf::from(s);
        cfg.dev_root = PathBuf::from(s);
    }
    if let Some(s) = ov.dev_root.as_ref().or(flags.nvidia_dev_root.as_ref()) {
        cfg.dev_root = PathBuf::from(s);
    }
    let plugin = &flags.plugin;
    if let Some(s) = ov
        .container_driver_root
        .as_ref()
        .or(plugin.container_driver_root.as_ref())
        && !s.is_empty()
    {
        if !s.starts_with('/') {
            return Err(invalid(
                "flags.plugin.containerDriverRoot",
                s,
                "must be an absolute path",
            ));
        }
        cfg.container_driver_root = Some(PathBuf::from(s));
    }
    if let Some(b) = ov.pass_device_specs.or(plugin.pass_device_specs) {
        cfg.pass_device_specs = b;
    }
    let strategies: Option<Vec<String>> = ov.device_list_strategy.clone().or_else(|| {
        plugin.device_list_strategy.as_ref().map(|s| match s {
            StringOrList::One(s) => vec![s.clone()],
            StringOrList::Many(v) => v.clone(),
        })
    });
    if let Some(list) = strategies {
        let mut out = Vec::new();
        for s in list.iter().flat_map(|s| s.split(',')).map(str::trim) {
            let st = match s {
                "envvar" => DeviceListStrategy::Envvar,
                "volume-mounts" => DeviceListStrategy::VolumeMounts,
                "cdi-annotations" => DeviceListStrategy::CdiAnnotations,
                "cdi-cri" => DeviceListStrategy::CdiCri,
                other => {
                    return Err(invalid(
                        "flags.plugin.deviceListStrategy",
                        &other,
                        "expected envvar, volume-mounts, cdi-annotations or cdi-cri",
                    ));
                }
            };
            if !out.contains(&st) {
                out.push(st);
            }
        }
        if out.is_empty() {
            return Err(invalid(
                "flags.plugin.deviceListStrategy",
                &"[]",
                "at least one strategy is required",
            ));
        }
        out.sort();
        cfg.device_list_strategy = out;
    }
    if let Some(s) = ov
        .device_id_strategy
        .as_ref()
        .or(plugin.device_id_strategy.as_ref())
    {
        cfg.device_id_strategy = match s.as_str() {
            "uuid" => DeviceIdStrategy::Uuid,
            "index" => DeviceIdStrategy::Index,
            other => {
                return Err(invalid(
                    "flags.plugin.deviceIDStrategy",
                    &other,
                    "expected uuid or index",
                ));
            }
        };
    }
    if let Some(s) = ov
        .cdi_annotation_prefix
        .as_ref()
        .or(plugin.cdi_annotation_prefix.as_ref())
    {
        if !s.ends_with('/') || s.len() < 2 {
            return Err(invalid(
                "flags.plugin.cdiAnnotationPrefix",
                s,
                "must be a DNS prefix ending in `/`, e.g. cdi.k8s.io/",
            ));
        }
        cfg.cdi_annotation_prefix = s.clone();
    }
    if let Some(s) = ov
        .allocation_policy
        .as_ref()
        .or(plugin.shared_devices_allocation_policy.as_ref())
    {
        cfg.allocation_policy = match s.as_str() {
            "distributed" => AllocationPolicy::Distributed,
            "packed" => AllocationPolicy::Packed,
            other => {
                return Err(invalid(
                    "flags.plugin.sharedDevicesAllocationPolicy",
                    &other,
                    "expected distributed or packed",
                ));
            }
        };
    }
    if let Some(s) = ov.cdi_kind.as_ref().or(plugin.cdi_kind.as_ref()) {
        crate::domain::cdi_kind::check_syntax(s)
            .and_then(|()| crate::domain::cdi_kind::check_not_foreign(s))
            .map_err(|m| invalid("flags.plugin.cdiKind", s, &m))?;
        cfg.cdi_kind = s.clone();
    }
    if let Some(imex) = &raw.imex
        && !(imex.channel_ids.is_empty() || imex.channel_ids == [0])
    {
        return Err(invalid(
            "imex.channelIDs",
            &format!("{:?}", imex.channel_ids),
            "only [] or [0] are valid",
        ));
    }
    if let Some(res) = &raw.resources
        && (!res.gpus.is_empty() || !res.mig.is_empty())
    {
        warnings.push(ConfigWarning::IgnoredResources {
            config: origin.to_string(),
        });
    }

    let mut sharing = Vec::new();
    if let Some(ts) = &raw.sharing.time_slicing {
        sharing.extend(shared_resources(ts, SharingKind::TimeSlicing, origin)?);
    }
    if let Some(mps) = &raw.sharing.mps {
        sharing.extend(shared_resources(mps, SharingKind::Mps, origin)?);
    }
    if sharing.iter().any(|s| s.isolation.uses_mps()) && cfg.mps_root.is_none() {
        cfg.mps_root = Some(PathBuf::from("/run/nvidia/mps"));
    }
    cfg.sharing = sharing;
    Ok((cfg, warnings))
}

/// A `devices:` value (`all`, a count, one reference or a list of them) as a selector.
/// `field` names it in errors, which come back as (field, value as written, message).
fn device_selector(
    devices: Option<&FileDevices>,
    field: &str,
) -> std::result::Result<DeviceSelector, (String, String, String)> {
    let bad = |f: String, v: String, m: String| (f, v, m);
    Ok(match devices {
        None => DeviceSelector::All,
        Some(FileDevices::Word(w)) if w == "all" => DeviceSelector::All,
        Some(FileDevices::Word(w)) => DeviceSelector::List(vec![
            parse_device_ref(w).map_err(|m| bad(field.into(), format!("`{w}`"), m))?,
        ]),
        Some(FileDevices::Count(n)) => DeviceSelector::Count(
            u32::try_from(*n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad(field.into(), n.to_string(), "must be positive".into()))?,
        ),
        Some(FileDevices::List(list)) => {
            if list.is_empty() {
                return Err(bad(
                    field.into(),
                    "`[]`".into(),
                    "empty list selects nothing; omit `devices` for all".into(),
                ));
            }
            let mut refs = Vec::new();
            for (i, v) in list.iter().enumerate() {
                let dr = match v {
                    DeviceRefValue::Index(n) => u32::try_from(*n)
                        .map(DeviceRef::Index)
                        .map_err(|_| "index must be >= 0".to_string()),
                    DeviceRefValue::Text(t) => parse_device_ref(t),
                }
                .map_err(|m| bad(format!("{field}[{i}]"), format!("`{v}`"), m))?;
                if refs.contains(&dr) {
                    return Err(bad(
                        format!("{field}[{i}]"),
                        format!("`{dr}`"),
                        "listed twice".into(),
                    ));
                }
                refs.push(dr);
            }
            DeviceSelector::List(refs)
        }
    })
}

fn shared_resources(
    section: &FileReplicas,
    kind: SharingKind,
    origin: &str,
) -> Result<Vec<SharedResource>> {
    let base = kind.field();
    let invalid = |field: String, value: String, message: String| ConfigError::Invalid {
        path: origin.to_string(),
        field,
        value,
        message,
    };
    let Some(resources) = section.resources.as_ref().filter(|r| !r.is_empty()) else {
        return Err(invalid(
            format!("{base}.resources"),
            "`[]`".into(),
            "no resources specified (drop the section to turn sharing off)".into(),
        ));
    };
    let rename_by_default = section.rename_by_default.unwrap_or(false);
    // The incumbent: nil means false for time-slicing and true for MPS.
    let fail_gt_one = section
        .fail_requests_greater_than_one
        .unwrap_or(kind == SharingKind::Mps);
    let mut out = Vec::with_capacity(resources.len());
    for (position, r) in resources.iter().enumerate() {
        let field = |name: &str| format!("{base}.resources[{position}].{name}");
        let name = qualify(&r.name);
        check_resource_name(&name)
            .map_err(|m| invalid(field("name"), format!("`{}`", r.name), m))?;
        let advertised_name = match &r.rename {
            Some(rn) if !rn.is_empty() => {
                let rn = qualify(rn);
                check_resource_name(&rn)
                    .map_err(|m| invalid(field("rename"), format!("`{rn}`"), m))?;
                rn
            }
            _ if rename_by_default => format!("{name}.shared"),
            _ => name.clone(),
        };
        check_resource_name(&advertised_name)
            .map_err(|m| invalid(field("name"), format!("`{advertised_name}`"), m))?;
        if r.replicas < 2 {
            return Err(invalid(
                field("replicas"),
                r.replicas.to_string(),
                "number of replicas must be >= 2 (drop the entry to turn sharing off)".into(),
            ));
        }
        let replicas = u32::try_from(r.replicas)
            .ok()
            .filter(|n| *n <= 1024)
            .ok_or_else(|| {
                invalid(
                    field("replicas"),
                    r.replicas.to_string(),
                    "at most 1024 replicas per device".into(),
                )
            })?;
        let devices = device_selector(r.devices.as_ref(), &field("devices"))
            .map_err(|(f, v, m)| invalid(f, v, m))?;
        let isolation = match (&r.isolation, kind) {
            (Some(s), _) => Isolation::parse(s).ok_or_else(|| {
                invalid(
                    field("isolation"),
                    format!("`{s}`"),
                    "expected none, memory, mps or memory+mps".into(),
                )
            })?,
            (None, SharingKind::Mps) => Isolation::Mps,
            (None, SharingKind::TimeSlicing) => Isolation::None,
        };
        if kind == SharingKind::Mps && !isolation.uses_mps() {
            return Err(invalid(
                field("isolation"),
                format!("`{}`", isolation.as_str()),
                "entries under sharing.mps always use MPS (mps or memory+mps)".into(),
            ));
        }
        let memory_per_replica = match &r.memory {
            None => None,
            Some(q) => {
                Some(parse_quantity(q).map_err(|m| invalid(field("memory"), format!("`{q}`"), m))?)
            }
        };
        out.push(SharedResource {
            kind,
            position,
            name,
            advertised_name,
            devices,
            replicas,
            isolation,
            memory_per_replica,
            fail_requests_greater_than_one: fail_gt_one,
            allow_multi_gpu: r.allow_multi_gpu.unwrap_or(false),
        });
    }
    Ok(out)
}

/// Add `nvidia.com/` when the name has no domain, as the incumbent does.
pub fn qualify(name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("nvidia.com/{name}")
    }
}

/// Kubernetes extended resource name rules: `<dns-domain>/<name>`, ≤ 63 characters in all
/// (the incumbent's limit), name part alphanumeric with `-`, `_`, `.` inside.
pub fn check_resource_name(name: &str) -> std::result::Result<(), String> {
    let Some((domain, rest)) = name.split_once('/') else {
        return Err("must be <domain>/<name>".into());
    };
    if name.len() > 63 {
        return Err(format!("{} characters; at most 63 allowed", name.len()));
    }
    let dns_ok = !domain.is_empty()
        && domain.split('.').all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if !dns_ok {
        return Err(format!("domain `{domain}` is not a lower-case DNS name"));
    }
    let name_ok = !rest.is_empty()
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && rest
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && rest
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if !name_ok {
        return Err(format!(
            "name `{rest}` must be alphanumeric with `-`, `_` or `.` inside"
        ));
    }
    Ok(())
}

/// Parse one `devices` entry given as a string.
pub fn parse_device_ref(s: &str) -> std::result::Result<DeviceRef, String> {
    let s = s.trim();
    if s.starts_with("GPU-") || s.starts_with("MIG-") {
        return Ok(DeviceRef::Uuid(s.to_string()));
    }
    if let Some((i, j)) = s.split_once(':') {
        if let (Ok(i), Ok(j)) = (i.parse(), j.parse()) {
            return Ok(DeviceRef::MigIndex(i, j));
        }
    } else if let Ok(i) = s.parse() {
        return Ok(DeviceRef::Index(i));
    }
    Err("expected a GPU index `i`, a MIG index `i:j`, a `GPU-…` or a `MIG-…` UUID".into())
}

/// Parse a memory quantity: bytes, or a number with a Ki/Mi/Gi/Ti (binary) or k/M/G/T
/// (decimal) suffix.
pub fn parse_quantity(q: &Quantity) -> std::result::Result<u64, String> {
    let text = match q {
        Quantity::Bytes(b) => return nonzero(*b),
        Quantity::Text(t) => t.trim(),
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (num, suffix) = text.split_at(split);
    let num: u64 = num
        .parse()
        .map_err(|_| "expected an integer with an optional Ki/Mi/Gi/Ti suffix".to_string())?;
    let mult: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown suffix `{other}` (use Ki, Mi, Gi, Ti, k, M, G, T)"
            ));
        }
    };
    nonzero(
        num.checked_mul(mult)
            .ok_or_else(|| "quantity overflows".to_string())?,
    )
}

/// [`parse_quantity`] of a quantity written as text (a flag, an environment variable).
pub fn parse_quantity_text(text: &str) -> std::result::Result<u64, String> {
    parse_quantity(&Quantity::Text(text.into()))
}

fn nonzero(b: u64) -> std::result::Result<u64, String> {
    if b == 0 {
        Err("must be greater than 0".into())
    } else {
        Ok(b)
    }
}

#[cfg(test)]
mod tests;
