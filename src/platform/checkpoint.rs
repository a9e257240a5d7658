//! The held-device checkpoint: what Allocate handed out, persisted so a restart (SIGKILL
//! included) writes its first CDI spec with every held device still in it.
//!
//! One JSON file, `held.json`, in a state directory of gpu-slicer's own (`--state-dir`,
//! default `/var/lib/gpu-slicer`): not the device-plugin directory, whose other files the
//! kubelet deletes when it restarts. Written atomically (an unpredictable temp name created
//! exclusively in the same directory, fsync'ed, renamed over the file, directory fsync'ed)
//! and only read back at start. Writes are serialised, and each one writes the store's
//! held set as it is when the write starts, so a later write never loses a newer record.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::domain::snapshot::Held;

/// File name of the checkpoint inside the state directory.
pub(crate) const FILE_NAME: &str = "held.json";

/// Errors reading or writing the checkpoint.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckpointError {
    /// The file or its directory could not be read or written.
    #[error("held-device checkpoint {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a checkpoint.
    #[error("held-device checkpoint {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The checkpoint file of one state directory.
#[derive(Debug)]
pub(crate) struct Checkpoint {
    dir: PathBuf,
    /// Serialises writers (Allocate answers on several streams at once).
    lock: Mutex<()>,
}

impl Checkpoint {
    /// The checkpoint in `dir` (created on first write).
    pub(crate) fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            lock: Mutex::new(()),
        }
    }

    /// Path of the file.
    pub(crate) fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Read the held set; an absent file is an empty set. A symlink in its place is
    /// refused, not followed.
    pub(crate) fn load(&self) -> Result<Held, CheckpointError> {
        let path = self.path();
        let io = |source| CheckpointError::Io {
            path: path.clone(),
            source,
        };
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Held::default()),
            Err(e) => return Err(io(e)),
            Ok(m) if !m.file_type().is_file() => {
                return Err(io(std::io::Error::new(
                    ErrorKind::InvalidData,
                    "not a regular file",
                )));
            }
            Ok(_) => {}
        }
        let text = std::fs::read_to_string(&path).map_err(io)?;
        serde_json::from_str(&text).map_err(|source| CheckpointError::Parse {
            path: path.clone(),
            source,
        })
    }

    /// Write `held()` (called under the write lock, so it reads the newest set).
    pub(crate) fn save_with(&self, held: impl FnOnce() -> Held) -> Result<(), CheckpointError> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let held = held();
        let path = self.path();
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| CheckpointError::Io { path: p, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let bytes = serde_json::to_vec_pretty(&held).map_err(|source| CheckpointError::Parse {
            path: path.clone(),
            source,
        })?;
        let from_io = |e: super::atomic_file::IoAt| CheckpointError::Io {
            path: e.path,
            source: e.source,
        };
        // Mode 0600: what is held is the agent's own record, no one else reads it.
        super::atomic_file::replace(&self.dir, &path, &bytes, 0o600).map_err(from_io)?;
        super::atomic_file::sync_dir(&self.dir).map_err(from_io)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Instant;

    use super::*;

    #[test]
    fn round_trip_and_absent_file() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("state"));
        assert!(cp.load().unwrap().is_empty(), "absent file: nothing held");
        let mut held = Held::default();
        let cdi: BTreeSet<String> = ["GPU-1-share-3".to_string()].into();
        held.record("nvidia.com/gpu.shared", ["GPU-1::0"], &cdi, Instant::now());
        cp.save_with(|| held.clone()).unwrap();
        let back = cp.load().unwrap();
        assert_eq!(back.cdi_names(), cdi);
        assert_eq!(back.ids(), held.ids());
    }

    #[test]
    fn a_planted_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::os::unix::fs::symlink(&victim, state.join(FILE_NAME)).unwrap();
        let cp = Checkpoint::new(&state);
        assert!(cp.load().is_err(), "a symlink is refused on read");
        cp.save_with(Held::default).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(
            !std::fs::symlink_metadata(state.join(FILE_NAME))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }
}
