//! Fifty agents' Node watchers against one API-server emulator: requests per label change
//! (none: each change arrives on the one open watch) and per agent after an API restart that
//! also compacted the history (a few GET/WATCH each, spread by jittered backoff).

use std::time::Duration;

use tokio::sync::watch;

use crate::platform::kube::NodeApi;
use crate::runtime::node_watch::{self, NodeView, NodeWatchSettings};
use crate::runtime::{Context, Handle};
use crate::testkit::apiserver::{ApiServer, Verb};
use crate::testkit::manifests::node;
use crate::testkit::wait_until;

const AGENTS: usize = 50;
const T: Duration = Duration::from_secs(30);

async fn until(rx: &mut watch::Receiver<Option<NodeView>>, want: impl Fn(&NodeView) -> bool) {
    tokio::time::timeout(T, rx.wait_for(|v| v.as_ref().is_some_and(&want)))
        .await
        .expect("in time")
        .expect("open");
}

fn label(v: &NodeView, value: &str) -> bool {
    v.labels
        .get("nvidia.com/device-plugin.config")
        .map(String::as_str)
        == Some(value)
}

#[tokio::test]
async fn fifty_agents_one_watch_each_and_reconnect_after_restart() {
    let api = ApiServer::start().await.unwrap();
    let ctx = Context::new(crate::state::Store::new(Default::default()));
    let mut agents: Vec<(Handle<watch::Receiver<Option<NodeView>>>, String)> = Vec::new();
    for i in 0..AGENTS {
        let name = format!("gpu-{i:02}");
        api.insert(&node(&name, &[])).unwrap();
        let settings = NodeWatchSettings {
            api: NodeApi::new(api.client().unwrap(), name.clone()),
            backoff_base: Duration::from_millis(20),
            backoff_cap: Duration::from_millis(500),
        };
        agents.push((node_watch::spawn(settings, &ctx), name));
    }
    for (h, _) in &agents {
        until(&mut h.get().clone(), |_| true).await;
    }
    let watches_open = || api.count(Verb::Watch, "/api/v1/nodes");
    assert!(
        wait_until(T, || async { (watches_open() >= AGENTS).then_some(()) })
            .await
            .is_some()
    );
    assert_eq!(
        api.count(Verb::Get, "/api/v1/nodes/"),
        AGENTS,
        "one GET per agent"
    );
    assert_eq!(
        api.count(Verb::List, "/api/v1/nodes"),
        0,
        "never a LIST of all nodes"
    );
    assert!(
        api.requests()
            .iter()
            .filter(|r| r.verb == Verb::Watch)
            .all(|r| r.query.contains("fieldSelector=metadata.name"))
    );

    // A label change on every node: delivered on the open watches, no new requests.
    let before = api.requests().len();
    for (_, name) in &agents {
        api.label_node(
            name,
            &[("nvidia.com/device-plugin.config", Some("inference"))],
        )
        .unwrap();
    }
    for (h, _) in &agents {
        until(&mut h.get().clone(), |v| label(v, "inference")).await;
    }
    assert_eq!(
        api.requests().len() - before,
        0,
        "requests per label change"
    );

    // API restart with a compacted history: every agent reconnects (410 -> one GET).
    api.go_down();
    api.compact();
    api.come_up().await.unwrap();
    for (_, name) in &agents {
        api.label_node(
            name,
            &[("nvidia.com/device-plugin.config", Some("training"))],
        )
        .unwrap();
    }
    for (h, _) in &agents {
        until(&mut h.get().clone(), |v| label(v, "training")).await;
    }
    // An agent that read "training" in a re-read (after its watch was refused as too old)
    // has seen the label before it opens its new watch: wait until every agent's latest
    // request is a watch of its Node again before counting.
    let names = |r: &crate::testkit::apiserver::RequestRecord, name: &str| {
        r.path.ends_with(&format!("/nodes/{name}"))
            || r.query.contains(&format!("metadata.name%3D{name}&"))
    };
    let after = wait_until(T, || async {
        let after: Vec<_> = api.requests().into_iter().skip(before).collect();
        agents
            .iter()
            .all(|(_, name)| {
                after
                    .iter()
                    .rev()
                    .find(|r| names(r, name))
                    .is_some_and(|r| r.verb == Verb::Watch)
            })
            .then_some(after)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "not every agent watches its Node again: {:?}",
            api.requests().into_iter().skip(before).collect::<Vec<_>>()
        )
    });
    let per_agent = after.len() as f64 / AGENTS as f64;
    println!(
        "requests after restart: {} ({per_agent:.1} per agent)",
        after.len()
    );
    assert!(
        after
            .iter()
            .all(|r| matches!(r.verb, Verb::Get | Verb::Watch))
    );
    assert!(
        after.len() >= 2 * AGENTS,
        "each agent re-read and re-watched: {}",
        after.len()
    );
    ctx.token.cancel();
    ctx.tracker.close();
    ctx.tracker.wait().await;
    api.stop().await;
}
