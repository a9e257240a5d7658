//! The HTTP endpoint over a real TCP socket: routes, readiness, and a `promtool check
//! metrics` of a real scrape; a client that connects and never sends a request.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::runtime::http::{self, Readiness};
use crate::runtime::metrics::{Metrics, ResourceLabels, RuleLabels};
use crate::testkit::{http as request, promtool_check, within};

#[tokio::test]
async fn routes_readiness_and_promtool() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let metrics = Arc::new(Metrics::new());
        let readiness = Arc::new(Readiness::default());
        let listener = http::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(http::serve(
            listener,
            metrics.clone(),
            readiness.clone(),
            stop.clone(),
        ));

        let gpu = ResourceLabels {
            resource: "nvidia.com/gpu".into(),
        };
        metrics.allocatable.get_or_create(&gpu).set(8);
        metrics.allocate_seconds.get_or_create(&gpu).observe(0.0001);
        metrics
            .allocate_errors
            .get_or_create(&RuleLabels {
                resource: "nvidia.com/gpu".into(),
                rule: "unknown-device".into(),
            })
            .inc();

        assert_eq!(request(addr, "GET", "/healthz").await.0, 200);
        let (code, body) = request(addr, "GET", "/readyz").await;
        assert_eq!(code, 503);
        assert!(body.contains("CDI spec not written"), "{body}");
        readiness.spec_written.store(true, Ordering::Release);
        readiness.registered.store(true, Ordering::Release);
        assert_eq!(request(addr, "GET", "/readyz").await.0, 200);
        assert_eq!(request(addr, "GET", "/nope").await.0, 404);
        // No usage sampler behind this endpoint.
        let (code, body) = request(addr, "GET", "/v1/state").await;
        assert_eq!(code, 503);
        assert!(body.contains("--usage-interval"), "{body}");
        assert_eq!(request(addr, "POST", "/metrics").await.0, 405);

        let (code, body) = request(addr, "GET", "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("gpu_slicer_allocatable_devices{resource=\"nvidia.com/gpu\"} 8"));
        promtool_check(&body);

        stop.cancel();
        server.await.unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_by_the_server() {
    let metrics = std::sync::Arc::new(crate::runtime::metrics::Metrics::new());
    let readiness = std::sync::Arc::new(crate::runtime::http::Readiness::default());
    let listener = crate::runtime::http::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(crate::runtime::http::serve(
        listener,
        metrics,
        readiness,
        stop.clone(),
    ));
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    // Half a request line, then silence: the header-read timeout ends it.
    idle.write_all(b"GET /heal").await.expect("write");
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    for s in [&mut idle, &mut silent] {
        let mut buf = Vec::new();
        // EOF (or a reset) from the server, well within the bound; never a response.
        let read = within("server closes the idle connection", s.read_to_end(&mut buf)).await;
        assert!(
            read.is_err() || buf.is_empty() || !buf.starts_with(b"HTTP/1.1 200"),
            "{buf:?}"
        );
    }
    stop.cancel();
    within("server stops", server).await.expect("join");
}
