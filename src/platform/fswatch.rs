//! One inotify instance for the whole daemon, read by one task on the tokio reactor: no
//! thread of its own (an idle daemon's thread count is a figure we keep low). The
//! kubelet-socket watch (`runtime::plugin::watch`), the DRA registration socket's removal
//! watch (`runtime::socket::RemovalWatch`) and the config-file watch (`runtime::triggers`)
//! each register a directory and a handler; events are routed by the
//! watch they happened in. Handlers run on the reader task and must not block (they send on
//! channels).
//!
//! `inotify` rather than `notify`: `notify` reads its inotify fd on a thread of its own.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio_stream::StreamExt;

/// What happened in a watched directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FsKind {
    /// An entry was created (a file, a directory, a socket bound).
    Created,
    /// An entry's data was written.
    Modified,
    /// An entry was renamed into or out of the directory.
    Renamed,
    /// An entry was deleted.
    Removed,
    /// Events may have been lost (queue overflow, the watch itself gone, a read error):
    /// every handler concerned hears it and decides.
    Lost,
}

/// One event: its kind and the entry's path (the watched directory, as given, joined with
/// the entry's name); `None` when it names no entry (`Lost`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FsEvent {
    /// What happened.
    pub(crate) kind: FsKind,
    /// The entry it happened to.
    pub(crate) path: Option<PathBuf>,
}

/// A directory's event handler.
pub(crate) type Handler = Box<dyn Fn(&FsEvent) + Send>;

struct Route {
    wd: WatchDescriptor,
    dir: PathBuf,
    handler: Handler,
}

type Routes = Arc<Mutex<Vec<Route>>>;

/// The shared watcher. Dropping the last `Arc` ends the reader task and closes the fd.
pub(crate) struct DirWatch {
    watches: Mutex<Watches>,
    routes: Routes,
    reader: tokio::task::AbortHandle,
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dirs: Vec<PathBuf> = lock(&self.routes).iter().map(|r| r.dir.clone()).collect();
        f.debug_struct("DirWatch").field("dirs", &dirs).finish()
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A handler that panicked leaves the route list intact.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What each watch asks for: entries appearing, written, renamed, deleted. Reads, opens and
/// closes are left out (the config loader's own reads would wake it).
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE
}

fn kind_of(mask: EventMask) -> FsKind {
    if mask.intersects(EventMask::Q_OVERFLOW | EventMask::IGNORED) {
        FsKind::Lost
    } else if mask.contains(EventMask::CREATE) {
        FsKind::Created
    } else if mask.intersects(EventMask::MOVED_FROM | EventMask::MOVED_TO) {
        FsKind::Renamed
    } else if mask.contains(EventMask::DELETE) {
        FsKind::Removed
    } else {
        FsKind::Modified
    }
}

impl DirWatch {
    /// Open the inotify instance and start its reader task (no directory watched yet).
    /// Must be called inside a tokio runtime: the fd is read through its reactor.
    pub(crate) fn new() -> std::io::Result<Arc<Self>> {
        let inotify = Inotify::init()?;
        let watches = inotify.watches();
        let mut events = inotify.into_event_stream([0u8; 4096])?;
        let routes: Routes = Arc::default();
        let dispatch = routes.clone();
        let reader = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let routes = lock(&dispatch);
                let event = match event {
                    Ok(e) => e,
                    Err(error) => {
                        // A read error is not transient (the fd is ours alone): tell every
                        // handler and stop, rather than spin on it. Re-scans and SIGHUP
                        // still reload.
                        tracing::error!(%error, "inotify read failed; file watches stop");
                        let lost = FsEvent {
                            kind: FsKind::Lost,
                            path: None,
                        };
                        routes.iter().for_each(|r| (r.handler)(&lost));
                        return;
                    }
                };
                let kind = kind_of(event.mask);
                let overflow = event.mask.contains(EventMask::Q_OVERFLOW);
                for r in routes.iter().filter(|r| overflow || r.wd == event.wd) {
                    let path = match kind {
                        FsKind::Lost => None,
                        _ => event.name.as_ref().map(|n| r.dir.join(n)),
                    };
                    (r.handler)(&FsEvent { kind, path });
                }
            }
        })
        .abort_handle();
        Ok(Arc::new(Self {
            watches: Mutex::new(watches),
            routes,
            reader,
        }))
    }

    /// Watch `dir` (not recursively) and hand its events to `handler`. Paths in events are
    /// `dir` joined with the entry name, so `dir` is matched as given.
    pub(crate) fn watch(&self, dir: &Path, handler: Handler) -> std::io::Result<()> {
        // Held across the add: the reader routes nothing until this watch's route exists,
        // so no event of the new watch is lost.
        let mut routes = lock(&self.routes);
        let wd = lock(&self.watches).add(dir, mask())?;
        routes.push(Route {
            wd,
            dir: dir.to_path_buf(),
            handler,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Creates, writes, renames and deletes in a watched directory reach its handler with
    /// their paths; another directory's handler hears only its own.
    #[tokio::test]
    async fn events_reach_the_handler_of_their_directory() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let fs = DirWatch::new().unwrap();
        let (tx_a, mut rx_a) = tokio::sync::mpsc::unbounded_channel();
        let (tx_b, mut rx_b) = tokio::sync::mpsc::unbounded_channel();
        fs.watch(a.path(), Box::new(move |e| drop(tx_a.send(e.clone()))))
            .unwrap();
        fs.watch(b.path(), Box::new(move |e| drop(tx_b.send(e.clone()))))
            .unwrap();
        let file = a.path().join("config.yaml");
        std::fs::write(&file, "x").unwrap();
        std::fs::rename(&file, a.path().join("moved")).unwrap();
        std::fs::remove_file(a.path().join("moved")).unwrap();
        std::fs::write(b.path().join("other"), "y").unwrap();
        let want = [
            (FsKind::Created, file.clone()),
            (FsKind::Modified, file.clone()),
            (FsKind::Renamed, file.clone()),
            (FsKind::Renamed, a.path().join("moved")),
            (FsKind::Removed, a.path().join("moved")),
        ];
        for (kind, path) in want {
            let e = tokio::time::timeout(Duration::from_secs(5), rx_a.recv())
                .await
                .expect("event in time")
                .expect("open");
            assert_eq!(
                e,
                FsEvent {
                    kind,
                    path: Some(path)
                }
            );
        }
        let e = tokio::time::timeout(Duration::from_secs(5), rx_b.recv())
            .await
            .expect("event in time")
            .expect("open");
        assert_eq!(e.path, Some(b.path().join("other")));
        assert_eq!(e.kind, FsKind::Created);
    }
}
