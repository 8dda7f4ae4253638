//! Endpoint rules shared by both sources of endpoints (WebhookEndpoint objects through
//! `k8s::sync`, and the endpoints API): what a valid URL, event-type filter, header set
//! and signing secret are, and how a secret reaches the database (sealed, never plain).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::crypto::Keyring;
use crate::db::{self, DbError};
use crate::outbound::{AllowList, check_ip, check_url};

/// Longest accepted URL (the CRD's bound).
pub const MAX_URL_LEN: usize = 2048;
/// Most entries in `eventTypes` and `headers` (the CRD's bounds).
pub const MAX_EVENT_TYPES: usize = 64;
pub const MAX_HEADERS: usize = 32;

/// Headers hookd sets itself, and the hop-by-hop and body-framing ones that would change
/// how a delivery is sent or read (a `content-encoding: gzip` on a plain body makes every
/// delivery unreadable to a standard receiver); an endpoint cannot set them, whichever
/// door it comes in by. The API and `hookd apply` check them here, a WebhookEndpoint's CRD
/// by [`HEADER_NAME_CEL`] (which lists the same names: a test ties the two), and the
/// controller holds an object stored before its CRD refused the name.
pub const RESERVED_HEADERS: [&str; 15] = [
    "content-type",
    "content-length",
    "host",
    "idempotency-key",
    "user-agent",
    "transfer-encoding",
    "connection",
    "content-encoding",
    "expect",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
];

/// The CRD's rule for `spec.headers` keys: [`RESERVED_HEADERS`] in CEL.
pub const HEADER_NAME_CEL: &str = "self.all(k, k.matches('^[A-Za-z0-9-]{1,64}$') && !k.lowerAscii().startsWith('webhook-') && !(k.lowerAscii() in ['content-type', 'content-length', 'host', 'idempotency-key', 'user-agent', 'transfer-encoding', 'connection', 'content-encoding', 'expect', 'upgrade', 'te', 'trailer', 'keep-alive', 'proxy-connection', 'proxy-authorization']))";

/// True for a name no endpoint may set (`webhook-*` and [`RESERVED_HEADERS`], any case).
/// The dispatcher also skips these when it sends, for rows stored before a door refused
/// them (`hookd apply` let `content-encoding` through).
pub fn is_reserved_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with("webhook-") || RESERVED_HEADERS.contains(&lower.as_str())
}

/// The one refusal of a header name, word for word in every door (the CRD's message).
pub const HEADER_NAME_RULE: &str = "headers keys must be header names (letters, digits, '-'; at most 64) and must not set webhook-* or a header hookd sets or that changes how a delivery is framed: content-type, content-length, host, idempotency-key, user-agent, transfer-encoding, connection, content-encoding, expect, upgrade, te, trailer, keep-alive, proxy-connection, proxy-authorization";

/// The one refusal of a header value, in every door (the CRD's message).
pub const HEADER_VALUE_RULE: &str =
    "headers values must be one line of visible text (no CR, LF or other control characters)";

/// A syntactically valid http(s) URL without credentials, and not a literal private,
/// loopback, link-local or metadata address unless `allow` admits it.
pub fn validate_url(url: &str, allow: &AllowList) -> Result<(), String> {
    if url.len() > MAX_URL_LEN {
        return Err(format!("url is longer than {MAX_URL_LEN} bytes"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("url must not contain spaces or control characters".into());
    }
    let parsed =
        reqwest::Url::parse(url).map_err(|e| format!("url is not an absolute URL: {e}"))?;
    if parsed.port() == Some(0) {
        return Err("url must not use port 0".into());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("url must not carry credentials (user:password@)".into());
    }
    check_url(&parsed, allow).map_err(|e| format!("url: {e}"))
}

/// Resolves the URL's host and refuses it when any address it resolves to is forbidden
/// (the dispatcher checks again at every send, and pins the address it checked). A name
/// that does not resolve yet is accepted: receivers are often registered before their DNS.
pub async fn check_destination(url: &str, allow: &AllowList) -> Result<(), String> {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return Ok(());
    };
    let Some(host) = parsed.host_str() else {
        return Ok(());
    };
    if host.starts_with('[') || host.parse::<IpAddr>().is_ok() {
        return Ok(()); // a literal, already checked by validate_url
    }
    let port = parsed.port_or_known_default().unwrap_or(443);
    let lookup = tokio::net::lookup_host((host.to_owned(), port));
    if let Ok(Ok(addrs)) = tokio::time::timeout(Duration::from_secs(2), lookup).await {
        for a in addrs {
            check_ip(a.ip(), allow).map_err(|e| format!("url: {e}"))?;
        }
    }
    Ok(())
}

/// `*`, an event type (`invoice.paid`) or a prefix (`invoice.*`), as `hookd.event_type_matches`
/// understands them.
pub fn validate_event_types(types: &[String]) -> Result<(), String> {
    if types.len() > MAX_EVENT_TYPES {
        return Err(format!(
            "eventTypes has {} entries; at most {MAX_EVENT_TYPES}",
            types.len()
        ));
    }
    for t in types {
        let base = t.strip_suffix(".*").unwrap_or(t);
        if t != "*" && crate::domain::validate_event_type(base).is_err() {
            return Err(format!(
                "eventTypes entry {t:?} must be '*', an event type like 'invoice.paid', or a prefix like 'invoice.*'"
            ));
        }
    }
    Ok(())
}

/// Header names of letters, digits and '-', none that hookd sets itself, values one line
/// of visible text.
pub fn validate_headers(headers: &BTreeMap<String, String>) -> Result<(), String> {
    if headers.len() > MAX_HEADERS {
        return Err(format!(
            "headers has {} entries; at most {MAX_HEADERS}",
            headers.len()
        ));
    }
    for (k, v) in headers {
        if k.is_empty()
            || k.len() > 64
            || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            || is_reserved_header(k)
        {
            return Err(format!("headers key {k:?}: {HEADER_NAME_RULE}"));
        }
        if v.contains(['\r', '\n']) || http::HeaderValue::from_str(v).is_err() {
            return Err(format!("headers.{k}: {HEADER_VALUE_RULE}"));
        }
        if v.len() > 4096 {
            return Err(format!("headers.{k}: values are at most 4096 bytes"));
        }
    }
    Ok(())
}

/// Free text bound for Postgres (a description, a name): Postgres text cannot hold U+0000.
pub fn validate_text(field: &str, text: &str, max_chars: usize) -> Result<(), String> {
    if text.chars().count() > max_chars {
        return Err(format!("{field} is longer than {max_chars} characters"));
    }
    if text.contains('\0') {
        return Err(format!("{field} must not contain NUL characters (U+0000)"));
    }
    Ok(())
}

/// A JSON document bound for `jsonb`, which cannot hold U+0000 in a key or string.
pub fn validate_json_text(field: &str, v: &serde_json::Value) -> Result<(), String> {
    let bad = |s: &str| s.contains('\0');
    let found = match v {
        serde_json::Value::String(s) => bad(s),
        serde_json::Value::Array(a) => {
            return a.iter().try_for_each(|x| validate_json_text(field, x));
        }
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                if bad(k) {
                    return Err(format!("{field} must not contain NUL characters (U+0000)"));
                }
                validate_json_text(field, x)?;
            }
            false
        }
        _ => false,
    };
    if found {
        Err(format!("{field} must not contain NUL characters (U+0000)"))
    } else {
        Ok(())
    }
}

/// A fresh signing secret: `whsec_` + base64 of 32 random bytes.
pub fn generate_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("whsec_{}", STANDARD.encode(bytes))
}

/// Makes `secret` the endpoint's current signing secret, sealed under the active key;
/// the previous one keeps signing for `grace_secs`.
pub async fn store_secret(
    conn: &mut PgConnection,
    keyring: &Keyring,
    endpoint_id: Uuid,
    secret: &str,
    grace_secs: i32,
) -> Result<db::secrets::RotateResult, DbError> {
    let sealed = keyring.encrypt(endpoint_id, secret);
    let known = keyring.fingerprints(endpoint_id, secret);
    // rows from before encryption at rest carry a bare SHA-256 fingerprint
    let legacy = Sha256::digest(secret.as_bytes()).to_vec();
    db::secrets::set_current(
        conn,
        endpoint_id,
        &db::secrets::NewSecret {
            key_id: &sealed.key_id,
            ciphertext: &sealed.ciphertext,
            fingerprint: &known[0].1,
            known: &known,
            legacy_fingerprint: &legacy,
        },
        grace_secs,
    )
    .await
}

#[cfg(test)]
mod tests {

    /// The CRD's CEL rule lists exactly the names the API and `hookd apply` refuse.
    #[test]
    fn the_crd_rule_lists_the_reserved_headers() {
        let list = HEADER_NAME_CEL.split(" in [").nth(1).unwrap();
        let list = list.split(']').next().unwrap();
        let names: Vec<&str> = list
            .split(',')
            .map(|n| n.trim().trim_matches('\''))
            .collect();
        assert_eq!(names, RESERVED_HEADERS);
        for name in RESERVED_HEADERS {
            assert!(HEADER_NAME_RULE.contains(name), "{name}");
        }
    }

    use super::*;

    #[test]
    fn urls() {
        let allow = AllowList::default();
        assert!(validate_url("https://example.com/hook", &allow).is_ok());
        for bad in [
            "ftp://example.com/",
            "example.com/hook",
            "https://user:pw@example.com/",
            "http://127.0.0.1/hook",
            "http://169.254.169.254/latest",
            "http://[::1]/",
            "https://exa mple.com/",
        ] {
            assert!(validate_url(bad, &allow).is_err(), "{bad}");
        }
    }

    #[test]
    fn event_type_patterns() {
        let ok =
            |v: &[&str]| validate_event_types(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(ok(&["*", "invoice.paid", "invoice.*", "a"]).is_ok());
        for bad in ["", ".*", "a..b", "a.*.b", "a b", "*.a"] {
            assert!(ok(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn headers() {
        let h = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(validate_headers(&h("X-Team", "billing")).is_ok());
        assert!(validate_headers(&h("webhook-id", "x")).is_err());
        assert!(validate_headers(&h("Content-Type", "x")).is_err());
        assert!(validate_headers(&h("X-A", "a\r\nb")).is_err());
        assert!(validate_headers(&h("X A", "a")).is_err());
    }

    #[test]
    fn generated_secrets_parse() {
        let s = generate_secret();
        assert!(crate::signing::SigningSecret::parse(&s).is_ok(), "{s}");
        assert_ne!(s, generate_secret());
    }
}
