//! The Node Feature Discovery feature file: written atomically, removed on request.
//!
//! NFD's worker reads every non-hidden file in its `features.d` directory at any moment, so
//! the file appears in one step ([`super::atomic_file`]): a hidden temp file in the same
//! directory (NFD skips names starting with `.`; never a planted symlink), mode 0644,
//! renamed over the target; the directory is fsync'ed after. A symlink at the target is
//! replaced, not followed. A missing directory is created (the DaemonSet's `DirectoryOrCreate` mount does
//! the same on the host), so a node where NFD is installed later finds the file waiting.
//! Called by the labels writer (`crate::runtime::labels`).

use std::fs;
use std::path::{Path, PathBuf};

use super::atomic_file::{self, IoAt};

/// Mode of the feature file: NFD may run as another user.
pub(crate) const FILE_MODE: u32 = 0o644;

/// Errors writing or removing the feature file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LabelsFileError {
    /// The path has no file name or no parent directory.
    #[error("labels file {path}: not a file path")]
    NotAFilePath { path: PathBuf },
    /// A filesystem call failed.
    #[error("labels file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Result alias for this module.
pub(crate) type Result<T, E = LabelsFileError> = std::result::Result<T, E>;

/// What [`write`] did.
pub(crate) use super::atomic_file::WriteOutcome;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LabelsFileError + '_ {
    move |source| LabelsFileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn from_io(e: IoAt) -> LabelsFileError {
    LabelsFileError::Io {
        path: e.path,
        source: e.source,
    }
}

/// The directory of the file path `path` (which must name a file).
fn split(path: &Path) -> Result<&Path> {
    let not_a_file = || LabelsFileError::NotAFilePath {
        path: path.to_path_buf(),
    };
    path.file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(not_a_file)?;
    match path.parent() {
        Some(d) if d.as_os_str().is_empty() => Ok(Path::new(".")),
        Some(d) => Ok(d),
        None => Err(not_a_file()),
    }
}

/// Write `contents` to `path` atomically (see the module header). Unchanged content is not
/// rewritten, so NFD sees no churn.
pub(crate) fn write(path: &Path, contents: &[u8]) -> Result<WriteOutcome> {
    let dir = split(path)?;
    if atomic_file::same_content(path, contents).map_err(from_io)? {
        return Ok(WriteOutcome::Unchanged);
    }
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    atomic_file::replace(dir, path, contents, FILE_MODE).map_err(from_io)?;
    atomic_file::sync_dir(dir).map_err(from_io)?;
    Ok(WriteOutcome::Written)
}

/// Remove the file (a symlink there is removed itself, never its target). `Ok(false)` when
/// there was nothing to remove.
pub(crate) fn remove(path: &Path) -> Result<bool> {
    split(path)?;
    atomic_file::remove_if_present(path).map_err(from_io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn writes_atomically_with_mode_0644_creating_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("features.d/gpu-slicer");
        assert_eq!(write(&path, b"a=1\n").unwrap(), WriteOutcome::Written);
        assert_eq!(fs::read(&path).unwrap(), b"a=1\n");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o644);
        assert_eq!(write(&path, b"a=1\n").unwrap(), WriteOutcome::Unchanged);
        assert_eq!(write(&path, b"a=2\n").unwrap(), WriteOutcome::Written);
        assert_eq!(fs::read(&path).unwrap(), b"a=2\n");
        // No temp file left behind.
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("gpu-slicer")]);
    }

    #[test]
    fn a_planted_symlink_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let path = dir.path().join("gpu-slicer");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        assert_eq!(write(&path, b"a=1\n").unwrap(), WriteOutcome::Written);
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert!(fs::symlink_metadata(&path).unwrap().is_file());
        // Removing a link removes the link only.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        assert!(remove(&path).unwrap());
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert!(!remove(&path).unwrap());
    }

    #[test]
    fn errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        fs::write(&blocker, b"").unwrap();
        let err = write(&blocker.join("gpu-slicer"), b"a=1\n").unwrap_err();
        assert!(
            err.to_string().contains(&*blocker.to_string_lossy()),
            "{err}"
        );
        let err = write(Path::new("/"), b"").unwrap_err();
        assert!(matches!(err, LabelsFileError::NotAFilePath { .. }), "{err}");
    }
}
