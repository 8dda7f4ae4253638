//! `/v1/messages`: enqueue (single and batch) and read back.

use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;
use uuid::Uuid;

use super::body::{ObjectOnly, parse, require_json};
use super::caller::Caller;
use super::error::ApiError;
use super::openapi::{any_json_but_null, responses};
use super::{AppState, Limits, path_id};
use crate::auth::{Principal, Scope, Subject};
use crate::db;
use crate::domain::ErrorCode;
use crate::domain::{self, DeliveryStatus};
use crate::outbox::{Enqueued, NewMessage};

/// One event to enqueue. Unknown fields are refused (422): a misspelt `idempotencyKey`
/// silently ignored would turn a producer's safe retry into a duplicate event.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MessageIn {
    /// The tenant; with authentication on it comes from the credential, and naming
    /// another tenant is a 403. Required when authentication is off.
    #[schema(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    tenant: Option<String>,
    /// Dot-separated segments of letters, digits, `_` and `-`, e.g. `invoice.paid`
    #[schema(
        value_type = String,
        required = true,
        pattern = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$",
        max_length = 128
    )]
    event_type: Option<String>,
    #[schema(schema_with = any_json_but_null, required = true)]
    payload: Option<Box<RawValue>>,
    /// A repeat with the same key returns the original ids and writes nothing
    #[schema(pattern = r"^[!-~]{1,255}$")]
    idempotency_key: Option<String>,
    /// The consumer (customer) the event is for: it reaches only that consumer's
    /// endpoints subscribed to its type. Without it, only the tenant's endpoints without a
    /// consumer. An unknown consumer reaches nobody (201 with no deliveries).
    #[schema(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    consumer: Option<String>,
    /// Endpoints that order by key (`ordering: perKey`) are sent the deliveries of one key
    /// one at a time, in the order their events committed; other endpoints ignore it.
    /// 1-256 characters without control characters, e.g. an order or account id.
    #[schema(min_length = 1, max_length = 256)]
    ordering_key: Option<String>,
    /// Check the message against the tenant's event-type catalog (`/v1/event-types`)
    /// before anything is written: its type must be declared (else 422
    /// `unknown_event_type`) and, when the type has a schema, the payload must match it
    /// (else 422 `schema_violation`, naming the path that failed). A deprecated type is
    /// taken, with a `Warning` header. Default false.
    validate: Option<bool>,
}

/// Several events, committed in one transaction (all or none).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchIn {
    /// 1 to HOOKD_MAX_BATCH (default 100) messages
    #[schema(min_items = 1, value_type = Vec<MessageIn>)]
    messages: Vec<ObjectOnly<MessageIn>>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnqueuedOut {
    event_id: Uuid,
    /// one per subscribed endpoint of the tenant (possibly none)
    delivery_ids: Vec<Uuid>,
    /// Only when `deliveryIds` is empty: why nothing will be sent (no endpoint of the
    /// tenant, or of the consumer, subscribes to the event type)
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<String>,
}

/// What a 201 with no delivery means: the event is stored, and nobody will receive it. A
/// typo in the event type or the consumer otherwise looks exactly like success.
fn no_delivery_hint(delivery_ids: &[Uuid], m: &Addressed) -> Option<String> {
    if !delivery_ids.is_empty() {
        return None;
    }
    let Addressed {
        tenant,
        event_type,
        consumer,
    } = m;
    let whose = match consumer {
        Some(c) => format!("consumer {c:?} of tenant {tenant:?}"),
        None => format!(
            "tenant {tenant:?} without a consumer (an event naming \"consumer\" reaches that consumer's endpoints instead)"
        ),
    };
    Some(format!(
        "no endpoint of {whose} subscribes to event type {event_type:?}: the event is stored, and nothing will be delivered"
    ))
}

/// Who a message is for, kept for [`no_delivery_hint`] (the message itself, payload and
/// all, goes to the committer).
struct Addressed {
    tenant: String,
    event_type: String,
    consumer: Option<String>,
}

impl From<&NewMessage> for Addressed {
    fn from(m: &NewMessage) -> Self {
        Addressed {
            tenant: m.tenant.clone(),
            event_type: m.event_type.clone(),
            consumer: m.consumer.clone(),
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchResultOut {
    event_id: Uuid,
    delivery_ids: Vec<Uuid>,
    /// false when the idempotency key was already known and the original ids are returned
    created: bool,
    /// Only when `deliveryIds` is empty: why nothing will be sent
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<String>,
}

/// One result per message, in input order.
#[derive(Serialize, ToSchema)]
pub struct BatchOut {
    results: Vec<BatchResultOut>,
}

/// With traces on (`telemetry`): the span of one enqueue request, a child of the
/// producer's trace context, which becomes the messages' own, so each delivery's
/// `hookd.send` (and the receiver) descends from it. `None`, and nothing done, when off.
fn ingest_span(messages: &mut [NewMessage]) -> Option<tracing::Span> {
    if !crate::telemetry::enabled() {
        return None;
    }
    let first = messages.first()?;
    let span = tracing::info_span!(
        target: crate::telemetry::TARGET,
        "hookd.ingest",
        hookd.tenant = %first.tenant,
        hookd.messages = messages.len(),
        hookd.event_id = tracing::field::Empty,
    );
    crate::telemetry::set_parent(&span, first.trace.as_ref());
    if let Some(own) = crate::telemetry::context_of(&span) {
        for m in messages.iter_mut() {
            m.trace = Some(own.clone());
        }
    }
    Some(span)
}

/// A message and whether its producer asked for it to be checked against the catalog.
type Validated = (NewMessage, bool);

fn validate(
    m: MessageIn,
    caller: &Caller,
    header_key: Option<&str>,
    max_payload: usize,
    prefix: &str,
) -> Result<Validated, ApiError> {
    let tenant = caller.resolve_tenant(m.tenant).map_err(|mut e| {
        e.message = format!("{prefix}{}", e.message);
        e
    })?;
    let tenant = tenant.ok_or_else(|| {
        ApiError::unprocessable(
            ErrorCode::MissingField,
            format!("{prefix}tenant is required"),
        )
    })?;
    domain::validate_tenant(&tenant)
        .map_err(|e| ApiError::unprocessable(ErrorCode::InvalidTenant, format!("{prefix}{e}")))?;
    let event_type = m.event_type.ok_or_else(|| {
        ApiError::unprocessable(
            ErrorCode::MissingField,
            format!("{prefix}eventType is required"),
        )
    })?;
    domain::validate_event_type(&event_type).map_err(|e| {
        ApiError::unprocessable(ErrorCode::InvalidEventType, format!("{prefix}{e}"))
    })?;
    domain::check_not_reserved(&event_type).map_err(|e| {
        ApiError::unprocessable(ErrorCode::ReservedEventType, format!("{prefix}{e}"))
    })?;
    let payload = m.payload.ok_or_else(|| {
        ApiError::unprocessable(
            ErrorCode::MissingField,
            format!("{prefix}payload is required (any JSON value but null)"),
        )
    })?;
    let payload = payload.get();
    if payload.len() > max_payload {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!(
                "{prefix}payload is {} bytes; the limit is {max_payload}",
                payload.len()
            ),
        ));
    }
    let idempotency_key = match (m.idempotency_key, header_key) {
        (Some(f), Some(h)) if f != h => {
            return Err(ApiError::unprocessable(
                ErrorCode::IdempotencyKeyMismatch,
                "the Idempotency-Key header and the idempotencyKey field differ",
            ));
        }
        (Some(k), _) => Some(k),
        (None, h) => h.map(str::to_owned),
    };
    if let Some(k) = &idempotency_key {
        domain::validate_idempotency_key(k).map_err(|e| {
            ApiError::unprocessable(ErrorCode::InvalidIdempotencyKey, format!("{prefix}{e}"))
        })?;
    }
    let consumer = caller.resolve_consumer(m.consumer).map_err(|mut e| {
        e.message = format!("{prefix}{}", e.message);
        e
    })?;
    if let Some(c) = &consumer {
        domain::validate_consumer(c).map_err(|e| {
            ApiError::unprocessable(ErrorCode::InvalidConsumer, format!("{prefix}{e}"))
        })?;
    }
    if let Some(k) = &m.ordering_key {
        domain::validate_ordering_key(k).map_err(|e| {
            ApiError::unprocessable(ErrorCode::InvalidOrderingKey, format!("{prefix}{e}"))
        })?;
    }
    Ok((
        NewMessage {
            tenant,
            event_type,
            // RawValue holds the producer's exact text: stored and signed byte for byte
            payload: payload.to_owned(),
            idempotency_key,
            consumer,
            origin: None,
            // the request's, set by the route (a body carries none)
            trace: None,
            ordering_key: m.ordering_key,
        },
        m.validate.unwrap_or(false),
    ))
}

/// Checks the messages whose producer asked for it against the catalog (one read of the
/// types' versions per tenant; schemas compiled once per version and process), before
/// anything is written. Returns a `Warning` header value per deprecated type (at most 10).
async fn check_catalog(
    state: &AppState,
    messages: &[NewMessage],
    checked: &[bool],
    batch: bool,
) -> Result<Vec<HeaderValue>, ApiError> {
    let to_check: Vec<crate::catalog::ToCheck<'_>> = messages
        .iter()
        .zip(checked)
        .enumerate()
        .filter(|(_, (_, c))| **c)
        .map(|(index, (m, _))| crate::catalog::ToCheck {
            index,
            tenant: &m.tenant,
            event_type: &m.event_type,
            payload: &m.payload,
        })
        .collect();
    if to_check.is_empty() {
        return Ok(Vec::new());
    }
    let deprecated = crate::catalog::check(&state.pool, &state.schemas, &to_check)
        .await
        .map_err(|e| super::error::catalog_refusal(e, batch))?;
    let mut names: Vec<(String, Option<String>)> = Vec::new();
    for d in deprecated {
        if !names.iter().any(|(n, _)| *n == d.event_type) {
            names.push((d.event_type, d.note));
        }
    }
    Ok(names
        .into_iter()
        .take(10)
        .filter_map(|(name, note)| deprecation_warning(&name, note.as_deref()))
        .collect())
}

/// A `Warning: 299 - "..."` value (the form Kubernetes uses for deprecated APIs) saying that
/// `name` is deprecated, with its note reduced to what a quoted header string holds.
fn deprecation_warning(name: &str, note: Option<&str>) -> Option<HeaderValue> {
    let mut text = format!("event type {name} is deprecated");
    if let Some(note) = note {
        text.push_str(": ");
        text.extend(
            note.chars()
                .take(200)
                .map(|c| if (' '..='~').contains(&c) { c } else { '?' }),
        );
    }
    let quoted = text.replace('\\', "\\\\").replace('"', "\\\"");
    HeaderValue::from_str(&format!("299 - \"{quoted}\"")).ok()
}

/// The body of `POST /v1/messages`: parsed and validated, before rate limiting and the
/// database.
fn parse_single(
    bytes: &[u8],
    caller: &Caller,
    header_key: Option<&str>,
    limits: &Limits,
) -> Result<Validated, ApiError> {
    let input: MessageIn = parse(bytes)?;
    validate(input, caller, header_key, limits.max_payload_bytes, "")
}

/// The body of `POST /v1/messages/batch`: parsed, its size checked, every message
/// validated, before rate limiting and the database.
fn parse_batch(bytes: &[u8], caller: &Caller, limits: &Limits) -> Result<Vec<Validated>, ApiError> {
    let input: BatchIn = parse(bytes)?;
    if input.messages.is_empty() {
        return Err(ApiError::unprocessable(
            ErrorCode::EmptyBatch,
            "messages must not be empty",
        ));
    }
    if input.messages.len() > limits.max_batch {
        return Err(ApiError::unprocessable(
            ErrorCode::BatchTooLarge,
            format!(
                "batch has {} messages; at most {} are allowed",
                input.messages.len(),
                limits.max_batch
            ),
        ));
    }
    input
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, ObjectOnly(m))| {
            validate(
                m,
                caller,
                None,
                limits.max_payload_bytes,
                &format!("messages[{i}]: "),
            )
        })
        .collect()
}

/// Which ingest route a body is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngestRoute {
    /// `POST /v1/messages`
    Single,
    /// `POST /v1/messages/batch`
    Batch,
}

/// What the ingest routes do with the body bytes once the caller is authenticated and the
/// body is read: parse, check the batch size and validate every message, exactly as the
/// handlers do (they call the same functions). `tenant` is the credential's tenant (`None`:
/// `HOOKD_AUTH=none`); `header_key` is an `Idempotency-Key` header (single route only).
/// Used by the fuzz targets (`fuzz/fuzz_targets/ingest.rs`), which have no database or
/// credential; the caller built here is never seen by anything but `validate`.
pub fn parse_ingest_body(
    route: IngestRoute,
    bytes: &[u8],
    tenant: Option<&str>,
    header_key: Option<&str>,
    limits: &Limits,
) -> Result<Vec<NewMessage>, ApiError> {
    let caller = match tenant {
        None => Caller::Anonymous,
        Some(t) => Caller::Authenticated(Principal {
            tenant: t.to_owned(),
            consumer: None,
            consumer_generation: None,
            consumer_since: None,
            scopes: vec![Scope::Produce],
            subject: Subject::Token { id: Uuid::nil() },
        }),
    };
    match route {
        IngestRoute::Single => {
            parse_single(bytes, &caller, header_key, limits).map(|(m, _)| vec![m])
        }
        IngestRoute::Batch => {
            parse_batch(bytes, &caller, limits).map(|v| v.into_iter().map(|(m, _)| m).collect())
        }
    }
}

fn header_idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(v) => v.to_str().map(Some).map_err(|_| {
            ApiError::unprocessable(
                ErrorCode::InvalidIdempotencyKey,
                "Idempotency-Key header is not ASCII",
            )
        }),
    }
}

/// POST /v1/messages
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "messages",
    operation_id = "createMessage",
    summary = "Enqueue one event (scope: produce)",
    description = "Answers only after the event and one delivery per subscribed endpoint of the \
        tenant are committed. A repeat of an idempotency key answers 200 with the original ids.",
    params(
        ("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Same as the idempotencyKey field; if both are given they must be equal"),
    ),
    request_body(content = MessageIn, content_type = "application/json"),
    responses(
        (status = 201, description = "Committed", body = EnqueuedOut, links(
            ("getMessage" = (operation_id = "getMessage", parameters(("id" = "$response.body#/eventId")), description = "The event just enqueued")),
            ("getDelivery" = (operation_id = "getDelivery", parameters(("id" = "$response.body#/deliveryIds/0")), description = "Its first delivery, if any endpoint subscribes")),
        )),
        (status = 200, description = "A repeat of a known idempotency key: the original ids; nothing was written", body = EnqueuedOut, links(
            ("getMessage" = (operation_id = "getMessage", parameters(("id" = "$response.body#/eventId")), description = "The original event")),
        )),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 409, response = responses::Conflict),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    caller: Caller,
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Produce)?;
    require_json(&headers)?;
    let mut admitted = state.admit_upload(&caller, &headers, state.limits.max_body_bytes)?;
    let bytes = admitted.read(body).await?;
    let (mut msg, checked) = parse_single(
        &bytes,
        &caller,
        header_idempotency_key(&headers)?,
        &state.limits,
    )?;
    drop(bytes);
    msg.trace = crate::domain::TraceContext::from_headers(&headers);
    let span = ingest_span(std::slice::from_mut(&mut msg));
    admitted.admit_events(&state, &[(msg.tenant.as_str(), 1)])?;
    let warnings = check_catalog(&state, std::slice::from_ref(&msg), &[checked], false).await?;
    let described = Addressed::from(&msg);
    let started = Instant::now();
    let result = admitted.enqueue(&state, vec![msg]).await?;
    state
        .metrics
        .ingest_commit_seconds
        .observe(started.elapsed().as_secs_f64());
    let Enqueued {
        event_id,
        delivery_ids,
        created,
    } = result.into_iter().next().expect("one result per message");
    if let Some(span) = &span {
        span.record("hookd.event_id", tracing::field::display(event_id));
    }
    if created {
        state.metrics.count_enqueued(delivery_ids.len());
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        with_warnings(warnings),
        Json(EnqueuedOut {
            event_id,
            hint: no_delivery_hint(&delivery_ids, &described),
            delivery_ids,
        }),
    )
        .into_response())
}

fn with_warnings(warnings: Vec<HeaderValue>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for w in warnings {
        headers.append(axum::http::header::WARNING, w);
    }
    headers
}

/// POST /v1/messages/batch
#[utoipa::path(
    post,
    path = "/v1/messages/batch",
    tag = "messages",
    operation_id = "createMessageBatch",
    summary = "Enqueue several events in one transaction (scope: produce)",
    description = "All messages are committed together or none is. Idempotency keys go in each \
        message; an Idempotency-Key header is refused (422). Each message counts against the \
        tenant's rate limit.",
    request_body(content = BatchIn, content_type = "application/json"),
    responses(
        (status = 201, description = "Committed (at least one message was new)", body = BatchOut, links(
            ("getMessage" = (operation_id = "getMessage", parameters(("id" = "$response.body#/results/0/eventId")), description = "The first event of the batch")),
        )),
        (status = 200, description = "Every message repeated a known idempotency key; nothing was written", body = BatchOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 409, response = responses::Conflict),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn create_batch(
    caller: Caller,
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Produce)?;
    require_json(&headers)?;
    if headers.contains_key("idempotency-key") {
        return Err(ApiError::unprocessable(
            ErrorCode::IdempotencyKeyHeaderOnBatch,
            "a batch takes idempotencyKey per message, not an Idempotency-Key header",
        ));
    }
    let mut admitted = state.admit_upload(&caller, &headers, state.limits.max_batch_body_bytes)?;
    let bytes = admitted.read(body).await?;
    let (mut messages, checked): (Vec<NewMessage>, Vec<bool>) =
        parse_batch(&bytes, &caller, &state.limits)?
            .into_iter()
            .unzip();
    drop(bytes);
    // one request, one trace context: every message of a batch carries it
    let trace = crate::domain::TraceContext::from_headers(&headers);
    for m in &mut messages {
        m.trace = trace.clone();
    }
    // held to the answer: the span ends with the request
    let _span = ingest_span(&mut messages);
    let mut demand: Vec<(&str, u32)> = Vec::new();
    for m in &messages {
        match demand.iter_mut().find(|d| d.0 == m.tenant) {
            Some(d) => d.1 += 1,
            None => demand.push((&m.tenant, 1)),
        }
    }
    admitted.admit_events(&state, &demand)?;
    let warnings = check_catalog(&state, &messages, &checked, true).await?;
    let described: Vec<Addressed> = messages.iter().map(Addressed::from).collect();
    let started = Instant::now();
    let results = admitted.enqueue(&state, messages).await?;
    state
        .metrics
        .ingest_commit_seconds
        .observe(started.elapsed().as_secs_f64());
    let any_created = results.iter().any(|r| r.created);
    for r in results.iter().filter(|r| r.created) {
        state.metrics.count_enqueued(r.delivery_ids.len());
    }
    let out = BatchOut {
        results: results
            .into_iter()
            .zip(&described)
            .map(|(r, m)| BatchResultOut {
                event_id: r.event_id,
                hint: no_delivery_hint(&r.delivery_ids, m),
                delivery_ids: r.delivery_ids,
                created: r.created,
            })
            .collect(),
    };
    let status = if any_created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, with_warnings(warnings), Json(out)).into_response())
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliverySummary {
    pub delivery_id: Uuid,
    pub endpoint_id: Uuid,
    pub status: DeliveryStatus,
    /// attempts since enqueue or the last replay (the same number as `attemptCount`)
    pub attempts: i32,
    /// `attempts` under the name `GET /v1/deliveries/{id}` uses, where `attempts` is the
    /// attempt log
    pub attempt_count: i32,
    /// when the next attempt is due (pending and failed deliveries only; none while it
    /// waits in its ordering key's line behind an earlier delivery)
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_status_code: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
}

impl From<db::deliveries::DeliveryRow> for DeliverySummary {
    fn from(d: db::deliveries::DeliveryRow) -> Self {
        let waiting = d.status.is_waiting() && d.visible_at < db::deliveries::ordering_waiting();
        DeliverySummary {
            delivery_id: d.id,
            endpoint_id: d.endpoint_id,
            attempts: d.attempts,
            attempt_count: d.attempts,
            next_attempt_at: waiting.then_some(d.visible_at),
            status: d.status,
            last_status_code: d.last_status_code,
            last_error: d.last_error,
            created_at: d.created_at,
            completed_at: d.completed_at,
        }
    }
}

/// An event as stored, with each of its deliveries.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageOut {
    event_id: Uuid,
    tenant: String,
    event_type: String,
    /// the payload exactly as it was sent
    #[schema(schema_with = any_json_but_null)]
    payload: Box<RawValue>,
    idempotency_key: Option<String>,
    /// the consumer the event was addressed to, if any
    consumer: Option<String>,
    /// the key endpoints that order by key send its deliveries in line with
    #[serde(skip_serializing_if = "Option::is_none")]
    ordering_key: Option<String>,
    created_at: DateTime<Utc>,
    /// the inbound source that took it; absent for a produced event
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    /// the provider's own id of the event, when its source took one
    #[serde(skip_serializing_if = "Option::is_none")]
    source_event_id: Option<String>,
    deliveries: Vec<DeliverySummary>,
}

/// GET /v1/messages/{id}
#[utoipa::path(
    get,
    path = "/v1/messages/{id}",
    tag = "messages",
    operation_id = "getMessage",
    summary = "An event and its deliveries (scope: read)",
    params(("id" = Uuid, Path, description = "The eventId")),
    responses(
        (status = 200, description = "The event", body = MessageOut, links(
            ("getDelivery" = (operation_id = "getDelivery", parameters(("id" = "$response.body#/deliveries/0/deliveryId")), description = "Its first delivery")),
            ("replayEndpoint" = (operation_id = "replayEndpoint", parameters(("id" = "$response.body#/deliveries/0/endpointId")), description = "The endpoint of its first delivery")),
        )),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let id = path_id(id, "message")?;
    let event = db::events::get(&state.pool, id, caller.audience())
        .await?
        .ok_or_else(|| ApiError::not_found("message"))?;
    let deliveries = db::deliveries::for_event(&state.pool, id).await?;
    // The stored text was validated as JSON on the way in, so this cannot fail unless the
    // row was edited by hand.
    let payload = RawValue::from_string(event.payload).map_err(|e| {
        tracing::error!(error = %e, event = %id, "stored payload is not JSON");
        ApiError::internal()
    })?;
    Ok(Json(MessageOut {
        event_id: event.id,
        tenant: event.tenant,
        event_type: event.event_type,
        payload,
        idempotency_key: event.idempotency_key,
        consumer: event.consumer,
        ordering_key: event.ordering_key,
        created_at: event.created_at,
        source: event.source,
        source_event_id: event.source_event_id,
        deliveries: deliveries.into_iter().map(Into::into).collect(),
    })
    .into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct MessageListParams {
    /// With authentication off: only this tenant's messages
    tenant: Option<String>,
    /// only messages addressed to this consumer
    #[param(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    consumer: Option<String>,
    /// only this event type (exact)
    #[param(pattern = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$", max_length = 128)]
    event_type: Option<String>,
    /// only messages with at least one delivery in this status
    #[param(value_type = Option<DeliveryStatus>)]
    status: Option<String>,
    /// only events this inbound source took (combines with since, until and cursor only)
    #[param(pattern = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
    source: Option<String>,
    /// created at or after
    #[serde(default, deserialize_with = "crate::domain::time_bound")]
    since: Option<DateTime<Utc>>,
    /// created before
    #[serde(default, deserialize_with = "crate::domain::time_bound")]
    until: Option<DateTime<Utc>>,
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// `nextCursor` of the previous page
    cursor: Option<String>,
}

/// Deliveries of one message by status.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryCounts {
    total: i64,
    succeeded: i64,
    /// waiting or being sent
    pending: i64,
    /// failed, waiting for a retry
    failed: i64,
    dead: i64,
    cancelled: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageSummaryOut {
    id: Uuid,
    /// the same as `id`, under the name the other message routes use
    event_id: Uuid,
    tenant: String,
    event_type: String,
    consumer: Option<String>,
    created_at: DateTime<Utc>,
    /// the inbound source that took it; absent for a produced event
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    /// the provider's own id of the event, when its source took one
    #[serde(skip_serializing_if = "Option::is_none")]
    source_event_id: Option<String>,
    deliveries: DeliveryCounts,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessagePage {
    items: Vec<MessageSummaryOut>,
    /// pass as `cursor` for the next page; null on the last page
    next_cursor: Option<String>,
}

/// GET /v1/messages
#[utoipa::path(
    get,
    path = "/v1/messages",
    tag = "messages",
    operation_id = "listMessages",
    summary = "The caller's messages, newest first, keyset-paginated (scope: read)",
    params(MessageListParams),
    responses(
        (status = 200, description = "A page of messages", body = MessagePage),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    caller: Caller,
    State(state): State<AppState>,
    params: Result<
        axum::extract::Query<MessageListParams>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let p = super::listing::query(params)?;
    let tenant = caller.resolve_tenant(p.tenant)?;
    let limit = super::listing::page_limit(p.limit)?;
    let status = super::listing::parse_status(p.status.as_deref())?;
    super::listing::check_consumer_filter(p.consumer.as_deref())?;
    if let Some(s) = p.source.as_deref() {
        crate::inbound::sources::validate_name(s).map_err(|e| {
            ApiError::unprocessable(ErrorCode::InvalidField, format!("source: {e}"))
        })?;
    }
    if let Some(t) = p.event_type.as_deref() {
        domain::validate_event_type(t)
            .map_err(|e| ApiError::unprocessable(ErrorCode::InvalidEventType, e))?;
    }
    let before = super::listing::uuid_cursor(p.cursor.as_deref())?;
    let audience = caller.audience();
    let query = db::events::EventQuery {
        audience: db::Audience {
            tenant: tenant.as_deref(),
            ..audience
        },
        consumer: p.consumer.as_deref(),
        event_type: p.event_type.as_deref(),
        source: p.source.as_deref(),
        status,
        before,
        since: p.since,
        until: p.until,
        limit,
    };
    // A listing costs what it returns or is refused: a status filter is read from the
    // deliveries' indexes, which know the tenant and consumer but not the event type.
    if !db::events::status_served(&query) {
        return Err(ApiError::unprocessable(
            ErrorCode::FilterNotServed,
            "status can be combined with consumer, since, until and cursor, but not with \
             eventType, and needs a tenant; see docs/retention-partitions.md",
        ));
    }
    if !db::events::source_served(&query) {
        return Err(ApiError::unprocessable(
            ErrorCode::FilterNotServed,
            "source can be combined with since, until and cursor only, by a tenant-wide \
             caller; see docs/retention-partitions.md",
        ));
    }
    let rows = db::events::list(&state.pool, &query).await?;
    let next_cursor = super::listing::next_cursor(&rows, limit, |r| r.id.to_string());
    Ok(Json(MessagePage {
        items: rows
            .into_iter()
            .map(|r| MessageSummaryOut {
                id: r.id,
                event_id: r.id,
                tenant: r.tenant,
                event_type: r.event_type,
                consumer: r.consumer,
                created_at: r.created_at,
                source: r.source,
                source_event_id: r.source_event_id,
                deliveries: DeliveryCounts {
                    total: r.total,
                    succeeded: r.succeeded,
                    pending: r.pending,
                    failed: r.failed,
                    dead: r.dead,
                    cancelled: r.cancelled,
                },
            })
            .collect(),
        next_cursor,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits() -> Limits {
        Limits {
            max_payload_bytes: 16,
            max_body_bytes: 1024,
            max_batch: 2,
            max_batch_body_bytes: 2048,
            request_timeout: Duration::from_secs(30),
            max_header_bytes: 16 * 1024,
            max_url_bytes: 4096,
        }
    }

    fn code(r: Result<Vec<NewMessage>, ApiError>) -> (u16, &'static str) {
        let e = r.expect_err("an error");
        (e.status.as_u16(), e.code.as_str())
    }

    #[test]
    fn ingest_body_takes_the_credentials_tenant() {
        let body = br#"{"eventType":"a.b","payload":{"x": 1},"idempotencyKey":"k"}"#;
        let m =
            parse_ingest_body(IngestRoute::Single, body, Some("acme"), None, &limits()).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].tenant, "acme");
        assert_eq!(m[0].payload, r#"{"x": 1}"#, "the payload byte for byte");
        assert_eq!(m[0].idempotency_key.as_deref(), Some("k"));

        let other = br#"{"tenant":"other","eventType":"a","payload":1}"#;
        let r = parse_ingest_body(IngestRoute::Single, other, Some("acme"), None, &limits());
        assert_eq!(code(r), (403, "tenant_mismatch"));
        let r = parse_ingest_body(IngestRoute::Single, other, None, None, &limits());
        assert_eq!(r.unwrap()[0].tenant, "other");
    }

    #[test]
    fn ingest_body_refusals() {
        let single = |b: &[u8], key| {
            code(parse_ingest_body(
                IngestRoute::Single,
                b,
                Some("acme"),
                key,
                &limits(),
            ))
        };
        assert_eq!(single(b"{", None), (400, "malformed_json"));
        assert_eq!(
            single(br#"{"eventType":"a","payload":null}"#, None),
            (422, "missing_field")
        );
        assert_eq!(
            single(br#"{"eventType":"a","payload":"0123456789abcdef"}"#, None),
            (413, "payload_too_large")
        );
        assert_eq!(
            single(
                br#"{"eventType":"a","payload":1,"idempotencyKey":"x"}"#,
                Some("y")
            ),
            (422, "idempotency_key_mismatch")
        );

        let batch = |b: &[u8]| {
            code(parse_ingest_body(
                IngestRoute::Batch,
                b,
                Some("acme"),
                None,
                &limits(),
            ))
        };
        assert_eq!(batch(br#"{"messages":[]}"#), (422, "empty_batch"));
        let three = br#"{"messages":[{"eventType":"a","payload":1},{"eventType":"a","payload":1},{"eventType":"a","payload":1}]}"#;
        assert_eq!(batch(three), (422, "batch_too_large"));
        let bad_second =
            br#"{"messages":[{"eventType":"a","payload":1},{"eventType":"a..b","payload":1}]}"#;
        let e = parse_ingest_body(IngestRoute::Batch, bad_second, None, None, &limits())
            .expect_err("no tenant");
        assert_eq!(
            e.code.as_str(),
            "missing_field",
            "no tenant without a credential"
        );
        let e = parse_ingest_body(
            IngestRoute::Batch,
            bad_second,
            Some("acme"),
            None,
            &limits(),
        )
        .expect_err("a bad event type");
        assert_eq!(e.code.as_str(), "invalid_event_type");
        assert!(e.message.starts_with("messages[1]: "), "{}", e.message);
    }
}
