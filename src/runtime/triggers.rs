//! What makes the daemon re-plan while it runs: a change in the config file's directory
//! (inotify via notify), SIGHUP, a periodic inventory re-scan, or an embedder's request.
//!
//! Talks to the OS (inotify, signals, timers) and to `app`, which owns the reload itself and
//! receives merged [`Causes`] from [`Triggers::next`]. The config file's *directory* is
//! watched, not the file: a Kubernetes ConfigMap volume updates by writing a new timestamped
//! directory and renaming the `..data` symlink over the old one, so the file the daemon was
//! given never changes in place (its path resolves through `..data`), and editors replace
//! a file by renaming a new one over it, which a watch on the old inode would miss. Only
//! events naming the config file itself or `..data` ask for a reload: anything else in that
//! directory (a log file, an editor's swap file, another ConfigMap key) is ignored, or a
//! busy neighbour would reload the daemon forever (and, with a broken config, count a
//! failed reload per write). Bursts (an editor's write + rename, the ConfigMap's renames)
//! are merged by a short settle delay.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::platform::fswatch::{DirWatch, FsEvent, FsKind, Handler};

/// How long to wait after the first trigger for more to arrive before reloading.
pub(crate) const SETTLE: Duration = Duration::from_millis(150);

/// Errors setting up the triggers.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReloadError {
    /// The config file has no directory to watch.
    #[error("cannot watch config file {path}: it has no parent directory")]
    NoParent { path: String },
    /// inotify refused the watch.
    #[error("cannot watch config directory {path}: {source}")]
    Watch {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The SIGHUP handler could not be installed.
    #[error("cannot install SIGHUP handler: {0}")]
    Signal(#[source] std::io::Error),
}

/// One reason to reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The config file (or the ConfigMap's `..data` link) changed.
    ConfigFile,
    /// SIGHUP: reload the config and re-scan the inventory.
    Signal,
    /// The re-scan interval elapsed.
    Rescan,
    /// A test asked (`Running::probe`): config and inventory, as [`Cause::Signal`].
    #[cfg(test)]
    Request,
    /// Held devices were released: the spec may drop devices kept only for them.
    Released,
}

/// Merged causes of one reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Causes {
    /// Re-read the config.
    pub(crate) config: bool,
    /// Re-discover the inventory.
    pub(crate) inventory: bool,
    /// Rewrite the spec if it keeps devices nothing holds any more.
    pub(crate) held: bool,
}

impl Causes {
    fn add(&mut self, cause: Cause) {
        match cause {
            Cause::ConfigFile => self.config = true,
            Cause::Rescan => self.inventory = true,
            Cause::Released => self.held = true,
            Cause::Signal => {
                self.config = true;
                self.inventory = true;
            }
            #[cfg(test)]
            Cause::Request => self.add(Cause::Signal),
        }
    }

    /// Short label for logs and metrics.
    pub(crate) fn label(&self) -> &'static str {
        match (self.config, self.inventory) {
            (true, true) => "config+inventory",
            (true, false) => "config",
            (false, true) => "inventory",
            (false, false) if self.held => "released",
            (false, false) => "none",
        }
    }
}

/// What to watch.
#[derive(Debug, Clone, Default)]
pub(crate) struct TriggerSettings {
    /// The config file (its directory is watched); `None`: no file to follow.
    pub(crate) config_file: Option<PathBuf>,
    /// `--config-dir` (watched itself): a change to any key or to the ConfigMap's `..data`
    /// link asks for a reload, which chooses the key again.
    pub(crate) config_dir: Option<PathBuf>,
    /// Reload on SIGHUP.
    pub(crate) sighup: bool,
    /// Re-scan the inventory this often; `None` or zero: never on a timer.
    pub(crate) rescan_interval: Option<Duration>,
}

/// Live triggers. Dropping this ends the inotify watch; the signal and timer tasks end with
/// the token they were given.
#[derive(Debug)]
pub(crate) struct Triggers {
    rx: mpsc::Receiver<Cause>,
    tx: mpsc::Sender<Cause>,
    /// Kept alive for as long as events are wanted: dropping the watcher ends the inotify
    /// watch and its thread.
    _watcher: Option<Arc<DirWatch>>,
}

impl Triggers {
    /// Start every trigger `settings` asks for; tasks are owned by `tracker` and stop with
    /// `token`.
    pub(crate) fn start(
        settings: &TriggerSettings,
        fs: &Arc<DirWatch>,
        tracker: &TaskTracker,
        token: &CancellationToken,
    ) -> Result<Self, ReloadError> {
        // Bounded: a full queue means a reload is already pending, which covers the event.
        let (tx, rx) = mpsc::channel(16);
        let watcher = match &settings.config_file {
            Some(file) => {
                watch_dir(file, fs, tx.clone())?;
                Some(fs.clone())
            }
            None => None,
        };
        let watcher = match &settings.config_dir {
            Some(dir) => {
                watch_keys(dir, fs, tx.clone())?;
                Some(fs.clone())
            }
            None => watcher,
        };
        if settings.sighup {
            let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .map_err(ReloadError::Signal)?;
            let (tx, token) = (tx.clone(), token.clone());
            tracker.spawn(async move {
                loop {
                    tokio::select! {
                        () = token.cancelled() => return,
                        got = hup.recv() => {
                            if got.is_none() { return }
                            tracing::info!(signal = "SIGHUP", "reload requested");
                            let _ = tx.try_send(Cause::Signal);
                        }
                    }
                }
            });
        }
        if let Some(every) = settings.rescan_interval.filter(|d| !d.is_zero()) {
            let (tx, token) = (tx.clone(), token.clone());
            tracker.spawn(async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                // After a long stall one re-scan is enough.
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        () = token.cancelled() => return,
                        _ = tick.tick() => { let _ = tx.try_send(Cause::Rescan); }
                    }
                }
            });
        }
        Ok(Self {
            rx,
            tx,
            _watcher: watcher,
        })
    }

    /// A sender for embedders that want to ask for a reload.
    pub(crate) fn requester(&self) -> mpsc::Sender<Cause> {
        self.tx.clone()
    }

    /// Wait for the next trigger, then for [`SETTLE`] more, and return everything that
    /// arrived merged. Never returns `None` while `self` holds a sender.
    pub(crate) async fn next(&mut self) -> Option<Causes> {
        let first = self.rx.recv().await?;
        let mut causes = Causes::default();
        causes.add(first);
        let settle = tokio::time::sleep(SETTLE);
        tokio::pin!(settle);
        loop {
            tokio::select! {
                () = &mut settle => return Some(causes),
                more = self.rx.recv() => match more {
                    Some(c) => causes.add(c),
                    None => return Some(causes),
                },
            }
        }
    }
}

/// The ConfigMap volume's link to the current data directory: renamed over on every update.
const CONFIGMAP_DATA: &str = "..data";

/// Whether `event` (in the directory watched for `file_name`) may have changed the config:
/// it names the file or the `..data` link, or it says events were lost.
fn concerns_config(event: &FsEvent, file_name: &OsStr) -> bool {
    if event.kind == FsKind::Lost {
        return true;
    }
    event.path.as_ref().is_some_and(|p| {
        p.file_name()
            .is_some_and(|n| n == file_name || n == CONFIGMAP_DATA)
    })
}

/// Watch the directory holding `file`; events about the file or `..data` are triggers.
fn watch_dir(file: &Path, fs: &DirWatch, tx: mpsc::Sender<Cause>) -> Result<(), ReloadError> {
    let no_parent = || ReloadError::NoParent {
        path: file.display().to_string(),
    };
    let dir = match file.parent() {
        Some(d) if d.as_os_str().is_empty() => Path::new("."),
        Some(d) => d,
        None => return Err(no_parent()),
    };
    let file_name: OsString = file.file_name().ok_or_else(no_parent)?.to_os_string();
    let shown = dir.display().to_string();
    // Lost events (a queue overflow) concern the config too: reload to be sure.
    let handler: Handler = Box::new(move |event| {
        if concerns_config(event, &file_name) {
            let _ = tx.try_send(Cause::ConfigFile);
        }
    });
    fs.watch(dir, handler).map_err(|source| ReloadError::Watch {
        path: shown,
        source,
    })
}

/// Whether `event` in a `--config-dir` may have changed a key: it names a file that is not
/// hidden (a key) or the `..data` link, or it says events were lost.
fn concerns_keys(event: &FsEvent) -> bool {
    if event.kind == FsKind::Lost {
        return true;
    }
    event.path.as_ref().is_some_and(|p| {
        p.file_name()
            .is_some_and(|n| n == CONFIGMAP_DATA || !n.to_string_lossy().starts_with('.'))
    })
}

/// Watch `dir` itself: events about a key or `..data` are triggers.
fn watch_keys(dir: &Path, fs: &DirWatch, tx: mpsc::Sender<Cause>) -> Result<(), ReloadError> {
    let handler: Handler = Box::new(move |event| {
        if concerns_keys(event) {
            let _ = tx.try_send(Cause::ConfigFile);
        }
    });
    fs.watch(dir, handler).map_err(|source| ReloadError::Watch {
        path: dir.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_merge() {
        let mut c = Causes::default();
        c.add(Cause::ConfigFile);
        assert_eq!(c.label(), "config");
        c.add(Cause::Rescan);
        assert_eq!(c.label(), "config+inventory");
        let mut s = Causes::default();
        s.add(Cause::Signal);
        assert!(s.config && s.inventory);
    }

    #[test]
    fn only_the_config_file_and_data_link_concern_the_config() {
        let ev = |kind: FsKind, path: &str| FsEvent {
            kind,
            path: Some(PathBuf::from(path)),
        };
        let name = OsStr::new("config.yaml");
        assert!(concerns_config(
            &ev(FsKind::Modified, "/etc/gs/config.yaml"),
            name
        ));
        // The ConfigMap swap renames `..data_tmp` over `..data`; an editor renames its
        // swap file over the config.
        assert!(concerns_config(
            &ev(FsKind::Renamed, "/etc/gs/..data"),
            name
        ));
        assert!(concerns_config(
            &ev(FsKind::Renamed, "/etc/gs/config.yaml"),
            name
        ));
        assert!(!concerns_config(
            &ev(FsKind::Renamed, "/etc/gs/..data_tmp"),
            name
        ));
        assert!(!concerns_config(
            &ev(FsKind::Modified, "/etc/gs/agent.log"),
            name
        ));
        assert!(!concerns_config(
            &ev(FsKind::Created, "/etc/gs/config.yaml.bak"),
            name
        ));
        assert!(!concerns_config(
            &ev(FsKind::Created, "/etc/gs/..2026_v2"),
            name
        ));
        let lost = FsEvent {
            kind: FsKind::Lost,
            path: None,
        };
        assert!(concerns_config(&lost, name));
        assert!(concerns_keys(&lost));
        assert!(concerns_keys(&ev(FsKind::Renamed, "/etc/gs/..data")));
        assert!(concerns_keys(&ev(FsKind::Modified, "/etc/gs/inference")));
        assert!(!concerns_keys(&ev(FsKind::Created, "/etc/gs/..2026_v2")));
        assert!(!concerns_keys(&ev(
            FsKind::Created,
            "/etc/gs/.inference.swp"
        )));
    }

    #[tokio::test]
    async fn a_configmap_style_swap_is_one_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let v1 = dir.path().join("..2026_v1");
        std::fs::create_dir(&v1).expect("v1");
        std::fs::write(v1.join("config.yaml"), "version: v1\n").expect("write");
        std::os::unix::fs::symlink("..2026_v1", dir.path().join("..data")).expect("data");
        std::os::unix::fs::symlink("..data/config.yaml", dir.path().join("config.yaml"))
            .expect("link");
        let tracker = TaskTracker::new();
        let token = CancellationToken::new();
        let settings = TriggerSettings {
            config_file: Some(dir.path().join("config.yaml")),
            ..TriggerSettings::default()
        };
        let fs = crate::platform::fswatch::DirWatch::new().expect("watcher");
        let mut triggers = Triggers::start(&settings, &fs, &tracker, &token).expect("start");
        // What the kubelet does: new directory, new `..data_tmp` link, rename over `..data`.
        let v2 = dir.path().join("..2026_v2");
        std::fs::create_dir(&v2).expect("v2");
        std::fs::write(v2.join("config.yaml"), "version: v1\nflags: {}\n").expect("write");
        std::os::unix::fs::symlink("..2026_v2", dir.path().join("..data_tmp")).expect("tmp");
        std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).expect("swap");
        let causes = tokio::time::timeout(Duration::from_secs(5), triggers.next())
            .await
            .expect("a trigger within 5 s")
            .expect("open");
        assert_eq!(causes.label(), "config");
        // The burst was merged: nothing else is pending after the settle delay.
        let more = tokio::time::timeout(SETTLE * 3, triggers.next()).await;
        assert!(more.is_err(), "burst not merged: {more:?}");
        token.cancel();
    }
}
