//! Puts a spec file into a CDI directory the way runtimes need it.
//!
//! Runtimes (Podman, containerd, CRI-O) may rescan the directory at any moment, so the file
//! appears in one step ([`super::atomic_file`]): a hidden temp file in the same directory (a
//! name that does not end in `.yaml`/`.json`, so no runtime loads it half-written, and never
//! a planted symlink), mode 0644, renamed over the target; the directory is fsync'ed so the
//! rename survives a crash. Unchanged content is not rewritten (no spurious reloads, no
//! mtime churn).
//!
//! Files touched: the named file, and its other-format twin (`x.json` for `x.yaml` and the
//! reverse), which is removed: runtimes load both, and two files offering the same devices
//! make every one of those devices unresolvable. Called by `crate::cli::cdi` and the
//! agent.

use std::fs;
use std::path::{Path, PathBuf};

use super::atomic_file::{self, IoAt};

use crate::domain::cdi::validate::check_file_name;
use crate::domain::cdi::{CdiError, Result};

/// Mode of written spec files: runtimes run as other users in some setups and must read it.
pub(crate) const SPEC_FILE_MODE: u32 = 0o644;

/// What [`write_spec`] did.
pub(crate) use super::atomic_file::WriteOutcome;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CdiError + '_ {
    move |source| CdiError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn from_io(e: IoAt) -> CdiError {
    CdiError::Io {
        path: e.path,
        source: e.source,
    }
}

/// Write `contents` to `dir/file_name` atomically, creating `dir` if needed, and remove the
/// same spec's file in the other format, if any.
pub(crate) fn write_spec(dir: &Path, file_name: &str, contents: &[u8]) -> Result<WriteOutcome> {
    let target = dir.join(file_name);
    if file_name.contains('/') || file_name.starts_with('.') {
        return Err(CdiError::FileName {
            path: target,
            rule: "must be a plain, non-hidden file name".into(),
        });
    }
    check_file_name(&target)?;
    crate::domain::cdi::foreign::check_file_name(&target)?;
    let outcome = if atomic_file::same_content(&target, contents).map_err(from_io)? {
        WriteOutcome::Unchanged
    } else {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        atomic_file::replace(dir, &target, contents, SPEC_FILE_MODE).map_err(from_io)?;
        WriteOutcome::Written
    };
    let removed_twin = atomic_file::remove_if_present(&twin_path(&target)).map_err(from_io)?;
    if outcome == WriteOutcome::Written || removed_twin {
        // Renames and unlinks are durable only once the directory entry is on disk.
        atomic_file::sync_dir(dir).map_err(from_io)?;
    }
    Ok(outcome)
}

/// The same spec in the other encoding: `a-b.json` for `a-b.yaml` and the reverse.
fn twin_path(target: &Path) -> PathBuf {
    let other = match target.extension().and_then(|e| e.to_str()) {
        Some("yaml") => "json",
        _ => "yaml",
    };
    target.with_extension(other)
}

/// Remove `dir/file_name` and its other-format twin; returns the paths that were there.
pub(crate) fn remove_spec(dir: &Path, file_name: &str) -> Result<Vec<PathBuf>> {
    let target = dir.join(file_name);
    check_file_name(&target)?;
    crate::domain::cdi::foreign::check_file_name(&target)?;
    let mut removed = Vec::new();
    for path in [target.clone(), twin_path(&target)] {
        if atomic_file::remove_if_present(&path).map_err(from_io)? {
            removed.push(path);
        }
    }
    Ok(removed)
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
        assert_eq!(remove_spec(&sub, "a-b.yaml")?, vec![path.clone()]);
        assert!(remove_spec(&sub, "a-b.yaml")?.is_empty());
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

#[cfg(test)]
mod hostile_files_tests;
