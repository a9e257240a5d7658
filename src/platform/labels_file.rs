//! The Node Feature Discovery feature file: written atomically, removed on request.
//!
//! NFD's worker reads every non-hidden file in its `features.d` directory at any moment, so
//! the file appears in one step: a hidden temp file in the same directory (NFD skips names
//! starting with `.`), created by the `tempfile` crate with `O_CREAT|O_EXCL` (a symlink
//! planted in the directory is never followed), given mode 0644, fsync'ed and renamed over
//! the target; the directory is fsync'ed after. A symlink at the target is replaced, not
//! followed. A missing directory is created (the DaemonSet's `DirectoryOrCreate` mount does
//! the same on the host), so a node where NFD is installed later finds the file waiting.
//! Called by the labels writer (`crate::runtime::labels`).

use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Mode of the feature file: NFD may run as another user.
pub const FILE_MODE: u32 = 0o644;

/// Errors writing or removing the feature file.
#[derive(Debug, thiserror::Error)]
pub enum LabelsFileError {
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
pub type Result<T, E = LabelsFileError> = std::result::Result<T, E>;

/// What [`write`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The file was created or replaced.
    Written,
    /// It already held exactly these bytes.
    Unchanged,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LabelsFileError + '_ {
    move |source| LabelsFileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn split(path: &Path) -> Result<(&Path, &str)> {
    let not_a_file = || LabelsFileError::NotAFilePath {
        path: path.to_path_buf(),
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(not_a_file)?;
    let dir = match path.parent() {
        Some(d) if d.as_os_str().is_empty() => Path::new("."),
        Some(d) => d,
        None => return Err(not_a_file()),
    };
    Ok((dir, name))
}

/// Write `contents` to `path` atomically (see the module header). Unchanged content is not
/// rewritten, so NFD sees no churn.
pub fn write(path: &Path, contents: &[u8]) -> Result<WriteOutcome> {
    let (dir, name) = split(path)?;
    if same_content(path, contents)? {
        return Ok(WriteOutcome::Unchanged);
    }
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(fs::Permissions::from_mode(FILE_MODE))
        .tempfile_in(dir)
        .map_err(io_err(dir))?;
    let tmp_path = tmp.path().to_path_buf();
    let f = tmp.as_file_mut();
    f.write_all(contents).map_err(io_err(&tmp_path))?;
    // The umask may have narrowed the mode at creation.
    f.set_permissions(fs::Permissions::from_mode(FILE_MODE))
        .map_err(io_err(&tmp_path))?;
    f.sync_all().map_err(io_err(&tmp_path))?;
    // On error the temp file is deleted when dropped and the old file stays.
    tmp.persist(path).map_err(|e| io_err(path)(e.error))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    Ok(WriteOutcome::Written)
}

/// Remove the file (a symlink there is removed itself, never its target). `Ok(false)` when
/// there was nothing to remove.
pub fn remove(path: &Path) -> Result<bool> {
    split(path)?;
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(path)(e)),
    }
}

/// Whether `path` is a regular file holding exactly `contents`; anything else there (a
/// symlink, a FIFO) is never opened.
fn same_content(path: &Path, contents: &[u8]) -> Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() && m.len() == contents.len() as u64 => {
            Ok(fs::read(path).map_err(io_err(path))? == contents)
        }
        Ok(_) => Ok(false),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(path)(e)),
    }
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
