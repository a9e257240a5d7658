//! Live reconfiguration of a running daemon, driven through its real triggers (a watched
//! config file, a ConfigMap-style `..data` swap, a re-scan of an edited node file) and
//! observed through the kubelet emulator over real sockets.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;

use crate::platform::sim::SimBackend;
use crate::runtime::supervisor::{ReloadSettings, ReloadStatus, RunSettings};
use crate::runtime::triggers::{Cause, TriggerSettings};
use crate::testkit::fixtures;
use crate::testkit::kubelet::KubeletEmulator;
use crate::testkit::{Node, temp_dir, within};

const FOUR: &str = "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n";

type Daemon = Node;

/// Replace a file the way editors and `kubectl cp` do: write aside, rename over.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// Start the daemon with `config_file` watched and `node` (a profile or file) as backend.
async fn start(dir: TempDir, config_file: PathBuf, node: &str) -> Daemon {
    let plugin_dir = dir.path().join("dp");
    let emulator = KubeletEmulator::start(&plugin_dir).await.expect("emulator");
    let load = fixtures::file_loader(&config_file);
    let config = load().expect("initial config");
    let backend = Arc::new(SimBackend::open(node).expect("node"));
    let mut settings = RunSettings::new(config, &plugin_dir, dir.path().join("cdi"));
    settings.reload = ReloadSettings {
        load: Some(load),
        triggers: TriggerSettings {
            config_file: Some(config_file),
            ..TriggerSettings::default()
        },
    };
    Node::launch(dir, emulator, settings, backend)
        .await
        .expect("daemon started")
}

#[tokio::test]
async fn more_replicas_re_advertise_only_that_resource() {
    let dir = temp_dir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, FOUR).unwrap();
    let d = start(dir, file.clone(), "mixed-a100").await;
    let before_regs = d.emulator.registrations().borrow().clone();
    let mut gpu = d.emulator.devices("nvidia.com/gpu").unwrap();
    assert_eq!(gpu.borrow_and_update().len(), 8);
    let before = d.running.reloads.borrow().clone();

    replace(&file, &FOUR.replace("replicas: 4", "replicas: 8"));
    let status = d.next_reload(&before).await;
    assert_eq!(status.applied, 1, "{status:?}");
    let diff = status.last_diff.expect("diff");
    assert_eq!(diff.changed, vec!["nvidia.com/gpu".to_string()]);
    assert!(diff.added.is_empty() && diff.removed.is_empty());

    // The new list arrives on the open stream, without re-registering.
    let list = within(
        "16 replicas advertised",
        gpu.wait_for(|devices| devices.len() == 16),
    )
    .await
    .unwrap()
    .clone();
    assert!(list.iter().any(|dev| dev.id.ends_with("::7")));
    // Allocate serves the new plan at once.
    let replica7 = list
        .iter()
        .find(|dev| dev.id.ends_with("::7"))
        .unwrap()
        .id
        .clone();
    d.emulator
        .allocate_ids("nvidia.com/gpu", &[replica7])
        .await
        .expect("replica ::7 exists after the reload");
    let after_regs = d.emulator.registrations().borrow().clone();
    for (name, reg) in &after_regs {
        let old = &before_regs[name];
        assert_eq!(reg.count, 1, "{name} re-registered");
        assert!(reg.open, "{name}: stream closed");
        if name == "nvidia.com/gpu" {
            assert!(reg.frames > old.frames, "{name}: no new frame");
        } else {
            assert_eq!(reg.frames, old.frames, "{name} got a frame it did not need");
        }
    }
    d.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_broken_config_keeps_the_last_good_plan() {
    let dir = temp_dir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, FOUR).unwrap();
    let d = start(dir, file.clone(), "mixed-a100").await;
    let plan = d.running.plan.clone();
    let before = d.running.reloads.borrow().clone();

    replace(&file, &FOUR.replace("replicas: 4", "replicas: four"));
    let status = d.next_reload(&before).await;
    assert_eq!((status.applied, status.failed), (0, 1), "{status:?}");
    let error = status.last_error.clone().expect("error kept");
    assert!(
        error.contains("config.yaml") && error.contains("replicas"),
        "error names file and field: {error}"
    );
    assert_eq!(*status.plan, *plan, "plan unchanged");
    // Still serving the old plan.
    d.emulator
        .allocate_ids(
            "nvidia.com/gpu",
            &["GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02::3".to_string()],
        )
        .await
        .expect("old plan still served");
    let regs = d.emulator.registrations().borrow().clone();
    assert!(regs.values().all(|r| r.open && r.count == 1));

    // A plan the config cannot build on this node is refused too.
    replace(&file, "version: v1\nflags: {migStrategy: single}\n");
    let status = d.next_reload(&status).await;
    assert_eq!(status.failed, 2, "{status:?}");
    assert!(
        status
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("single"),
        "{status:?}"
    );

    // A file that is gone is refused, naming the path.
    std::fs::remove_file(&file).unwrap();
    let status = d.next_reload(&status).await;
    assert_eq!(status.failed, 3, "{status:?}");
    assert!(
        status
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("config.yaml"),
        "{status:?}"
    );

    // Fixing the file applies it.
    replace(&file, FOUR);
    let status = d.next_reload(&status).await;
    assert!(status.last_error.is_none(), "{status:?}");
    d.stop().await.expect("clean stop");
}

#[tokio::test]
async fn configmap_symlink_swap_is_followed() {
    let dir = temp_dir();
    let root = dir.path().join("cm");
    std::fs::create_dir_all(root.join("..v1")).unwrap();
    std::fs::write(root.join("..v1/config.yaml"), FOUR).unwrap();
    std::os::unix::fs::symlink("..v1", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/config.yaml", root.join("config.yaml")).unwrap();
    let d = start(dir, root.join("config.yaml"), "mixed-a100").await;
    let before = d.running.reloads.borrow().clone();
    let mut gpu = d.emulator.devices("nvidia.com/gpu").unwrap();

    std::fs::create_dir_all(root.join("..v2")).unwrap();
    std::fs::write(
        root.join("..v2/config.yaml"),
        FOUR.replace("replicas: 4", "replicas: 2"),
    )
    .unwrap();
    std::os::unix::fs::symlink("..v2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();

    let status = d.next_reload(&before).await;
    assert_eq!(status.applied, 1, "{status:?}");
    within("4 replicas", gpu.wait_for(|v| v.len() == 4))
        .await
        .unwrap();
    d.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_allocated_device_stays_in_the_spec_after_it_leaves_the_node() {
    let dir = temp_dir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, "version: v1\nflags: {migStrategy: mixed}\n").unwrap();
    let node = dir.path().join("node.yaml");
    let text = include_str!("../../../hack/nodes/mixed-a100.yaml");
    std::fs::write(&node, text).unwrap();
    let d = start(dir, file, node.to_str().unwrap()).await;
    const HELD: &str = "MIG-1b2c3d4e-0000-4a00-8000-00000000000d";
    const FREE: &str = "MIG-1b2c3d4e-0000-4a00-8000-00000000000c";
    d.emulator
        .allocate_ids("nvidia.com/mig-1g.10gb", &[HELD.to_string()])
        .await
        .expect("allocate");
    assert!(d.cdi_spec().contains(HELD) && d.cdi_spec().contains(FREE));
    let mut mig = d.emulator.devices("nvidia.com/mig-1g.10gb").unwrap();
    assert_eq!(mig.borrow_and_update().len(), 9);

    // The MIG layout changes: GPU 0 loses GPU instances 12 and 13.
    let edited: String = text
        .lines()
        .filter(|l| !l.contains("gpuInstanceId: 12}") && !l.contains("gpuInstanceId: 13}"))
        .map(|l| format!("{l}\n"))
        .collect();
    replace(&node, &edited);
    let before = d.running.reloads.borrow().clone();
    d.running.probe().reload.send(Cause::Request).await.unwrap();
    let status = d.next_reload(&before).await;
    assert_eq!(status.applied, 1, "{status:?}");
    assert_eq!(
        status.last_diff.unwrap().changed,
        vec!["nvidia.com/mig-1g.10gb".to_string()]
    );
    within("7 slices advertised", mig.wait_for(|v| v.len() == 7))
        .await
        .unwrap();
    let spec = d.cdi_spec();
    assert!(
        spec.contains(HELD),
        "allocated device dropped from the spec"
    );
    assert!(!spec.contains(FREE), "free device kept");
    crate::domain::cdi::validate(
        &crate::domain::cdi::Spec::parse(&spec, Path::new("x.yaml")).unwrap(),
    )
    .expect("spec with a kept device is valid");
    // The device is gone from the resource: Allocate refuses it by name.
    let err = d
        .emulator
        .allocate_ids("nvidia.com/mig-1g.10gb", &[HELD.to_string()])
        .await
        .unwrap_err();
    assert!(err.to_string().contains(HELD), "{err}");
    d.stop().await.expect("clean stop");
}

#[tokio::test]
async fn health_survives_a_reload() {
    let dir = temp_dir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, FOUR).unwrap();
    let d = start(dir, file.clone(), "mixed-a100").await;
    const GPU2: &str = "GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02";
    d.running
        .probe()
        .store
        .set_health(GPU2, crate::domain::inventory::Health::Unhealthy, "XID 79")
        .unwrap();
    let mut gpu = d.emulator.devices("nvidia.com/gpu").unwrap();
    within(
        "4 unhealthy",
        gpu.wait_for(|v| v.iter().filter(|x| !x.healthy).count() == 4),
    )
    .await
    .unwrap();
    let before = d.running.reloads.borrow().clone();
    replace(&file, &FOUR.replace("replicas: 4", "replicas: 8"));
    d.next_reload(&before).await;
    let list = within("16 replicas", gpu.wait_for(|v| v.len() == 16))
        .await
        .unwrap()
        .clone();
    for dev in &list {
        assert_eq!(dev.healthy, !dev.id.starts_with(GPU2), "{dev:?}");
    }
    d.stop().await.expect("clean stop");
}

const TWO: &str = "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n";

/// Wait until a reload has published a new plan (`applied` past `before`).
async fn next_applied(d: &Daemon, before: &ReloadStatus) -> ReloadStatus {
    let mut rx = d.running.reloads.clone();
    within(
        "applied reload",
        rx.wait_for(|s| s.applied > before.applied),
    )
    .await
    .expect("daemon alive")
    .clone()
}

/// What a chatty neighbour does: append to a log file in the config's directory, `writes`
/// times, spread over longer than the settle delay so no two writes could be merged into
/// one reload.
async fn write_log_next_to(dir: &Path, writes: usize) {
    use std::io::Write;
    let log = dir.join("agent.log");
    for i in 0..writes {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log");
        writeln!(f, "line {i}").expect("append");
        drop(f);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn writes_next_to_the_config_cause_no_reload() {
    let dir = temp_dir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, FOUR).unwrap();
    let d = start(dir, file.clone(), "mixed-a100").await;
    let before = d.running.reloads.borrow().clone();
    write_log_next_to(d.dir.path(), 30).await;
    // The barrier: inotify delivers events in order, so once the edit below has been
    // applied every log write before it has been seen (and must have been ignored).
    // An in-place edit (truncate + write), as `kubectl cp` or `echo >` does.
    std::fs::write(&file, TWO).unwrap();
    let after = next_applied(&d, &before).await;
    assert_eq!(
        (after.applied, after.unchanged, after.failed),
        (before.applied + 1, before.unchanged, before.failed),
        "only the edit reloads"
    );
    let mut gpu = d.emulator.devices("nvidia.com/gpu").unwrap();
    within("2 replicas served", gpu.wait_for(|v| v.len() == 4))
        .await
        .unwrap();
    d.stop().await.expect("clean stop");
}

#[tokio::test]
async fn writes_next_to_an_invalid_config_count_no_failed_reloads() {
    let dir = temp_dir();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, FOUR).unwrap();
    let d = start(dir, file.clone(), "mixed-a100").await;
    let before = d.running.reloads.borrow().clone();
    replace(&file, "version: v9\n");
    let broken = d.next_reload(&before).await;
    assert_eq!(broken.failed, before.failed + 1, "{broken:?}");
    write_log_next_to(d.dir.path(), 30).await;
    replace(&file, TWO);
    let after = next_applied(&d, &broken).await;
    assert_eq!(
        (after.failed, after.unchanged),
        (broken.failed, broken.unchanged),
        "the log writes were counted as reloads"
    );
    d.stop().await.expect("clean stop");
}
