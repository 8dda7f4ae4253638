//! Sources: what one is (its rules, for every door), creating one, and turning a verified
//! request into the message the outbox commits.

use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::providers::{HmacAlgorithm, HmacScheme, Provider, SignatureEncoding, Verified};
use crate::crypto::Keyring;
use crate::db::{self, DbError, sources::SourceRow};
use crate::signing::MAX_ROTATION_GRACE_SECS;

/// The default largest body of a source; a source may accept at most what an event's
/// payload may be (the API's HOOKD_MAX_PAYLOAD_BYTES), since the body is the payload.
pub const DEFAULT_MAX_BODY_BYTES: i32 = 1 << 20;

/// The shortest secret a source takes from its user.
pub const MIN_SECRET_LEN: usize = 16;

/// Most sources one tenant may have: each is a public URL, a series in the metrics and a
/// name taken for every tenant.
pub const MAX_SOURCES_PER_TENANT: i64 = 100;

/// The providers by their configuration names (`spec.provider`, the API's `provider`).
pub const PROVIDERS: [&str; 6] = [
    "standard-webhooks",
    "stripe",
    "github",
    "shopify",
    "slack",
    "hmac",
];

/// The generic scheme as the API and a WebhookSource spell it.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HmacSpec {
    /// the header carrying the signature, e.g. `X-Signature`
    pub header: String,
    /// `sha256` (default) or `sha512`
    #[serde(default)]
    pub algorithm: Option<String>,
    /// `hex` (default) or `base64`
    #[serde(default)]
    pub encoding: Option<String>,
    /// text before the signature, e.g. `sha256=`
    #[serde(default)]
    pub prefix: Option<String>,
    /// a header with a unix timestamp the provider signs as `{timestamp}.{body}`
    #[serde(default)]
    pub timestamp_header: Option<String>,
    /// the header with the provider's event id
    #[serde(default)]
    pub id_header: Option<String>,
    /// the header with the provider's event type
    #[serde(default)]
    pub type_header: Option<String>,
}

/// Why a source operation was refused (mapped to answers in `api::error`).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{0}")]
    Invalid(String),
    #[error("a source named {0:?} exists")]
    NameTaken(String),
    #[error("tenant {tenant:?} has {cap} sources, the most it may have")]
    TenantLimit { tenant: String, cap: i64 },
    /// declared by a WebhookSource object: the object is changed, not the source
    #[error("source {0:?} is declared by a WebhookSource object")]
    ManagedByKubernetes(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// A source name: a lower-case DNS label, since it is the last segment of the URL the
/// provider is given (`/in/{name}`) and the default prefix of its event types.
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name {name:?} must be 1-63 lower-case letters, digits or '-', starting and ending with a letter or digit"
        ))
    }
}

/// Headers that carry the request's framing or routing, never a provider's signature,
/// time, id or type: a scheme naming one could never verify, or would read what a proxy
/// sets.
const NOT_A_SIGNATURE_HEADER: [&str; 9] = [
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "host",
    "connection",
    "authorization",
    "cookie",
    "te",
];

fn header_name(field: &str, v: &str) -> Result<(), String> {
    let ok = v.len() <= 64
        && http::HeaderName::from_bytes(v.as_bytes()).is_ok()
        && !NOT_A_SIGNATURE_HEADER.contains(&v.to_ascii_lowercase().as_str());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "hmac.{field} {v:?} must be a header name of at most 64 characters, not one of {}",
            NOT_A_SIGNATURE_HEADER.join(", ")
        ))
    }
}

/// The provider a source's configuration names, with the generic scheme's parameters.
pub fn provider(name: &str, hmac: Option<&HmacSpec>) -> Result<Provider, String> {
    let p = match (name, hmac) {
        ("standard-webhooks", None) => Provider::StandardWebhooks,
        ("stripe", None) => Provider::Stripe,
        ("github", None) => Provider::Github,
        ("shopify", None) => Provider::Shopify,
        ("slack", None) => Provider::Slack,
        ("hmac", Some(h)) => {
            header_name("header", &h.header)?;
            for (field, v) in [
                ("timestampHeader", &h.timestamp_header),
                ("idHeader", &h.id_header),
                ("typeHeader", &h.type_header),
            ] {
                if let Some(v) = v {
                    header_name(field, v)?;
                }
            }
            if h.timestamp_header
                .as_deref()
                .is_some_and(|t| t.eq_ignore_ascii_case(&h.header))
            {
                return Err("hmac.timestampHeader must differ from hmac.header".into());
            }
            let algorithm = match h.algorithm.as_deref().unwrap_or("sha256") {
                "sha256" => HmacAlgorithm::Sha256,
                "sha512" => HmacAlgorithm::Sha512,
                other => {
                    return Err(format!("hmac.algorithm {other:?} must be sha256 or sha512"));
                }
            };
            let encoding = match h.encoding.as_deref().unwrap_or("hex") {
                "hex" => SignatureEncoding::Hex,
                "base64" => SignatureEncoding::Base64,
                other => return Err(format!("hmac.encoding {other:?} must be hex or base64")),
            };
            let prefix = h.prefix.clone().unwrap_or_default();
            if prefix.len() > 64 || !prefix.bytes().all(|b| b.is_ascii_graphic()) {
                return Err("hmac.prefix must be at most 64 visible ASCII characters".into());
            }
            Provider::Hmac(HmacScheme {
                header: h.header.clone(),
                algorithm,
                encoding,
                prefix,
                timestamp_header: h.timestamp_header.clone(),
                id_header: h.id_header.clone(),
                type_header: h.type_header.clone(),
            })
        }
        ("hmac", None) => return Err("provider hmac needs the hmac object (header, …)".into()),
        (p, Some(_)) if PROVIDERS.contains(&p) => {
            return Err(format!("hmac is only for provider hmac, not {p}"));
        }
        (other, _) => {
            return Err(format!(
                "provider {other:?} must be one of {}",
                PROVIDERS.join(", ")
            ));
        }
    };
    Ok(p)
}

/// A secret for a provider that lets its user choose one (Standard Webhooks, GitHub, the
/// generic scheme); the others (Stripe, Shopify, Slack) issue theirs, and it must be given.
pub fn generate_secret(provider: &Provider) -> Option<String> {
    match provider {
        Provider::StandardWebhooks => Some(crate::signing::generate_secret()),
        Provider::Github | Provider::Hmac(_) => {
            let mut bytes = [0u8; 32];
            rand::rng().fill_bytes(&mut bytes);
            Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
        }
        Provider::Stripe | Provider::Shopify | Provider::Slack => None,
    }
}

/// The event type of an inbound event: the source's prefix, then the provider's type with
/// every character hookd's event types do not allow turned into a dot (`orders/create`
/// becomes `orders.create`); the prefix alone when the provider sends none or it does not
/// fit in 128 characters.
pub fn event_type(prefix: &str, provider_type: Option<&str>) -> String {
    let Some(t) = provider_type else {
        return prefix.to_string();
    };
    let mapped: String = t
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '.'
            }
        })
        .collect();
    let segments: Vec<&str> = mapped.split('.').filter(|s| !s.is_empty()).collect();
    if segments.is_empty() {
        return prefix.to_string();
    }
    let full = format!("{prefix}.{}", segments.join("."));
    if crate::domain::validate_event_type(&full).is_ok() {
        full
    } else {
        prefix.to_string()
    }
}

/// The idempotency key that makes a provider's retry of one event a duplicate: the
/// source and the provider's event id, or the exact body when the provider sends no id.
/// Hashed, so any id a provider uses fits the key's syntax.
pub fn dedupe_key(source: Uuid, verified: &Verified, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    match &verified.event_id {
        Some(id) => {
            h.update(b"id\0");
            h.update(id.as_bytes());
        }
        None => {
            h.update(b"body\0");
            h.update(body);
        }
    }
    let digest = h.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("in:{hex}")
}

/// The challenge of a Slack `url_verification` request (its check of a Request URL, which
/// wants the challenge echoed and is not an event), when `body` is one.
pub fn slack_url_verification(provider: &Provider, body: &[u8]) -> Option<String> {
    if !matches!(provider, Provider::Slack) {
        return None;
    }
    #[derive(Deserialize)]
    struct Check {
        r#type: String,
        challenge: String,
    }
    let c: Check = serde_json::from_slice(body).ok()?;
    (c.r#type == "url_verification" && c.challenge.len() <= 1024).then_some(c.challenge)
}

/// Why a verified request cannot become an event.
#[derive(Debug, thiserror::Error)]
pub enum Unacceptable {
    #[error("an inbound body must be JSON (it is forwarded byte for byte as application/json)")]
    NotJson,
}

/// What a verified request becomes, for the source's tenant and consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct InboundEvent {
    /// `{prefix}.{provider's type}` (see [`event_type`])
    pub event_type: String,
    /// the exact body
    pub payload: String,
    /// see [`dedupe_key`]
    pub idempotency_key: String,
    /// the source, the provider's event id and the headers it documents
    pub origin: db::events::Origin,
}

/// The event a verified request becomes: the mapped event type, the exact body, the
/// dedupe key, and its origin (the provider's documented headers among `headers`). The
/// body must be JSON: it is forwarded byte for byte as application/json.
pub fn event(
    source: &SourceRow,
    provider: &Provider,
    verified: &Verified,
    headers: &http::HeaderMap,
    body: &[u8],
) -> Result<InboundEvent, Unacceptable> {
    let text = std::str::from_utf8(body).map_err(|_| Unacceptable::NotJson)?;
    serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|_| Unacceptable::NotJson)?;
    Ok(InboundEvent {
        event_type: event_type(&source.event_type_prefix, verified.event_type.as_deref()),
        payload: text.to_string(),
        idempotency_key: dedupe_key(source.id, verified, body),
        origin: db::events::Origin {
            source: source.name.clone(),
            source_event_id: verified.event_id.clone().filter(|id| is_header_value(id)),
            headers: kept_headers(provider, headers),
        },
    })
}

/// The provider's documented headers present on the request, by lower-case name; a value
/// that is not visible ASCII is left out (it could not be shown or sent on as it was).
/// Repeated headers keep their first value, as the verification reads them.
fn kept_headers(
    provider: &Provider,
    headers: &http::HeaderMap,
) -> serde_json::Map<String, serde_json::Value> {
    super::providers::documented_headers(provider)
        .into_iter()
        .filter_map(|name| {
            let value = headers.get(name.as_str())?.to_str().ok()?;
            is_header_value(value).then(|| (name, serde_json::Value::from(value)))
        })
        .collect()
}

/// One line of visible ASCII, at most 1,024 bytes: what is kept and sent on as a header.
fn is_header_value(v: &str) -> bool {
    v.len() <= 1024 && v.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// A source as stored: its provider rebuilt from the row.
pub fn provider_of(source: &SourceRow) -> Result<Provider, String> {
    let hmac = match &source.hmac {
        None => None,
        Some(v) => Some(
            serde_json::from_value::<HmacSpec>(v.0.clone())
                .map_err(|e| format!("stored hmac scheme: {e}"))?,
        ),
    };
    provider(&source.provider, hmac.as_ref())
}

/// A source to create.
#[derive(Debug, Clone)]
pub struct NewSource {
    pub name: String,
    pub tenant: String,
    pub consumer: Option<String>,
    pub provider: String,
    pub hmac: Option<HmacSpec>,
    pub secret: Option<String>,
    pub event_type_prefix: Option<String>,
    pub max_body_bytes: Option<i32>,
    pub description: Option<String>,
    /// the largest body this API takes (its HOOKD_MAX_PAYLOAD_BYTES): a source may not
    /// promise a provider more
    pub max_body_allowed: i32,
}

/// The rules a source's naming and routing fields meet whichever door it comes through
/// (the API's create, a WebhookSource object); the body limit is each door's to check,
/// against its own bound, before [`check_description`]. Returns the provider they name.
fn check_fields(
    name: &str,
    tenant: &str,
    consumer: Option<&str>,
    provider_name: &str,
    hmac: Option<&HmacSpec>,
    event_type_prefix: &str,
) -> Result<Provider, String> {
    validate_name(name)?;
    crate::domain::validate_tenant(tenant)?;
    if let Some(c) = consumer {
        crate::domain::validate_consumer(c)?;
    }
    let p = provider(provider_name, hmac)?;
    check_prefix(event_type_prefix)?;
    Ok(p)
}

/// A source's event-type prefix, in every door (and in a change): an event type, and not
/// hookd's own (`hookd` as a name defaults the prefix to it, so that name needs another).
fn check_prefix(prefix: &str) -> Result<(), String> {
    crate::domain::validate_event_type(prefix)
        .and_then(|()| crate::domain::check_not_reserved(prefix))
        .map_err(|e| format!("eventTypePrefix: {e}"))
}

/// A source's description, in every door (and in a change).
fn check_description(description: Option<&str>) -> Result<(), String> {
    match description {
        Some(d) => crate::domain::validate_text("description", d, 1000),
        None => Ok(()),
    }
}

/// A body limit between 1 and what this API takes.
fn check_max_body(max: i32, allowed: i32) -> Result<(), SourceError> {
    if (1..=allowed).contains(&max) {
        Ok(())
    } else {
        Err(SourceError::Invalid(format!(
            "maxBodyBytes must be between 1 and {allowed} (the API's HOOKD_MAX_PAYLOAD_BYTES: the body becomes the event's payload)"
        )))
    }
}

/// Creates a source with its secret sealed (given, or generated where the provider lets
/// its user choose). Returns the row and the secret (shown once).
pub async fn create(
    pool: &sqlx::PgPool,
    keyring: &Keyring,
    s: NewSource,
) -> Result<(SourceRow, String), SourceError> {
    let prefix = s.event_type_prefix.unwrap_or_else(|| s.name.clone());
    let provider = check_fields(
        &s.name,
        &s.tenant,
        s.consumer.as_deref(),
        &s.provider,
        s.hmac.as_ref(),
        &prefix,
    )
    .map_err(SourceError::Invalid)?;
    let max_body = s
        .max_body_bytes
        .unwrap_or(DEFAULT_MAX_BODY_BYTES.min(s.max_body_allowed));
    check_max_body(max_body, s.max_body_allowed)?;
    check_description(s.description.as_deref()).map_err(SourceError::Invalid)?;
    let secret = checked_or_generated(&provider, s.secret)?;
    let id = Uuid::now_v7();
    let sealed = keyring.encrypt(id, &secret);
    let hmac = s
        .hmac
        .as_ref()
        .map(|h| serde_json::to_value(h).unwrap_or_default());
    let mut tx = db::begin(pool).await?;
    if db::sources::lock_and_count(&mut tx, &s.tenant).await? >= MAX_SOURCES_PER_TENANT {
        return Err(SourceError::TenantLimit {
            tenant: s.tenant,
            cap: MAX_SOURCES_PER_TENANT,
        });
    }
    let inserted = db::sources::insert(
        &mut tx,
        &db::sources::NewSource {
            id,
            name: &s.name,
            tenant: &s.tenant,
            consumer: s.consumer.as_deref(),
            provider: provider.name(),
            hmac,
            event_type_prefix: &prefix,
            max_body_bytes: max_body,
            description: s.description.as_deref(),
            key_id: &sealed.key_id,
            ciphertext: &sealed.ciphertext,
            declared_in: None,
        },
    )
    .await?;
    let Some(row) = inserted else {
        return Err(SourceError::NameTaken(s.name));
    };
    tx.commit().await.map_err(DbError::from)?;
    Ok((row, secret))
}

/// Makes a new secret current for the source `name` of `tenant` (the caller's, or a
/// generated one where the provider lets its user choose); the previous one verifies for
/// `grace_secs` more, so the provider can be switched over without a refused request.
/// Returns the new secret (shown once) and when the previous stops verifying; None when
/// there is no such source.
pub async fn rotate(
    pool: &sqlx::PgPool,
    keyring: &Keyring,
    tenant: Option<&str>,
    name: &str,
    secret: Option<String>,
    grace_secs: i64,
) -> Result<Option<(String, chrono::DateTime<chrono::Utc>)>, SourceError> {
    if !(0..=MAX_ROTATION_GRACE_SECS).contains(&grace_secs) {
        return Err(SourceError::Invalid(format!(
            "graceSeconds must be between 0 and {MAX_ROTATION_GRACE_SECS}"
        )));
    }
    let Some(source) = db::sources::get(pool, name, tenant).await? else {
        return Ok(None);
    };
    if source.managed_by == crate::domain::ManagedBy::Kubernetes {
        return Err(SourceError::ManagedByKubernetes(source.name));
    }
    let provider = provider_of(&source).map_err(SourceError::Invalid)?;
    let secret = checked_or_generated(&provider, secret)?;
    let sealed = keyring.encrypt(source.id, &secret);
    let mut tx = db::begin(pool).await?;
    let until = db::sources::rotate(
        &mut tx,
        source.id,
        &sealed.key_id,
        &sealed.ciphertext,
        grace_secs as i32,
    )
    .await?;
    tx.commit().await.map_err(DbError::from)?;
    Ok(Some((secret, until)))
}

/// A change to a source (its provider and name stay: a new provider is a new source).
#[derive(Debug, Clone, Default)]
pub struct SourceChange {
    pub consumer: Option<Option<String>>,
    pub event_type_prefix: Option<String>,
    pub max_body_bytes: Option<i32>,
    pub description: Option<Option<String>>,
    pub hmac: Option<HmacSpec>,
}

/// Applies a change to the source `name` of `tenant` with the rules of [`create`]; None
/// when there is no such source.
pub async fn change(
    pool: &sqlx::PgPool,
    tenant: Option<&str>,
    name: &str,
    c: SourceChange,
    max_body_allowed: i32,
) -> Result<Option<SourceRow>, SourceError> {
    let invalid = SourceError::Invalid;
    let Some(source) = db::sources::get(pool, name, tenant).await? else {
        return Ok(None);
    };
    if source.managed_by == crate::domain::ManagedBy::Kubernetes {
        return Err(SourceError::ManagedByKubernetes(source.name));
    }
    if let Some(Some(consumer)) = &c.consumer {
        crate::domain::validate_consumer(consumer).map_err(invalid)?;
    }
    if let Some(prefix) = &c.event_type_prefix {
        check_prefix(prefix).map_err(invalid)?;
    }
    if let Some(max) = c.max_body_bytes {
        check_max_body(max, max_body_allowed)?;
    }
    if let Some(d) = &c.description {
        check_description(d.as_deref()).map_err(invalid)?;
    }
    if let Some(h) = &c.hmac {
        provider(&source.provider, Some(h)).map_err(invalid)?;
    }
    Ok(db::sources::patch(
        pool,
        name,
        tenant,
        &db::sources::SourcePatch {
            consumer: c.consumer,
            event_type_prefix: c.event_type_prefix,
            max_body_bytes: c.max_body_bytes,
            description: c.description,
            hmac: c.hmac.map(|h| serde_json::to_value(h).unwrap_or_default()),
        },
    )
    .await?)
}

/// A WebhookSource object as the source rules judge it (`k8s::crd::WebhookSourceSpec`).
#[derive(Debug, Clone)]
pub struct Declared<'a> {
    pub namespace: &'a str,
    /// the object's name: the route, `/in/{name}`
    pub name: &'a str,
    pub tenant: &'a str,
    pub consumer: Option<&'a str>,
    pub provider: &'a str,
    pub hmac: Option<&'a HmacSpec>,
    /// the verification secret, read from the object's Secret
    pub secret: &'a str,
    pub event_type_prefix: Option<&'a str>,
    pub max_body_bytes: Option<i32>,
    pub description: Option<&'a str>,
    /// how long a replaced secret keeps verifying (default a day)
    pub secret_rotation_grace_seconds: Option<i64>,
}

/// The largest body a declared source may ask for (what the table allows); the API still
/// caps each request at its own HOOKD_MAX_PAYLOAD_BYTES.
pub const MAX_DECLARED_BODY_BYTES: i32 = 16 << 20;

/// The source rules for a declared source, every field; the message names the field.
pub fn validate_declared(d: &Declared<'_>) -> Result<Provider, String> {
    let p = check_fields(
        d.name,
        d.tenant,
        d.consumer,
        d.provider,
        d.hmac,
        d.event_type_prefix.unwrap_or(d.name),
    )?;
    if let Some(max) = d.max_body_bytes
        && !(1..=MAX_DECLARED_BODY_BYTES).contains(&max)
    {
        return Err(format!(
            "maxBodyBytes must be between 1 and {MAX_DECLARED_BODY_BYTES}"
        ));
    }
    check_description(d.description)?;
    if let Some(g) = d.secret_rotation_grace_seconds
        && !(0..=MAX_ROTATION_GRACE_SECS).contains(&g)
    {
        return Err(format!(
            "secretRotationGraceSeconds must be between 0 and {MAX_ROTATION_GRACE_SECS}"
        ));
    }
    checked_or_generated(&p, Some(d.secret.to_string())).map_err(|e| e.to_string())?;
    Ok(p)
}

/// Writes a declared source in the caller's transaction (the controller's, or `hookd
/// apply`'s for a whole file): created, or its fields updated and, when its Secret holds
/// a new secret, that one made current with the previous verifying for the grace.
pub async fn apply_declared(
    conn: &mut sqlx::PgConnection,
    keyring: &Keyring,
    d: &Declared<'_>,
) -> Result<db::sources::DeclaredWrite, SourceError> {
    let provider = validate_declared(d).map_err(SourceError::Invalid)?;
    let grace = d
        .secret_rotation_grace_seconds
        .unwrap_or(i64::from(crate::signing::DEFAULT_ROTATION_GRACE_SECS));
    let written = db::sources::write_declared(
        conn,
        &db::sources::DeclaredSource {
            namespace: d.namespace,
            name: d.name,
            tenant: d.tenant,
            consumer: d.consumer,
            provider: provider.name(),
            hmac: d.hmac.map(|h| serde_json::to_value(h).unwrap_or_default()),
            event_type_prefix: d.event_type_prefix.unwrap_or(d.name),
            max_body_bytes: d.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES),
            description: d.description,
        },
        |id| {
            let sealed = keyring.encrypt(id, d.secret);
            (sealed.key_id, sealed.ciphertext)
        },
        // a secret sealed under a key this process lacks is replaced: the declaration is
        // what is current
        |id, key_id, ciphertext| {
            keyring
                .decrypt(id, key_id, ciphertext)
                .is_ok_and(|s| s.as_str() == d.secret)
        },
        i32::try_from(grace).unwrap_or(i32::MAX),
        MAX_SOURCES_PER_TENANT,
    )
    .await?;
    Ok(written)
}

/// Deletes the API's source `name` of `tenant`; false when there is none. A declared one
/// is its object's to delete.
pub async fn delete(
    pool: &sqlx::PgPool,
    tenant: Option<&str>,
    name: &str,
) -> Result<bool, SourceError> {
    if db::sources::delete(pool, name, tenant).await? {
        return Ok(true);
    }
    match db::sources::get(pool, name, tenant).await? {
        Some(s) if s.managed_by == crate::domain::ManagedBy::Kubernetes => {
            Err(SourceError::ManagedByKubernetes(s.name))
        }
        _ => Ok(false),
    }
}

/// Deletes a declared source in the caller's transaction; its id, when there was one.
pub async fn remove_declared(
    conn: &mut sqlx::PgConnection,
    namespace: &str,
    name: &str,
) -> Result<Option<Uuid>, SourceError> {
    Ok(db::sources::delete_declared(conn, namespace, name).await?)
}

/// The caller's secret if `provider` can verify with it (never echoed), else a generated
/// one where the provider lets its user choose.
fn checked_or_generated(
    provider: &Provider,
    secret: Option<String>,
) -> Result<String, SourceError> {
    match secret {
        Some(secret) => {
            if secret.len() < MIN_SECRET_LEN
                || secret.len() > 1024
                || !super::providers::secret_is_usable(provider, &secret)
            {
                return Err(SourceError::Invalid(format!(
                    "secret cannot verify {} signatures: it must be {MIN_SECRET_LEN} to 1024 characters (a guessable secret lets anyone sign), and for standard-webhooks whsec_ + base64",
                    provider.name()
                )));
            }
            Ok(secret)
        }
        None => generate_secret(provider).ok_or_else(|| {
            SourceError::Invalid(format!(
                "{} issues the signing secret: copy it from the provider into secret",
                provider.name()
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_types_map_to_event_types() {
        assert_eq!(
            event_type("stripe", Some("invoice.paid")),
            "stripe.invoice.paid"
        );
        assert_eq!(
            event_type("shop", Some("orders/create")),
            "shop.orders.create"
        );
        assert_eq!(event_type("gh", Some("push")), "gh.push");
        assert_eq!(event_type("gh", None), "gh");
        assert_eq!(event_type("gh", Some("//")), "gh");
        assert_eq!(event_type("gh", Some(&"a".repeat(200))), "gh");
        assert_eq!(event_type("x", Some("a b..c")), "x.a.b.c");
    }

    #[test]
    fn the_kept_headers_are_the_providers_documented_ones_as_sent() {
        let scheme = HmacScheme {
            header: "X-Acme-Signature".into(),
            algorithm: HmacAlgorithm::Sha256,
            encoding: SignatureEncoding::Hex,
            prefix: String::new(),
            timestamp_header: Some("X-Acme-Time".into()),
            id_header: Some("X-Acme-Id".into()),
            type_header: None,
        };
        let mut h = http::HeaderMap::new();
        h.insert("x-acme-signature", "abc".parse().unwrap());
        h.insert("x-acme-time", "1700000000".parse().unwrap());
        h.insert("x-forwarded-for", "203.0.113.9".parse().unwrap());
        // not visible ASCII: left out, not mangled
        h.insert(
            "x-acme-id",
            http::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        let kept = kept_headers(&Provider::Hmac(scheme), &h);
        assert_eq!(
            serde_json::Value::Object(kept),
            serde_json::json!({"x-acme-signature": "abc", "x-acme-time": "1700000000"})
        );
        assert!(!is_header_value("a\u{7f}"));
        assert!(!is_header_value(&"a".repeat(1025)));
    }

    #[test]
    fn names_are_dns_labels() {
        for ok in ["stripe", "a", "gh-main-1"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dedupe_keys_are_per_source_and_fit_the_key_syntax() {
        let v = Verified {
            event_id: Some("evt_\u{1}ü".into()),
            event_type: None,
        };
        let a = dedupe_key(Uuid::from_u128(1), &v, b"{}");
        assert!(crate::domain::validate_idempotency_key(&a).is_ok(), "{a}");
        assert_ne!(a, dedupe_key(Uuid::from_u128(2), &v, b"{}"));
        assert_eq!(a, dedupe_key(Uuid::from_u128(1), &v, b"{\"other\":1}"));
        let none = Verified::default();
        assert_ne!(
            dedupe_key(Uuid::from_u128(1), &none, b"{}"),
            dedupe_key(Uuid::from_u128(1), &none, b"{ }")
        );
    }
}
