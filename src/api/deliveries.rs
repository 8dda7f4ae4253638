//! `/v1/deliveries`, `/v1/endpoints/{id}/replay`, `/v1/dead-letters`: operating the queue.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::body::{parse, read_limited, require_json};
use super::error::ApiError;
use super::messages::DeliverySummary;
use super::{AppState, parse_id};
use crate::db::{self, deliveries::ReplayOutcome};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AttemptOut {
    attempt: i32,
    started_at: DateTime<Utc>,
    duration_ms: i32,
    status_code: Option<i32>,
    error_class: Option<String>,
    error: Option<String>,
    response_snippet: Option<String>,
}

/// `attempts` is the attempt log (the contract); `attemptCount` the counter that the
/// retry schedule and max attempts work from (reset by replay, so it can be lower than
/// the log's length).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeliveryOut {
    delivery_id: Uuid,
    event_id: Uuid,
    endpoint_id: Uuid,
    tenant: String,
    status: String,
    attempt_count: i32,
    next_attempt_at: Option<DateTime<Utc>>,
    last_status_code: Option<i32>,
    last_error: Option<String>,
    created_at: DateTime<Utc>,
    completed_at: Option<DateTime<Utc>>,
    attempts: Vec<AttemptOut>,
}

/// GET /v1/deliveries/{id}: the delivery and its attempt log.
pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "delivery")?;
    let d = db::deliveries::get(&state.pool, id)
        .await?
        .ok_or_else(|| ApiError::not_found("delivery"))?;
    let attempts = db::attempts::for_delivery(&state.pool, id).await?;
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
    })
    .into_response())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReplayOut {
    delivery_id: Uuid,
    status: &'static str,
}

/// POST /v1/deliveries/{id}/replay
pub async fn replay(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "delivery")?;
    match db::deliveries::replay(&state.pool, id, None).await? {
        ReplayOutcome::Replayed => {
            state.notifier.wake();
            Ok((
                StatusCode::ACCEPTED,
                Json(ReplayOut {
                    delivery_id: id,
                    status: "pending",
                }),
            )
                .into_response())
        }
        ReplayOutcome::Leased => Err(ApiError::new(
            StatusCode::CONFLICT,
            "delivery_leased",
            "a dispatcher is sending this delivery right now; retry after it completes",
        )),
        ReplayOutcome::NotFound => Err(ApiError::not_found("delivery")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EndpointReplayIn {
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    /// default: `["dead"]`
    statuses: Option<Vec<String>>,
    /// most deliveries replayed by this call (default 1000, at most 10000)
    limit: Option<i64>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EndpointReplayOut {
    endpoint_id: Uuid,
    replayed: i64,
    skipped_leased: i64,
}

/// POST /v1/endpoints/{id}/replay `{"since"?, "until"?, "statuses"?, "limit"?}`
pub async fn replay_endpoint(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "endpoint")?;
    let bytes = read_limited(body, 64 * 1024).await?;
    let input: EndpointReplayIn = if bytes.is_empty() {
        EndpointReplayIn {
            since: None,
            until: None,
            statuses: None,
            limit: None,
        }
    } else {
        require_json(&headers)?;
        parse(&bytes)?
    };
    let statuses = input.statuses.unwrap_or_else(|| vec!["dead".into()]);
    const REPLAYABLE: [&str; 5] = ["pending", "failed", "succeeded", "dead", "cancelled"];
    if let Some(bad) = statuses.iter().find(|s| !REPLAYABLE.contains(&s.as_str())) {
        return Err(ApiError::unprocessable(
            "invalid_status",
            format!("status {bad:?} cannot be replayed; use any of {REPLAYABLE:?}"),
        ));
    }
    let limit = input.limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::unprocessable(
            "invalid_limit",
            "limit must be between 1 and 10000",
        ));
    }
    let since = input.since.unwrap_or(DateTime::<Utc>::MIN_UTC);
    let until = input.until.unwrap_or(DateTime::<Utc>::MAX_UTC);
    if db::endpoints::get(&state.pool, id).await?.is_none() {
        return Err(ApiError::not_found("endpoint"));
    }
    let (replayed, skipped) =
        db::deliveries::replay_endpoint(&state.pool, id, since, until, &statuses, limit).await?;
    if replayed > 0 {
        state.notifier.wake();
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(EndpointReplayOut {
            endpoint_id: id,
            replayed,
            skipped_leased: skipped,
        }),
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeadLetterParams {
    tenant: Option<String>,
    endpoint_id: Option<Uuid>,
    limit: Option<i64>,
    cursor: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeadLetterOut {
    delivery_id: Uuid,
    event_id: Uuid,
    endpoint_id: Uuid,
    tenant: String,
    reason: String,
    attempts: i32,
    dead_at: DateTime<Utc>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeadLetterPage {
    items: Vec<DeadLetterOut>,
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
pub async fn dead_letters(
    State(state): State<AppState>,
    params: Result<Query<DeadLetterParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::unprocessable("invalid_query", e.body_text()))?;
    let limit = p.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::unprocessable(
            "invalid_limit",
            "limit must be between 1 and 1000",
        ));
    }
    let after = match p.cursor.as_deref() {
        None => None,
        Some(c) => Some(
            decode_cursor(c)
                .ok_or_else(|| ApiError::unprocessable("invalid_cursor", "cursor is not valid"))?,
        ),
    };
    let rows = db::dead_letters::list(
        &state.pool,
        &db::dead_letters::DeadLetterQuery {
            tenant: p.tenant,
            endpoint_id: p.endpoint_id,
            after,
            limit,
        },
    )
    .await?;
    let next_cursor = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|r| encode_cursor(r.dead_at, r.delivery_id)))
        .flatten();
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
