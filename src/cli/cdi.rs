//! `gpu-slicer cdi generate | validate | list | remove`.
//!
//! Loads the inventory (sim backend for now) and the config, calls [`crate::domain::cdi`] to build,
//! check and write specs, and prints one line per result to the writer it is given.
//! Argument structs live here so the top-level `crate::cli::args` only nests them.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use crate::domain::cdi::{self, CdiError, Format, GenerateOptions, Result, spec_file_name};
use crate::domain::config::{Config, Overrides};
use crate::domain::inventory::Inventory;
use crate::platform::cdi_host::HostProbe;
use crate::platform::cdi_writer::WriteOutcome;

/// `gpu-slicer cdi …`.
#[derive(Debug, Clone, Subcommand)]
pub(crate) enum CdiCommand {
    /// Generate the CDI spec for this node's GPUs and MIG devices.
    Generate(Box<CdiGenerateArgs>),
    /// Check spec files against the rules every supported runtime enforces.
    Validate(CdiValidateArgs),
    /// Print the qualified device names (`vendor/class=name`) spec files offer.
    List(CdiListArgs),
    /// Remove the spec file `generate` would write.
    Remove(CdiRemoveArgs),
}

/// Arguments of `cdi generate`.
#[derive(Debug, Clone, Args)]
pub(crate) struct CdiGenerateArgs {
    /// Where the inventory comes from (`--backend`, `--nvml-lib`, `--proc-root`).
    #[command(flatten)]
    pub(crate) backend: crate::cli::args::BackendArgs,
    /// `--config` (its `flags.plugin.cdiKind`, `flags.nvidiaDevRoot`, `flags.mpsRoot`,
    /// `sharing` for per-share devices, …) and `--mig-strategy`, read as every planning
    /// command reads them.
    #[command(flatten)]
    pub(crate) config: crate::cli::args::PlanConfigArgs,
    /// `--cdi-kind` (over the config's).
    #[command(flatten)]
    pub(crate) kind: crate::cli::args::KindSettingArgs,
    /// The settings that shape the spec (`--driver-root`, `--dev-root`, `--mps-root`,
    /// `--container-driver-root`), as `run` reads them.
    #[command(flatten)]
    pub(crate) spec: crate::cli::args::SpecSettingArgs,
    /// A spec file (`PATH.yaml` / `PATH.json`, the extension sets the encoding), a
    /// directory to write `<vendor>-<class>.<format>` into, or `-` for stdout.
    #[arg(long, default_value = cdi::DEFAULT_SPEC_DIR)]
    pub(crate) output: String,
    /// Encoding: yaml or json (default: from the `--output` file's extension, else yaml).
    #[arg(long, value_parser = spec_format())]
    pub(crate) format: Option<Format>,
    /// Extra folder (inside the driver root) to look for driver libraries in; repeatable.
    #[arg(long = "library-search-path")]
    pub(crate) library_search_path: Vec<PathBuf>,
    /// Device names: index (`0`, `1:3`), uuid (`GPU-…`), type-index (`gpu0`, `mig1:3`);
    /// repeatable. Default: index and uuid.
    #[arg(long = "device-name-strategy")]
    pub(crate) device_name_strategy: Vec<cdi::naming::DeviceNameStrategy>,
    /// Leave the driver out: device nodes only. Without it the driver is added when the
    /// backend is `nvml` or a driver root other than `/` is set.
    #[arg(long, conflicts_with = "driver_root")]
    pub(crate) no_driver: bool,
    /// The memory-limit hook written into per-share devices.
    #[command(flatten)]
    pub(crate) hook: crate::cli::args::HookArgs,
}

/// Arguments of `cdi validate`.
#[derive(Debug, Clone, Args)]
pub(crate) struct CdiValidateArgs {
    /// Spec files, or directories whose `.yaml`/`.json` files are all checked together
    /// (a device name offered by two files of one directory is a conflict runtimes drop).
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
}

/// Arguments of `cdi list`.
#[derive(Debug, Clone, Args)]
pub(crate) struct CdiListArgs {
    /// Spec files or directories to read (default: `/etc/cdi` and `/var/run/cdi`, as
    /// runtimes scan them).
    pub(crate) files: Vec<PathBuf>,
}

/// The directories runtimes scan by default, lowest priority first.
pub(crate) const DEFAULT_SPEC_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// Arguments of `cdi remove`.
#[derive(Debug, Clone, Args)]
pub(crate) struct CdiRemoveArgs {
    /// `--config`, whose CDI kind names the spec.
    #[command(flatten)]
    pub(crate) config: crate::cli::args::ConfigFileArgs,
    /// `--cdi-kind` (over the config's).
    #[command(flatten)]
    pub(crate) kind: crate::cli::args::KindSettingArgs,
    /// Directory holding the spec.
    #[arg(long, default_value = cdi::DEFAULT_SPEC_DIR)]
    pub(crate) output: PathBuf,
    /// Encoding the spec was written in (the file in the other encoding is removed too).
    #[arg(long, default_value = "yaml", value_parser = spec_format())]
    pub(crate) format: Format,
}

/// `--format` of a spec: its encodings as clap's possible values (listed in `--help` as
/// every command's `--format` values are), parsed into the domain's [`Format`].
fn spec_format() -> impl clap::builder::TypedValueParser<Value = Format> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["yaml", "json"]).try_map(|s| s.parse::<Format>())
}

/// Run one `cdi` subcommand.
pub(crate) fn run(cmd: &CdiCommand, out: &mut dyn Write) -> crate::cli::error::Result<()> {
    match cmd {
        CdiCommand::Generate(a) => generate(a, out),
        CdiCommand::Validate(a) => Ok(validate(a, out)?),
        CdiCommand::List(a) => Ok(list(a, out)?),
        CdiCommand::Remove(a) => Ok(remove(a, out)?),
    }
}

fn load_config(path: Option<&Path>, kind: &crate::cli::args::KindSettingArgs) -> Result<Config> {
    let mut overrides = Overrides::default();
    kind.apply(&mut overrides);
    Ok(crate::platform::config_file::load(path, &overrides)?)
}

/// Where `cdi generate` puts the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Stdout(Format),
    /// Directory and file name.
    File(PathBuf, String, Format),
}

/// Read `--output` and `--format`: `-`, a `.yaml`/`.json` file, or a directory.
fn output_target(output: &str, format: Option<Format>, kind: &str) -> Result<Target> {
    if output == "-" {
        return Ok(Target::Stdout(format.unwrap_or_default()));
    }
    let path = PathBuf::from(output);
    let ext = path.extension().and_then(|e| e.to_str());
    let from_ext = match ext {
        Some("yaml") => Some(Format::Yaml),
        Some("json") => Some(Format::Json),
        _ => None,
    };
    if path.is_dir() || (from_ext.is_none() && ext != Some("yml")) {
        let format = format.unwrap_or_default();
        return Ok(Target::File(path, spec_file_name(kind, format), format));
    }
    let Some(ext_format) = from_ext else {
        return Err(CdiError::FileName {
            path,
            rule: "--output: runtimes only load files ending in .yaml or .json (.yml is ignored)"
                .into(),
        });
    };
    if let Some(f) = format
        && f != ext_format
    {
        return Err(CdiError::FileName {
            path,
            rule: format!("--output: the extension says {ext_format} but --format says {f}"),
        });
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok(Target::File(dir, name, ext_format))
}

/// Discover the inventory behind `--backend`, as every other command does.
pub(crate) fn load_inventory(backend: &crate::cli::args::BackendArgs) -> Result<Inventory> {
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
/// `cdi generate`: its errors are the spec's ([`CdiError`]) or the driver discovery's.
pub(crate) fn generate(
    args: &CdiGenerateArgs,
    out: &mut dyn Write,
) -> crate::cli::error::Result<()> {
    let mut overrides = args.config.overrides();
    args.kind.apply(&mut overrides);
    args.spec.apply(&mut overrides);
    let cfg = crate::platform::config_file::load(args.config.file.config.as_deref(), &overrides)?;
    let target = output_target(&args.output, args.format, &cfg.cdi_kind)?;
    // The config's default dev root `/` means "the real /dev": no hostPath needed; a
    // `--dev-root` given on the command line (even `/`) is probed as given.
    let dev_root = (args.spec.dev_root.is_some() || cfg.dev_root != Path::new("/"))
        .then(|| cfg.dev_root.clone());
    if let Some(root) = &dev_root {
        HostProbe::check_root(root)?;
    }
    let inv = load_inventory(&args.backend)?;
    // The plan says which devices are split how many ways: their shares get devices.
    let plan = crate::runtime::report::plan_logged(&inv, &cfg)?;
    let hook = args.hook.settings(args.backend.nvml_lib.as_deref())?;
    let want_driver = !args.no_driver && cdi::equips_driver(&inv, &cfg.driver_root);
    let driver = if want_driver {
        crate::platform::driver::spec_edits(
            &cfg,
            inv.driver_version.as_deref(),
            &args.library_search_path,
            &hook.path,
        )?
    } else {
        None
    };
    let opts = GenerateOptions {
        kind: cfg.cdi_kind.clone(),
        dev_root,
        shares: Some(cdi::shares::ShareOptions {
            plan: plan.into(),
            mps_root: cfg.mps_root.clone(),
            hook,
        }),
        driver: driver.as_ref().map(|(_, edits)| edits.clone()),
    };
    let mut spec = cdi::generate(&inv, &opts, &HostProbe)?;
    cdi::naming::apply(&mut spec, &args.device_name_strategy)?;
    let (dir, name, format) = match target {
        Target::Stdout(format) => {
            let bytes = spec.to_bytes(format)?;
            out.write_all(&bytes).map_err(|source| CdiError::Io {
                path: PathBuf::from("<stdout>"),
                source,
            })?;
            return Ok(());
        }
        Target::File(dir, name, format) => (dir, name, format),
    };
    let bytes = spec.to_bytes(format)?;
    let what = match crate::platform::cdi_writer::write_spec(&dir, &name, &bytes)? {
        WriteOutcome::Written => "wrote",
        WriteOutcome::Unchanged => "unchanged",
    };
    crate::platform::cdi_host::warn_same_kind_specs(
        &dir,
        &spec.kind,
        &name,
        Some(&spec.qualified_names()),
    );
    let driver_note = match &driver {
        Some((d, _)) => format!(
            "; driver {} from {}: {} libraries, {} firmware, {} binaries, {} sockets",
            d.version,
            d.host_root.display(),
            d.libraries.len(),
            d.firmware.len(),
            d.binaries.len(),
            d.ipc_sockets.len()
        ),
        None => String::new(),
    };
    Ok(written(
        out,
        format_args!(
            "{what} {} ({} devices, cdiVersion {}{driver_note})\n",
            dir.join(&name).display(),
            spec.devices.len(),
            spec.cdi_version
        ),
    )?)
}

/// Expand directories into the spec files a runtime would load from them (regular files
/// directly inside, ending `.yaml`/`.json`, in lexical order); files stay as given.
/// Returns the files and the names a runtime would ignore. A missing directory is skipped
/// when `skip_missing` (the default spec dirs need not exist).
fn spec_files(paths: &[PathBuf], skip_missing: bool) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut files = Vec::new();
    let mut ignored = Vec::new();
    for p in paths {
        if !p.is_dir() {
            if !p.exists() {
                // Said before the name rules: `/var/run/cdi` missing is not a bad extension.
                if skip_missing {
                    continue;
                }
                return Err(CdiError::NotFound { path: p.clone() });
            }
            files.push(p.clone());
            continue;
        }
        let entries = std::fs::read_dir(p).map_err(|source| CdiError::Io {
            path: p.clone(),
            source,
        })?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| f.is_file())
            .collect();
        found.sort();
        for f in found {
            if cdi::validate::check_file_name(&f).is_ok() {
                files.push(f);
            } else {
                ignored.push(f);
            }
        }
    }
    Ok((files, ignored))
}

/// Devices offered by two files of one directory: runtimes drop such a device entirely.
fn conflicts(specs: &[(PathBuf, cdi::Spec)]) -> Vec<String> {
    let mut seen: std::collections::BTreeMap<(PathBuf, String), &Path> = Default::default();
    let mut out = Vec::new();
    for (path, spec) in specs {
        let dir = path.parent().unwrap_or(Path::new("."));
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        for name in spec.qualified_names() {
            match seen.get(&(dir.clone(), name.clone())) {
                Some(first) if *first != path.as_path() => out.push(format!(
                    "{name} is offered by {} and {}: runtimes drop a device two files of one directory define",
                    first.display(),
                    path.display()
                )),
                Some(_) => {}
                None => {
                    seen.insert((dir.clone(), name), path);
                }
            }
        }
    }
    out
}

/// `cdi validate`: one line per file; directories are checked as runtimes load them,
/// including device names that two of their files define. An error when anything is wrong.
pub(crate) fn validate(args: &CdiValidateArgs, out: &mut dyn Write) -> Result<()> {
    let (files, ignored) = spec_files(&args.files, false)?;
    for f in &ignored {
        written(
            out,
            format_args!(
                "ignored {}: runtimes only load .yaml and .json files\n",
                f.display()
            ),
        )?;
    }
    let mut failures = Vec::new();
    let mut good = Vec::new();
    for path in &files {
        match crate::platform::cdi_host::validate_file(path) {
            Ok(spec) => {
                written(
                    out,
                    format_args!(
                        "ok {}: {}, {} devices, cdiVersion {}\n",
                        path.display(),
                        spec.kind,
                        spec.devices.len(),
                        spec.cdi_version
                    ),
                )?;
                good.push((path.clone(), spec));
            }
            Err(e) => failures.push(e),
        }
    }
    let clashes = conflicts(&good);
    for c in &clashes {
        written(out, format_args!("conflict: {c}\n"))?;
    }
    if files.is_empty() {
        return Err(CdiError::FileName {
            path: args.files[0].clone(),
            rule: "no .yaml or .json spec files to check".into(),
        });
    }
    match failures.len() {
        0 if clashes.is_empty() => Ok(()),
        0 => Err(CdiError::Conflicts {
            count: clashes.len(),
        }),
        1 if files.len() == 1 => Err(failures.remove(0)),
        failed => {
            for e in &failures {
                written(out, format_args!("invalid: {e}\n"))?;
            }
            Err(CdiError::SomeInvalid {
                failed,
                total: files.len(),
            })
        }
    }
}

/// `cdi list`: the qualified names of every device in the files (or the directories'
/// files; default the runtimes' spec dirs), sorted. Invalid files fail the command.
pub(crate) fn list(args: &CdiListArgs, out: &mut dyn Write) -> Result<()> {
    let defaults: Vec<PathBuf> = DEFAULT_SPEC_DIRS.iter().map(PathBuf::from).collect();
    let (paths, skip_missing) = if args.files.is_empty() {
        (&defaults, true)
    } else {
        (&args.files, false)
    };
    let (files, _) = spec_files(paths, skip_missing)?;
    let mut names = Vec::new();
    for path in &files {
        names.extend(crate::platform::cdi_host::validate_file(path)?.qualified_names());
    }
    names.sort();
    for n in names {
        written(out, format_args!("{n}\n"))?;
    }
    Ok(())
}

/// `cdi remove`: delete the spec file for the configured kind, in both formats (a stale
/// twin in the other format would keep offering the devices), if present.
pub(crate) fn remove(args: &CdiRemoveArgs, out: &mut dyn Write) -> Result<()> {
    let cfg = load_config(args.config.config.as_deref(), &args.kind)?;
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
