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
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio::sync::{Mutex, mpsc, oneshot};
use uuid::Uuid;

use crate::db::{self, DbError, events::KeyLock, events::NewEvent};
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
    /// the consumer the event is for (`None`: the tenant's endpoints without a consumer)
    pub consumer: Option<String>,
    /// where an inbound event came from (`POST /in/{name}`); `None` for a produced one
    pub origin: Option<crate::db::events::Origin>,
    /// the W3C trace context the request carried (`traceparent`, `tracestate`)
    pub trace: Option<crate::domain::TraceContext>,
    /// the message's `orderingKey`: endpoints that order by key are sent the deliveries
    /// of one key one at a time, in commit order
    pub ordering_key: Option<String>,
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
    /// another request (or a producer's open transaction through `hookd.enqueue`) holds
    /// this key and did not finish within the wait bound
    #[error("idempotency key {key:?} is being used by a request that has not finished")]
    KeyInUse { key: String },
    /// another request (or a producer's open transaction) holds this ordering key's line
    /// and did not finish within the wait bound
    #[error("ordering key {key:?} is being used by a transaction that has not finished")]
    OrderingKeyInUse { key: String },
    /// carries the driver's message for logs only; it never reaches a client
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// The connection failed at or after COMMIT and the rows could not be looked up
    /// afterwards: the event may or may not exist. Never reported as "nothing written".
    #[error("the outcome of the commit is unknown: {0}")]
    CommitOutcomeUnknown(String),
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

pub use crate::domain::{
    validate_consumer, validate_event_type, validate_idempotency_key, validate_ordering_key,
    validate_tenant,
};

/// What makes two requests with one idempotency key "the same": event type, the exact
/// payload bytes, the consumer and the ordering key (the tenant is part of the key itself).
pub fn request_hash(
    event_type: &str,
    payload: &str,
    consumer: Option<&str>,
    ordering_key: Option<&str>,
) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(event_type.as_bytes());
    h.update(b"\n");
    h.update(payload.as_bytes());
    // the consumer is part of what a key stands for; without one the hash is the one
    // stored before consumers existed
    if let Some(c) = consumer {
        h.update(b"\n");
        h.update(c.as_bytes());
    }
    // as hookd.enqueue hashes it (migration 0034); a consumer never starts with '#'
    if let Some(k) = ordering_key {
        h.update(b"\n#");
        h.update(k.as_bytes());
    }
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
    /// how long a request waits for another holder of its idempotency key (a concurrent
    /// request, or a producer's open transaction through `hookd.enqueue`) before it is
    /// answered `409 idempotency_key_in_use`. Only that request waits, on a task of its
    /// own; its group goes ahead without it.
    pub key_wait: Duration,
}

impl OutboxConfig {
    pub fn defaults() -> Self {
        OutboxConfig {
            committers: 4,
            max_group: 256,
            key_wait: Duration::from_secs(5),
        }
    }
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
            let config = config.clone();
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
                    commit_group(&pool, &config, jobs, &notifier).await;
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
        // A dropped reply means the committer task died mid-transaction: whether it
        // committed is unknown to us.
        rx.await.map_err(|_| {
            EnqueueError::CommitOutcomeUnknown("the committer stopped while committing".into())
        })?
    }
}

/// How one job fared inside a shared transaction.
enum Verdict {
    Done(Vec<Enqueued>),
    /// refused without writing anything of its own (a single message whose key was used
    /// with different content): answered after the group commits
    Refused(EnqueueError),
    /// must leave the shared transaction: a batch with a refused message (its other
    /// messages were inserted and must not commit), or a key another holder is using
    Alone,
}

/// Commits a group of jobs in one transaction, answering each. Whatever one job does
/// (a key conflict, a key held elsewhere, a batch that must be refused whole), the others
/// commit together: the job leaves the group and is handled on its own.
async fn commit_group(pool: &PgPool, cfg: &OutboxConfig, mut jobs: Vec<Job>, notifier: &Notifier) {
    let mut retried_unwritten = false;
    loop {
        let messages: Vec<&[NewMessage]> = jobs.iter().map(|j| j.messages.as_slice()).collect();
        match group_tx(pool, &messages).await {
            Ok(GroupResult::Committed(verdicts)) => {
                notifier.hand(verdicts.iter().flat_map(|v| match v {
                    Verdict::Done(r) => handed(r),
                    _ => Vec::new(),
                }));
                let mut alone = Vec::new();
                for (job, v) in jobs.into_iter().zip(verdicts) {
                    match v {
                        Verdict::Done(r) => {
                            let _ = job.reply.send(Ok(r));
                        }
                        Verdict::Refused(e) => {
                            let _ = job.reply.send(Err(e));
                        }
                        Verdict::Alone => alone.push(job),
                    }
                }
                spawn_alone(pool, cfg, alone, notifier);
                return;
            }
            Ok(GroupResult::Regroup(verdicts)) => {
                // Some jobs must leave; the rest go again without them (nothing was
                // committed: the transaction was rolled back).
                let mut stay = Vec::new();
                let mut alone = Vec::new();
                for (job, v) in jobs.into_iter().zip(verdicts) {
                    if matches!(v, Verdict::Alone) {
                        alone.push(job);
                    } else {
                        stay.push(job);
                    }
                }
                spawn_alone(pool, cfg, alone, notifier);
                if stay.is_empty() {
                    return;
                }
                jobs = stay;
            }
            Err(GroupError::NotWritten(e))
                if e.is_transient_conflict() || e.sqlstate().as_deref() == Some(LOCK_TIMEOUT) =>
            {
                // A deadlock or serialization failure is about this group's mix: each
                // job on its own has its own chance (not a 503 for all of them). A lock
                // wait that timed out (someone's DDL or a producer's lock) is retried
                // the same way: a busy lock is never an answer (invariant 10).
                spawn_alone(pool, cfg, jobs, notifier);
                return;
            }
            Err(GroupError::NotWritten(e)) if e.is_unavailable() => {
                let detail = e.to_string();
                for job in jobs {
                    let _ = job
                        .reply
                        .send(Err(EnqueueError::Unavailable(detail.clone())));
                }
                return;
            }
            Err(GroupError::NotWritten(e)) => {
                if jobs.len() == 1 {
                    let job = jobs.pop().expect("one job");
                    let _ = job.reply.send(Err(EnqueueError::from(e)));
                    return;
                }
                // someone's request broke the shared statement: each on its own
                spawn_alone(pool, cfg, jobs, notifier);
                return;
            }
            Err(GroupError::ProvenUnwritten(e)) if !retried_unwritten => {
                // The connection failed at COMMIT, and a fresh connection proved the
                // transaction did not commit: run it again once.
                tracing::warn!(error = %e, "commit failed before it took effect; retrying the group");
                retried_unwritten = true;
            }
            Err(GroupError::ProvenUnwritten(e)) => {
                let detail = e.to_string();
                for job in jobs {
                    let _ = job
                        .reply
                        .send(Err(EnqueueError::Unavailable(detail.clone())));
                }
                return;
            }
            Err(GroupError::Unknown(detail)) => {
                tracing::error!(error = %detail, "the outcome of a commit is unknown");
                for job in jobs {
                    let _ = job
                        .reply
                        .send(Err(EnqueueError::CommitOutcomeUnknown(detail.clone())));
                }
                return;
            }
        }
    }
}

/// Runs jobs that left their group, each in a transaction of its own, on tasks of their
/// own: a job waiting for a held idempotency key holds up nobody else.
fn spawn_alone(pool: &PgPool, cfg: &OutboxConfig, jobs: Vec<Job>, notifier: &Notifier) {
    for job in jobs {
        let (pool, cfg, notifier) = (pool.clone(), cfg.clone(), notifier.clone());
        tokio::spawn(async move {
            let result = enqueue_alone(&pool, &cfg, &job.messages).await;
            if let Ok(r) = &result {
                notifier.hand(handed(r));
            }
            let _ = job.reply.send(result);
        });
    }
}

/// The deliveries a commit created, for the dispatchers to lease at once (those of an
/// event an idempotency key returned are not new).
fn handed(enqueued: &[Enqueued]) -> Vec<Uuid> {
    enqueued
        .iter()
        .filter(|e| e.created)
        .flat_map(|e| e.delivery_ids.iter().copied())
        .collect()
}

/// One job in its own transaction, waiting (bounded) for keys held elsewhere.
async fn enqueue_alone(
    pool: &PgPool,
    cfg: &OutboxConfig,
    messages: &[NewMessage],
) -> Result<Vec<Enqueued>, EnqueueError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match alone_tx(pool, cfg, messages).await {
            Ok(r) => return r,
            Err(GroupError::NotWritten(e)) if e.is_transient_conflict() && tries < 3 => {}
            // A lock wait other than for an idempotency key (those are answered in
            // `alone_tx`) timed out: a table lock held by upkeep or a producer. Retried
            // after a pause; if it persists, the database is busy (503, retryable), never
            // an internal error.
            Err(GroupError::NotWritten(e)) if e.sqlstate().as_deref() == Some(LOCK_TIMEOUT) => {
                if tries >= LOCK_TIMEOUT_TRIES {
                    return Err(EnqueueError::Unavailable(e.to_string()));
                }
                tokio::time::sleep(Duration::from_millis(50 * u64::from(tries))).await;
            }
            Err(GroupError::NotWritten(e)) => return Err(EnqueueError::from(e)),
            Err(GroupError::ProvenUnwritten(_)) if tries < 3 => {}
            Err(GroupError::ProvenUnwritten(e)) => return Err(EnqueueError::from(e)),
            Err(GroupError::Unknown(detail)) => {
                return Err(EnqueueError::CommitOutcomeUnknown(detail));
            }
        }
    }
}

/// SQLSTATE 55P03: `lock_timeout` expired.
const LOCK_TIMEOUT: &str = "55P03";

/// Attempts of a job alone whose lock waits (other than for its keys) time out.
const LOCK_TIMEOUT_TRIES: u32 = 4;

enum GroupResult {
    Committed(Vec<Verdict>),
    /// rolled back; the jobs marked `Alone` must leave the group
    Regroup(Vec<Verdict>),
}

#[derive(Debug)]
enum GroupError {
    /// failed before COMMIT was sent: rolled back, nothing written
    NotWritten(DbError),
    /// COMMIT's answer was lost, and a fresh connection proved nothing was written
    ProvenUnwritten(DbError),
    /// COMMIT's answer was lost and what happened could not be established
    Unknown(String),
}

impl From<DbError> for GroupError {
    fn from(e: DbError) -> Self {
        GroupError::NotWritten(e)
    }
}

/// The shared transaction of a group. Keys held elsewhere are not waited for: their jobs
/// are marked to leave the group.
async fn group_tx(pool: &PgPool, jobs: &[&[NewMessage]]) -> Result<GroupResult, GroupError> {
    // A backstop: no wait inside a shared transaction is unbounded (keys are try-locked
    // below, so this only fires on something unforeseen).
    let mut tx = db::events::begin_enqueue(pool, GROUP_LOCK_TIMEOUT).await?;
    let keys: Vec<KeyLock> = jobs.iter().flat_map(|m| key_locks(m)).collect();
    let busy: std::collections::HashSet<KeyLock> = db::events::try_lock_keys(&mut tx, &keys)
        .await?
        .into_iter()
        .collect();
    let holds_busy_key = |msgs: &[NewMessage]| key_locks(msgs).iter().any(|k| busy.contains(k));
    // Jobs with a busy key do not take part; their slots get `Alone`.
    let taking_part: Vec<bool> = jobs.iter().map(|m| !holds_busy_key(m)).collect();
    let all: Vec<&NewMessage> = jobs
        .iter()
        .zip(&taking_part)
        .filter(|(_, t)| **t)
        .flat_map(|(m, _)| m.iter())
        .collect();
    let (rows, outcomes, session) = insert_messages(&mut tx, &all).await?;
    let mut outcomes = outcomes.into_iter();
    let mut verdicts = Vec::with_capacity(jobs.len());
    let mut regroup = false;
    for (msgs, take) in jobs.iter().zip(&taking_part) {
        if !take {
            verdicts.push(Verdict::Alone);
            continue;
        }
        let mine: Vec<MessageOutcome> = outcomes.by_ref().take(msgs.len()).collect();
        verdicts.push(job_verdict(mine, &mut regroup));
    }
    if regroup {
        tx.rollback().await.map_err(DbError::from)?;
        return Ok(GroupResult::Regroup(verdicts));
    }
    finish(pool, tx, session, &rows).await?;
    Ok(GroupResult::Committed(verdicts))
}

/// One job alone, waiting at most `key_wait` for its keys.
async fn alone_tx(
    pool: &PgPool,
    cfg: &OutboxConfig,
    messages: &[NewMessage],
) -> Result<Result<Vec<Enqueued>, EnqueueError>, GroupError> {
    let mut tx = db::events::begin_enqueue(pool, cfg.key_wait).await?;
    let keys = key_locks(messages);
    match db::events::lock_keys(&mut tx, &keys).await {
        Ok(()) => {}
        Err(e) if e.sqlstate().as_deref() == Some(LOCK_TIMEOUT) => {
            // which of the keys was busy, the timeout does not say: the idempotency key
            // when there is one (the answer producers already handle)
            let first = keys.iter().find(|k| !k.ordering).or(keys.first());
            let key = first.map(|k| k.key.clone()).unwrap_or_default();
            return Ok(Err(match first {
                Some(k) if k.ordering => EnqueueError::OrderingKeyInUse { key },
                _ => EnqueueError::KeyInUse { key },
            }));
        }
        Err(e) => return Err(e.into()),
    }
    let all: Vec<&NewMessage> = messages.iter().collect();
    let (rows, outcomes, session) = insert_messages(&mut tx, &all).await?;
    let mut out = Vec::with_capacity(outcomes.len());
    for o in outcomes {
        match o {
            MessageOutcome::Ok(e) => out.push(e),
            MessageOutcome::Conflict(key) => {
                tx.rollback().await.map_err(DbError::from)?;
                return Ok(Err(EnqueueError::KeyConflict { key }));
            }
            MessageOutcome::Vanished => {
                tx.rollback().await.map_err(DbError::from)?;
                // retention removed the event holding the key while we ran: go again,
                // the key is free now
                return Err(GroupError::ProvenUnwritten(DbError::Query(
                    sqlx::Error::RowNotFound,
                )));
            }
        }
    }
    finish(pool, tx, session, &rows).await?;
    Ok(Ok(out))
}

/// The keys a job's transaction must hold: its idempotency keys and its ordering keys.
fn key_locks(messages: &[NewMessage]) -> Vec<KeyLock> {
    let mut keys = Vec::new();
    for m in messages {
        if let Some(k) = &m.idempotency_key {
            keys.push(KeyLock::idempotency(&m.tenant, k));
        }
        if let Some(k) = &m.ordering_key {
            keys.push(KeyLock::ordering(&m.tenant, k));
        }
    }
    keys
}

/// Lock waits in a shared transaction end after this long (a backstop; see `group_tx`).
const GROUP_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

enum MessageOutcome {
    Ok(Enqueued),
    Conflict(String),
    /// the key's event was deleted (retention) between the insert and the lookup
    Vanished,
}

fn job_verdict(mine: Vec<MessageOutcome>, regroup: &mut bool) -> Verdict {
    let single = mine.len() == 1;
    let mut done = Vec::with_capacity(mine.len());
    for o in mine {
        match o {
            MessageOutcome::Ok(e) => done.push(e),
            // a single message refused inserted nothing: the group can commit
            MessageOutcome::Conflict(key) if single => {
                return Verdict::Refused(EnqueueError::KeyConflict { key });
            }
            MessageOutcome::Conflict(_) | MessageOutcome::Vanished => {
                *regroup = true;
                return Verdict::Alone;
            }
        }
    }
    Verdict::Done(done)
}

/// Inserts the messages and their deliveries in one statement and resolves idempotency
/// repeats to the original ids, one verdict per message, in input order.
async fn insert_messages(
    tx: &mut sqlx::PgConnection,
    messages: &[&NewMessage],
) -> Result<
    (
        Vec<NewEvent>,
        Vec<MessageOutcome>,
        Option<db::events::Session>,
    ),
    DbError,
> {
    let rows: Vec<NewEvent> = messages
        .iter()
        .map(|m| NewEvent {
            id: Uuid::now_v7(),
            tenant: m.tenant.clone(),
            event_type: m.event_type.clone(),
            payload: m.payload.clone(),
            idempotency_key: m.idempotency_key.clone(),
            request_hash: request_hash(
                &m.event_type,
                &m.payload,
                m.consumer.as_deref(),
                m.ordering_key.as_deref(),
            ),
            consumer: m.consumer.clone(),
            origin: m.origin.clone(),
            trace: m.trace.clone(),
            ordering_key: m.ordering_key.clone(),
        })
        .collect();
    if rows.is_empty() {
        return Ok((rows, Vec::new(), None));
    }
    let (inserted, session) = db::events::insert_with_fanout(tx, &rows).await?;
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
        db::events::find_by_keys(tx, &repeated)
            .await?
            .into_iter()
            .map(|e| ((e.tenant.clone(), e.idempotency_key.clone()), e))
            .collect::<HashMap<_, _>>()
    };
    let mut out = Vec::with_capacity(rows.len());
    let mut created = Vec::with_capacity(rows.len());
    for r in &rows {
        if let Some(ids) = by_id.remove(&r.id) {
            out.push(MessageOutcome::Ok(Enqueued {
                event_id: r.id,
                delivery_ids: ids,
                created: true,
            }));
            created.push(r.clone());
            continue;
        }
        let key = r.idempotency_key.clone().unwrap_or_default();
        out.push(match existing.get(&(r.tenant.clone(), key.clone())) {
            Some(e) if e.request_hash == r.request_hash => MessageOutcome::Ok(Enqueued {
                event_id: e.event_id,
                delivery_ids: e.delivery_ids.clone(),
                created: false,
            }),
            Some(_) => MessageOutcome::Conflict(key),
            None => MessageOutcome::Vanished,
        });
    }
    Ok((created, out, session))
}

/// COMMIT, and if its answer is lost, find out on a fresh connection whether it took
/// effect: the event ids were minted here, so their presence is the proof.
async fn finish(
    pool: &PgPool,
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    session: Option<db::events::Session>,
    created: &[NewEvent],
) -> Result<(), GroupError> {
    let e = match tx.commit().await {
        Ok(()) => return Ok(()),
        Err(e) => DbError::from(e),
    };
    if !e.is_transport() {
        // the server answered: it refused the commit, nothing was written
        return Err(GroupError::NotWritten(e));
    }
    let ids: Vec<Uuid> = created.iter().map(|r| r.id).collect();
    match db::events::settle_commit(pool, session, &ids, SETTLE_FOR).await {
        Ok(db::events::Settled::Committed) => Ok(()),
        Ok(db::events::Settled::NotCommitted) => Err(GroupError::ProvenUnwritten(e)),
        Err(lookup) => Err(GroupError::Unknown(format!(
            "connection lost at COMMIT ({e}); looking the rows up failed: {lookup}"
        ))),
    }
}

/// How long a lost COMMIT answer is investigated before it is reported as unknown.
const SETTLE_FOR: Duration = Duration::from_secs(5);

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
        let a = request_hash("t", r#"{"a":1}"#, None, None);
        assert_eq!(a, request_hash("t", r#"{"a":1}"#, None, None));
        assert_ne!(a, request_hash("t", r#"{"a": 1}"#, None, None));
        assert_ne!(a, request_hash("u", r#"{"a":1}"#, None, None));
        assert_ne!(a, request_hash("t", r#"{"a":1}"#, Some("c"), None));
        assert_ne!(a, request_hash("t", r#"{"a":1}"#, None, Some("c")));
        assert_ne!(
            request_hash("t", r#"{"a":1}"#, Some("c"), None),
            request_hash("t", r#"{"a":1}"#, None, Some("c"))
        );
    }
}
