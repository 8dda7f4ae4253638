//! `/v1/sources`: inbound sources of a tenant (scope `manage`, tenant credentials only).
//! A source receives one provider's webhooks at `POST /in/{name}` (see `api::inbound`).

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, DurationRound, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AppState;
use super::body::{not_null, nullable};
use super::caller::Caller;
use super::error::ApiError;
use super::listing::{page_limit, query};
use super::openapi::responses;
use crate::auth::Scope;
use crate::db;
use crate::domain::ErrorCode;
use crate::inbound::sources::{self as rules, HmacSpec};

const BODY_LIMIT: usize = 64 * 1024;

/// The largest body a source of this API may take: an event's payload limit.
fn max_body_allowed(state: &AppState) -> i32 {
    i32::try_from(state.limits.max_payload_bytes).unwrap_or(i32::MAX)
}

/// A source as the API shows it (never its secret).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceOut {
    id: Uuid,
    /// the last segment of the URL the provider is given: `/in/{name}`
    name: String,
    tenant: String,
    /// events it takes in are for this consumer only
    consumer: Option<String>,
    /// `standard-webhooks`, `stripe`, `github`, `shopify`, `slack` or `hmac`
    provider: String,
    hmac: Option<HmacSpec>,
    /// its events' types start with this (`{prefix}.{provider's type}`)
    event_type_prefix: String,
    max_body_bytes: i32,
    description: Option<String>,
    /// where the provider must send: relative to the API unless HOOKD_PUBLIC_URL is set
    url: String,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    /// `kubernetes`: declared by a WebhookSource object, read-only here (409
    /// `managed_by_kubernetes` to a change, rotation or delete)
    managed_by: crate::domain::ManagedBy,
}

fn out(state: &AppState, s: db::sources::SourceRow) -> SourceOut {
    let base = state
        .manage
        .public_url
        .as_deref()
        .unwrap_or("")
        .trim_end_matches('/');
    SourceOut {
        url: format!("{base}/in/{}", s.name),
        hmac: s
            .hmac
            .and_then(|v| serde_json::from_value::<HmacSpec>(v.0).ok()),
        id: s.id,
        name: s.name,
        tenant: s.tenant,
        consumer: s.consumer,
        provider: s.provider,
        event_type_prefix: s.event_type_prefix,
        max_body_bytes: s.max_body_bytes,
        description: s.description,
        created_at: s.created_at,
        updated_at: s.updated_at,
        managed_by: s.managed_by,
    }
}

/// A new source. Unknown fields are refused (422).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SourceIn {
    /// 1-63 lower-case letters, digits or '-'; unique across tenants (it is the route)
    #[schema(pattern = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
    name: String,
    /// required with authentication off; otherwise the credential's tenant
    tenant: Option<String>,
    /// the consumer its events are for (none: the tenant's endpoints without a consumer)
    consumer: Option<String>,
    /// `standard-webhooks`, `stripe`, `github`, `shopify`, `slack` or `hmac`
    provider: String,
    /// the generic scheme, for provider `hmac` only
    hmac: Option<HmacSpec>,
    /// the provider's signing secret as it shows it; generated (and returned once) for
    /// standard-webhooks, github and hmac when left out
    secret: Option<String>,
    /// its events' types start with this; default: the name
    event_type_prefix: Option<String>,
    /// largest body accepted (default 1 MiB, at most 16 MiB)
    max_body_bytes: Option<i32>,
    description: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedSourceOut {
    #[serde(flatten)]
    source: SourceOut,
    /// the verification secret: shown in this answer only
    secret: String,
}

/// POST /v1/sources
#[utoipa::path(
    post,
    path = "/v1/sources",
    tag = "sources",
    operation_id = "createSource",
    summary = "Create an inbound source (scope: manage)",
    description = "Give the provider the answer's url (with HOOKD_PUBLIC_URL set, an absolute \
        one) and, where hookd generated it, the secret. Its secret is stored encrypted.",
    request_body(content = SourceIn, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = CreatedSourceOut),
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
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    state.admit_work(&caller, 0)?;
    let input: SourceIn = state
        .read_json_body(&caller, &headers, body, BODY_LIMIT, false)
        .await?;
    let tenant = caller
        .resolve_tenant(input.tenant)?
        .ok_or_else(|| ApiError::unprocessable(ErrorCode::MissingField, "tenant is required"))?;
    let keyring = super::endpoints::keyring(&state)?;
    let (row, secret) = rules::create(
        &state.pool,
        keyring,
        rules::NewSource {
            name: input.name,
            tenant,
            consumer: input.consumer,
            provider: input.provider,
            hmac: input.hmac,
            secret: input.secret,
            event_type_prefix: input.event_type_prefix,
            max_body_bytes: input.max_body_bytes,
            description: input.description,
            max_body_allowed: max_body_allowed(&state),
        },
    )
    .await?;
    tracing::info!(source = %row.name, tenant = %row.tenant, provider = %row.provider, "source created through the API");
    Ok((
        StatusCode::CREATED,
        Json(CreatedSourceOut {
            source: out(&state, row),
            secret,
        }),
    )
        .into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct SourceListParams {
    /// With authentication off: only this tenant's
    tenant: Option<String>,
    /// page size, 1 to 1000 (default 100)
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// `nextCursor` of the previous page
    cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourcePage {
    /// in name order
    items: Vec<SourceOut>,
    next_cursor: Option<String>,
}

/// GET /v1/sources
#[utoipa::path(
    get,
    path = "/v1/sources",
    tag = "sources",
    operation_id = "listSources",
    summary = "The tenant's inbound sources, by name (scope: manage)",
    params(SourceListParams),
    responses(
        (status = 200, description = "A page of sources", body = SourcePage),
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
    params: Result<Query<SourceListParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    state.admit_read(&caller)?;
    let p = query(params)?;
    let tenant = caller.resolve_tenant(p.tenant)?;
    let limit = page_limit(p.limit)?;
    if let Some(c) = &p.cursor {
        rules::validate_name(c).map_err(|_| {
            ApiError::unprocessable(ErrorCode::InvalidCursor, "cursor is not a source name")
        })?;
    }
    let rows =
        db::sources::list(&state.pool, tenant.as_deref(), p.cursor.as_deref(), limit).await?;
    let next_cursor = super::listing::next_cursor(&rows, limit, |r| r.name.clone());
    Ok(Json(SourcePage {
        items: rows.into_iter().map(|r| out(&state, r)).collect(),
        next_cursor,
    })
    .into_response())
}

/// The `{name}` of a source path; a name that cannot be one is as absent as an unknown one.
fn path_name(raw: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Ok(Path(name)) = raw else {
        return Err(ApiError::not_found("source"));
    };
    rules::validate_name(&name).map_err(|_| ApiError::not_found("source"))?;
    Ok(name)
}

/// The source of a path, for a tenant-wide caller with scope manage within its read
/// rate; another tenant's is as absent as an unknown name.
async fn readable(
    caller: &Caller,
    state: &AppState,
    name: Result<Path<String>, PathRejection>,
) -> Result<db::sources::SourceRow, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    state.admit_read(caller)?;
    let name = path_name(name)?;
    db::sources::get(&state.pool, &name, caller.tenant_scope())
        .await?
        .ok_or_else(|| ApiError::not_found("source"))
}

/// GET /v1/sources/{name}
#[utoipa::path(
    get,
    path = "/v1/sources/{name}",
    tag = "sources",
    operation_id = "getSource",
    summary = "One inbound source (scope: manage)",
    params(("name" = String, Path, description = "The source's name")),
    responses(
        (status = 200, description = "The source", body = SourceOut),
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
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let row = readable(&caller, &state, name).await?;
    Ok(Json(out(&state, row)).into_response())
}

/// DELETE /v1/sources/{name}
#[utoipa::path(
    delete,
    path = "/v1/sources/{name}",
    tag = "sources",
    operation_id = "deleteSource",
    summary = "Delete an inbound source (scope: manage)",
    description = "Its URL answers 401 from then on (as for a name that never existed); the \
        events it took in and their deliveries stay.",
    params(("name" = String, Path, description = "The source's name")),
    responses(
        (status = 204, description = "Deleted"),
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
pub async fn delete(
    caller: Caller,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    state.admit_work(&caller, 0)?;
    let name = path_name(name)?;
    if !rules::delete(&state.pool, caller.tenant_scope(), &name).await? {
        return Err(ApiError::not_found("source"));
    }
    // here at once; other processes when migration 0028's notification reaches them
    state.sources.forget_all();
    tracing::info!(source = %name, "source deleted through the API");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A change; absent fields stay as they are. The name and provider stay: a new provider
/// is a new source.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SourcePatchIn {
    /// `null`: its events are for no consumer
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>)]
    consumer: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>)]
    event_type_prefix: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<i32>)]
    max_body_bytes: Option<Option<i32>>,
    /// `null` clears it
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>)]
    description: Option<Option<String>>,
    /// for provider `hmac` only
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<HmacSpec>)]
    hmac: Option<Option<HmacSpec>>,
}

/// PATCH /v1/sources/{name}
#[utoipa::path(
    patch,
    path = "/v1/sources/{name}",
    tag = "sources",
    operation_id = "updateSource",
    summary = "Change an inbound source (scope: manage)",
    description = "Its consumer, event-type prefix, body limit, description, or (provider \
        hmac) its scheme. Requests already verified are not affected.",
    params(("name" = String, Path, description = "The source's name")),
    request_body(content = SourcePatchIn, content_type = "application/json"),
    responses(
        (status = 200, description = "The source as changed", body = SourceOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
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
pub async fn update(
    caller: Caller,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    state.admit_work(&caller, 0)?;
    let name = path_name(name)?;
    let input: SourcePatchIn = state
        .read_json_body(&caller, &headers, body, BODY_LIMIT, false)
        .await?;
    let change = rules::SourceChange {
        consumer: input.consumer,
        event_type_prefix: not_null("eventTypePrefix", input.event_type_prefix)?,
        max_body_bytes: not_null("maxBodyBytes", input.max_body_bytes)?,
        description: input.description,
        hmac: not_null("hmac", input.hmac)?,
    };
    let row = rules::change(
        &state.pool,
        caller.tenant_scope(),
        &name,
        change,
        max_body_allowed(&state),
    )
    .await?
    .ok_or_else(|| ApiError::not_found("source"))?;
    state.sources.forget_all();
    Ok(Json(out(&state, row)).into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SourceRotateIn {
    /// the provider's new secret; generated when left out (standard-webhooks, github, hmac)
    secret: Option<String>,
    /// how long the previous secret keeps verifying, 0 to 604800 (default 86400)
    #[schema(minimum = 0, maximum = 604800)]
    grace_seconds: Option<i64>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceSecretOut {
    /// the new secret: shown in this answer only
    secret: String,
    previous_valid_until: DateTime<Utc>,
}

/// POST /v1/sources/{name}/secret/rotate
#[utoipa::path(
    post,
    path = "/v1/sources/{name}/secret/rotate",
    tag = "sources",
    operation_id = "rotateSourceSecret",
    summary = "Make a new verification secret current (scope: manage)",
    description = "The previous secret keeps verifying for graceSeconds, so the provider can be \
        switched to the new one without a refused request. At most 4 secrets verify at once.",
    params(("name" = String, Path, description = "The source's name")),
    request_body(content = Option<SourceRotateIn>, content_type = "application/json"),
    responses(
        (status = 201, description = "Rotated", body = SourceSecretOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
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
pub async fn rotate_secret(
    caller: Caller,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    state.admit_work(&caller, 0)?;
    let name = path_name(name)?;
    let input: SourceRotateIn = state
        .read_json_body(&caller, &headers, body, BODY_LIMIT, true)
        .await?;
    let keyring = super::endpoints::keyring(&state)?;
    let (secret, until) = rules::rotate(
        &state.pool,
        keyring,
        caller.tenant_scope(),
        &name,
        input.secret,
        input
            .grace_seconds
            .unwrap_or(crate::signing::DEFAULT_ROTATION_GRACE_SECS.into()),
    )
    .await?
    .ok_or_else(|| ApiError::not_found("source"))?;
    state.sources.forget_all();
    tracing::info!(source = %name, "source secret rotated through the API");
    Ok((
        StatusCode::CREATED,
        Json(SourceSecretOut {
            secret,
            previous_valid_until: until,
        }),
    )
        .into_response())
}

/// Requests to a source with one outcome.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceOutcomeOut {
    /// `accepted`, `duplicate`, `url_verification`, or why a request was not taken:
    /// `missing_signature`, `malformed_signature`, `bad_signature`, `stale_timestamp`,
    /// `not_json`, `not_admitted` (held back before its signature was read: size, bytes
    /// in flight, rate), `not_taken` (verified, not committed: the tenant's rate or an
    /// outage; the provider retries)
    outcome: String,
    /// true for the outcomes that answered 2xx
    taken: bool,
    count: i64,
    last_at: DateTime<Utc>,
}

/// What a source was sent.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatsOut {
    /// counted from the start of this hour on (the last 24 hours)
    since: DateTime<Utc>,
    /// most frequent first; a request to an unknown name is nobody's and is in the
    /// metrics only (`hookd_inbound_requests_total{source="(unknown)"}`)
    outcomes: Vec<SourceOutcomeOut>,
}

/// GET /v1/sources/{name}/stats
#[utoipa::path(
    get,
    path = "/v1/sources/{name}/stats",
    tag = "sources",
    operation_id = "getSourceStats",
    summary = "Requests to an inbound source in the last 24 hours, by outcome (scope: manage)",
    description = "Counted by every API process and written every few seconds, so the \
        newest requests show a moment later. The events it took are listed by \
        GET /v1/messages?source={name}.",
    params(("name" = String, Path, description = "The source's name")),
    responses(
        (status = 200, description = "Its requests by outcome", body = SourceStatsOut),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn stats(
    caller: Caller,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let row = readable(&caller, &state, name).await?;
    let since = Utc::now() - chrono::Duration::hours(24);
    let outcomes = db::sources::request_counts(&state.pool, row.id, since).await?;
    Ok(Json(SourceStatsOut {
        since: since
            .duration_trunc(chrono::Duration::hours(1))
            .unwrap_or(since),
        outcomes: outcomes
            .into_iter()
            .map(|(outcome, count, last_at)| SourceOutcomeOut {
                taken: matches!(
                    outcome.as_str(),
                    "accepted" | "duplicate" | "url_verification"
                ),
                outcome,
                count,
                last_at,
            })
            .collect(),
    })
    .into_response())
}
