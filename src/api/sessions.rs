//! `/v1/sessions`: what the console and the portal sign in with, so that no long-lived
//! token ever sits in a browser's history or storage (see `auth::sessions`).

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::body;
use super::caller::Caller;
use super::error::ApiError;
use super::openapi::responses;
use crate::auth::{Subject, sessions};
use crate::db;

/// A code is 43 characters; the body is `{"code": "…"}`.
const BODY_LIMIT: usize = 1024;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignInCodeIn {
    /// the one-time code of a portal link (its `#code=` fragment)
    code: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionOut {
    /// a `hookd_` token for this browser tab: the scopes, tenant and consumer of the
    /// credential it was made from, revoked with it
    token: String,
    expires_at: DateTime<Utc>,
    tenant: String,
    consumer: Option<String>,
    scopes: Vec<String>,
}

impl From<sessions::Session> for SessionOut {
    fn from(s: sessions::Session) -> Self {
        SessionOut {
            token: s.token,
            expires_at: s.expires_at,
            tenant: s.tenant,
            consumer: s.consumer,
            scopes: s.scopes,
        }
    }
}

fn created(s: sessions::Session) -> Response {
    (
        StatusCode::CREATED,
        // a session is a credential: no cache may keep the answer
        [(
            axum::http::header::CACHE_CONTROL,
            axum::http::HeaderValue::from_static("no-store"),
        )],
        Json(SessionOut::from(s)),
    )
        .into_response()
}

/// POST /v1/sessions
#[utoipa::path(
    post,
    path = "/v1/sessions",
    tag = "tokens",
    operation_id = "createSession",
    summary = "A browser session made from the presented hookd_ token (any scope)",
    description = "The console's sign-in: the page sends the operator's token once and keeps \
        only the session, a token with the same tenant, consumer and scopes that expires within \
        12 hours (sooner if its parent does) and is revoked with its parent. A token keeps its \
        50 newest sessions (the oldest is deleted); a session makes none (422 \
        `session_needs_token`).",
    responses(
        (status = 201, description = "The session, shown once", body = SessionOut),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn create(caller: Caller, State(state): State<AppState>) -> Result<Response, ApiError> {
    let parent = match &caller {
        Caller::Authenticated(p) => match p.subject {
            Subject::Token { id } => id,
            Subject::ServiceAccount { .. } | Subject::Source { .. } => {
                return Err(ApiError::session_needs_token());
            }
        },
        Caller::Anonymous => return Err(ApiError::session_needs_token()),
    };
    // every session is a row: a customer looping sign-ins spends its own rate, not the
    // database everyone shares
    state.admit_work(&caller, 1)?;
    if sessions::is_session(&state.pool, parent).await? {
        return Err(ApiError::session_from_session());
    }
    let mut conn = state.pool.acquire().await.map_err(db::DbError::from)?;
    let session = sessions::create_in(&mut conn, parent)
        .await?
        // revoked between its verification and now
        .ok_or(crate::auth::AuthError::Invalid)?;
    tracing::info!(tenant = %session.tenant, parent = %parent, "browser session made from a token");
    Ok(created(session))
}

/// POST /v1/sessions/from-code
#[utoipa::path(
    post,
    path = "/v1/sessions/from-code",
    tag = "tokens",
    operation_id = "createSessionFromCode",
    summary = "Exchange a portal link's one-time code for a browser session (no credential)",
    description = "A code works once, within 5 minutes of the link being made; a used, expired \
        or unknown code (or one whose token was revoked) is 401 `sign_in_code_invalid`.",
    request_body(content = SignInCodeIn, content_type = "application/json"),
    responses(
        (status = 201, description = "The session, shown once", body = SessionOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, response = responses::Unprocessable),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(())
)]
pub async fn from_code(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    body::require_json(&headers)?;
    let bytes = body::read_limited(body, BODY_LIMIT).await?;
    let input: SignInCodeIn = body::parse(&bytes)?;
    let session = sessions::redeem(&state.pool, &input.code)
        .await?
        .ok_or_else(ApiError::sign_in_code_invalid)?;
    tracing::info!(tenant = %session.tenant, consumer = ?session.consumer, "sign-in code exchanged for a browser session");
    Ok(created(session))
}

/// DELETE /v1/sessions
#[utoipa::path(
    delete,
    path = "/v1/sessions",
    tag = "tokens",
    operation_id = "endSession",
    summary = "Sign out: revoke the presented browser session (any scope)",
    description = "Revokes the bearer credential if it is a session (made by POST /v1/sessions \
        or from a sign-in code): 204. Any other credential is left alone: 422 `not_a_session`.",
    responses(
        (status = 204, description = "The session is revoked"),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 422, response = responses::Unprocessable),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn end(caller: Caller, State(state): State<AppState>) -> Result<Response, ApiError> {
    let id = match &caller {
        Caller::Authenticated(p) => match p.subject {
            Subject::Token { id } => Some(id),
            Subject::ServiceAccount { .. } | Subject::Source { .. } => None,
        },
        Caller::Anonymous => None,
    };
    let ended = match id {
        Some(id) => db::sign_in::end_session(&state.pool, id).await?,
        None => false,
    };
    if !ended {
        return Err(ApiError::not_a_session());
    }
    if let Some(id) = id {
        state.auth.forget_tokens(&[id]);
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}
