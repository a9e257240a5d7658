//! The daemon applies `flags.migLayouts` live, through the real NVML path against the fake
//! driver (crates/fake-nvml) and the kubelet emulator: an idle GPU is repartitioned and its
//! new MIG resources advertised without a restart while another GPU keeps serving; a GPU with
//! an allocated slice stays pending until the emulator releases it; a failing create rolls
//! the GPU back; a GPU left to DRA claims (`flags.dra.dynamicMig`) is never repartitioned.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::platform::nvml::NvmlBackend;
use crate::runtime::ledger::LedgerSettings;
use crate::runtime::miglayout::MigLayoutSettings;
use crate::runtime::supervisor::{ReloadSettings, RunSettings};
use crate::runtime::triggers::TriggerSettings;
use crate::testkit::fixtures;
use crate::testkit::kubelet::{KubeletEmulator, PodRef};
use crate::testkit::{
    Node, PrivateFake, STEP, fake_driver_root, temp_dir, wait_until, within, write_mig_minors,
};

/// The GPUs of [`fixtures::MIG_A100_40GB`].
const GPU0: &str = "GPU-40400000-0000-4000-8000-0000000000a0";
const GPU1: &str = "GPU-40400000-0000-4000-8000-0000000000a1";

const LAYOUTS: &str = "version: v1\nmig-configs:\n  gpu0-small:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.5gb\": 7}\n  all-small:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.5gb\": 7}\n  gpu0-balanced:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.5gb\": 2, \"2g.10gb\": 1, \"3g.20gb\": 1}\n";

struct Daemon {
    h: Node,
    config: PathBuf,
    _fake: PrivateFake,
    lib_path: PathBuf,
}

fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn start(config_text: &str, mig_state: Option<&str>) -> Daemon {
    let dir = temp_dir();
    let fake = PrivateFake::new(dir.path());
    let lib_path = fake.path.clone();
    fake.set_node(fixtures::MIG_A100_40GB);
    if let Some(state) = mig_state {
        fake.set_mig_state(state);
    }
    let proc_root = write_mig_minors(&dir.path().join("proc"), &[0, 1]);
    std::fs::write(dir.path().join("layouts.yaml"), LAYOUTS).unwrap();
    let config_file = dir.path().join("config.yaml");
    let driver = fake_driver_root(dir.path(), "570.124.06");
    std::fs::write(
        &config_file,
        config_text.replace("DRIVER", &driver.display().to_string()),
    )
    .unwrap();
    let plugin_dir = dir.path().join("dp");
    let emulator = KubeletEmulator::start(&plugin_dir).await.expect("emulator");
    let pod_resources = dir.path().join("pod-resources.sock");
    emulator
        .serve_pod_resources(&pod_resources)
        .expect("pod-resources");
    let load = fixtures::file_loader(&config_file);
    let mut settings =
        RunSettings::new(load().expect("config"), &plugin_dir, dir.path().join("cdi"));
    settings.reload = ReloadSettings {
        load: Some(load),
        triggers: TriggerSettings {
            config_file: Some(config_file.clone()),
            ..TriggerSettings::default()
        },
    };
    settings.ledger = Some(LedgerSettings {
        socket: pod_resources,
        interval: Duration::from_millis(50),
    });
    settings.mig_layouts = Some(MigLayoutSettings {
        nvml_lib: Some(lib_path.clone()),
        interval: Duration::from_millis(100),
    });
    let backend = Arc::new(
        NvmlBackend::new(Some(lib_path.clone()), proc_root).with_sys_root(dir.path().join("sys")),
    );
    let h = Node::launch(dir, emulator, settings, backend)
        .await
        .expect("daemon started");
    Daemon {
        h,
        config: config_file,
        _fake: fake,
        lib_path,
    }
}

impl Daemon {
    /// Wait until the served plan has `count` devices of `resource` (0: no such resource).
    async fn wait_devices(&self, resource: &str, count: usize) {
        let mut rx = self.h.running.probe().store.subscribe();
        within(
            &format!("{count} x {resource}"),
            rx.wait_for(|s| s.plan.resource(resource).map_or(0, |r| r.devices.len()) == count),
        )
        .await
        .expect("store alive");
    }

    /// Wait until the emulator's ListAndWatch list of `resource` has `count` healthy devices.
    async fn wait_listed(&self, resource: &str, count: usize) {
        let what = format!("{count} x {resource} listed");
        let mut rx = wait_until(STEP, || async { self.h.emulator.devices(resource) })
            .await
            .unwrap_or_else(|| panic!("timed out: {what}"));
        within(
            &what,
            rx.wait_for(|d| d.iter().filter(|d| d.healthy).count() == count),
        )
        .await
        .expect("emulator alive");
    }

    /// The config with `flags.migLayouts` naming `layout` of the test's layout file.
    fn with_layout(&self, layout: &str) -> String {
        let dir = self.config.parent().unwrap();
        format!(
            "{MIXED}  migLayouts: {{file: {}, layout: {layout}}}\n",
            dir.join("layouts.yaml").display()
        )
        .replace("DRIVER", &dir.join("driver-root").display().to_string())
    }

    fn pending(&self, gpu: &str) -> Option<String> {
        let text = self.h.running.probe().metrics.encode_prometheus();
        let prefix = format!("gpu_slicer_mig_layout_pending{{gpu=\"{gpu}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
    }
}

const MIXED: &str =
    "version: v1\nflags:\n  migStrategy: mixed\n  plugin: {containerDriverRoot: DRIVER}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_layout_on_idle_gpu_is_advertised_live_while_the_other_gpu_keeps_serving() {
    let d = start(MIXED, None).await;
    d.wait_listed("nvidia.com/mig-3g.20gb", 2).await;
    // A pod on GPU 1 (the only 2g.10gb devices).
    let pod = PodRef {
        namespace: "default".into(),
        name: "keep".into(),
        container: "c".into(),
    };
    let held =
        d.h.emulator
            .allocate_for(pod, "nvidia.com/mig-2g.10gb", 1)
            .await
            .expect("allocate");
    let registrations = d.h.emulator.registrations().borrow().clone();
    write(&d.config, &d.with_layout("gpu0-small"));
    d.wait_devices("nvidia.com/mig-1g.5gb", 7).await;
    d.wait_devices("nvidia.com/mig-3g.20gb", 0).await;
    d.wait_listed("nvidia.com/mig-1g.5gb", 7).await;
    // GPU 1 untouched: its slices still served, the held one among them, healthy.
    d.wait_listed("nvidia.com/mig-2g.10gb", 3).await;
    let listed =
        d.h.emulator
            .devices("nvidia.com/mig-2g.10gb")
            .unwrap()
            .borrow()
            .clone();
    assert!(
        listed
            .iter()
            .any(|x| x.id == held.device_ids[0] && x.healthy),
        "{listed:?}"
    );
    // The 2g.10gb plugin did not re-register (no restart of what was not changed).
    let now = d.h.emulator.registrations().borrow().clone();
    assert_eq!(
        now.get("nvidia.com/mig-2g.10gb").map(|r| r.count),
        registrations.get("nvidia.com/mig-2g.10gb").map(|r| r.count)
    );
    wait_until(STEP, || async {
        (d.pending(GPU0).as_deref() == Some("0")).then_some(())
    })
    .await
    .expect("gpu 0 not pending");
    // The CDI spec names the new devices.
    let spec = d.h.cdi_spec();
    let inv = d.h.running.probe().store.current().inventory.clone();
    let gpu0 = inv.gpu(GPU0).unwrap();
    assert_eq!(gpu0.mig_devices.len(), 7);
    assert!(
        gpu0.mig_devices.iter().all(|m| spec.contains(&m.uuid)),
        "{spec}"
    );
    let _ = &d.lib_path;
    d.h.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_gpu_stays_pending_until_released_then_converges() {
    let d = start(MIXED, None).await;
    let pod = PodRef {
        namespace: "default".into(),
        name: "busy".into(),
        container: "c".into(),
    };
    d.h.emulator
        .allocate_for(pod, "nvidia.com/mig-2g.10gb", 1)
        .await
        .expect("allocate");
    write(&d.config, &d.with_layout("all-small"));
    d.wait_devices("nvidia.com/mig-1g.5gb", 7).await;
    wait_until(STEP, || async {
        (d.pending(GPU1).as_deref() == Some("1")).then_some(())
    })
    .await
    .expect("gpu 1 pending");
    // Still pending a while later: the held slice keeps GPU 1 as it is.
    assert_eq!(
        d.h.running
            .probe()
            .store
            .current()
            .plan
            .resource("nvidia.com/mig-2g.10gb")
            .map(|r| r.devices.len()),
        Some(3)
    );
    assert_eq!(d.pending(GPU1).as_deref(), Some("1"));
    d.h.emulator.release("default", "busy");
    d.wait_devices("nvidia.com/mig-1g.5gb", 14).await;
    d.wait_devices("nvidia.com/mig-2g.10gb", 0).await;
    wait_until(STEP, || async {
        (d.pending(GPU1).as_deref() == Some("0")).then_some(())
    })
    .await
    .expect("gpu 1 converged");
    d.h.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_create_rolls_the_gpu_back_and_keeps_it_pending() {
    let state = format!(r#"{{"failCreate": {{"{GPU0}": ["1g.5gb"]}}}}"#);
    let d = start(MIXED, Some(&state)).await;
    write(&d.config, &d.with_layout("gpu0-balanced"));
    wait_until(STEP, || async {
        (d.pending(GPU0).as_deref() == Some("1")).then_some(())
    })
    .await
    .expect("gpu 0 pending");
    // Back to two 3g.20gb, both advertised healthy; no 1g.5gb device was ever planned.
    d.wait_devices("nvidia.com/mig-3g.20gb", 2).await;
    d.wait_listed("nvidia.com/mig-3g.20gb", 2).await;
    assert!(
        d.h.running
            .probe()
            .store
            .current()
            .plan
            .resource("nvidia.com/mig-1g.5gb")
            .is_none()
    );
    d.h.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_whose_mig_devices_dra_claims_make_is_left_alone() {
    let d = start(MIXED, None).await;
    d.wait_listed("nvidia.com/mig-2g.10gb", 3).await;
    let config = format!("{}  dra: {{dynamicMig: [1]}}\n", d.with_layout("all-small"));
    write(&d.config, &config);
    // GPU 0 takes the layout; GPU 1, made on demand, is pending in the same round ...
    d.wait_devices("nvidia.com/mig-1g.5gb", 7).await;
    wait_until(STEP, || async {
        (d.pending(GPU0).as_deref() == Some("0") && d.pending(GPU1).as_deref() == Some("1"))
            .then_some(())
    })
    .await
    .expect("gpu 0 converged, gpu 1 pending");
    // ... and keeps its instances: the round that set its metric has passed over it.
    let now = d.h.running.probe().store.current();
    assert_eq!(
        now.plan
            .resource("nvidia.com/mig-2g.10gb")
            .map(|r| r.devices.len()),
        Some(3)
    );
    assert_eq!(
        now.inventory.gpu(GPU1).map(|g| g.mig_devices.len()),
        Some(3),
        "{:?}",
        now.inventory.gpu(GPU1)
    );
    d.h.stop().await.expect("clean stop");
}
