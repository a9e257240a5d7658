//! The runtime: long-lived actors, each spawned on the daemon's `TaskTracker` and stopped by a
//! `CancellationToken`. They read the state store and talk to the kubelet, the network and
//! the platform layer.
//!
//! # One actor shape
//!
//! Every actor is started the same way:
//!
//! ```text
//! pub fn spawn(settings: XSettings, ctx: &Context) -> Handle<T>
//! pub fn spawn(settings: XSettings, peers: XPeers, ctx: &Context) -> Handle<T>  // talks to other actors
//! // either may return Result<Handle<T>, XError> when starting can fail
//! ```
//!
//! - [`Context`] is what every actor shares: the state [`Store`], the [`Metrics`]
//!   registry, the [`TaskTracker`] that owns every task and the daemon's stop token.
//! - `settings` is the actor's own configuration: plain data that `cli` or a test builds
//!   (flags, paths, intervals).
//! - `peers`, only for an actor that talks to others, are what the supervisor hands it
//!   from them: a reload requester, another actor's watch, the held-device checkpoint.
//! - The actor's tasks stop on its own token, a child of the context's: cancelling the
//!   daemon stops every actor. The returned [`Handle`] carries whatever the actor exposes
//!   to others (`T`: a watch receiver, an address; `()` when nothing).
//!
//! # How to add an actor
//!
//! 1. Write `src/runtime/<name>.rs` with a `//!` header saying what it follows and whom it
//!    tells, a `<Name>Settings` struct (and `<Name>Peers` if it talks to other actors)
//!    and `spawn(settings, &ctx) -> Handle<T>`.
//! 2. In `spawn`, take `let token = ctx.child_token();`, move what the task needs into an
//!    `async fn run(...)`, start it with `ctx.tracker.spawn(...)` and return
//!    `Handle::new(exposed)`. Never `tokio::spawn` directly; never `unwrap` inside
//!    the task. Follow the store with `ctx.store.subscribe()` and `select!` on
//!    `token.cancelled()`; write to it through its commands (`set_health`, `hold`, ...).
//! 3. Add its settings as an `Option<<Name>Settings>` field of
//!    [`supervisor::RunSettings`] (`None`: not started) and one line in the supervisor's
//!    `spawn_actors`. The supervisor's shutdown (cancel, close, wait with a deadline)
//!    then covers it.
//! 4. Test it with [`crate::testkit::Node`] (a whole daemon with a kubelet emulator) or,
//!    alone, with a [`Context`] from [`Context::new`] on a fixture store.

pub(crate) mod dra;
pub(crate) mod error;
pub(crate) mod fleet;
pub(crate) mod front_end;
pub(crate) mod health;
pub(crate) mod held;
pub(crate) mod http;
pub(crate) mod labels;
pub(crate) mod ledger;
pub(crate) mod metrics;
pub(crate) mod miglayout;
pub(crate) mod mps;
pub(crate) mod node_labels;
pub(crate) mod node_watch;
pub(crate) mod plugin;
pub(crate) mod reloader;
pub(crate) mod report;
pub(crate) mod retry_summary;
pub(crate) mod socket;
pub(crate) mod supervisor;
pub(crate) mod triggers;
pub(crate) mod usage;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::runtime::metrics::Metrics;
use crate::state::Store;

/// What every actor shares: the state, the metrics, the owner of its tasks and the stop
/// signal. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    /// The state every actor reads one snapshot of and writes through commands.
    pub(crate) store: Store,
    /// The registry `/metrics` serves.
    pub(crate) metrics: Arc<Metrics>,
    /// Owner of every task an actor spawns; the supervisor waits on it at shutdown.
    pub(crate) tracker: TaskTracker,
    /// Cancelled when the daemon stops; each actor runs on a child of it.
    pub(crate) token: CancellationToken,
}

impl Context {
    /// A context on `store` with a fresh registry, tracker and token (tests, embedders).
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) fn new(store: Store) -> Self {
        Self {
            store,
            metrics: Arc::default(),
            tracker: TaskTracker::new(),
            token: CancellationToken::new(),
        }
    }

    /// A token for one actor: cancelled with the daemon.
    pub(crate) fn child_token(&self) -> CancellationToken {
        self.token.child_token()
    }
}

/// A started actor: what it exposes to others.
#[derive(Debug, Clone)]
pub(crate) struct Handle<T = ()> {
    exposed: T,
}

impl<T> Handle<T> {
    /// An actor running until its token is cancelled, exposing `exposed`.
    pub(crate) fn new(exposed: T) -> Self {
        Self { exposed }
    }

    /// What the actor exposes.
    pub(crate) fn get(&self) -> &T {
        &self.exposed
    }

    /// What the actor exposes, by value.
    pub(crate) fn into_inner(self) -> T {
        self.exposed
    }
}
