//! Fleets as code end to end: a daemon on a sim node with `--config-dir`, its Node in the
//! API-server emulator, the kubelet emulator watching ListAndWatch. Relabelling the Node
//! switches the config live and the state labels and Events say so; bad choices keep the
//! last good config; the API down at start serves the recorded choice; a refused patch is
//! retried; a flapping label is one reload. (The built binary following its labels:
//! tests/cli_fleet.rs.)

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node};

use crate::domain::config::Overrides;
use crate::domain::fleet::{
    CONFIG_APPLIED_LABEL, CONFIG_LABEL, CONFIG_STATE_LABEL, MIG_CONFIG_LABEL, MIG_STATE_LABEL,
};
use crate::platform::kube::NodeApi;
use crate::platform::sim::SimBackend;
use crate::runtime::fleet::{FleetSettings, Selection};
use crate::runtime::node_labels::NodeLabelsSettings;
use crate::runtime::node_watch::NodeWatchSettings;
use crate::runtime::supervisor::{ReloadSettings, RunSettings};
use crate::runtime::triggers::TriggerSettings;
use crate::testkit::apiserver::{ApiServer, Fault, Verb};
use crate::testkit::fixtures::{self, time_sliced as shared, write_pool_configs as write_configs};
use crate::testkit::kubelet::KubeletEmulator;
use crate::testkit::manifests;
use crate::testkit::{
    Node as Daemon, PrivateFake, fake_driver_root, temp_dir, within, write_mig_minors,
};

const NODE: &str = "gpu-node-1";
const T: Duration = Duration::from_secs(20);

fn node(labels: &[(&str, &str)]) -> Node {
    manifests::node(NODE, labels)
}

/// The daemon with `--config-dir <dir>/configs`, `--state-dir <dir>/state`, on the sim
/// node `mixed-a100` (2 whole GPUs as `nvidia.com/gpu`).
async fn launch(api: &ApiServer, dir: tempfile::TempDir) -> Daemon {
    launch_with(api, dir, false).await
}

/// [`launch`], with `--labels-to-node` when `to_node`.
async fn launch_with(api: &ApiServer, dir: tempfile::TempDir, to_node: bool) -> Daemon {
    let configs = dir.path().join("configs");
    let state = dir.path().join("state");
    if !configs.exists() {
        write_configs(&configs);
    }
    let selection = Selection::new(
        &configs,
        CONFIG_LABEL,
        None,
        crate::platform::fleet_state::read(&state),
        Arc::new(|p: &Path| crate::platform::config_file::load(Some(p), &Overrides::default())),
    );
    let config = selection.load().expect("initial config");
    let plugin_dir = dir.path().join("dp");
    let emulator = KubeletEmulator::start(&plugin_dir).await.expect("emulator");
    let mut settings = RunSettings::new(config, &plugin_dir, dir.path().join("cdi"));
    let loader = selection.clone();
    settings.reload = ReloadSettings {
        load: Some(Arc::new(move || loader.load())),
        triggers: TriggerSettings {
            config_dir: Some(configs),
            ..TriggerSettings::default()
        },
    };
    let watch = NodeWatchSettings {
        api: NodeApi::new(api.client().expect("client"), NODE.into()),
        backoff_base: Duration::from_millis(20),
        backoff_cap: Duration::from_millis(200),
    };
    let mut fleet = FleetSettings::new(selection, Some(watch));
    fleet.state_dir = Some(state);
    settings.fleet = Some(fleet);
    if to_node {
        let mut labeller =
            NodeLabelsSettings::new(NodeApi::new(api.client().expect("client"), NODE.into()));
        labeller.backoff_base = Duration::from_millis(20);
        labeller.backoff_cap = Duration::from_millis(200);
        settings.node_labels = Some(labeller);
    }
    let backend = Arc::new(SimBackend::open("mixed-a100").expect("node"));
    Daemon::launch(dir, emulator, settings, backend)
        .await
        .expect("daemon started")
}

fn labels_of(api: &ApiServer) -> BTreeMap<String, String> {
    manifests::labels_of(api, NODE)
}

/// Wait until the Node carries every `(key, value)` of `want`.
async fn until_labels(api: &ApiServer, want: &[(&str, &str)]) {
    manifests::until_labels(api, NODE, want, T).await;
}

/// Wait until an Event with `reason` whose message contains `text` exists.
async fn until_event(api: &ApiServer, reason: &str, text: &str) -> Event {
    let found = |events: &[Event]| {
        events
            .iter()
            .find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.message.as_deref().is_some_and(|m| m.contains(text))
            })
            .cloned()
    };
    let ok = api.wait_for::<Event, _>(T, |e| found(e).is_some()).await;
    let events = api.list::<Event>();
    assert!(ok, "no {reason} event with {text:?}: {events:#?}");
    found(&events).expect("found")
}

async fn gpu_count(d: &Daemon, n: usize) {
    let mut gpu = d
        .emulator
        .devices("nvidia.com/gpu")
        .expect("nvidia.com/gpu");
    within(
        "the nvidia.com/gpu list",
        gpu.wait_for(|devices| devices.len() == n),
    )
    .await
    .expect("stream open");
}

/// Wait until the Node has none of `keys`.
async fn until_absent(api: &ApiServer, keys: &[&str]) {
    let ok = api
        .wait_for::<Node, _>(T, |nodes| {
            nodes.iter().any(|n| {
                let l = n.metadata.labels.clone().unwrap_or_default();
                keys.iter().all(|k| !l.contains_key(*k))
            })
        })
        .await;
    assert!(
        ok,
        "labels {keys:?} still on the Node: {:?}",
        labels_of(api)
    );
}

#[tokio::test]
async fn labels_to_node_sets_removes_owned_and_leaves_foreign_labels() {
    use crate::domain::fleet::OWNED_LABELS_ANNOTATION;
    let api = ApiServer::start().await.unwrap();
    let mut n = node(&[
        ("team", "ml"),
        // Written by GPU Feature Discovery, not by us: never touched.
        ("nvidia.com/gpu.product", "written-by-gfd"),
        // Written by an earlier run of ours (the annotation says so), no longer built.
        ("nvidia.com/gpu.stale", "1"),
    ]);
    n.metadata.annotations = Some(BTreeMap::from([(
        OWNED_LABELS_ANNOTATION.to_owned(),
        "nvidia.com/gpu.stale".to_owned(),
    )]));
    api.insert(&n).unwrap();
    let dir = temp_dir();
    let configs = dir.path().join("configs");
    std::fs::create_dir_all(&configs).unwrap();
    std::fs::write(configs.join("default"), shared(2)).unwrap();
    std::fs::write(
        configs.join("plain"),
        "version: v1\nflags: {migStrategy: none}\n",
    )
    .unwrap();
    let _d = launch_with(&api, dir, true).await;
    until_labels(
        &api,
        &[
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.replicas", "2"),
            ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
            ("nvidia.com/mig.strategy", "mixed"),
            ("nvidia.com/gpu.product", "written-by-gfd"),
            ("team", "ml"),
        ],
    )
    .await;
    until_absent(&api, &["nvidia.com/gpu.stale"]).await;
    let owned = |api: &ApiServer| {
        api.get::<Node>("", NODE)
            .and_then(|n| n.metadata.annotations)
            .and_then(|a| a.get(OWNED_LABELS_ANNOTATION).cloned())
            .unwrap_or_default()
    };
    let listed = owned(&api);
    assert!(listed.contains("nvidia.com/gpu.present"), "{listed}");
    assert!(listed.contains("nvidia.com/mig.strategy"), "{listed}");
    assert!(!listed.contains("nvidia.com/gpu.product"), "{listed}");

    // A config with no MIG strategy: the MIG labels leave the set and the Node.
    api.label_node(NODE, &[(CONFIG_LABEL, Some("plain"))])
        .unwrap();
    until_labels(
        &api,
        &[
            (CONFIG_APPLIED_LABEL, "plain"),
            ("nvidia.com/gpu.replicas", "1"),
        ],
    )
    .await;
    until_absent(&api, &["nvidia.com/mig.strategy"]).await;
    let labels = labels_of(&api);
    assert_eq!(
        labels.get("nvidia.com/gpu.product").map(String::as_str),
        Some("written-by-gfd")
    );
    assert_eq!(labels.get("team").map(String::as_str), Some("ml"));
    assert!(!owned(&api).contains("nvidia.com/mig.strategy"));
}

#[tokio::test]
async fn relabel_switches_the_config_live_and_reports_it() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node(&[("team", "ml")])).unwrap();
    let dir = temp_dir();
    let d = launch(&api, dir).await;
    gpu_count(&d, 4).await;
    until_labels(
        &api,
        &[
            (CONFIG_STATE_LABEL, "success"),
            (CONFIG_APPLIED_LABEL, "default"),
        ],
    )
    .await;
    let registered = |d: &Daemon| -> Vec<(String, u64)> {
        d.emulator
            .registrations()
            .borrow()
            .iter()
            .map(|(name, r)| (name.clone(), r.count))
            .collect()
    };
    let regs = registered(&d);

    // kubectl label node gpu-node-1 nvidia.com/device-plugin.config=inference
    let patches_before = api.count(Verb::Patch, "/api/v1/nodes/");
    let t0 = Instant::now();
    api.label_node(NODE, &[(CONFIG_LABEL, Some("inference"))])
        .unwrap();
    gpu_count(&d, 8).await;
    let to_frame = t0.elapsed();
    until_labels(
        &api,
        &[
            (CONFIG_STATE_LABEL, "success"),
            (CONFIG_APPLIED_LABEL, "inference"),
        ],
    )
    .await;
    let to_label = t0.elapsed();
    println!(
        "label change -> new ListAndWatch list: {:.0} ms; -> state label: {:.0} ms; node patches: {}",
        to_frame.as_secs_f64() * 1e3,
        to_label.as_secs_f64() * 1e3,
        api.count(Verb::Patch, "/api/v1/nodes/") - patches_before
    );
    // Only the changed resource re-served: no re-registration.
    assert_eq!(registered(&d), regs);
    let ev = until_event(&api, "ConfigApplied", "config inference applied").await;
    assert_eq!(ev.involved_object.name.as_deref(), Some(NODE));
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    // Other controllers' labels are never touched.
    assert_eq!(labels_of(&api).get("team").map(String::as_str), Some("ml"));
    let recorded = d.dir.path().join("state").join("config-applied");
    assert_eq!(
        std::fs::read_to_string(&recorded).unwrap().trim(),
        "inference"
    );

    // A MIG layout label on a backend that cannot repartition: failed, said so.
    api.label_node(NODE, &[(MIG_CONFIG_LABEL, Some("all-1g.10gb"))])
        .unwrap();
    until_labels(&api, &[(MIG_STATE_LABEL, "failed")]).await;
    until_event(&api, "MigLayoutFailed", "all-1g.10gb").await;
    // Label removed: the MIG state label we wrote goes too.
    api.label_node(NODE, &[(MIG_CONFIG_LABEL, None)]).unwrap();
    assert!(
        api.wait_for::<Node, _>(T, |n| n.iter().all(|n| !n
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(MIG_STATE_LABEL))))
            .await
    );
    d.stop().await.unwrap();
    api.stop().await;
}

#[tokio::test]
async fn bad_choices_keep_the_last_good_config_and_say_why() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node(&[(CONFIG_LABEL, "inference")])).unwrap();
    let dir = temp_dir();
    let configs = dir.path().join("configs");
    write_configs(&configs);
    std::fs::write(
        configs.join("broken"),
        "version: v1\nflags: {migStrategy: [\n",
    )
    .unwrap();
    let d = launch(&api, dir).await;
    gpu_count(&d, 8).await;
    until_labels(&api, &[(CONFIG_APPLIED_LABEL, "inference")]).await;

    // A key the directory does not have.
    api.label_node(NODE, &[(CONFIG_LABEL, Some("infrence"))])
        .unwrap();
    until_labels(
        &api,
        &[
            (CONFIG_STATE_LABEL, "failed"),
            (CONFIG_APPLIED_LABEL, "inference"),
        ],
    )
    .await;
    let ev = until_event(&api, "ConfigRefused", "no key \"infrence\"").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert!(ev.message.unwrap().contains(CONFIG_LABEL));

    // A key that does not parse.
    api.label_node(NODE, &[(CONFIG_LABEL, Some("broken"))])
        .unwrap();
    until_event(&api, "ConfigRefused", "broken").await;
    until_labels(
        &api,
        &[
            (CONFIG_STATE_LABEL, "failed"),
            (CONFIG_APPLIED_LABEL, "inference"),
        ],
    )
    .await;
    // The last good config kept serving throughout.
    gpu_count(&d, 8).await;

    // Fixing the key in the directory (a ConfigMap update) is enough: the reload chooses again.
    std::fs::write(d.dir.path().join("configs").join("broken"), shared(3)).unwrap();
    gpu_count(&d, 6).await;
    until_labels(
        &api,
        &[
            (CONFIG_STATE_LABEL, "success"),
            (CONFIG_APPLIED_LABEL, "broken"),
        ],
    )
    .await;
    d.stop().await.unwrap();
    api.stop().await;
}

#[tokio::test]
async fn api_down_at_start_serves_the_recorded_choice_then_catches_up() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node(&[(CONFIG_LABEL, "training")])).unwrap();
    let dir = temp_dir();
    crate::platform::fleet_state::write(&dir.path().join("state"), "inference").unwrap();
    api.go_down();
    let d = launch(&api, dir).await;
    // The pool's config from before the restart, not the default.
    gpu_count(&d, 8).await;
    api.come_up().await.unwrap();
    gpu_count(&d, 2).await;
    until_labels(
        &api,
        &[
            (CONFIG_STATE_LABEL, "success"),
            (CONFIG_APPLIED_LABEL, "training"),
        ],
    )
    .await;
    d.stop().await.unwrap();
    api.stop().await;
}

#[tokio::test]
async fn refused_patches_are_retried_with_backoff() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node(&[])).unwrap();
    api.inject(Fault::status(Verb::Patch, "/api/v1/nodes/", 403).times(2));
    api.inject(Fault::status(Verb::Create, "/events", 500).times(1));
    let d = launch(&api, temp_dir()).await;
    until_labels(&api, &[(CONFIG_STATE_LABEL, "success")]).await;
    until_event(&api, "ConfigApplied", "default").await;
    let refused = api
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::Patch && r.code == 403)
        .count();
    assert_eq!(refused, 2);
    assert!(api.count(Verb::Patch, "/api/v1/nodes/") >= 3);
    d.stop().await.unwrap();
    api.stop().await;
}

#[tokio::test]
async fn a_flapping_label_is_one_reload() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node(&[])).unwrap();
    let d = launch(&api, temp_dir()).await;
    until_labels(&api, &[(CONFIG_APPLIED_LABEL, "default")]).await;
    let before = d.running.reloads.borrow().clone();
    for i in 0..20 {
        let v = if i % 2 == 0 { "training" } else { "inference" };
        api.label_node(NODE, &[(CONFIG_LABEL, Some(v))]).unwrap();
    }
    gpu_count(&d, 8).await;
    until_labels(&api, &[(CONFIG_APPLIED_LABEL, "inference")]).await;
    let after = d.running.reloads.borrow().clone();
    assert_eq!(after.applied - before.applied, 1, "{after:?}");
    assert_eq!(after.failed, before.failed);
    d.stop().await.unwrap();
    api.stop().await;
}

#[tokio::test]
async fn a_key_for_other_hardware_skips_its_entries_and_succeeds() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node(&[])).unwrap();
    let dir = temp_dir();
    let configs = dir.path().join("configs");
    write_configs(&configs);
    // Written for a 40 GB A100 pool: 4g.20gb is no profile of this node's 80 GB GPUs.
    std::fs::write(
        configs.join("a100-40gb"),
        "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 3}\n    - {name: nvidia.com/mig-4g.20gb, replicas: 2}\n",
    )
    .unwrap();
    let d = launch(&api, dir).await;
    gpu_count(&d, 4).await;
    api.label_node(NODE, &[(CONFIG_LABEL, Some("a100-40gb"))])
        .unwrap();
    // The entry this node can serve is served; the other one is skipped, not an error.
    gpu_count(&d, 6).await;
    until_labels(
        &api,
        &[
            (CONFIG_STATE_LABEL, "success"),
            (CONFIG_APPLIED_LABEL, "a100-40gb"),
        ],
    )
    .await;
    until_event(&api, "ConfigApplied", "config a100-40gb applied").await;
    assert!(
        !d.emulator
            .registrations()
            .borrow()
            .contains_key("nvidia.com/mig-4g.20gb")
    );
    d.stop().await.unwrap();
    api.stop().await;
}

/// A ConfigMap volume as the kubelet lays it out: keys are links through `..data` to a
/// timestamped directory; an update writes a new directory and renames a new `..data` link
/// over the old one, then removes the old directory.
fn configmap_version(dir: &Path, version: &str, files: &[(&str, String)]) {
    let ts = dir.join(format!("..{version}"));
    std::fs::create_dir_all(&ts).unwrap();
    for (k, v) in files {
        std::fs::write(ts.join(k), v).unwrap();
        let link = dir.join(k);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(k), &link).unwrap();
        }
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

#[tokio::test]
async fn the_configmap_directory_swapped_mid_read_serves_the_new_content() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node(&[(CONFIG_LABEL, "inference")])).unwrap();
    let dir = temp_dir();
    let configs = dir.path().join("configs");
    std::fs::create_dir_all(&configs).unwrap();
    configmap_version(
        &configs,
        "2026_12_02_07_00_00.1",
        &[("default", shared(2)), ("inference", shared(4))],
    );
    let d = launch(&api, dir).await;
    gpu_count(&d, 8).await;
    until_labels(&api, &[(CONFIG_APPLIED_LABEL, "inference")]).await;
    // Several swaps in a row, each removing the directory the last one pointed at, so a
    // reload that listed one version may open its files after the next swap.
    for (i, replicas) in [3u32, 5, 3].into_iter().enumerate() {
        let version = format!("2026_12_02_07_00_0{}.{i}", i + 1);
        configmap_version(
            &configs,
            &version,
            &[("default", shared(2)), ("inference", shared(replicas))],
        );
        let old = if i == 0 {
            "..2026_12_02_07_00_00.1".to_owned()
        } else {
            format!("..2026_12_02_07_00_0{i}.{}", i - 1)
        };
        std::fs::remove_dir_all(configs.join(old)).unwrap();
    }
    // The last version is what serves, and no failure was reported on the way.
    gpu_count(&d, 6).await;
    until_labels(
        &api,
        &[
            (CONFIG_STATE_LABEL, "success"),
            (CONFIG_APPLIED_LABEL, "inference"),
        ],
    )
    .await;
    assert!(
        api.list::<Event>()
            .iter()
            .all(|e| e.reason.as_deref() != Some("ConfigRefused")),
        "{:#?}",
        api.list::<Event>()
    );
    d.stop().await.unwrap();
    api.stop().await;
}

/// `current` is the layout the GPUs have; `gpu0-small` repartitions GPU 0.
const MIG_LAYOUTS: &str = "version: v1\nmig-configs:\n  current:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 2}\n  gpu0-small:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.5gb\": 7}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_layout_label_naming_no_layout_fails_and_keeps_the_layout_then_a_good_one_applies() {
    use crate::platform::nvml::NvmlBackend;
    use crate::runtime::miglayout::MigLayoutSettings;
    let api = ApiServer::start().await.unwrap();
    api.insert(&node(&[])).unwrap();
    let dir = temp_dir();
    let lib = PrivateFake::new(dir.path());
    let lib_path = lib.path.clone();
    lib.set_node(fixtures::MIG_A100_40GB);
    let proc_root = write_mig_minors(&dir.path().join("proc"), &[0, 1]);
    let layouts = dir.path().join("layouts.yaml");
    std::fs::write(&layouts, MIG_LAYOUTS).unwrap();
    let driver = fake_driver_root(dir.path(), "570.124.06");
    let configs = dir.path().join("configs");
    std::fs::create_dir_all(&configs).unwrap();
    std::fs::write(
        configs.join("default"),
        format!(
            "version: v1\nflags:\n  migStrategy: mixed\n  plugin: {{containerDriverRoot: {}}}\n  migLayouts: {{file: {}, layout: current}}\n",
            driver.display(),
            layouts.display()
        ),
    )
    .unwrap();
    let selection = Selection::new(
        &configs,
        CONFIG_LABEL,
        None,
        None,
        Arc::new(|p: &Path| crate::platform::config_file::load(Some(p), &Overrides::default())),
    );
    let plugin_dir = dir.path().join("dp");
    let emulator = KubeletEmulator::start(&plugin_dir).await.expect("emulator");
    let mut settings = RunSettings::new(
        selection.load().expect("initial config"),
        &plugin_dir,
        dir.path().join("cdi"),
    );
    let loader = selection.clone();
    settings.reload = ReloadSettings {
        load: Some(Arc::new(move || loader.load())),
        triggers: TriggerSettings {
            config_dir: Some(configs),
            ..TriggerSettings::default()
        },
    };
    settings.mig_layouts = Some(MigLayoutSettings {
        nvml_lib: Some(lib_path.clone()),
        interval: Duration::from_millis(100),
    });
    let watch = NodeWatchSettings {
        api: NodeApi::new(api.client().expect("client"), NODE.into()),
        backoff_base: Duration::from_millis(20),
        backoff_cap: Duration::from_millis(200),
    };
    settings.fleet = Some(FleetSettings::new(selection, Some(watch)));
    let backend = Arc::new(
        NvmlBackend::new(Some(lib_path.clone()), proc_root).with_sys_root(dir.path().join("sys")),
    );
    let d = Daemon::launch(dir, emulator, settings, backend)
        .await
        .expect("daemon started");
    let devices = |resource: &str, n: usize| {
        let mut rx = d.running.probe().store.subscribe();
        let resource = resource.to_owned();
        async move {
            within(
                &format!("{n} x {resource}"),
                rx.wait_for(|s| s.plan.resource(&resource).map_or(0, |r| r.devices.len()) == n),
            )
            .await
            .expect("store alive");
        }
    };
    devices("nvidia.com/mig-3g.20gb", 2).await;
    until_labels(&api, &[(CONFIG_STATE_LABEL, "success")]).await;

    // kubectl label node gpu-node-1 nvidia.com/mig.config=no-such-layout
    api.label_node(NODE, &[(MIG_CONFIG_LABEL, Some("no-such-layout"))])
        .unwrap();
    until_labels(&api, &[(MIG_STATE_LABEL, "failed")]).await;
    let ev = until_event(&api, "MigLayoutFailed", "no-such-layout").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    // The layout the GPUs had is kept, and the config stays applied.
    devices("nvidia.com/mig-3g.20gb", 2).await;
    until_labels(&api, &[(CONFIG_STATE_LABEL, "success")]).await;

    // A layout the file has, on an idle GPU: pending while it is applied, then success, as
    // a watcher of the Node (mig-manager's tools) sees the state label change.
    let nodes: kube::Api<Node> = kube::Api::all(api.client().expect("client"));
    let rv = api
        .get::<Node>("", NODE)
        .and_then(|n| n.metadata.resource_version)
        .expect("resourceVersion");
    let params = kube::api::WatchParams::default().fields(&format!("metadata.name={NODE}"));
    let mut stream = Box::pin(nodes.watch(&params, &rv).await.expect("watch"));
    api.label_node(NODE, &[(MIG_CONFIG_LABEL, Some("gpu0-small"))])
        .unwrap();
    let states = within("mig.config.state success", async {
        use tokio_stream::StreamExt as _;
        // From the state the bad layout left.
        let mut seen = vec!["failed".to_owned()];
        while let Some(event) = stream.next().await {
            if let Ok(kube::api::WatchEvent::Modified(n)) = event {
                let state = n
                    .metadata
                    .labels
                    .unwrap_or_default()
                    .get(MIG_STATE_LABEL)
                    .cloned();
                if let Some(state) = state.filter(|s| seen.last() != Some(s)) {
                    seen.push(state);
                }
                if seen.last().map(String::as_str) == Some("success") {
                    break;
                }
            }
        }
        seen
    })
    .await;
    assert_eq!(states, ["failed", "pending", "success"], "{states:?}");
    devices("nvidia.com/mig-1g.5gb", 7).await;
    until_event(&api, "MigLayoutApplied", "gpu0-small").await;
    d.stop().await.unwrap();
    drop(lib);
    api.stop().await;
}

#[tokio::test]
async fn labels_to_node_survives_refused_calls() {
    let api = ApiServer::start().await.unwrap();
    api.insert(&node(&[])).unwrap();
    // Both Node writers (state labels, GFD labels) meet these; neither gives up.
    api.inject(Fault::status(Verb::Patch, "/api/v1/nodes/", 403).times(3));
    api.inject(Fault::status(Verb::Get, "/api/v1/nodes/", 500).times(1));
    let d = launch_with(&api, temp_dir(), true).await;
    gpu_count(&d, 4).await;
    until_labels(
        &api,
        &[
            ("nvidia.com/gpu.present", "true"),
            (CONFIG_STATE_LABEL, "success"),
        ],
    )
    .await;
    let refused = api
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::Patch && r.code == 403)
        .count();
    assert_eq!(refused, 3);
    d.stop().await.unwrap();
    api.stop().await;
}
