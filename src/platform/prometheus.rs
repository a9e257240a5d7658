//! A Prometheus HTTP API client for `advise --prometheus`: instant queries
//! (`GET /api/v1/query`) over plain `http://` through [`super::http_get`], with an optional
//! bearer token, a size cap and a deadline per query. The queries and what their answers
//! mean are `domain::advise::promql`'s; this module only moves them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::domain::advise::promql::Sample;

/// Largest answer accepted (a query over 10 000 GPUs is a few MiB).
const MAX_BODY: usize = 256 << 20;

/// Errors talking to Prometheus.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PrometheusError {
    /// `--prometheus` is not an `http://host[:port][/prefix]` URL.
    #[error("invalid flag `--prometheus` = `{url}`: {why}")]
    Url { url: String, why: String },
    /// The server could not be reached, or answered with an error.
    #[error("prometheus query at {url} failed: {why} (query: {query})")]
    Query {
        url: String,
        query: String,
        why: String,
    },
    /// The body is not the API's JSON answer.
    #[error("not a query answer: {0}")]
    NotAnAnswer(#[source] serde_json::Error),
    /// The API answered with a status other than `success`.
    #[error("{}", .error.clone().unwrap_or_else(|| format!("status {status}")))]
    Refused {
        status: String,
        error: Option<String>,
    },
    /// A `success` answer without `data`.
    #[error("no data in the answer")]
    NoData,
    /// The answer is not an instant vector.
    #[error("result type {0} (expected vector)")]
    ResultType(String),
}

/// Where Prometheus is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// `host:port` to connect to.
    pub(crate) authority: String,
    /// Path prefix (`""` or `/prometheus`).
    pub(crate) prefix: String,
    /// The URL as given, for messages.
    pub(crate) url: String,
    /// `Authorization: Bearer` token.
    pub(crate) token: Option<String>,
    /// Deadline per query.
    pub(crate) timeout: Duration,
}

impl Endpoint {
    /// Parse `http://host[:port][/prefix]`.
    pub(crate) fn parse(
        url: &str,
        token: Option<String>,
        timeout: Duration,
    ) -> Result<Self, PrometheusError> {
        let bad = |why: &str| PrometheusError::Url {
            url: url.to_string(),
            why: why.to_string(),
        };
        let uri: hyper::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "only http:// is supported (reach an https endpoint through a port-forward or proxy)",
            ));
        }
        let host = uri.host().ok_or_else(|| bad("no host"))?;
        let port = uri.port_u16().unwrap_or(80);
        Ok(Endpoint {
            authority: format!("{host}:{port}"),
            prefix: uri.path().trim_end_matches('/').to_string(),
            url: url.to_string(),
            token,
            timeout,
        })
    }
}

/// Percent-encode a query parameter (RFC 3986 unreserved characters kept).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: Vec<Series>,
}

#[derive(Deserialize)]
struct Series {
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

/// Read the samples of an instant-query answer (the API's JSON).
pub(crate) fn parse_answer(body: &[u8]) -> Result<Vec<Sample>, PrometheusError> {
    let a: Answer = serde_json::from_slice(body).map_err(PrometheusError::NotAnAnswer)?;
    if a.status != "success" {
        return Err(PrometheusError::Refused {
            status: a.status,
            error: a.error,
        });
    }
    let data = a.data.ok_or(PrometheusError::NoData)?;
    if data.result_type != "vector" {
        return Err(PrometheusError::ResultType(data.result_type));
    }
    Ok(data
        .result
        .into_iter()
        .filter_map(|s| {
            let v: f64 = s.value.1.parse().ok()?;
            v.is_finite().then_some(Sample {
                labels: s.metric,
                value: v,
            })
        })
        .collect())
}

/// Run one instant query at `time` (unix seconds; `None`: now).
pub(crate) async fn query(
    ep: &Endpoint,
    promql: &str,
    time: Option<f64>,
) -> Result<Vec<Sample>, PrometheusError> {
    let fail = |why: String| PrometheusError::Query {
        url: ep.url.clone(),
        query: promql.to_string(),
        why,
    };
    let mut path = format!("{}/api/v1/query?query={}", ep.prefix, encode(promql));
    if let Some(t) = time {
        path.push_str(&format!("&time={t}"));
    }
    let answer = super::http_get::get(
        &ep.authority,
        &path,
        ep.token.as_deref(),
        MAX_BODY,
        ep.timeout,
    )
    .await
    .map_err(|e| fail(e.to_string()))?;
    if !answer.status.is_success() {
        // The API explains a bad query in its JSON error.
        let why = parse_answer(&answer.body)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        return Err(fail(format!("HTTP {}: {why}", answer.status)));
    }
    parse_answer(&answer.body).map_err(|e| fail(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_answers_and_encoding() {
        let ep =
            Endpoint::parse("http://prom:9090/prometheus/", None, Duration::from_secs(1)).unwrap();
        assert_eq!(ep.authority, "prom:9090");
        assert_eq!(ep.prefix, "/prometheus");
        assert!(Endpoint::parse("https://prom", None, Duration::from_secs(1)).is_err());
        assert_eq!(
            encode("max by (a) (x{y=\"1\"}[7d])"),
            "max%20by%20%28a%29%20%28x%7By%3D%221%22%7D%5B7d%5D%29"
        );
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"uuid":"GPU-1"},"value":[1764586000.5,"0.25"]},{"metric":{"uuid":"GPU-2"},"value":[1764586000.5,"NaN"]}]}}"#;
        let s = parse_answer(body).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].labels["uuid"], "GPU-1");
        assert_eq!(s[0].value, 0.25);
        let err = br#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        assert!(
            parse_answer(err)
                .unwrap_err()
                .to_string()
                .contains("parse error")
        );
    }
}
