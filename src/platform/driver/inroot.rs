//! Path resolution inside a root directory, the way the kernel would resolve it after a
//! `chroot` to that root: absolute symlinks restart at the root, `..` stops at the root.
//!
//! Used by driver discovery (symlinks in a driver root such as `/run/nvidia/driver` mean
//! paths under that root, never the agent's own files) and by the `cdi-hook` commands,
//! which write into a container's root filesystem before it starts: an image may carry
//! absolute or `..` symlinks (`/usr/lib/x86_64-linux-gnu -> /host-root`,
//! `a -> ../../..`) aimed at the host, and every path a hook touches goes through here.
//!
//! Written by hand because `openat2(RESOLVE_IN_ROOT)` is not wrapped by the `nix` version
//! we use and `std` has no equivalent. The walk is component by component with `lstat`;
//! the tree is not expected to change while we walk (a container root before its process
//! starts; a driver root the agent only reads).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use super::DriverError;

/// Symlinks followed in one resolution before giving up (Linux's limit).
pub(crate) const MAX_SYMLINKS: usize = 40;

/// Resolve `path` (absolute or relative, both taken from the root) inside `root`,
/// following every symlink including the last component. Missing components are kept as
/// written. The result always lies under `root`.
pub(crate) fn resolve(root: &Path, path: &Path) -> Result<PathBuf, DriverError> {
    walk(root, Vec::new(), path, true)
}

/// What `resolve(root, <base inside root>/name)` returns, for `base` a path [`resolve`]
/// returned: its components are symlink-free already, so only `name` is walked (one
/// `lstat` per component and link instead of one per component of the whole path).
pub(crate) fn resolve_in(root: &Path, base: &Path, name: &Path) -> Result<PathBuf, DriverError> {
    let done = base
        .strip_prefix(root)
        .unwrap_or(Path::new(""))
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            _ => None,
        })
        .collect();
    walk(root, done, name, true)
}

/// The walk from the resolved components `done`; `follow_last: false` leaves a symlink in
/// the last component unresolved.
fn walk(
    root: &Path,
    mut done: Vec<OsString>,
    path: &Path,
    follow_last: bool,
) -> Result<PathBuf, DriverError> {
    let mut pending: VecDeque<OsString> = VecDeque::new();
    push_front(&mut pending, path);
    let mut links = 0usize;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            done.pop();
            continue;
        }
        done.push(name);
        let here = join(root, &done);
        let meta = match std::fs::symlink_metadata(&here) {
            Ok(m) => m,
            // Absent (or under a non-directory): nothing to follow; callers see it missing.
            Err(e) if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(20) => {
                continue;
            }
            Err(source) => {
                return Err(DriverError::Io {
                    action: "inspect",
                    path: here,
                    source,
                });
            }
        };
        if !meta.file_type().is_symlink() || (pending.is_empty() && !follow_last) {
            continue;
        }
        links += 1;
        if links > MAX_SYMLINKS {
            return Err(DriverError::SymlinkLoop {
                root: root.to_path_buf(),
                path: path.to_path_buf(),
            });
        }
        let target = std::fs::read_link(&here).map_err(|source| DriverError::Io {
            action: "read symlink",
            path: here.clone(),
            source,
        })?;
        done.pop();
        if target.has_root() {
            done.clear();
        }
        push_front(&mut pending, &target);
    }
    Ok(join(root, &done))
}

/// Queue `path`'s components ahead of what is pending (`/` and `.` carry no name).
fn push_front(pending: &mut VecDeque<OsString>, path: &Path) {
    let names: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    for n in names.into_iter().rev() {
        pending.push_front(n);
    }
}

fn join(root: &Path, names: &[OsString]) -> PathBuf {
    let mut p = root.to_path_buf();
    p.extend(names);
    p
}

/// Create directory `path` and its missing parents inside `root` (mode 0755, like
/// `mkdir -p`), each step resolved in the root. Returns the directory's path on the host.
/// A non-directory in the way is an error.
pub(crate) fn create_dir_all(root: &Path, path: &Path) -> Result<PathBuf, DriverError> {
    let mut prefix = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(n) => prefix.push(n),
            Component::ParentDir => prefix.push(".."),
            _ => continue,
        }
        let here = resolve(root, &prefix)?;
        match std::fs::metadata(&here) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(DriverError::NotADirectory {
                    root: root.to_path_buf(),
                    path: prefix,
                });
            }
            Err(e) if e.kind() == ErrorKind::NotFound => create_resolved(root, &here)?,
            Err(source) => {
                return Err(DriverError::Io {
                    action: "inspect",
                    path: here,
                    source,
                });
            }
        }
    }
    resolve(root, path)
}

/// Create the missing directories of `here`, a path [`resolve`] returned: its existing
/// components are real directories and the rest are plain names, so each is created
/// with `mkdir` directly; a symlink appearing on the way is refused.
fn create_resolved(root: &Path, here: &Path) -> Result<(), DriverError> {
    let rel = here.strip_prefix(root).unwrap_or(Path::new(""));
    let mut at = root.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => {
                return Err(DriverError::NotADirectory {
                    root: root.to_path_buf(),
                    path: at,
                });
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(source) => {
                return Err(DriverError::Io {
                    action: "inspect",
                    path: at,
                    source,
                });
            }
        }
        match std::fs::create_dir(&at) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists && at.is_dir() => {}
            Err(source) => {
                return Err(DriverError::Io {
                    action: "create directory",
                    path: at,
                    source,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn hostile_root() -> tempfile::TempDir {
        let t = tempfile::tempdir().expect("tmp");
        let r = t.path();
        std::fs::create_dir_all(r.join("usr/lib")).expect("mkdir");
        std::fs::create_dir_all(r.join("etc")).expect("mkdir");
        // Absolute: means /host-root inside the container, never the host's.
        symlink("/host-root", r.join("usr/lib/x86_64-linux-gnu")).expect("ln");
        // Climbs far above the root.
        symlink("../../../../../..", r.join("usr/lib/up")).expect("ln");
        symlink("../../..", r.join("a")).expect("ln");
        symlink("/etc/../../../../proc/self", r.join("etc/self")).expect("ln");
        symlink("loop2", r.join("loop1")).expect("ln");
        symlink("loop1", r.join("loop2")).expect("ln");
        symlink("lib", r.join("usr/lib64")).expect("ln");
        t
    }

    #[test]
    fn absolute_and_dotdot_symlinks_are_rerooted() -> Result<(), DriverError> {
        let t = hostile_root();
        let r = t.path();
        assert_eq!(
            resolve(r, Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1"))?,
            r.join("host-root/libcuda.so.1")
        );
        assert_eq!(
            resolve(r, Path::new("/usr/lib/up/etc/passwd"))?,
            r.join("etc/passwd")
        );
        assert_eq!(resolve(r, Path::new("a/etc/shadow"))?, r.join("etc/shadow"));
        assert_eq!(resolve(r, Path::new("/../../etc"))?, r.join("etc"));
        assert_eq!(
            resolve(r, Path::new("/etc/self/root"))?,
            r.join("proc/self/root")
        );
        assert_eq!(resolve(r, Path::new("/usr/lib64/x"))?, r.join("usr/lib/x"));
        // The link itself, when asked for.
        assert_eq!(
            walk(r, Vec::new(), Path::new("/usr/lib/x86_64-linux-gnu"), false)?,
            r.join("usr/lib/x86_64-linux-gnu")
        );
        for p in [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/up",
            "/a",
            "/etc/self/x",
        ] {
            let got = resolve(r, Path::new(p))?;
            assert!(got.starts_with(r), "{p} -> {}", got.display());
        }
        Ok(())
    }

    /// Resolving a name from an already resolved folder gives what resolving the whole
    /// path gives, hostile links and missing parts included (driver discovery memoises
    /// folders this way).
    #[test]
    fn resolve_in_a_resolved_folder_matches_resolve() -> Result<(), DriverError> {
        let t = hostile_root();
        let r = t.path();
        for p in [
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/lib/up/etc/passwd",
            "/usr/lib64/x",
            "/etc/self/root",
            "/missing/dir/lib.so",
            "/usr/lib/x86_64-linux-gnu/../up/etc/passwd",
        ] {
            let path = Path::new(p);
            let (folder, name) = (
                path.parent().expect("folder"),
                path.file_name().expect("name"),
            );
            let base = resolve(r, folder)?;
            assert_eq!(
                resolve_in(r, &base, Path::new(name))?,
                resolve(r, path)?,
                "{p}"
            );
        }
        Ok(())
    }

    #[test]
    fn loops_fail_closed_naming_the_path() {
        let t = hostile_root();
        let e = resolve(t.path(), Path::new("/loop1/x")).expect_err("loop");
        assert!(matches!(e, DriverError::SymlinkLoop { .. }));
        assert!(e.to_string().contains("/loop1/x"), "{e}");
    }

    #[test]
    fn create_dir_all_stays_inside_through_hostile_links() -> Result<(), DriverError> {
        let t = hostile_root();
        let r = t.path();
        let made = create_dir_all(r, Path::new("/usr/lib/x86_64-linux-gnu/nvidia/sub"))?;
        assert_eq!(made, r.join("host-root/nvidia/sub"));
        assert!(made.is_dir());
        let made = create_dir_all(r, Path::new("/a/etc/ld.so.conf.d"))?;
        assert_eq!(made, r.join("etc/ld.so.conf.d"));
        std::fs::write(r.join("file"), "x").expect("write");
        let e = create_dir_all(r, Path::new("/file/sub")).expect_err("file in the way");
        assert!(e.to_string().contains("/file"), "{e}");
        Ok(())
    }
}
