//! Who is calling, for which tenant, with which scopes.
//!
//! Two kinds of credential travel as `Authorization: Bearer <token>`:
//! - static API tokens (`hookd_…`, made by `hookd token create`), checked against their
//!   SHA-256 in Postgres ([`tokens`]);
//! - Kubernetes ServiceAccount tokens with audience `hookd`, checked with a TokenReview
//!   ([`service_account`]).
//!
//! The prefix decides which verifier sees a token, so a static token is never sent to the
//! Kubernetes API server and a ServiceAccount token never touches the token table.
//! Nothing here logs, returns or counts a token: only a token's id or the ServiceAccount's
//! name ever appear.

mod cache;
pub mod cluster_keys;
pub mod service_account;
pub mod sessions;
pub mod tokens;

use std::sync::Arc;

use axum::http::HeaderValue;
use sqlx::PgPool;
use uuid::Uuid;

pub use service_account::ServiceAccounts;
pub use tokens::StaticTokens;

pub use crate::domain::{AuthMode, Scope};

/// Who a valid credential belongs to (never the credential itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Token {
        id: Uuid,
    },
    ServiceAccount {
        namespace: String,
        name: String,
    },
    /// an inbound source's provider, known by its signature (`POST /in/{name}`)
    Source {
        id: Uuid,
    },
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Token { id } => write!(f, "token {id}"),
            Subject::ServiceAccount { namespace, name } => {
                write!(f, "serviceaccount {namespace}/{name}")
            }
            Subject::Source { id } => write!(f, "source {id}"),
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: String,
    /// a consumer token: confined to this consumer of the tenant
    pub consumer: Option<String>,
    /// a consumer token: the generation of its consumer, and when that consumer was
    /// created; what an earlier consumer with the same uid left is not this one's
    pub consumer_generation: Option<i64>,
    pub consumer_since: Option<chrono::DateTime<chrono::Utc>>,
    pub scopes: Vec<Scope>,
    pub subject: Subject,
}

impl Principal {
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope)
    }
}

/// Why a request is not authenticated. The strings are for logs; clients get the fixed
/// texts of `api::error`.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("no Authorization: Bearer credential")]
    Missing,
    #[error("invalid credential")]
    Invalid,
    /// The credential could not be checked (database or Kubernetes API server down or
    /// refusing us). Never treated as valid, and never as invalid either: the caller may
    /// well be legitimate, so this is a 503 to retry, not a 401 to give up on.
    #[error("credentials cannot be checked right now: {0}")]
    Unavailable(String),
}

/// Longest credential accepted; a projected ServiceAccount token is about 1 KiB.
const MAX_TOKEN_LEN: usize = 8 * 1024;

/// The token from an `Authorization: Bearer <token>` header value.
pub fn bearer_token(header: Option<&HeaderValue>) -> Result<&str, AuthError> {
    let value = header.ok_or(AuthError::Missing)?;
    let value = value.to_str().map_err(|_| AuthError::Invalid)?;
    let (scheme, token) = value.split_once(' ').ok_or(AuthError::Invalid)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::Invalid);
    }
    let token = token.trim();
    if token.is_empty()
        || token.len() > MAX_TOKEN_LEN
        || !token.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(AuthError::Invalid);
    }
    Ok(token)
}

/// The verifiers of one API process. Cheap to clone.
#[derive(Clone)]
pub struct Authenticator {
    /// `None`: authentication is off (`HOOKD_AUTH=none`).
    inner: Option<Arc<Verifiers>>,
}

struct Verifiers {
    tokens: StaticTokens,
    /// `None` when no cluster is configured: ServiceAccount tokens are then invalid.
    service_accounts: Option<ServiceAccounts>,
}

impl Authenticator {
    /// Authentication off: every request is anonymous and names its tenant itself.
    pub fn disabled() -> Self {
        Authenticator { inner: None }
    }

    pub fn new(pool: PgPool, service_accounts: Option<ServiceAccounts>) -> Self {
        Authenticator {
            inner: Some(Arc::new(Verifiers {
                tokens: StaticTokens::new(pool),
                service_accounts,
            })),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Forgets cached verdicts of these tokens (just revoked): they stop working in this
    /// process at once, not when the cache entry expires.
    pub fn forget_tokens(&self, ids: &[Uuid]) {
        if let Some(v) = &self.inner {
            v.tokens.forget(ids);
        }
    }

    /// Checks the request's credential. `Ok(None)` when authentication is off.
    pub async fn authenticate(
        &self,
        authorization: Option<&HeaderValue>,
    ) -> Result<Option<Principal>, AuthError> {
        let Some(v) = &self.inner else {
            return Ok(None);
        };
        let token = bearer_token(authorization)?;
        let principal = if tokens::is_static_token(token) {
            v.tokens.verify(token).await?
        } else {
            match &v.service_accounts {
                Some(sa) => sa.verify(token).await?,
                None => return Err(AuthError::Invalid),
            }
        };
        Ok(Some(principal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_header_parsing() {
        let h = |s: &str| HeaderValue::from_str(s).unwrap();
        assert!(matches!(bearer_token(None), Err(AuthError::Missing)));
        assert_eq!(bearer_token(Some(&h("Bearer abc"))).unwrap(), "abc");
        assert_eq!(bearer_token(Some(&h("bearer  abc "))).unwrap(), "abc");
        for bad in ["Basic abc", "Bearer", "Bearer ", "abc", "Bearer a b"] {
            assert!(
                matches!(bearer_token(Some(&h(bad))), Err(AuthError::Invalid)),
                "{bad}"
            );
        }
        let long = format!("Bearer {}", "a".repeat(MAX_TOKEN_LEN + 1));
        assert!(matches!(
            bearer_token(Some(&h(&long))),
            Err(AuthError::Invalid)
        ));
    }

    #[test]
    fn scopes_round_trip() {
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
        }
        assert_eq!(Scope::parse("admin"), None);
    }
}
