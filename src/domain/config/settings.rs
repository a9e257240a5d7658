//! The settings table: every setting of the `flags` and `flags.plugin` sections, one entry
//! each, with its [`Config`] field, type, default, file key, raw form and check.
//!
//! The `settings!` macro turns the table into the validated [`Config`] (and its `Default`), the
//! file's section structs ([`FileFlags`], [`FilePluginFlags`], serde, unknown keys refused),
//! the command line's [`Overrides`] (one slot per setting, each value a [`Given`] that names
//! its flag or variable) and one `resolve` per section that applies the incumbent's
//! precedence (flag > env > file > default; the command line has already put a flag
//! over its variable) and blames a bad value on where it was written. The command line (`cli::args`)
//! declares each setting's flag and variable once, in a field named as its slot here.
//!
//! Adding a setting: one entry here, one field of the `cli::args` setting group of the commands it acts in, a test, a line in docs/src/configuration.md.
//! Sections with rules across fields (`flags.migLayouts`, `flags.dra`, `sharing`) have
//! their own functions in the parent module.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::file::{FileDra, FileMigLayouts, StringOrList};
use super::origin::{Given, Origin};
use super::values::{self, AllocationPolicy, DeviceIdStrategy, DeviceListStrategy, MigStrategy};
use super::{
    DEFAULT_CDI_ANNOTATION_PREFIX, DEFAULT_CDI_KIND, DraFlags, MigLayouts, Result, SharedResource,
};

/// The table's grammar (see the invocation below for an example of each part):
///
/// * `pub(crate) struct Config { field: Type = default, … }`: the fields of [`Config`] that no flag
///   or file key sets directly (filled by the section functions of the parent module);
/// * `pub(crate) struct Overrides { field: Raw, … }`: override slots of those section functions;
/// * `section FileX = "flags.x" { field: Type = default; "fileKey": Raw => check; … } also
///   { file-only fields }`: a section of the file. Each entry is a field of [`Config`] (its
///   doc and attributes go there), a key of the section's file struct holding `Raw` as
///   written, a slot of [`Overrides`], and a line of `FileX::resolve`: the override, else
///   the file's value, checked by `check(&Raw) -> Result<Type, Refusal>`, else `default` (an
///   expression that may name the section's earlier fields). `also` lists the file struct's
///   keys that are not settings (NVIDIA's ignored flags, nested sections).
macro_rules! settings {
    (
        $(#[$cmeta:meta])*
        pub(crate) struct $config:ident {
            $( $(#[$pmeta:meta])* $pfield:ident : $pty:ty = $pdefault:expr, )*
        }
        $(#[$ometa:meta])*
        pub(crate) struct $overrides:ident {
            $( $(#[$xmeta:meta])* $xfield:ident : $xty:ty, )*
        }
        $(
            $(#[$smeta:meta])*
            section $file:ident = $path:literal {
                $(
                    $(#[$fmeta:meta])*
                    $field:ident : $ty:ty = $default:expr ; $key:literal : $raw:ty => $check:expr ;
                )*
            } also {
                $( $(#[$emeta:meta])* $efield:ident : $ety:ty, )*
            }
        )*
    ) => {
        $(#[$cmeta])*
        pub(crate) struct $config {
            $( $(#[$pmeta])* pub(crate) $pfield: $pty, )*
            $( $( $(#[$fmeta])* pub(crate) $field: $ty, )* )*
        }

        impl Default for $config {
            fn default() -> Self {
                $( $( let $field: $ty = $default; )* )*
                Self {
                    $( $pfield: $pdefault, )*
                    $( $( $field, )* )*
                }
            }
        }

        $(#[$ometa])*
        #[derive(Debug, Clone, Default)]
        pub(crate) struct $overrides {
            $(
                $(
                    #[doc = concat!("`", $path, ".", $key, "` from a flag or an environment variable.")]
                    pub(crate) $field: Option<Given<$raw>>,
                )*
            )*
            $( $(#[$xmeta])* pub(crate) $xfield: Option<Given<$xty>>, )*
        }

        $(
            $(#[$smeta])*
            #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
            #[serde(rename_all = "camelCase", deny_unknown_fields)]
            pub(crate) struct $file {
                $(
                    #[doc = concat!("`", $path, ".", $key, "`.")]
                    #[serde(default, rename = $key)]
                    pub(crate) $field: Option<$raw>,
                )*
                $( $(#[$emeta])* pub(crate) $efield: $ety, )*
            }

            impl $file {
                /// Set this section's fields of `cfg`: each from its override, else from
                /// this file (`origin`), else its default. A bad value is blamed on where it
                /// was written.
                pub(super) fn resolve(
                    &self,
                    ov: &$overrides,
                    origin: &str,
                    cfg: &mut $config,
                ) -> Result<()> {
                    $(
                        let $field: $ty = match layered(
                            ov.$field.as_ref(),
                            self.$field.as_ref(),
                            origin,
                            concat!($path, ".", $key),
                        ) {
                            Some(given) => given.parse(|raw| $check(raw))?,
                            None => $default,
                        };
                    )*
                    $( cfg.$field = $field; )*
                    Ok(())
                }
            }
        )*
    };
}

/// The value that wins: the override (it carries its own origin), else the file's value,
/// named by the file and `field`.
fn layered<R: Clone>(
    over: Option<&Given<R>>,
    file: Option<&R>,
    path: &str,
    field: &str,
) -> Option<Given<R>> {
    match (over, file) {
        (Some(given), _) => Some(given.clone()),
        (None, Some(value)) => Some(Given::new(value.clone(), Origin::file(path, field))),
        (None, None) => None,
    }
}

settings! {
    /// A validated config.
    #[derive(Debug, Clone, PartialEq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub(crate) struct Config {
        /// Where it came from (file path, or `built-in defaults`).
        source: String = "built-in defaults".to_string(),
        /// Sharing entries in file order (time-slicing first, then MPS).
        sharing: Vec<SharedResource> = Vec::new(),
        /// The MIG layout the daemon takes idle GPUs to (`flags.migLayouts`).
        #[serde(skip_serializing_if = "Option::is_none")]
        mig_layouts: Option<MigLayouts> = None,
        /// `flags.dra` as the file says it; `run` resolves it with `--dra` /
        /// `--dra-driver-name` once at start (a front-end switch needs a restart).
        #[serde(skip_serializing_if = "DraFlags::is_unset")]
        dra: DraFlags = DraFlags::default(),
    }

    /// Settings given on the command line or in the environment, each with the flag or
    /// variable that set it; `Some` wins over the file. A value set through the library
    /// without naming its flag is blamed on "command-line setting".
    pub(crate) struct Overrides {
        /// `flags.migLayouts.file`: `--mig-layout-file` / `MIG_LAYOUT_FILE`.
        mig_layout_file: String,
        /// `flags.migLayouts.layout`: `--mig-layout` / `MIG_LAYOUT`.
        mig_layout: String,
    }

    /// `flags:`.
    section FileFlags = "flags" {
        /// MIG strategy.
        mig_strategy: MigStrategy = MigStrategy::None;
            "migStrategy": String => values::word;
        /// Exit when the backend cannot start (false: run with no devices).
        fail_on_init_error: bool = true;
            "failOnInitError": bool => values::boolean;
        /// Root of MPS pipe/log directories (`/run/nvidia/mps` when an MPS share needs one
        /// and none is set).
        mps_root: Option<PathBuf> = None;
            "mpsRoot": String => values::absolute_or_unset;
        /// Host driver root.
        driver_root: PathBuf = PathBuf::from("/");
            "nvidiaDriverRoot": String => values::path;
        /// Host root of `/dev` (CDI `hostPath` prefix); default: the driver root.
        dev_root: PathBuf = driver_root.clone();
            "nvidiaDevRoot": String => values::path;
    } also {
        #[serde(default)]
        gdrcopy_enabled: Option<bool>,
        #[serde(default)]
        gds_enabled: Option<bool>,
        #[serde(default)]
        mofed_enabled: Option<bool>,
        #[serde(default)]
        device_discovery_strategy: Option<String>,
        #[serde(default, rename = "useNodeFeatureAPI")]
        use_node_feature_api: Option<bool>,
        #[serde(default)]
        plugin: FilePluginFlags,
        /// `flags.migLayouts: {file, layout}`: the mig-parted layout the daemon applies to
        /// idle GPUs.
        #[serde(default)]
        mig_layouts: Option<FileMigLayouts>,
        /// `flags.dra: {enabled, driverName}`: serve the GPUs through DRA instead of the
        /// device-plugin API.
        #[serde(default)]
        dra: Option<FileDra>,
        /// GPU feature discovery flags: not used by a device plugin (the incumbent drops
        /// them too).
        #[serde(default)]
        gfd: Option<serde_yaml_ng::Value>,
    }

    /// `flags.plugin:`.
    section FilePluginFlags = "flags.plugin" {
        /// Also return DeviceSpecs in Allocate.
        pass_device_specs: bool = false;
            "passDeviceSpecs": bool => values::boolean;
        /// Allocate response formats.
        device_list_strategy: Vec<DeviceListStrategy> = vec![DeviceListStrategy::Envvar];
            "deviceListStrategy": StringOrList => values::strategies;
        /// IDs shown to the runtime in env/mounts.
        device_id_strategy: DeviceIdStrategy = DeviceIdStrategy::Uuid;
            "deviceIDStrategy": String => values::word;
        /// Prefix of CDI annotations.
        cdi_annotation_prefix: String = DEFAULT_CDI_ANNOTATION_PREFIX.to_string();
            "cdiAnnotationPrefix": String => values::annotation_prefix;
        /// Where this process sees `driver_root` when it runs in a container
        /// (`flags.plugin.containerDriverRoot`, e.g. `/host`); `None`: at `driver_root`.
        #[serde(skip_serializing_if = "Option::is_none")]
        container_driver_root: Option<PathBuf> = None;
            "containerDriverRoot": String => values::absolute_or_unset;
        /// Preferred-allocation policy for replicas and MIG.
        allocation_policy: AllocationPolicy = AllocationPolicy::Distributed;
            "sharedDevicesAllocationPolicy": String => values::word;
        /// CDI kind of the generated spec (a gpu-slicer extension).
        cdi_kind: String = DEFAULT_CDI_KIND.to_string();
            "cdiKind": String => values::cdi_kind;
    } also {
        #[serde(default, rename = "nvidiaCTKPath")]
        nvidia_ctk_path: Option<String>,
    }
}
