//! The unix sockets both front-ends serve on: bound fresh (a stale socket of an earlier run
//! replaced, mode 0600, the path checked against `sun_path`), their clients read through
//! `platform::uds_authority`, and unlinked when serving stops. `runtime::plugin` (one socket
//! per resource) and `runtime::dra` (the DRA service and registration sockets) both use it
//! and name nothing of each other.
//!
//! A socket the kubelet may delete (the DRA registration socket, when a kubelet restart
//! cleans its plugin registry) is followed by a [`RemovalWatch`] on the daemon's one inotify
//! instance (`crate::platform::fswatch`), as the device plugin follows `kubelet.sock`: no
//! polling.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::platform::fswatch::{DirWatch, FsKind, Handler};

pub(crate) use crate::platform::uds_authority::incoming;

/// Longest unix socket path (`sun_path` is 108 bytes including the terminator).
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// Why a socket could not be served.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SocketError {
    /// The socket path does not fit in `sun_path`.
    #[error(
        "socket path {path} is {len} bytes, longer than the {MAX_SOCKET_PATH} a unix socket allows"
    )]
    PathTooLong { path: String, len: usize },
    /// Socket directory, stale socket removal, bind or chmod failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Bind a fresh socket at `path` (its directory made, a stale socket replaced), mode 0600.
pub(crate) fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    let shown = || path.display().to_string();
    let io = |action: &'static str| {
        move |source| SocketError::Io {
            action,
            path: shown(),
            source,
        }
    };
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(SocketError::PathTooLong { path: shown(), len });
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io("create directory for"))?;
    }
    remove(path).map_err(io("remove stale socket"))?;
    let listener = UnixListener::bind(path).map_err(io("bind"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io("chmod"))?;
    Ok(listener)
}

/// Tells when a served socket file is gone, from its directory's inotify events.
#[derive(Debug)]
pub(crate) struct RemovalWatch {
    path: PathBuf,
    /// Bumped on every event that may have removed the file.
    events: watch::Receiver<u64>,
    /// Keeps the inotify reader alive as long as this watch.
    _fs: Arc<DirWatch>,
}

impl RemovalWatch {
    /// Follow `path` through `fs` (its directory made if missing).
    pub(crate) fn start(path: &Path, fs: &Arc<DirWatch>) -> Result<Self, SocketError> {
        let dir = path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let io = |action: &'static str| {
            let dir = dir.display().to_string();
            move |source| SocketError::Io {
                action,
                path: dir,
                source,
            }
        };
        std::fs::create_dir_all(&dir).map_err(io("create directory"))?;
        let name = path.file_name().map(std::ffi::OsStr::to_os_string);
        let (tx, rx) = watch::channel(0u64);
        let handler: Handler = Box::new(move |event| {
            // On the watcher's reader task: a plain send, nothing that blocks.
            let ours = event
                .path
                .as_ref()
                .is_some_and(|p| p.file_name().map(std::ffi::OsStr::to_os_string) == name);
            let may_be_gone = match event.kind {
                FsKind::Removed | FsKind::Renamed => ours,
                // Events lost: look.
                FsKind::Lost => true,
                FsKind::Created | FsKind::Modified => false,
            };
            if may_be_gone {
                tx.send_modify(|n| *n += 1);
            }
        });
        fs.watch(&dir, handler).map_err(io("watch"))?;
        Ok(Self {
            path: path.to_path_buf(),
            events: rx,
            _fs: fs.clone(),
        })
    }

    /// Return once the file is gone: checked now (it may have gone before the watch
    /// started), then after every event that may have removed it (a rename onto it, or our
    /// own re-bind replacing it, leaves it there).
    pub(crate) async fn removed(&mut self) {
        loop {
            if std::fs::symlink_metadata(&self.path).is_err() {
                return;
            }
            if self.events.changed().await.is_err() {
                // The watcher is gone (its reader stopped): nothing more will be heard.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Remove a socket file; it being gone already (the kubelet deletes sockets) is fine.
pub(crate) fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[tokio::test]
    async fn bind_refuses_paths_longer_than_sun_path() {
        let long = PathBuf::from(format!("/tmp/{}/x.sock", "d".repeat(110)));
        assert!(matches!(bind(&long), Err(SocketError::PathTooLong { .. })));
    }

    #[tokio::test]
    async fn bind_replaces_a_stale_socket_with_mode_0600() {
        let dir = tempfile::Builder::new()
            .prefix("gsp")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let path = dir.path().join("s.sock");
        let stale = std::os::unix::net::UnixListener::bind(&path).expect("stale");
        drop(stale);
        let _listener = bind(&path).expect("bind over stale socket");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        remove(&path).expect("remove");
        remove(&path).expect("already gone is fine");
    }

    /// A removal is heard through inotify, and the watch wakes only with the file gone (a
    /// re-bind over it, remove + bind, is not taken for one).
    #[tokio::test]
    async fn a_removal_watch_wakes_when_the_socket_is_deleted() {
        let dir = tempfile::Builder::new()
            .prefix("gsp")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let path = dir.path().join("r.sock");
        let fs = DirWatch::new().expect("inotify");
        let _first = bind(&path).expect("bind");
        let mut watch = RemovalWatch::start(&path, &fs).expect("watch");
        // Re-bound in place: its events reach the watch, the file is still there.
        let _second = bind(&path).expect("bind again");
        let woke = async {
            watch.removed().await;
            // Checked the moment it wakes: gone.
            std::fs::symlink_metadata(&path).is_err()
        };
        let deleted = async {
            tokio::task::yield_now().await;
            std::fs::remove_file(&path).expect("delete");
        };
        let (woke, ()) = tokio::join!(
            tokio::time::timeout(std::time::Duration::from_secs(10), woke),
            deleted
        );
        assert_eq!(
            woke.ok(),
            Some(true),
            "heard, and only once the file was gone"
        );
    }
}
