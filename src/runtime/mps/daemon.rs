//! Supervisor of the MPS control daemons: start, configure, watch, restart, stop.
//!
//! One task per [`DaemonSpec`], spawned on the caller's `TaskTracker` and stopped by its
//! `CancellationToken`. Each task runs `nvidia-cuda-mps-control -f` (foreground) as a
//! child of gpu-slicer with the spec's environment, waits until the control pipe answers
//! `get_default_active_thread_percentage` (a client invocation of the same binary with
//! the same environment, command on stdin), sends the default limits, and reports
//! [`DaemonState::Up`]. When the child exits the task reports [`DaemonState::Down`] and
//! restarts it with exponential backoff; on cancellation it sends `quit`, waits with a
//! deadline, and kills the child otherwise. States are published on a
//! `tokio::sync::watch` channel, read by the device plugin (devices Unhealthy while their
//! daemon is not Up).
//!
//! Why `-f` and not `-d` (NVIDIA's plugin): with `-d` the daemon forks away and the
//! supervisor would have to poll its pid file to notice a crash (and could mistake a reused
//! PID for a live daemon). In the foreground the daemon is our child: its exit wakes the
//! task at once through `Child::wait`, `kill_on_drop` guarantees no orphan if gpu-slicer
//! is torn down, and its output goes to a file in the daemon's log directory.
//!
//! `/dev/shm`: each daemon has its own, `<mpsRoot>/<uuid>/shm`, a tmpfs of at most
//! `shm_size_bytes` mounted before its first start and removed after it stops
//! (`crate::platform::mps_shm`). The daemon is spawned in a mount namespace of its own with
//! that tmpfs bound onto `/dev/shm`, so it and the server it spawns meet their clients there
//! (the share devices bind the same host directory at `/dev/shm`), and no two daemons'
//! tenants share one. Without `CAP_SYS_ADMIN` the daemon does not start and stays Down
//! with an error saying so: a daemon on a shared `/dev/shm` is what this replaced. A task
//! replacing another for the same device (a settings change) waits until the old one has
//! stopped its daemon and removed the mount ([`DirOwners`]).
//!
//! Compute mode: when an `nvidia-smi` path is configured and exists, a whole GPU is set to
//! `EXCLUSIVE_PROCESS` before its daemon starts and back to `DEFAULT` after it stops, as
//! NVIDIA's plugin does, so only the MPS server can open a context on it. It is skipped for
//! MIG devices: compute mode is a setting of the parent GPU, which several MIG daemons (and
//! non-MPS MIG tenants) share, and one daemon stopping must not reset it under the others.
//! Failures are logged and do not stop the daemon.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::domain::mps::{DEFAULT_CONTROL_BIN, DaemonSpec, MpsError, Result};
use crate::platform::mps_shm;

/// State of one daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DaemonState {
    /// Not yet started or being configured for the first time.
    Starting,
    /// Running and configured: its devices may be advertised Healthy.
    Up,
    /// Not running (crashed, failed to start, or stopped); `reason` says why.
    Down {
        /// What happened.
        reason: String,
    },
}

impl DaemonState {
    /// Whether the daemon's devices may be used.
    pub(crate) fn is_up(&self) -> bool {
        matches!(self, DaemonState::Up)
    }
}

impl std::fmt::Display for DaemonState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DaemonState::Starting => f.write_str("starting"),
            DaemonState::Up => f.write_str("up"),
            DaemonState::Down { reason } => write!(f, "down ({reason})"),
        }
    }
}

/// States of all supervised daemons, keyed by device UUID.
pub(crate) type DaemonStates = BTreeMap<String, DaemonState>;

/// Longest each step of stopping a daemon (quit, wait for exit, compute mode back to
/// DEFAULT) may take before it is given up on (the daemon is killed).
const STOP_STEP: Duration = Duration::from_secs(1);

/// Supervisor settings (binary paths and timing; tests shorten the timing).
#[derive(Debug, Clone)]
pub(crate) struct SupervisorConfig {
    /// `nvidia-cuda-mps-control` or a stand-in.
    pub(crate) control_bin: PathBuf,
    /// `nvidia-smi` for compute-mode changes; `None` or a missing file skips them.
    pub(crate) nvidia_smi: Option<PathBuf>,
    /// First restart delay.
    pub(crate) backoff_base: Duration,
    /// Longest restart delay; a daemon that stayed up this long restarts at the base delay.
    pub(crate) backoff_max: Duration,
    /// How long a started daemon may take to answer on its control pipe.
    pub(crate) ready_timeout: Duration,
    /// Deadline of one control-client invocation.
    pub(crate) command_timeout: Duration,
    /// How long a daemon may take to exit after `quit` before it is killed.
    pub(crate) stop_timeout: Duration,
    /// Size bound of each daemon's `/dev/shm` tmpfs, bytes.
    pub(crate) shm_size_bytes: u64,
    /// Which task owns each daemon directory; shared by every supervisor started from
    /// clones of this config.
    pub(crate) owners: DirOwners,
}

/// One owner at a time per daemon directory (keyed by its shm path): a task that replaces
/// another for the same device starts only once the old one has stopped its daemon and
/// removed its tmpfs, or the old task's clean-up would unmount the new daemon's
/// `/dev/shm` (and two daemons would fight over one pipe directory).
#[derive(Debug, Clone, Default)]
pub(crate) struct DirOwners(Arc<std::sync::Mutex<BTreeMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>>);

impl DirOwners {
    fn lock_for(&self, dir: &Path) -> Arc<tokio::sync::Mutex<()>> {
        // A poisoned map still holds valid locks: a panic elsewhere must not stop MPS.
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(dir.to_path_buf()).or_default().clone()
    }
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            control_bin: PathBuf::from(DEFAULT_CONTROL_BIN),
            nvidia_smi: None,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            ready_timeout: Duration::from_secs(10),
            command_timeout: Duration::from_secs(5),
            stop_timeout: Duration::from_secs(5),
            shm_size_bytes: 1 << 30,
            owners: DirOwners::default(),
        }
    }
}

/// Handle on the running supervisor: the state channel.
#[derive(Debug, Clone)]
pub(crate) struct Supervisor {
    states: watch::Receiver<DaemonStates>,
}

impl Supervisor {
    /// Start one supervising task per daemon on `tracker`; they stop when `cancel` fires.
    ///
    /// Returns at once; every daemon starts as [`DaemonState::Starting`]. Advertise a
    /// resource only once its daemons are Up (`Supervisor::wait_up`, in tests).
    pub(crate) fn start(
        daemons: Vec<DaemonSpec>,
        config: SupervisorConfig,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let initial: DaemonStates = daemons
            .iter()
            .map(|d| (d.uuid.clone(), DaemonState::Starting))
            .collect();
        let (tx, rx) = watch::channel(initial);
        for spec in daemons {
            let task = DaemonTask {
                spec,
                config: config.clone(),
                states: tx.clone(),
                cancel: cancel.clone(),
            };
            tracker.spawn(task.run());
        }
        Self { states: rx }
    }

    /// A receiver of state changes.
    pub(crate) fn states(&self) -> watch::Receiver<DaemonStates> {
        self.states.clone()
    }

    #[cfg(test)]
    /// Wait until every daemon is Up, at most `timeout`.
    pub(crate) async fn wait_up(&self, timeout: Duration) -> Result<()> {
        let mut rx = self.states.clone();
        let waited = tokio::time::timeout(timeout, rx.wait_for(|s| s.values().all(|d| d.is_up())))
            .await
            .map(|r| r.is_ok());
        if matches!(waited, Ok(true)) {
            return Ok(());
        }
        let down = self
            .states
            .borrow()
            .iter()
            .filter(|(_, s)| !s.is_up())
            .map(|(u, s)| format!("{u}: {s}"))
            .collect::<Vec<_>>()
            .join(", ");
        Err(MpsError::NotUp {
            waited: timeout,
            down,
        })
    }
}

/// One daemon's supervising loop.
#[derive(Debug)]
struct DaemonTask {
    spec: DaemonSpec,
    config: SupervisorConfig,
    states: watch::Sender<DaemonStates>,
    cancel: CancellationToken,
}

impl DaemonTask {
    fn set(&self, state: DaemonState) {
        self.states.send_modify(|m| {
            m.insert(self.spec.uuid.clone(), state);
        });
    }

    #[tracing::instrument(name = "mps_daemon", skip(self), fields(uuid = %self.spec.uuid))]
    async fn run(self) {
        let owner = self.config.owners.lock_for(&self.spec.shm_dir);
        let _owner = tokio::select! {
            () = self.cancel.cancelled() => {
                self.set(DaemonState::Down { reason: "stopped".into() });
                return;
            }
            guard = owner.lock_owned() => guard,
        };
        let mut failures: u32 = 0;
        let mut mounted = false;
        let whole_gpu = self.spec.uuid == self.spec.gpu_uuid;
        if whole_gpu {
            set_compute_mode(&self.config, &self.spec.uuid, "EXCLUSIVE_PROCESS").await;
        }
        loop {
            if self.cancel.is_cancelled() {
                break;
            }
            let started = Instant::now();
            let attempt = match self.mount_shm(&mut mounted) {
                Ok(()) => self.start_and_configure().await,
                Err(e) => Err(e),
            };
            match attempt {
                Ok(child) => {
                    tracing::info!(resource = %self.spec.resource, "MPS control daemon up");
                    self.set(DaemonState::Up);
                    match self.watch(child).await {
                        Watched::Stopped => break,
                        Watched::Exited(reason) => {
                            tracing::warn!(%reason, "MPS control daemon exited");
                            self.set(DaemonState::Down { reason });
                        }
                    }
                    // A daemon that ran for a while earns a fresh backoff.
                    if started.elapsed() >= self.config.backoff_max {
                        failures = 0;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "MPS control daemon failed to start");
                    self.set(DaemonState::Down {
                        reason: e.to_string(),
                    });
                }
            }
            let delay = backoff(&self.config, failures);
            failures = failures.saturating_add(1);
            tracing::info!(
                delay_ms = delay.as_millis() as u64,
                "restarting MPS control daemon"
            );
            tokio::select! {
                () = self.cancel.cancelled() => break,
                () = tokio::time::sleep(delay) => {}
            }
        }
        self.set(DaemonState::Down {
            reason: "stopped".into(),
        });
        if mounted {
            // The daemon is gone: its tenants' segments go with it, and a container started
            // later must fail on the missing directory, not get an unbounded one.
            match mps_shm::remove(&self.spec.shm_dir) {
                Ok(()) => tracing::debug!(shm = %self.spec.shm_dir.display(), "MPS shm removed"),
                Err(e) => {
                    tracing::warn!(shm = %self.spec.shm_dir.display(), error = %e, "cannot remove the MPS shm")
                }
            }
        }
        if whole_gpu {
            // Bounded like the stop itself: shutdown has a deadline.
            let _ = tokio::time::timeout(
                STOP_STEP,
                set_compute_mode(&self.config, &self.spec.uuid, "DEFAULT"),
            )
            .await;
        }
        tracing::info!("MPS control daemon stopped");
    }

    /// Mount the daemon's `/dev/shm` tmpfs once per task: a restarted daemon keeps it.
    fn mount_shm(&self, mounted: &mut bool) -> Result<()> {
        if *mounted {
            return Ok(());
        }
        let spec = &self.spec;
        mps_shm::mount(&spec.shm_dir, self.config.shm_size_bytes).map_err(|source| {
            MpsError::Shm {
                uuid: spec.uuid.clone(),
                path: spec.shm_dir.clone(),
                size_bytes: self.config.shm_size_bytes,
                source,
            }
        })?;
        *mounted = true;
        tracing::debug!(shm = %spec.shm_dir.display(), size_bytes = self.config.shm_size_bytes, "MPS shm mounted");
        Ok(())
    }

    /// Create the directories, start the daemon, wait for its pipe, send the limits.
    async fn start_and_configure(&self) -> Result<Child> {
        let spec = &self.spec;
        create_dir(&spec.pipe_dir, 0o755)?;
        create_dir(&spec.log_dir, 0o755)?;
        let (out, err) = control_log(&spec.log_dir)?;
        let bind = mps_shm::ShmBind::check_target()
            .and_then(|()| mps_shm::ShmBind::new(&spec.shm_dir))
            .map_err(|source| MpsError::Namespace {
                bin: self.config.control_bin.clone(),
                uuid: spec.uuid.clone(),
                shm: spec.shm_dir.clone(),
                source,
            })?;
        let mut command = Command::new(&self.config.control_bin);
        command
            .arg("-f")
            .envs(spec.env())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // The child must never outlive its supervisor.
            .kill_on_drop(true);
        // SAFETY: `apply` runs between fork and exec and only makes system calls (no
        // allocation, no locks), which is all a child of a multithreaded process may do.
        unsafe {
            command.pre_exec(move || bind.apply());
        }
        let mut child = command.spawn().map_err(|source| {
            // The pre-exec step fails with the errno of unshare/mount: EPERM without
            // CAP_SYS_ADMIN; a missing binary is ENOENT.
            if source.raw_os_error() == Some(nix::libc::EPERM) {
                MpsError::Namespace {
                    bin: self.config.control_bin.clone(),
                    uuid: spec.uuid.clone(),
                    shm: spec.shm_dir.clone(),
                    source: std::io::Error::new(
                        source.kind(),
                        format!("{source} (unshare and mount need CAP_SYS_ADMIN)"),
                    ),
                }
            } else {
                MpsError::Spawn {
                    bin: self.config.control_bin.clone(),
                    uuid: spec.uuid.clone(),
                    source,
                }
            }
        })?;
        tracing::debug!(pid = child.id(), "MPS control daemon started");

        let deadline = Instant::now() + self.config.ready_timeout;
        loop {
            if let Some(status) = child.try_wait().map_err(|e| MpsError::ExitedEarly {
                uuid: spec.uuid.clone(),
                status: e.to_string(),
            })? {
                return Err(MpsError::ExitedEarly {
                    uuid: spec.uuid.clone(),
                    status: describe(status),
                });
            }
            // A control client that hangs must not hold up a stop.
            let answered = tokio::select! {
                () = self.cancel.cancelled() => None,
                r = control(&self.config, spec, "get_default_active_thread_percentage") => Some(r),
            };
            match answered {
                Some(Ok(_)) => break,
                Some(Err(e)) if Instant::now() >= deadline => return Err(e),
                Some(Err(_)) | None => {}
            }
            tokio::select! {
                () = self.cancel.cancelled() => {
                    stop(&self.config, spec, &mut child).await;
                    return Err(MpsError::Control {
                        uuid: spec.uuid.clone(),
                        command: "get_default_active_thread_percentage".into(),
                        message: "cancelled while waiting for the control pipe".into(),
                    });
                }
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
        for command in spec.default_limit_commands() {
            if let Err(e) = control(&self.config, spec, &command).await {
                stop(&self.config, spec, &mut child).await;
                return Err(e);
            }
        }
        Ok(child)
    }

    /// Wait for the daemon to exit or for cancellation (then stop it).
    async fn watch(&self, mut child: Child) -> Watched {
        tokio::select! {
            status = child.wait() => Watched::Exited(match status {
                Ok(s) => describe(s),
                Err(e) => format!("cannot wait for the daemon: {e}"),
            }),
            () = self.cancel.cancelled() => {
                stop(&self.config, &self.spec, &mut child).await;
                Watched::Stopped
            }
        }
    }
}

/// How a watched daemon ended.
#[derive(Debug)]
enum Watched {
    /// Cancelled and stopped by us.
    Stopped,
    /// Exited by itself.
    Exited(String),
}

/// Restart delay after `failures` consecutive failures: base × 2^failures, capped.
fn backoff(config: &SupervisorConfig, failures: u32) -> Duration {
    let factor = 1u32.checked_shl(failures.min(16)).unwrap_or(u32::MAX);
    config
        .backoff_base
        .saturating_mul(factor)
        .min(config.backoff_max)
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}

fn create_dir(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| MpsError::CreateDir {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(path).map_err(err)?;
    // Clients run as any user and must reach the pipe; umask must not narrow it.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(err)
}

/// Send one command through a control-client invocation; returns its trimmed stdout.
async fn control(config: &SupervisorConfig, spec: &DaemonSpec, command: &str) -> Result<String> {
    let fail = |message: String| MpsError::Control {
        uuid: spec.uuid.clone(),
        command: command.to_string(),
        message,
    };
    let mut child = Command::new(&config.control_bin)
        .envs(spec.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| fail(format!("cannot run {}: {e}", config.control_bin.display())))?;
    let mut stdin = child.stdin.take().ok_or_else(|| fail("no stdin".into()))?;
    let run = async {
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .map_err(|e| fail(format!("cannot write the command: {e}")))?;
        // Closing stdin ends the client's interactive session.
        drop(stdin);
        child
            .wait_with_output()
            .await
            .map_err(|e| fail(e.to_string()))
    };
    let output = tokio::time::timeout(config.command_timeout, run)
        .await
        .map_err(|_| fail(format!("no answer within {:?}", config.command_timeout)))??;
    if !output.status.success() {
        return Err(fail(format!(
            "{}: {}",
            describe(output.status),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    tracing::debug!(command, "MPS control command sent");
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// Ask the daemon to quit; kill it if it has not exited by the deadline.
async fn stop(config: &SupervisorConfig, spec: &DaemonSpec, child: &mut Child) {
    // Stopping happens on reloads and at shutdown, which has a deadline of its own: a
    // daemon or control client that hangs is given one short step each, then killed.
    let step = config.stop_timeout.min(STOP_STEP);
    match tokio::time::timeout(step, control(config, spec, "quit")).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "MPS quit failed; killing the daemon"),
        Err(_) => tracing::warn!(timeout = ?step, "MPS quit did not answer; killing the daemon"),
    }
    match tokio::time::timeout(step, child.wait()).await {
        Ok(Ok(status)) => tracing::debug!(status = %describe(status), "MPS control daemon exited"),
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot wait for the MPS control daemon"),
        Err(_) => {
            tracing::warn!(timeout = ?step, "MPS control daemon ignored quit; killing it");
            if let Err(e) = child.kill().await {
                tracing::warn!(error = %e, "cannot kill the MPS control daemon");
            }
        }
    }
}

/// `nvidia-smi -i <gpu> -c <mode>`, when configured and present; failures are logged.
async fn set_compute_mode(config: &SupervisorConfig, gpu_uuid: &str, mode: &str) {
    let Some(smi) = config.nvidia_smi.as_deref() else {
        tracing::debug!("no nvidia-smi configured; compute mode left as is");
        return;
    };
    if !smi.exists() {
        tracing::info!(nvidia_smi = %smi.display(), "nvidia-smi not found; compute mode left as is");
        return;
    }
    let run = Command::new(smi)
        .args(["-i", gpu_uuid, "-c", mode])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(config.command_timeout, run).await {
        Ok(Ok(out)) if out.status.success() => {
            tracing::info!(gpu = gpu_uuid, mode, "compute mode set");
        }
        Ok(Ok(out)) => tracing::warn!(
            gpu = gpu_uuid,
            mode,
            status = %describe(out.status),
            stderr = %String::from_utf8_lossy(&out.stderr).trim(),
            "cannot set compute mode"
        ),
        Ok(Err(e)) => tracing::warn!(gpu = gpu_uuid, mode, error = %e, "cannot run nvidia-smi"),
        Err(_) => tracing::warn!(gpu = gpu_uuid, mode, "nvidia-smi timed out"),
    }
}

/// The daemon's stdout and stderr: `control.out` in its log directory, appended to.
fn control_log(log_dir: &std::path::Path) -> Result<(std::fs::File, std::fs::File)> {
    let out_path = log_dir.join("control.out");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&out_path)
        .map_err(|source| MpsError::CreateDir {
            path: out_path.clone(),
            source,
        })?;
    let err = out.try_clone().map_err(|source| MpsError::CreateDir {
        path: out_path,
        source,
    })?;
    Ok((out, err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_read_as_words_not_rust_debug_text() {
        let down = DaemonState::Down {
            reason: "exit status: 1".into(),
        };
        assert_eq!(down.to_string(), "down (exit status: 1)");
        assert_eq!(DaemonState::Starting.to_string(), "starting");
        assert_eq!(DaemonState::Up.to_string(), "up");
    }

    #[test]
    fn backoff_doubles_up_to_the_max() {
        let config = SupervisorConfig {
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_millis(1000),
            ..SupervisorConfig::default()
        };
        let delays: Vec<u128> = (0..6).map(|f| backoff(&config, f).as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(&config, u32::MAX), Duration::from_millis(1000));
    }
}
