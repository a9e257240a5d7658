//! NVML event watcher: one OS thread that owns its own `Nvml` handle, registers every GPU for
//! XID and ECC events and turns what `nvmlEventSetWait_v2` reports into [`HealthEvent`]s.
//!
//! Talks to NVML (the driver, or the fake in `crates/fake-nvml`) and to whoever holds the
//! receiving end of the channel (the app's health task, which marks devices unhealthy). The
//! wait blocks for up to `wait_timeout`, so it runs on its own thread, never on the async
//! runtime; the stop flag is checked after every wait, so stopping takes at most one timeout.
//!
//! As NVIDIA's plugin does: the event mask is intersected with each GPU's supported types and
//! registered on the parent GPU; a failed registration (other than `NOT_SUPPORTED`) is reported
//! as a [`HealthEventKind::WaitError`] for that GPU. `register_events` frees the whole set on
//! error, so after a failure the set is rebuilt from the GPUs registered so far. The wait goes
//! through the raw symbol because the wrapper's `EventData` drops the GPU/compute instance ids
//! that attribute an XID to one MIG device. A `GPU_IS_LOST` from the wait is resolved to the
//! lost GPUs by re-probing each one.

use std::collections::BTreeSet;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, EventSet, Nvml};
use tokio::sync::mpsc::UnboundedSender;

use crate::platform::nvml::open_nvml;

/// GI/CI id NVML uses for "not attributed to an instance".
const NO_INSTANCE: u32 = 0xFFFF_FFFF;
/// Pause after a wait error other than a timeout, so a persistent error does not spin.
const ERROR_BACKOFF: Duration = Duration::from_secs(1);

/// Errors starting the watcher.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NvmlEventsError {
    /// NVML could not be opened or initialised.
    #[error("NVML event watcher: {0}")]
    Open(#[source] crate::domain::inventory::InventoryError),
    /// NVML answered, but the event set could not be set up.
    #[error("NVML event watcher: {call}: {source}")]
    Nvml {
        call: &'static str,
        #[source]
        source: NvmlError,
    },
    /// The OS refused to start the thread.
    #[error("cannot start the nvml-events thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The thread ended before reporting whether it started.
    #[error("the nvml-events thread exited during start-up")]
    StartupLost,
}

/// Result alias for this module.
pub(crate) type Result<T, E = NvmlEventsError> = std::result::Result<T, E>;

/// One health signal about a GPU (or one of its MIG devices).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HealthEvent {
    /// UUID of the physical GPU the event was reported on.
    pub(crate) gpu_uuid: String,
    /// GPU instance the event is attributed to, when NVML names one (MIG).
    pub(crate) gpu_instance_id: Option<u32>,
    /// Compute instance the event is attributed to, when NVML names one (MIG).
    pub(crate) compute_instance_id: Option<u32>,
    /// What happened.
    pub(crate) kind: HealthEventKind,
}

/// Kinds of health signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HealthEventKind {
    /// An XID critical error with its number.
    Xid(u64),
    /// A double-bit ECC error.
    DoubleBitEcc,
    /// A single-bit ECC error.
    SingleBitEcc,
    /// The GPU fell off the bus.
    GpuLost,
    /// Registration or waiting failed for this GPU: its health is unknown.
    WaitError(String),
}

impl std::fmt::Display for HealthEventKind {
    /// The short codes health reasons use (`xid-79`, `gpu-lost`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HealthEventKind::Xid(x) => write!(f, "xid-{x}"),
            HealthEventKind::DoubleBitEcc => f.write_str("double-bit-ecc"),
            HealthEventKind::SingleBitEcc => f.write_str("single-bit-ecc"),
            HealthEventKind::GpuLost => f.write_str("gpu-lost"),
            HealthEventKind::WaitError(m) => write!(f, "event-wait-error ({m})"),
        }
    }
}

/// A running watcher. Dropping it stops and joins the thread.
#[derive(Debug)]
pub(crate) struct NvmlEventWatcher {
    /// The library the watcher opened, for [`NvmlEventWatcher::reprobe`].
    #[cfg(test)]
    lib_path: Option<PathBuf>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl NvmlEventWatcher {
    /// Open NVML from `lib_path` (`None`: `libnvidia-ml.so.1`) on a new thread, register all
    /// GPUs and start waiting with `wait_timeout` per wait. Returns once registration is done;
    /// fails if NVML cannot be opened or the event set cannot be created.
    pub(crate) fn start(
        lib_path: Option<PathBuf>,
        wait_timeout: Duration,
        tx: UnboundedSender<HealthEvent>,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("nvml-events".to_string())
            .spawn({
                let lib_path = lib_path.clone();
                let stop = Arc::clone(&stop);
                move || run(lib_path.as_deref(), wait_timeout, &tx, &stop, ready_tx)
            })
            .map_err(NvmlEventsError::Spawn)?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                #[cfg(test)]
                lib_path,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(NvmlEventsError::StartupLost)
            }
        }
    }

    #[cfg(test)]
    /// Ask the thread to stop and wait for it (at most one wait timeout).
    pub(crate) fn stop(mut self) {
        self.shutdown();
    }

    /// Ask the thread to stop without waiting for it: it is blocked in
    /// `nvmlEventSetWait_v2` (FFI, not cancellable) and exits when that wait returns. Used
    /// at daemon shutdown, which must not wait up to a whole wait timeout; the process
    /// exits right after.
    pub(crate) fn detach(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        drop(self.thread.take());
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("nvml-events thread panicked");
        }
    }

    #[cfg(test)]
    /// Blocking: whether the GPU answers again (see [`reprobe`]).
    pub(crate) fn reprobe(&self, gpu_uuid: &str) -> bool {
        reprobe(self.lib_path.as_deref(), gpu_uuid)
    }
}

impl Drop for NvmlEventWatcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Blocking: open NVML and check that the GPU `gpu_uuid` can be found and answers a memory
/// query. Health recovery uses it before marking a device healthy again.
pub(crate) fn reprobe(lib_path: Option<&Path>, gpu_uuid: &str) -> bool {
    let nvml = match open_nvml(lib_path) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(gpu = gpu_uuid, error = %e, "re-probe: NVML unavailable");
            return false;
        }
    };
    probe(&nvml, gpu_uuid).is_ok()
}

fn probe(nvml: &Nvml, gpu_uuid: &str) -> Result<(), NvmlError> {
    nvml.device_by_uuid(gpu_uuid)?.memory_info().map(|_| ())
}

/// The thread body: set up, report readiness, loop until stopped.
fn run(
    lib_path: Option<&Path>,
    wait_timeout: Duration,
    tx: &UnboundedSender<HealthEvent>,
    stop: &AtomicBool,
    ready: std::sync::mpsc::Sender<Result<()>>,
) {
    let nvml = match open_nvml(lib_path) {
        Ok(n) => n,
        Err(e) => {
            let _ = ready.send(Err(NvmlEventsError::Open(e)));
            return;
        }
    };
    let (set, gpus) = match register_all(&nvml, tx) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    tracing::info!(gpus = gpus.len(), "NVML event watcher started");
    wait_loop(&nvml, &set, &gpus, wait_timeout, tx, stop);
    if let Err(e) = set.release_events() {
        tracing::warn!(error = %e, "cannot free the NVML event set");
    }
    tracing::info!("NVML event watcher stopped");
}

/// A GPU registered for events.
#[derive(Debug, Clone)]
struct Registered {
    index: u32,
    uuid: String,
    mask: EventTypes,
}

fn wanted() -> EventTypes {
    EventTypes::CRITICAL_XID_ERROR
        | EventTypes::DOUBLE_BIT_ECC_ERROR
        | EventTypes::SINGLE_BIT_ECC_ERROR
}

fn wait_error(uuid: &str, message: String) -> HealthEvent {
    HealthEvent {
        gpu_uuid: uuid.to_string(),
        gpu_instance_id: None,
        compute_instance_id: None,
        kind: HealthEventKind::WaitError(message),
    }
}

/// Register every GPU on one set, one GPU at a time.
fn register_all<'n>(
    nvml: &'n Nvml,
    tx: &UnboundedSender<HealthEvent>,
) -> Result<(EventSet<'n>, Vec<Registered>)> {
    let count = nvml
        .device_count()
        .map_err(|source| NvmlEventsError::Nvml {
            call: "nvmlDeviceGetCount_v2",
            source,
        })?;
    let mut set = new_set(nvml)?;
    let mut done: Vec<Registered> = Vec::new();
    for index in 0..count {
        let Some(candidate) = candidate(nvml, index, tx) else {
            continue;
        };
        let dev = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                let _ = tx.send(wait_error(&candidate.uuid, e.to_string()));
                continue;
            }
        };
        match dev.register_events(candidate.mask, set) {
            Ok(s) => {
                set = s;
                done.push(candidate);
            }
            Err(e) => {
                // The wrapper freed the set: report this GPU, rebuild from the ones that worked.
                tracing::warn!(gpu = %candidate.uuid, error = %e.error, "cannot register NVML events");
                if !matches!(e.error, NvmlError::NotSupported) {
                    let _ = tx.send(wait_error(&candidate.uuid, e.error.to_string()));
                }
                set = rebuild(nvml, &mut done, tx)?;
            }
        }
    }
    Ok((set, done))
}

/// The GPU at `index` with the mask to register, or `None` if it supports none of it.
fn candidate(nvml: &Nvml, index: u32, tx: &UnboundedSender<HealthEvent>) -> Option<Registered> {
    let found = nvml
        .device_by_index(index)
        .and_then(|dev| dev.uuid().map(|uuid| (dev, uuid)));
    let (dev, uuid) = match found {
        Ok(f) => f,
        Err(e) => {
            // Without a UUID there is nobody to report to; the inventory reports this GPU.
            tracing::warn!(index, error = %e, "cannot identify GPU for health events");
            return None;
        }
    };
    match dev.supported_event_types() {
        Ok(supported) => {
            let mask = supported & wanted();
            if mask.is_empty() {
                tracing::info!(gpu = %uuid, "GPU supports no health events");
                return None;
            }
            Some(Registered { index, uuid, mask })
        }
        Err(NvmlError::NotSupported) => {
            tracing::info!(gpu = %uuid, "GPU does not report health events");
            None
        }
        Err(e) => {
            let _ = tx.send(wait_error(&uuid, e.to_string()));
            None
        }
    }
}

fn new_set(nvml: &Nvml) -> Result<EventSet<'_>> {
    nvml.create_event_set()
        .map_err(|source| NvmlEventsError::Nvml {
            call: "nvmlEventSetCreate",
            source,
        })
}

/// A fresh set with the GPUs in `done` registered again; GPUs that now fail are reported
/// and dropped (each failure frees the set, so registration starts over without them).
fn rebuild<'n>(
    nvml: &'n Nvml,
    done: &mut Vec<Registered>,
    tx: &UnboundedSender<HealthEvent>,
) -> Result<EventSet<'n>> {
    loop {
        let mut set = Some(new_set(nvml)?);
        let mut failed = None;
        for (i, r) in done.iter().enumerate() {
            let Some(current) = set.take() else { break };
            let dev = match nvml.device_by_index(r.index) {
                Ok(d) => d,
                Err(e) => {
                    failed = Some((i, e.to_string()));
                    break;
                }
            };
            match dev.register_events(r.mask, current) {
                Ok(s) => set = Some(s),
                Err(e) => {
                    failed = Some((i, e.error.to_string()));
                    break;
                }
            }
        }
        match (failed, set) {
            (None, Some(set)) => return Ok(set),
            (Some((i, message)), _) => {
                let r = done.remove(i);
                let _ = tx.send(wait_error(&r.uuid, message));
            }
            // Not reached (a set is only lost with a failure); retrying is still correct.
            (None, None) => {}
        }
    }
}

fn wait_loop(
    nvml: &Nvml,
    set: &EventSet<'_>,
    gpus: &[Registered],
    wait_timeout: Duration,
    tx: &UnboundedSender<HealthEvent>,
    stop: &AtomicBool,
) {
    let timeout_ms = u32::try_from(wait_timeout.as_millis()).unwrap_or(u32::MAX);
    let mut reported_lost = BTreeSet::new();
    while !stop.load(Ordering::Relaxed) {
        let events = match wait_raw(nvml, set, timeout_ms) {
            Ok(Some(ev)) => event_to_health(nvml, ev).into_iter().collect(),
            Ok(None) => continue,
            Err(NvmlError::GpuLost) => {
                let mut lost = lost_gpus(nvml, gpus, &mut reported_lost);
                if lost.is_empty() && reported_lost.is_empty() {
                    // Lost, but every GPU still answers: health unknown for all of them.
                    lost = gpus
                        .iter()
                        .map(|g| wait_error(&g.uuid, NvmlError::GpuLost.to_string()))
                        .collect();
                }
                backoff(stop);
                lost
            }
            Err(e) => {
                tracing::warn!(error = %e, "NVML event wait failed");
                let events = gpus
                    .iter()
                    .map(|g| wait_error(&g.uuid, e.to_string()))
                    .collect();
                backoff(stop);
                events
            }
        };
        for ev in events {
            tracing::debug!(gpu = %ev.gpu_uuid, kind = %ev.kind, "NVML health event");
            if tx.send(ev).is_err() {
                tracing::info!("health receiver gone; stopping the NVML event watcher");
                return;
            }
        }
    }
}

/// Sleep [`ERROR_BACKOFF`] in small steps so a stop request is still honoured quickly.
fn backoff(stop: &AtomicBool) {
    let until = Instant::now() + ERROR_BACKOFF;
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The registered GPUs that no longer answer, each reported once.
fn lost_gpus(
    nvml: &Nvml,
    gpus: &[Registered],
    reported: &mut BTreeSet<String>,
) -> Vec<HealthEvent> {
    let mut out = Vec::new();
    for g in gpus {
        match probe(nvml, &g.uuid) {
            Ok(()) => {
                reported.remove(&g.uuid);
            }
            Err(e) => {
                tracing::warn!(gpu = %g.uuid, error = %e, "GPU lost");
                if reported.insert(g.uuid.clone()) {
                    out.push(HealthEvent {
                        gpu_uuid: g.uuid.clone(),
                        gpu_instance_id: None,
                        compute_instance_id: None,
                        kind: HealthEventKind::GpuLost,
                    });
                }
            }
        }
    }
    out
}

/// What one raw wait returned, in owned form.
#[derive(Debug, Clone, Copy)]
struct RawEvent {
    device: usize,
    event_type: u64,
    event_data: u64,
    gpu_instance_id: u32,
    compute_instance_id: u32,
}

/// `nvmlEventSetWait_v2` through the raw symbol, keeping the GI/CI ids. `Ok(None)` on timeout.
fn wait_raw(
    nvml: &Nvml,
    set: &EventSet<'_>,
    timeout_ms: u32,
) -> Result<Option<RawEvent>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    let mut data = MaybeUninit::zeroed();
    // SAFETY: `set.handle()` is a live set of this `Nvml` (borrowed for the call), the symbol
    // has nvml.h's signature `(nvmlEventSet_t, nvmlEventData_t*, unsigned)`, and `data` is a
    // writable, zero-initialised `nvmlEventData_t` that outlives the call.
    let rc = unsafe { sym(set.handle(), data.as_mut_ptr(), timeout_ms) };
    match nvml_try(rc) {
        Ok(()) => {}
        Err(NvmlError::Timeout) => return Ok(None),
        Err(e) => return Err(e),
    }
    // SAFETY: zero is a valid bit pattern for this plain C struct (a pointer and integers), and
    // NVML filled it on success.
    let data = unsafe { data.assume_init() };
    Ok(Some(RawEvent {
        device: data.device as usize,
        event_type: data.eventType,
        event_data: data.eventData,
        gpu_instance_id: data.gpuInstanceId,
        compute_instance_id: data.computeInstanceId,
    }))
}

fn event_to_health(nvml: &Nvml, ev: RawEvent) -> Option<HealthEvent> {
    let types = EventTypes::from_bits_truncate(ev.event_type);
    let kind = if types.contains(EventTypes::CRITICAL_XID_ERROR) {
        HealthEventKind::Xid(ev.event_data)
    } else if types.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
        HealthEventKind::DoubleBitEcc
    } else if types.contains(EventTypes::SINGLE_BIT_ECC_ERROR) {
        HealthEventKind::SingleBitEcc
    } else {
        return None;
    };
    // Identify the GPU by UUID, never by handle value.
    // SAFETY: NVML put a device handle of this `Nvml` in the event; the `Device` only borrows
    // `nvml` and is dropped before it.
    let dev = unsafe { Device::new(ev.device as _, nvml) };
    let gpu_uuid = match dev.uuid() {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, "event from an unidentifiable device");
            return None;
        }
    };
    let id = |v: u32| (v != NO_INSTANCE).then_some(v);
    Some(HealthEvent {
        gpu_uuid,
        gpu_instance_id: id(ev.gpu_instance_id),
        compute_instance_id: id(ev.compute_instance_id),
        kind,
    })
}

#[cfg(test)]
mod display_tests {
    use super::HealthEventKind;

    #[test]
    fn event_kinds_log_as_codes() {
        assert_eq!(HealthEventKind::Xid(79).to_string(), "xid-79");
        assert_eq!(HealthEventKind::GpuLost.to_string(), "gpu-lost");
        assert_eq!(
            HealthEventKind::WaitError("timeout".into()).to_string(),
            "event-wait-error (timeout)"
        );
    }
}
