//! The NVIDIA user-space driver on this node, and what a container needs of it.
//!
//! [`discover`](fn@discover) finds, under the driver root, the files a CUDA container needs besides its
//! device nodes: every `*.so.<driver version>` library (looked up in the root's
//! `etc/ld.so.cache` with [`ldcache`], or in the standard library folders when there is
//! none, plus `--library-search-path`), the GSP firmware, the driver's binaries and its IPC
//! sockets, each only if present. Blocking `std::fs` I/O only: the daemon must call it off
//! its async workers. Every path is resolved inside the root ([`inroot`]), so a symlink in
//! the driver root never leads to the agent's own files.
//!
//! [`container_edits`] turns a [`Driver`] into spec-level CDI edits (read-only bind mounts
//! and the `cdi-hook` hooks of [`hooks`]); `crate::domain::cdi::generate` merges them into the spec
//! through `GenerateOptions::driver`. [`spec_edits`] is the daemon's one call: discovery
//! plus the `failOnInitError` rule.
//!
//! Two roots: `host` is the driver root as the container runtime sees it (`/`, or
//! `/run/nvidia/driver` for a containerised driver), which every `hostPath` starts with;
//! `visible` is where this process sees that same tree (`flags.plugin.containerDriverRoot`,
//! e.g. `/host`, when the agent runs in a container; else the host root).
//!
//! Files: `discover.rs` (the search), `edits.rs` (the CDI edits), [`hooks`] (the hooks the
//! runtime runs), [`inroot`], [`ldcache`]; this module holds the types and [`spec_edits`].

use std::path::{Path, PathBuf};

use crate::domain::cdi::ContainerEdits;

mod discover;
mod edits;
pub(crate) mod hooks;
pub(crate) mod inroot;
pub(crate) mod ldcache;

pub(crate) use discover::{DEFAULT_LDCONFIG, discover};
pub(crate) use edits::container_edits;
#[cfg(test)]
pub(crate) use edits::symlinks;

/// Errors of driver discovery and of the driver hooks. Each names the path or argument.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DriverError {
    /// An `ld.so.cache` could not be parsed.
    #[error("cannot parse ld.so cache {path}: {message}")]
    LdCache { path: String, message: String },
    /// A filesystem call failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Too many symlinks while resolving a path inside a root.
    #[error("too many symlinks resolving {path} inside {root} (a loop?)")]
    SymlinkLoop { root: PathBuf, path: PathBuf },
    /// A path component that must be a directory is not one.
    #[error("{path} inside {root} is not a directory")]
    NotADirectory { root: PathBuf, path: PathBuf },
    /// The driver root is missing.
    #[error("driver root {root}: {message}")]
    Root { root: PathBuf, message: String },
    /// The driver version is unknown or unusable.
    #[error("driver version {version:?} (driver root {root}): {message}")]
    Version {
        root: PathBuf,
        version: String,
        message: String,
    },
    /// No library of the driver was found.
    #[error(
        "no NVIDIA driver libraries (*.so.{version}) under driver root {root} (searched {searched}); set flags.nvidiaDriverRoot / --driver-root to where the driver is installed"
    )]
    NoLibraries {
        root: PathBuf,
        version: String,
        searched: String,
    },
    /// The OCI state or bundle config given to a hook is unusable.
    #[error("invalid OCI state: {0}")]
    OciState(String),
    /// A hook argument is unusable.
    #[error("{flag} `{value}`: {message}")]
    HookArg {
        flag: &'static str,
        value: String,
        message: String,
    },
    /// `ldconfig` failed.
    #[error("{ldconfig} -r {root} failed ({status}): {stderr}")]
    Ldconfig {
        ldconfig: PathBuf,
        root: PathBuf,
        status: String,
        stderr: String,
    },
    /// A mount or namespace operation of a hook failed or is unsafe here.
    #[error("{what}: {message}")]
    Mount { what: String, message: String },
}

/// Result alias for this module.
pub(crate) type Result<T, E = DriverError> = std::result::Result<T, E>;

/// Where the driver is: as the runtime sees it and as this process sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DriverRoot {
    /// Host path of the root (`hostPath` prefix): `/` or `/run/nvidia/driver`.
    pub(crate) host: PathBuf,
    /// Where this process reads the same tree (`containerDriverRoot`, else `host`).
    pub(crate) visible: PathBuf,
}

impl DriverRoot {
    /// The root from the config's `driver_root` and `container_driver_root`.
    pub(crate) fn from_config(cfg: &crate::domain::config::Config) -> Self {
        Self {
            host: cfg.driver_root.clone(),
            visible: cfg
                .container_driver_root
                .clone()
                .unwrap_or_else(|| cfg.driver_root.clone()),
        }
    }
}

/// What [`discover`](fn@discover) needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiscoverOptions {
    /// The driver root.
    pub(crate) root: DriverRoot,
    /// Driver version (`550.54.14`): libraries are `*.so.<version>`.
    pub(crate) version: String,
    /// Extra library folders (paths inside the root), searched after the cache.
    pub(crate) library_search_paths: Vec<PathBuf>,
    /// `uname -r`, for `/lib/firmware/updates/<release>` (None: not searched).
    pub(crate) kernel_release: Option<String>,
}

/// One file of the driver.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct DriverFile {
    /// Path in the container (and inside the driver root).
    pub(crate) container_path: String,
    /// Path on the host (driver root + the resolved path inside it).
    pub(crate) host_path: String,
}

/// A driver library.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Library {
    /// Where it is.
    pub(crate) file: DriverFile,
    /// Its soname (`libcuda.so.1`) when known.
    pub(crate) soname: Option<String>,
}

/// The driver's files, sorted by container path within each group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Driver {
    /// Driver version.
    pub(crate) version: String,
    /// Host path of the driver root.
    pub(crate) host_root: PathBuf,
    /// `*.so.<version>` libraries.
    pub(crate) libraries: Vec<Library>,
    /// GSP firmware.
    pub(crate) firmware: Vec<DriverFile>,
    /// Binaries ([`BINARIES`](discover::BINARIES) found).
    pub(crate) binaries: Vec<DriverFile>,
    /// IPC sockets found.
    pub(crate) ipc_sockets: Vec<DriverFile>,
    /// Host path of the `ldconfig` the `update-ldcache` hook runs.
    pub(crate) ldconfig: String,
    /// Where libraries were looked for (for messages).
    pub(crate) searched: Vec<String>,
}

/// The host's kernel release (`uname -r`), for the firmware search.
pub(crate) fn kernel_release() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && !s.contains('/'))
}

/// The daemon's and `cdi generate`'s one call: discover the driver of `cfg`
/// (`driver_root`, `container_driver_root`) at `version` (the inventory's
/// `driver_version`) and return its spec-level edits, with hooks pointing at the host path
/// `hook_path`. When nothing usable is found: the error when `cfg.fail_on_init_error`,
/// else a warning and `None` (a devices-only spec). Blocking.
pub(crate) fn spec_edits(
    cfg: &crate::domain::config::Config,
    version: Option<&str>,
    library_search_paths: &[PathBuf],
    hook_path: &Path,
) -> Result<Option<(Driver, ContainerEdits)>> {
    let root = DriverRoot::from_config(cfg);
    let opts = DiscoverOptions {
        root: root.clone(),
        version: version.unwrap_or_default().to_string(),
        library_search_paths: library_search_paths.to_vec(),
        kernel_release: kernel_release(),
    };
    match discover(&opts) {
        Ok(driver) => {
            tracing::info!(
                driver_root = %root.host.display(),
                version = %driver.version,
                libraries = driver.libraries.len(),
                firmware = driver.firmware.len(),
                binaries = driver.binaries.len(),
                ipc_sockets = driver.ipc_sockets.len(),
                "driver found"
            );
            let edits = container_edits(&driver, hook_path);
            Ok(Some((driver, edits)))
        }
        Err(e) if !cfg.fail_on_init_error => {
            tracing::warn!(
                error = %e,
                driver_root = %root.host.display(),
                "driver not added to the CDI spec (failOnInitError is false): containers get device nodes only"
            );
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
