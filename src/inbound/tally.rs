//! Requests to each source by outcome (accepted, duplicate, or why one was refused),
//! counted in memory on the request path and added to `hookd.source_requests` every
//! [`FLUSH_EVERY`] in one statement, for the console's source page. Counters only:
//! nothing of a refused request is kept beyond them. A process killed loses at most its
//! last interval's counts; the Prometheus counters (`hookd_inbound_requests_total`) are
//! the per-process record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::db;

/// How often counts are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// How long hourly counts are kept (the page shows the last 24 hours).
pub const KEEP: Duration = Duration::from_secs(48 * 3600);

/// How often old counts are deleted (by each API process; the delete reads one index).
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

type Pending = HashMap<(Uuid, &'static str), (i64, DateTime<Utc>)>;

/// Cheap to clone; one per API process.
#[derive(Clone, Default)]
pub struct RequestTally {
    pending: Arc<Mutex<Pending>>,
}

impl RequestTally {
    /// A tally written to `pool` until `shutdown`, then once more.
    pub fn start(pool: PgPool, shutdown: CancellationToken) -> Self {
        let tally = RequestTally::default();
        let writer = tally.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(FLUSH_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut pruned_at = tokio::time::Instant::now();
            loop {
                let stopping = tokio::select! {
                    _ = tick.tick() => false,
                    _ = shutdown.cancelled() => true,
                };
                writer.flush(&pool).await;
                if pruned_at.elapsed() >= PRUNE_EVERY {
                    pruned_at = tokio::time::Instant::now();
                    if let Err(e) = db::sources::prune_requests(&pool, KEEP).await {
                        tracing::debug!(error = %e, "old source request counts not deleted; next hour");
                    }
                }
                if stopping {
                    return;
                }
            }
        });
        tally
    }

    /// One request to the source `id` ended with `outcome`.
    pub fn count(&self, id: Uuid, outcome: &'static str) {
        let mut pending = self.pending.lock().expect("tally lock");
        let e = pending.entry((id, outcome)).or_insert((0, Utc::now()));
        e.0 += 1;
        e.1 = Utc::now();
    }

    async fn flush(&self, pool: &PgPool) {
        let taken = std::mem::take(&mut *self.pending.lock().expect("tally lock"));
        if taken.is_empty() {
            return;
        }
        let counted: Vec<_> = taken
            .iter()
            .map(|((id, outcome), (n, last))| (*id, *outcome, *n, *last))
            .collect();
        if let Err(e) = db::sources::add_requests(pool, &counted).await {
            // put them back for the next interval: an outage delays counts, a long one
            // bounds them by the sources and outcomes there are
            tracing::debug!(error = %e, "source request counts not written; retried");
            let mut pending = self.pending.lock().expect("tally lock");
            for (k, (n, last)) in taken {
                let e = pending.entry(k).or_insert((0, last));
                e.0 += n;
                e.1 = e.1.max(last);
            }
        }
    }
}
