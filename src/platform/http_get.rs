//! One HTTP/1 GET over plain TCP, bounded in time and in body size: what `gpu-slicer top`
//! fetches from an agent (`/v1/state`) and `advise --prometheus` from the query API. hyper's
//! connection API directly, one connection per request: a pooled client (reqwest,
//! hyper-util's legacy client) would add a dependency tree for a handful of requests.
//! Callers (`crate::cli::top`, `super::prometheus`) judge the status and parse the body.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

/// Why no answer came back.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpGetError {
    #[error("connect to {authority}: {source}")]
    Connect {
        authority: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("bad request: {0}")]
    Request(#[from] http::Error),
    #[error("body: {0}")]
    Body(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// What came back: the status and at most the bound's bytes of body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: hyper::StatusCode,
    pub(crate) body: Bytes,
}

/// GET `path` from `authority` (`host:port`), with a bearer token when given; the whole
/// exchange within `timeout`, a body over `max_body` bytes an error.
pub(crate) async fn get(
    authority: &str,
    path: &str,
    bearer: Option<&str>,
    max_body: usize,
    timeout: Duration,
) -> Result<Answer, HttpGetError> {
    let work = async {
        let stream = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(|source| HttpGetError::Connect {
                authority: authority.to_string(),
                source,
            })?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        // The connection future ends with the exchange; a failure shows in the request.
        let driver = tokio::spawn(conn);
        let result = async {
            let mut req = hyper::Request::get(path).header(hyper::header::HOST, authority);
            if let Some(t) = bearer {
                req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let resp = send.send_request(req.body(Empty::<Bytes>::new())?).await?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), max_body)
                .collect()
                .await
                .map_err(|e| HttpGetError::Body(e.to_string()))?
                .to_bytes();
            Ok(Answer { status, body })
        }
        .await;
        driver.abort();
        result
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| HttpGetError::Timeout(timeout))?
}
