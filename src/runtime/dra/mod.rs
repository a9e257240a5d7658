//! The DRA driver's kubelet side: the plugin-watcher registration socket
//! (`<registry dir>/<driver>-reg.sock`) and the DRA service socket
//! (`<plugins dir>/<driver>/dra.sock`, serving `DRAPlugin` v1 and v1beta1 and
//! `DRAResourceHealth` v1alpha1 and v1), over the same state store the device plugin reads.
//!
//! [`spawn`] loads the prepared-claims checkpoint (`crate::platform::dra_state`), binds both
//! sockets (stale ones removed) and serves them on the context's `TaskTracker` until the
//! daemon stops it. When the registration socket disappears (the kubelet's plugin
//! directory wiped, a kubelet restart that cleans it), it is bound again, which makes the
//! plugin watcher register the driver anew; the removal is heard through inotify
//! (`crate::runtime::socket::RemovalWatch` on the daemon's one watch, no polling). Claims are read through a [`ClaimSource`] (the
//! Kubernetes API in the daemon, a map in tests), which also takes their `status.devices`
//! (`status`: written after the answer, never holding it). [`publish`] keeps the node's ResourceSlices
//! in the API; [`front`] starts both in DRA mode ([`DraModeSettings`]) with the driver's
//! readiness and its recovery Event.

pub(crate) mod driver;
pub(crate) mod front;
mod instances;
pub(crate) mod publish;
pub(crate) mod service;
mod status;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use crate::platform::claims::ClaimSource;
// Named through here by the DRA kubelet side of the test support only.
#[cfg(any(test, feature = "testkit"))]
pub(crate) use crate::platform::claims::ClaimSourceError;
pub(crate) use driver::{Driver, DriverExtras};

use crate::platform::dra_state::{DraFiles, LoadOutcome};
use crate::platform::fswatch::DirWatch;
use crate::proto::{dra_v1, dra_v1beta1, drahealth_v1, drahealth_v1alpha1, pluginregistration};
use crate::runtime::socket::{RemovalWatch, SocketError, bind};
use crate::state::Store;

/// Errors starting the DRA driver.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DraRuntimeError {
    /// A socket could not be bound.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The checkpoint could not be read or kept aside.
    #[error(transparent)]
    State(#[from] crate::platform::dra_state::DraStateError),
    /// No inotify instance for the registration socket's watch.
    #[error("cannot watch {path}: {source}")]
    #[cfg(any(test, feature = "testkit"))]
    Watch {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Settings of the DRA driver.
#[derive(Debug, Clone)]
pub(crate) struct DraSettings {
    /// Driver name (`--dra-driver-name`).
    pub(crate) driver: String,
    /// Node (pool) name.
    pub(crate) node: String,
    /// `--kubelet-registry-dir`.
    pub(crate) registry_dir: PathBuf,
    /// `--kubelet-plugins-dir`.
    pub(crate) plugins_dir: PathBuf,
    /// CDI directory of the per-claim specs.
    pub(crate) cdi_dir: PathBuf,
    /// `--state-dir` (the checkpoint `dra-prepared.json`).
    pub(crate) state_dir: PathBuf,
    /// Root of /proc (the boot ID).
    pub(crate) proc_root: PathBuf,
    /// Health stream resend interval.
    pub(crate) health_resend: Duration,
    /// Base of the delay between tries when the registration socket cannot be bound again
    /// (its removal itself is heard through inotify).
    pub(crate) socket_check: Duration,
    /// The memory-limit hook, MIG instance operations and fault point of
    /// [`Driver::with_extras`].
    pub(crate) extras: DriverExtras,
}

impl DraSettings {
    /// `<registry dir>/<driver>-reg.sock`.
    pub(crate) fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver))
    }

    /// `<plugins dir>/<driver>/dra.sock`.
    pub(crate) fn service_socket(&self) -> PathBuf {
        self.plugins_dir.join(&self.driver).join("dra.sock")
    }
}

/// The DRA front-end as `run --dra` starts it, in place of the device-plugin servers.
#[derive(Debug)]
pub(crate) struct DraModeSettings {
    /// The kubelet side (sockets, checkpoint, per-claim specs).
    pub(crate) driver: DraSettings,
    /// Where Prepare reads claims (the API in the daemon).
    pub(crate) claims: Arc<dyn ClaimSource>,
    /// ResourceSlice publishing; `None`: slices are not published (tests without an API).
    pub(crate) publish: Option<publish::PublishSettings>,
}

/// The kubelet's last verdict on the driver's registration (`None`: none yet).
pub(crate) type Verdict = Option<Result<(), RegistrationRefused>>;

/// The kubelet refused the driver's registration: its own text, relayed as it sent it (the
/// driver makes no error here).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the kubelet refused the registration: {0}")]
pub(crate) struct RegistrationRefused(pub(crate) String);

/// What a started driver exposes.
#[derive(Debug, Clone)]
pub(crate) struct DraExposed {
    /// The core (prepared claims), read through [`DraExposed::driver`].
    driver: Driver,
    /// How the checkpoint loaded.
    pub(crate) loaded: LoadOutcome,
    /// What the start found half-done on disk and completed or removed.
    pub(crate) repairs: Vec<crate::platform::dra_state::Repair>,
    /// The kubelet's last registration verdict.
    pub(crate) registration: watch::Receiver<Verdict>,
    /// The prepared claims, for `/v1/state`.
    pub(crate) prepared: watch::Receiver<Arc<crate::domain::usage::DraReport>>,
}

impl DraExposed {
    /// The driver's core, for an embedder that looks at its prepared claims directly: the
    /// tests (the daemon reads them through `prepared`).
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "only tests look at the driver's core")
    )]
    pub(crate) fn driver(&self) -> &Driver {
        &self.driver
    }
}

/// A started driver.
pub(crate) type DraHandle = crate::runtime::Handle<DraExposed>;

/// Start the driver on `ctx` (its store, tracker and a child token): load the checkpoint,
/// bind and serve both sockets until the daemon stops it. The registration socket is
/// followed through an inotify instance of its own; the daemon shares its one through
/// [`spawn_watched`].
#[cfg(any(test, feature = "testkit"))]
pub(crate) async fn spawn(
    settings: DraSettings,
    claims: Arc<dyn ClaimSource>,
    ctx: &crate::runtime::Context,
) -> Result<DraHandle, DraRuntimeError> {
    let fs = DirWatch::new().map_err(|source| DraRuntimeError::Watch {
        path: settings.registration_socket().display().to_string(),
        source,
    })?;
    spawn_watched(settings, claims, &fs, ctx).await
}

/// [`spawn`] on the daemon's inotify instance `fs`.
pub(crate) async fn spawn_watched(
    settings: DraSettings,
    claims: Arc<dyn ClaimSource>,
    fs: &Arc<DirWatch>,
    ctx: &crate::runtime::Context,
) -> Result<DraHandle, DraRuntimeError> {
    let stop = ctx.child_token();
    let exposed = start(
        (settings, fs),
        ctx.store.clone(),
        claims,
        &ctx.metrics,
        &ctx.tracker,
        stop.clone(),
    )
    .await?;
    Ok(crate::runtime::Handle::new(exposed))
}

async fn start(
    (settings, fs): (DraSettings, &Arc<DirWatch>),
    store: Store,
    claims: Arc<dyn ClaimSource>,
    metrics: &Arc<crate::runtime::metrics::Metrics>,
    tracker: &TaskTracker,
    stop: CancellationToken,
) -> Result<DraExposed, DraRuntimeError> {
    let files = DraFiles {
        checkpoint: settings
            .state_dir
            .join(crate::platform::dra_state::CHECKPOINT_FILE),
        cdi_dir: settings.cdi_dir.clone(),
        driver: settings.driver.clone(),
    };
    let (prepared, loaded, repairs) = load(&settings, &files, metrics).await?;
    let queue = status::spawn(
        claims.clone(),
        settings.driver.clone(),
        tracker,
        stop.clone(),
    );
    if let Some(ops) = &settings.extras.instances {
        clean_dynamic_gpus(ops, &store, &prepared, &loaded).await;
    }
    let driver = Driver::with_extras(
        &settings.driver,
        &settings.node,
        store,
        claims,
        (files, prepared),
        settings.extras.clone(),
    );
    driver.write_status_with(queue);
    let prepared_view = driver.prepared_view();
    let (claims_now, devices_now) = driver.prepared_totals();
    metrics.set_dra_prepared(claims_now, devices_now);
    // A stop waits for the Prepares and Unprepares under way (they outlive their RPCs) and
    // never cuts one in half; each is bounded by its file writes and MIG calls.
    let (tasks, tasks_stop) = (driver.tasks().clone(), stop.clone());
    tracker.spawn(async move {
        tasks_stop.cancelled().await;
        tasks.close();
        tasks.wait().await;
    });
    let service_path = settings.service_socket();
    let listener = bind(&service_path)?;
    let router = tonic::transport::Server::builder()
        .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(
            service::DraV1 {
                driver: driver.clone(),
                metrics: metrics.clone(),
            },
        ))
        .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(
            service::DraV1beta1 {
                driver: driver.clone(),
                metrics: metrics.clone(),
            },
        ))
        .add_service(
            drahealth_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                service::HealthV1alpha1 {
                    driver: driver.clone(),
                    resend: settings.health_resend,
                    stop: stop.clone(),
                },
            ),
        )
        .add_service(
            drahealth_v1::dra_resource_health_server::DraResourceHealthServer::new(
                service::HealthV1 {
                    driver: driver.clone(),
                    resend: settings.health_resend,
                    stop: stop.clone(),
                },
            ),
        );
    let service_stop = stop.clone();
    tracker.spawn(async move {
        let served = router
            .serve_with_incoming_shutdown(
                crate::runtime::socket::incoming(listener),
                service_stop.cancelled(),
            )
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "DRA service failed");
        }
        crate::runtime::socket::remove(&service_path).ok();
    });
    let (status, registration) = watch::channel(None);
    let registrar = service::Registrar {
        driver: settings.driver.clone(),
        endpoint: settings.service_socket().display().to_string(),
        status: Arc::new(status),
    };
    let reg_path = settings.registration_socket();
    let first = bind(&reg_path)?;
    let removal = RemovalWatch::start(&reg_path, fs)?;
    tracker.spawn(registration_loop(
        (reg_path, removal),
        first,
        registrar,
        settings.socket_check,
        stop,
    ));
    Ok(DraExposed {
        driver,
        loaded,
        repairs,
        registration,
        prepared: prepared_view,
    })
}

/// Load the checkpoint (and what the disk adds to it; see `crate::platform::dra_state`), give
/// claims recovered without a pool this node's, and report and write back a recovery.
async fn load(
    settings: &DraSettings,
    files: &DraFiles,
    metrics: &crate::runtime::metrics::Metrics,
) -> Result<
    (
        crate::platform::dra_state::Prepared,
        LoadOutcome,
        Vec<crate::platform::dra_state::Repair>,
    ),
    DraRuntimeError,
> {
    let boot = crate::platform::dra_state::boot_id(&settings.proc_root);
    let load_files = files.clone();
    let (mut prepared, loaded, repairs) =
        tokio::task::spawn_blocking(move || load_files.load_reconciled(&boot))
            .await
            .map_err(|e| crate::platform::dra_state::DraStateError::Encode {
                path: files.checkpoint.clone(),
                message: format!("load task failed: {e}"),
            })??;
    // A claim recovered from its spec alone has no pool: it can only be this node's.
    for d in prepared
        .claims
        .values_mut()
        .flat_map(|c| c.devices.iter_mut())
    {
        if d.pool.is_empty() {
            d.pool.clone_from(&settings.node);
        }
    }
    match &loaded {
        LoadOutcome::Corrupt { kept_as } => {
            metrics.dra_checkpoint_recoveries.inc();
            tracing::error!(
                checkpoint = %files.checkpoint.display(),
                kept_as = %kept_as.display(),
                recovered = prepared.claims.len(),
                "DRA checkpoint unreadable: kept aside, prepared claims recovered from their records and CDI specs"
            );
            // Written back at once, so the next start reads the recovered claims instead of
            // recovering again; a failure here is not fatal, the next prepare writes it too.
            let save_files = files.clone();
            let recovered = prepared.clone();
            match tokio::task::spawn_blocking(move || save_files.save(&recovered)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "recovered DRA checkpoint not written"),
                Err(e) => tracing::warn!(error = %e, "recovered DRA checkpoint not written"),
            }
        }
        LoadOutcome::OtherBoot => {
            tracing::info!("DRA checkpoint from an earlier boot: entries void")
        }
        _ => tracing::debug!(claims = prepared.claims.len(), "DRA checkpoint loaded"),
    }
    Ok((prepared, loaded, repairs))
}

/// Destroy the MIG instances on dynamic GPUs that no claim of the checkpoint owns (made by a
/// run that died before recording them). Skipped when the checkpoint was unreadable: the
/// claims recovered from the specs do not say which instances are theirs, and destroying
/// one in use would break a running container.
async fn clean_dynamic_gpus(
    ops: &Arc<dyn crate::platform::dra_mig::InstanceOps>,
    store: &Store,
    prepared: &crate::platform::dra_state::Prepared,
    loaded: &LoadOutcome,
) {
    let devices = crate::domain::dra::slices::snapshot_devices(&store.current());
    let dynamic: Vec<(u32, String)> = devices
        .devices
        .values()
        .filter_map(|d| d.placement.as_ref())
        .map(|p| (p.gpu_index, p.gpu_uuid.clone()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if dynamic.is_empty() {
        return;
    }
    if matches!(loaded, LoadOutcome::Corrupt { .. }) {
        tracing::error!(
            gpus = dynamic.len(),
            "DRA checkpoint was unreadable: MIG instances on dynamic GPUs left as they are"
        );
        return;
    }
    let destroyed = instances::clean_orphans(ops, &dynamic, prepared).await;
    tracing::info!(
        gpus = dynamic.len(),
        destroyed = destroyed.len(),
        "MIG instances on dynamic GPUs checked against the prepared claims"
    );
}

/// Serve the registration socket; bind it again whenever it disappears.
async fn registration_loop(
    (path, mut removal): (PathBuf, RemovalWatch),
    first: tokio::net::UnixListener,
    registrar: service::Registrar,
    check: Duration,
    stop: CancellationToken,
) {
    let mut listener = Some(first);
    let mut attempt = 0u32;
    while !stop.is_cancelled() {
        let l = match listener.take() {
            Some(l) => l,
            None => match bind(&path) {
                Ok(l) => {
                    attempt = 0;
                    tracing::info!(socket = %path.display(), "registration socket bound again");
                    l
                }
                Err(e) => {
                    attempt += 1;
                    tracing::warn!(socket = %path.display(), error = %e, attempt, "cannot bind registration socket");
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep(check.saturating_mul(attempt.min(10))) => continue,
                    }
                }
            },
        };
        let gone = CancellationToken::new();
        let server = tonic::transport::Server::builder()
            .add_service(
                pluginregistration::registration_server::RegistrationServer::new(registrar.clone()),
            )
            .serve_with_incoming_shutdown(
                crate::runtime::socket::incoming(l),
                gone.clone().cancelled_owned(),
            );
        let watcher = removal.removed();
        tokio::pin!(server);
        tokio::select! {
            r = &mut server => {
                if let Err(e) = r {
                    tracing::error!(error = %e, "registration service failed");
                }
            }
            () = watcher => {
                tracing::info!(socket = %path.display(), "registration socket removed; serving it again");
                gone.cancel();
                let _ = server.await;
            }
            () = stop.cancelled() => {
                gone.cancel();
                let _ = server.await;
            }
        }
    }
    crate::runtime::socket::remove(&path).ok();
}

#[cfg(test)]
mod cancel_tests;
#[cfg(test)]
mod capacity_tests;
#[cfg(test)]
mod kube_claims_tests;
#[cfg(test)]
mod kubelet_tests;
#[cfg(test)]
mod publish_tests;
