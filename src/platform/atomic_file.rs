//! Replacing a file in one step, for the files the agent writes for others to read at any
//! moment: CDI specs ([`super::cdi_writer`]), the NFD feature file ([`super::labels_file`])
//! and the held-device checkpoint ([`super::checkpoint`]).
//!
//! The new bytes go to a hidden temp file in the target's directory, created by the
//! `tempfile` crate (random name, `O_CREAT|O_EXCL`: a symlink planted in a shared directory
//! is never followed), are given their mode (the umask may have narrowed it at creation),
//! fsync'ed, and renamed over the target, which replaces a symlink there rather than
//! following it. Callers fsync the directory ([`sync_dir`]) once the renames and unlinks of
//! one write are done. Errors carry the path they happened on; each caller translates them
//! into its own error once.

use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteOutcome {
    /// The file was created or replaced.
    Written,
    /// The file already held exactly these bytes; nothing was touched.
    Unchanged,
}

/// A filesystem call that failed, and the path it failed on.
#[derive(Debug)]
pub(crate) struct IoAt {
    pub(crate) path: PathBuf,
    pub(crate) source: std::io::Error,
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> IoAt + '_ {
    move |source| IoAt {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `path` is a regular file holding exactly `contents`. Anything else there (a
/// symlink, a FIFO, a directory) is never opened.
pub(crate) fn same_content(path: &Path, contents: &[u8]) -> Result<bool, IoAt> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() && m.len() == contents.len() as u64 => {
            Ok(fs::read(path).map_err(at(path))? == contents)
        }
        Ok(_) => Ok(false),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(at(path)(e)),
    }
}

/// Put `contents` at `target` (in the existing directory `dir`) with `mode`, in one rename.
/// On any error the temp file is deleted when dropped and the old file stays untouched.
pub(crate) fn replace(dir: &Path, target: &Path, contents: &[u8], mode: u32) -> Result<(), IoAt> {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(fs::Permissions::from_mode(mode))
        .tempfile_in(dir)
        .map_err(at(dir))?;
    let tmp_path = tmp.path().to_path_buf();
    let f = tmp.as_file_mut();
    f.write_all(contents).map_err(at(&tmp_path))?;
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(at(&tmp_path))?;
    f.sync_all().map_err(at(&tmp_path))?;
    tmp.persist(target)
        .map(drop)
        .map_err(|e| at(target)(e.error))
}

/// Make the renames and unlinks done in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), IoAt> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(at(dir))
}

/// Remove `path` (a symlink is removed itself, never its target); `false` when nothing was
/// there.
pub(crate) fn remove_if_present(path: &Path) -> Result<bool, IoAt> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(at(path)(e)),
    }
}
