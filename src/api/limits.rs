//! Request limits with JSON errors: URL length (414), header size (431), a deadline on
//! the whole request (408), the per-tenant ingest rate (429), and the bytes of request
//! bodies in flight per tenant (429) and per process (503), admitted from the request head
//! before any of the body is read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use crate::domain::ErrorCode;
use crate::metrics::Metrics;

/// Refuses oversized request targets and headers before any handler runs, and answers
/// 408 when a request (its body upload included) outlives the request timeout. A slow
/// client therefore cannot hold a handler forever; hyper's header-read timeout covers the
/// time before the request head is complete (see `server`).
///
/// A request cut off by the deadline may still have been committed if it was an enqueue
/// that reached the committer; its 408 is not a 2xx, and the producer's retry with the same
/// idempotency key returns the original ids.
pub async fn enforce(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let limits = &state.limits;
    let target = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    if target > limits.max_url_bytes {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            ErrorCode::UriTooLong,
            format!(
                "the request target is {target} bytes; the limit is {}",
                limits.max_url_bytes
            ),
        )
        .into_response();
    }
    // name, ": ", value and CRLF, as on the wire
    let header_bytes: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if header_bytes > limits.max_header_bytes {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorCode::HeadersTooLarge,
            format!(
                "the request headers are {header_bytes} bytes; the limit is {}",
                limits.max_header_bytes
            ),
        )
        .into_response();
    }
    let timeout = limits.request_timeout;
    match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::request_timeout(timeout).into_response(),
    }
}

/// Token buckets per tenant, refilled at `rate` events per second up to one second's worth.
///
/// The limit is per API process: with R replicas behind a Service a tenant can reach R
/// times it. Keeping it in memory costs nothing per request, where a shared counter in
/// Postgres would add a write (on the hottest row: the busy tenant's) to every ingest.
pub struct TenantRateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// A consumer's share of request-body bytes in flight unless configured: 16 requests of
/// the largest body the consumer routes take.
pub const DEFAULT_CONSUMER_SHARE: usize = 1 << 20;

/// Buckets kept before idle (full) ones are forgotten.
const MAX_BUCKETS: usize = 10_000;

impl TenantRateLimiter {
    pub fn new(rate: f64) -> Self {
        TenantRateLimiter {
            rate,
            burst: rate.max(1.0),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Admits `n` events of `tenant` for every entry of `demand`, all or none. Err carries
    /// the first refused tenant and how long until it would be admitted.
    ///
    /// A request is admitted when its tenant's bucket holds `n` events, or is full when `n`
    /// is more than a full bucket (a batch larger than one second's worth): it then takes
    /// all `n` and leaves the bucket in debt, so the average rate still holds and a large
    /// batch is never refused forever.
    pub fn admit<'a>(
        &self,
        demand: &[(&'a str, u32)],
        now: Instant,
    ) -> Result<(), (&'a str, Duration)> {
        let mut buckets = self.buckets.lock().expect("rate limiter lock");
        let refill = |b: Option<&Bucket>| match b {
            None => self.burst,
            Some(b) => (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * self.rate)
                .min(self.burst),
        };
        for &(tenant, n) in demand {
            let have = refill(buckets.get(tenant));
            let need = f64::from(n).min(self.burst);
            if have < need {
                return Err((tenant, Duration::from_secs_f64((need - have) / self.rate)));
            }
        }
        if buckets.len() >= MAX_BUCKETS {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate < burst
            });
        }
        for &(tenant, n) in demand {
            let tokens = refill(buckets.get(tenant)) - f64::from(n);
            buckets.insert(tenant.to_string(), Bucket { tokens, at: now });
        }
        Ok(())
    }
}

impl TenantRateLimiter {
    /// Takes between 1 and `max` events from `tenant`'s bucket, as many as it holds; Err
    /// (with the wait) when it holds less than one. For work whose size is only known as a
    /// bound (an endpoint replay), so one call cannot run far ahead of the rate.
    pub fn take_up_to(&self, tenant: &str, max: u32, now: Instant) -> Result<u32, Duration> {
        let mut buckets = self.buckets.lock().expect("rate limiter lock");
        let have = match buckets.get(tenant) {
            None => self.burst,
            Some(b) => (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * self.rate)
                .min(self.burst),
        };
        if have < 1.0 {
            return Err(Duration::from_secs_f64((1.0 - have) / self.rate));
        }
        let n = (have.floor() as u32).clamp(1, max.max(1));
        buckets.insert(
            tenant.to_string(),
            Bucket {
                tokens: have - f64::from(n),
                at: now,
            },
        );
        Ok(n)
    }

    /// Gives back events taken but not used (an endpoint replay that found fewer).
    pub fn refund(&self, tenant: &str, n: u32) {
        let mut buckets = self.buckets.lock().expect("rate limiter lock");
        if let Some(b) = buckets.get_mut(tenant) {
            b.tokens = (b.tokens + f64::from(n)).min(self.burst);
        }
    }
}

/// Bytes of ingest request bodies admitted and not yet answered: reserved from the request
/// head (its `Content-Length`, or the route's limit for a body of unknown length) before
/// the body is read, and held while it is read, parsed and waits in the ingest queue for
/// its commit. Bounding these bounds the API's memory, whatever clients send or hold open:
/// a tenant may hold at most its share, so one tenant's uploads cannot take what others
/// need, and the process at most its total.
pub struct IngestBudget {
    process_max: usize,
    tenant_max: usize,
    /// a consumer token's share, kept apart from its tenant's (so a customer cannot use up
    /// what the producer's ingest needs)
    consumer_max: usize,
    state: Mutex<InFlight>,
    metrics: Metrics,
}

#[derive(Default)]
struct InFlight {
    total: usize,
    per_tenant: HashMap<String, usize>,
}

/// Why an upload was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetRefusal {
    /// the tenant already has its share of bytes in flight
    Tenant { in_flight: usize, share: usize },
    /// the process has its total in flight
    Process,
}

/// A reservation of body bytes; dropping it (the request answered, or abandoned) gives
/// them back.
pub struct BodyPermit {
    budget: Arc<IngestBudget>,
    tenant: Option<String>,
    bytes: usize,
}

impl IngestBudget {
    pub fn new(process_max: usize, tenant_max: usize, metrics: Metrics) -> Self {
        IngestBudget {
            process_max,
            tenant_max: tenant_max.min(process_max),
            consumer_max: DEFAULT_CONSUMER_SHARE.min(process_max),
            state: Mutex::new(InFlight::default()),
            metrics,
        }
    }

    /// Most body bytes one tenant may have in flight.
    pub fn tenant_share(&self) -> usize {
        self.tenant_max
    }

    /// Sets one consumer's share (HOOKD_CONSUMER_INFLIGHT_BYTES).
    pub fn with_consumer_share(mut self, bytes: usize) -> Self {
        self.consumer_max = bytes.clamp(1, self.process_max);
        self
    }

    /// Reserves `bytes` for what `caller` sends: a consumer token from its consumer's share
    /// (not its tenant's), a tenant credential from its tenant's, no credential from the
    /// process total only.
    pub fn try_reserve_for(
        self: &Arc<Self>,
        caller: &Caller,
        bytes: usize,
    ) -> Result<BodyPermit, BudgetRefusal> {
        match (caller.tenant_scope(), caller.consumer_scope()) {
            (Some(t), Some(c)) => {
                // a tenant name never holds a newline, so this key is no tenant's
                self.reserve_keyed(Some(format!("{t}\n{c}")), self.consumer_max, bytes)
            }
            (t, _) => self.try_reserve(t, bytes),
        }
    }

    /// Reserves `bytes` for `tenant` (`None`: no credential, only the process total
    /// applies), all or nothing.
    pub fn try_reserve(
        self: &Arc<Self>,
        tenant: Option<&str>,
        bytes: usize,
    ) -> Result<BodyPermit, BudgetRefusal> {
        self.reserve_keyed(tenant.map(str::to_owned), self.tenant_max, bytes)
    }

    fn reserve_keyed(
        self: &Arc<Self>,
        key: Option<String>,
        share: usize,
        bytes: usize,
    ) -> Result<BodyPermit, BudgetRefusal> {
        let mut s = self.state.lock().expect("ingest budget lock");
        if let Some(t) = &key {
            let held = s.per_tenant.get(t).copied().unwrap_or(0);
            if held + bytes > share {
                return Err(BudgetRefusal::Tenant {
                    in_flight: held,
                    share,
                });
            }
        }
        if s.total + bytes > self.process_max {
            return Err(BudgetRefusal::Process);
        }
        s.total += bytes;
        if let Some(t) = &key {
            *s.per_tenant.entry(t.clone()).or_default() += bytes;
        }
        self.metrics.ingest_bytes_in_flight.set(s.total as i64);
        Ok(BodyPermit {
            budget: self.clone(),
            tenant: key,
            bytes,
        })
    }

    fn release(&self, tenant: Option<&str>, bytes: usize) {
        let mut s = self.state.lock().expect("ingest budget lock");
        s.total -= bytes;
        if let Some(t) = tenant
            && let Some(held) = s.per_tenant.get_mut(t)
        {
            *held -= bytes;
            if *held == 0 {
                s.per_tenant.remove(t);
            }
        }
        self.metrics.ingest_bytes_in_flight.set(s.total as i64);
    }

    /// Bytes in flight (process, tenant), for tests.
    pub fn in_flight(&self, tenant: &str) -> (usize, usize) {
        let s = self.state.lock().expect("ingest budget lock");
        (s.total, s.per_tenant.get(tenant).copied().unwrap_or(0))
    }
}

impl BodyPermit {
    /// Keeps only `bytes` of the reservation (a body shorter than reserved).
    fn shrink_to(&mut self, bytes: usize) {
        if bytes < self.bytes {
            self.budget
                .release(self.tenant.as_deref(), self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for BodyPermit {
    fn drop(&mut self) {
        self.budget.release(self.tenant.as_deref(), self.bytes);
    }
}

/// An ingest request admitted on its head: its body bytes reserved and, with a credential
/// and a rate limit, one event of its tenant's rate taken. Held until the response.
pub struct Admitted {
    _permit: BodyPermit,
    limit: usize,
    /// the tenant one event was already taken from
    charged: Option<String>,
}

impl AppState {
    /// Admits an ingest request from its head alone, before any of its body is read: 413
    /// when the declared `Content-Length` is over `limit`; 429 when the caller's tenant is
    /// over its rate (one event is taken now) or already has its share of body bytes in
    /// flight; 503 when the process has its total in flight. A body of unknown length
    /// reserves the whole `limit` until it has been read.
    pub(crate) fn admit_upload(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        limit: usize,
    ) -> Result<Admitted, ApiError> {
        self.admit_upload_on(&self.ingest_budget, caller, headers, limit)
    }

    /// [`AppState::admit_upload`] for `POST /in/{name}`, before its signature is checked:
    /// from the inbound budget, a quarter of the process's, so requests nobody has to sign
    /// can never hold the bytes producers' ingest needs; `caller` is the source (its own
    /// share and rate bucket, see `api::inbound`).
    pub(crate) fn admit_inbound(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        limit: usize,
    ) -> Result<Admitted, ApiError> {
        self.admit_upload_on(&self.inbound_budget, caller, headers, limit)
    }

    fn admit_upload_on(
        &self,
        budget: &Arc<IngestBudget>,
        caller: &Caller,
        headers: &HeaderMap,
        limit: usize,
    ) -> Result<Admitted, ApiError> {
        let tenant = caller.tenant_scope();
        let declared = match headers.get(header::CONTENT_LENGTH) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|v| v.parse::<usize>().ok())
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            ErrorCode::InvalidContentLength,
                            "Content-Length is not a number",
                        )
                    })?,
            ),
        };
        let limit = limit.min(budget.tenant_share());
        if let Some(n) = declared
            && n > limit
        {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::BodyTooLarge,
                format!("request body is {n} bytes; the limit is {limit}"),
            ));
        }
        let permit = budget
            .try_reserve(tenant, declared.unwrap_or(limit))
            .map_err(|refusal| match refusal {
                BudgetRefusal::Tenant { in_flight, share } => {
                    self.count_refusal("tenant_bytes");
                    ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        ErrorCode::TenantIngestBusy,
                        format!(
                            "tenant {:?} has {in_flight} bytes of requests in flight and may have {share}; nothing was written, retry after 1 s",
                            tenant.unwrap_or_default()
                        ),
                    )
                    .with_retry_after(1)
                }
                BudgetRefusal::Process => {
                    self.count_refusal("process_bytes");
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        ErrorCode::IngestBusy,
                        "this API replica has as many request bytes in flight as it may hold; nothing was written, retry after 1 s",
                    )
                }
            })?;
        // after the bytes, so a request refused for its bytes costs no rate
        let mut charged = None;
        if let (Some(t), Some(limiter)) = (tenant, &self.rate_limiter) {
            limiter
                .admit(&[(t, 1)], Instant::now())
                .map_err(|(t, wait)| {
                    self.metrics.rate_limited_events.inc();
                    self.count_refusal("rate_limited");
                    ApiError::rate_limited(t, wait)
                })?;
            charged = Some(t.to_string());
        }
        Ok(Admitted {
            _permit: permit,
            limit: declared.unwrap_or(limit),
            charged,
        })
    }

    /// Reads the JSON body of a request on a route other than the ingest ones, within the
    /// same per-process budget of bytes in flight: the bytes are reserved from the request
    /// head (its Content-Length, or `limit` when unknown) before any is read, from the
    /// caller's share (a consumer's own, a tenant's, or only the process total), and given
    /// back once parsed. Held connections on these routes thus cost at most the budget.
    /// `empty_ok`: an empty body (no bytes) reads as `{}`. A body of whitespace is not
    /// empty: it is not JSON, and accepting it would let a client's broken encoder pass.
    pub(crate) async fn read_json_body<T: serde::de::DeserializeOwned>(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        body: Body,
        limit: usize,
        empty_ok: bool,
    ) -> Result<T, ApiError> {
        let bytes = self.read_body(caller, headers, body, limit).await?;
        if empty_ok && bytes.is_empty() {
            return super::body::parse(b"{}");
        }
        super::body::require_json(headers)?;
        super::body::parse(&bytes)
    }

    /// The raw body of a non-ingest request, read within the budget (see
    /// [`AppState::read_json_body`]).
    pub(crate) async fn read_body(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        body: Body,
        limit: usize,
    ) -> Result<bytes::Bytes, ApiError> {
        let declared = match headers.get(header::CONTENT_LENGTH) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|v| v.parse::<usize>().ok())
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            ErrorCode::InvalidContentLength,
                            "Content-Length is not a number",
                        )
                    })?,
            ),
        };
        if let Some(n) = declared
            && n > limit
        {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::BodyTooLarge,
                format!("request body is {n} bytes; the limit is {limit}"),
            ));
        }
        if declared == Some(0) {
            return Ok(bytes::Bytes::new());
        }
        let reserve = declared.unwrap_or(limit);
        let mut permit = self
            .ingest_budget
            .try_reserve_for(caller, reserve)
            .map_err(|refusal| self.budget_refused(caller, refusal))?;
        let bytes = super::body::read_limited(body, reserve).await?;
        permit.shrink_to(bytes.len());
        Ok(bytes)
    }

    fn budget_refused(&self, caller: &Caller, refusal: BudgetRefusal) -> ApiError {
        match (refusal, caller.consumer_scope()) {
            (BudgetRefusal::Tenant { in_flight, share }, Some(c)) => {
                self.count_refusal("consumer_bytes");
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::ConsumerRequestsBusy,
                    format!(
                        "consumer {c:?} has {in_flight} bytes of requests in flight and may have {share}; nothing was written, retry after 1 s"
                    ),
                )
                .with_retry_after(1)
            }
            (BudgetRefusal::Tenant { in_flight, share }, None) => {
                self.count_refusal("tenant_bytes");
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::TenantIngestBusy,
                    format!(
                        "tenant {:?} has {in_flight} bytes of requests in flight and may have {share}; nothing was written, retry after 1 s",
                        caller.tenant_scope().unwrap_or_default()
                    ),
                )
                .with_retry_after(1)
            }
            (BudgetRefusal::Process, _) => {
                self.count_refusal("process_bytes");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::IngestBusy,
                    "this API replica has as many request bytes in flight as it may hold; nothing was written, retry after 1 s",
                )
            }
        }
    }

    /// Takes one read from a consumer token's own read bucket (any other caller reads
    /// freely): a consumer reading in a loop was answered as fast as the API could, and cut
    /// the producer's ingest to a sixth on two cores (nothing was refused; the CPU was
    /// shared).
    pub(crate) fn admit_read(&self, caller: &Caller) -> Result<(), ApiError> {
        let (Some(t), Some(c)) = (caller.tenant_scope(), caller.consumer_scope()) else {
            return Ok(());
        };
        self.admit_consumer(ConsumerBucket::Reads, t, c, 1)
    }

    /// Takes the rate of work a request causes. A consumer token's work (test events,
    /// replays, endpoint changes: at least one unit each) comes from its consumer's own
    /// bucket, never from the tenant's: a customer can then never get the producer's
    /// events refused. A tenant credential's `sends` (test events, replays) come from the
    /// tenant's ingest rate, as before.
    pub(crate) fn admit_work(&self, caller: &Caller, sends: u32) -> Result<(), ApiError> {
        match (caller.tenant_scope(), caller.consumer_scope()) {
            (Some(t), Some(c)) => self.admit_consumer(ConsumerBucket::Work, t, c, sends.max(1)),
            (Some(t), None) if sends > 0 => self.admit(&[(t, sends)]),
            _ => Ok(()),
        }
    }

    /// Takes between 1 and `max` sends for a replay of unknown size (see
    /// [`TenantRateLimiter::take_up_to`]) from the caller's bucket (a consumer's own, or
    /// its tenant's when there is a tenant rate limit); returns what to give back with
    /// [`AppState::refund_work`] and the most it may replay.
    pub(crate) fn take_work_up_to(
        &self,
        caller: &Caller,
        max: u32,
    ) -> Result<Option<(Arc<TenantRateLimiter>, String, u32)>, ApiError> {
        let (limiter, key, consumer) = match (caller.tenant_scope(), caller.consumer_scope()) {
            (Some(t), Some(c)) => (self.consumer_rate.clone(), format!("{t}\n{c}"), Some(c)),
            (Some(t), None) => match &self.rate_limiter {
                Some(l) => (l.clone(), t.to_owned(), None),
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        let took =
            limiter
                .take_up_to(&key, max, Instant::now())
                .map_err(|wait| match consumer {
                    Some(c) => self.consumer_refusal(ConsumerBucket::Work, c, wait),
                    None => ApiError::rate_limited(caller.tenant_scope().unwrap_or_default(), wait),
                })?;
        Ok(Some((limiter, key, took)))
    }

    /// Takes `n` from consumer `c` (of tenant `t`)'s own `bucket`.
    fn admit_consumer(
        &self,
        bucket: ConsumerBucket,
        t: &str,
        c: &str,
        n: u32,
    ) -> Result<(), ApiError> {
        let limiter = match bucket {
            ConsumerBucket::Work => &self.consumer_rate,
            ConsumerBucket::Reads => &self.consumer_reads,
        };
        let key = format!("{t}\n{c}");
        limiter
            .admit(&[(key.as_str(), n)], Instant::now())
            .map_err(|(_, wait)| self.consumer_refusal(bucket, c, wait))
    }

    /// 429 for consumer `c` over its own rate in `bucket`, counted in the metrics.
    fn consumer_refusal(&self, bucket: ConsumerBucket, c: &str, wait: Duration) -> ApiError {
        let (code, setting, what, note) = match bucket {
            ConsumerBucket::Work => (
                ErrorCode::ConsumerRateLimited,
                "HOOKD_CONSUMER_RATE_LIMIT",
                "rate limit",
                "nothing was done, ",
            ),
            ConsumerBucket::Reads => (
                ErrorCode::ConsumerReadRateLimited,
                "HOOKD_CONSUMER_READ_RATE_LIMIT",
                "read rate limit",
                "",
            ),
        };
        self.count_refusal(code.as_str());
        let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            code,
            format!("consumer {c:?} is over its {what} ({setting}); {note}retry after {secs} s"),
        )
        .with_retry_after(secs)
    }

    fn count_refusal(&self, reason: &'static str) {
        self.metrics
            .ingest_refused
            .get_or_create(&crate::metrics::Reason { reason })
            .inc();
    }
}

/// A consumer's own rate buckets: the work its token causes, and its reads.
#[derive(Debug, Clone, Copy)]
enum ConsumerBucket {
    Work,
    Reads,
}

impl Admitted {
    /// Reads the body, at most the bytes reserved for it (413 past them); a body shorter
    /// than reserved gives the rest back at once.
    pub async fn read(&mut self, body: Body) -> Result<bytes::Bytes, ApiError> {
        let bytes = super::body::read_limited(body, self.limit).await?;
        self._permit.shrink_to(bytes.len());
        Ok(bytes)
    }

    /// Enqueues `messages`, holding this admission until the committer has answered: the
    /// wait runs in its own task, so a request cut off by the deadline (408) or a client
    /// that goes away still counts its bytes while they sit in the ingest queue. The queue
    /// is thereby bounded in bytes by the process budget, not only in jobs.
    pub async fn enqueue(
        self,
        state: &AppState,
        messages: Vec<crate::outbox::NewMessage>,
    ) -> Result<Vec<crate::outbox::Enqueued>, ApiError> {
        Ok(self.enqueue_outcome(state, messages).await??)
    }

    /// [`Admitted::enqueue`] with the outbox's own refusal, for a route that answers one
    /// of them differently (inbound: a reused key is a duplicate, not a conflict).
    pub async fn enqueue_outcome(
        self,
        state: &AppState,
        messages: Vec<crate::outbox::NewMessage>,
    ) -> Result<Result<Vec<crate::outbox::Enqueued>, crate::outbox::EnqueueError>, ApiError> {
        let outbox = state.outbox.clone();
        let committed = tokio::spawn(async move {
            let result = outbox.enqueue(messages).await;
            drop(self);
            result
        });
        committed.await.map_err(|e| {
            tracing::error!(error = %e, "enqueue task failed");
            ApiError::internal()
        })
    }

    /// Admits the request's events under the rate limit, less the one taken on its head.
    pub fn admit_events(&self, state: &AppState, demand: &[(&str, u32)]) -> Result<(), ApiError> {
        let rest: Vec<(&str, u32)> = demand
            .iter()
            .map(|&(t, n)| match &self.charged {
                Some(c) if c == t => (t, n.saturating_sub(1)),
                _ => (t, n),
            })
            .filter(|d| d.1 > 0)
            .collect();
        if rest.is_empty() {
            return Ok(());
        }
        state.admit(&rest).inspect_err(|_| {
            // All or none: the event taken on the head goes back, or a client retrying a
            // batch larger than what the bucket holds would drain it one head at a time
            // and never be admitted.
            if let (Some(t), Some(limiter)) = (&self.charged, &state.rate_limiter) {
                limiter.refund(t, 1);
                state.metrics.rate_limited_events.inc();
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_refill_at_the_rate_and_batches_take_debt() {
        let l = TenantRateLimiter::new(10.0);
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(l.admit(&[("a", 1)], t0).is_ok());
        }
        let (who, wait) = l.admit(&[("a", 1)], t0).unwrap_err();
        assert_eq!(who, "a");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // other tenants are unaffected
        assert!(l.admit(&[("b", 1)], t0).is_ok());
        // 100 ms later one more event fits
        let t1 = t0 + Duration::from_millis(100);
        assert!(l.admit(&[("a", 1)], t1).is_ok());
        assert!(l.admit(&[("a", 1)], t1).is_err());
        // a batch of 30 is admitted into a full bucket and leaves 2 s of debt
        let t2 = t1 + Duration::from_secs(5);
        assert!(l.admit(&[("a", 30)], t2).is_ok());
        let (_, wait) = l.admit(&[("a", 1)], t2).unwrap_err();
        assert!((wait.as_secs_f64() - 2.1).abs() < 1e-6, "{wait:?}");
        // all or none: b's events are not taken when a is refused
        assert!(l.admit(&[("b", 10), ("a", 50)], t2).is_err());
        assert!(l.admit(&[("b", 10)], t2).is_ok());
    }

    #[test]
    fn a_fractional_rate_still_admits_single_events() {
        let l = TenantRateLimiter::new(0.5);
        let t0 = Instant::now();
        assert!(l.admit(&[("a", 1)], t0).is_ok());
        let (_, wait) = l.admit(&[("a", 1)], t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(2));
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn tenant_share_and_process_total_bound_bytes_in_flight() {
        let b = Arc::new(IngestBudget::new(100, 40, Metrics::new()));
        let a1 = b.try_reserve(Some("a"), 30).unwrap();
        assert_eq!(
            b.try_reserve(Some("a"), 11).err(),
            Some(BudgetRefusal::Tenant {
                in_flight: 30,
                share: 40
            })
        );
        let _b1 = b.try_reserve(Some("b"), 40).unwrap();
        let mut anon = b.try_reserve(None, 30).unwrap();
        assert_eq!(
            b.try_reserve(Some("c"), 1).err(),
            Some(BudgetRefusal::Process)
        );
        anon.shrink_to(10);
        assert_eq!(b.in_flight("a"), (80, 30));
        let c = b.try_reserve(Some("c"), 20).unwrap();
        drop(a1);
        drop(c);
        assert_eq!(b.in_flight("a"), (50, 0));
        assert!(b.try_reserve(Some("a"), 40).is_ok());
    }

    #[test]
    fn replays_take_what_the_bucket_holds() {
        let l = TenantRateLimiter::new(5.0);
        let t0 = Instant::now();
        assert_eq!(l.take_up_to("a", 1000, t0), Ok(5));
        assert!(l.take_up_to("a", 1000, t0).is_err());
        l.refund("a", 2);
        assert_eq!(l.take_up_to("a", 1, t0), Ok(1));
        assert_eq!(l.take_up_to("a", 1000, t0), Ok(1));
        assert!(l.take_up_to("a", 1000, t0).is_err());
    }
}
