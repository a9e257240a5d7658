//! `gpu-slicer cdi-hook set-memory-limit`: the CDI hook that binds a container's GPU memory.
//! `gpu-slicer cdi-hook install --to DIR`: put this binary where the runtime can run it.
//! `gpu-slicer cdi-hook create-symlinks | update-ldcache | disable-device-node-modification`:
//! the driver hooks of the spec's driver edits (`crate::platform::driver::hooks`), run as
//! `createContainer` hooks with the OCI state on stdin.
//!
//! Run by the container runtime on the host (a CDI `createRuntime` hook) with the OCI state
//! on stdin; sets the hard limit of the container's cgroup on one GPU through NVML
//! (`crate::platform::enforce`). Any failure exits non-zero with a one-line reason on stderr, so the
//! runtime refuses to start the container instead of starting it unlimited.

use std::io::Read;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::platform::enforce::{self, EnforceError, MemoryLimiter, nvml::NvmlLimiter};

/// `cdi-hook` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub(crate) enum CdiHookCommand {
    /// Set the container's hard GPU-memory limit on one GPU.
    SetMemoryLimit(SetMemoryLimitArgs),
    /// Copy this executable into a host directory (a DaemonSet init container does this so
    /// the hook path written into CDI specs exists on the host, where the runtime runs it).
    Install(InstallArgs),
    /// Create symlinks in the container (driver sonames, `libcuda.so`).
    CreateSymlinks(CreateSymlinksArgs),
    /// Add the driver's library folders to the container's ld cache (host's ldconfig).
    UpdateLdcache(UpdateLdcacheArgs),
    /// Bind a copy of the driver's params with `ModifyDeviceFiles: 0` over the container's,
    /// so the user-space driver never creates device nodes in it.
    DisableDeviceNodeModification(DisableDeviceNodeModificationArgs),
}

/// `cdi-hook create-symlinks` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct CreateSymlinksArgs {
    /// `TARGET::LINK`: LINK (absolute, in the container) points at TARGET; repeatable.
    #[arg(long = "link")]
    pub(crate) links: Vec<String>,
}

/// `cdi-hook update-ldcache` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct UpdateLdcacheArgs {
    /// Folder in the container holding driver libraries; repeatable.
    #[arg(long = "folder")]
    pub(crate) folders: Vec<PathBuf>,
    /// The HOST's ldconfig, run with `-r <container root>` (images need none of their own).
    #[arg(long, default_value = crate::platform::driver::DEFAULT_LDCONFIG)]
    pub(crate) ldconfig_path: PathBuf,
}

/// `cdi-hook disable-device-node-modification` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct DisableDeviceNodeModificationArgs {
    /// The host's driver params file to copy.
    #[arg(long, default_value = crate::platform::driver::hooks::PARAMS_PATH)]
    pub(crate) params: PathBuf,
    /// Host directory for the moment between writing the copy and binding it (the file
    /// is unlinked right after the mount).
    #[arg(long, default_value = "/run")]
    pub(crate) scratch_dir: PathBuf,
}

fn read_state() -> Result<String, EnforceError> {
    let mut state = String::new();
    std::io::stdin()
        .read_to_string(&mut state)
        .map_err(|source| EnforceError::Read {
            path: PathBuf::from("<stdin>"),
            source,
        })?;
    Ok(state)
}

/// `cdi-hook install` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct InstallArgs {
    /// Directory to install `gpu-slicer` into (created if missing).
    #[arg(long)]
    pub(crate) to: PathBuf,
}

/// Copy `exe` to `<dir>/gpu-slicer` atomically (temp file, fsync, mode 0755, rename), so a
/// runtime starting a hook at that moment sees the old binary or the new one, never half
/// of one. The temp file has a random name and is created exclusively (`tempfile`): the
/// host directory may be writable by others, and a symlink planted at a predictable name
/// would make us overwrite and chmod its target as root. Returns the installed path.
pub(crate) fn install(
    exe: &std::path::Path,
    dir: &std::path::Path,
) -> Result<PathBuf, EnforceError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |action: &'static str, path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| EnforceError::Install {
            action,
            path,
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(err("create", dir))?;
    let target = dir.join("gpu-slicer");
    let mut src = std::fs::File::open(exe).map_err(err("open", exe))?;
    // Dropped (and deleted) on any error: nothing half-written is left behind.
    let mut tmp = tempfile::Builder::new()
        .prefix(".gpu-slicer.")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(err("create a temp file in", dir))?;
    let tmp_path = tmp.path().to_path_buf();
    std::io::copy(&mut src, tmp.as_file_mut()).map_err(err("copy to", &tmp_path))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o755))
        .map_err(err("chmod", &tmp_path))?;
    tmp.as_file().sync_all().map_err(err("sync", &tmp_path))?;
    tmp.persist(&target)
        .map_err(|e| err("rename into", &target)(e.error))?;
    Ok(target)
}

/// `cdi-hook set-memory-limit` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct SetMemoryLimitArgs {
    /// GPU UUID (`GPU-…`; MIG devices are not supported by the driver).
    #[arg(long)]
    pub(crate) device: String,
    /// Hard limit in bytes (k × device memory / N for k of N shares); at least 1 (0 would
    /// mean "no memory", which no share plan produces).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) bytes: u64,
    /// NVML library (default: libnvidia-ml.so.1); read as every command reads it (the
    /// spec passes the flag: runtimes give a hook only the spec's environment).
    #[arg(long, env = "NVML_LIB")]
    pub(crate) nvml_lib: Option<PathBuf>,
    /// Root of /proc.
    #[arg(long, env = "PROC_ROOT", default_value = "/proc")]
    pub(crate) proc_root: PathBuf,
    /// Root of the cgroup filesystem.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub(crate) cgroup_root: PathBuf,
}

/// Run a `cdi-hook` subcommand with the real NVML limiter, reading the state from stdin.
pub(crate) fn run(cmd: &CdiHookCommand) -> Result<(), EnforceError> {
    match cmd {
        CdiHookCommand::SetMemoryLimit(args) => {
            let mut limiter = NvmlLimiter::new(args.nvml_lib.clone());
            let mut state = String::new();
            std::io::stdin()
                .read_to_string(&mut state)
                .map_err(|source| EnforceError::Read {
                    path: PathBuf::from("<stdin>"),
                    source,
                })?;
            run_with(args, &state, &mut limiter)
        }
        CdiHookCommand::Install(args) => {
            let exe = std::env::current_exe().map_err(|source| EnforceError::Read {
                path: PathBuf::from("/proc/self/exe"),
                source,
            })?;
            let target = install(&exe, &args.to)?;
            println!("{}", target.display());
            Ok(())
        }
        CdiHookCommand::CreateSymlinks(args) => {
            use crate::platform::driver::hooks;
            // Arguments first: a bad one fails before anything is touched.
            let links = args
                .links
                .iter()
                .map(|l| hooks::parse_link(l))
                .collect::<Result<Vec<_>, _>>()?;
            let root = hooks::container_root(&read_state()?)?;
            Ok(hooks::create_symlinks(&root, &links)?)
        }
        CdiHookCommand::UpdateLdcache(args) => {
            use crate::platform::driver::hooks;
            let root = hooks::container_root(&read_state()?)?;
            Ok(hooks::update_ldcache(
                &root,
                &args.ldconfig_path,
                &args.folders,
            )?)
        }
        CdiHookCommand::DisableDeviceNodeModification(args) => {
            use crate::platform::driver::hooks;
            let root = hooks::container_root(&read_state()?)?;
            Ok(hooks::disable_device_node_modification(
                &root,
                &args.params,
                &args.scratch_dir,
            )?)
        }
    }
}

/// `set-memory-limit` with an injected limiter and state (tests).
pub(crate) fn run_with(
    args: &SetMemoryLimitArgs,
    state: &str,
    limiter: &mut dyn MemoryLimiter,
) -> Result<(), EnforceError> {
    enforce::set_memory_limit(
        state,
        &args.proc_root,
        &args.cgroup_root,
        &args.device,
        args.bytes,
        limiter,
    )
    .map(|_| ())
}
