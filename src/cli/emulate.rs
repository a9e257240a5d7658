//! `gpu-slicer emulate` (hidden; test support): the in-process Kubernetes API server and the
//! kubelet's DRA side ([`crate::testkit`]), driven one line at a time from stdin, so that an
//! end-to-end script can run the real daemon (`run --dra`) against them and hand what it
//! prepares to a real container runtime (`hack/e2e-podman.sh`).
//!
//! At start it binds the API-server emulator on 127.0.0.1, writes `<dir>/kubeconfig` for the
//! daemon, stores the Node `--node-name` and prints `ready <url>`. Then one command per line
//! and one answer line each, `ok …` or `error <why>` (a bad command is an answer, never an
//! exit; end of input or `quit` stops):
//!
//! - `claim <file>`: store the ResourceClaim of a YAML or JSON file as it is, `status.allocation`
//!   included (what the scheduler leaves) → `ok <uid>`;
//! - `prepare <namespace> <name>`: register the driver through the plugin-watcher directory
//!   `<dir>/registry` as the kubelet does, then NodePrepareResources for the claim →
//!   `ok <cdi device id>…`, or `error <the claim's error>`;
//! - `unprepare <namespace> <name>`: NodeUnprepareResources → `ok`;
//! - `slices`: wait until the driver's pool for the node is published →
//!   `ok <device>=<uuid>…`;
//! - `claim-status <namespace> <name>` → `ok <status.devices as one line of JSON>`.
//!
//! With `--kubelet` it is the kubelet's device-plugin side instead (see [`kubelet`]).
//!
//! Each wait is bounded ([`STEP`]). Only for tests: nothing here is hardened for input
//! other than a test script's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

use crate::domain::dra::DEFAULT_DRIVER_NAME;
use crate::testkit::apiserver::{ApiServer, ApiServerError};
use crate::testkit::kubelet::EmulatorError;
use crate::testkit::kubelet::dra::{KubeletClaim, register};
use crate::testkit::node::wait_until;

mod kubelet;

/// Longest wait of one command.
const STEP: Duration = Duration::from_secs(30);

/// Arguments of `gpu-slicer emulate`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct EmulateArgs {
    /// Folder for the kubeconfig and the plugin-watcher directory (`registry/`).
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// The Node to store (the driver's pool).
    #[arg(long, default_value = "node-a")]
    pub(crate) node_name: String,
    /// The DRA driver the kubelet side talks to.
    #[arg(long = "dra-driver-name", default_value = DEFAULT_DRIVER_NAME)]
    pub(crate) driver_name: String,
    /// Be the kubelet's device-plugin side in `--dir` (registration, Allocate, PodResources,
    /// checkpoint) instead of the API server and the DRA side.
    #[arg(long)]
    pub(crate) kubelet: bool,
}

/// Errors of `emulate`: `Io` and `ApiServer` end it; the others only answer the command
/// that failed (`error <message>`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum EmulateError {
    /// Reading commands, writing answers or the kubeconfig failed.
    #[error("emulate: {0}")]
    Io(#[from] std::io::Error),
    /// The API-server emulator could not start, or refused an object.
    #[error("emulate: {0}")]
    ApiServer(#[from] ApiServerError),
    /// The kubelet emulator could not start.
    #[error("emulate: {0}")]
    KubeletEmulator(#[from] EmulatorError),
    /// A line that is no command.
    #[error("unknown command `{0}`")]
    UnknownCommand(String),
    /// The claim file could not be read.
    #[error("{}: {error}", .path.display())]
    ClaimFile {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The claim file is not a ResourceClaim.
    #[error("{}: {error}", .path.display())]
    ClaimYaml {
        path: PathBuf,
        error: serde_yaml_ng::Error,
    },
    /// The API server has no such claim.
    #[error("no claim {namespace}/{name}")]
    NoClaim { namespace: String, name: String },
    /// The stored claim has no UID.
    #[error("claim {namespace}/{name} has no UID")]
    NoUid { namespace: String, name: String },
    /// `status.devices` could not be written as JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Nothing registered on the plugin-watcher socket within the wait.
    #[error("no DRA plugin registered on {}", .0.display())]
    NoPlugin(PathBuf),
    /// The DRA call itself failed.
    #[error(transparent)]
    Kubelet(#[from] crate::testkit::kubelet::dra::DraKubeletError),
    /// The driver's answer does not mention the claim.
    #[error("claim {0} left out of the answer")]
    LeftOut(String),
    /// The driver's error for the claim, relayed as it wrote it.
    #[error("{0}")]
    Claim(String),
    /// No slice of the node was published within the wait.
    #[error("no ResourceSlice of node {0}")]
    NoSlices(String),
}

/// Serve the emulators and answer commands from stdin until `quit` or end of input.
pub(crate) async fn emulate(
    args: &EmulateArgs,
    out: &mut impl std::io::Write,
) -> Result<(), EmulateError> {
    if args.kubelet {
        return kubelet::serve(&args.dir, out).await;
    }
    crate::platform::kube::install_crypto_provider();
    let server = ApiServer::start().await?;
    std::fs::create_dir_all(&args.dir)?;
    std::fs::write(args.dir.join("kubeconfig"), server.kubeconfig(None))?;
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": args.node_name, "uid": "e2e00000-0000-4000-8000-000000000001"}
    }))
    .map_err(|source| ApiServerError::Json {
        kind: "Node",
        name: args.node_name.clone(),
        source,
    })?;
    server.insert(&node)?;
    let session = Session { args, server };
    answer(out, &format!("ready {}", session.server.url()))?;
    while let Some(line) = next_line().await? {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"quit") {
            break;
        }
        let reply = match session.command(&words).await {
            Ok(text) if text.is_empty() => "ok".to_string(),
            Ok(text) => format!("ok {text}"),
            // One line per answer, whatever the error says.
            Err(why) => format!("error {}", why.to_string().replace('\n', " ")),
        };
        answer(out, &reply)?;
    }
    session.server.stop().await;
    Ok(())
}

/// The next line of stdin (`None` at its end), read on a blocking thread: the daemon's
/// tokio build has no async stdin.
async fn next_line() -> std::io::Result<Option<String>> {
    let read = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map(|n| (n > 0).then_some(line))
    });
    read.await.map_err(std::io::Error::other)?
}

fn answer(out: &mut impl std::io::Write, line: &str) -> std::io::Result<()> {
    writeln!(out, "{line}")?;
    out.flush()
}

struct Session<'a> {
    args: &'a EmulateArgs,
    server: ApiServer,
}

impl Session<'_> {
    async fn command(&self, words: &[&str]) -> Result<String, EmulateError> {
        match words {
            ["claim", file] => self.claim(Path::new(file)),
            ["prepare", namespace, name] => self.prepare(namespace, name).await,
            ["unprepare", namespace, name] => self.unprepare(namespace, name).await,
            ["slices"] => self.slices().await,
            ["claim-status", namespace, name] => {
                let claim = self.claim_object(namespace, name)?;
                let devices = claim.status.and_then(|s| s.devices).unwrap_or_default();
                Ok(serde_json::to_string(&devices)?)
            }
            _ => Err(EmulateError::UnknownCommand(words.join(" "))),
        }
    }

    fn claim(&self, file: &Path) -> Result<String, EmulateError> {
        let text = std::fs::read_to_string(file).map_err(|error| EmulateError::ClaimFile {
            path: file.to_path_buf(),
            error,
        })?;
        let mut claim: ResourceClaim =
            serde_yaml_ng::from_str(&text).map_err(|error| EmulateError::ClaimYaml {
                path: file.to_path_buf(),
                error,
            })?;
        let namespace = claim
            .metadata
            .namespace
            .get_or_insert_with(|| "default".into())
            .clone();
        let name = claim.metadata.name.clone().unwrap_or_default();
        self.server.insert(&claim)?;
        self.claim_object(&namespace, &name)?
            .metadata
            .uid
            .ok_or(EmulateError::NoUid { namespace, name })
    }

    fn claim_object(&self, namespace: &str, name: &str) -> Result<ResourceClaim, EmulateError> {
        self.server
            .get::<ResourceClaim>(namespace, name)
            .ok_or_else(|| EmulateError::NoClaim {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
    }

    fn kubelet_claim(&self, namespace: &str, name: &str) -> Result<KubeletClaim, EmulateError> {
        let uid = self.claim_object(namespace, name)?.metadata.uid;
        Ok(KubeletClaim {
            namespace: namespace.into(),
            uid: uid.unwrap_or_default(),
            name: name.into(),
        })
    }

    /// Register as the plugin watcher does, once the daemon has bound its socket.
    async fn plugin(&self) -> Result<crate::testkit::kubelet::dra::DraPluginConn, EmulateError> {
        let socket = self
            .args
            .dir
            .join("registry")
            .join(format!("{}-reg.sock", self.args.driver_name));
        wait_until(STEP, || async { register(&socket).await.ok() })
            .await
            .ok_or(EmulateError::NoPlugin(socket))
    }

    async fn prepare(&self, namespace: &str, name: &str) -> Result<String, EmulateError> {
        let claim = self.kubelet_claim(namespace, name)?;
        let plugin = self.plugin().await?;
        let mut answer = plugin.prepare(std::slice::from_ref(&claim), None).await?;
        let devices = answer
            .remove(&claim.uid)
            .ok_or_else(|| EmulateError::LeftOut(claim.uid.clone()))?
            .map_err(EmulateError::Claim)?;
        let ids: Vec<String> = devices.into_iter().flat_map(|(_, ids)| ids).collect();
        Ok(ids.join(" "))
    }

    async fn unprepare(&self, namespace: &str, name: &str) -> Result<String, EmulateError> {
        let claim = self.kubelet_claim(namespace, name)?;
        let plugin = self.plugin().await?;
        let mut answer = plugin.unprepare(std::slice::from_ref(&claim)).await?;
        match answer.remove(&claim.uid) {
            Some(error) if error.is_empty() => Ok(String::new()),
            Some(error) => Err(EmulateError::Claim(error)),
            None => Err(EmulateError::LeftOut(claim.uid)),
        }
    }

    async fn slices(&self) -> Result<String, EmulateError> {
        let ours = |s: &ResourceSlice| {
            s.spec.driver == self.args.driver_name
                && s.spec.node_name.as_deref() == Some(self.args.node_name.as_str())
        };
        let published = self
            .server
            .wait_for::<ResourceSlice, _>(STEP, |all| {
                all.iter().any(|s| ours(s) && s.spec.devices.is_some())
            })
            .await;
        if !published {
            return Err(EmulateError::NoSlices(self.args.node_name.clone()));
        }
        let mut devices = Vec::new();
        for s in self
            .server
            .list::<ResourceSlice>()
            .iter()
            .filter(|s| ours(s))
        {
            for d in s.spec.devices.iter().flatten() {
                let uuid = d
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get("uuid"))
                    .and_then(|a| a.string.clone())
                    .unwrap_or_default();
                devices.push(format!("{}={uuid}", d.name));
            }
        }
        Ok(devices.join(" "))
    }
}
