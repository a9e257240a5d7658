//! The config half of fleets as code: the [`Selection`] the reloader's loader and the fleet
//! actor share. It lists `--config-dir` (through `..data`, one version), chooses the key
//! from the Node's labels last handed over (or the name recorded in `--state-dir`), loads
//! that file with the command-line overrides, puts the MIG label's layout over
//! `flags.migLayouts.layout`, and records what it chose or why it refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::domain::config::{Config, ConfigError};
use crate::domain::fleet::{self, MIG_CONFIG_LABEL};

/// Loads one config file with the command line's overrides (`ConfigArgs::load_path`).
pub(crate) type FileLoader = Arc<dyn Fn(&Path) -> Result<Config, ConfigError> + Send + Sync>;

/// How often one load reads the directory again after `..data` moved under it.
const SWAP_RETRIES: u32 = 3;

/// What the last config load chose, or why it refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Loaded {
    /// The labels generation it used ([`Selection::set_labels`] bumps it).
    pub(crate) generation: u64,
    /// The key and the file loaded, or the refusal.
    pub(crate) result: Result<Chosen, String>,
}

/// A key that loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chosen {
    pub(crate) key: String,
    /// The config's `source` (the file read): the store serves it once committed.
    pub(crate) source: String,
    /// Why the MIG label could not be honoured, if it could not.
    pub(crate) layout_error: Option<String>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The Node's labels as last handed over; `None` until the Node was read.
    labels: Option<BTreeMap<String, String>>,
    /// The name recorded in `--state-dir` at start.
    recorded: Option<String>,
    generation: u64,
    last: Option<Loaded>,
}

/// The choice shared by the reloader's loader and the actor. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Selection {
    dir: PathBuf,
    label: String,
    default: Option<String>,
    load_file: FileLoader,
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selection")
            .field("dir", &self.dir)
            .field("label", &self.label)
            .field("default", &self.default)
            .finish_non_exhaustive()
    }
}

impl Selection {
    /// The selection over `dir` by `label` (`--config-label`), `default`
    /// (`--config-default`) and `recorded` (the last applied name from `--state-dir`).
    pub(crate) fn new(
        dir: impl Into<PathBuf>,
        label: impl Into<String>,
        default: Option<String>,
        recorded: Option<String>,
        load_file: FileLoader,
    ) -> Self {
        Self {
            dir: dir.into(),
            label: label.into(),
            default: default.filter(|d| !d.is_empty()),
            load_file,
            inner: Arc::new(Mutex::new(Inner {
                recorded,
                ..Inner::default()
            })),
        }
    }

    /// The name recorded in `--state-dir` at start, if any.
    pub(super) fn recorded(&self) -> Option<String> {
        self.lock().recorded.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The directory (`--config-dir`).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The label that names the key (`--config-label`).
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// Hand over the Node's labels; the next load chooses from them.
    pub(crate) fn set_labels(&self, labels: BTreeMap<String, String>) -> u64 {
        let mut inner = self.lock();
        inner.labels = Some(labels);
        inner.generation += 1;
        inner.generation
    }

    /// The labels generation wanted and what the last load did.
    pub(crate) fn status(&self) -> (u64, Option<Loaded>) {
        let inner = self.lock();
        (inner.generation, inner.last.clone())
    }

    /// Choose and load the config (the reloader's loader): the key the labels name, or the
    /// recorded one before the Node was read, or the defaults; the MIG label's layout over
    /// `flags.migLayouts.layout`.
    pub(crate) fn load(&self) -> Result<Config, ConfigError> {
        let (labels, recorded, generation) = {
            let inner = self.lock();
            (
                inner.labels.clone(),
                inner.recorded.clone(),
                inner.generation,
            )
        };
        let result = self.choose_and_load(labels.as_ref(), recorded.as_deref());
        let last = Loaded {
            generation,
            result: match &result {
                Ok((cfg, chosen)) => Ok(Chosen {
                    source: cfg.source.clone(),
                    ..chosen.clone()
                }),
                Err(e) => Err(e.to_string()),
            },
        };
        self.lock().last = Some(last);
        result.map(|(cfg, _)| cfg)
    }

    fn choose_and_load(
        &self,
        labels: Option<&BTreeMap<String, String>>,
        recorded: Option<&str>,
    ) -> Result<(Config, Chosen), ConfigError> {
        use crate::platform::config_file::dir;
        // The kubelet may swap `..data` (and remove the version we listed) between our listing
        // and the file read: that is an update, not a bad config, so read the new version.
        let mut attempts = 0;
        loop {
            let listing = dir::read(&self.dir)?;
            match self.choose_in(&listing, labels, recorded) {
                Err(e) if attempts < SWAP_RETRIES && dir::swapped(&self.dir, &listing) => {
                    attempts += 1;
                    tracing::debug!(dir = %self.dir.display(), error = %e, "config directory swapped while reading: reading the new version");
                }
                other => return other,
            }
        }
    }

    fn choose_in(
        &self,
        dir: &crate::platform::config_file::dir::ConfigDir,
        labels: Option<&BTreeMap<String, String>>,
        recorded: Option<&str>,
    ) -> Result<(Config, Chosen), ConfigError> {
        let value = match labels {
            Some(l) => l.get(&self.label).map(String::as_str),
            // The API has not answered yet: the pool's config from before the restart.
            None => recorded.filter(|r| dir.keys.contains(*r)),
        };
        let choice = fleet::choose_config(&self.label, value, self.default.as_deref(), &dir.keys)?;
        let mut config = (self.load_file)(&dir.path(&choice.key))?;
        let mig_label = labels.and_then(|l| l.get(MIG_CONFIG_LABEL).map(String::as_str));
        let mut layout_error = None;
        match (
            config.mig_layouts.as_mut(),
            fleet::choose_layout(mig_label, None),
        ) {
            (Some(layouts), Some(layout)) => layout.clone_into(&mut layouts.layout),
            (None, Some(layout)) => {
                layout_error = Some(format!(
                    "label {MIG_CONFIG_LABEL}={layout}: config {} has no flags.migLayouts.file to take the layout from",
                    choice.key
                ));
            }
            (_, None) => {}
        }
        tracing::debug!(key = %choice.key, reason = ?choice.reason, "config chosen");
        Ok((
            config,
            Chosen {
                key: choice.key,
                source: String::new(),
                layout_error,
            },
        ))
    }
}
