//! `gpu-slicer demo`: the device plugin at work, end to end, on the built-in `mixed-a100`
//! node, told as a story ([`story`] words it: the node's GPUs and MIG slices first, what a
//! container receives from the CDI spec, counts in correct English, no log lines). Starts the kubelet emulator and the daemon in-process in a temporary directory,
//! lets every resource register over real unix sockets, performs a few kubelet-style
//! allocations (a MIG slice, a whole GPU, two replicas), injects an XID through the health
//! monitor's sim event file, shows the refusal that follows and the recovery after the quiet
//! period, then rewrites the watched config file (GPU 3 split 4 ways with `isolation:
//! memory`) and shows the live reload and a 3-share allocation with its memory-limit hook,
//! prints each answer and stops.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use crate::domain::allocate::answer::GENERATION_ANNOTATION;
use crate::domain::config::{ConfigError, Overrides};
use crate::domain::health::XidFilter;
use crate::domain::inventory::InventoryError;
use crate::platform::sim::SimBackend;
use crate::runtime::health::{HealthSettings, SIM_POLL_INTERVAL, Source};
use crate::runtime::supervisor::{self as app, AppError};
use crate::testkit::kubelet::{Allocation, EmulatorError, KubeletEmulator};
use crate::testkit::node::NodeFailure;
use crate::testkit::{Node, NodeError};

/// The demo's sharing config: MIG slices per profile, GPU 2 whole, GPU 3 time-sliced
/// into 4 replicas under its own name.
pub(crate) const DEMO_CONFIG: &str = "version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      rename: nvidia.com/gpu.shared
      devices: [3]
      replicas: 4
";

/// Quiet period after which the demo's GPU recovers (`run` defaults to 60 s).
const DEMO_QUIET_PERIOD: Duration = Duration::from_secs(1);

/// Longest the demo waits for registration.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the demo.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DemoError {
    /// Writing output or the temp directory failed.
    #[error("demo: {0}")]
    Io(#[from] std::io::Error),
    /// The built-in profile or config did not load.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The built-in profile did not load.
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    /// The emulated kubelet failed.
    #[error(transparent)]
    Emulator(#[from] EmulatorError),
    /// The daemon failed.
    #[error(transparent)]
    App(#[from] AppError),
    /// A step took too long.
    #[error("demo: timed out waiting for {0}")]
    Timeout(&'static str),
    /// The daemon task ended abnormally.
    #[error("demo: {0}")]
    Node(NodeError),
}

impl From<NodeError> for DemoError {
    fn from(e: NodeError) -> Self {
        match e.0 {
            NodeFailure::Dir(e) => Self::Io(e),
            NodeFailure::Profile(e) => Self::Inventory(e),
            NodeFailure::Emulator(e) => Self::Emulator(e),
            NodeFailure::App(e) => Self::App(e),
            NodeFailure::Timeout(what) => Self::Timeout(what),
            e @ (NodeFailure::Join(_) | NodeFailure::Flags { .. }) => Self::Node(NodeError(e)),
        }
    }
}

/// Run the demo, writing a report to `out`.
pub(crate) async fn demo(out: &mut impl Write) -> Result<(), DemoError> {
    // Short path: unix socket paths must fit in 108 bytes. Random and created 0700
    // exclusively: a predictable name in /tmp could be planted by another user.
    let tmp = crate::testkit::node::short_tempdir("gsd-")?;
    let dir = tmp.path().to_path_buf();
    let plugin_dir = dir.join("dp");
    let emulator = KubeletEmulator::start(&plugin_dir).await?;
    // A real, watched config file, so the script can reconfigure the running daemon.
    let config_file = dir.join("config.yaml");
    std::fs::write(&config_file, DEMO_CONFIG)?;
    let config = crate::platform::config_file::load(Some(&config_file), &Overrides::default())?;
    let backend = Arc::new(SimBackend::open("mixed-a100")?);
    let mut settings = Node::settings(&dir, config);
    let path = config_file.clone();
    settings.reload = app::ReloadSettings {
        load: Some(Arc::new(move || {
            crate::platform::config_file::load(Some(&path), &Overrides::default())
        })),
        triggers: crate::runtime::triggers::TriggerSettings {
            config_file: Some(config_file.clone()),
            ..crate::runtime::triggers::TriggerSettings::default()
        },
    };
    // Health as `run --backend sim:… --health-events-file` does it, with a short quiet period.
    let events_file = dir.join("health-events.jsonl");
    settings.health_monitor = Some(HealthSettings {
        source: Source::Sim {
            timeline: Vec::new(),
            events_file: Some(events_file.clone()),
            poll: SIM_POLL_INTERVAL,
        },
        filter: XidFilter::default(),
        quiet_period: DEMO_QUIET_PERIOD,
    });
    let node = Node::launch(tmp, emulator, settings, backend).await?;
    let script = script(
        &node.emulator,
        &node.running,
        &events_file,
        &config_file,
        out,
    )
    .await;
    let stopped = node.stop().await;
    script?;
    stopped?;
    writeln!(out, "\ndaemon stopped; sockets removed")?;
    Ok(())
}

async fn script(
    emulator: &KubeletEmulator,
    running: &app::Running,
    events_file: &std::path::Path,
    config_file: &std::path::Path,
    out: &mut impl Write,
) -> Result<(), DemoError> {
    write!(
        out,
        "{}",
        story::node_table(&running.inventory, &running.plan)
    )?;
    writeln!(
        out,
        "\nconfig: MIG slices served per profile (migStrategy: mixed), GPU 2 whole, GPU 3 time-sliced\n4 ways under its own name (nvidia.com/gpu.shared)\n"
    )?;
    writeln!(
        out,
        "registered with the (emulated) kubelet, one socket per resource:"
    )?;
    let registrations = emulator.registrations().borrow().clone();
    for name in registrations.keys() {
        let devices = emulator
            .devices(name)
            .map(|d| d.borrow().len())
            .unwrap_or_default();
        writeln!(
            out,
            "  {name:<26} {:>10}  ({})",
            story::count(devices, "device"),
            story::backing(&running.plan, name)
        )?;
    }
    let mut generations = Vec::new();
    for (resource, count) in [
        ("nvidia.com/mig-1g.10gb", 1),
        ("nvidia.com/gpu", 1),
        ("nvidia.com/gpu.shared", 2),
    ] {
        let a = emulator.allocate(resource, count).await?;
        print_allocation(out, &a, &mut generations)?;
        if resource == "nvidia.com/mig-1g.10gb"
            && let Some(name) = a.response.cdi_devices.first()
            && let Some(spec) = written_spec(config_file)
            && let Some(view) = story::container_view(&spec, name)
        {
            write!(out, "\n{view}")?;
        }
    }
    // A health event on GPU 3 takes every replica of it out of service.
    let gpu3 = running
        .inventory
        .gpus
        .iter()
        .find(|g| g.index == 3)
        .map(|g| g.uuid.clone())
        .unwrap_or_default();
    let mut shared = emulator
        .devices("nvidia.com/gpu.shared")
        .ok_or_else(|| EmulatorError::NotRegistered("nvidia.com/gpu.shared".into()))?;
    shared.borrow_and_update();
    // Written whole (temp file + rename): the health monitor reads and removes it.
    let tmp = events_file.with_extension("tmp");
    std::fs::write(&tmp, "{\"gpu\":3,\"kind\":\"xid\",\"xid\":79}\n")?;
    std::fs::rename(&tmp, events_file)?;
    tokio::time::timeout(STEP_TIMEOUT, shared.changed())
        .await
        .map_err(|_| DemoError::Timeout("the ListAndWatch update"))?
        .map_err(|_| DemoError::Timeout("the ListAndWatch update"))?;
    let healthy = shared.borrow().iter().filter(|d| d.healthy).count();
    writeln!(
        out,
        "\nXID 79 on GPU 3 ({gpu3}) via the sim event file: ListAndWatch now reports {healthy} healthy of {} replicas",
        shared.borrow().len()
    )?;
    let id = format!("{gpu3}::3");
    match emulator.allocate_ids("nvidia.com/gpu.shared", &[id]).await {
        Ok(_) => writeln!(
            out,
            "unexpected: Allocate of an unhealthy replica succeeded"
        )?,
        Err(e) => writeln!(
            out,
            "Allocate refused as it must be:\n  {e}\n  (the daemon logs each refusal as a warning; the demo keeps the log out of the story,\n  `RUST_LOG=warn gpu-slicer demo` shows it)"
        )?,
    }
    tokio::time::timeout(
        STEP_TIMEOUT,
        shared.wait_for(|d| d.iter().all(|d| d.healthy)),
    )
    .await
    .map_err(|_| DemoError::Timeout("recovery"))?
    .map_err(|_| DemoError::Timeout("recovery"))?;
    writeln!(
        out,
        "no new event for {DEMO_QUIET_PERIOD:?}, GPU 3 re-probed: all {} replicas Healthy again",
        shared.borrow().len()
    )?;
    reconfigure(
        emulator,
        running,
        config_file,
        &mut shared,
        &mut generations,
        out,
    )
    .await?;
    if let (Some(first), Some(last)) = (generations.first(), generations.last()) {
        writeln!(
            out,
            "\nevery answer is stamped {GENERATION_ANNOTATION}: the version of the node's state it was built\nfrom ({first} for the first answers, {last} for the last: the XID, the recovery and the reload\nchanged the state in between)"
        )?;
    }
    Ok(())
}

/// The CDI spec the daemon wrote: [`Node::settings`] puts the CDI directory beside the
/// config file in the demo's temp directory. `None` when it cannot be read (the story then leaves that step out).
fn written_spec(config_file: &std::path::Path) -> Option<crate::domain::cdi::Spec> {
    let spec_path = config_file
        .parent()
        .unwrap_or(config_file)
        .join("cdi")
        .join(crate::domain::cdi::spec_file_name(
            crate::domain::config::DEFAULT_CDI_KIND,
            crate::domain::cdi::Format::Yaml,
        ));
    let text = std::fs::read_to_string(&spec_path).ok()?;
    crate::domain::cdi::Spec::parse(&text, &spec_path).ok()
}

/// Rewrite the watched config: GPU 3's replicas get a driver-enforced memory share. The
/// running daemon reloads; only `nvidia.com/gpu.shared` changes.
async fn reconfigure(
    emulator: &KubeletEmulator,
    running: &app::Running,
    config_file: &std::path::Path,
    shared: &mut tokio::sync::watch::Receiver<Vec<crate::testkit::kubelet::DeviceInfo>>,
    generations: &mut Vec<String>,
    out: &mut impl Write,
) -> Result<(), DemoError> {
    let before = running.reloads.borrow().clone();
    let tmp = config_file.with_extension("tmp");
    std::fs::write(
        &tmp,
        DEMO_CONFIG.replace("replicas: 4", "replicas: 4\n      isolation: memory"),
    )?;
    std::fs::rename(&tmp, config_file)?;
    let mut reloads = running.reloads.clone();
    let status = tokio::time::timeout(
        STEP_TIMEOUT,
        reloads.wait_for(|s| s.applied + s.failed > before.applied + before.failed),
    )
    .await
    .map_err(|_| DemoError::Timeout("the reload"))?
    .map_err(|_| DemoError::Timeout("the reload"))?
    .clone();
    match (&status.last_error, &status.last_diff) {
        (Some(e), _) => writeln!(out, "\nreload refused: {e}")?,
        (None, Some(diff)) => writeln!(
            out,
            "\nconfig file rewritten (GPU 3: isolation: memory): reloaded without a restart; changed {:?}, {} resources untouched",
            diff.changed,
            diff.unchanged.len()
        )?,
        (None, None) => writeln!(out, "\nreload: nothing changed")?,
    }
    shared.borrow_and_update();
    // The 2-replica pod from before finishes, leaving all of GPU 3 free.
    for held in emulator.allocations() {
        if held.resource == "nvidia.com/gpu.shared" {
            emulator.release(&held.pod.namespace, &held.pod.name);
        }
    }
    let a = emulator.allocate("nvidia.com/gpu.shared", 3).await?;
    print_allocation(out, &a, generations)?;
    // The hook the runtime will run for that CDI device, from the spec the daemon wrote.
    if let (Some(spec), Some(name)) = (written_spec(config_file), a.response.cdi_devices.first())
        && let Some(device) = spec
            .devices
            .iter()
            .find(|d| name.ends_with(&format!("={}", d.name)))
    {
        for hook in &device.container_edits.hooks {
            writeln!(
                out,
                "  CDI hook    {} {}",
                hook.hook_name,
                hook.args.join(" ")
            )?;
        }
    }
    Ok(())
}

/// One Allocate answer; its generation stamp is kept for the closing remark rather than
/// printed unexplained.
fn print_allocation(
    out: &mut impl Write,
    a: &Allocation,
    generations: &mut Vec<String>,
) -> std::io::Result<()> {
    writeln!(
        out,
        "\nAllocate {} x{} -> {}",
        a.resource,
        a.device_ids.len(),
        a.device_ids.join(", ")
    )?;
    for name in &a.response.cdi_devices {
        writeln!(out, "  cdi device  {name}")?;
    }
    for (k, v) in &a.response.annotations {
        if k == GENERATION_ANNOTATION {
            generations.push(v.clone());
            continue;
        }
        writeln!(out, "  annotation  {k}={v}")?;
    }
    for (k, v) in &a.response.envs {
        writeln!(out, "  env         {k}={v}")?;
    }
    Ok(())
}

mod story;

#[cfg(test)]
mod demo_tests;
