//! `/v1/messages`: enqueue (single and batch) and read back.

use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::body::{parse, read_limited, require_json};
use super::error::ApiError;
use super::{AppState, parse_id};
use crate::db;
use crate::outbox::{self, Enqueued, NewMessage};

/// Unknown fields are refused (422): a misspelt `idempotencyKey` silently ignored would
/// turn a producer's safe retry into a duplicate event.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MessageIn {
    tenant: Option<String>,
    event_type: Option<String>,
    payload: Option<Box<RawValue>>,
    idempotency_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchIn {
    messages: Vec<MessageIn>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnqueuedOut {
    event_id: Uuid,
    delivery_ids: Vec<Uuid>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BatchResultOut {
    event_id: Uuid,
    delivery_ids: Vec<Uuid>,
    created: bool,
}

#[derive(Serialize)]
struct BatchOut {
    results: Vec<BatchResultOut>,
}

fn validate(
    m: MessageIn,
    header_key: Option<&str>,
    max_payload: usize,
    prefix: &str,
) -> Result<NewMessage, ApiError> {
    let tenant = m.tenant.ok_or_else(|| {
        ApiError::unprocessable("missing_field", format!("{prefix}tenant is required"))
    })?;
    outbox::validate_tenant(&tenant)
        .map_err(|e| ApiError::unprocessable("invalid_tenant", format!("{prefix}{e}")))?;
    let event_type = m.event_type.ok_or_else(|| {
        ApiError::unprocessable("missing_field", format!("{prefix}eventType is required"))
    })?;
    outbox::validate_event_type(&event_type)
        .map_err(|e| ApiError::unprocessable("invalid_event_type", format!("{prefix}{e}")))?;
    let payload = m.payload.ok_or_else(|| {
        ApiError::unprocessable(
            "missing_field",
            format!("{prefix}payload is required (any JSON value but null)"),
        )
    })?;
    let payload = payload.get();
    if payload.len() > max_payload {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "{prefix}payload is {} bytes; the limit is {max_payload}",
                payload.len()
            ),
        ));
    }
    let idempotency_key = match (m.idempotency_key, header_key) {
        (Some(f), Some(h)) if f != h => {
            return Err(ApiError::unprocessable(
                "idempotency_key_mismatch",
                "the Idempotency-Key header and the idempotencyKey field differ",
            ));
        }
        (Some(k), _) => Some(k),
        (None, h) => h.map(str::to_owned),
    };
    if let Some(k) = &idempotency_key {
        outbox::validate_idempotency_key(k).map_err(|e| {
            ApiError::unprocessable("invalid_idempotency_key", format!("{prefix}{e}"))
        })?;
    }
    Ok(NewMessage {
        tenant,
        event_type,
        // RawValue holds the producer's exact text: stored and signed byte for byte
        payload: payload.to_owned(),
        idempotency_key,
    })
}

fn header_idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(v) => v.to_str().map(Some).map_err(|_| {
            ApiError::unprocessable(
                "invalid_idempotency_key",
                "Idempotency-Key header is not ASCII",
            )
        }),
    }
}

pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    require_json(&headers)?;
    let bytes = read_limited(body, state.limits.max_body_bytes).await?;
    let input: MessageIn = parse(&bytes)?;
    let msg = validate(
        input,
        header_idempotency_key(&headers)?,
        state.limits.max_payload_bytes,
        "",
    )?;
    let started = Instant::now();
    let result = state.outbox.enqueue(vec![msg]).await?;
    state
        .metrics
        .ingest_commit_seconds
        .observe(started.elapsed().as_secs_f64());
    let Enqueued {
        event_id,
        delivery_ids,
        created,
    } = result.into_iter().next().expect("one result per message");
    if created {
        state.metrics.events_enqueued.inc();
        state
            .metrics
            .deliveries_created
            .inc_by(delivery_ids.len() as u64);
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(EnqueuedOut {
            event_id,
            delivery_ids,
        }),
    )
        .into_response())
}

pub async fn create_batch(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    require_json(&headers)?;
    if headers.contains_key("idempotency-key") {
        return Err(ApiError::unprocessable(
            "idempotency_key_header_on_batch",
            "a batch takes idempotencyKey per message, not an Idempotency-Key header",
        ));
    }
    let bytes = read_limited(body, state.limits.max_batch_body_bytes).await?;
    let input: BatchIn = parse(&bytes)?;
    if input.messages.is_empty() {
        return Err(ApiError::unprocessable(
            "empty_batch",
            "messages must not be empty",
        ));
    }
    if input.messages.len() > state.limits.max_batch {
        return Err(ApiError::unprocessable(
            "batch_too_large",
            format!(
                "batch has {} messages; at most {} are allowed",
                input.messages.len(),
                state.limits.max_batch
            ),
        ));
    }
    let messages = input
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            validate(
                m,
                None,
                state.limits.max_payload_bytes,
                &format!("messages[{i}]: "),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let results = state.outbox.enqueue(messages).await?;
    state
        .metrics
        .ingest_commit_seconds
        .observe(started.elapsed().as_secs_f64());
    let any_created = results.iter().any(|r| r.created);
    for r in results.iter().filter(|r| r.created) {
        state.metrics.events_enqueued.inc();
        state
            .metrics
            .deliveries_created
            .inc_by(r.delivery_ids.len() as u64);
    }
    let out = BatchOut {
        results: results
            .into_iter()
            .map(|r| BatchResultOut {
                event_id: r.event_id,
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
    Ok((status, Json(out)).into_response())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliverySummary {
    pub delivery_id: Uuid,
    pub endpoint_id: Uuid,
    pub status: String,
    pub attempts: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_status_code: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
}

impl From<db::deliveries::DeliveryRow> for DeliverySummary {
    fn from(d: db::deliveries::DeliveryRow) -> Self {
        let waiting = matches!(d.status.as_str(), "pending" | "failed");
        DeliverySummary {
            delivery_id: d.id,
            endpoint_id: d.endpoint_id,
            attempts: d.attempts,
            next_attempt_at: waiting.then_some(d.visible_at),
            status: d.status,
            last_status_code: d.last_status_code,
            last_error: d.last_error,
            created_at: d.created_at,
            completed_at: d.completed_at,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageOut {
    event_id: Uuid,
    tenant: String,
    event_type: String,
    payload: Box<RawValue>,
    idempotency_key: Option<String>,
    created_at: DateTime<Utc>,
    deliveries: Vec<DeliverySummary>,
}

pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "message")?;
    let event = db::events::get(&state.pool, id)
        .await?
        .ok_or_else(|| ApiError::not_found("message"))?;
    let deliveries = db::deliveries::for_event(&state.pool, id).await?;
    // The stored text was validated as JSON on the way in, so this cannot fail unless the
    // row was edited by hand.
    let payload = RawValue::from_string(event.payload).map_err(|e| {
        tracing::error!(error = %e, event = %id, "stored payload is not JSON");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    })?;
    Ok(Json(MessageOut {
        event_id: event.id,
        tenant: event.tenant,
        event_type: event.event_type,
        payload,
        idempotency_key: event.idempotency_key,
        created_at: event.created_at,
        deliveries: deliveries.into_iter().map(Into::into).collect(),
    })
    .into_response())
}
