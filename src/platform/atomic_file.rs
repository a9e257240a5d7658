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

/// Length of the random part `tempfile` puts in a temp file's name (its default).
const TEMP_RANDOM_LEN: usize = 6;

/// Whether `name` is one of [`replace`]'s temp files: `.<target>.<6 random>.tmp`. Nothing
/// else in a directory we share with others matches, so only our own litter is removed.
pub(crate) fn is_temp_name(name: &str) -> bool {
    let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
        return false;
    };
    let Some((target, random)) = inner.rsplit_once('.') else {
        return false;
    };
    !target.is_empty()
        && random.len() == TEMP_RANDOM_LEN
        && random.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Remove the temp files a killed [`replace`] left in `dir` (regular files whose names
/// [`is_temp_name`] accepts; symlinks and anything else are left alone) and make that
/// durable; the paths removed. A missing `dir` has none.
pub(crate) fn remove_temps(dir: &Path) -> Result<Vec<PathBuf>, IoAt> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(at(dir)(e)),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(at(dir))?;
        let name = entry.file_name();
        let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
        if is_file && is_temp_name(&name.to_string_lossy()) {
            let path = entry.path();
            if remove_if_present(&path)? {
                removed.push(path);
            }
        }
    }
    if !removed.is_empty() {
        sync_dir(dir)?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_write_leaves_a_temp_that_is_recognised_and_removed_and_nothing_else_is() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("k8s.gpu-slicer.io-claim_x.json");
        // What a write killed before its rename leaves: the temp file `replace` creates.
        let tmp = tempfile::Builder::new()
            .prefix(".k8s.gpu-slicer.io-claim_x.json.")
            .suffix(".tmp")
            .tempfile_in(dir.path())
            .unwrap();
        let (_, left) = tmp.keep().unwrap();
        replace(dir.path(), &target, b"{}", 0o644).unwrap();
        // Look-alikes that are not ours, and a symlink named like ours.
        let others = [
            ".k8s.json.12345.tmp",
            "k8s.json.abcdef.tmp",
            ".hidden.tmp",
            ".x.abcdef.tmp.json",
            ".x.abc-ef.tmp",
        ];
        for o in others {
            fs::write(dir.path().join(o), "keep").unwrap();
        }
        std::os::unix::fs::symlink(&target, dir.path().join(".link.json.abcdef.tmp")).unwrap();
        let removed = remove_temps(dir.path()).unwrap();
        assert_eq!(removed, std::slice::from_ref(&left));
        assert!(!left.exists() && target.exists());
        for o in others {
            assert!(dir.path().join(o).exists(), "{o}");
        }
        assert!(dir.path().join(".link.json.abcdef.tmp").is_symlink());
        assert!(
            remove_temps(&dir.path().join("missing"))
                .unwrap()
                .is_empty()
        );
    }
}
