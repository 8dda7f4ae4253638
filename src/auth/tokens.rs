//! Static API tokens: `hookd_` + 43 characters of URL-safe base64 (256 random bits).
//!
//! The fixed `hookd_` prefix lets secret scanners recognise a leaked token, and lets the API
//! tell a static token from a ServiceAccount JWT without a lookup. Only the SHA-256 of a
//! token is stored; the token itself exists in the output of `hookd token create` and
//! nowhere else.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use super::cache::{Key, TtlCache};
use super::{AuthError, Principal, Scope, Subject};
use crate::db::{self, DbError};

pub const TOKEN_PREFIX: &str = "hookd_";
/// 32 random bytes in unpadded base64.
const SECRET_LEN: usize = 43;
/// Characters of a token kept in the table and shown by `hookd token list`: the prefix
/// and 8 characters (48 bits) of the secret — enough to tell tokens apart, far too few
/// to guess the other 208 bits.
pub(crate) const DISPLAY_LEN: usize = TOKEN_PREFIX.len() + 8;

/// How long a verification result is reused. This bounds how long a revoked token keeps
/// working (the README promises "within 5 seconds") while sparing Postgres one lookup
/// per request at ingest rates.
pub const CACHE_TTL: Duration = Duration::from_secs(5);
const CACHE_MAX_ENTRIES: usize = 10_000;

/// Whether `token` has the shape of a static token (and so is never sent to Kubernetes).
pub fn is_static_token(token: &str) -> bool {
    token.starts_with(TOKEN_PREFIX)
}

fn well_formed(token: &str) -> bool {
    token.strip_prefix(TOKEN_PREFIX).is_some_and(|s| {
        s.len() == SECRET_LEN
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// SHA-256 of the token text: the only form in which a token is stored.
pub fn hash(token: &str) -> Key {
    Sha256::digest(token.as_bytes()).into()
}

/// A new random token.
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// What `hookd token create` asks for.
#[derive(Debug, Clone)]
pub struct TokenRequest {
    pub tenant: String,
    /// confine the token to this consumer of the tenant
    pub consumer: Option<String>,
    pub scopes: Vec<Scope>,
    pub name: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// A freshly created token: the only time `token` is known.
pub struct CreatedToken {
    pub id: Uuid,
    pub token: String,
    pub prefix: String,
}

/// Redacted, so that a stray `{:?}` cannot log the token.
impl std::fmt::Debug for CreatedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedToken")
            .field("id", &self.id)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CreateTokenError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// Mints a token and stores its hash.
pub async fn create(pool: &PgPool, req: &TokenRequest) -> Result<CreatedToken, CreateTokenError> {
    let mut conn = pool.acquire().await.map_err(DbError::from)?;
    create_in(&mut conn, req).await
}

/// [`create`] on the caller's connection, so the token can commit with what it depends
/// on (a consumer token with its consumer held, see `db::consumers::ensure`).
pub async fn create_in(
    conn: &mut sqlx::PgConnection,
    req: &TokenRequest,
) -> Result<CreatedToken, CreateTokenError> {
    crate::domain::validate_tenant(&req.tenant).map_err(CreateTokenError::Invalid)?;
    if req.scopes.is_empty() {
        return Err(CreateTokenError::Invalid(
            "at least one scope is required (produce, read, operate, manage)".into(),
        ));
    }
    if let Some(c) = &req.consumer {
        crate::domain::validate_consumer(c).map_err(CreateTokenError::Invalid)?;
        if req.scopes.contains(&Scope::Produce) {
            return Err(CreateTokenError::Invalid(
                "a consumer token cannot have the produce scope: consumers receive events, they do not enqueue them".into(),
            ));
        }
    }
    if req.name.as_ref().is_some_and(|n| n.len() > 200) {
        return Err(CreateTokenError::Invalid(
            "name is longer than 200 bytes".into(),
        ));
    }
    if req.expires_at.is_some_and(|at| at <= Utc::now()) {
        return Err(CreateTokenError::Invalid(
            "the expiry is in the past".into(),
        ));
    }
    let mut scopes = req.scopes.clone();
    scopes.sort();
    scopes.dedup();
    // the token is for the consumer as it is now: held (and created if need be) in this
    // transaction, so a concurrent delete revokes it, and a later consumer with the same
    // uid does not inherit it
    let consumer_generation = match &req.consumer {
        Some(c) => Some(db::consumers::ensure(conn, &req.tenant, c).await?),
        None => None,
    };
    let token = generate();
    let id = Uuid::now_v7();
    let prefix = token[..DISPLAY_LEN].to_string();
    db::tokens::insert(
        conn,
        &db::tokens::NewToken {
            id,
            token_hash: hash(&token).to_vec(),
            prefix: prefix.clone(),
            tenant: req.tenant.clone(),
            consumer: req.consumer.clone(),
            consumer_generation,
            scopes: scopes.iter().map(|s| s.as_str().to_string()).collect(),
            name: req.name.clone(),
            expires_at: req.expires_at,
        },
    )
    .await?;
    Ok(CreatedToken { id, token, prefix })
}

/// Verifies static tokens against the table, with a short cache of results (valid and
/// invalid alike: a fresh token cannot have been presented before it existed, so caching
/// "unknown" never locks out a new token).
pub struct StaticTokens {
    pool: PgPool,
    cache: TtlCache<Option<Principal>>,
}

impl StaticTokens {
    pub fn new(pool: PgPool) -> Self {
        StaticTokens {
            pool,
            cache: TtlCache::new(CACHE_MAX_ENTRIES),
        }
    }

    /// Forgets the cached verdicts of these tokens (see `Authenticator::forget_tokens`).
    pub fn forget(&self, ids: &[Uuid]) {
        self.cache.remove_where(|p| {
            matches!(p, Some(Principal { subject: Subject::Token { id }, .. }) if ids.contains(id))
        });
    }

    pub async fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        if !well_formed(token) {
            return Err(AuthError::Invalid);
        }
        let key = hash(token);
        let now = Instant::now();
        if let Some(cached) = self.cache.get(&key, now) {
            return cached.ok_or(AuthError::Invalid);
        }
        let row = db::tokens::find_valid(&self.pool, &key)
            .await
            .map_err(|e| AuthError::Unavailable(e.to_string()))?;
        let mut until = now + CACHE_TTL;
        let principal = row.map(|t| {
            // an expiring token is not served from the cache past its expiry
            if let Some(left) = t.expires_at.and_then(|at| (at - Utc::now()).to_std().ok()) {
                until = until.min(now + left);
            }
            let is_consumer = t.consumer.is_some();
            Principal {
                tenant: t.tenant,
                consumer: t.consumer,
                consumer_generation: t.consumer_generation,
                consumer_since: t.consumer_since,
                // a consumer token made before migration 0017 may list produce: never honoured
                scopes: t
                    .scopes
                    .iter()
                    .filter_map(|s| Scope::parse(s))
                    .filter(|s| !(is_consumer && *s == Scope::Produce))
                    .collect(),
                subject: Subject::Token { id: t.id },
            }
        });
        self.cache.insert(key, principal.clone(), until, now);
        principal.ok_or(AuthError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_well_formed_and_distinct() {
        let a = generate();
        let b = generate();
        assert_ne!(a, b);
        for t in [&a, &b] {
            assert!(t.starts_with("hookd_"), "{t}");
            assert_eq!(t.len(), 6 + 43);
            assert!(well_formed(t), "{t}");
            assert!(is_static_token(t));
        }
        assert!(!well_formed("hookd_short"));
        assert!(!well_formed(&format!("hookd_{}", "a".repeat(42) + "!")));
        assert!(!is_static_token("eyJhbGciOiJSUzI1NiJ9.e30.sig"));
        assert_ne!(hash(&a), hash(&b));
    }
}
