//! The one place where errors become HTTP responses. Clients get a stable `code` and a
//! human `message`; driver errors and internals are logged, never sent. Credentials are
//! never part of a message: an authentication failure says what was wrong with the
//! request, not what it carried.

use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::{AuthError, Scope};
use crate::catalog::{CatalogError, CheckError};
use crate::db::DbError;
use crate::db::endpoints::PatchRefused;
use crate::domain::ErrorCode;
use crate::endpoints::EndpointError;
use crate::inbound::sources::SourceError;
use crate::outbox::EnqueueError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
    /// extra response headers (WWW-Authenticate, Retry-After)
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// Every error answer: `{"error": {"code", "message"}}`.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable and machine-readable: one of the codes of the `ErrorCode` schema. A string
    /// here, not that enum, so a client built from this document still reads an answer
    /// whose code a later version added (and treats it as it treats the status).
    #[schema(value_type = String)]
    pub code: ErrorCode,
    /// for humans; wording may change
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            headers: Vec::new(),
        }
    }
    fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }
    pub fn with_retry_after(self, secs: u64) -> Self {
        self.with_header(header::RETRY_AFTER, HeaderValue::from(secs))
    }
    pub fn bad_request(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
    pub fn unprocessable(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }
    /// A sign-in code that is unknown, used already, expired, or whose token was revoked:
    /// one answer for all four, so a guesser learns nothing.
    pub fn sign_in_code_invalid() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::SignInCodeInvalid,
            "this sign-in link was used already or has expired; ask for a new one",
        )
    }
    /// A session is made from a `hookd_` token only (a ServiceAccount token is for
    /// workloads, and with authentication off there is no credential to make it of).
    pub fn session_needs_token() -> Self {
        Self::unprocessable(
            ErrorCode::SessionNeedsToken,
            "a browser session is made from a hookd_ API token; this request carries none",
        )
    }
    /// A session presented to make another: sessions hang off tokens only, so that a
    /// token's sessions are bounded ([`crate::auth::sessions::MAX_SESSIONS_PER_TOKEN`]).
    pub fn session_from_session() -> Self {
        Self::unprocessable(
            ErrorCode::SessionNeedsToken,
            "a browser session is made from a hookd_ API token, not from another session; sign in with the token",
        )
    }
    /// Sign-out with a credential that is not a browser session: a token is revoked with
    /// `DELETE /v1/tokens/{id}`, never by presenting it.
    pub fn not_a_session() -> Self {
        Self::unprocessable(
            ErrorCode::NotASession,
            "this credential is not a browser session; revoke a token with DELETE /v1/tokens/{id}",
        )
    }
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("{what} not found"),
        )
    }
    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::DatabaseUnavailable,
            "the database is unavailable; nothing was written, retry with the same idempotency key",
        )
    }
    /// 500 on any route. It claims nothing about writes: a route may fail after its
    /// statement committed (a consumer upsert did, reading back what it stored).
    pub(crate) fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            "internal error; the server's log has the cause",
        )
    }
    /// 500 from an enqueue whose transaction rolled back.
    fn internal_nothing_written() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            "internal error; nothing was written, retry with the same idempotency key",
        )
    }
    /// 403: the credential is valid but lacks `scope` for this route.
    pub fn insufficient_scope(scope: Scope) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            ErrorCode::InsufficientScope,
            format!("this credential does not have the {scope} scope this route needs"),
        )
        .with_header(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(match scope {
                Scope::Produce => r#"Bearer error="insufficient_scope", scope="produce""#,
                Scope::Read => r#"Bearer error="insufficient_scope", scope="read""#,
                Scope::Operate => r#"Bearer error="insufficient_scope", scope="operate""#,
                Scope::Manage => r#"Bearer error="insufficient_scope", scope="manage""#,
            }),
        )
    }
    /// 403: the request names a tenant other than the credential's.
    pub fn tenant_mismatch(credential: &str, requested: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            ErrorCode::TenantMismatch,
            format!(
                "this credential acts for tenant {credential:?}, not {requested:?}; omit tenant or use a credential of that tenant"
            ),
        )
    }
    /// 429 with the number of seconds to wait.
    pub fn rate_limited(tenant: &str, retry_after: Duration) -> Self {
        let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::RateLimited,
            format!(
                "tenant {tenant:?} is over its ingest rate limit; nothing was written, retry after {secs} s"
            ),
        )
        .with_header(header::RETRY_AFTER, HeaderValue::from(secs))
    }
    pub fn request_timeout(limit: Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            ErrorCode::RequestTimeout,
            format!(
                "the request did not complete within {} s; if it was an enqueue, retry with the same idempotency key",
                limit.as_secs()
            ),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
            },
        })
        .unwrap_or_default();
        let mut resp = (self.status, body).into_response();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        resp
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Missing => ApiError::new(
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthenticated,
                "this route needs an Authorization: Bearer credential (a hookd_ API token or a ServiceAccount token with audience hookd)",
            )
            .with_header(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Bearer realm="hookd""#),
            ),
            AuthError::Invalid => ApiError::new(
                StatusCode::UNAUTHORIZED,
                ErrorCode::InvalidCredential,
                "the credential is malformed, unknown, revoked or expired",
            )
            .with_header(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Bearer realm="hookd", error="invalid_token""#),
            ),
            AuthError::Unavailable(detail) => {
                tracing::warn!(error = %detail, "credential check unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::AuthUnavailable,
                    "credentials cannot be checked right now; nothing was written, retry later",
                )
            }
        }
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        if e.is_transient_conflict() {
            // what a deletion or cancellation answers once its retries are spent
            tracing::warn!(error = %e, "conflict with concurrent writes after retries");
            Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::WriteConflict,
                "this change kept meeting concurrent writes to the same rows (deadlock or serialization failure) and was rolled back each time; nothing was changed, retry the request",
            )
            .with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
        } else if e.is_unavailable() {
            tracing::warn!(error = %e, "database unavailable");
            ApiError::unavailable()
        } else {
            tracing::error!(error = %e, "database error");
            ApiError::internal()
        }
    }
}

impl From<EndpointError> for ApiError {
    fn from(e: EndpointError) -> Self {
        match e {
            EndpointError::Invalid(message) => {
                ApiError::unprocessable(ErrorCode::InvalidField, message)
            }
            EndpointError::WeakSecret(message) => {
                ApiError::unprocessable(ErrorCode::WeakSecret, message)
            }
            EndpointError::ConsumerNotFound => ApiError::not_found("consumer"),
            EndpointError::ConsumerLimit { consumer, cap } => ApiError::unprocessable(
                ErrorCode::ConsumerEndpointLimit,
                format!(
                    "consumer {consumer:?} has {cap} endpoints, the most one consumer may have (HOOKD_CONSUMER_MAX_ENDPOINTS); delete one first"
                ),
            ),
            EndpointError::TenantLimit { tenant, cap } => ApiError::unprocessable(
                ErrorCode::TenantEndpointLimit,
                format!(
                    "tenant {tenant:?} has {cap} endpoints made through the API, the most one tenant may have (HOOKD_TENANT_MAX_ENDPOINTS); delete one first"
                ),
            ),
            EndpointError::Refused(PatchRefused::NotFound) => ApiError::not_found("endpoint"),
            EndpointError::Refused(PatchRefused::ManagedByKubernetes) => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::ManagedByKubernetes,
                // The declaration is the source of truth: a change made here would be undone
                // by the controller's next resync or the next `hookd apply` of the same file.
                "this endpoint is declared by a WebhookEndpoint object; change that object instead: in a cluster with kubectl (kubectl apply, or kubectl delete); without one, where `hookd apply -f FILE` stored it, with `hookd apply -f FILE` (set `paused: true` in its spec to pause it) or `hookd delete -f FILE`",
            ),
            EndpointError::Refused(PatchRefused::ConsumerDeleted) => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::ConsumerDeleted,
                "this endpoint's consumer was deleted; it stays disabled for good (a consumer created again with the same uid is another customer and starts without it)",
            ),
            EndpointError::Db(e) => e.into(),
        }
    }
}

impl From<SourceError> for ApiError {
    fn from(e: SourceError) -> Self {
        match e {
            SourceError::Invalid(message) => {
                ApiError::unprocessable(ErrorCode::InvalidField, message)
            }
            SourceError::NameTaken(name) => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::SourceExists,
                format!(
                    "a source named {name:?} exists (names are unique across tenants: they are the URL providers send to); choose another"
                ),
            ),
            SourceError::TenantLimit { tenant, cap } => ApiError::unprocessable(
                ErrorCode::TenantSourceLimit,
                format!(
                    "tenant {tenant:?} has {cap} sources, the most one tenant may have; delete one first"
                ),
            ),
            SourceError::ManagedByKubernetes(name) => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::ManagedByKubernetes,
                format!(
                    "source {name:?} is declared by a WebhookSource object; change that object (or its Secret) with kubectl instead"
                ),
            ),
            SourceError::Db(e) => e.into(),
        }
    }
}

impl From<CatalogError> for ApiError {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::InvalidName(message) => {
                ApiError::unprocessable(ErrorCode::InvalidEventType, message)
            }
            CatalogError::Reserved(message) => {
                ApiError::unprocessable(ErrorCode::ReservedEventType, message)
            }
            CatalogError::Invalid(message) => {
                ApiError::unprocessable(ErrorCode::InvalidField, message)
            }
            CatalogError::InvalidSchema(message) => {
                ApiError::unprocessable(ErrorCode::InvalidSchema, message)
            }
            CatalogError::Exists(name) => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::EventTypeExists,
                format!(
                    "event type {name:?} is in the catalog already; change it with PATCH /v1/event-types/{name}"
                ),
            ),
            CatalogError::TenantLimit { tenant, cap } => ApiError::unprocessable(
                ErrorCode::TenantEventTypeLimit,
                format!(
                    "tenant {tenant:?} has {cap} event types, the most one tenant may have; delete one first"
                ),
            ),
            CatalogError::ManagedByKubernetes(name) => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::ManagedByKubernetes,
                format!(
                    "event type {name:?} is declared by a WebhookEventType object; change that object instead (kubectl, or hookd apply -f FILE where it was applied)"
                ),
            ),
            CatalogError::Db(e) => e.into(),
        }
    }
}

/// A message refused at enqueue by its type's catalog entry: nothing of the request was
/// written. `prefix` names the message of a batch (`messages[2]: `).
pub fn catalog_refusal(e: CheckError, batch: bool) -> ApiError {
    let prefix = |index: usize| {
        if batch {
            format!("messages[{index}]: ")
        } else {
            String::new()
        }
    };
    match e {
        CheckError::Unknown {
            index,
            tenant,
            event_type,
        } => ApiError::unprocessable(
            ErrorCode::UnknownEventType,
            format!(
                "{}event type {event_type:?} is not in tenant {tenant:?}'s catalog (GET /v1/event-types); declare it, or send without \"validate\": true; nothing was written",
                prefix(index)
            ),
        ),
        CheckError::Violation { index, message } => ApiError::unprocessable(
            ErrorCode::SchemaViolation,
            format!("{}{message}; nothing was written", prefix(index)),
        ),
        CheckError::BrokenSchema {
            index,
            event_type,
            problem,
        } => ApiError::unprocessable(
            ErrorCode::InvalidSchema,
            format!(
                "{}the stored schema of event type {event_type:?} does not compile with this hookd ({problem}); replace it with PATCH /v1/event-types/{event_type}; nothing was written",
                prefix(index)
            ),
        ),
        CheckError::Internal(detail) => {
            tracing::error!(error = %detail, "event-type check failed");
            ApiError::internal_nothing_written()
        }
        CheckError::Db(e) => e.into(),
    }
}

impl From<EnqueueError> for ApiError {
    fn from(e: EnqueueError) -> Self {
        match e {
            EnqueueError::KeyConflict { key } => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::IdempotencyKeyConflict,
                format!(
                    "idempotency key {key:?} was already used for a message with a different eventType or payload"
                ),
            ),
            EnqueueError::KeyInUse { key } => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::IdempotencyKeyInUse,
                format!(
                    "idempotency key {key:?} is held by a request that has not finished committing; retry shortly with the same key"
                ),
            )
            .with_header(header::RETRY_AFTER, HeaderValue::from_static("1")),
            EnqueueError::OrderingKeyInUse { key } => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::OrderingKeyInUse,
                format!(
                    "ordering key {key:?} is held by a transaction that has not finished committing (a producer's own transaction through hookd.enqueue, or a replay); nothing was written, retry shortly"
                ),
            )
            .with_header(header::RETRY_AFTER, HeaderValue::from_static("1")),
            EnqueueError::CommitOutcomeUnknown(detail) => {
                tracing::error!(error = %detail, "enqueue: commit outcome unknown");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::CommitOutcomeUnknown,
                    "the database connection failed while committing and the outcome could not be checked: the event may exist. Retry with the same idempotency key (a retry without one may create a second event)",
                )
                .with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
            }
            EnqueueError::Unavailable(detail) => {
                tracing::warn!(error = %detail, "enqueue failed: database unavailable");
                ApiError::unavailable()
            }
            EnqueueError::Internal(e) => {
                tracing::error!(error = %e, "enqueue failed");
                ApiError::internal_nothing_written()
            }
            EnqueueError::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::ShuttingDown,
                "hookd is shutting down; retry with the same idempotency key",
            ),
        }
    }
}
