//! Kubelet restart detection: an inotify watch (notify) on the directory holding
//! `kubelet.sock`. The kubelet deletes every plugin socket and creates `kubelet.sock` anew
//! when it starts, so each Create of that file bumps a generation counter published on a
//! `tokio::sync::watch` channel. The channel keeps only the latest value, which coalesces
//! bursts; every resource task re-serves and re-registers on a change.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use crate::platform::fswatch::{DirWatch, FsKind, Handler};

/// Errors setting up the watch.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchError {
    /// The directory could not be created.
    #[error("cannot create directory {path}: {source}")]
    CreateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// inotify refused the watch.
    #[error("cannot watch directory {path}: {source}")]
    Watch {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A live watch on the kubelet socket's directory. Dropping it stops the watch.
#[derive(Debug)]
pub(crate) struct KubeletWatch {
    /// Kept alive for as long as events are wanted: the last holder of the shared watcher
    /// ends the inotify watch and its thread.
    _watcher: Arc<DirWatch>,
    generation: watch::Receiver<u64>,
}

impl KubeletWatch {
    /// Start watching the directory of `kubelet_socket` (created if missing, so a plugin
    /// that starts before the kubelet waits instead of failing).
    pub(crate) fn start(kubelet_socket: &Path, fs: &Arc<DirWatch>) -> Result<Self, WatchError> {
        let dir = kubelet_socket
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        std::fs::create_dir_all(&dir).map_err(|source| WatchError::CreateDir {
            path: dir.display().to_string(),
            source,
        })?;
        let name = kubelet_socket.file_name().map(|n| n.to_os_string());
        let (tx, rx) = watch::channel(0u64);
        let handler: Handler = Box::new(move |event| {
            // Runs on the watcher's reader task: a non-async send is right here.
            if event.kind != FsKind::Created {
                return;
            }
            if event
                .path
                .as_ref()
                .is_some_and(|p| p.file_name().map(|n| n.to_os_string()) == name)
            {
                tx.send_modify(|g| *g += 1);
            }
        });
        fs.watch(&dir, handler)
            .map_err(|source| WatchError::Watch {
                path: dir.display().to_string(),
                source,
            })?;
        Ok(Self {
            _watcher: fs.clone(),
            generation: rx,
        })
    }

    /// A receiver that changes every time `kubelet.sock` is created.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.clone()
    }
}
