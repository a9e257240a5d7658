//! The name of the config last applied from `--config-dir`, kept in `--state-dir`
//! (`config-applied`, one line), so that an agent restarted while the API server is down
//! serves the pool's config rather than the default until it can read its Node's labels.
//! Written atomically when the applied name changes; read once at start.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// File name inside the state directory.
pub(crate) const FILE_NAME: &str = "config-applied";

/// Errors writing the record (reading treats anything unusable as "no record").
#[derive(Debug, thiserror::Error)]
pub(crate) enum FleetStateError {
    #[error("applied-config record {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The recorded name, if there is a usable one.
pub(crate) fn read(dir: &Path) -> Option<String> {
    let path = dir.join(FILE_NAME);
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(text.trim().to_owned()).filter(|n| !n.is_empty()),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "applied-config record unreadable: ignored");
            None
        }
    }
}

/// Record `name` as applied (creates `dir` when missing).
pub(crate) fn write(dir: &Path, name: &str) -> Result<(), FleetStateError> {
    let path = dir.join(FILE_NAME);
    let io = |e: super::atomic_file::IoAt| FleetStateError::Io {
        path: e.path,
        source: e.source,
    };
    std::fs::create_dir_all(dir).map_err(|source| FleetStateError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    super::atomic_file::replace(dir, &path, format!("{name}\n").as_bytes(), 0o644).map_err(io)?;
    super::atomic_file::sync_dir(dir).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_absent() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), None);
        write(&dir.path().join("new"), "inference").unwrap();
        assert_eq!(read(&dir.path().join("new")).as_deref(), Some("inference"));
    }
}
