//! Puts a spec file into a CDI directory the way runtimes need it.
//!
//! Runtimes (Podman, containerd, CRI-O) may rescan the directory at any moment, so the file
//! appears in one step: written to a hidden temp file in the same directory (a name that
//! does not end in `.yaml`/`.json`, so no runtime loads it half-written), fsync'ed, given mode
//! 0644 and renamed over the target; the directory is fsync'ed so the rename survives a
//! crash. Unchanged content is not rewritten (no spurious reloads, no mtime churn). Only the
//! named file is ever touched. Called by `crate::cli::cdi` and, later, the agent.

use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::domain::cdi::validate::check_file_name;
use crate::domain::cdi::{CdiError, Result};

/// Mode of written spec files: runtimes run as other users in some setups and must read it.
pub const SPEC_FILE_MODE: u32 = 0o644;

/// What [`write_spec`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The file was created or replaced.
    Written,
    /// The file already held exactly these bytes; nothing was touched.
    Unchanged,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CdiError + '_ {
    move |source| CdiError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Write `contents` to `dir/file_name` atomically, creating `dir` if needed.
pub fn write_spec(dir: &Path, file_name: &str, contents: &[u8]) -> Result<WriteOutcome> {
    let target = dir.join(file_name);
    if file_name.contains('/') || file_name.starts_with('.') {
        return Err(CdiError::FileName {
            path: target,
            rule: "must be a plain, non-hidden file name".into(),
        });
    }
    check_file_name(&target)?;
    match fs::read(&target) {
        Ok(existing) if existing == contents => return Ok(WriteOutcome::Unchanged),
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&target)(e)),
    }
    fs::create_dir_all(dir).map_err(io_err(dir))?;

    let tmp = temp_path(dir, file_name);
    let result = write_and_rename(&tmp, &target, contents);
    if result.is_err() {
        // Leave nothing behind; the old file (if any) is untouched because rename never ran.
        let _ = fs::remove_file(&tmp);
    }
    result?;
    // The rename is durable only once the directory entry is on disk.
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    Ok(WriteOutcome::Written)
}

fn temp_path(dir: &Path, file_name: &str) -> PathBuf {
    dir.join(format!(".{file_name}.{}.tmp", std::process::id()))
}

fn write_and_rename(tmp: &Path, target: &Path, contents: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(SPEC_FILE_MODE)
        .open(tmp)
        .map_err(io_err(tmp))?;
    f.write_all(contents).map_err(io_err(tmp))?;
    // The umask may have narrowed the mode at creation.
    f.set_permissions(fs::Permissions::from_mode(SPEC_FILE_MODE))
        .map_err(io_err(tmp))?;
    f.sync_all().map_err(io_err(tmp))?;
    drop(f);
    fs::rename(tmp, target).map_err(io_err(target))
}

/// Remove `dir/file_name`; returns whether a file was there.
pub fn remove_spec(dir: &Path, file_name: &str) -> Result<bool> {
    let target = dir.join(file_name);
    check_file_name(&target)?;
    match fs::remove_file(&target) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(&target)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn writes_atomically_with_mode_and_skips_unchanged() -> Result<()> {
        let dir = tempfile::tempdir().map_err(io_err(Path::new("tmp")))?;
        let sub = dir.path().join("cdi");
        let other = dir.path().join("other.yaml");
        fs::write(&other, "keep").map_err(io_err(&other))?;
        assert_eq!(
            write_spec(&sub, "a-b.yaml", b"one\n")?,
            WriteOutcome::Written
        );
        let path = sub.join("a-b.yaml");
        let meta = fs::metadata(&path).map_err(io_err(&path))?;
        assert_eq!(meta.mode() & 0o777, SPEC_FILE_MODE);
        let ino = meta.ino();
        assert_eq!(
            write_spec(&sub, "a-b.yaml", b"one\n")?,
            WriteOutcome::Unchanged
        );
        let meta = fs::metadata(&path).map_err(io_err(&path))?;
        assert_eq!(meta.ino(), ino, "unchanged content must not be rewritten");
        assert_eq!(
            write_spec(&sub, "a-b.yaml", b"two\n")?,
            WriteOutcome::Written
        );
        assert_eq!(fs::read(&path).map_err(io_err(&path))?, b"two\n");
        let names: Vec<_> = fs::read_dir(&sub)
            .map_err(io_err(&sub))?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        assert_eq!(names.len(), 1, "no temp files left: {names:?}");
        assert_eq!(fs::read(&other).map_err(io_err(&other))?, b"keep");
        assert!(remove_spec(&sub, "a-b.yaml")?);
        assert!(!remove_spec(&sub, "a-b.yaml")?);
        Ok(())
    }

    #[test]
    fn refuses_names_runtimes_ignore() {
        let dir = Path::new("/nonexistent-cdi-dir");
        assert!(write_spec(dir, "a.yml", b"x").is_err());
        assert!(write_spec(dir, "../a.yaml", b"x").is_err());
        assert!(write_spec(dir, ".a.yaml", b"x").is_err());
    }
}
