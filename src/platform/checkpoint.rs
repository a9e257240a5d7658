//! The held-device checkpoint: what Allocate handed out, persisted so a restart (SIGKILL
//! included) writes its first CDI spec with every held device still in it.
//!
//! One JSON file, `held.json`, in a state directory of gpu-slicer's own (`--state-dir`,
//! default `/var/lib/gpu-slicer`): not the device-plugin directory, whose other files the
//! kubelet deletes when it restarts. Written atomically (an unpredictable temp name created
//! exclusively in the same directory, fsync'ed, renamed over the file, directory fsync'ed)
//! and only read back at start. The file is a `platform::versioned` envelope (kind, schema
//! version, SHA-256): a file of the release before is read and written back by the caller, a
//! newer schema or a failed checksum is refused. Writes are serialised, and each one writes the store's
//! held set as it is when the write starts, so a later write never loses a newer record.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::domain::snapshot::Held;

/// File name of the checkpoint inside the state directory.
pub(crate) const FILE_NAME: &str = "held.json";
/// Its kind in the state-file envelope (`platform::versioned`).
const KIND: &str = "gpu-slicer.io/held-devices";

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
    /// The file is not a checkpoint this release reads (damaged, or a newer schema).
    #[error("held-device checkpoint {path}: {source}")]
    Format {
        path: PathBuf,
        #[source]
        source: super::versioned::VersionedError,
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
    /// refused, not followed. [`Decoded::Legacy`](super::versioned::Decoded): written by the
    /// release before versioned state, for the caller to write back in this schema.
    pub(crate) fn load(&self) -> Result<super::versioned::Decoded<Held>, CheckpointError> {
        let path = self.path();
        let io = |source| CheckpointError::Io {
            path: path.clone(),
            source,
        };
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Ok(super::versioned::Decoded::Current(Held::default()));
            }
            Err(e) => return Err(io(e)),
            Ok(m) if !m.file_type().is_file() => {
                return Err(io(std::io::Error::new(
                    ErrorKind::InvalidData,
                    "not a regular file",
                )));
            }
            Ok(_) => {}
        }
        let bytes = std::fs::read(&path).map_err(io)?;
        super::versioned::decode(KIND, &bytes).map_err(|source| CheckpointError::Format {
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
        let bytes =
            super::versioned::encode(KIND, &held).map_err(|source| CheckpointError::Format {
                path: path.clone(),
                source: source.into(),
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
        assert!(
            cp.load().unwrap().into_inner().is_empty(),
            "absent file: nothing held"
        );
        let mut held = Held::default();
        let cdi: BTreeSet<String> = ["GPU-1-share-3".to_string()].into();
        held.record("nvidia.com/gpu.shared", ["GPU-1::0"], &cdi, Instant::now());
        cp.save_with(|| held.clone()).unwrap();
        let back = cp.load().unwrap();
        let super::super::versioned::Decoded::Current(back) = back else {
            panic!("written in this schema: {back:?}");
        };
        assert_eq!(back.cdi_names(), cdi);
        assert_eq!(back.ids(), held.ids());
    }

    /// The file the release before versioned state wrote reads as what it held.
    #[test]
    fn the_release_befores_file_is_read_as_legacy() {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/upgrade/v1/dp/state/held.json");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(&fixture, dir.path().join(FILE_NAME)).unwrap();
        let loaded = Checkpoint::new(dir.path()).load().unwrap();
        let super::super::versioned::Decoded::Legacy(held) = loaded else {
            panic!("schema 1 read as {loaded:?}");
        };
        assert_eq!(held.len(), 5, "{held:?}");
        assert!(
            held.cdi_names()
                .contains("GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03-share-3")
        );
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
