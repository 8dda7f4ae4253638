//! `/v1/deliveries`, `/v1/endpoints/{id}/replay`, `/v1/dead-letters`: operating the queue.

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::body::{parse, require_json};
use super::caller::Caller;
use super::error::ApiError;
use super::messages::DeliverySummary;
use super::openapi::responses;
use super::{AppState, path_id};
use crate::auth::Scope;
use crate::db::{self, deliveries::ReplayOutcome};
use crate::domain::ErrorCode;
use crate::domain::{CircuitState, DeliveryStatus, EndpointState, ErrorClass};

/// One entry of the attempt log.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptOut {
    attempt: i32,
    started_at: DateTime<Utc>,
    duration_ms: i32,
    status_code: Option<i32>,
    #[schema(value_type = Option<String>)]
    error_class: Option<ErrorClass>,
    error: Option<String>,
    response_snippet: Option<String>,
}

/// `attempts` is the attempt log (the contract); `attemptCount` the counter that the
/// retry schedule and max attempts work from (reset by replay, so it can be lower than
/// the log's length).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryOut {
    delivery_id: Uuid,
    event_id: Uuid,
    endpoint_id: Uuid,
    tenant: String,
    status: DeliveryStatus,
    attempt_count: i32,
    next_attempt_at: Option<DateTime<Utc>>,
    last_status_code: Option<i32>,
    last_error: Option<String>,
    created_at: DateTime<Utc>,
    completed_at: Option<DateTime<Utc>>,
    /// the latest 100 entries of the attempt log, oldest first
    attempts: Vec<AttemptOut>,
    /// older entries of the log not shown (a delivery replayed many times)
    attempts_omitted: i64,
    /// the endpoint's state now: why a waiting delivery is not being sent (a receiver's
    /// 410, a paused or unusable declaration, an open circuit and when it is probed again)
    endpoint: Option<EndpointStateOut>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStateOut {
    state: EndpointState,
    /// why it is paused or disabled
    state_reason: Option<String>,
    /// `closed`, `open` or `half_open`
    #[schema(value_type = String)]
    circuit_state: CircuitState,
    /// while the circuit is open: when one probe delivery is tried again
    circuit_open_until: Option<DateTime<Utc>>,
}

/// Attempt-log entries one read returns at most.
const ATTEMPTS_SHOWN: i64 = 100;

/// GET /v1/deliveries/{id}: the delivery and its attempt log.
#[utoipa::path(
    get,
    path = "/v1/deliveries/{id}",
    tag = "deliveries",
    operation_id = "getDelivery",
    summary = "A delivery and its attempt log (scope: read)",
    params(("id" = Uuid, Path, description = "The delivery id (the webhook-id receivers see)")),
    responses(
        (status = 200, description = "The delivery", body = DeliveryOut, links(
            ("replayDelivery" = (operation_id = "replayDelivery", parameters(("id" = "$response.body#/deliveryId")), description = "Replay this delivery")),
            ("getMessage" = (operation_id = "getMessage", parameters(("id" = "$response.body#/eventId")), description = "Its event")),
            ("replayEndpoint" = (operation_id = "replayEndpoint", parameters(("id" = "$response.body#/endpointId")), description = "Its endpoint")),
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
    let id = path_id(id, "delivery")?;
    let d = db::deliveries::get(&state.pool, id, caller.audience())
        .await?
        .ok_or_else(|| ApiError::not_found("delivery"))?;
    let (attempts, attempts_omitted) =
        db::attempts::latest_for_delivery(&state.pool, id, ATTEMPTS_SHOWN).await?;
    let endpoint = db::endpoints::get(&state.pool, d.endpoint_id, None)
        .await?
        .map(|e| EndpointStateOut {
            state: e.state,
            state_reason: e.state_reason,
            circuit_state: e.circuit_state,
            circuit_open_until: e.circuit_open_until,
        });
    let s = DeliverySummary::from(d.clone());
    Ok(Json(DeliveryOut {
        delivery_id: d.id,
        event_id: d.event_id,
        endpoint_id: d.endpoint_id,
        tenant: d.tenant,
        status: s.status,
        attempt_count: s.attempts,
        next_attempt_at: s.next_attempt_at,
        last_status_code: s.last_status_code,
        last_error: s.last_error,
        created_at: s.created_at,
        completed_at: s.completed_at,
        attempts: attempts
            .into_iter()
            .map(|a| AttemptOut {
                attempt: a.attempt,
                started_at: a.started_at,
                duration_ms: a.duration_ms,
                status_code: a.status_code,
                error_class: a.error_class,
                error: a.error,
                response_snippet: a.response_snippet,
            })
            .collect(),
        attempts_omitted,
        endpoint,
    })
    .into_response())
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplayOut {
    delivery_id: Uuid,
    /// always `pending`: the delivery is due now
    #[schema(value_type = String)]
    status: DeliveryStatus,
}

/// POST /v1/deliveries/{id}/replay
#[utoipa::path(
    post,
    path = "/v1/deliveries/{id}/replay",
    tag = "deliveries",
    operation_id = "replayDelivery",
    summary = "Send a delivery again, now (scope: operate)",
    description = "Resets the attempts and keeps the delivery id. Refused with 409 while a \
        dispatcher holds the delivery, or while a transaction that has not finished holds its \
        orderingKey (`ordering_key_in_use`). A keyed delivery of an endpoint that orders by key \
        goes back in its key's line, in its event's order. A request body, if any, is ignored.",
    params(("id" = Uuid, Path, description = "The delivery id")),
    responses(
        (status = 202, description = "The delivery is due now", body = ReplayOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 409, response = responses::Conflict),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn replay(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Operate)?;
    let id = path_id(id, "delivery")?;
    // a replay is a send like an enqueue's: it counts against the tenant's rate, or a
    // consumer token's own (never the tenant's: a customer cannot use up the producer's)
    state.admit_work(&caller, 1)?;
    match db::deliveries::replay(&state.pool, id, caller.audience()).await? {
        ReplayOutcome::Replayed => {
            state.notifier.wake();
            Ok((
                StatusCode::ACCEPTED,
                Json(ReplayOut {
                    delivery_id: id,
                    status: DeliveryStatus::Pending,
                }),
            )
                .into_response())
        }
        ReplayOutcome::Leased => Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::DeliveryLeased,
            "a dispatcher is sending this delivery right now; retry after it completes",
        )),
        ReplayOutcome::LineBusy => Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::OrderingKeyInUse,
            "this delivery's orderingKey is held by a transaction that has not finished (a producer's, through hookd.enqueue, or another replay); nothing was changed, retry shortly",
        )
        .with_retry_after(1)),
        ReplayOutcome::NotFound => Err(ApiError::not_found("delivery")),
    }
}

/// A status a window replay may select: [`DeliveryStatus::REPLAYABLE`], which is also
/// what the document lists. Requests carry it as a string, parsed here, so that a bad one
/// gets this route's own 422 (`invalid_status`) rather than a body error.
struct ReplayableStatus(DeliveryStatus);

impl ReplayableStatus {
    fn parse(s: &str) -> Result<ReplayableStatus, ApiError> {
        DeliveryStatus::parse(s)
            .filter(|s| DeliveryStatus::REPLAYABLE.contains(s))
            .map(ReplayableStatus)
            .ok_or_else(|| {
                ApiError::unprocessable(
                    ErrorCode::InvalidStatus,
                    format!(
                        "status {s:?} cannot be replayed; use any of {:?}",
                        DeliveryStatus::REPLAYABLE.map(DeliveryStatus::as_str)
                    ),
                )
            })
    }
}

impl utoipa::PartialSchema for ReplayableStatus {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(DeliveryStatus::REPLAYABLE.map(DeliveryStatus::as_str)))
            .description(Some("Statuses a window replay may select."))
            .into()
    }
}

impl ToSchema for ReplayableStatus {}

/// Which of the endpoint's deliveries to replay; an empty body takes every default.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointReplayIn {
    /// deliveries created at or after this time (default: any)
    #[serde(default, deserialize_with = "crate::domain::time_bound")]
    since: Option<DateTime<Utc>>,
    /// deliveries created before this time (default: any)
    #[serde(default, deserialize_with = "crate::domain::time_bound")]
    until: Option<DateTime<Utc>>,
    /// default: `["dead"]`
    #[schema(value_type = Option<Vec<ReplayableStatus>>)]
    statuses: Option<Vec<String>>,
    /// most deliveries replayed by this call (default 1000, at most 10000); with
    /// HOOKD_TENANT_RATE_LIMIT set, also at most what the tenant's rate allows right now
    /// (call again for the rest)
    #[schema(minimum = 1, maximum = 10000)]
    limit: Option<i64>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointReplayOut {
    endpoint_id: Uuid,
    replayed: i64,
    /// matching deliveries left alone because a dispatcher holds them
    skipped_leased: i64,
    /// matching deliveries left alone because their orderingKey is held by a transaction
    /// that has not finished (a producer's, or another replay), or because one call takes
    /// at most 1,000 ordering keys; replay again for them
    skipped_ordering_key_in_use: i64,
}

/// POST /v1/endpoints/{id}/replay `{"since"?, "until"?, "statuses"?, "limit"?}`
#[utoipa::path(
    post,
    path = "/v1/endpoints/{id}/replay",
    tag = "deliveries",
    operation_id = "replayEndpoint",
    summary = "Replay an endpoint's deliveries in a window (scope: operate)",
    params(("id" = Uuid, Path, description = "The endpoint id")),
    request_body(content = Option<EndpointReplayIn>, content_type = "application/json", description = "Optional; an empty body replays up to 1000 dead deliveries"),
    responses(
        (status = 202, description = "Replayed", body = EndpointReplayOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn replay_endpoint(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Operate)?;
    let id = path_id(id, "endpoint")?;
    let bytes = state.read_body(&caller, &headers, body, 64 * 1024).await?;
    // no body, or JSON null: every default
    let input: Option<EndpointReplayIn> = if bytes.is_empty() {
        None
    } else {
        require_json(&headers)?;
        parse(&bytes)?
    };
    let input = input.unwrap_or(EndpointReplayIn {
        since: None,
        until: None,
        statuses: None,
        limit: None,
    });
    let statuses: Vec<DeliveryStatus> = match input.statuses {
        None => vec![DeliveryStatus::Dead],
        Some(given) => given
            .iter()
            .map(|s| ReplayableStatus::parse(s).map(|r| r.0))
            .collect::<Result<_, _>>()?,
    };
    let limit = input.limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::unprocessable(
            ErrorCode::InvalidLimit,
            "limit must be between 1 and 10000",
        ));
    }

    if db::endpoints::get_visible(&state.pool, id, caller.audience())
        .await?
        .is_none()
    {
        return Err(ApiError::not_found("endpoint"));
    }
    // Each replayed delivery is a send and counts against the caller's rate (the tenant's,
    // or a consumer token's own): one call replays at most what the bucket holds (the rest
    // is for the next call), and what it does not use is given back.
    let want = u32::try_from(limit).unwrap_or(u32::MAX);
    let rated = state.take_work_up_to(&caller, want)?;
    let limit = rated.as_ref().map_or(limit, |r| i64::from(r.2));
    let replayed = db::deliveries::replay_endpoint(
        &state.pool,
        id,
        input.since,
        input.until,
        &statuses,
        limit,
        caller.tenant_scope(),
    )
    .await;
    if let Some((limiter, key, took)) = rated {
        let used = replayed.as_ref().map_or(0, |r| r.replayed);
        limiter.refund(
            &key,
            took.saturating_sub(u32::try_from(used).unwrap_or(took)),
        );
    }
    let r = replayed?;
    if r.replayed > 0 {
        state.notifier.wake();
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(EndpointReplayOut {
            endpoint_id: id,
            replayed: r.replayed,
            skipped_leased: r.skipped_leased,
            skipped_ordering_key_in_use: r.skipped_line_busy,
        }),
    )
        .into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct DeadLetterParams {
    /// With authentication on, the credential's tenant (another is a 403); the filter
    /// itself when authentication is off
    tenant: Option<String>,
    /// only this endpoint's dead letters
    endpoint_id: Option<Uuid>,
    /// page size, 1 to 1000 (default 100)
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// `nextCursor` of the previous page (opaque, URL-safe base64)
    #[param(pattern = "^[A-Za-z0-9_-]+$")]
    cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterOut {
    delivery_id: Uuid,
    event_id: Uuid,
    endpoint_id: Uuid,
    tenant: String,
    reason: String,
    attempts: i32,
    dead_at: DateTime<Utc>,
}

/// Oldest first.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterPage {
    items: Vec<DeadLetterOut>,
    /// pass as `cursor` for the next page; absent on the last page
    next_cursor: Option<String>,
}

fn encode_cursor(at: DateTime<Utc>, id: Uuid) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}|{}", at.to_rfc3339(), id))
}

fn decode_cursor(c: &str) -> Option<(DateTime<Utc>, Uuid)> {
    let raw = String::from_utf8(URL_SAFE_NO_PAD.decode(c).ok()?).ok()?;
    let (at, id) = raw.split_once('|')?;
    Some((
        DateTime::parse_from_rfc3339(at).ok()?.with_timezone(&Utc),
        id.parse().ok()?,
    ))
}

/// GET /v1/dead-letters?tenant=&endpointId=&limit=&cursor=
#[utoipa::path(
    get,
    path = "/v1/dead-letters",
    tag = "deliveries",
    operation_id = "listDeadLetters",
    summary = "The caller's dead letters, keyset-paginated (scope: read)",
    params(DeadLetterParams),
    responses(
        (status = 200, description = "A page of dead letters", body = DeadLetterPage),
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
pub async fn dead_letters(
    caller: Caller,
    State(state): State<AppState>,
    params: Result<Query<DeadLetterParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let Query(p) =
        params.map_err(|e| ApiError::unprocessable(ErrorCode::InvalidQuery, e.body_text()))?;
    let tenant = caller.resolve_tenant(p.tenant)?;
    let limit = super::listing::page_limit(p.limit)?;
    let after = match p.cursor.as_deref() {
        None => None,
        Some(c) => Some(decode_cursor(c).ok_or_else(|| {
            ApiError::unprocessable(ErrorCode::InvalidCursor, "cursor is not valid")
        })?),
    };
    let rows = db::dead_letters::list(
        &state.pool,
        &db::dead_letters::DeadLetterQuery {
            tenant,
            consumer: caller.consumer_scope().map(str::to_owned),
            since: caller.audience().since,
            endpoint_id: p.endpoint_id,
            after,
            limit,
        },
    )
    .await?;
    let next_cursor =
        super::listing::next_cursor(&rows, limit, |r| encode_cursor(r.dead_at, r.delivery_id));
    Ok(Json(DeadLetterPage {
        items: rows
            .into_iter()
            .map(|r| DeadLetterOut {
                delivery_id: r.delivery_id,
                event_id: r.event_id,
                endpoint_id: r.endpoint_id,
                tenant: r.tenant,
                reason: r.reason,
                attempts: r.attempts,
                dead_at: r.dead_at,
            })
            .collect(),
        next_cursor,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips() {
        let at = Utc::now();
        let id = Uuid::now_v7();
        assert_eq!(decode_cursor(&encode_cursor(at, id)), Some((at, id)));
        assert_eq!(decode_cursor("garbage!"), None);
    }
}
