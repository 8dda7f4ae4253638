//! Retention: terminal deliveries (succeeded, dead, cancelled) with their attempts and
//! dead letters, and then their events, are deleted once older than the retention of
//! their tenant (HOOKD_RETENTION_DAYS, default 30, or a HOOKD_TENANT_RETENTION
//! override). Pending, in-progress and retrying deliveries are never deleted, whatever
//! their age, and neither is an event that still has one.
//!
//! Every dispatcher runs a pass on an interval, under a Postgres advisory lock so only
//! one replica prunes at a time; `hookd prune` runs one pass on demand.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::RetentionSettings;
use crate::db::retention::{self as db, Cutoffs};
use crate::db::{self as dbmod, DbError};
use crate::metrics::{Metrics, PassResult, Table};

/// Longest retention accepted, in days (a century); keeps date arithmetic in range.
const MAX_DAYS: u32 = 36_500;

/// How long past its cutoff a row may wait for its day to be dropped whole (migration
/// 0014) before the row-by-row walk deletes it. A day can be dropped only once all of its
/// rows have expired; rows finish up to a retry schedule after their creation, so a day
/// usually becomes droppable within a day of its first rows expiring. Without the wait,
/// the walk would delete every day row by row just before it could be dropped.
pub const DROP_GRACE: Duration = Duration::from_secs(2 * 24 * 3600);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RetentionConfigError {
    #[error("HOOKD_RETENTION_DAYS: {0} is more than {MAX_DAYS} days")]
    TooLong(u32),
    #[error(
        "HOOKD_TENANT_RETENTION: {0:?} is not `tenant=days` (days: 0 for forever, at most {MAX_DAYS})"
    )]
    Entry(String),
    #[error("HOOKD_TENANT_RETENTION: tenant {0:?} is listed twice")]
    Duplicate(String),
    #[error("HOOKD_PRUNE_BATCH must be at least 1")]
    Batch,
}

/// Validated retention settings. Days of 0 mean "keep forever".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPolicy {
    pub default_days: u32,
    pub tenants: BTreeMap<String, u32>,
    pub batch: i64,
}

impl RetentionPolicy {
    pub fn from_settings(s: &RetentionSettings) -> Result<Self, RetentionConfigError> {
        if s.retention_days > MAX_DAYS {
            return Err(RetentionConfigError::TooLong(s.retention_days));
        }
        if s.prune_batch == 0 {
            return Err(RetentionConfigError::Batch);
        }
        Ok(RetentionPolicy {
            default_days: s.retention_days,
            tenants: parse_tenant_retention(&s.tenant_retention)?,
            batch: i64::from(s.prune_batch),
        })
    }

    /// The cutoffs at `now`: rows last updated before them have expired.
    pub fn cutoffs(&self, now: DateTime<Utc>) -> Cutoffs {
        Cutoffs {
            default: cutoff(self.default_days, now),
            tenants: self.tenants.keys().cloned().collect(),
            tenant_cutoffs: self.tenants.values().map(|d| cutoff(*d, now)).collect(),
            // set by `prune_once` from the days that exist; nil: nothing waits
            drop_below: Uuid::nil(),
            drop_grace: DROP_GRACE,
        }
    }

    /// The cutoff of the longest retention in force: a day whose ids all lie before it
    /// may have expired entirely. The Unix epoch when some tenant keeps forever.
    fn oldest_cutoff(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        self.tenants
            .values()
            .chain([&self.default_days])
            .map(|d| cutoff(*d, now))
            .min()
            .unwrap_or(DateTime::UNIX_EPOCH)
    }

    fn days_for(&self, tenant: &str) -> u32 {
        self.tenants
            .get(tenant)
            .copied()
            .unwrap_or(self.default_days)
    }

    /// One line for logs and `hookd prune`: `30 days; billing=90, scratch=1`.
    pub fn describe(&self) -> String {
        let days = |d: u32| {
            if d == 0 {
                "forever".to_string()
            } else {
                format!("{d} days")
            }
        };
        let mut s = days(self.default_days);
        if !self.tenants.is_empty() {
            let overrides: Vec<String> = self
                .tenants
                .iter()
                .map(|(t, d)| format!("{t}={}", days(*d)))
                .collect();
            s.push_str("; ");
            s.push_str(&overrides.join(", "));
        }
        s
    }
}

/// `tenant=days,tenant=days`; blanks and empty entries are ignored.
pub fn parse_tenant_retention(text: &str) -> Result<BTreeMap<String, u32>, RetentionConfigError> {
    let mut out = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = || RetentionConfigError::Entry(entry.to_string());
        let (tenant, days) = entry.split_once('=').ok_or_else(bad)?;
        let tenant = tenant.trim();
        let days: u32 = days.trim().parse().map_err(|_| bad())?;
        if tenant.is_empty() || days > MAX_DAYS {
            return Err(bad());
        }
        if out.insert(tenant.to_string(), days).is_some() {
            return Err(RetentionConfigError::Duplicate(tenant.to_string()));
        }
    }
    Ok(out)
}

fn cutoff(days: u32, now: DateTime<Utc>) -> DateTime<Utc> {
    if days == 0 {
        return DateTime::UNIX_EPOCH;
    }
    now - TimeDelta::days(i64::from(days))
}

pub use crate::db::retention::uuid_v7_floor;

/// Rows one pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneCounts {
    pub deliveries: i64,
    pub attempts: i64,
    pub dead_letters: i64,
    pub events: i64,
    /// history days dropped whole, with their attempts and dead letters
    pub days_dropped: i64,
    /// deliveries those days held (the planner's estimate)
    pub days_deliveries: i64,
    /// of `events`, those deleted in bulk below the dropped days (no history to probe)
    pub events_with_days: i64,
    /// browser sessions that ended more than a day ago
    pub sessions: i64,
}

impl PruneCounts {
    pub fn total(&self) -> i64 {
        self.deliveries
            + self.attempts
            + self.dead_letters
            + self.events
            + self.days_dropped
            + self.sessions
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneOutcome {
    Done(PruneCounts),
    /// another process holds the pruning lock
    Skipped,
}

/// One pass at `now`, if no other process is pruning: a transaction holds the advisory
/// lock (see [`db::try_lock`]) while the pass runs on another connection.
pub async fn prune_once(
    pool: &PgPool,
    policy: &RetentionPolicy,
    now: DateTime<Utc>,
    metrics: &Metrics,
) -> Result<PruneOutcome, DbError> {
    let mut lock = dbmod::begin(pool).await?;
    if !db::try_lock(&mut lock).await? {
        return Ok(PruneOutcome::Skipped);
    }
    let mut conn = pool.acquire().await?;
    let mut cutoffs = policy.cutoffs(now);
    let mut counts = PruneCounts::default();
    let record = |table: &'static str, n: i64| {
        if n > 0 {
            metrics
                .retention_deleted
                .get_or_create(&Table { table })
                .inc_by(n.unsigned_abs());
        }
    };

    // Tomorrow's partitions, made on every pass as well as by every dispatcher.
    if let Err(e) = db::ensure_history_days(&mut conn, db::HISTORY_DAYS_AHEAD).await {
        tracing::warn!(error = %e, "could not create the coming history days; retrying at the next pass");
    }
    // Whole days first: what they drop, the walk below need not delete row by row.
    let oldest = policy.oldest_cutoff(now);
    if oldest > DateTime::UNIX_EPOCH {
        for day in db::history_days_below(&mut conn, uuid_v7_floor(oldest)).await? {
            match db::drop_history_day(&mut conn, &day, &cutoffs).await? {
                db::DayDrop::Dropped { deliveries } => {
                    tracing::info!(day = %day.suffix, deliveries, "retention dropped a history day whole");
                    counts.days_dropped += 1;
                    counts.days_deliveries += deliveries;
                    metrics.retention_days_dropped.inc();
                }
                db::DayDrop::Kept | db::DayDrop::Busy => {}
            }
        }
        // The days that will be old enough to drop within the grace: their expired rows
        // wait that long for the drop. Days are contiguous id ranges from the lowest id
        // up, so "below the last such day's end" is "in one of them".
        let grace = TimeDelta::from_std(DROP_GRACE).unwrap_or_default();
        let soon = db::history_days_below(&mut conn, uuid_v7_floor(oldest + grace)).await?;
        if let Some(last) = soon.last() {
            cutoffs.drop_below = last.upper;
        }
    }

    // The events of dropped days, in bulk: below the lowest day left, no history row can
    // name them, so each is one probe of the queue and a delete (see
    // `db::dropped_days_end`); the walk below would probe every day for each.
    let lowest = db::history_days_below(&mut conn, Uuid::max()).await?;
    if let Some(end) = lowest.first().and_then(|d| db::dropped_days_end(d.lower)) {
        let n = walk_events(
            &mut conn,
            EventWalk::DroppedDays(end),
            &cutoffs,
            policy.batch,
            &record,
        )
        .await?;
        counts.events += n;
        counts.events_with_days += n;
    }

    for (endpoint_id, tenant) in db::endpoints(&mut conn).await? {
        let days = policy.days_for(&tenant);
        if days == 0 {
            continue; // kept forever
        }
        // Nothing of this endpoint created after its tenant's cutoff can have expired,
        // which bounds the index range scan. Each row is then judged by its own tenant
        // (fixed at fan-out); only after an endpoint moved tenants can the two differ,
        // and then a row is at worst kept longer, never deleted early.
        let scan_before = cutoff(days, now);
        let mut after = Uuid::nil();
        loop {
            let b = db::prune_endpoint_batch(
                &mut conn,
                endpoint_id,
                scan_before,
                after,
                &cutoffs,
                policy.batch,
            )
            .await?;
            counts.deliveries += b.deliveries;
            counts.attempts += b.attempts;
            counts.dead_letters += b.dead_letters;
            counts.events += b.events;
            record("deliveries", b.deliveries);
            record("delivery_attempts", b.attempts);
            record("dead_letters", b.dead_letters);
            record("events", b.events);
            match b.last {
                Some(last) if b.deliveries >= policy.batch => after = last,
                _ => break,
            }
            // let claims and completions interleave between batches
            tokio::task::yield_now().await;
        }
    }

    // Events with no delivery left: none was subscribed, or their last deliveries were
    // deleted by batches that each still saw another one.
    let newest = cutoffs
        .tenant_cutoffs
        .iter()
        .copied()
        .chain([cutoffs.default])
        .max()
        .unwrap_or(cutoffs.default);
    if newest > DateTime::UNIX_EPOCH {
        let before = uuid_v7_floor(newest + TimeDelta::milliseconds(1));
        counts.events += walk_events(
            &mut conn,
            EventWalk::Orphans { before },
            &cutoffs,
            policy.batch,
            &record,
        )
        .await?;
    }
    // Ordering keys held by a dead letter this pass (or an earlier one) deleted: nobody can
    // replay it any more, so its line moves on.
    let released = crate::db::deliveries::release_orphaned_holds(&mut conn).await?;
    if released > 0 {
        tracing::info!(
            released,
            "ordering keys held by a dead letter retention deleted move on"
        );
    }
    // Browser sessions that ended a day ago, and expired sign-in codes: one per sign-in.
    loop {
        let n = crate::db::sign_in::delete_ended_sessions(&mut conn, policy.batch).await?;
        counts.sessions += n as i64;
        record("api_tokens", n as i64);
        if (n as i64) < policy.batch {
            break;
        }
        tokio::task::yield_now().await;
    }
    drop(conn);
    lock.rollback().await?;
    Ok(PruneOutcome::Done(counts))
}

/// The dispatcher's pruner: a pass every `interval` until `shutdown` (a background duty,
/// see [`crate::runtime::Duties`]).
pub async fn run_pruner(
    pool: PgPool,
    policy: RetentionPolicy,
    interval: Duration,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    tracing::info!(retention = %policy.describe(), every = ?interval, "retention pruner started");
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.cancelled() => return,
        }
        let started = std::time::Instant::now();
        let outcome = tokio::select! {
            r = prune_once(&pool, &policy, Utc::now(), &metrics) => r,
            _ = shutdown.cancelled() => return,
        };
        let result = match outcome {
            Ok(PruneOutcome::Done(c)) => {
                if c.total() > 0 {
                    tracing::info!(
                        deliveries = c.deliveries,
                        attempts = c.attempts,
                        dead_letters = c.dead_letters,
                        events = c.events,
                        days_dropped = c.days_dropped,
                        took = ?started.elapsed(),
                        "retention pass deleted expired rows"
                    );
                }
                "done"
            }
            Ok(PruneOutcome::Skipped) => "skipped",
            Err(e) => {
                tracing::warn!(error = %e, "retention pass failed; retrying at the next interval");
                "failed"
            }
        };
        metrics
            .retention_passes
            .get_or_create(&PassResult { result })
            .inc();
    }
}

/// Creates the coming history days (see [`db::HISTORY_DAYS_AHEAD`]) now and then every hour
/// until `shutdown`. Every dispatcher runs it, whether or not it prunes: there is no
/// default partition (migration 0016), so a delivery can become terminal only in a day
/// that exists, and creating one takes no lock that enqueue, claim or outcome writes
/// wait for. A background duty (see [`crate::runtime::Duties`]).
pub async fn run_history_days(pool: PgPool, shutdown: CancellationToken) {
    loop {
        let made = async {
            let mut conn = pool.acquire().await?;
            db::ensure_history_days(&mut conn, db::HISTORY_DAYS_AHEAD).await
        }
        .await;
        if let Err(e) = &made {
            tracing::warn!(error = %e, "could not create the coming history days; retrying in a minute");
        }
        let wait = if made.is_ok() { 3600 } else { 60 };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(wait)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Which old events a walk deletes.
#[derive(Debug, Clone, Copy)]
enum EventWalk {
    /// those of dropped history days, below this end (see `db::dropped_days_end`)
    DroppedDays((Uuid, DateTime<Utc>)),
    /// those with no delivery left anywhere, minted before `before`
    Orphans { before: Uuid },
}

/// Walks the events upwards from the lowest id in batches of `batch`, deleting what `walk`
/// selects and recording each batch as it goes; how many were deleted.
async fn walk_events(
    conn: &mut sqlx::PgConnection,
    walk: EventWalk,
    cutoffs: &Cutoffs,
    batch: i64,
    record: &(dyn Fn(&'static str, i64) + Sync),
) -> Result<i64, DbError> {
    let mut after = Uuid::nil();
    let mut deleted = 0;
    loop {
        let (n, last) = match walk {
            EventWalk::DroppedDays(end) => {
                db::prune_dropped_day_events_batch(conn, after, end, cutoffs, batch).await?
            }
            EventWalk::Orphans { before } => {
                db::prune_orphan_events_batch(conn, after, before, cutoffs, batch).await?
            }
        };
        deleted += n;
        record("events", n);
        match last {
            Some(last) => after = last,
            None => return Ok(deleted),
        }
        // let claims and completions interleave between batches
        tokio::task::yield_now().await;
    }
}

/// `hookd prune`: one pass, reported on stdout.
pub async fn run_once(pool: &PgPool, settings: &RetentionSettings) -> anyhow::Result<()> {
    let policy = RetentionPolicy::from_settings(settings)?;
    dbmod::check_schema(pool).await?;
    match prune_once(pool, &policy, Utc::now(), &Metrics::new()).await? {
        PruneOutcome::Skipped => {
            println!("prune: another process is pruning right now; nothing done");
        }
        PruneOutcome::Done(c) => println!(
            "prune: deleted {} deliveries, {} attempts, {} dead letters, {} events (retention {}){}",
            c.deliveries,
            c.attempts,
            c.dead_letters,
            c.events,
            policy.describe(),
            if c.days_dropped > 0 {
                format!(
                    "; dropped {} history days whole (about {} deliveries)",
                    c.days_dropped, c.days_deliveries
                )
            } else {
                String::new()
            } + &if c.events_with_days > 0 {
                format!(
                    "; {} of the events were those of dropped days, deleted in bulk",
                    c.events_with_days
                )
            } else {
                String::new()
            }
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(days: u32, tenants: &str) -> RetentionSettings {
        RetentionSettings {
            retention_days: days,
            tenant_retention: tenants.into(),
            prune_interval_secs: 600,
            prune_batch: 500,
        }
    }

    #[test]
    fn tenant_overrides_parse_and_bad_ones_are_named() {
        let p = RetentionPolicy::from_settings(&settings(30, " billing=90, scratch=1,,keep=0 "))
            .unwrap();
        assert_eq!(p.days_for("billing"), 90);
        assert_eq!(p.days_for("scratch"), 1);
        assert_eq!(p.days_for("keep"), 0);
        assert_eq!(p.days_for("other"), 30);
        assert_eq!(
            p.describe(),
            "30 days; billing=90 days, keep=forever, scratch=1 days"
        );
        for bad in ["billing", "billing=x", "=3", "a=-1", "a=99999"] {
            assert_eq!(
                RetentionPolicy::from_settings(&settings(30, bad)),
                Err(RetentionConfigError::Entry(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(
            RetentionPolicy::from_settings(&settings(30, "a=1,a=2")),
            Err(RetentionConfigError::Duplicate("a".into()))
        );
        assert!(RetentionPolicy::from_settings(&settings(99_999, "")).is_err());
    }

    #[test]
    fn cutoffs_and_forever() {
        let now = Utc::now();
        let p = RetentionPolicy::from_settings(&settings(0, "short=2")).unwrap();
        let c = p.cutoffs(now);
        assert_eq!(c.default, DateTime::UNIX_EPOCH);
        assert_eq!(c.tenants, vec!["short".to_string()]);
        assert_eq!(c.tenant_cutoffs, vec![now - TimeDelta::days(2)]);
    }

    #[test]
    fn uuid_v7_floor_orders_ids_by_time() {
        let t = Utc::now() - TimeDelta::days(30);
        let floor = uuid_v7_floor(t);
        let ms = u64::try_from(t.timestamp_millis()).unwrap();
        let ts = |ms: u64| {
            uuid::Timestamp::from_unix(uuid::NoContext, ms / 1000, ((ms % 1000) * 1_000_000) as u32)
        };
        let before = Uuid::new_v7(ts(ms - 1));
        let at = Uuid::new_v7(ts(ms));
        let after = Uuid::new_v7(ts(ms + 1));
        assert!(before < floor, "{before} < {floor}");
        assert!(at >= floor && after > floor);
        // past the 48 bits of milliseconds, the bound is the top, not a wrapped-around
        // small id that would select nothing
        let far = DateTime::from_timestamp_millis(1 << 48).unwrap();
        assert_eq!(uuid_v7_floor(far), Uuid::max());
        assert!(uuid_v7_floor(far - TimeDelta::milliseconds(1)) > Uuid::new_v7(ts(ms)));
    }
}
