//! The one place where errors become HTTP responses. Clients get a stable `code` and a
//! human `message`; driver errors and internals are logged, never sent.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::db::DbError;
use crate::outbox::EnqueueError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    code: &'a str,
    message: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }
    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            "the database is unavailable; nothing was written, retry with the same idempotency key",
        )
    }
    fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; nothing was written, retry with the same idempotency key",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&Body {
            error: Inner {
                code: self.code,
                message: &self.message,
            },
        })
        .unwrap_or_default();
        let mut resp = (self.status, body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        if e.is_unavailable() {
            tracing::warn!(error = %e, "database unavailable");
            ApiError::unavailable()
        } else {
            tracing::error!(error = %e, "database error");
            ApiError::internal()
        }
    }
}

impl From<EnqueueError> for ApiError {
    fn from(e: EnqueueError) -> Self {
        match e {
            EnqueueError::KeyConflict { key } => ApiError::new(
                StatusCode::CONFLICT,
                "idempotency_key_conflict",
                format!(
                    "idempotency key {key:?} was already used for a message with a different eventType or payload"
                ),
            ),
            EnqueueError::Unavailable(detail) => {
                tracing::warn!(error = %detail, "enqueue failed: database unavailable");
                ApiError::unavailable()
            }
            EnqueueError::Internal(e) => {
                tracing::error!(error = %e, "enqueue failed");
                ApiError::internal()
            }
            EnqueueError::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "hookd is shutting down; retry with the same idempotency key",
            ),
        }
    }
}
