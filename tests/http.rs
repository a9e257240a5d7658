//! The HTTP endpoint over a real TCP socket: routes, readiness, and a `promtool check
//! metrics` of a real scrape.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gpu_slicer::runtime::http::{self, Readiness};
use gpu_slicer::runtime::metrics::{Metrics, ResourceLabels, RuleLabels};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn routes_readiness_and_promtool() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let metrics = Arc::new(Metrics::new());
        let readiness = Arc::new(Readiness::default());
        let listener = http::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(http::serve(listener, metrics.clone(), readiness.clone(), stop.clone()));

        let gpu = ResourceLabels { resource: "nvidia.com/gpu".into() };
        metrics.allocatable.get_or_create(&gpu).set(8);
        metrics.allocate_seconds.get_or_create(&gpu).observe(0.0001);
        metrics
            .allocate_errors
            .get_or_create(&RuleLabels { resource: "nvidia.com/gpu".into(), rule: "unknown-device".into() })
            .inc();

        assert_eq!(common::http(addr, "GET", "/healthz").await.0, 200);
        let (code, body) = common::http(addr, "GET", "/readyz").await;
        assert_eq!(code, 503);
        assert!(body.contains("CDI spec not written"), "{body}");
        readiness.spec_written.store(true, Ordering::Release);
        readiness.registered.store(true, Ordering::Release);
        assert_eq!(common::http(addr, "GET", "/readyz").await.0, 200);
        assert_eq!(common::http(addr, "GET", "/nope").await.0, 404);
        // No usage sampler behind this endpoint.
        let (code, body) = common::http(addr, "GET", "/v1/state").await;
        assert_eq!(code, 503);
        assert!(body.contains("--usage-interval"), "{body}");
        assert_eq!(common::http(addr, "POST", "/metrics").await.0, 405);

        let (code, body) = common::http(addr, "GET", "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("gpu_slicer_allocatable_devices{resource=\"nvidia.com/gpu\"} 8"));
        let dir = tempfile::tempdir().unwrap();
        let scrape = dir.path().join("scrape.txt");
        std::fs::write(&scrape, &body).unwrap();
        let out = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(&scrape).unwrap())
            .output()
            .expect("promtool (Debian package `prometheus`) must be installed: run hack/install-deps.sh");
        assert!(
            out.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );

        stop.cancel();
        server.await.unwrap();
    })
    .await
    .unwrap();
}
