//! The DRA driver under a kubelet's load, in process (no socket, the claims from an
//! in-memory map that can be made slow): one claim's Prepare and Unprepare, a batch of 8,
//! 4 concurrent clients, and 13 concurrent Prepares behind 2 s API reads (bench
//! `dra_claims`). The node has 16 whole GPUs; claim `i` is allocated `gpu-i`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::domain::cdi::{GenerateOptions, NoProbe, generate};
use crate::domain::dra::claim::{ClaimRef, ResourceClaim};
use crate::domain::snapshot::Snapshot;
use crate::platform::claims::{ClaimSource, ClaimSourceError};
use crate::platform::dra_state::{DraFiles, Prepared};
use crate::runtime::dra::{Driver, DriverExtras};
use crate::state::Store;
use crate::testkit::fixtures;
use crate::testkit::kubelet::dra::Claims;

/// GPUs of the node, and so claims.
const GPUS: usize = 16;

/// Claims whose reads take a settable time, as a slow API server's.
#[derive(Debug)]
struct Slow {
    claims: Arc<Claims>,
    delay: Mutex<Duration>,
}

impl ClaimSource for Slow {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<ResourceClaim, ClaimSourceError>> + Send + 'a>> {
        let delay = *self.delay.lock().unwrap_or_else(PoisonError::into_inner);
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            self.claims.get(namespace, name).await
        })
    }
}

/// A driver over a 16-GPU node with its files on one file system.
#[derive(Debug)]
pub struct DraClaims {
    driver: Driver,
    source: Arc<Slow>,
    dir: TempDir,
}

impl DraClaims {
    /// State and CDI dirs in a temp dir under `base` (`/tmp`: the disk; `/dev/shm`: tmpfs).
    ///
    /// # Panics
    /// When the node or the temp dir cannot be made.
    pub fn new(base: &str) -> Self {
        let dir = tempfile::tempdir_in(base).unwrap_or_else(|e| panic!("tempdir in {base}: {e}"));
        let node =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/nodes/topo-pairs-16.yaml");
        let (inv, cfg, plan) = fixtures::planned(&node.display().to_string(), "version: v1\n");
        let spec = generate(&inv, &GenerateOptions::new("nvidia.com/gpu"), &NoProbe)
            .unwrap_or_else(|e| panic!("spec: {e}"));
        let mut snap = Snapshot::serving(cfg, inv, plan);
        snap.spec = Some(Arc::new(spec));
        let claims = Claims::new();
        for i in 0..GPUS {
            let c = Self::claim(i);
            claims.put(serde_json::json!({"metadata": {"namespace": c.namespace, "name": c.name, "uid": c.uid},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": "gpu-slicer.io", "pool": "node-a", "device": format!("gpu-{i}")}]}}}}));
        }
        let source = Arc::new(Slow {
            claims,
            delay: Mutex::new(Duration::ZERO),
        });
        let files = DraFiles {
            checkpoint: dir.path().join("state/dra-prepared.json"),
            cdi_dir: dir.path().join("cdi"),
            driver: "gpu-slicer.io".into(),
        };
        let driver = Driver::with_extras(
            "gpu-slicer.io",
            "node-a",
            Store::new(snap),
            source.clone(),
            (files, Prepared::default()),
            DriverExtras::default(),
        );
        Self {
            driver,
            source,
            dir,
        }
    }

    /// Claim `i` (allocated `gpu-i`).
    fn claim(i: usize) -> ClaimRef {
        ClaimRef {
            namespace: "ml".into(),
            uid: format!("eeeeeeee-0000-4000-8000-{i:012}"),
            name: format!("c{i}"),
        }
    }

    /// The file system the files are on (`stat -f`).
    pub fn file_system(&self) -> String {
        std::process::Command::new("stat")
            .args(["-f", "-c", "%T"])
            .arg(self.dir.path())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }

    /// Make every claim read take `delay`.
    pub fn slow(&self, delay: Duration) {
        *self
            .source
            .delay
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = delay;
    }

    /// Prepare claims `ix` in one call; the time it took.
    ///
    /// # Panics
    /// When a claim is not prepared.
    pub async fn prepare(&self, ix: &[usize]) -> Duration {
        let refs: Vec<ClaimRef> = ix.iter().map(|i| Self::claim(*i)).collect();
        let start = Instant::now();
        let out = self.driver.prepare(&refs).await;
        let took = start.elapsed();
        assert!(out.values().all(Result::is_ok), "{out:?}");
        took
    }

    /// Unprepare claims `ix` in one call; the time it took.
    ///
    /// # Panics
    /// When a claim is not unprepared.
    pub async fn unprepare(&self, ix: &[usize]) -> Duration {
        let refs: Vec<ClaimRef> = ix.iter().map(|i| Self::claim(*i)).collect();
        let start = Instant::now();
        let out = self.driver.unprepare(&refs).await;
        let took = start.elapsed();
        assert!(out.values().all(Result::is_ok), "{out:?}");
        took
    }
}
