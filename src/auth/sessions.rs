//! Browser sessions and one-time sign-in codes: a browser never holds a long-lived token.
//!
//! Chromium keeps every URL it opened (fragment included) in its History database and
//! session-restore files, `history.replaceState` notwithstanding, and it keeps
//! sessionStorage on disk too. So the pages hold a *session*: an ordinary `hookd_` token
//! made from the credential they were given, with the same tenant, consumer and scopes,
//! that expires within [`SESSION_TTL`] (or with its parent, if sooner) and is revoked with
//! its parent (migration 0018). Two ways in:
//!
//! - a portal link carries a one-time code, not a token: `POST /v1/sessions/from-code`
//!   uses it up (once, within [`CODE_TTL`]) and answers with a session;
//! - the console's sign-in form sends the operator's token once, as a bearer credential,
//!   to `POST /v1/sessions`, and keeps only the session it gets back.
//!
//! Why not a cookie: the portal is embedded in other sites' pages, where browsers block or
//! partition third-party cookies and never send `SameSite=Strict` ones; a bearer session in
//! the tab's sessionStorage works in an iframe and cannot be ridden by another site's
//! requests (nothing is sent automatically).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use rand::RngCore;
use uuid::Uuid;

use super::tokens::{self, DISPLAY_LEN};
use crate::db::{self, DbError};

/// How long a sign-in code can be exchanged: long enough to click a link just received,
/// short enough that a link found later in a history file or a log is dead.
pub const CODE_TTL: Duration = Duration::from_secs(5 * 60);
/// How long a browser session lasts at most: a working day. A session from a token that
/// expires sooner ends with it.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// Live sessions one token keeps: making one more deletes its oldest. Every portal link
/// has a token of its own and every console tab a session, so this is far above use; a
/// customer signing in in a loop (663 sessions in 90 s from outside) keeps only these.
pub const MAX_SESSIONS_PER_TOKEN: i64 = 50;

/// A fresh one-time code and its SHA-256 (the only form stored). 256 random bits, like a
/// token, but without the `hookd_` prefix: a code is not a credential the API accepts.
pub fn generate_code() -> (String, [u8; 32]) {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let code = URL_SAFE_NO_PAD.encode(bytes);
    let hash = tokens::hash(&code);
    (code, hash)
}

/// Whether `code` has the shape [`generate_code`] gives (anything else is not looked up).
pub fn well_formed_code(code: &str) -> bool {
    code.len() == 43
        && code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A session just made: the only time its token is known.
pub struct Session {
    pub token: String,
    pub tenant: String,
    pub consumer: Option<String>,
    pub scopes: Vec<String>,
    pub expires_at: DateTime<Utc>,
}

/// Redacted, so that a stray `{:?}` cannot log the session token.
impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("tenant", &self.tenant)
            .field("consumer", &self.consumer)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// Makes a session of the token `parent` on `conn`; `None` if that token is no longer
/// valid.
pub async fn create_in(
    conn: &mut sqlx::PgConnection,
    parent: Uuid,
) -> Result<Option<Session>, DbError> {
    let token = tokens::generate();
    let ttl = chrono::Duration::from_std(SESSION_TTL).expect("a small duration");
    let row = db::sign_in::insert_session(
        conn,
        &db::sign_in::NewSession {
            id: Uuid::now_v7(),
            parent_id: parent,
            token_hash: tokens::hash(&token).to_vec(),
            prefix: token[..DISPLAY_LEN].to_string(),
            expires_at: Utc::now() + ttl,
        },
    )
    .await?;
    if row.is_some() {
        db::sign_in::trim_sessions(conn, parent, MAX_SESSIONS_PER_TOKEN).await?;
    }
    Ok(row.map(|r| Session {
        token,
        tenant: r.tenant,
        consumer: r.consumer,
        scopes: r.scopes,
        expires_at: r.expires_at,
    }))
}

/// Whether the token `id` is itself a session (which makes none: see
/// [`MAX_SESSIONS_PER_TOKEN`]).
pub async fn is_session(pool: &sqlx::PgPool, id: Uuid) -> Result<bool, DbError> {
    db::sign_in::is_session(pool, id).await
}

/// Uses up a sign-in code and makes a session of the token it stands for; `None` for a
/// code that is unknown, used, expired, or whose token was revoked meanwhile.
pub async fn redeem(pool: &sqlx::PgPool, code: &str) -> Result<Option<Session>, DbError> {
    if !well_formed_code(code) {
        return Ok(None);
    }
    let mut tx = db::begin(pool).await?;
    let Some(parent) = db::sign_in::take_code(&mut tx, &tokens::hash(code)).await? else {
        // commit anyway: an expired code's row is gone for good
        tx.commit().await?;
        return Ok(None);
    };
    let session = create_in(&mut tx, parent).await?;
    tx.commit().await?;
    Ok(session)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_random_well_formed_and_not_tokens() {
        let (a, ha) = generate_code();
        let (b, hb) = generate_code();
        assert_ne!(a, b);
        assert_ne!(ha, hb);
        assert_eq!(ha, tokens::hash(&a));
        assert!(well_formed_code(&a) && well_formed_code(&b));
        assert!(!tokens::is_static_token(&a));
        assert!(!well_formed_code("short"));
        assert!(!well_formed_code(&format!("{}!", &a[..42])));
    }
}
