//! The caller of a `/v1` request, as every handler's first extractor: authentication runs
//! before anything of the request body is read, so an unauthenticated client learns
//! nothing from validation errors and costs no parsing.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use super::AppState;
use super::error::ApiError;
use crate::auth::{AuthError, Principal, Scope};
use crate::domain::ErrorCode;

/// `Anonymous` only when authentication is off (`HOOKD_AUTH=none`).
#[derive(Debug, Clone)]
pub enum Caller {
    Anonymous,
    Authenticated(Principal),
}

impl Caller {
    /// 403 unless the credential carries `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        match self {
            Caller::Authenticated(p) if !p.has(scope) => Err(ApiError::insufficient_scope(scope)),
            _ => Ok(()),
        }
    }

    /// The tenant reads and replays are confined to; `None` (every tenant) only when
    /// authentication is off.
    pub fn tenant_scope(&self) -> Option<&str> {
        match self {
            Caller::Anonymous => None,
            Caller::Authenticated(p) => Some(&p.tenant),
        }
    }

    /// Whose rows this caller may read: its tenant, and its consumer for a consumer token.
    pub fn audience(&self) -> crate::db::Audience<'_> {
        match self {
            Caller::Anonymous => crate::db::Audience::default(),
            Caller::Authenticated(p) => crate::db::Audience {
                tenant: Some(&p.tenant),
                consumer: p.consumer.as_deref(),
                consumer_generation: p.consumer_generation,
                since: p.consumer_since.map(crate::db::events::uuid_floor),
            },
        }
    }

    /// The consumer a consumer token is confined to.
    pub fn consumer_scope(&self) -> Option<&str> {
        match self {
            Caller::Anonymous => None,
            Caller::Authenticated(p) => p.consumer.as_deref(),
        }
    }

    /// 403 for a consumer token: routes that act on the whole tenant (consumers, minting
    /// tokens) are never a consumer's.
    pub fn require_tenant_wide(&self) -> Result<(), ApiError> {
        match self.consumer_scope() {
            Some(c) => Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                ErrorCode::ConsumerToken,
                format!(
                    "this credential is confined to consumer {c:?}; this route needs a tenant credential"
                ),
            )),
            None => Ok(()),
        }
    }

    /// The consumer a write is for: a consumer token's own, which the request may repeat
    /// but not change (403); otherwise the one named (or none).
    pub fn resolve_consumer(&self, named: Option<String>) -> Result<Option<String>, ApiError> {
        match (self.consumer_scope(), named) {
            (Some(own), Some(n)) if n != own => Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                ErrorCode::ConsumerMismatch,
                format!("this credential acts for consumer {own:?}, not {n:?}; omit consumer"),
            )),
            (Some(own), _) => Ok(Some(own.to_owned())),
            (None, named) => Ok(named),
        }
    }

    /// The tenant a write or query acts for: the credential's, which a tenant named in the
    /// request may repeat but not change (403). Without authentication, the named one.
    pub fn resolve_tenant(&self, named: Option<String>) -> Result<Option<String>, ApiError> {
        match (self, named) {
            (Caller::Anonymous, named) => Ok(named),
            (Caller::Authenticated(p), Some(n)) if n != p.tenant => {
                Err(ApiError::tenant_mismatch(&p.tenant, &n))
            }
            (Caller::Authenticated(p), _) => Ok(Some(p.tenant.clone())),
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // Two credentials are ambiguous: proxies and frameworks disagree on which one wins,
        // so one of them could authorise what another layer logged or checked as the other.
        if parts
            .headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .nth(1)
            .is_some()
        {
            state.metrics.count_auth_failure("duplicate");
            return Err(ApiError::bad_request(
                ErrorCode::DuplicateAuthorization,
                "the request carries more than one Authorization header; send exactly one",
            ));
        }
        match state
            .auth
            .authenticate(parts.headers.get(header::AUTHORIZATION))
            .await
        {
            Ok(None) => Ok(Caller::Anonymous),
            Ok(Some(p)) => {
                tracing::trace!(subject = %p.subject, tenant = %p.tenant, "authenticated");
                let caller = Caller::Authenticated(p);
                // every read of a consumer token, whichever route (writes are charged as
                // work by their handlers)
                if matches!(
                    parts.method,
                    axum::http::Method::GET | axum::http::Method::HEAD
                ) {
                    state.admit_read(&caller)?;
                }
                Ok(caller)
            }
            Err(e) => {
                let reason = match &e {
                    AuthError::Missing => "missing",
                    AuthError::Invalid => "invalid",
                    AuthError::Unavailable(_) => "unavailable",
                };
                state.metrics.count_auth_failure(reason);
                Err(e.into())
            }
        }
    }
}
