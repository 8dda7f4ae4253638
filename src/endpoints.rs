//! The endpoint: its rules for every door (WebhookEndpoint objects through the controller
//! and `hookd apply`, and the endpoints API): what a valid URL, event-type filter, header
//! set, policy and signing secret are, how a secret reaches the database (sealed, never
//! plain), and the operations the API offers (create, change, delete), with typed refusals.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::crypto::Keyring;
use crate::db::{self, DbError};
pub use crate::domain::{DeliveryOrder, OnDeadLetter, RateLimit};
use crate::outbound::{AllowList, check_ip, check_url};
use crate::signing::MAX_ROTATION_GRACE_SECS;

/// Longest accepted URL, in characters (the CRD's bound).
pub const MAX_URL_LEN: usize = 2048;

/// What an endpoint URL looks like, in the syntax RE2 (the API server's CEL) and the
/// `regex` crate share: `http` or `https` in lower case, a host of ASCII letters, digits,
/// `.`, `-`, `_`, `~` (IDN hosts in their `xn--` form) or a bracketed IPv6 address, an
/// optional port 1-65535, then a path, query or fragment without ASCII spaces, control
/// characters or backslashes. No `user:password@`: a credential in a URL is shown to
/// everyone who can read the endpoint. (The `url` crate alone is laxer than the CRD:
/// it takes `https:example.com`, `HTTPS://…`, backslashes as slashes and port 0.)
pub const URL_PATTERN: &str = r"^https?://([A-Za-z0-9._~-]+|\[[0-9A-Fa-f:.]+\])(:0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?([/?#][^\x00-\x20\x7f\\]*)?$";

/// The CRD's rule for `spec.url`: [`URL_PATTERN`] in a CEL string (a test ties the two).
pub const URL_CEL: &str = r"self.matches('^https?://([A-Za-z0-9._~-]+|\\[[0-9A-Fa-f:.]+\\])(:0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?([/?#][^\\x00-\\x20\\x7f\\\\]*)?$')";

/// The one refusal of a URL, in every door (the CRD's message).
pub const URL_RULE: &str = "url must be an absolute http:// or https:// URL: a host of letters, digits, '.', '-', '_' or '~' (or [an IPv6 address]), an optional port 1-65535, and no credentials, spaces, control characters or backslashes";

static URL_RE: std::sync::LazyLock<regex::Regex> =
    std::sync::LazyLock::new(|| regex::Regex::new(URL_PATTERN).expect("URL_PATTERN compiles"));
/// Most entries in `eventTypes` and `headers` (the CRD's bounds).
pub const MAX_EVENT_TYPES: usize = 64;
pub const MAX_HEADERS: usize = 32;

/// Headers hookd sets itself (`hookd-source*` on an inbound event's deliveries: a
/// receiver may trust them to say the event came from a provider; the producer's W3C
/// trace context), and the hop-by-hop and body-framing ones that would change
/// how a delivery is sent or read (a `content-encoding: gzip` on a plain body makes every
/// delivery unreadable to a standard receiver); an endpoint cannot set them, whichever
/// door it comes in by. The API and `hookd apply` check them here, a WebhookEndpoint's CRD
/// by [`HEADER_NAME_CEL`] (which lists the same names: a test ties the two), and the
/// controller holds an object stored before its CRD refused the name.
pub const RESERVED_HEADERS: [&str; 19] = [
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
    "hookd-source",
    "hookd-source-event-id",
    "traceparent",
    "tracestate",
];

/// The CRD's rule for `spec.headers` keys: [`RESERVED_HEADERS`] in CEL.
pub const HEADER_NAME_CEL: &str = "self.all(k, k.matches('^[A-Za-z0-9-]{1,64}$') && !k.lowerAscii().startsWith('webhook-') && !(k.lowerAscii() in ['content-type', 'content-length', 'host', 'idempotency-key', 'user-agent', 'transfer-encoding', 'connection', 'content-encoding', 'expect', 'upgrade', 'te', 'trailer', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'hookd-source', 'hookd-source-event-id', 'traceparent', 'tracestate']))";

/// True for a name no endpoint may set (`webhook-*` and [`RESERVED_HEADERS`], any case).
/// The dispatcher also skips these when it sends, for rows stored before a door refused
/// them (`hookd apply` let `content-encoding` through).
pub fn is_reserved_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with("webhook-") || RESERVED_HEADERS.contains(&lower.as_str())
}

/// The one refusal of a header name, word for word in every door (the CRD's message).
pub const HEADER_NAME_RULE: &str = "headers keys must be header names (letters, digits, '-'; at most 64) and must not set webhook-* or a header hookd sets or that changes how a delivery is framed: content-type, content-length, host, idempotency-key, user-agent, transfer-encoding, connection, content-encoding, expect, upgrade, te, trailer, keep-alive, proxy-connection, proxy-authorization, hookd-source, hookd-source-event-id, traceparent, tracestate";

/// The one refusal of a header value, in every door (the CRD's message).
pub const HEADER_VALUE_RULE: &str =
    "headers values must be one line of visible text (no CR, LF or other control characters)";

/// A syntactically valid http(s) URL without credentials, and not a literal private,
/// loopback, link-local or metadata address unless `allow` admits it.
pub fn validate_url(url: &str, allow: &AllowList) -> Result<(), String> {
    let parsed = validate_url_syntax(url)?;
    check_url(&parsed, allow).map_err(|e| format!("url: {e}"))
}

/// A syntactically valid absolute http(s) URL with a host, no credentials and no port 0:
/// the part of [`validate_url`] that does not depend on where the process runs (its
/// allow-list), and so the part the CRD's rule states too.
pub fn validate_url_syntax(url: &str) -> Result<reqwest::Url, String> {
    if url.chars().count() > MAX_URL_LEN {
        return Err(format!("url is longer than {MAX_URL_LEN} characters"));
    }
    if !URL_RE.is_match(url) {
        return Err(URL_RULE.into());
    }
    // what the pattern admits and a URL parser still refuses (an IPv6 literal that is
    // not an address)
    reqwest::Url::parse(url).map_err(|e| format!("url is not a URL: {e}"))
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

/// The one refusal of an event-type filter, in every door (the CRD's message).
pub const EVENT_TYPES_RULE: &str = "each eventTypes entry must be '*', an event type like 'invoice.paid', or a prefix like 'invoice.*'";

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
            return Err(format!("eventTypes entry {t:?}: {EVENT_TYPES_RULE}"));
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
        if v.chars().count() > MAX_HEADER_VALUE_LEN {
            return Err(format!(
                "headers.{k}: values are at most {MAX_HEADER_VALUE_LEN} characters"
            ));
        }
    }
    Ok(())
}

/// Bounds of a declared endpoint's delivery policy (the CRD's schema states the same
/// numbers; `tests/crd.rs` feeds one corpus to both).
pub const TIMEOUT_SECONDS: (u32, u32) = (1, 300);
pub const MAX_ATTEMPTS: (u32, u32) = (1, 100);
pub const RETRY_DELAY_SECONDS: (u32, u32) = (1, 604_800);
pub const RETRY_SCHEDULE_LEN: (usize, usize) = (1, 50);
pub const MAX_IN_FLIGHT: (u32, u32) = (1, 10_000);
pub const SECRET_GRACE_SECONDS: (u32, u32) = (0, 2_592_000);
pub const MAX_HEADER_VALUE_LEN: usize = 4096;

/// An endpoint as it is declared (a WebhookEndpoint's spec, or a `hookd apply` document),
/// borrowed: what [`validate_declared`] judges.
#[derive(Debug, Clone, Copy)]
pub struct Declared<'a> {
    pub url: &'a str,
    pub event_types: &'a [String],
    pub headers: &'a BTreeMap<String, String>,
    pub tenant: Option<&'a str>,
    pub consumer: Option<&'a str>,
    pub timeout_seconds: Option<u32>,
    pub max_attempts: Option<u32>,
    pub retry_schedule: Option<&'a [u32]>,
    pub max_in_flight: Option<u32>,
    pub rate_limit: Option<&'a RateLimit>,
    pub secret_rotation_grace_seconds: Option<u32>,
}

/// Every rule of a declared endpoint, in the order of its fields: the first broken one,
/// as `field: problem` (or the field's own message). The controller holds an object it
/// refuses (one stored before its CRD said the same); `hookd apply` refuses the file. The
/// API checks the fields it takes with the same functions. Where the endpoint may send
/// (private addresses) is the process's policy, not a rule of the spec: see
/// [`validate_url`].
pub fn validate_declared(d: &Declared<'_>) -> Result<(), String> {
    let range = |field: &str, v: Option<u32>, (lo, hi): (u32, u32)| match v {
        Some(v) if v < lo || v > hi => Err(format!("{field} {v} is outside {lo}-{hi}")),
        _ => Ok(()),
    };
    validate_url_syntax(d.url)?;
    if d.url.chars().count() < 8 {
        return Err("url is shorter than 8 characters".into());
    }
    validate_event_types(d.event_types)?;
    if let Some(t) = d.tenant {
        crate::domain::validate_tenant(t)?;
    }
    if let Some(c) = d.consumer {
        crate::domain::validate_consumer(c)?;
    }
    range("timeoutSeconds", d.timeout_seconds, TIMEOUT_SECONDS)?;
    range("maxAttempts", d.max_attempts, MAX_ATTEMPTS)?;
    if let Some(schedule) = d.retry_schedule {
        let (lo, hi) = RETRY_SCHEDULE_LEN;
        if schedule.len() < lo || schedule.len() > hi {
            return Err(format!(
                "retrySchedule has {} entries; it needs {lo}-{hi}",
                schedule.len()
            ));
        }
        for s in schedule {
            range("retrySchedule entry", Some(*s), RETRY_DELAY_SECONDS)?;
        }
    }
    range("maxInFlight", d.max_in_flight, MAX_IN_FLIGHT)?;
    if let Some(r) = d.rate_limit {
        r.validate()?;
    }
    validate_headers(d.headers)?;
    range(
        "secretRotationGraceSeconds",
        d.secret_rotation_grace_seconds,
        SECRET_GRACE_SECONDS,
    )
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

// ---- operations through the endpoints API ----
//
// The HTTP handlers (`api::endpoints`) authenticate, read the body and shape the answer;
// what a change is (its rules, its limits, its transaction) is here, and its refusals are
// typed so that `api::error` maps them to answers in one place.

/// Why an endpoint operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// a field breaks a rule; the message names it
    #[error("{0}")]
    Invalid(String),
    /// a signing secret anyone could know (never echoed)
    #[error("{0}")]
    WeakSecret(String),
    /// the consumer does not exist (or is not the caller's generation of that uid)
    #[error("consumer not found")]
    ConsumerNotFound,
    #[error("consumer {consumer:?} has {cap} endpoints, the most one consumer may have")]
    ConsumerLimit { consumer: String, cap: i64 },
    #[error("tenant {tenant:?} has {cap} endpoints made through the API, the most it may have")]
    TenantLimit { tenant: String, cap: i64 },
    #[error("refused: {0:?}")]
    Refused(db::endpoints::PatchRefused),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// How many endpoints made through the API a consumer and a tenant may hold.
#[derive(Debug, Clone, Copy)]
pub struct EndpointLimits {
    pub per_consumer: i64,
    pub per_tenant: i64,
}

/// An endpoint to create through the API; the tenant and consumer are the caller's,
/// already resolved.
#[derive(Debug, Clone)]
pub struct NewEndpoint {
    pub tenant: String,
    pub consumer: Option<String>,
    pub url: String,
    pub event_types: Vec<String>,
    pub description: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub paused: bool,
    pub rate_limit: Option<RateLimit>,
    pub ordering: DeliveryOrder,
    pub on_dead_letter: OnDeadLetter,
    /// None: hookd generates one
    pub secret: Option<String>,
}

/// Checks the fields the API takes, with the rules every door shares, and the URL's
/// destination against `allow` (literal and resolved addresses).
pub async fn validate_api_fields(
    allow: &AllowList,
    url: Option<&str>,
    event_types: Option<&[String]>,
    headers: Option<&BTreeMap<String, String>>,
    description: Option<&str>,
) -> Result<(), EndpointError> {
    if let Some(url) = url {
        validate_url(url, allow).map_err(EndpointError::Invalid)?;
        check_destination(url, allow)
            .await
            .map_err(EndpointError::Invalid)?;
    }
    if let Some(t) = event_types {
        validate_event_types(t).map_err(EndpointError::Invalid)?;
    }
    if let Some(h) = headers {
        validate_headers(h).map_err(EndpointError::Invalid)?;
    }
    if let Some(d) = description {
        crate::domain::validate_text("description", d, 1000).map_err(EndpointError::Invalid)?;
    }
    Ok(())
}

/// A secret supplied by the caller: `whsec_` + base64 of 24-64 bytes, and not one anyone
/// can know. Neither refusal echoes the value.
pub fn check_supplied_secret(secret: &str) -> Result<(), EndpointError> {
    crate::signing::SigningSecret::parse(secret).map_err(|e| {
        EndpointError::Invalid(format!(
            "secret must be whsec_ followed by base64 of 24-64 bytes ({})",
            e.to_string().replace(secret, "…")
        ))
    })?;
    match crate::signing::weak_secret_reason(secret) {
        None => Ok(()),
        Some(why) => Err(EndpointError::WeakSecret(format!(
            "this secret cannot be used: {why}, so anyone could forge its signatures. Leave secret out to have one generated, or use echo \"whsec_$(openssl rand -base64 32)\""
        ))),
    }
}

/// The caller's secret once [`check_supplied_secret`] takes it, or a fresh one.
fn supplied_or_generated(secret: Option<String>) -> Result<String, EndpointError> {
    match secret {
        Some(s) => {
            check_supplied_secret(&s)?;
            Ok(s)
        }
        None => Ok(crate::signing::generate_secret()),
    }
}

/// A rate limit from the API, checked, with its burst resolved.
fn resolve_rate_limit(r: Option<RateLimit>) -> Result<Option<RateLimit>, EndpointError> {
    r.map(|r| r.validate().map_err(EndpointError::Invalid))
        .transpose()
}

/// Creates an endpoint through the API in one transaction: the caller's consumer must
/// exist (and be the generation a consumer token was minted for), the consumer's and the
/// tenant's limits are counted under locks (two creates count one after the other), then
/// the row and its sealed secret. Returns the id and the signing secret (shown once).
pub async fn create_api(
    pool: &sqlx::PgPool,
    keyring: &Keyring,
    allow: &AllowList,
    limits: EndpointLimits,
    audience: db::Audience<'_>,
    e: NewEndpoint,
) -> Result<(Uuid, String), EndpointError> {
    crate::domain::validate_tenant(&e.tenant).map_err(EndpointError::Invalid)?;
    if let Some(c) = &e.consumer {
        crate::domain::validate_consumer(c).map_err(EndpointError::Invalid)?;
    }
    validate_api_fields(
        allow,
        Some(&e.url),
        Some(&e.event_types),
        Some(&e.headers),
        e.description.as_deref(),
    )
    .await?;
    let rate_limit = resolve_rate_limit(e.rate_limit)?;
    let secret = supplied_or_generated(e.secret)?;
    let id = Uuid::now_v7();
    let mut tx = db::begin(pool).await?;
    let consumer_generation = match &e.consumer {
        None => None,
        Some(c) => {
            // A consumer token never brings its consumer back after a delete, nor acts
            // for a later consumer with its uid (the API caches verdicts for a few
            // seconds). Held exclusively: two creates count one after the other.
            let own = audience.consumer_generation;
            let held =
                db::consumers::lock_for_endpoints(&mut tx, &e.tenant, c, own.is_none()).await?;
            let generation = match (held, own) {
                (Some(g), Some(own)) if g != own => None,
                (held, _) => held,
            }
            .ok_or(EndpointError::ConsumerNotFound)?;
            let cap = limits.per_consumer;
            if db::consumers::count_endpoints(&mut tx, &e.tenant, c, generation, cap).await? >= cap
            {
                return Err(EndpointError::ConsumerLimit {
                    consumer: c.clone(),
                    cap,
                });
            }
            Some(generation)
        }
    };
    let cap = limits.per_tenant;
    if db::consumers::lock_and_count_tenant_endpoints(&mut tx, &e.tenant, cap).await? >= cap {
        return Err(EndpointError::TenantLimit {
            tenant: e.tenant,
            cap,
        });
    }
    db::endpoints::insert_api(
        &mut tx,
        &db::endpoints::NewApiEndpoint {
            id,
            tenant: e.tenant,
            consumer: e.consumer,
            url: e.url,
            event_types: e.event_types,
            description: e.description,
            headers: serde_json::to_value(&e.headers).unwrap_or_default(),
            paused: e.paused,
            rate_limit,
            ordering: e.ordering,
            on_dead_letter: e.on_dead_letter,
            consumer_generation,
        },
    )
    .await?;
    store_secret(&mut tx, keyring, id, &secret, 0).await?;
    tx.commit().await.map_err(DbError::from)?;
    Ok((id, secret))
}

/// Applies a change to an API-managed endpoint `audience` may see, in one transaction
/// (the derived rules, such as a new URL closing the circuit, are the schema's: see
/// migration 0023). The fields are checked first, as in [`create_api`].
pub async fn patch_api(
    pool: &sqlx::PgPool,
    allow: &AllowList,
    audience: db::Audience<'_>,
    id: Uuid,
    mut patch: db::endpoints::EndpointPatch,
    headers: Option<&BTreeMap<String, String>>,
) -> Result<db::endpoints::EndpointView, EndpointError> {
    if let Some(r) = patch.rate_limit {
        patch.rate_limit = Some(resolve_rate_limit(r)?);
    }
    validate_api_fields(
        allow,
        patch.url.as_deref(),
        patch.event_types.as_deref(),
        headers,
        patch.description.as_ref().and_then(|d| d.as_deref()),
    )
    .await?;
    let mut tx = db::begin(pool).await?;
    let view = db::endpoints::patch_api(&mut tx, id, audience, &patch)
        .await?
        .map_err(EndpointError::Refused)?;
    tx.commit().await.map_err(DbError::from)?;
    Ok(view)
}

/// Makes a new signing secret current for an API-managed endpoint `audience` may see
/// (the caller's, or a generated one); the previous keeps signing for `grace_secs`.
/// Returns the new secret (shown once).
pub async fn rotate_api(
    pool: &sqlx::PgPool,
    keyring: &Keyring,
    audience: db::Audience<'_>,
    id: Uuid,
    secret: Option<String>,
    grace_secs: i64,
) -> Result<String, EndpointError> {
    if !(0..=MAX_ROTATION_GRACE_SECS).contains(&grace_secs) {
        return Err(EndpointError::Invalid(format!(
            "graceSeconds must be between 0 and {MAX_ROTATION_GRACE_SECS}"
        )));
    }
    let secret = supplied_or_generated(secret)?;
    let e = db::endpoints::get_visible(pool, id, audience)
        .await?
        .ok_or(EndpointError::Refused(
            db::endpoints::PatchRefused::NotFound,
        ))?;
    if e.managed_by != crate::domain::ManagedBy::Api {
        return Err(EndpointError::Refused(
            db::endpoints::PatchRefused::ManagedByKubernetes,
        ));
    }
    let mut tx = db::begin(pool).await?;
    store_secret(&mut tx, keyring, id, &secret, grace_secs as i32).await?;
    tx.commit().await.map_err(DbError::from)?;
    Ok(secret)
}

/// Deletes an API-managed endpoint `audience` may see: it stops receiving, its open
/// deliveries are cancelled (retried on deadlock). Returns how many were cancelled.
pub async fn delete_api(
    pool: &sqlx::PgPool,
    audience: db::Audience<'_>,
    id: Uuid,
) -> Result<i64, EndpointError> {
    let mut conn = pool.acquire().await.map_err(DbError::from)?;
    db::endpoints::delete_api(&mut conn, id, audience)
        .await?
        .map_err(EndpointError::Refused)
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

    /// The CRD's URL rule is [`URL_PATTERN`] written as a CEL string literal.
    #[test]
    fn the_crd_rule_is_the_url_pattern() {
        let escaped = URL_PATTERN.replace('\\', "\\\\");
        assert_eq!(URL_CEL, format!("self.matches('{escaped}')"));
    }

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
            "https:example.com/",
            "HTTPS://example.com/",
            "https://example.com\\@evil.example/",
            "https://example.com:0/",
            "https://example.com:65536/",
            "https://[1:2]/",
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
        let s = crate::signing::generate_secret();
        assert!(crate::signing::SigningSecret::parse(&s).is_ok(), "{s}");
        assert_ne!(s, crate::signing::generate_secret());
    }
}
