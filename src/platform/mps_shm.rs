//! The `/dev/shm` of one MPS control daemon: a size-bounded tmpfs at the daemon's
//! `<mpsRoot>/<uuid>/shm`, and the mount namespace the daemon runs in, where that tmpfs is
//! its `/dev/shm`.
//!
//! Used by `crate::runtime::mps::daemon`: [`mount`] before a daemon's first start,
//! [`ShmBind`] in the spawned child before `exec` (own mount namespace, private
//! propagation, the tmpfs bound onto `/dev/shm`), [`unmount`] when the daemon is removed.
//! The tenants of the daemon's shares get the same host directory at `/dev/shm` from their
//! CDI device, so server and clients meet in one tmpfs that no other daemon's tenants see.
//!
//! Why a tmpfs mounted here and not a plain directory: the runtime bind-mounts a *host*
//! path into tenants, and under `/run` a plain directory would let one tenant fill the
//! host's `/run`. The mount must exist on the host, so in a pod the `mpsRoot` volume needs
//! `mountPropagation: Bidirectional` (deploy/mps/); run directly on a host it is there
//! already. Everything here needs `CAP_SYS_ADMIN`.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};

/// Filesystem source name of the tmpfs (what `/proc/mounts` shows), to tell ours apart.
pub(crate) const TMPFS_SOURCE: &str = "gpu-slicer-mps-shm";

/// Most leftover mounts detached from one directory before giving up (a crashed agent
/// leaves one per run; more than this is not ours to clean up).
const MAX_LEFTOVERS: usize = 16;

/// Mount a fresh tmpfs of at most `size_bytes` at `dir` (`<mpsRoot>/<uuid>/shm`).
///
/// `dir`'s parent is created if missing. Neither may be a symlink (we refuse to mount
/// through a path someone else pointed elsewhere), and `dir` must be a directory. A mount
/// already there (left by an agent that died) is detached first: its daemon is gone, and
/// a fresh one must not inherit its segments. The tmpfs is `1777` like `/dev/shm`
/// (tenants run as any UID), `nosuid,nodev,noexec` like a container's `/dev/shm`.
pub(crate) fn mount(dir: &Path, size_bytes: u64) -> io::Result<()> {
    let parent = dir
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no parent directory"))?;
    // The MPS root is the operator's (`flags.mpsRoot`); below it, nothing is followed.
    if let Some(root) = parent.parent() {
        std::fs::create_dir_all(root)?;
    }
    ensure_dir(parent, 0o755)?;
    // The mount point itself is only seen when nothing is mounted on it: nobody's.
    ensure_dir(dir, 0o700)?;
    unmount(dir)?;
    let data = format!("size={size_bytes},mode=1777");
    nix::mount::mount(
        Some(TMPFS_SOURCE),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(data.as_str()),
    )
    .map_err(|e| with_step("mount a tmpfs", e))
}

/// Detach every mount at `dir` (lazily: tenants still holding it keep their view until
/// they exit) and remove the directory, so a container started after its daemon is gone
/// fails to start instead of getting an unbounded directory on the host. A `dir` that
/// does not exist is fine.
pub(crate) fn remove(dir: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) if !m.file_type().is_dir() => return Err(not_a_dir(&m.file_type())),
        Ok(_) => {}
    }
    unmount(dir)?;
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Detach whatever is mounted at `dir`, stacked mounts included; none is fine.
pub(crate) fn unmount(dir: &Path) -> io::Result<()> {
    for _ in 0..MAX_LEFTOVERS {
        match nix::mount::umount2(dir, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => {}
            // Not a mount point (any more).
            Err(Errno::EINVAL) => return Ok(()),
            Err(e) => return Err(with_step("detach what is mounted there", e)),
        }
    }
    Err(io::Error::other(format!(
        "more than {MAX_LEFTOVERS} mounts stacked on it"
    )))
}

#[cfg(test)]
/// Whether a tmpfs of ours is mounted at `dir`, and its size in bytes (from
/// `/proc/self/mountinfo`; for tests and diagnostics).
pub(crate) fn mounted_size(dir: &Path) -> io::Result<Option<u64>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = dir.as_os_str().as_bytes();
    // The last line for a mount point is the one on top.
    let mut found = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.get(4).map(|p| p.as_bytes()) != Some(want) {
            continue;
        }
        found = match (
            fields.get(sep + 1),
            fields.get(sep + 2),
            fields.get(sep + 3),
        ) {
            (Some(&"tmpfs"), Some(&TMPFS_SOURCE), Some(opts)) => Some(
                opts.split(',')
                    .find_map(|o| o.strip_prefix("size="))
                    .and_then(kib)
                    .unwrap_or(0),
            ),
            _ => None,
        };
    }
    Ok(found)
}

#[cfg(test)]
/// `size=` as mountinfo writes it for tmpfs: a number with an optional `k` suffix.
fn kib(v: &str) -> Option<u64> {
    match v.strip_suffix('k') {
        Some(n) => n.parse::<u64>().ok().map(|n| n << 10),
        None => v.parse().ok(),
    }
}

/// What the spawned daemon does before `exec`: a mount namespace of its own, nothing in it
/// propagating back, and its daemon's tmpfs at `/dev/shm`. The server the control daemon
/// spawns inherits the namespace, so server and clients share that one tmpfs.
#[derive(Debug, Clone)]
pub(crate) struct ShmBind {
    source: CString,
}

impl ShmBind {
    /// Paths are converted here, before `fork`: the child may not allocate.
    pub(crate) fn new(shm_dir: &Path) -> io::Result<Self> {
        let source = CString::new(shm_dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in the path"))?;
        Ok(Self { source })
    }

    /// Checked before spawning: a missing `/dev/shm` would fail the child with an ENOENT
    /// that reads like a missing binary.
    pub(crate) fn check_target() -> io::Result<()> {
        match std::fs::metadata("/dev/shm") {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(io::Error::other("/dev/shm is not a directory")),
            Err(e) => Err(io::Error::new(e.kind(), format!("/dev/shm: {e}"))),
        }
    }

    /// Run in the child between `fork` and `exec` (`Command::pre_exec`): only system
    /// calls, no allocation. The error is the failed call's errno.
    pub(crate) fn apply(&self) -> io::Result<()> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
        // Private first: with the mpsRoot volume shared (Bidirectional), the bind below
        // would otherwise propagate out to the agent and the host.
        nix::mount::mount(
            None::<&std::ffi::CStr>,
            c"/",
            None::<&std::ffi::CStr>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&std::ffi::CStr>,
        )?;
        nix::mount::mount(
            Some(self.source.as_c_str()),
            c"/dev/shm",
            None::<&std::ffi::CStr>,
            MsFlags::MS_BIND,
            None::<&std::ffi::CStr>,
        )?;
        Ok(())
    }
}

/// `path` as a real directory with `mode` (created if missing, never through a symlink).
fn ensure_dir(path: &Path, mode: u32) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => Ok(()),
        Ok(m) => Err(not_a_dir(&m.file_type())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match std::fs::DirBuilder::new().mode(mode).create(path) {
                // Created meanwhile by someone else: check what it is.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => ensure_dir(path, mode),
                r => r,
            }
        }
        Err(e) => Err(e),
    }
}

fn not_a_dir(t: &std::fs::FileType) -> io::Error {
    let what = if t.is_symlink() {
        "a symlink (refused: it would be followed)"
    } else if t.is_socket() || t.is_fifo() || t.is_char_device() || t.is_block_device() {
        "a special file"
    } else {
        "a file"
    };
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("exists and is {what}, not a directory"),
    )
}

fn with_step(step: &str, e: Errno) -> io::Error {
    let hint = if e == Errno::EPERM {
        " (needs CAP_SYS_ADMIN)"
    } else {
        ""
    };
    io::Error::new(
        io::Error::from(e).kind(),
        format!("cannot {step}: {e}{hint}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_and_files_are_refused_before_any_mount() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let uuid = dir.path().join("GPU-1");
        std::fs::create_dir(&uuid).unwrap();
        std::os::unix::fs::symlink(&elsewhere, uuid.join("shm")).unwrap();
        let err = mount(&uuid.join("shm"), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        // A symlinked daemon directory is refused too.
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("GPU-2")).unwrap();
        let err = mount(&dir.path().join("GPU-2/shm"), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        std::fs::write(dir.path().join("GPU-3"), "").unwrap();
        let err = mount(&dir.path().join("GPU-3/shm"), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("a file"), "{err}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        // Removing goes through no symlink either.
        assert!(remove(&uuid.join("shm")).is_err());
        assert!(elsewhere.is_dir());
    }

    #[test]
    fn mountinfo_sizes_read_as_bytes() {
        assert_eq!(kib("262144k"), Some(256 << 20));
        assert_eq!(kib("4096"), Some(4096));
        assert_eq!(kib("x"), None);
    }
}
