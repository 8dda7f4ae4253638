//! The Prometheus registry shared by every component of one process. Each metric is cheap
//! to update on the hot path (atomics); nothing here queries the database per scrape.

use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteStatus {
    pub method: &'static str,
    /// the matched route template (`/v1/messages/{id}`), or `unmatched`
    pub route: String,
    pub status: u16,
}

/// An inbound request's outcome at a source. `source` is `(unknown)` for a name no
/// source has, so a scan of made-up names cannot mint series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InboundOutcome {
    pub source: String,
    /// `accepted`, `duplicate`, `url_verification` (Slack's check, answered), or why it
    /// was not taken: refused (`unknown_source`, `missing_signature`, `bad_signature`,
    /// `stale_timestamp`, `malformed_signature`, `not_json`), held back before its
    /// signature was read (`not_admitted`), or verified but not committed (`not_taken`:
    /// the tenant's rate or an outage; the provider retries), or the source could not be
    /// read or its secrets opened (`unavailable`, under `(unknown)`)
    pub outcome: &'static str,
}

/// A request method as a label: the standard ones by name, anything else as `other`, so a
/// client cannot mint series with made-up methods.
pub fn method_label(m: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub outcome: AttemptOutcome,
}

/// What one delivery attempt came to: the `outcome` label of `hookd_delivery_attempts`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum AttemptOutcome {
    Succeeded,
    /// failed; another attempt is scheduled
    Retry,
    /// the receiver answered 410 Gone (the endpoint is disabled)
    Gone,
    /// not sent: the signing secret cannot be decrypted here
    Held,
    /// dead-lettered
    Dead,
}

impl AttemptOutcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Retry => "retry",
            AttemptOutcome::Gone => "gone",
            AttemptOutcome::Held => "held",
            AttemptOutcome::Dead => "dead",
        }
    }
}

// Written by hand: the derive would write the variant names as they are (`Succeeded`).
impl EncodeLabelValue for AttemptOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileResult {
    pub controller: &'static str,
    /// `ok` or `error`
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Table {
    pub table: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassResult {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: &'static str,
}

#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub http_requests: Family<RouteStatus, Counter>,
    pub inbound_requests: Family<InboundOutcome, Counter>,
    pub events_enqueued: Counter,
    pub deliveries_created: Counter,
    pub ingest_commit_seconds: Histogram,
    pub ingest_group_size: Histogram,
    pub delivery_attempts: Family<Outcome, Counter>,
    pub delivery_seconds: Histogram,
    pub deliveries_in_flight: Gauge,
    pub claim_seconds: Histogram,
    pub claimed: Counter,
    /// of `claimed`, those leased because the API named them in its NOTIFY, without a scan
    pub claimed_handed: Counter,
    pub leases_lost: Counter,
    pub outcome_write_errors: Counter,
    pub circuits_opened: Counter,
    pub endpoints_disabled: Counter,
    pub backlog: Gauge,
    pub oldest_due_age_seconds: Gauge,
    pub reconciles: Family<ReconcileResult, Counter>,
    pub reconcile_seconds: Family<ControllerLabel, Histogram>,
    pub leader: Gauge,
    pub secret_decryptions: Counter,
    pub secret_decrypt_failures: Counter,
    pub retention_deleted: Family<Table, Counter>,
    pub retention_passes: Family<PassResult, Counter>,
    pub retention_days_dropped: Counter,
    pub auth_failures: Family<Reason, Counter>,
    pub rate_limited_events: Counter,
    pub ingest_refused: Family<Reason, Counter>,
    pub ingest_bytes_in_flight: Gauge,
    /// SHA-256 of the bearer token `/metrics` requires (`HOOKD_METRICS_TOKEN`); `None`: open
    scrape_token: Option<[u8; 32]>,
}

/// The process-wide `HOOKD_METRICS_TOKEN`, set once by `main` before any component starts,
/// so every registry of the process (API, dispatcher, controller, `dev`) requires it.
static SCRAPE_TOKEN: OnceLock<[u8; 32]> = OnceLock::new();

/// Makes `/metrics` of every component of this process require `Authorization: Bearer
/// <token>`. Only the token's hash is kept.
pub fn require_scrape_token(token: &str) {
    let _ = SCRAPE_TOKEN.set(Sha256::digest(token.as_bytes()).into());
}

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// One event committed with `deliveries` deliveries (a repeat of a key counts nothing).
    pub fn count_enqueued(&self, deliveries: usize) {
        self.events_enqueued.inc();
        self.deliveries_created.inc_by(deliveries as u64);
    }

    pub fn new() -> Self {
        let mut r = Registry::with_prefix("hookd");
        let http_requests = Family::<RouteStatus, Counter>::default();
        r.register(
            "http_requests",
            "HTTP requests by route and status",
            http_requests.clone(),
        );
        let inbound_requests = Family::<InboundOutcome, Counter>::default();
        r.register(
            "inbound_requests",
            "Requests to inbound sources (POST /in/{name}) by source and outcome",
            inbound_requests.clone(),
        );
        let events_enqueued = Counter::default();
        r.register(
            "events_enqueued",
            "Events committed",
            events_enqueued.clone(),
        );
        let deliveries_created = Counter::default();
        r.register(
            "deliveries_created",
            "Delivery rows committed by fan-out",
            deliveries_created.clone(),
        );
        let ingest_commit_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        r.register(
            "ingest_commit_seconds",
            "Time from request accepted to commit",
            ingest_commit_seconds.clone(),
        );
        let ingest_group_size = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        r.register(
            "ingest_group_size",
            "Messages per shared ingest transaction",
            ingest_group_size.clone(),
        );
        let delivery_attempts = Family::<Outcome, Counter>::default();
        r.register(
            "delivery_attempts",
            "Delivery attempts by outcome",
            delivery_attempts.clone(),
        );
        let delivery_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        r.register(
            "delivery_seconds",
            "Duration of one delivery attempt",
            delivery_seconds.clone(),
        );
        let deliveries_in_flight = Gauge::default();
        r.register(
            "deliveries_in_flight",
            "Deliveries being sent by this process",
            deliveries_in_flight.clone(),
        );
        let claim_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        r.register(
            "claim_seconds",
            "Duration of one claim statement",
            claim_seconds.clone(),
        );
        let claimed = Counter::default();
        r.register(
            "claimed",
            "Deliveries leased by this process",
            claimed.clone(),
        );
        let claimed_handed = Counter::default();
        r.register(
            "claimed_handed",
            "Deliveries leased by this process as the API handed them over (NOTIFY), without a scan",
            claimed_handed.clone(),
        );
        let leases_lost = Counter::default();
        r.register(
            "leases_lost",
            "Outcomes dropped because the lease had been taken over",
            leases_lost.clone(),
        );
        let outcome_write_errors = Counter::default();
        r.register(
            "outcome_write_errors",
            "Outcomes the database refused even alone (written without their details or dropped; the delivery is resent when its lease lapses)",
            outcome_write_errors.clone(),
        );
        let circuits_opened = Counter::default();
        r.register(
            "circuits_opened",
            "Circuit breakers opened by this process",
            circuits_opened.clone(),
        );
        let endpoints_disabled = Counter::default();
        r.register(
            "endpoints_disabled",
            "Endpoints disabled after 410 Gone",
            endpoints_disabled.clone(),
        );
        let backlog = Gauge::default();
        r.register(
            "backlog",
            "Claimable deliveries (sampled, capped at 100000)",
            backlog.clone(),
        );
        let oldest_due_age_seconds = Gauge::default();
        r.register(
            "oldest_due_age_seconds",
            "Age of the oldest due delivery of an active endpoint (sampled)",
            oldest_due_age_seconds.clone(),
        );
        let reconciles = Family::<ReconcileResult, Counter>::default();
        r.register(
            "reconciles",
            "Controller reconciliations by controller and result",
            reconciles.clone(),
        );
        let reconcile_seconds = Family::<ControllerLabel, Histogram>::new_with_constructor(
            reconcile_histogram as fn() -> Histogram,
        );
        r.register(
            "reconcile_seconds",
            "Duration of one reconciliation",
            reconcile_seconds.clone(),
        );
        let leader = Gauge::default();
        r.register(
            "leader",
            "1 while this controller replica holds the leader lease",
            leader.clone(),
        );
        let secret_decryptions = Counter::default();
        r.register(
            "secret_decryptions",
            "Signing secrets decrypted (once per secret row per process, thanks to the cache)",
            secret_decryptions.clone(),
        );
        let secret_decrypt_failures = Counter::default();
        r.register(
            "secret_decrypt_failures",
            "Signing secrets that could not be decrypted (unknown key id or failed authentication)",
            secret_decrypt_failures.clone(),
        );
        let retention_deleted = Family::<Table, Counter>::default();
        r.register(
            "retention_deleted",
            "Rows deleted by retention, by table",
            retention_deleted.clone(),
        );
        let retention_passes = Family::<PassResult, Counter>::default();
        r.register(
            "retention_passes",
            "Retention passes by result: done, skipped (another process held the lock), failed",
            retention_passes.clone(),
        );
        let retention_days_dropped = Counter::default();
        r.register(
            "retention_days_dropped",
            "History days (deliveries, attempts and dead letters of one UTC day) dropped whole by retention",
            retention_days_dropped.clone(),
        );
        let auth_failures = Family::<Reason, Counter>::default();
        r.register(
            "auth_failures",
            "API requests refused before authorization: missing, invalid, unavailable",
            auth_failures.clone(),
        );
        let rate_limited_events = Counter::default();
        r.register(
            "rate_limited_events",
            "Events refused by the per-tenant ingest rate limit",
            rate_limited_events.clone(),
        );
        let ingest_refused = Family::<Reason, Counter>::default();
        r.register(
            "ingest_refused",
            "Ingest requests refused before their body was read: rate_limited, tenant_bytes (the tenant's share of bytes in flight), process_bytes (the process's)",
            ingest_refused.clone(),
        );
        let ingest_bytes_in_flight = Gauge::default();
        r.register(
            "ingest_bytes_in_flight",
            "Request-body bytes admitted and not yet answered (read, parsed or waiting for commit)",
            ingest_bytes_in_flight.clone(),
        );
        Metrics {
            registry: Arc::new(r),
            http_requests,
            inbound_requests,
            events_enqueued,
            deliveries_created,
            ingest_commit_seconds,
            ingest_group_size,
            delivery_attempts,
            delivery_seconds,
            deliveries_in_flight,
            claim_seconds,
            claimed,
            claimed_handed,
            leases_lost,
            outcome_write_errors,
            circuits_opened,
            endpoints_disabled,
            backlog,
            oldest_due_age_seconds,
            reconciles,
            reconcile_seconds,
            leader,
            secret_decryptions,
            secret_decrypt_failures,
            retention_deleted,
            retention_passes,
            retention_days_dropped,
            auth_failures,
            rate_limited_events,
            ingest_refused,
            ingest_bytes_in_flight,
            scrape_token: SCRAPE_TOKEN.get().copied(),
        }
    }

    /// The same registry, requiring `token` on `/metrics` (`None`: open).
    pub fn with_scrape_token(mut self, token: Option<&str>) -> Self {
        self.scrape_token = token.map(|t| Sha256::digest(t.as_bytes()).into());
        self
    }

    /// Whether an `Authorization` header value may read `/metrics`. Compared as SHA-256
    /// digests, so the comparison's timing says nothing about the token.
    pub fn scrape_allowed(&self, authorization: Option<&[u8]>) -> bool {
        let Some(want) = self.scrape_token else {
            return true;
        };
        let Some(token) = authorization
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim())
        else {
            return false;
        };
        let got: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        got == want
    }

    pub fn count_auth_failure(&self, reason: &'static str) {
        self.auth_failures.get_or_create(&Reason { reason }).inc();
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dashboards and alert rules in manifests/monitoring select these label values.
    #[test]
    fn attempt_outcomes_render_as_their_label_values() {
        let m = Metrics::new();
        let all = [
            AttemptOutcome::Succeeded,
            AttemptOutcome::Retry,
            AttemptOutcome::Gone,
            AttemptOutcome::Held,
            AttemptOutcome::Dead,
        ];
        for outcome in all {
            m.delivery_attempts
                .get_or_create(&Outcome { outcome })
                .inc();
        }
        let text = m.render();
        for value in ["succeeded", "retry", "gone", "held", "dead"] {
            assert!(
                text.contains(&format!(
                    "hookd_delivery_attempts_total{{outcome=\"{value}\"}} 1"
                )),
                "{value}: {text}"
            );
        }
    }
}
