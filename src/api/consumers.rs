//! `/v1/consumers`: the parties a tenant's webhooks are for, and the short-lived tokens
//! a customer-facing page uses to manage one consumer's endpoints.

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use super::listing::{page_limit, query};
use super::openapi::responses;
use crate::auth::tokens::{self, TokenRequest};
use crate::auth::{Scope, sessions};
use crate::db;
use crate::domain;
use crate::domain::ErrorCode;

const BODY_LIMIT: usize = 64 * 1024;

/// Longest and default lifetime of a token minted for a consumer.
const MAX_TOKEN_TTL_SECS: i64 = 7 * 86_400;
const DEFAULT_TOKEN_TTL_SECS: i64 = 3_600;

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerOut {
    uid: String,
    tenant: String,
    name: Option<String>,
    #[schema(value_type = Object)]
    metadata: Box<serde_json::value::RawValue>,
    /// live endpoints (counted up to 10,000)
    endpoint_count: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

fn empty_object() -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string("{}".into()).expect("{} is JSON")
}

impl From<db::consumers::ConsumerRow> for ConsumerOut {
    fn from(c: db::consumers::ConsumerRow) -> Self {
        // jsonb's text form is always valid JSON; the fallback only keeps this infallible
        let metadata =
            serde_json::value::RawValue::from_string(c.metadata).unwrap_or_else(|_| empty_object());
        ConsumerOut {
            uid: c.uid,
            tenant: c.tenant,
            name: c.name,
            metadata,
            endpoint_count: c.endpoint_count,
            created_at: c.created_at,
            updated_at: c.updated_at,
        }
    }
}

#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConsumerIn {
    #[schema(max_length = 200)]
    name: Option<String>,
    /// any JSON object, at most 16 KiB
    #[schema(value_type = Option<Object>)]
    metadata: Option<serde_json::Value>,
    /// With authentication on, the credential's tenant; required when it is off
    tenant: Option<String>,
}

/// The consumer uid of a path, or 422 naming what is wrong with it.
fn path_uid(raw: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(uid) = raw.map_err(|_| {
        ApiError::bad_request(
            ErrorCode::InvalidConsumer,
            "the consumer uid is not decodable",
        )
    })?;
    domain::validate_consumer(&uid)
        .map_err(|e| ApiError::unprocessable(ErrorCode::InvalidConsumer, e))?;
    Ok(uid)
}

/// The tenant a consumer route acts in, for a tenant credential (a consumer token may
/// only read its own consumer).
fn tenant_of(caller: &Caller, named: Option<String>) -> Result<String, ApiError> {
    caller
        .resolve_tenant(named)?
        .ok_or_else(|| ApiError::unprocessable(ErrorCode::MissingField, "tenant is required"))
}

/// PUT /v1/consumers/{uid}
#[utoipa::path(
    put,
    path = "/v1/consumers/{uid}",
    tag = "consumers",
    operation_id = "upsertConsumer",
    summary = "Create or update a consumer (scope: manage)",
    params(("uid" = String, Path, description = "The consumer's uid, chosen by you (e.g. cust_42)")),
    request_body(content = Option<ConsumerIn>, content_type = "application/json"),
    responses(
        (status = 200, description = "Updated", body = ConsumerOut),
        (status = 201, description = "Created", body = ConsumerOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn upsert(
    caller: Caller,
    State(state): State<AppState>,
    uid: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    let uid = path_uid(uid)?;
    let input: ConsumerIn = state
        .read_json_body(&caller, &headers, body, BODY_LIMIT, true)
        .await?;
    let tenant = tenant_of(&caller, input.tenant)?;
    domain::validate_tenant(&tenant)
        .map_err(|e| ApiError::unprocessable(ErrorCode::InvalidTenant, e))?;
    if let Some(n) = &input.name {
        crate::domain::validate_text("name", n, 200)
            .map_err(|e| ApiError::unprocessable(ErrorCode::InvalidField, e))?;
    }
    let metadata = input
        .metadata
        .unwrap_or_else(|| serde_json::Value::Object(Default::default()));
    if !metadata.is_object() {
        return Err(ApiError::unprocessable(
            ErrorCode::InvalidField,
            "metadata must be a JSON object",
        ));
    }
    crate::domain::validate_json_text("metadata", &metadata)
        .map_err(|e| ApiError::unprocessable(ErrorCode::InvalidField, e))?;
    if metadata.to_string().len() > 16 * 1024 {
        return Err(ApiError::unprocessable(
            ErrorCode::InvalidField,
            "metadata is larger than 16 KiB",
        ));
    }
    let (row, created) =
        db::consumers::upsert(&state.pool, &tenant, &uid, input.name.as_deref(), &metadata).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(ConsumerOut::from(row))).into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct TenantParam {
    /// With authentication off: the tenant (required); otherwise the credential's
    tenant: Option<String>,
}

/// GET /v1/consumers/{uid}
#[utoipa::path(
    get,
    path = "/v1/consumers/{uid}",
    tag = "consumers",
    operation_id = "getConsumer",
    summary = "A consumer (scope: read)",
    params(("uid" = String, Path, description = "The consumer's uid"), TenantParam),
    responses(
        (status = 200, description = "The consumer", body = ConsumerOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 422, response = responses::Unprocessable),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    caller: Caller,
    State(state): State<AppState>,
    uid: Result<Path<String>, PathRejection>,
    params: Result<Query<TenantParam>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let uid = path_uid(uid)?;
    let p = query(params)?;
    let tenant = tenant_of(&caller, p.tenant)?;
    if caller.consumer_scope().is_some_and(|own| own != uid) {
        return Err(ApiError::not_found("consumer"));
    }
    let row = db::consumers::get(&state.pool, &tenant, &uid)
        .await?
        .filter(|r| {
            caller
                .audience()
                .consumer_generation
                .is_none_or(|own| own == r.generation)
        })
        .ok_or_else(|| ApiError::not_found("consumer"))?;
    let mut out = ConsumerOut::from(row);
    if caller.consumer_scope().is_some() {
        // the producer's name and notes about its customer are not the customer's to read
        out.name = None;
        out.metadata = empty_object();
    }
    Ok(Json(out).into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct ConsumerListParams {
    /// With authentication off: only this tenant's
    tenant: Option<String>,
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerPage {
    items: Vec<ConsumerOut>,
    next_cursor: Option<String>,
}

/// GET /v1/consumers
#[utoipa::path(
    get,
    path = "/v1/consumers",
    tag = "consumers",
    operation_id = "listConsumers",
    summary = "The tenant's consumers by uid, keyset-paginated (scope: read)",
    params(ConsumerListParams),
    responses(
        (status = 200, description = "A page of consumers", body = ConsumerPage),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 422, response = responses::Unprocessable),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    caller: Caller,
    State(state): State<AppState>,
    params: Result<Query<ConsumerListParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    caller.require_tenant_wide()?;
    let p = query(params)?;
    let tenant = caller.resolve_tenant(p.tenant)?;
    let limit = page_limit(p.limit)?;
    let after = match p.cursor.as_deref() {
        None => None,
        Some(c) => Some(
            URL_SAFE_NO_PAD
                .decode(c)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| {
                    s.split_once('\n')
                        .map(|(t, u)| (t.to_owned(), u.to_owned()))
                })
                .ok_or_else(|| {
                    ApiError::unprocessable(ErrorCode::InvalidCursor, "cursor is not valid")
                })?,
        ),
    };
    let rows = db::consumers::list(
        &state.pool,
        tenant.as_deref(),
        after.as_ref().map(|(t, u)| (t.as_str(), u.as_str())),
        limit,
    )
    .await?;
    let next_cursor = super::listing::next_cursor(&rows, limit, |r| {
        URL_SAFE_NO_PAD.encode(format!("{}\n{}", r.tenant, r.uid))
    });
    Ok(Json(ConsumerPage {
        items: rows.into_iter().map(Into::into).collect(),
        next_cursor,
    })
    .into_response())
}

/// How far a consumer deletion got.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerDeletionOut {
    id: Uuid,
    tenant: String,
    /// the deleted consumer's uid (a consumer created later with it is another one)
    consumer: String,
    /// `running` (endpoints being disabled, deliveries cancelled, in batches) or `done`
    status: &'static str,
    tokens_revoked: i64,
    endpoints_disabled: i64,
    deliveries_cancelled: i64,
    requested_at: DateTime<Utc>,
    completed_at: Option<DateTime<Utc>>,
}

impl From<db::consumers::DeletionRow> for ConsumerDeletionOut {
    fn from(d: db::consumers::DeletionRow) -> Self {
        ConsumerDeletionOut {
            status: if d.completed_at.is_some() {
                "done"
            } else {
                "running"
            },
            id: d.id,
            tenant: d.tenant,
            consumer: d.uid,
            tokens_revoked: d.tokens_revoked,
            endpoints_disabled: d.endpoints_disabled,
            deliveries_cancelled: d.deliveries_cancelled,
            requested_at: d.requested_at,
            completed_at: d.completed_at,
        }
    }
}

/// DELETE /v1/consumers/{uid}
#[utoipa::path(
    delete,
    path = "/v1/consumers/{uid}",
    tag = "consumers",
    operation_id = "deleteConsumer",
    summary = "Delete a consumer (scope: manage)",
    description = "At once, whatever its size: the consumer is gone (a consumer created \
        later with this uid starts empty), its tokens are revoked and no new delivery is made \
        for its endpoints. Its endpoints are then disabled (reason: consumer deleted) and \
        their open deliveries cancelled with that reason, in bounded batches: 204 when that \
        finished within the request, else 202 with the deletion's progress (also at \
        `GET /v1/consumer-deletions/{id}`, the Location). History stays.",
    params(("uid" = String, Path, description = "The consumer's uid"), TenantParam),
    responses(
        (status = 202, description = "Deleted; endpoints and deliveries still being wound down", body = ConsumerDeletionOut),
        (status = 204, description = "Deleted"),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 422, response = responses::Unprocessable),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    caller: Caller,
    State(state): State<AppState>,
    uid: Result<Path<String>, PathRejection>,
    params: Result<Query<TenantParam>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    let uid = path_uid(uid)?;
    let p = query(params)?;
    let tenant = tenant_of(&caller, p.tenant)?;
    let started = db::consumers::start_delete(&state.pool, &tenant, &uid)
        .await?
        .ok_or_else(|| ApiError::not_found("consumer"))?;
    // dead in this process now; elsewhere the token lookup finds no consumer of the
    // token's generation as soon as its cache entry (5 s at most) lapses
    state.auth.forget_tokens(&started.revoked_tokens);
    let id = started.deletion.id;
    let batch = state.customers.delete_batch;
    // a small consumer is done within the request: its endpoints, then its deliveries
    let mut row = started.deletion;
    for _ in 0..2 {
        match db::consumers::delete_step(&state.pool, id, batch).await? {
            db::consumers::DeleteStep::Progress(r) => {
                row = r;
                if row.completed_at.is_some() {
                    break;
                }
            }
            db::consumers::DeleteStep::Busy => break,
        }
    }
    tracing::info!(
        tenant = %tenant, consumer = %uid, deletion = %id,
        tokens_revoked = row.tokens_revoked,
        endpoints_disabled = row.endpoints_disabled,
        deliveries_cancelled = row.deliveries_cancelled,
        done = row.completed_at.is_some(),
        "consumer deleted"
    );
    if row.completed_at.is_some() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    tokio::spawn(crate::api::deletions::finish(state.pool.clone(), id, batch));
    let location = format!("/v1/consumer-deletions/{id}");
    Ok((
        StatusCode::ACCEPTED,
        [(axum::http::header::LOCATION, location)],
        Json(ConsumerDeletionOut::from(row)),
    )
        .into_response())
}

/// GET /v1/consumer-deletions/{id}
#[utoipa::path(
    get,
    path = "/v1/consumer-deletions/{id}",
    tag = "consumers",
    operation_id = "getConsumerDeletion",
    summary = "How far a consumer deletion got (scope: read)",
    params(("id" = Uuid, Path, description = "The deletion id (from DELETE /v1/consumers/{uid})")),
    responses(
        (status = 200, description = "The deletion", body = ConsumerDeletionOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn get_deletion(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    caller.require_tenant_wide()?;
    let id = super::path_id(id, "consumer deletion")?;
    let row = db::consumers::get_deletion(&state.pool, id, caller.tenant_scope())
        .await?
        .ok_or_else(|| ApiError::not_found("consumer deletion"))?;
    Ok(Json(ConsumerDeletionOut::from(row)).into_response())
}

#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConsumerTokenIn {
    /// lifetime in seconds, 60 to 604800 (default 3600)
    #[schema(minimum = 60, maximum = 604800)]
    ttl_seconds: Option<i64>,
    /// With authentication off: the tenant (required)
    tenant: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerTokenOut {
    /// a `hookd_` token confined to this consumer, with the scopes read, operate and
    /// manage that the minting credential has
    token: String,
    expires_at: DateTime<Utc>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortalOut {
    /// the customer portal, with a one-time sign-in code in the URL fragment (which
    /// browsers never send to a server): it works once, within 5 minutes, and the page
    /// trades it for a browser session, so the token is never in the browser's history
    url: String,
    /// the consumer token the code stands for, for a server that calls the API for the
    /// customer itself; never put it in a URL
    token: String,
    expires_at: DateTime<Utc>,
}

/// Mints a consumer token; the consumer is created if it does not exist yet.
async fn mint(
    caller: &Caller,
    state: &AppState,
    uid: Result<Path<String>, PathRejection>,
    headers: &HeaderMap,
    body: Body,
    sign_in_code: Option<&[u8; 32]>,
) -> Result<(String, DateTime<Utc>), ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    let uid = path_uid(uid)?;
    let input: ConsumerTokenIn = state
        .read_json_body(caller, headers, body, BODY_LIMIT, true)
        .await?;
    let tenant = tenant_of(caller, input.tenant)?;
    domain::validate_tenant(&tenant)
        .map_err(|e| ApiError::unprocessable(ErrorCode::InvalidTenant, e))?;
    let ttl = input.ttl_seconds.unwrap_or(DEFAULT_TOKEN_TTL_SECS);
    if !(60..=MAX_TOKEN_TTL_SECS).contains(&ttl) {
        return Err(ApiError::unprocessable(
            ErrorCode::InvalidField,
            format!("ttlSeconds must be between 60 and {MAX_TOKEN_TTL_SECS}"),
        ));
    }
    // A minted token never has a scope its minter lacks: a manage-only credential mints
    // manage-only consumer tokens, not a way to read or replay.
    let scopes: Vec<Scope> = [Scope::Read, Scope::Operate, Scope::Manage]
        .into_iter()
        .filter(|s| caller.require(*s).is_ok())
        .collect();
    let expires_at = Utc::now() + chrono::Duration::seconds(ttl);
    // the token commits with its consumer held, so a concurrent delete of the consumer
    // waits for it and then revokes it (db::consumers::delete)
    let mut tx = crate::db::begin(&state.pool).await?;
    db::consumers::ensure(&mut tx, &tenant, &uid).await?;
    let created = tokens::create_in(
        &mut tx,
        &TokenRequest {
            tenant: tenant.clone(),
            consumer: Some(uid.clone()),
            scopes: scopes.clone(),
            name: Some(format!("consumer {uid} (minted through the API)")),
            expires_at: Some(expires_at),
        },
    )
    .await
    .map_err(|e| match e {
        tokens::CreateTokenError::Invalid(m) => ApiError::unprocessable(ErrorCode::InvalidField, m),
        tokens::CreateTokenError::Db(e) => e.into(),
    })?;
    if let Some(code_hash) = sign_in_code {
        let ttl = chrono::Duration::from_std(sessions::CODE_TTL).expect("a small duration");
        db::sign_in::insert_code(&mut tx, code_hash, created.id, Utc::now() + ttl).await?;
    }
    tx.commit().await.map_err(db::DbError::from)?;
    tracing::info!(tenant = %tenant, consumer = %uid, token = %created.id, ttl_seconds = ttl, "consumer token minted");
    Ok((created.token, expires_at))
}

/// POST /v1/consumers/{uid}/tokens
#[utoipa::path(
    post,
    path = "/v1/consumers/{uid}/tokens",
    tag = "consumers",
    operation_id = "createConsumerToken",
    summary = "Mint a short-lived token for one consumer (scope: manage)",
    description = "For a customer-facing page: the token sees and manages only this consumer's \
        endpoints, messages, deliveries and replays. Revoked when the consumer is deleted.",
    params(("uid" = String, Path, description = "The consumer's uid")),
    request_body(content = Option<ConsumerTokenIn>, content_type = "application/json"),
    responses(
        (status = 201, description = "The token, shown once", body = ConsumerTokenOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn create_token(
    caller: Caller,
    State(state): State<AppState>,
    uid: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (token, expires_at) = mint(&caller, &state, uid, &headers, body, None).await?;
    Ok((
        StatusCode::CREATED,
        Json(ConsumerTokenOut { token, expires_at }),
    )
        .into_response())
}

/// POST /v1/consumers/{uid}/portal
#[utoipa::path(
    post,
    path = "/v1/consumers/{uid}/portal",
    tag = "consumers",
    operation_id = "createPortalLink",
    summary = "A customer portal link for one consumer (scope: manage)",
    description = "The URL carries a one-time sign-in code (not the token) in its fragment: \
        the portal exchanges it, once and within 5 minutes, for a browser session. Open or \
        embed the link right away; mint one per page view. It is relative to the API unless \
        HOOKD_PUBLIC_URL is set.",
    params(("uid" = String, Path, description = "The consumer's uid")),
    request_body(content = Option<ConsumerTokenIn>, content_type = "application/json"),
    responses(
        (status = 201, description = "The link, shown once", body = PortalOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn create_portal(
    caller: Caller,
    State(state): State<AppState>,
    uid: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (code, code_hash) = sessions::generate_code();
    let (token, expires_at) = mint(&caller, &state, uid, &headers, body, Some(&code_hash)).await?;
    let base = state
        .manage
        .public_url
        .as_deref()
        .unwrap_or("")
        .trim_end_matches('/');
    Ok((
        StatusCode::CREATED,
        Json(PortalOut {
            url: format!("{base}/portal#code={code}"),
            token,
            expires_at,
        }),
    )
        .into_response())
}
