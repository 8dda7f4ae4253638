//! The enqueue transaction: validation, fan-out, idempotency, and group commit.
//!
//! Concurrent requests share commits: each committer task takes every request waiting in
//! the queue (up to `max_group` messages), inserts them all in one transaction, commits,
//! and only then answers each request. Commit-then-2xx is unchanged (no request is
//! answered before the commit that holds its rows), but one fsync now covers many
//! events. With no concurrency a request goes alone and waits for nobody: there is no
//! linger timer. A failing group is retried request by request, so one poisoned request
//! cannot fail its neighbours.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio::sync::{Mutex, mpsc, oneshot};
use uuid::Uuid;

use crate::db::{self, DbError, events::NewEvent};
use crate::metrics::Metrics;
use crate::notify::Notifier;

/// A validated message ready to enqueue.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub tenant: String,
    pub event_type: String,
    /// the producer's exact payload bytes, already checked to be JSON
    pub payload: String,
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    pub event_id: Uuid,
    pub delivery_ids: Vec<Uuid>,
    /// false when an earlier event with the same idempotency key was returned
    pub created: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    #[error("idempotency key {key:?} was already used with different content")]
    KeyConflict { key: String },
    /// carries the driver's message for logs only; it never reaches a client
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    #[error("enqueue failed")]
    Internal(#[source] DbError),
    #[error("hookd is shutting down")]
    ShuttingDown,
}

impl From<DbError> for EnqueueError {
    fn from(e: DbError) -> Self {
        if e.is_unavailable() {
            EnqueueError::Unavailable(e.to_string())
        } else {
            EnqueueError::Internal(e)
        }
    }
}

// ---- validation: shared by the HTTP API and documented in the README ----

/// Tenants are DNS-label-like (they default to a Kubernetes namespace).
pub fn validate_tenant(t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 128
        && t.as_bytes()[0].is_ascii_alphanumeric()
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tenant {t:?} is invalid: 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"
        ))
    }
}

/// Event types are dot-separated segments of letters, digits, '_' and '-'
/// (`invoice.paid`, `user.created-v2`), at most 128 characters. The same rule is in
/// `hookd.enqueue()` and the CRD's eventTypes patterns.
pub fn validate_event_type(t: &str) -> Result<(), String> {
    let segment_ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    if t.len() <= 128 && t.split('.').all(segment_ok) {
        Ok(())
    } else {
        Err(format!(
            "eventType {t:?} is invalid: dot-separated segments of letters, digits, '_' or '-', at most 128 characters"
        ))
    }
}

/// Idempotency keys: 1-255 printable ASCII characters.
pub fn validate_idempotency_key(k: &str) -> Result<(), String> {
    if !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        Ok(())
    } else {
        Err("idempotency key must be 1-255 printable ASCII characters without spaces".into())
    }
}

/// What makes two requests with one idempotency key "the same": event type and the
/// exact payload bytes (the tenant is part of the key itself).
fn request_hash(event_type: &str, payload: &str) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(event_type.as_bytes());
    h.update(b"\n");
    h.update(payload.as_bytes());
    h.finalize().to_vec()
}

// ---- group commit ----

struct Job {
    messages: Vec<NewMessage>,
    reply: oneshot::Sender<Result<Vec<Enqueued>, EnqueueError>>,
}

#[derive(Debug, Clone)]
pub struct OutboxConfig {
    /// committer tasks (each holds at most one connection while committing)
    pub committers: usize,
    /// most messages one shared transaction may carry
    pub max_group: usize,
}

/// Handle to the enqueue pipeline. Cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    queue: mpsc::Sender<Job>,
}

impl Outbox {
    /// Starts the committer tasks. They stop when every `Outbox` handle is dropped and the
    /// queue is drained, so requests accepted before shutdown are still committed.
    pub fn start(pool: PgPool, config: OutboxConfig, notifier: Notifier, metrics: Metrics) -> Self {
        let (tx, rx) = mpsc::channel::<Job>(config.max_group.max(1) * 4);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..config.committers.max(1) {
            let rx = rx.clone();
            let pool = pool.clone();
            let notifier = notifier.clone();
            let metrics = metrics.clone();
            let max_group = config.max_group.max(1);
            tokio::spawn(async move {
                loop {
                    let jobs = {
                        let mut rx = rx.lock().await;
                        let Some(first) = rx.recv().await else { break };
                        let mut count = first.messages.len();
                        let mut jobs = vec![first];
                        while count < max_group {
                            match rx.try_recv() {
                                Ok(j) => {
                                    count += j.messages.len();
                                    jobs.push(j);
                                }
                                Err(_) => break,
                            }
                        }
                        jobs
                    };
                    let size: usize = jobs.iter().map(|j| j.messages.len()).sum();
                    metrics.ingest_group_size.observe(size as f64);
                    commit_group(&pool, jobs, &notifier).await;
                }
            });
        }
        Outbox { queue: tx }
    }

    /// Enqueues the messages atomically (all or none) and returns once they are committed.
    pub async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<Vec<Enqueued>, EnqueueError> {
        let (reply, rx) = oneshot::channel();
        self.queue
            .send(Job { messages, reply })
            .await
            .map_err(|_| EnqueueError::ShuttingDown)?;
        // A dropped reply means the committer task died mid-transaction: the outcome is
        // unknown to us, so the producer must retry (with its idempotency key).
        rx.await.map_err(|_| EnqueueError::ShuttingDown)?
    }
}

async fn commit_group(pool: &PgPool, jobs: Vec<Job>, notifier: &Notifier) {
    if jobs.len() == 1 {
        let job = jobs.into_iter().next().expect("one job");
        let result = enqueue_tx(pool, &job.messages).await;
        if result.is_ok() {
            notifier.wake();
        }
        let _ = job.reply.send(result);
        return;
    }
    let all: Vec<NewMessage> = jobs
        .iter()
        .flat_map(|j| j.messages.iter().cloned())
        .collect();
    match enqueue_tx(pool, &all).await {
        Ok(results) => {
            notifier.wake();
            let mut results = results.into_iter();
            for job in jobs {
                let mine: Vec<Enqueued> = results.by_ref().take(job.messages.len()).collect();
                let _ = job.reply.send(Ok(mine));
            }
        }
        Err(EnqueueError::Unavailable(e)) => {
            for job in jobs {
                let _ = job.reply.send(Err(EnqueueError::Unavailable(e.clone())));
            }
        }
        Err(_) => {
            // Someone's request broke the shared transaction (an idempotency conflict or a
            // database-side rejection): give each request its own transaction and answer.
            let mut any = false;
            for job in jobs {
                let result = enqueue_tx(pool, &job.messages).await;
                any |= result.is_ok();
                let _ = job.reply.send(result);
            }
            if any {
                notifier.wake();
            }
        }
    }
}

/// One transaction: insert the events and their deliveries, resolve idempotency-key
/// repeats to the original ids, commit. Results are in input order.
async fn enqueue_tx(pool: &PgPool, messages: &[NewMessage]) -> Result<Vec<Enqueued>, EnqueueError> {
    let rows: Vec<NewEvent> = messages
        .iter()
        .map(|m| NewEvent {
            id: Uuid::now_v7(),
            tenant: m.tenant.clone(),
            event_type: m.event_type.clone(),
            payload: m.payload.clone(),
            idempotency_key: m.idempotency_key.clone(),
            request_hash: request_hash(&m.event_type, &m.payload),
        })
        .collect();
    let mut tx = pool.begin().await.map_err(DbError::from)?;
    let inserted = db::events::insert_with_fanout(&mut tx, &rows).await?;
    let mut by_id: HashMap<Uuid, Vec<Uuid>> = inserted
        .into_iter()
        .map(|r| (r.event_id, r.delivery_ids))
        .collect();

    let repeated: Vec<(String, String)> = rows
        .iter()
        .filter(|r| !by_id.contains_key(&r.id))
        .filter_map(|r| r.idempotency_key.clone().map(|k| (r.tenant.clone(), k)))
        .collect();
    let existing = if repeated.is_empty() {
        HashMap::new()
    } else {
        db::events::find_by_keys(&mut tx, &repeated)
            .await?
            .into_iter()
            .map(|e| ((e.tenant.clone(), e.idempotency_key.clone()), e))
            .collect::<HashMap<_, _>>()
    };

    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        if let Some(ids) = by_id.remove(&r.id) {
            out.push(Enqueued {
                event_id: r.id,
                delivery_ids: ids,
                created: true,
            });
            continue;
        }
        let key = r.idempotency_key.clone().unwrap_or_default();
        match existing.get(&(r.tenant.clone(), key.clone())) {
            Some(e) if e.request_hash == r.request_hash => out.push(Enqueued {
                event_id: e.event_id,
                delivery_ids: e.delivery_ids.clone(),
                created: false,
            }),
            Some(_) => return Err(EnqueueError::KeyConflict { key }),
            // Inserted-and-conflicting in this very statement is the only other way; the
            // row then exists and was found above, so this is a bug worth surfacing.
            None => {
                return Err(EnqueueError::Internal(DbError::Query(
                    sqlx::Error::RowNotFound,
                )));
            }
        }
    }
    tx.commit().await.map_err(DbError::from)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_type_syntax() {
        for ok in ["invoice.paid", "a", "user.created-v2", "a_b.c-d.e9"] {
            assert!(validate_event_type(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "a..b",
            "a b",
            "a/b",
            "a.*",
            &"x".repeat(129),
        ] {
            assert!(validate_event_type(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tenant_syntax() {
        assert!(validate_tenant("team-a").is_ok());
        assert!(validate_tenant("Team.A_1").is_ok());
        for bad in ["", "-a", "a b", "a/b", &"t".repeat(129)] {
            assert!(validate_tenant(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn idempotency_key_syntax() {
        assert!(validate_idempotency_key("order-42/attempt:1").is_ok());
        assert!(validate_idempotency_key("").is_err());
        assert!(validate_idempotency_key("has space").is_err());
        assert!(validate_idempotency_key(&"k".repeat(256)).is_err());
    }

    #[test]
    fn request_hash_depends_on_type_and_exact_bytes() {
        let a = request_hash("t", r#"{"a":1}"#);
        assert_eq!(a, request_hash("t", r#"{"a":1}"#));
        assert_ne!(a, request_hash("t", r#"{"a": 1}"#));
        assert_ne!(a, request_hash("u", r#"{"a":1}"#));
    }
}
