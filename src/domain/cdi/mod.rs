//! CDI (Container Device Interface) provider: the spec model, the generator and the checks.
//!
//! [`generate`](fn@generate) turns an [`Inventory`](crate::domain::inventory::Inventory) into a [`Spec`] (pure;
//! host device nodes are looked up through an injected [`generate::NodeProbe`]).
//! [`validate`](fn@validate) applies the rules that every runtime we target (Podman 4.3.1, containerd
//! 1.7, CRI-O) enforces when it loads a file; `crate::platform::cdi_writer` puts the file
//! in place atomically. The device plugin names devices with [`qualified_name`]; the CLI
//! (`crate::cli::cdi`) wires these together. Container runtimes are the only readers
//! of our output, so the types here are strict: they carry exactly the 0.3.0–0.5.0 field
//! set, because every CDI parser rejects a file with a key it does not know.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub(crate) mod foreign;
pub(crate) mod generate;
pub(crate) mod naming;
pub(crate) mod shares;
pub(crate) mod validate;
pub(crate) mod yaml;

// `NoProbe` serves the tests and the bench support only.
#[cfg(any(test, feature = "testkit"))]
pub(crate) use generate::NoProbe;
pub(crate) use generate::{GenerateOptions, generate};
pub(crate) use validate::{minimum_version, validate};

/// Spec versions we write or accept, oldest first. 0.1.0/0.2.0 are pre-release schemas that
/// current libraries reject; 0.6.0 and later cannot be loaded by Podman 4.3 or containerd
/// 1.7.0–1.7.11, so a spec that needs them is refused rather than written.
pub(crate) const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.4.0", "0.5.0"];

/// Directory that dynamically generated specs go to (runtimes also scan `/etc/cdi`, which
/// has lower priority).
pub(crate) const DEFAULT_SPEC_DIR: &str = "/var/run/cdi";

/// Env entry that stops an image's baked-in `NVIDIA_VISIBLE_DEVICES` from widening access
/// through the NVIDIA container runtime hook.
pub(crate) const VISIBLE_DEVICES_VOID: &str = "NVIDIA_VISIBLE_DEVICES=void";

/// Errors generating, checking or writing a CDI spec. Each names the device, rule or path
/// concerned.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CdiError {
    /// `kind` breaks the vendor/class rules.
    #[error("invalid CDI kind `{kind}`: {rule}")]
    Kind {
        kind: String,
        rule: crate::domain::cdi_kind::CdiKindError,
    },
    /// A device name breaks the naming rules.
    #[error("invalid CDI device name `{device}`: {rule}")]
    DeviceName { device: String, rule: String },
    /// Two devices share a name (runtimes reject the whole spec).
    #[error("duplicate CDI device `{device}`: runtimes reject a spec that names a device twice")]
    DuplicateDevice { device: String },
    /// A device (or the spec) breaks a container-edits rule.
    #[error("CDI device `{device}`: {rule}")]
    Edits { device: String, rule: String },
    /// The spec has no devices.
    #[error("CDI spec has no devices: runtimes from CDI 1.0 on reject it")]
    NoDevices,
    /// `cdiVersion` is unknown, too new for our targets, or older than the features need.
    #[error("cdiVersion `{version}`: {rule}")]
    Version { version: String, rule: String },
    /// A MIG device lacks the capability minors that isolate it.
    #[error(
        "MIG device `{device}` has no {which} capability minor: without its /dev/nvidia-caps node the slice cannot be isolated"
    )]
    MissingCapMinor { device: String, which: &'static str },
    /// The CDI hook binary path cannot be used in a spec.
    #[error("CDI hook path {path}: {rule}")]
    HookPath { path: PathBuf, rule: String },
    /// `--dev-root` does not exist or is not a directory.
    #[error("dev root {path}: {rule}")]
    DevRoot { path: PathBuf, rule: String },
    /// A spec file or directory given on the command line does not exist.
    #[error("{path}: no such spec file or directory")]
    NotFound { path: PathBuf },
    /// A spec file has a name runtimes do not scan.
    #[error("spec file {path}: {rule}")]
    FileName { path: PathBuf, rule: String },
    /// A spec file could not be parsed.
    #[error("cannot parse CDI spec {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A spec file failed a check (wraps the rule error with the file it came from).
    #[error("{path}: {source}")]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<CdiError>,
    },
    /// Devices defined by two files of one directory (runtimes drop them).
    #[error("{count} CDI device name conflicts between spec files of one directory")]
    Conflicts { count: usize },
    /// Several files were checked and some failed.
    #[error("{failed} of {total} CDI spec files invalid")]
    SomeInvalid { failed: usize, total: usize },
    /// Serialising the spec failed.
    #[error("cannot serialise CDI spec: {0}")]
    Serialize(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The backend could not produce an inventory.
    #[error(transparent)]
    Inventory(#[from] crate::domain::inventory::InventoryError),
    /// The config does not fit this node's inventory.
    #[error(transparent)]
    Plan(#[from] crate::domain::plan::PlanError),
    /// The config file was invalid.
    #[error(transparent)]
    Config(#[from] crate::domain::config::ConfigError),
}

/// Result alias for this module.
pub(crate) type Result<T, E = CdiError> = std::result::Result<T, E>;

/// A CDI spec file, limited to the fields CDI 0.3.0–0.5.0 define.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Spec {
    /// Spec version, e.g. `0.5.0`.
    pub(crate) cdi_version: String,
    /// `vendor/class`.
    pub(crate) kind: String,
    /// The devices, sorted by name.
    pub(crate) devices: Vec<Device>,
    /// Edits applied once for any device of this spec.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub(crate) container_edits: ContainerEdits,
}

/// One CDI device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Device {
    /// Name inside the kind (`GPU-…`, `0`, `0:1`, `all`).
    pub(crate) name: String,
    /// What the runtime does to a container that gets this device.
    #[serde(default)]
    pub(crate) container_edits: ContainerEdits,
}

/// Changes a runtime applies to the OCI spec of a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ContainerEdits {
    /// `KEY=VALUE` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) env: Vec<String>,
    /// Device nodes to create.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) device_nodes: Vec<DeviceNode>,
    /// Mounts to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) mounts: Vec<Mount>,
    /// OCI hooks to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) hooks: Vec<Hook>,
}

impl ContainerEdits {
    /// True when no edit is present (runtimes reject a device with empty edits).
    pub(crate) fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
    }
}

/// A device node in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct DeviceNode {
    /// Path in the container.
    pub(crate) path: String,
    /// Host node to stat (CDI 0.5.0); the runtime uses `path` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) host_path: Option<String>,
    /// `c`, `b`, `u` or `p`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub(crate) node_type: Option<String>,
    /// Major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) minor: Option<i64>,
    /// Go `os.FileMode` bits (a number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) file_mode: Option<u32>,
    /// cgroup access, letters from `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) permissions: Option<String>,
    /// Owner in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) uid: Option<u32>,
    /// Group in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) gid: Option<u32>,
}

impl DeviceNode {
    /// A node with only its container path (and optional host path) set.
    pub(crate) fn at(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            host_path: None,
            node_type: None,
            major: None,
            minor: None,
            file_mode: None,
            permissions: None,
            uid: None,
            gid: None,
        }
    }
}

/// A mount in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Mount {
    /// Source on the host.
    pub(crate) host_path: String,
    /// Destination in the container.
    pub(crate) container_path: String,
    /// Mount type (CDI 0.4.0).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub(crate) mount_type: Option<String>,
    /// Mount options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) options: Vec<String>,
}

/// An OCI hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Hook {
    /// OCI hook point (`createContainer`, …).
    pub(crate) hook_name: String,
    /// Executable on the host.
    pub(crate) path: String,
    /// Arguments, `argv[0]` first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) args: Vec<String>,
    /// `KEY=VALUE` environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) env: Vec<String>,
    /// Seconds; must be positive when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) timeout: Option<i64>,
}

/// Output encoding of a spec file (`pub`: the bench support re-exports it).
#[cfg_attr(not(feature = "testkit"), allow(unreachable_pub))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// YAML (`.yaml`), the runtimes' own convention.
    #[default]
    Yaml,
    /// JSON (`.json`).
    Json,
}

impl Format {
    /// File extension, without the dot.
    pub(crate) fn extension(self) -> &'static str {
        match self {
            Format::Yaml => "yaml",
            Format::Json => "json",
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "yaml" => Ok(Format::Yaml),
            "json" => Ok(Format::Json),
            other => Err(format!("unknown format `{other}`: expected yaml or json")),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.extension())
    }
}

/// `<kind>=<device>`: the name a runtime (or the kubelet's `cdi_devices`) asks for.
pub(crate) fn qualified_name(kind: &str, device: &str) -> String {
    format!("{kind}={device}")
}

/// Whether the spec carries the host's user-space driver (libraries, binaries, hooks): always
/// on a real driver (an NVML inventory), and on a sim node only when a driver root other than
/// `/` is given (a fake driver root in tests and demos). `cdi generate` and the daemon's
/// reloader both ask here, so a spec written by either has the same shape.
pub(crate) fn equips_driver(
    inventory: &crate::domain::inventory::Inventory,
    driver_root: &std::path::Path,
) -> bool {
    inventory.source == crate::domain::inventory::NVML_SOURCE
        || driver_root != std::path::Path::new("/")
}

/// Default file name of the spec for `kind`: `<vendor>-<class>.<ext>`.
pub(crate) fn spec_file_name(kind: &str, format: Format) -> String {
    format!("{}.{}", kind.replace('/', "-"), format.extension())
}

impl Spec {
    /// Serialise in `format`. YAML quotes `cdiVersion` so no YAML reader can take it for a
    /// number, and device names such as `1:0` so no YAML 1.1 reader takes them for
    /// base-60 integers; both encodings end in a newline and are deterministic for a
    /// given spec.
    pub(crate) fn to_bytes(&self, format: Format) -> Result<Vec<u8>> {
        match format {
            Format::Json => {
                let mut s = serde_json::to_string_pretty(self)
                    .map_err(|e| CdiError::Serialize(e.to_string()))?;
                s.push('\n');
                Ok(s.into_bytes())
            }
            // Written from the model (see `yaml`): a generic YAML emitter took six times
            // the JSON time on large specs.
            Format::Yaml => Ok(yaml::emit(self).into_bytes()),
        }
    }

    /// Parse a spec file's text. Runtimes parse every file as YAML (JSON is a subset), so
    /// we do too; unknown keys are errors, as in every CDI library.
    pub(crate) fn parse(text: &str, path: &std::path::Path) -> Result<Self> {
        if text.trim().is_empty() {
            return Err(CdiError::Parse {
                path: path.to_path_buf(),
                message: "empty file".into(),
            });
        }
        serde_yaml_ng::from_str(text).map_err(|e| CdiError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Qualified names of all devices, in spec order.
    pub(crate) fn qualified_names(&self) -> Vec<String> {
        self.devices
            .iter()
            .map(|d| qualified_name(&self.kind, &d.name))
            .collect()
    }
}

#[cfg(test)]
mod cdi_tests;
