//! `gpu-slicer cdi generate | validate | list | remove`.
//!
//! Loads the inventory (sim backend for now) and the config, calls [`crate::domain::cdi`] to build,
//! check and write specs, and prints one line per result to the writer it is given.
//! Argument structs live here so the top-level `crate::cli::args` only nests them.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use crate::domain::cdi::{
    self, CdiError, Format, GenerateOptions, HostProbe, Result, spec_file_name,
};
use crate::domain::config::{self, Config, Overrides};
use crate::domain::inventory::Inventory;
use crate::platform::cdi_writer::WriteOutcome;

/// `gpu-slicer cdi …`.
#[derive(Debug, Clone, Subcommand)]
pub enum CdiCommand {
    /// Generate the CDI spec for this node's GPUs and MIG devices.
    Generate(CdiGenerateArgs),
    /// Check spec files against the rules every supported runtime enforces.
    Validate(CdiValidateArgs),
    /// Print the qualified device names (`vendor/class=name`) spec files offer.
    List(CdiListArgs),
    /// Remove the spec file `generate` would write.
    Remove(CdiRemoveArgs),
}

/// Arguments of `cdi generate`.
#[derive(Debug, Clone, Args)]
pub struct CdiGenerateArgs {
    /// Where the inventory comes from (`--backend`, `--nvml-lib`, `--proc-root`).
    #[command(flatten)]
    pub backend: crate::cli::args::BackendArgs,
    /// Config file (NVIDIA `version: v1` format); its `flags.plugin.cdiKind`,
    /// `flags.nvidiaDevRoot`, `flags.mpsRoot` and `sharing` (per-share devices) are used.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// CDI kind `vendor/class` (overrides the config).
    #[arg(long)]
    pub kind: Option<String>,
    /// Directory to write `<vendor>-<class>.<format>` into, or `-` for stdout.
    #[arg(long, default_value = cdi::DEFAULT_SPEC_DIR)]
    pub output: String,
    /// Encoding: yaml or json.
    #[arg(long, default_value = "yaml")]
    pub format: Format,
    /// Host root under which `/dev` is found (hostPath = DIR + /dev/…); nodes found there
    /// get their type and numbers, missing control nodes are left out.
    #[arg(long)]
    pub dev_root: Option<PathBuf>,
    /// The memory-limit hook written into per-share devices.
    #[command(flatten)]
    pub hook: HookArgs,
}

/// Where the `set-memory-limit` CDI hook is on the host, and what it is told. Shared by
/// `cdi generate` and `run`.
#[derive(Debug, Clone, Default, Args)]
pub struct HookArgs {
    /// Absolute HOST path of the gpu-slicer binary the runtime runs as the CDI hook
    /// (default: this executable). In a DaemonSet, the host path the binary is copied to.
    #[arg(long, env = "CDI_HOOK_PATH")]
    pub cdi_hook_path: Option<PathBuf>,
    /// NVML library the hook loads (default: `--nvml-lib` when given, else the system's
    /// libnvidia-ml.so.1).
    #[arg(long, env = "CDI_HOOK_NVML_LIB")]
    pub cdi_hook_nvml_lib: Option<PathBuf>,
    /// `KEY=VALUE` environment of the hook process (repeat the flag; comma list in the env).
    #[arg(long, env = "CDI_HOOK_ENV", value_delimiter = ',')]
    pub cdi_hook_env: Vec<String>,
}

impl HookArgs {
    /// The hook settings, `nvml_lib` being the backend's `--nvml-lib`. The path must be
    /// absolute: runtimes execute it from their own working directory.
    pub fn settings(&self, nvml_lib: Option<&Path>) -> Result<cdi::shares::HookSettings> {
        let path = match &self.cdi_hook_path {
            Some(p) => p.clone(),
            None => cdi::shares::HookSettings::current_exe(None)?.path,
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
        Ok(cdi::shares::HookSettings {
            path,
            nvml_lib: self
                .cdi_hook_nvml_lib
                .clone()
                .or_else(|| nvml_lib.map(Path::to_path_buf)),
            env: self.cdi_hook_env.clone(),
        })
    }
}

/// Arguments of `cdi validate`.
#[derive(Debug, Clone, Args)]
pub struct CdiValidateArgs {
    /// Spec files to check.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Arguments of `cdi list`.
#[derive(Debug, Clone, Args)]
pub struct CdiListArgs {
    /// Spec files to read.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Arguments of `cdi remove`.
#[derive(Debug, Clone, Args)]
pub struct CdiRemoveArgs {
    /// Config file whose CDI kind names the spec.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// CDI kind `vendor/class` (overrides the config).
    #[arg(long)]
    pub kind: Option<String>,
    /// Directory holding the spec.
    #[arg(long, default_value = cdi::DEFAULT_SPEC_DIR)]
    pub output: PathBuf,
    /// Encoding the spec was written in (the file in the other encoding is removed too).
    #[arg(long, default_value = "yaml")]
    pub format: Format,
}

/// Run one `cdi` subcommand.
pub fn run(cmd: &CdiCommand, out: &mut dyn Write) -> Result<()> {
    match cmd {
        CdiCommand::Generate(a) => generate(a, out),
        CdiCommand::Validate(a) => validate(a, out),
        CdiCommand::List(a) => list(a, out),
        CdiCommand::Remove(a) => remove(a, out),
    }
}

fn load_config(path: Option<&Path>, kind: Option<&String>) -> Result<Config> {
    let overrides = Overrides {
        cdi_kind: kind.cloned(),
        ..Overrides::default()
    };
    Ok(config::load(path, &overrides)?)
}

/// Discover the inventory behind `--backend`, as every other command does.
pub fn load_inventory(backend: &crate::cli::args::BackendArgs) -> Result<Inventory> {
    Ok(super::backend::open_backend(backend)?.discover()?)
}

fn written(out: &mut dyn Write, text: std::fmt::Arguments<'_>) -> Result<()> {
    out.write_fmt(text)
        .and_then(|()| out.flush())
        .map_err(|source| CdiError::Io {
            path: PathBuf::from("<stdout>"),
            source,
        })
}

/// `cdi generate`: build, check and write (or print) the spec. Nothing is written when any
/// check fails, so an existing good spec stays in place.
pub fn generate(args: &CdiGenerateArgs, out: &mut dyn Write) -> Result<()> {
    let cfg = load_config(args.config.as_deref(), args.kind.as_ref())?;
    // The config's default dev root `/` means "the real /dev": no hostPath needed.
    let dev_root = args
        .dev_root
        .clone()
        .or_else(|| (cfg.dev_root != Path::new("/")).then(|| cfg.dev_root.clone()));
    if let Some(root) = &dev_root {
        HostProbe::check_root(root)?;
    }
    let inv = load_inventory(&args.backend)?;
    // The plan says which devices are split how many ways: their shares get devices.
    let plan = crate::domain::plan::build(&inv, &cfg)?;
    let opts = GenerateOptions {
        kind: cfg.cdi_kind.clone(),
        dev_root,
        shares: Some(cdi::shares::ShareOptions {
            plan,
            mps_root: cfg.mps_root.clone(),
            hook: args.hook.settings(args.backend.nvml_lib.as_deref())?,
        }),
    };
    let spec = cdi::generate(&inv, &opts, &HostProbe)?;
    let bytes = spec.to_bytes(args.format)?;
    if args.output == "-" {
        out.write_all(&bytes).map_err(|source| CdiError::Io {
            path: PathBuf::from("<stdout>"),
            source,
        })?;
        return Ok(());
    }
    let dir = PathBuf::from(&args.output);
    let name = spec_file_name(&spec.kind, args.format);
    let what = match crate::platform::cdi_writer::write_spec(&dir, &name, &bytes)? {
        WriteOutcome::Written => "wrote",
        WriteOutcome::Unchanged => "unchanged",
    };
    written(
        out,
        format_args!(
            "{what} {} ({} devices, cdiVersion {})\n",
            dir.join(&name).display(),
            spec.devices.len(),
            spec.cdi_version
        ),
    )
}

/// `cdi validate`: one line per file; an error when any file is invalid.
pub fn validate(args: &CdiValidateArgs, out: &mut dyn Write) -> Result<()> {
    let mut failures = Vec::new();
    for path in &args.files {
        match cdi::validate::validate_file(path) {
            Ok(spec) => written(
                out,
                format_args!(
                    "ok {}: {}, {} devices, cdiVersion {}\n",
                    path.display(),
                    spec.kind,
                    spec.devices.len(),
                    spec.cdi_version
                ),
            )?,
            Err(e) => failures.push(e),
        }
    }
    match failures.len() {
        0 => Ok(()),
        1 if args.files.len() == 1 => Err(failures.remove(0)),
        failed => {
            for e in &failures {
                written(out, format_args!("invalid: {e}\n"))?;
            }
            Err(CdiError::SomeInvalid {
                failed,
                total: args.files.len(),
            })
        }
    }
}

/// `cdi list`: the qualified names of every device in the (valid) files, sorted.
pub fn list(args: &CdiListArgs, out: &mut dyn Write) -> Result<()> {
    let mut names = Vec::new();
    for path in &args.files {
        names.extend(cdi::validate::validate_file(path)?.qualified_names());
    }
    names.sort();
    for n in names {
        written(out, format_args!("{n}\n"))?;
    }
    Ok(())
}

/// `cdi remove`: delete the spec file for the configured kind, in both formats (a stale
/// twin in the other format would keep offering the devices), if present.
pub fn remove(args: &CdiRemoveArgs, out: &mut dyn Write) -> Result<()> {
    let cfg = load_config(args.config.as_deref(), args.kind.as_ref())?;
    let name = spec_file_name(&cfg.cdi_kind, args.format);
    let removed = crate::platform::cdi_writer::remove_spec(&args.output, &name)?;
    if removed.is_empty() {
        return written(
            out,
            format_args!("absent {}\n", args.output.join(&name).display()),
        );
    }
    for path in removed {
        written(out, format_args!("removed {}\n", path.display()))?;
    }
    Ok(())
}
