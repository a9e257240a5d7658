//! Config: what the operator asked for, in NVIDIA k8s-device-plugin `version: v1` form.
//!
//! [`parse`] takes the text of a YAML or JSON file ([`file`](mod@file) holds the raw shape; reading it is
//! `platform::config_file::load`), applies CLI/env [`Overrides`] with the incumbent's
//! precedence (flag > env > file > default) and returns a validated [`Config`]. Each setting
//! of `flags` and `flags.plugin` is one entry of the [`settings`] table; its value travels
//! with its [`Origin`] so a bad one is blamed on the flag, variable or file field that set
//! it. One function per section here ([`from_file_config`] calls them in file order); the
//! `sharing` entries are checked in [`sharing`]. Checks that need the inventory (does
//! `devices: [7]` exist?) happen in the planner, which names the same file and field. Pure:
//! warnings come back as [`ConfigWarning`] values for the caller to log.

use std::path::PathBuf;

use serde::Serialize;

pub(crate) mod file;
mod origin;
mod quantity;
mod settings;
mod sharing;
mod values;

use file::{
    FileConfig, FileDevices, FileDra, FileImex, FileMigLayouts, FileResources, FileSharing,
};

pub(crate) use crate::domain::cdi_kind::DEFAULT_CDI_KIND;
pub(crate) use origin::{Given, Origin};
pub(crate) use quantity::QuantityError;
pub(crate) use quantity::format_quantity;
#[cfg(test)]
pub(crate) use quantity::parse_quantity;
pub(crate) use quantity::parse_quantity_text;
pub(crate) use settings::{Config, Overrides};
pub(crate) use sharing::{DeviceRef, DeviceSelector, SharedResource, SharingKind};
pub(crate) use values::{
    AllocationPolicy, DeviceIdStrategy, DeviceListStrategy, Isolation, MigStrategy,
};

/// Default prefix of CDI container annotations.
pub(crate) const DEFAULT_CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// `mpsRoot` when an MPS share needs one and none is set (NVIDIA's default).
const DEFAULT_MPS_ROOT: &str = "/run/nvidia/mps";

/// Errors loading or validating a config.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
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
pub(crate) type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// `flags.dra`: the file's DRA mode settings (unvalidated: the driver name is checked where
/// the mode is resolved, with the flags that override it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DraFlags {
    /// `flags.dra.enabled`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) enabled: Option<bool>,
    /// `flags.dra.driverName`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) driver_name: Option<String>,
    /// `flags.dra.dynamicMig`: the GPUs (`all` or a `devices`-style list of GPU indices and
    /// UUIDs) whose MIG instances the DRA driver creates per claim; `None`: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) dynamic_mig: Option<DeviceSelector>,
}

impl DraFlags {
    /// Nothing set in the file.
    pub(crate) fn is_unset(&self) -> bool {
        self.enabled.is_none() && self.driver_name.is_none() && self.dynamic_mig.is_none()
    }
}

/// `flags.migLayouts`: a mig-parted config file and the layout of it to apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct MigLayouts {
    /// The mig-parted file.
    pub(crate) file: PathBuf,
    /// A key of its `mig-configs`.
    pub(crate) layout: String,
}

/// Something in a config worth a warning that does not stop the load; the caller logs it
/// (the domain does no logging).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConfigWarning {
    /// The `resources` field (pattern-based naming) is set: accepted but ignored.
    IgnoredResources {
        /// The config's origin (file path).
        config: String,
    },
    /// The file holds no settings (empty, or only comments): a ConfigMap key left blank
    /// or a wrong file, which would silently serve the defaults.
    Empty {
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
            ConfigWarning::Empty { .. } => f.write_str(
                "the config file holds no settings (empty or only comments): the defaults apply and nothing is shared",
            ),
        }
    }
}

/// The defaults with overrides applied (no file given).
pub(crate) fn defaults(overrides: &Overrides) -> Result<Config> {
    from_file_config(FileConfig::default(), "built-in defaults", overrides).map(|(c, _)| c)
}

/// [`parse`], also returning the warnings for the caller to log.
pub(crate) fn parse_reporting(
    text: &str,
    origin: &str,
    overrides: &Overrides,
) -> Result<(Config, Vec<ConfigWarning>)> {
    let raw = parse_file(text, origin)?;
    let (cfg, mut warnings) = from_file_config(raw, origin, overrides)?;
    if holds_nothing(text) {
        warnings.insert(
            0,
            ConfigWarning::Empty {
                config: origin.to_string(),
            },
        );
    }
    Ok((cfg, warnings))
}

/// Whether config text has no YAML content at all (blank, or comments only).
fn holds_nothing(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with('#') || l == "---")
}

/// Parse config text. `origin` names the source in errors.
pub(crate) fn parse(text: &str, origin: &str, overrides: &Overrides) -> Result<Config> {
    parse_reporting(text, origin, overrides).map(|(c, _)| c)
}

/// Parse the raw file shape, reporting the dotted path of the offending field.
pub(crate) fn parse_file(text: &str, origin: &str) -> Result<FileConfig> {
    let parse_err = |field: String, message: String| ConfigError::Parse {
        path: origin.to_string(),
        field,
        message,
    };
    if holds_nothing(text) {
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

/// The config a file describes, with the overrides over it: one function per section, in
/// file order.
fn from_file_config(
    raw: FileConfig,
    origin: &str,
    ov: &Overrides,
) -> Result<(Config, Vec<ConfigWarning>)> {
    version(raw.version.as_deref(), origin)?;
    let mut cfg = Config {
        source: origin.to_string(),
        ..Config::default()
    };
    let flags = &raw.flags;
    flags.resolve(ov, origin, &mut cfg)?;
    cfg.mig_layouts = mig_layouts(flags.mig_layouts.as_ref(), ov, origin)?;
    cfg.dra = dra(flags.dra.as_ref(), origin)?;
    flags.plugin.resolve(ov, origin, &mut cfg)?;
    imex(raw.imex.as_ref(), origin)?;
    let warnings = resources(raw.resources.as_ref(), origin);
    cfg.sharing = sharing_entries(&raw.sharing, origin)?;
    if cfg.sharing.iter().any(|s| s.isolation.uses_mps()) && cfg.mps_root.is_none() {
        cfg.mps_root = Some(PathBuf::from(DEFAULT_MPS_ROOT));
    }
    Ok((cfg, warnings))
}

/// `version`: `v1`, or empty.
fn version(version: Option<&str>, origin: &str) -> Result<()> {
    match version {
        None | Some("") | Some("v1") => Ok(()),
        Some(v) => {
            Err(Origin::file(origin, "version").invalid(v, "unknown version (expected `v1`)"))
        }
    }
}

/// `flags.migLayouts`: a file and a layout, each from its flag or the file; both or neither
/// (empty counts as unset). A missing half is blamed on what would have set it.
fn mig_layouts(
    file: Option<&FileMigLayouts>,
    ov: &Overrides,
    origin: &str,
) -> Result<Option<MigLayouts>> {
    let file = file.cloned().unwrap_or_default();
    let pick = |slot: &Option<Given<String>>, written: Option<String>| {
        slot.as_ref()
            .map(|g| g.value.clone())
            .or(written)
            .filter(|s| !s.is_empty())
    };
    let blame = |slot: &Option<Given<String>>, field: &str| {
        slot.as_ref()
            .map_or_else(|| Origin::file(origin, field), |g| g.origin.clone())
    };
    match (
        pick(&ov.mig_layout_file, file.file),
        pick(&ov.mig_layout, file.layout),
    ) {
        (None, None) => Ok(None),
        (Some(file), Some(layout)) => Ok(Some(MigLayouts {
            file: PathBuf::from(file),
            layout,
        })),
        (Some(file), None) => Err(blame(&ov.mig_layout, "flags.migLayouts.layout")
            .invalid("(unset)", format!("required with the layout file {file}"))),
        (None, Some(layout)) => Err(blame(&ov.mig_layout_file, "flags.migLayouts.file")
            .invalid("(unset)", format!("required with the layout `{layout}`"))),
    }
}

/// `flags.dra`, as written (an empty driver name is unset); `run` resolves it with its flags.
fn dra(file: Option<&FileDra>, origin: &str) -> Result<DraFlags> {
    let Some(d) = file else {
        return Ok(DraFlags::default());
    };
    Ok(DraFlags {
        enabled: d.enabled,
        driver_name: d.driver_name.clone().filter(|s| !s.is_empty()),
        dynamic_mig: d
            .dynamic_mig
            .as_ref()
            .map(|v| dynamic_mig(v, origin))
            .transpose()?,
    })
}

/// `flags.dra.dynamicMig` as a GPU selector: like a sharing entry's `devices`, but GPUs
/// only (a MIG index names a slice, not a GPU whose slices are made on demand).
fn dynamic_mig(value: &FileDevices, origin: &str) -> Result<DeviceSelector> {
    const FIELD: &str = "flags.dra.dynamicMig";
    let selector = sharing::device_selector(Some(value), origin, FIELD)?;
    if let DeviceSelector::List(refs) = &selector
        && let Some((i, r)) = refs.iter().enumerate().find(|(_, r)| {
            matches!(r, DeviceRef::MigIndex(..))
                || matches!(r, DeviceRef::Uuid(u) if u.starts_with("MIG-"))
        })
    {
        return Err(Origin::file(origin, &format!("{FIELD}[{i}]"))
            .invalid(r, "names a MIG device; list GPUs (index or GPU UUID)"));
    }
    Ok(selector)
}

/// `imex`: accepted for compatibility; only `channelIDs: []` or `[0]`, as upstream.
fn imex(imex: Option<&FileImex>, origin: &str) -> Result<()> {
    match imex {
        Some(imex) if !(imex.channel_ids.is_empty() || imex.channel_ids == [0]) => {
            Err(Origin::file(origin, "imex.channelIDs").invalid(
                format!("{:?}", imex.channel_ids),
                "only [] or [0] are valid",
            ))
        }
        _ => Ok(()),
    }
}

/// `resources` (pattern-based naming): accepted and ignored with a warning, as upstream.
fn resources(resources: Option<&FileResources>, origin: &str) -> Vec<ConfigWarning> {
    match resources {
        Some(res) if !res.gpus.is_empty() || !res.mig.is_empty() => {
            vec![ConfigWarning::IgnoredResources {
                config: origin.to_string(),
            }]
        }
        _ => Vec::new(),
    }
}

/// `sharing`: time-slicing entries, then MPS entries.
fn sharing_entries(raw: &FileSharing, origin: &str) -> Result<Vec<SharedResource>> {
    let mut out = Vec::new();
    if let Some(ts) = &raw.time_slicing {
        out.extend(sharing::shared_resources(
            ts,
            SharingKind::TimeSlicing,
            origin,
        )?);
    }
    if let Some(mps) = &raw.mps {
        out.extend(sharing::shared_resources(mps, SharingKind::Mps, origin)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
