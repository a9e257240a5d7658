//! Driver discovery: the files of the driver at one version under a driver root, each
//! resolved inside the root ([`super::inroot`]) and kept only if present. Blocking
//! `std::fs` I/O; [`discover`] runs its steps in order (libraries from the ld cache
//! ([`super::ldcache`]) and folders, firmware, binaries, IPC sockets, `ldconfig`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{
    DiscoverOptions, Driver, DriverError, DriverFile, DriverRoot, Library, Result, inroot, ldcache,
};

/// Binaries of the driver a container may use, as `nvidia-ctk` mounts them.
pub(crate) const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// Folders searched for binaries, inside the driver root.
const BINARY_DIRS: &[&str] = &["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"];

/// Library folders searched when the driver root has no `etc/ld.so.cache`.
pub(crate) const STANDARD_LIBRARY_DIRS: &[&str] = &[
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
pub(crate) const IPC_SOCKETS: &[&str] = &[
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
pub(crate) const DEFAULT_LDCONFIG: &str = "/sbin/ldconfig";

/// Largest `ld.so.cache` read (real ones are well under 1 MiB).
const MAX_CACHE_BYTES: u64 = 64 << 20;
/// Most directory entries looked at in one library folder.
const MAX_DIR_ENTRIES: usize = 100_000;

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

/// Find the driver's files under `opts.root`: its libraries (the root's ld cache, else the
/// standard folders; `--library-search-path` always), GSP firmware, binaries, IPC sockets
/// and the `ldconfig` the hook runs.
pub(crate) fn discover(opts: &DiscoverOptions) -> Result<Driver> {
    let root = &opts.root;
    check_version(&root.host, &opts.version)?;
    check_root(&root.visible)?;
    let find = Finder::new(root);
    let mut libraries = Libraries {
        find: &find,
        suffix: format!(".so.{}", opts.version),
        seen: BTreeSet::new(),
        found: Vec::new(),
        searched: Vec::new(),
    };
    let has_cache = libraries.search_cache()?;
    // The standard folders only without a cache; --library-search-path always.
    let mut dirs: Vec<PathBuf> = Vec::new();
    if !has_cache {
        dirs.extend(STANDARD_LIBRARY_DIRS.iter().map(PathBuf::from));
    }
    dirs.extend(opts.library_search_paths.iter().cloned());
    for dir in &dirs {
        libraries.search_folder(dir)?;
    }
    let Libraries {
        found: mut libraries,
        searched,
        ..
    } = libraries;
    if libraries.is_empty() {
        return Err(DriverError::NoLibraries {
            root: root.host.clone(),
            version: opts.version.clone(),
            searched: searched.join(", "),
        });
    }
    libraries.sort();
    Ok(Driver {
        version: opts.version.clone(),
        host_root: root.host.clone(),
        libraries,
        firmware: firmware(&find, opts)?,
        binaries: binaries(&find)?,
        ipc_sockets: ipc_sockets(&find)?,
        ldconfig: ldconfig(&find)?,
        searched,
    })
}

/// The visible root must be a readable directory.
fn check_root(visible: &Path) -> Result<()> {
    let message = match std::fs::metadata(visible) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => "not a directory".to_string(),
        Err(e) => format!("cannot read ({e})"),
    };
    Err(DriverError::Root {
        root: visible.to_path_buf(),
        message,
    })
}

/// The search for `*.so.<version>` libraries: each found once, by container path.
struct Libraries<'a> {
    find: &'a Finder<'a>,
    /// `.so.<version>`.
    suffix: String,
    /// Container paths found so far.
    seen: BTreeSet<String>,
    found: Vec<Library>,
    /// Where libraries were looked for (for messages).
    searched: Vec<String>,
}

impl Libraries<'_> {
    /// The root's ld cache: soname -> soname link; the link resolves to the versioned file.
    /// Whether the root has a cache.
    fn search_cache(&mut self) -> Result<bool> {
        let find = self.find;
        let (_, cache_path) = find.resolve(Path::new("/etc/ld.so.cache"))?;
        let bytes = match std::fs::metadata(&cache_path) {
            Ok(m) if m.is_file() && m.len() <= MAX_CACHE_BYTES => std::fs::read(&cache_path)
                .map_err(|source| DriverError::Io {
                    action: "read",
                    path: cache_path.clone(),
                    source,
                })?,
            _ => return Ok(false),
        };
        self.searched.push(format!("{}", cache_path.display()));
        for e in ldcache::parse(&bytes, &cache_path.display().to_string())? {
            if !e.is_native() {
                continue;
            }
            // Only the driver's own files matter: look at the file itself (one more stat)
            // only when its resolved name carries the version.
            let (inside, _) = find.resolve(Path::new(&e.path))?;
            if !inside.ends_with(&self.suffix) {
                continue;
            }
            let Some(file) = find.file(Path::new(&e.path), None, is_file)? else {
                continue;
            };
            if file.container_path.ends_with(&self.suffix)
                && self.seen.insert(file.container_path.clone())
            {
                self.found.push(Library {
                    file,
                    soname: Some(e.soname),
                });
            }
        }
        Ok(true)
    }

    /// The `lib*.so.<version>` files directly in the in-root folder `dir`, their sonames
    /// from [`KNOWN_SONAMES`].
    fn search_folder(&mut self, dir: &Path) -> Result<()> {
        self.searched.push(dir.display().to_string());
        for name in self.find.names(dir)? {
            if !(name.starts_with("lib") && name.ends_with(&self.suffix)) {
                continue;
            }
            let Some(file) = self.find.file(&dir.join(&name), None, is_file)? else {
                continue;
            };
            if self.seen.insert(file.container_path.clone()) {
                let stem = name.split(".so").next().unwrap_or_default();
                let soname = KNOWN_SONAMES
                    .iter()
                    .find(|(s, _)| *s == stem)
                    .map(|(_, so)| so.to_string());
                self.found.push(Library { file, soname });
            }
        }
        Ok(())
    }
}

/// GSP firmware, first hit per file name in the kernel's search order.
fn firmware(find: &Finder<'_>, opts: &DiscoverOptions) -> Result<Vec<DriverFile>> {
    let v = &opts.version;
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
    let mut out = Vec::new();
    for base in fw_dirs {
        let dir = format!("{base}/nvidia/{v}");
        for name in find.names(Path::new(&dir))? {
            if !(name.starts_with("gsp") && name.ends_with(".bin")) || fw_names.contains(&name) {
                continue;
            }
            let logical = format!("{dir}/{name}");
            if let Some(f) = find.file(Path::new(&logical), Some(&logical), is_file)? {
                fw_names.insert(name);
                out.push(f);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Binaries: first folder that has each as an executable file.
fn binaries(find: &Finder<'_>) -> Result<Vec<DriverFile>> {
    let exec = |m: &std::fs::Metadata| {
        use std::os::unix::fs::PermissionsExt;
        m.is_file() && m.permissions().mode() & 0o111 != 0
    };
    let mut out = Vec::new();
    for name in BINARIES {
        for dir in BINARY_DIRS {
            let logical = format!("{dir}/{name}");
            if let Some(f) = find.file(Path::new(&logical), Some(&logical), exec)? {
                out.push(f);
                break;
            }
        }
    }
    out.sort();
    Ok(out)
}

/// IPC sockets; /var/run is usually a link to /run, so one socket is found once.
fn ipc_sockets(find: &Finder<'_>) -> Result<Vec<DriverFile>> {
    let is_sock = |m: &std::fs::Metadata| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_socket()
    };
    let mut hosts = BTreeSet::new();
    let mut out = Vec::new();
    for sock in IPC_SOCKETS {
        let logical = sock.strip_prefix("/var").unwrap_or(sock);
        if let Some(f) = find.file(Path::new(sock), Some(logical), is_sock)?
            && hosts.insert(f.container_path.clone())
        {
            out.push(f);
        }
    }
    out.sort();
    Ok(out)
}

/// The ldconfig the hook runs: the driver root's, else the host's default.
fn ldconfig(find: &Finder<'_>) -> Result<String> {
    for cand in LDCONFIG_CANDIDATES {
        if let Some(f) = find.file(Path::new(cand), None, is_file)? {
            return Ok(f.host_path);
        }
    }
    Ok(DEFAULT_LDCONFIG.to_string())
}
