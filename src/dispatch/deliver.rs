//! One HTTP attempt in two steps: **preflight** (the destination and the signing
//! secrets, checked before any I/O) and **request** (sign, send, read a capped snippet).
//! What the result means for the delivery is [`super::classify`]'s.

use std::time::{Duration, Instant};

use chrono::Utc;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use super::policy::{AttemptResult, parse_retry_after};
use super::secrets::SecretUnreadable;
use crate::db::deliveries::ClaimedDelivery;
use crate::domain::{ErrorClass, TraceContext};
use crate::outbound::{self, AllowList};
use crate::signing::{self, SigningSecret};

pub struct AttemptReport {
    pub result: AttemptResult,
    pub started_at: chrono::DateTime<Utc>,
    pub duration: Duration,
    pub snippet: Option<String>,
}

pub struct Sender<'a> {
    pub client: &'a reqwest::Client,
    pub allow: &'a AllowList,
    pub max_timeout: Duration,
    pub snippet_bytes: usize,
}

/// What preflight admits: a destination that may be sent to and the secrets to sign with.
struct Cleared {
    url: reqwest::Url,
    secrets: Vec<SigningSecret>,
}

impl Sender<'_> {
    pub async fn send(
        &self,
        d: &ClaimedDelivery,
        secrets: Result<Vec<SigningSecret>, SecretUnreadable>,
    ) -> AttemptReport {
        let started_at = Utc::now();
        let t0 = Instant::now();
        // with traces on, this attempt's span, a child of the event's trace context
        let stored = trace_of(d);
        let span = crate::telemetry::enabled().then(|| {
            let span = tracing::info_span!(
                target: crate::telemetry::TARGET,
                "hookd.send",
                hookd.delivery_id = %d.id,
                hookd.endpoint_id = %d.endpoint_id,
                hookd.attempt = d.attempts,
                http.response.status_code = tracing::field::Empty,
                error.type = tracing::field::Empty,
            );
            crate::telemetry::set_parent(&span, stored.as_ref());
            span
        });
        // the receiver's parent: this attempt's span when traced, else the producer's own
        let forwarded = span
            .as_ref()
            .and_then(crate::telemetry::context_of)
            .or(stored);
        let (result, snippet) = match preflight(d, self.allow, secrets) {
            Ok(cleared) => self.request(d, cleared, forwarded.as_ref()).await,
            Err(refused) => (refused, None),
        };
        if let Some(span) = &span {
            match &result {
                AttemptResult::Success { status } => {
                    span.record("http.response.status_code", status);
                }
                AttemptResult::Retryable { status, class, .. } => {
                    if let Some(s) = status {
                        span.record("http.response.status_code", s);
                    }
                    span.record("error.type", class.as_str());
                }
                AttemptResult::Permanent { class, .. } => {
                    span.record("error.type", class.as_str());
                }
                AttemptResult::Gone => {
                    span.record("http.response.status_code", 410);
                }
            }
        }
        AttemptReport {
            result,
            started_at,
            duration: t0.elapsed(),
            snippet,
        }
    }

    /// Signs and sends the delivery, and reads at most `snippet_bytes` of the answer.
    async fn request(
        &self,
        d: &ClaimedDelivery,
        cleared: Cleared,
        trace: Option<&TraceContext>,
    ) -> (AttemptResult, Option<String>) {
        let headers = signed_headers(d, &cleared.secrets, trace);
        let timeout = d
            .timeout_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis)
            .map_or(self.max_timeout, |t| t.min(self.max_timeout));

        let resp = self
            .client
            .post(cleared.url)
            .headers(headers)
            .timeout(timeout)
            .body(d.payload.clone())
            .send()
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => return (send_failed(&e), None),
        };
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, Utc::now()));
        let (snippet, _truncated) = outbound::read_capped(resp, self.snippet_bytes).await;
        let snippet = (!snippet.is_empty()).then_some(snippet);
        (answered(status, retry_after), snippet)
    }
}

/// The checks that need no I/O: a parseable URL the allow-list admits, and secrets to
/// sign with. A refusal is the attempt's result; nothing was sent.
fn preflight(
    d: &ClaimedDelivery,
    allow: &AllowList,
    secrets: Result<Vec<SigningSecret>, SecretUnreadable>,
) -> Result<Cleared, AttemptResult> {
    let url = reqwest::Url::parse(&d.url).map_err(|e| AttemptResult::Permanent {
        class: ErrorClass::InvalidUrl,
        error: format!("endpoint url is invalid: {e}"),
    })?;
    // IP-literal hosts bypass the guarded resolver; host names are checked (and
    // pinned) by it when the connection is made.
    outbound::check_url(&url, allow).map_err(|e| AttemptResult::Permanent {
        class: ErrorClass::DestinationForbidden,
        error: e.to_string(),
    })?;
    // Never send unsigned or half-signed. Retried on the schedule: a dispatcher
    // restarted with the right keys delivers it.
    let secrets = secrets.map_err(|e| AttemptResult::Retryable {
        status: None,
        class: ErrorClass::SecretUnreadable,
        error: e.to_string(),
        retry_after: None,
    })?;
    if secrets.is_empty() {
        // Never send unsigned. Secrets are validated at reconcile time, so this means
        // the endpoint lost its secret between claim and send: retry later.
        return Err(AttemptResult::Retryable {
            status: None,
            class: ErrorClass::NoSigningSecret,
            error: "endpoint has no usable signing secret".into(),
            retry_after: None,
        });
    }
    Ok(Cleared { url, secrets })
}

/// The event's stored trace context (migration 0031).
fn trace_of(d: &ClaimedDelivery) -> Option<TraceContext> {
    d.traceparent.clone().map(|traceparent| TraceContext {
        traceparent,
        tracestate: d.tracestate.clone(),
    })
}

/// The endpoint's static headers, then the protocol's: ids, timestamp and signature, an
/// inbound event's source and provider event id, and the trace context `trace`.
fn signed_headers(
    d: &ClaimedDelivery,
    secrets: &[SigningSecret],
    trace: Option<&TraceContext>,
) -> HeaderMap {
    let id = d.id.to_string();
    let ts = Utc::now().timestamp();
    let signature = signing::signature_header(secrets, &id, ts, d.payload.as_bytes());

    let mut headers = HeaderMap::with_capacity(12);
    // Static endpoint headers first, so the protocol headers below always win; never a
    // reserved one, whatever an older door stored.
    if let Some(map) = d.headers.0.as_object() {
        for (k, v) in map
            .iter()
            .filter(|(k, _)| !crate::endpoints::is_reserved_header(k))
        {
            if let (Ok(name), Some(Ok(value))) = (
                HeaderName::from_bytes(k.as_bytes()),
                v.as_str().map(HeaderValue::from_str),
            ) {
                headers.insert(name, value);
            }
        }
    }
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let id_value = HeaderValue::from_str(&id).expect("uuid is a header value");
    headers.insert("webhook-id", id_value.clone());
    headers.insert("idempotency-key", id_value);
    headers.insert("webhook-timestamp", HeaderValue::from(ts));
    if let Ok(v) = HeaderValue::from_str(&signature) {
        headers.insert("webhook-signature", v);
    }
    if let Ok(v) = HeaderValue::from_str(&d.event_type) {
        headers.insert("hookd-event-type", v);
    }
    headers.insert("hookd-attempt", HeaderValue::from(d.attempts));
    // an inbound event says where it came from (checked to be header values when taken),
    // and a traced one carries its producer's trace context on to the receiver
    for (name, value) in [
        ("hookd-source", d.source.as_deref()),
        ("hookd-source-event-id", d.source_event_id.as_deref()),
        ("traceparent", trace.map(|t| t.traceparent.as_str())),
        ("tracestate", trace.and_then(|t| t.tracestate.as_deref())),
    ] {
        if let Some(v) = value.and_then(|v| HeaderValue::from_str(v).ok()) {
            headers.insert(name, v);
        }
    }
    headers
}

/// A request that got no answer.
fn send_failed(e: &reqwest::Error) -> AttemptResult {
    let class = outbound::classify_error(e);
    let error = error_chain(e);
    if class == ErrorClass::DestinationForbidden {
        AttemptResult::Permanent { class, error }
    } else {
        AttemptResult::Retryable {
            status: None,
            class,
            error,
            retry_after: None,
        }
    }
}

/// A request the receiver answered.
fn answered(status: StatusCode, retry_after: Option<Duration>) -> AttemptResult {
    let code = status.as_u16();
    if status.is_success() {
        AttemptResult::Success { status: code }
    } else if code == 410 {
        AttemptResult::Gone
    } else {
        AttemptResult::Retryable {
            status: Some(code),
            class: ErrorClass::HttpStatus,
            error: format!("HTTP {code}"),
            retry_after,
        }
    }
}

/// reqwest's Display hides the cause ("error sending request"); the chain says why.
fn error_chain(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    // the url in reqwest's message may carry a query string with tenant data: keep it short
    if s.len() > 500 {
        let cut = (0..=500)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row stored before every door refused framing headers (an older `hookd apply`
    /// stored `content-encoding`) never sends one: a receiver would read the plain body as
    /// gzip and every delivery would fail.
    #[test]
    fn reserved_headers_stored_by_an_older_door_are_not_sent() {
        let d = ClaimedDelivery {
            source: Some("stripe-live".into()),
            source_event_id: Some("evt_1".into()),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            tracestate: Some("congo=t61rcWkgMzE".into()),
            headers: sqlx::types::Json(serde_json::json!({
                "Content-Encoding": "gzip", "Webhook-Id": "forged", "X-Team": "billing",
                "Hookd-Source": "forged", "Traceparent": "forged"
            })),
            ..crate::dispatch::claimed_row(uuid::Uuid::now_v7(), "t")
        };
        let h = signed_headers(&d, &[], trace_of(&d).as_ref());
        assert!(h.get("content-encoding").is_none());
        assert_eq!(h["webhook-id"], d.id.to_string().as_str());
        assert_eq!(h["x-team"], "billing");
        // where an inbound event came from wins over an endpoint's own header
        assert_eq!(h["hookd-source"], "stripe-live");
        assert_eq!(h.get_all("hookd-source").iter().count(), 1);
        assert_eq!(h["hookd-source-event-id"], "evt_1");
        assert_eq!(
            h["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(h["tracestate"], "congo=t61rcWkgMzE");
        // and a produced event never carries one, whatever an endpoint stored
        let produced = ClaimedDelivery {
            source: None,
            source_event_id: None,
            traceparent: None,
            tracestate: None,
            ..d
        };
        let h = signed_headers(&produced, &[], trace_of(&produced).as_ref());
        assert!(h.get("hookd-source").is_none(), "{h:?}");
        assert!(h.get("traceparent").is_none(), "{h:?}");
    }
}
