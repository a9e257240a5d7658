//! How the node's GPUs are offered to the kubelet: the device-plugin servers or the DRA
//! driver, never both (one node never offers a resource both ways). Each front-end owns its
//! specifics behind the one [`FrontEnd`] shape: its readiness on `/readyz`, its Events and
//! its failures. The supervisor starts one, hands it the store and the stop token (through
//! the [`Context`]) and waits on [`FrontEnd::failed`] next to the shutdown.
//!
//! Talks to: [`crate::runtime::plugin`] (servers, registration, their failures),
//! [`crate::runtime::dra`] (driver, slice publisher, recovery Event), the ledger's pool
//! attribution and the usage view (what each front-end tells the followers).

use std::sync::Arc;

use tokio::sync::watch;

use crate::domain::usage::DraReport;
use crate::platform::fswatch::DirWatch;
use crate::runtime::Context;
use crate::runtime::dra::DraModeSettings;
use crate::runtime::error::AppError;
use crate::runtime::held::HeldCheckpoint;
use crate::runtime::http::Readiness;
use crate::runtime::ledger::DraPool;
use crate::runtime::plugin::{self, PluginSettings};
use crate::runtime::reloader::FirstSpec;

/// Which front-end to start, and its settings.
#[derive(Debug)]
pub(crate) enum FrontEndSettings {
    /// One device-plugin server per planned resource.
    Plugin(PluginSettings),
    /// The DRA driver (boxed: its settings dwarf the plugin's).
    Dra(Box<DraModeSettings>),
}

/// What the supervisor hands a front-end from the other actors.
#[derive(Debug)]
pub(crate) struct FrontEndPeers {
    /// The daemon's one inotify instance (the kubelet socket, the registration socket).
    pub(crate) fs: Arc<DirWatch>,
    /// Where Allocate persists what it hands out (device plugin).
    pub(crate) held: HeldCheckpoint,
    /// `/readyz`: each front-end says what it serves and when the kubelet took it.
    pub(crate) readiness: Arc<Readiness>,
}

/// A started front-end.
#[derive(Debug)]
pub(crate) enum FrontEnd {
    /// Device-plugin servers; a resource that cannot be served is reported here.
    Plugin(plugin::Failures),
    /// The DRA driver: its pool (for the ledger) and its prepared claims (for `/v1/state`).
    Dra {
        pool: DraPool,
        prepared: watch::Receiver<Arc<DraReport>>,
    },
}

impl FrontEnd {
    /// Start the front-end `settings` names on `ctx`.
    ///
    /// The device plugin's servers register while the first spec is being written (their
    /// streams and Allocate wait for it: see `Snapshot::spec_pending`); the DRA driver starts
    /// once it is on disk. A failed write fails the start either way.
    pub(crate) async fn start(
        settings: FrontEndSettings,
        peers: FrontEndPeers,
        first_spec: FirstSpec,
        ctx: &Context,
    ) -> Result<Self, AppError> {
        let FrontEndPeers {
            fs,
            held,
            readiness,
        } = peers;
        match settings {
            FrontEndSettings::Plugin(settings) => {
                let servers = plugin::start(settings, held, readiness, &fs, ctx)?;
                first_spec.written().await?;
                Ok(Self::Plugin(servers))
            }
            FrontEndSettings::Dra(dra) => {
                first_spec.written().await?;
                let pool = DraPool {
                    driver: dra.driver.driver.clone(),
                    pool: dra.driver.node.clone(),
                };
                let prepared =
                    crate::runtime::dra::front::start(*dra, &fs, &readiness, ctx).await?;
                Ok(Self::Dra { pool, prepared })
            }
        }
    }

    /// The pool whose claims the ledger attributes to this driver; `None` for the device
    /// plugin (its allocations come with resource names).
    pub(crate) fn dra_pool(&self) -> Option<DraPool> {
        match self {
            Self::Plugin(_) => None,
            Self::Dra { pool, .. } => Some(pool.clone()),
        }
    }

    /// The DRA driver's prepared claims, for `/v1/state`; `None` for the device plugin.
    pub(crate) fn dra_view(&self) -> Option<watch::Receiver<Arc<DraReport>>> {
        match self {
            Self::Plugin(_) => None,
            Self::Dra { prepared, .. } => Some(prepared.clone()),
        }
    }

    /// Resolves with the first failure that must stop the daemon; never for a front-end
    /// that cannot fail once started (DRA) or whose servers all stopped.
    pub(crate) async fn failed(&mut self) -> AppError {
        match self {
            Self::Plugin(failures) => match failures.recv().await {
                Some(e) => e.into(),
                None => std::future::pending().await,
            },
            Self::Dra { .. } => std::future::pending().await,
        }
    }
}
