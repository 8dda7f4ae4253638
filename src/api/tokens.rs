//! `/v1/tokens`: a tenant's API tokens, consumer tokens included, listed without their
//! secrets and revoked one at a time (scope `manage`, tenant credentials only).

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::caller::Caller;
use super::error::ApiError;
use super::listing::{check_consumer_filter, page_limit, query, uuid_cursor};
use super::openapi::responses;
use super::{AppState, path_id};
use crate::auth::Scope;
use crate::db;

/// A token as listed: never its secret, only the first characters that tell it apart.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenOut {
    id: Uuid,
    /// `hookd_` and the first 8 characters of the secret
    prefix: String,
    tenant: String,
    /// set for a consumer token
    consumer: Option<String>,
    scopes: Vec<String>,
    name: Option<String>,
    created_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
}

impl From<db::tokens::TokenRow> for TokenOut {
    fn from(t: db::tokens::TokenRow) -> Self {
        TokenOut {
            id: t.id,
            prefix: t.prefix,
            tenant: t.tenant,
            consumer: t.consumer,
            scopes: t.scopes,
            name: t.name,
            created_at: t.created_at,
            expires_at: t.expires_at,
            revoked_at: t.revoked_at,
        }
    }
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct TokenListParams {
    /// only this consumer's tokens
    #[param(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    consumer: Option<String>,
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
pub struct TokenPage {
    /// newest first
    items: Vec<TokenOut>,
    next_cursor: Option<String>,
}

/// GET /v1/tokens
#[utoipa::path(
    get,
    path = "/v1/tokens",
    tag = "tokens",
    operation_id = "listTokens",
    summary = "The tenant's API tokens, consumer tokens included, newest first (scope: manage)",
    description = "Never a token's secret: its id, its first characters, its scopes, \
        consumer, expiry and revocation.",
    params(TokenListParams),
    responses(
        (status = 200, description = "A page of tokens", body = TokenPage),
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
    params: Result<Query<TokenListParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    let p = query(params)?;
    let tenant = caller.resolve_tenant(p.tenant)?;
    check_consumer_filter(p.consumer.as_deref())?;
    let limit = page_limit(p.limit)?;
    let before = uuid_cursor(p.cursor.as_deref())?;
    let rows = db::tokens::list_page(
        &state.pool,
        tenant.as_deref(),
        p.consumer.as_deref(),
        before,
        limit,
    )
    .await?;
    let next_cursor = super::listing::next_cursor(&rows, limit, |r| r.id.to_string());
    Ok(Json(TokenPage {
        items: rows.into_iter().map(Into::into).collect(),
        next_cursor,
    })
    .into_response())
}

/// DELETE /v1/tokens/{id}
#[utoipa::path(
    delete,
    path = "/v1/tokens/{id}",
    tag = "tokens",
    operation_id = "revokeToken",
    summary = "Revoke a token at once (scope: manage)",
    description = "Refused from then on by this API process; other replicas refuse it once \
        their 5-second verification cache lets go. Revoking it again changes nothing.",
    params(("id" = Uuid, Path, description = "The token id")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn revoke(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<axum::extract::Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    let id = path_id(id, "token")?;
    match db::tokens::revoke_in_tenant(&state.pool, id, caller.tenant_scope()).await? {
        db::tokens::Revoked::NotFound => Err(ApiError::not_found("token")),
        db::tokens::Revoked::Now | db::tokens::Revoked::Already(_) => {
            state.auth.forget_tokens(&[id]);
            tracing::info!(token = %id, tenant = ?caller.tenant_scope(), "token revoked through the API");
            Ok(StatusCode::NO_CONTENT.into_response())
        }
    }
}
