//! `hookd receiver`: a small webhook receiver for people testing their setup and for the
//! end-to-end test. Every POST, on any path, is a delivery: its Standard Webhooks signature
//! is verified with the secrets it was given (flags, and files re-read on every delivery so
//! a rotated, mounted Secret takes effect), one line per delivery is printed, and what
//! arrived is recorded per webhook id and served as JSON:
//!
//! - `GET /received`: counts, duplicates, invalid signatures, and per id how often it came,
//!   how many `v1,` signatures the latest delivery carried and which secret verified it
//!   (by where it came from, `secret #1` or `FILE #1`; a SHA-256 prefix only with
//!   `--show-fingerprints`, since this page is unauthenticated); `DELETE /received` forgets
//!   it all. At most [`MAX_RECORDED_IDS`] ids are kept, the oldest forgotten first.
//! - `GET /control`, `PUT /control` `{"delayMs"?, "status"?}`: answer slowly, or with an
//!   error status, to hold deliveries in flight or keep them pending.
//! - `GET /healthz`.
//!
//! `hookd dev` serves the same receiver for its examples. Everything is in memory: this is
//! a test tool, and its control routes are unauthenticated.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::config::ReceiverArgs;
use crate::signing::{self, SecretError, SigningSecret};

/// Printed bodies are cut here, so one large payload cannot flood a terminal or a log.
const MAX_PRINTED_BODY: usize = 1024;

/// Ids kept in `GET /received`; past it the oldest (smallest UUIDv7) are forgotten, so a
/// long run or a flood of made-up ids cannot grow the receiver without bound.
pub const MAX_RECORDED_IDS: usize = 10_000;

/// Longest `webhook-id` or event type recorded (hookd's are 36 and at most 128).
const MAX_RECORDED_FIELD: usize = 256;

/// Largest delivery body read; hookd's payload limit is 256 KiB by default.
const MAX_BODY_BYTES: usize = 4 << 20;

/// Secrets supplied at run time by an embedding process (`hookd dev` passes every secret
/// of its database), as (label, `whsec_…`) pairs, read on every delivery.
pub type DynamicSecrets = Arc<std::sync::RwLock<Vec<(String, String)>>>;

#[derive(Debug, thiserror::Error)]
pub enum ReceiverError {
    /// The secret itself is never part of the message.
    #[error("signing secret #{index}: {source}")]
    BadSecret {
        index: usize,
        #[source]
        source: SecretError,
    },
    #[error(
        "no signing secret: give --secret (HOOKD_RECEIVER_SECRETS) or --secret-file (HOOKD_RECEIVER_SECRET_FILES)"
    )]
    NoSecrets,
    #[error("status {0} is not an HTTP status code (100-599)")]
    BadStatus(u16),
}

/// A short, stable name for a secret that reveals nothing about it: the first 12 hex digits
/// of the SHA-256 of the secret string (surrounding whitespace removed, as `SigningSecret`
/// ignores it). `printf %s "$secret" | sha256sum | cut -c1-12` computes the same.
pub fn fingerprint(secret: &str) -> String {
    let digest = Sha256::digest(secret.trim().as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// Makes text from a request safe to print on one line: control characters (CR, LF, ESC
/// and the rest) and bidirectional-override characters are escaped, so a sender cannot
/// forge log lines or rewrite a terminal.
pub fn escape_for_log(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let invisible = matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || invisible {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn truncated(s: &str) -> String {
    s.chars().take(MAX_RECORDED_FIELD).collect()
}

#[derive(Clone, Debug)]
struct Key {
    /// What `/received` calls it: its source, or its fingerprint when asked for.
    label: String,
    secret: SigningSecret,
}

impl Key {
    fn parse(raw: &str, label: String, show_fingerprint: bool) -> Result<Key, SecretError> {
        Ok(Key {
            label: if show_fingerprint {
                fingerprint(raw)
            } else {
                label
            },
            secret: SigningSecret::parse(raw)?,
        })
    }
}

/// How the receiver answers deliveries; changeable at run time with `PUT /control`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Behaviour {
    /// Milliseconds to wait before answering.
    pub delay_ms: u64,
    /// Status answered to verified deliveries (invalid ones always get 401).
    pub status: u16,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            delay_ms: 0,
            status: 200,
        }
    }
}

impl Behaviour {
    fn validate(self) -> Result<Self, ReceiverError> {
        if (100..=599).contains(&self.status) {
            Ok(self)
        } else {
            Err(ReceiverError::BadStatus(self.status))
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BehaviourPatch {
    delay_ms: Option<u64>,
    status: Option<u16>,
}

/// What `GET /received` answers.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Received {
    /// Fingerprints of the secrets in use now (flags first, then files).
    pub secrets: Vec<String>,
    pub behaviour: Behaviour,
    /// Every POST, valid or not.
    pub deliveries: u64,
    pub verified: u64,
    /// Deliveries whose signature did not verify (or that lacked the webhook headers).
    pub invalid: u64,
    /// Webhook ids verified at least once.
    pub unique: u64,
    /// Verified deliveries of an id that had been verified before (at-least-once resends).
    pub duplicates: u64,
    /// Ids dropped from `ids` to keep it at most MAX_RECORDED_IDS long (oldest first).
    #[serde(default)]
    pub forgotten: u64,
    /// Deliveries being answered right now (useful with a delay).
    pub in_flight: u64,
    /// Per `webhook-id`.
    pub ids: BTreeMap<String, IdRecord>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IdRecord {
    pub event_type: Option<String>,
    /// Deliveries with this id, valid or not.
    pub count: u64,
    pub verified: u64,
    pub invalid: u64,
    /// `v1,` entries in the latest delivery's `webhook-signature` (two during a rotation).
    pub signatures: usize,
    /// Which secret verified the latest delivery, if one did (its label, or fingerprint
    /// with `--show-fingerprints`).
    pub key: Option<String>,
    /// Status answered to the latest delivery.
    pub last_status: u16,
}

/// Where the receiver's secrets come from.
#[derive(Debug, Clone, Default)]
pub struct ReceiverConfig {
    /// `whsec_…` secrets, fixed for the life of the process.
    pub secrets: Vec<String>,
    /// Files of whitespace-separated secrets, re-read on every delivery.
    pub secret_files: Vec<PathBuf>,
    pub behaviour: Behaviour,
    /// Name secrets by a SHA-256 prefix in `/received` instead of by their source.
    pub show_fingerprints: bool,
    /// Secrets an embedding process keeps up to date.
    pub dynamic: Option<DynamicSecrets>,
}

impl From<&ReceiverArgs> for ReceiverConfig {
    fn from(a: &ReceiverArgs) -> Self {
        ReceiverConfig {
            secrets: a.secrets.clone(),
            secret_files: a.secret_files.clone(),
            behaviour: Behaviour {
                delay_ms: a.delay_ms,
                status: a.status,
            },
            show_fingerprints: a.show_fingerprints,
            dynamic: None,
        }
    }
}

/// The last content read from one secret file, so it is parsed (and logged) only when it
/// changes.
#[derive(Default)]
struct FileKeys {
    content: Option<String>,
    keys: Vec<Key>,
    error: Option<String>,
}

#[derive(Default)]
struct Inner {
    behaviour: Behaviour,
    files: Vec<FileKeys>,
    received: Received,
}

struct Shared {
    static_keys: Vec<Key>,
    files: Vec<PathBuf>,
    dynamic: Option<DynamicSecrets>,
    show_fingerprints: bool,
    state: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the counters inconsistent enough to
        // matter for a test tool; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-reads every secret file and returns the secrets in use now.
    async fn current_keys(&self) -> Vec<Key> {
        let mut contents = Vec::with_capacity(self.files.len());
        for path in &self.files {
            contents.push(tokio::fs::read_to_string(path).await);
        }
        let dynamic: Vec<Key> = match &self.dynamic {
            None => Vec::new(),
            Some(d) => d
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter_map(|(label, raw)| {
                    Key::parse(raw, label.clone(), self.show_fingerprints).ok()
                })
                .collect(),
        };
        let mut st = self.lock();
        for ((path, read), cached) in self.files.iter().zip(contents).zip(st.files.iter_mut()) {
            refresh_file(path, read, cached, self.show_fingerprints);
        }
        let keys: Vec<Key> = self
            .static_keys
            .iter()
            .chain(st.files.iter().flat_map(|f| f.keys.iter()))
            .cloned()
            .chain(dynamic)
            .collect();
        st.received.secrets = keys.iter().map(|k| k.label.clone()).collect();
        keys
    }
}

fn refresh_file(
    path: &std::path::Path,
    read: std::io::Result<String>,
    cached: &mut FileKeys,
    show_fingerprints: bool,
) {
    match read {
        Ok(content) => {
            if cached.content.as_deref() == Some(content.as_str()) {
                return;
            }
            let mut keys = Vec::new();
            let mut errors = Vec::new();
            for (i, raw) in content.split_whitespace().enumerate() {
                let label = format!("{} #{}", path.display(), i + 1);
                match Key::parse(raw, label, show_fingerprints) {
                    Ok(k) => keys.push(k),
                    Err(e) => errors.push(format!("secret #{}: {e}", i + 1)),
                }
            }
            let labels: Vec<&str> = keys.iter().map(|k| k.label.as_str()).collect();
            tracing::info!(path = %path.display(), secrets = ?labels, "secret file loaded");
            if !errors.is_empty() {
                tracing::warn!(path = %path.display(), errors = ?errors, "secret file has unusable entries");
            }
            cached.content = Some(content);
            cached.keys = keys;
            cached.error = None;
        }
        Err(e) => {
            let msg = e.to_string();
            if cached.error.as_deref() != Some(msg.as_str()) {
                tracing::warn!(path = %path.display(), error = %msg, "secret file unreadable; its secrets are not used");
            }
            *cached = FileKeys {
                content: None,
                keys: Vec::new(),
                error: Some(msg),
            };
        }
    }
}

/// Counts a delivery as in flight until its response is sent or its client goes away
/// (axum drops the handler future then, and this guard with it).
struct InFlight(Arc<Shared>);

impl InFlight {
    fn enter(shared: &Arc<Shared>) -> Self {
        shared.lock().received.in_flight += 1;
        InFlight(shared.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().received.in_flight -= 1;
    }
}

/// A configured receiver; `router()` serves it.
#[derive(Clone)]
pub struct Receiver {
    shared: Arc<Shared>,
}

impl Receiver {
    pub fn new(config: ReceiverConfig) -> Result<Self, ReceiverError> {
        let static_keys = config
            .secrets
            .iter()
            .enumerate()
            .map(|(index, raw)| {
                Key::parse(
                    raw,
                    format!("secret #{}", index + 1),
                    config.show_fingerprints,
                )
                .map_err(|source| ReceiverError::BadSecret { index, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let behaviour = config.behaviour.validate()?;
        let state = Inner {
            behaviour,
            files: config
                .secret_files
                .iter()
                .map(|_| FileKeys::default())
                .collect(),
            received: Received {
                secrets: static_keys.iter().map(|k| k.label.clone()).collect(),
                behaviour,
                ..Received::default()
            },
        };
        Ok(Receiver {
            shared: Arc::new(Shared {
                static_keys,
                files: config.secret_files,
                dynamic: config.dynamic,
                show_fingerprints: config.show_fingerprints,
                state: Mutex::new(state),
            }),
        })
    }

    /// Every POST is a delivery, whatever its path, so an endpoint URL can point anywhere
    /// on the receiver; the other methods serve the JSON routes.
    pub fn router(&self) -> Router {
        let with_post = |m: MethodRouter<Arc<Shared>>| m.post(deliver);
        Router::new()
            .route("/received", with_post(get(received).delete(reset)))
            .route("/control", with_post(get(control).put(set_control)))
            .route("/healthz", with_post(get(|| async { "ok" })))
            .fallback(post(deliver))
            .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(self.shared.clone())
    }
}

/// `hookd receiver`: serves until `shutdown`.
pub async fn run(args: ReceiverArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    if args.secrets.is_empty() && args.secret_files.is_empty() {
        return Err(ReceiverError::NoSecrets.into());
    }
    let receiver = Receiver::new(ReceiverConfig::from(&args))?;
    let listener = crate::runtime::bind(args.listen, "receiver", "--listen, HOOKD_LISTEN").await?;
    let keys = receiver.shared.current_keys().await;
    println!(
        "hookd receiver: listening on http://{}, verifying with {} secret(s) now ({} from files re-read on every delivery)",
        listener.local_addr()?,
        keys.len(),
        args.secret_files.len()
    );
    crate::ops::serve_on(listener, receiver.router(), shutdown).await?;
    Ok(())
}

/// Longer than `hookd dev`'s secret refresh period (1 s).
const DYNAMIC_SETTLE: std::time::Duration = std::time::Duration::from_millis(1500);

async fn deliver(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let _in_flight = InFlight::enter(&shared);
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let (id, event_type, signature) = (
        h("webhook-id"),
        h("hookd-event-type"),
        h("webhook-signature"),
    );
    let verify = |keys: &[Key]| -> Result<String, String> {
        if keys.is_empty() {
            return Err("no signing secret configured".into());
        }
        let now = chrono::Utc::now().timestamp();
        // Header and timestamp errors do not depend on the key; the first error is the reason.
        let mut first_error = None;
        keys.iter()
            .find(|key| {
                let checked = signing::verify(
                    &key.secret,
                    id,
                    h("webhook-timestamp"),
                    signature,
                    &body,
                    now,
                );
                checked.map_err(|e| first_error.get_or_insert(e)).is_ok()
            })
            .map(|k| k.label.clone())
            .ok_or_else(|| first_error.map(|e| e.to_string()).unwrap_or_default())
    };
    let mut verdict = verify(&shared.current_keys().await);
    if verdict.is_err() && shared.dynamic.is_some() {
        // `hookd dev`: an endpoint made through the API a moment ago may be signing with a
        // secret the next refresh brings; wait for it once instead of refusing the first send
        tokio::time::sleep(DYNAMIC_SETTLE).await;
        verdict = verify(&shared.current_keys().await);
    }
    let signatures = signature.map_or(0, |s| {
        s.split_ascii_whitespace()
            .filter(|e| e.starts_with("v1,"))
            .count()
    });

    let behaviour = {
        let mut st = shared.lock();
        let behaviour = st.behaviour;
        let status = if verdict.is_ok() {
            behaviour.status
        } else {
            StatusCode::UNAUTHORIZED.as_u16()
        };
        let r = &mut st.received;
        r.deliveries += 1;
        match &verdict {
            Ok(_) => r.verified += 1,
            Err(_) => r.invalid += 1,
        }
        if let Some(id) = id {
            let id = truncated(id);
            if !r.ids.contains_key(&id) && r.ids.len() >= MAX_RECORDED_IDS {
                r.ids.pop_first();
                r.forgotten += 1;
            }
            let rec = r.ids.entry(id).or_default();
            let seen_before = rec.verified > 0;
            rec.event_type = event_type.map(truncated);
            rec.count += 1;
            rec.signatures = signatures;
            rec.last_status = status;
            match &verdict {
                Ok(key) => {
                    rec.verified += 1;
                    rec.key = Some(key.clone());
                }
                Err(_) => {
                    rec.invalid += 1;
                    rec.key = None;
                }
            }
            if verdict.is_ok() {
                if seen_before {
                    r.duplicates += 1;
                } else {
                    r.unique += 1;
                }
            }
        }
        behaviour
    };

    println!(
        "receiver: {} webhook-id={} signature={} body={}",
        escape_for_log(event_type.unwrap_or("?")),
        escape_for_log(id.unwrap_or("?")),
        if verdict.is_ok() {
            "verified"
        } else {
            "INVALID"
        },
        printable_body(&body)
    );
    if let Err(reason) = &verdict {
        tracing::warn!(webhook_id = %escape_for_log(id.unwrap_or("?")), reason = %escape_for_log(reason), "delivery refused");
    }

    if behaviour.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(behaviour.delay_ms)).await;
    }
    match verdict {
        Ok(_) => {
            let status = StatusCode::from_u16(behaviour.status).unwrap_or(StatusCode::OK);
            (status, if status.is_success() { "ok" } else { "error" }).into_response()
        }
        Err(reason) => error(
            StatusCode::UNAUTHORIZED,
            "invalid_signature",
            format!("signature not verified: {reason}"),
        ),
    }
}

/// An error answer in the API's shape (`{"error": {"code", "message"}}`), so scripts read
/// one format from both; built here because a test receiver has no business depending on
/// the API's error type (and its auth and database mappings).
fn error(status: StatusCode, code: &str, message: String) -> Response {
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    (status, axum::Json(body)).into_response()
}

fn printable_body(body: &[u8]) -> String {
    if body.len() <= MAX_PRINTED_BODY {
        return escape_for_log(&String::from_utf8_lossy(body));
    }
    format!(
        "{}… ({} bytes)",
        escape_for_log(&String::from_utf8_lossy(&body[..MAX_PRINTED_BODY])),
        body.len()
    )
}

async fn received(State(shared): State<Arc<Shared>>) -> Response {
    // Re-read the files so a caller waiting for a rotated secret sees it without sending
    // a delivery first.
    shared.current_keys().await;
    let snapshot = shared.lock().received.clone();
    axum::Json(snapshot).into_response()
}

async fn reset(State(shared): State<Arc<Shared>>) -> StatusCode {
    let mut st = shared.lock();
    let r = &mut st.received;
    *r = Received {
        secrets: std::mem::take(&mut r.secrets),
        behaviour: r.behaviour,
        in_flight: r.in_flight,
        ..Received::default()
    };
    StatusCode::NO_CONTENT
}

async fn control(State(shared): State<Arc<Shared>>) -> Response {
    let behaviour = shared.lock().behaviour;
    axum::Json(behaviour).into_response()
}

async fn set_control(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let patch: BehaviourPatch = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_control",
                e.to_string(),
            );
        }
    };
    let mut st = shared.lock();
    let next = Behaviour {
        delay_ms: patch.delay_ms.unwrap_or(st.behaviour.delay_ms),
        status: patch.status.unwrap_or(st.behaviour.status),
    };
    match next.validate() {
        Ok(b) => {
            st.behaviour = b;
            st.received.behaviour = b;
            tracing::info!(
                delay_ms = b.delay_ms,
                status = b.status,
                "receiver behaviour changed"
            );
            axum::Json(b).into_response()
        }
        Err(e) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_control",
            e.to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_sha256_prefix_of_trimmed_secret() {
        // printf %s whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw | sha256sum | cut -c1-12
        let fp = fingerprint("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        assert_eq!(fp, "96ad2ccd8146");
        assert_eq!(
            fp,
            fingerprint("  whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")
        );
        assert_ne!(fp, fingerprint("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"));
    }

    #[test]
    fn bad_secret_error_does_not_contain_the_secret() {
        let err = Receiver::new(ReceiverConfig {
            secrets: vec!["whsec_c2hvcnQ=".into()],
            ..ReceiverConfig::default()
        })
        .err()
        .expect("a 5-byte key is refused");
        let msg = err.to_string();
        assert!(msg.contains("#0"), "{msg}");
        assert!(!msg.contains("c2hvcnQ"), "{msg}");
    }

    #[test]
    fn printed_fields_cannot_forge_lines() {
        assert_eq!(
            printable_body(b"{\"a\":1}\nreceiver: forged\x1b[2K"),
            "{\"a\":1}\\nreceiver: forged\\u{1b}[2K"
        );
        assert_eq!(escape_for_log("id\r\nx\u{202E}y"), "id\\r\\nx\\u{202e}y");
        assert_eq!(escape_for_log("invoice.paid ü"), "invoice.paid ü");
    }

    /// Issue 19: a flood of ids keeps at most MAX_RECORDED_IDS records, oldest dropped.
    #[tokio::test]
    async fn recorded_ids_are_bounded() {
        use tower::ServiceExt;
        let rx = Receiver::new(ReceiverConfig {
            secrets: vec!["whsec_3q8JNv6QYhT0mZf1xk2Wc9bLr4sPaGdE".into()],
            ..ReceiverConfig::default()
        })
        .unwrap();
        let router = rx.router();
        let long_id = "x".repeat(10_000);
        for i in 0..MAX_RECORDED_IDS + 5 {
            let id = if i == 0 {
                long_id.clone()
            } else {
                format!("id-{i:06}")
            };
            let req = axum::http::Request::post("/hooks")
                .header("webhook-id", id)
                .body(axum::body::Body::from("{}"))
                .unwrap();
            let resp = router.clone().oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        }
        let r = rx.shared.lock().received.clone();
        assert_eq!(r.ids.len(), MAX_RECORDED_IDS);
        assert_eq!(r.forgotten, 5);
        assert_eq!(r.deliveries, (MAX_RECORDED_IDS + 5) as u64);
        assert!(r.ids.keys().all(|k| k.len() <= MAX_RECORDED_FIELD));
        // the smallest ids went first
        assert!(!r.ids.contains_key("id-000001"));
        assert!(
            r.ids
                .contains_key(&format!("id-{:06}", MAX_RECORDED_IDS + 4))
        );
    }

    #[test]
    fn body_is_cut_for_printing() {
        assert_eq!(printable_body(b"{\"a\":1}"), "{\"a\":1}");
        let big = vec![b'x'; MAX_PRINTED_BODY + 10];
        let p = printable_body(&big);
        assert!(p.ends_with(&format!("… ({} bytes)", MAX_PRINTED_BODY + 10)));
    }
}
