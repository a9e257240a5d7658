//! `gpu-slicer emulate --kubelet` (hidden; test support): the kubelet's device-plugin side
//! ([`KubeletEmulator`]) as a process, so that a script can run real agents
//! (`gpu-slicer run`) with pods on their shares without a kubelet: the fleet check of
//! `hack/advise-fleet.sh`.
//!
//! It serves `Registration` on `<dir>/kubelet.sock` (the agent's `--device-plugin-dir`),
//! PodResources v1 on `<dir>/pod-resources.sock` (the agent's `--pod-resources-socket`) and
//! keeps `<dir>/kubelet_internal_checkpoint`, prints `ready <dir>`, then answers one line
//! per command, `ok …` or `error <why>`:
//!
//! - `allocate <resource> <namespace> <pod> <container> <count>`: wait (bounded) until the
//!   resource offers `count` free healthy devices, then GetPreferredAllocation and Allocate
//!   as the kubelet does → `ok <pod uid> <device id>…` (the UID is what the pod's
//!   `<proc-root>/<pid>/cgroup` must name);
//! - `release <namespace> <pod>`: the pod is gone → `ok`;
//! - `resources`: what is registered and streamed → `ok <resource>=<devices>…`.

use std::path::Path;

use crate::testkit::kubelet::{KubeletEmulator, PodRef, pod_uid};
use crate::testkit::node::wait_until;

use super::{EmulateError, STEP, answer, next_line};

/// Why one command got `error …` (the emulator goes on serving).
#[derive(Debug, thiserror::Error)]
pub(super) enum CommandError {
    /// `allocate`'s count is not a number.
    #[error("count `{0}` is not a number")]
    Count(String),
    /// A line that is no command.
    #[error("unknown command `{0}`")]
    Unknown(String),
    /// The resource did not offer enough free devices within the wait.
    #[error("resource {resource}: {count} devices wanted, {free} free after {secs}s")]
    NotFree {
        resource: String,
        count: usize,
        free: usize,
        secs: u64,
    },
    /// The agent refused the allocation (or the call failed).
    #[error(transparent)]
    Allocate(#[from] crate::testkit::kubelet::EmulatorError),
}

/// File name of the PodResources socket in the emulator's folder.
const POD_RESOURCES_SOCKET: &str = "pod-resources.sock";

/// Serve the kubelet emulator in `dir` and answer commands until `quit` or end of input.
pub(super) async fn serve(dir: &Path, out: &mut impl std::io::Write) -> Result<(), EmulateError> {
    let kubelet = KubeletEmulator::start(dir).await?;
    kubelet.serve_pod_resources(&dir.join(POD_RESOURCES_SOCKET))?;
    answer(out, &format!("ready {}", dir.display()))?;
    while let Some(line) = next_line().await? {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"quit") {
            break;
        }
        let reply = match command(&kubelet, &words).await {
            Ok(text) if text.is_empty() => "ok".to_string(),
            Ok(text) => format!("ok {text}"),
            Err(why) => format!("error {}", why.to_string().replace('\n', " ")),
        };
        answer(out, &reply)?;
    }
    kubelet.shutdown().await;
    Ok(())
}

async fn command(kubelet: &KubeletEmulator, words: &[&str]) -> Result<String, CommandError> {
    match words {
        ["allocate", resource, namespace, pod, container, count] => {
            let count: usize = count
                .parse()
                .map_err(|_| CommandError::Count((*count).to_string()))?;
            let pod = PodRef {
                namespace: (*namespace).into(),
                name: (*pod).into(),
                container: (*container).into(),
            };
            allocate(kubelet, pod, resource, count).await
        }
        ["release", namespace, pod] => {
            kubelet.release(namespace, pod);
            Ok(String::new())
        }
        ["resources"] => {
            let registered = kubelet.registrations().borrow().clone();
            let mut out = Vec::new();
            for resource in registered.keys() {
                let n = kubelet.devices(resource).map_or(0, |d| d.borrow().len());
                out.push(format!("{resource}={n}"));
            }
            Ok(out.join(" "))
        }
        _ => Err(CommandError::Unknown(words.join(" "))),
    }
}

/// Allocate once the resource is registered with enough free devices: after a config
/// reload the agent re-registers, and the script asks as soon as it wrote the config.
async fn allocate(
    kubelet: &KubeletEmulator,
    pod: PodRef,
    resource: &str,
    count: usize,
) -> Result<String, CommandError> {
    let uid = pod_uid(&pod);
    let free = |k: &KubeletEmulator| {
        let held: usize = k
            .allocations()
            .iter()
            .filter(|a| a.resource == resource)
            .map(|a| a.device_ids.len())
            .sum();
        let offered = k
            .devices(resource)
            .map_or(0, |d| d.borrow().iter().filter(|d| d.healthy).count());
        offered.saturating_sub(held)
    };
    let ready = wait_until(STEP, || async {
        (kubelet
            .registrations()
            .borrow()
            .get(resource)
            .is_some_and(|r| r.open)
            && free(kubelet) >= count)
            .then_some(())
    })
    .await;
    if ready.is_none() {
        return Err(CommandError::NotFree {
            resource: resource.to_string(),
            count,
            free: free(kubelet),
            secs: STEP.as_secs(),
        });
    }
    let allocation = kubelet.allocate_for(pod, resource, count).await?;
    Ok(std::iter::once(uid)
        .chain(allocation.device_ids)
        .collect::<Vec<_>>()
        .join(" "))
}
