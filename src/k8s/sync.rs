//! The endpoint sync core: a `WebhookEndpoint` plus its resolved signing secret becomes
//! an endpoint row and secret rows. `hookd apply` and the controller both go through
//! `desired_endpoint` (pure) and `apply_endpoint` (database), so a YAML file applied
//! locally and a CR reconciled in a cluster produce the same rows.

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use sha2::{Digest, Sha256};
use sqlx::PgConnection;
use uuid::Uuid;

use super::crd::WebhookEndpoint;
use crate::crypto::Keyring;
use crate::db::{self, DbError, endpoints::EndpointUpsert};
use crate::domain::EndpointState;
use crate::signing::SigningSecret;

/// Why an endpoint's signing secret cannot be used. Each becomes a `SecretResolved=False`
/// reason in the controller and a refusal in `hookd apply`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretProblem {
    #[error("Secret {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("Secret {namespace}/{name} has no key {key:?}")]
    MissingKey {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("Secret {namespace}/{name} cannot be read: {reason}")]
    Unreadable {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("Secret {namespace}/{name} key {key:?} is not a valid signing secret: {reason}")]
    Malformed {
        namespace: String,
        name: String,
        key: String,
        reason: String,
    },
}

impl SecretProblem {
    /// CamelCase reason for a status condition.
    pub fn reason(&self) -> &'static str {
        match self {
            SecretProblem::NotFound { .. } => "SecretNotFound",
            SecretProblem::Unreadable { .. } => "SecretUnreadable",
            SecretProblem::MissingKey { .. } => "SecretKeyMissing",
            SecretProblem::Malformed { .. } => "SecretMalformed",
        }
    }
}

/// A validated signing secret, in memory only: `apply_endpoint` encrypts it before it
/// reaches the database.
#[derive(Clone, PartialEq, Eq)]
pub struct ResolvedSecret {
    pub value: String,
}

impl std::fmt::Debug for ResolvedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResolvedSecret(..)")
    }
}

/// Reads `key` from a Secret (`data`, or `stringData` as written in a YAML file) and
/// checks it is `whsec_` + base64 of 24-64 bytes. Never falls back to anything.
pub fn resolve_secret(
    namespace: &str,
    name: &str,
    key: &str,
    secret: Option<&Secret>,
) -> Result<ResolvedSecret, SecretProblem> {
    let value = secret_text(namespace, name, key, secret)?;
    SigningSecret::parse(&value).map_err(|e| SecretProblem::Malformed {
        namespace: namespace.into(),
        name: name.into(),
        key: key.into(),
        reason: e.to_string(),
    })?;
    Ok(ResolvedSecret { value })
}

/// The text under `key` of a Secret (`data`, or `stringData` as written in a YAML file),
/// trimmed: `echo secret > file` leaves a newline, and the secret is the text without it.
pub fn secret_text(
    namespace: &str,
    name: &str,
    key: &str,
    secret: Option<&Secret>,
) -> Result<String, SecretProblem> {
    let Some(secret) = secret else {
        return Err(SecretProblem::NotFound {
            namespace: namespace.into(),
            name: name.into(),
        });
    };
    let raw: Option<Vec<u8>> = secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|s| s.as_bytes().to_vec())
        .or_else(|| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|b| b.0.clone())
        });
    let Some(raw) = raw else {
        return Err(SecretProblem::MissingKey {
            namespace: namespace.into(),
            name: name.into(),
            key: key.into(),
        });
    };
    let text = String::from_utf8(raw).map_err(|_| SecretProblem::Malformed {
        namespace: namespace.into(),
        name: name.into(),
        key: key.into(),
        reason: "not UTF-8 text".into(),
    })?;
    Ok(text.trim().to_string())
}

/// What the database should hold for one endpoint.
#[derive(Debug, Clone)]
pub struct DesiredEndpoint {
    pub row: EndpointUpsert,
    /// None while the secret cannot be resolved: the row is then `paused` with the
    /// problem as its reason, so deliveries are held, never sent unsigned or dropped.
    pub secret: Option<ResolvedSecret>,
}

/// Pure: the desired endpoint row for a CR and the outcome of resolving its secret.
pub fn desired_endpoint(
    ep: &WebhookEndpoint,
    secret: Result<ResolvedSecret, SecretProblem>,
) -> DesiredEndpoint {
    let namespace = ep.namespace().unwrap_or_else(|| "default".into());
    let spec = &ep.spec;
    let tenant = spec.tenant.clone().unwrap_or_else(|| namespace.clone());
    let (state, state_reason, secret) = match (spec.paused, secret) {
        (_, Err(problem)) => (EndpointState::Paused, Some(problem.to_string()), None),
        (true, Ok(s)) => (
            EndpointState::Paused,
            Some("paused by spec".to_string()),
            Some(s),
        ),
        (false, Ok(s)) => (EndpointState::Active, None, Some(s)),
    };
    let headers = serde_json::to_value(&spec.headers).unwrap_or_default();
    let to_i32 = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
    // The fingerprint covers everything declared plus the desired state, so "same
    // declaration" means exactly that (see db::endpoints::upsert on disabled endpoints).
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(spec).unwrap_or_default());
    h.update(tenant.as_bytes());
    h.update(state.as_str().as_bytes());
    h.update(state_reason.as_deref().unwrap_or("").as_bytes());
    let row = EndpointUpsert {
        namespace,
        name: ep.name_any(),
        uid: ep.uid(),
        tenant,
        consumer: spec.consumer.clone(),
        url: spec.url.clone(),
        event_types: spec.event_types.clone(),
        state,
        state_reason,
        timeout_ms: spec.timeout_seconds.map(|s| to_i32(s.saturating_mul(1000))),
        max_attempts: spec.max_attempts.map(to_i32),
        retry_schedule_secs: spec
            .retry_schedule
            .as_ref()
            .map(|v| v.iter().copied().map(to_i32).collect()),
        max_in_flight: spec.max_in_flight.map(to_i32),
        // resolved (the burst's default filled in); a limit the rules refuse never gets
        // here (the object is held)
        rate_limit: spec.rate_limit.and_then(|r| r.validate().ok()),
        ordering: spec.ordering.unwrap_or_default(),
        on_dead_letter: spec.on_dead_letter.unwrap_or_default(),
        headers,
        secret_grace_secs: to_i32(
            spec.secret_rotation_grace_seconds
                .unwrap_or(crate::signing::DEFAULT_ROTATION_GRACE_SECS),
        ),
        spec_fingerprint: h.finalize().to_vec(),
    };
    DesiredEndpoint { row, secret }
}

/// What applying one endpoint changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    pub endpoint_id: Uuid,
    pub created: bool,
    pub changed: bool,
    pub secret_rotated: bool,
    pub active_secrets: i64,
    /// None when nothing was written
    pub state: Option<EndpointState>,
}

impl SyncOutcome {
    /// Nothing was written (a refused declaration).
    pub fn unchanged() -> Self {
        SyncOutcome {
            endpoint_id: Uuid::nil(),
            created: false,
            changed: false,
            secret_rotated: false,
            active_secrets: 0,
            state: None,
        }
    }
}

/// Writes the desired endpoint (idempotent: an unchanged endpoint writes nothing). Runs
/// on the caller's connection so several endpoints can share one transaction.
///
/// The signing secret is sealed with `keyring`'s active key, bound to this endpoint's id,
/// before it is stored; whether it changed is decided by keyed fingerprints under every
/// key of the ring, so a secret still stored under an older key during a rotation is
/// not mistaken for a new one.
pub async fn apply_endpoint(
    conn: &mut PgConnection,
    desired: &DesiredEndpoint,
    keyring: &Keyring,
) -> Result<SyncOutcome, DbError> {
    let up = db::endpoints::upsert(conn, &desired.row).await?;
    let (rotated, active) = match &desired.secret {
        Some(s) => {
            let r = crate::endpoints::store_secret(
                conn,
                keyring,
                up.id,
                &s.value,
                desired.row.secret_grace_secs,
            )
            .await?;
            // A first secret (a new endpoint, or one whose Secret was missing until now)
            // is not a rotation: a rotation retires a previous secret.
            (r.rotated && r.retired > 0, r.active)
        }
        None => (false, 0),
    };
    Ok(SyncOutcome {
        endpoint_id: up.id,
        created: up.created,
        changed: up.changed,
        secret_rotated: rotated,
        active_secrets: active,
        state: Some(up.state),
    })
}

/// The declaration is gone: disable the row and cancel what was still pending.
pub async fn remove_endpoint(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
) -> Result<Option<(Uuid, i64)>, DbError> {
    db::endpoints::remove_declared(conn, namespace, name, "WebhookEndpoint deleted").await
}
