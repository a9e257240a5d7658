//! One inotify watcher for the whole daemon. `notify` runs one thread per watcher; the
//! kubelet-socket watch and the config-file watch share this one, so an idle daemon keeps a
//! single watcher thread. Each user registers a directory and a handler; events are routed
//! by the directory they happened in. Handlers run on the watcher's thread and must not
//! block (they send on channels).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use notify::{RecommendedWatcher, RecursiveMode, Watcher};

/// What a handler receives: an event in its directory, or a watcher error (a queue
/// overflow lost events: every handler hears it and decides).
pub type Handler = Box<dyn Fn(&notify::Result<notify::Event>) + Send>;

type Routes = Arc<Mutex<Vec<(PathBuf, Handler)>>>;

/// The shared watcher. Dropping the last `Arc` ends the watch and its thread.
pub struct DirWatch {
    watcher: Mutex<RecommendedWatcher>,
    routes: Routes,
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dirs: Vec<PathBuf> = lock(&self.routes).iter().map(|(d, _)| d.clone()).collect();
        f.debug_struct("DirWatch").field("dirs", &dirs).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A handler that panicked leaves the route list intact.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DirWatch {
    /// Start the watcher thread (no directory watched yet).
    pub fn new() -> notify::Result<Arc<Self>> {
        let routes: Routes = Arc::default();
        let dispatch = routes.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let routes = lock(&dispatch);
            for (dir, handler) in routes.iter() {
                let concerns = match &res {
                    Ok(e) => e.paths.iter().any(|p| p.parent() == Some(dir.as_path())),
                    Err(_) => true,
                };
                if concerns {
                    handler(&res);
                }
            }
        })?;
        Ok(Arc::new(Self {
            watcher: Mutex::new(watcher),
            routes,
        }))
    }

    /// Watch `dir` (not recursively) and hand its events to `handler`. Paths in events are
    /// the watched path joined with the entry name, so `dir` is matched as given.
    pub fn watch(&self, dir: &Path, handler: Handler) -> notify::Result<()> {
        lock(&self.routes).push((dir.to_path_buf(), handler));
        lock(&self.watcher).watch(dir, RecursiveMode::NonRecursive)
    }
}
