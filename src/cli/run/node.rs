//! [`Node::run`]: a test node started from `gpu-slicer run` flags. The harness is the
//! testkit's ([`Node::launch`]); this part lives here, beside the flags it parses, because
//! the testkit sits below `cli` and may not name it.

use crate::cli::backend::open_backend;
use crate::cli::run::RunArgs;
use crate::testkit::kubelet::KubeletEmulator;
use crate::testkit::node::{NodeFailure, short_tempdir};
use crate::testkit::{Node, NodeError};

impl Node {
    /// `gpu-slicer run <args>` in process, in a fresh directory: sockets in its `dp/` where
    /// the kubelet emulator serves, the spec in `cdi/`, and, unless `args` say otherwise, no
    /// state directory, HTTP endpoint, ledger, labels file, usage sampling or re-scan timer
    /// (`--state-dir "" --http-listen "" --pod-resources-socket "" --labels-file ""
    /// --usage-interval 0 --rescan-interval 0`). Environment variables count as on the
    /// command line. Returns once the daemon is ready and every planned resource registered.
    pub async fn run(args: &[&str]) -> Result<Self, NodeError> {
        let dir = short_tempdir("gs")?;
        let emulator = KubeletEmulator::start(dir.path().join("dp")).await?;
        let dp = dir.path().join("dp").display().to_string();
        let cdi = dir.path().join("cdi").display().to_string();
        let defaults: [(&str, &str); 8] = [
            ("--device-plugin-dir", &dp),
            ("--cdi-dir", &cdi),
            ("--state-dir", ""),
            ("--http-listen", ""),
            ("--pod-resources-socket", ""),
            ("--labels-file", ""),
            ("--usage-interval", "0"),
            ("--rescan-interval", "0"),
        ];
        let given = |flag: &str| {
            args.iter()
                .any(|a| *a == flag || a.strip_prefix(flag).is_some_and(|r| r.starts_with('=')))
        };
        let mut argv: Vec<String> = defaults
            .iter()
            .filter(|(flag, _)| !given(flag))
            .map(|(flag, value)| format!("{flag}={value}"))
            .collect();
        argv.extend(args.iter().map(|a| (*a).to_string()));
        let refused = |message: String| {
            NodeError(NodeFailure::Flags {
                args: args.join(" "),
                message,
            })
        };
        let run = RunArgs::parse(&argv).map_err(|e| refused(e.to_string()))?;
        let mut settings = run.settings().map_err(|e| refused(e.to_string()))?;
        settings.dra = run
            .dra_settings(&settings.config)
            .await
            .map_err(|e| refused(e.to_string()))?;
        let backend = open_backend(&run.backend)?;
        Node::launch(dir, emulator, settings, backend).await
    }
}
