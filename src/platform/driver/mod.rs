//! The NVIDIA user-space driver on this node, and what a container needs of it.
//!
//! [`discover`] finds, under the driver root, the files a CUDA container needs besides its
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

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::domain::cdi::{ContainerEdits, Hook, Mount};

pub mod hooks;
pub(crate) mod inroot;
pub(crate) mod ldcache;

/// Errors of driver discovery and of the driver hooks. Each names the path or argument.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
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
pub type Result<T, E = DriverError> = std::result::Result<T, E>;

/// Binaries of the driver a container may use, as `nvidia-ctk` mounts them.
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// Folders searched for binaries, inside the driver root.
const BINARY_DIRS: &[&str] = &["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"];

/// Library folders searched when the driver root has no `etc/ld.so.cache`.
pub const STANDARD_LIBRARY_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
];

/// IPC sockets of the driver's daemons, container path = path in the root.
pub const IPC_SOCKETS: &[&str] = &[
    "/run/nvidia-persistenced/socket",
    "/var/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
    "/var/run/nvidia-fabricmanager/socket",
];

/// `ldconfig` candidates inside the driver root; `.real` first (Ubuntu's `ldconfig` is a
/// shell wrapper around it).
const LDCONFIG_CANDIDATES: &[&str] = &[
    "/sbin/ldconfig.real",
    "/sbin/ldconfig",
    "/usr/sbin/ldconfig",
];

/// The ldconfig the hook runs when the driver root has none.
pub const DEFAULT_LDCONFIG: &str = "/sbin/ldconfig";

/// Largest `ld.so.cache` read (real ones are well under 1 MiB).
const MAX_CACHE_BYTES: u64 = 64 << 20;
/// Most directory entries looked at in one library folder.
const MAX_DIR_ENTRIES: usize = 100_000;

/// Mount options of every driver file: read-only, no setuid, no device files.
pub const MOUNT_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "bind"];

/// Sonames the CUDA and NVML loaders open, for libraries whose soname the cache does not
/// tell us (no cache in the root). `update-ldcache` adds any other from the ELF headers.
const KNOWN_SONAMES: &[(&str, &str)] = &[
    ("libcuda", "libcuda.so.1"),
    ("libnvidia-ml", "libnvidia-ml.so.1"),
    ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1"),
    ("libnvidia-nvvm", "libnvidia-nvvm.so.4"),
    ("libcudadebugger", "libcudadebugger.so.1"),
    ("libnvidia-opencl", "libnvidia-opencl.so.1"),
    ("libnvidia-cfg", "libnvidia-cfg.so.1"),
    ("libnvidia-allocator", "libnvidia-allocator.so.1"),
];

/// Where the driver is: as the runtime sees it and as this process sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverRoot {
    /// Host path of the root (`hostPath` prefix): `/` or `/run/nvidia/driver`.
    pub host: PathBuf,
    /// Where this process reads the same tree (`containerDriverRoot`, else `host`).
    pub visible: PathBuf,
}

impl DriverRoot {
    /// The root from the config's `driver_root` and `container_driver_root`.
    pub fn from_config(cfg: &crate::domain::config::Config) -> Self {
        Self {
            host: cfg.driver_root.clone(),
            visible: cfg
                .container_driver_root
                .clone()
                .unwrap_or_else(|| cfg.driver_root.clone()),
        }
    }
}

/// What [`discover`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverOptions {
    /// The driver root.
    pub root: DriverRoot,
    /// Driver version (`550.54.14`): libraries are `*.so.<version>`.
    pub version: String,
    /// Extra library folders (paths inside the root), searched after the cache.
    pub library_search_paths: Vec<PathBuf>,
    /// `uname -r`, for `/lib/firmware/updates/<release>` (None: not searched).
    pub kernel_release: Option<String>,
}

/// One file of the driver.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DriverFile {
    /// Path in the container (and inside the driver root).
    pub container_path: String,
    /// Path on the host (driver root + the resolved path inside it).
    pub host_path: String,
}

/// A driver library.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Library {
    /// Where it is.
    pub file: DriverFile,
    /// Its soname (`libcuda.so.1`) when known.
    pub soname: Option<String>,
}

/// The driver's files, sorted by container path within each group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Driver {
    /// Driver version.
    pub version: String,
    /// Host path of the driver root.
    pub host_root: PathBuf,
    /// `*.so.<version>` libraries.
    pub libraries: Vec<Library>,
    /// GSP firmware.
    pub firmware: Vec<DriverFile>,
    /// Binaries ([`BINARIES`] found).
    pub binaries: Vec<DriverFile>,
    /// IPC sockets found.
    pub ipc_sockets: Vec<DriverFile>,
    /// Host path of the `ldconfig` the `update-ldcache` hook runs.
    pub ldconfig: String,
    /// Where libraries were looked for (for messages).
    pub searched: Vec<String>,
}

/// Check a version string before it becomes part of file names and paths.
fn check_version(root: &Path, version: &str) -> Result<()> {
    let bad = |message: &str| DriverError::Version {
        root: root.to_path_buf(),
        version: version.to_string(),
        message: message.to_string(),
    };
    if version.is_empty() {
        return Err(bad(
            "unknown: NVML reported none (node file: set driverVersion)",
        ));
    }
    if !version
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        || version.starts_with('.')
    {
        return Err(bad("must be letters, digits, `.`, `-` or `_`"));
    }
    Ok(())
}

/// Looks files up in one driver root.
struct Finder<'a> {
    root: &'a DriverRoot,
    /// Folders resolved so far (as written → visible path): the hundreds of `ld.so.cache`
    /// entries sit in a handful of folders, and the tree does not change during discovery,
    /// so each folder is walked once instead of once per entry.
    folders: std::cell::RefCell<std::collections::HashMap<PathBuf, PathBuf>>,
}

impl<'a> Finder<'a> {
    fn new(root: &'a DriverRoot) -> Self {
        Self {
            root,
            folders: std::cell::RefCell::default(),
        }
    }

    /// `path` resolved inside the visible root, its folder taken from the memo.
    fn visible(&self, path: &Path) -> Result<PathBuf> {
        let (Some(folder), Some(name)) = (path.parent(), path.file_name()) else {
            return inroot::resolve(&self.root.visible, path);
        };
        let known = self.folders.borrow().get(folder).cloned();
        let base = match known {
            Some(base) => base,
            None => {
                let base = inroot::resolve(&self.root.visible, folder)?;
                self.folders
                    .borrow_mut()
                    .insert(folder.to_path_buf(), base.clone());
                base
            }
        };
        inroot::resolve_in(&self.root.visible, &base, Path::new(name))
    }

    /// Resolve `path` inside the visible root: `(in-root path, visible path)`. The in-root
    /// path is empty when it is not UTF-8 (a spec cannot name it).
    fn resolve(&self, path: &Path) -> Result<(String, PathBuf)> {
        let visible = self.visible(path)?;
        let rel = visible
            .strip_prefix(&self.root.visible)
            .unwrap_or(Path::new(""));
        let inside = rel.to_str().map(|r| format!("/{r}")).unwrap_or_default();
        Ok((inside, visible))
    }

    /// The driver file at `path` (logical container path `container`) when it resolves to
    /// something `keep` accepts.
    fn file(
        &self,
        path: &Path,
        container: Option<&str>,
        keep: impl Fn(&std::fs::Metadata) -> bool,
    ) -> Result<Option<DriverFile>> {
        let (inside, visible) = self.resolve(path)?;
        match std::fs::metadata(&visible) {
            Ok(m) if keep(&m) => {}
            _ => return Ok(None),
        }
        if inside.is_empty() || inside.contains(|c: char| c.is_control()) {
            return Ok(None);
        }
        let host = self.root.host.join(inside.trim_start_matches('/'));
        Ok(Some(DriverFile {
            container_path: container.map_or(inside, str::to_string),
            host_path: host.display().to_string(),
        }))
    }

    /// File names directly in the in-root folder `dir`, bounded.
    fn names(&self, dir: &Path) -> Result<Vec<String>> {
        let (_, visible) = self.resolve(dir)?;
        let entries = match std::fs::read_dir(&visible) {
            Ok(e) => e,
            Err(_) => return Ok(Vec::new()),
        };
        let mut out: Vec<String> = entries
            .take(MAX_DIR_ENTRIES)
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        out.sort();
        Ok(out)
    }
}

fn is_file(m: &std::fs::Metadata) -> bool {
    m.is_file()
}

/// Find the driver's files under `opts.root`.
pub fn discover(opts: &DiscoverOptions) -> Result<Driver> {
    let root = &opts.root;
    check_version(&root.host, &opts.version)?;
    match std::fs::metadata(&root.visible) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(DriverError::Root {
                root: root.visible.clone(),
                message: "not a directory".into(),
            });
        }
        Err(e) => {
            return Err(DriverError::Root {
                root: root.visible.clone(),
                message: format!("cannot read ({e})"),
            });
        }
    }
    let find = Finder::new(root);
    let v = &opts.version;
    let suffix = format!(".so.{v}");
    let mut driver = Driver {
        version: v.clone(),
        host_root: root.host.clone(),
        ..Driver::default()
    };
    let mut seen = BTreeSet::new();

    // 1. The root's ld cache: soname -> soname link; the link resolves to the versioned file.
    let (_, cache_path) = find.resolve(Path::new("/etc/ld.so.cache"))?;
    let cache = match std::fs::metadata(&cache_path) {
        Ok(m) if m.is_file() && m.len() <= MAX_CACHE_BYTES => Some(
            std::fs::read(&cache_path).map_err(|source| DriverError::Io {
                action: "read",
                path: cache_path.clone(),
                source,
            })?,
        ),
        _ => None,
    };
    if let Some(bytes) = &cache {
        driver.searched.push(format!("{}", cache_path.display()));
        for e in ldcache::parse(bytes, &cache_path.display().to_string())? {
            if !e.is_native() {
                continue;
            }
            // Only the driver's own files matter: look at the file itself (one more stat)
            // only when its resolved name carries the version.
            let (inside, _) = find.resolve(Path::new(&e.path))?;
            if !inside.ends_with(&suffix) {
                continue;
            }
            let Some(file) = find.file(Path::new(&e.path), None, is_file)? else {
                continue;
            };
            if file.container_path.ends_with(&suffix) && seen.insert(file.container_path.clone()) {
                driver.libraries.push(Library {
                    file,
                    soname: Some(e.soname),
                });
            }
        }
    }
    // 2. Folders: the standard ones only without a cache; --library-search-path always.
    let mut dirs: Vec<PathBuf> = Vec::new();
    if cache.is_none() {
        dirs.extend(STANDARD_LIBRARY_DIRS.iter().map(PathBuf::from));
    }
    dirs.extend(opts.library_search_paths.iter().cloned());
    for dir in &dirs {
        driver.searched.push(dir.display().to_string());
        for name in find.names(dir)? {
            if !(name.starts_with("lib") && name.ends_with(&suffix)) {
                continue;
            }
            let Some(file) = find.file(&dir.join(&name), None, is_file)? else {
                continue;
            };
            if seen.insert(file.container_path.clone()) {
                let stem = name.split(".so").next().unwrap_or_default();
                let soname = KNOWN_SONAMES
                    .iter()
                    .find(|(s, _)| *s == stem)
                    .map(|(_, so)| so.to_string());
                driver.libraries.push(Library { file, soname });
            }
        }
    }
    if driver.libraries.is_empty() {
        return Err(DriverError::NoLibraries {
            root: root.host.clone(),
            version: v.clone(),
            searched: driver.searched.join(", "),
        });
    }
    driver.libraries.sort();

    // 3. GSP firmware, first hit per file name in the kernel's search order.
    let mut fw_dirs = Vec::new();
    if let Some(kr) = &opts.kernel_release {
        fw_dirs.push(format!("/lib/firmware/updates/{kr}"));
    }
    fw_dirs.push("/lib/firmware/updates".into());
    if let Some(kr) = &opts.kernel_release {
        fw_dirs.push(format!("/lib/firmware/{kr}"));
    }
    fw_dirs.push("/lib/firmware".into());
    let mut fw_names = BTreeSet::new();
    for base in fw_dirs {
        let dir = format!("{base}/nvidia/{v}");
        for name in find.names(Path::new(&dir))? {
            if !(name.starts_with("gsp") && name.ends_with(".bin")) || fw_names.contains(&name) {
                continue;
            }
            let logical = format!("{dir}/{name}");
            if let Some(f) = find.file(Path::new(&logical), Some(&logical), is_file)? {
                fw_names.insert(name);
                driver.firmware.push(f);
            }
        }
    }
    driver.firmware.sort();

    // 4. Binaries: first folder that has each as an executable file.
    for name in BINARIES {
        for dir in BINARY_DIRS {
            let logical = format!("{dir}/{name}");
            let exec = |m: &std::fs::Metadata| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            };
            if let Some(f) = find.file(Path::new(&logical), Some(&logical), exec)? {
                driver.binaries.push(f);
                break;
            }
        }
    }
    driver.binaries.sort();

    // 5. IPC sockets; /var/run is usually a link to /run, so one socket is found once.
    let mut hosts = BTreeSet::new();
    for sock in IPC_SOCKETS {
        let is_sock = |m: &std::fs::Metadata| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_socket()
        };
        let logical = sock.strip_prefix("/var").unwrap_or(sock);
        if let Some(f) = find.file(Path::new(sock), Some(logical), is_sock)?
            && hosts.insert(f.container_path.clone())
        {
            driver.ipc_sockets.push(f);
        }
    }
    driver.ipc_sockets.sort();

    // 6. The ldconfig the hook runs: the driver root's, else the host's default.
    driver.ldconfig = DEFAULT_LDCONFIG.to_string();
    for cand in LDCONFIG_CANDIDATES {
        if let Some(f) = find.file(Path::new(cand), None, is_file)? {
            driver.ldconfig = f.host_path;
            break;
        }
    }
    Ok(driver)
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn dir_name(path: &str) -> &str {
    match path.rsplit_once('/') {
        Some(("", _)) => "/",
        Some((d, _)) => d,
        None => "/",
    }
}

/// The `--link TARGET::LINK` pairs `create-symlinks` is given: each library's soname link
/// (when the soname differs from the file name), and the unversioned development links
/// `libcuda.so` and `libnvidia-ml.so` that some tools open.
pub fn symlinks(driver: &Driver) -> Vec<String> {
    let mut links = BTreeSet::new();
    for lib in &driver.libraries {
        let path = &lib.file.container_path;
        let (dir, name) = (dir_name(path), file_name(path));
        let Some(soname) = &lib.soname else { continue };
        if soname != name && !soname.contains('/') {
            links.insert(format!("{name}::{}", join(dir, soname)));
        }
        for dev in ["libcuda.so", "libnvidia-ml.so"] {
            if soname.strip_suffix(".1") == Some(dev) {
                links.insert(format!("{soname}::{}", join(dir, dev)));
            }
        }
    }
    links.into_iter().collect()
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// Seconds the runtime gives each driver hook.
pub const HOOK_TIMEOUT_SECS: i64 = 30;

fn hook(hook_path: &Path, args: Vec<String>) -> Hook {
    let path = hook_path.display().to_string();
    let mut all = vec![path.clone(), "cdi-hook".to_string()];
    all.extend(args);
    Hook {
        hook_name: "createContainer".into(),
        path,
        args: all,
        env: Vec::new(),
        timeout: Some(HOOK_TIMEOUT_SECS),
    }
}

/// Spec-level CDI edits for `driver`: one read-only bind mount per file, sorted by
/// container path, and the `createContainer` hooks `create-symlinks`, `update-ldcache` and
/// `disable-device-node-modification` of the `gpu-slicer` binary at `hook_path` (a host
/// path). Pure.
pub fn container_edits(driver: &Driver, hook_path: &Path) -> ContainerEdits {
    let mut mounts: Vec<Mount> = Vec::new();
    let files = driver
        .libraries
        .iter()
        .map(|l| (&l.file, false))
        .chain(driver.firmware.iter().map(|f| (f, false)))
        .chain(driver.binaries.iter().map(|f| (f, false)))
        .chain(driver.ipc_sockets.iter().map(|f| (f, true)));
    for (f, socket) in files {
        let mut options: Vec<String> = MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect();
        if socket {
            options.push("noexec".into());
        }
        mounts.push(Mount {
            host_path: f.host_path.clone(),
            container_path: f.container_path.clone(),
            mount_type: None,
            options,
        });
    }
    mounts.sort_by(|a, b| a.container_path.cmp(&b.container_path));
    mounts.dedup_by(|a, b| a.container_path == b.container_path);

    let mut hooks = Vec::new();
    let links = symlinks(driver);
    if !links.is_empty() {
        let mut args = vec!["create-symlinks".to_string()];
        for l in links {
            args.push("--link".into());
            args.push(l);
        }
        hooks.push(hook(hook_path, args));
    }
    let folders: BTreeSet<&str> = driver
        .libraries
        .iter()
        .map(|l| dir_name(&l.file.container_path))
        .collect();
    let mut args = vec![
        "update-ldcache".to_string(),
        "--ldconfig-path".into(),
        driver.ldconfig.clone(),
    ];
    for f in folders {
        args.push("--folder".into());
        args.push(f.to_string());
    }
    hooks.push(hook(hook_path, args));
    hooks.push(hook(
        hook_path,
        vec!["disable-device-node-modification".to_string()],
    ));
    ContainerEdits {
        mounts,
        hooks,
        ..ContainerEdits::default()
    }
}

/// The host's kernel release (`uname -r`), for the firmware search.
pub fn kernel_release() -> Option<String> {
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
pub fn spec_edits(
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
