//! The ordering keys' lines (migration 0034), moved on a task of their own: when a keyed
//! delivery ends, the key's next one is let go here, not on the claim's path. Measured
//! inline before every claim, letting lines go took a few milliseconds a claim, and with
//! one dispatcher that time was the claim loop's (`hookd-bench --only ordering`).

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::db;
use crate::notify::Wakeup;

/// Moves the lines whenever `kick` is notified (an outcome batch ended keyed deliveries,
/// or the dispatcher was woken: an enqueue or a replay may have queued behind a line that
/// is free) and at least every `poll`, until `stop`. Each time, it takes the advances in
/// batches until a batch is not full, and asks the claim loop (`wake`) to scan after any
/// batch: what it let go is due now. A failure is logged and tried again at the next kick or
/// poll; the advances stay in their table meanwhile, and nothing else waits for them.
pub(super) fn spawn_line_mover(
    pool: PgPool,
    kick: Arc<Notify>,
    wake: Arc<Wakeup>,
    poll: Duration,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = kick.notified() => {}
                _ = tokio::time::sleep(poll) => {}
                _ = stop.cancelled() => return,
            }
            loop {
                match db::deliveries::advance_lines(&pool).await {
                    Ok(0) => break,
                    Ok(n) => {
                        wake.scan();
                        if n < u64::from(db::deliveries::ADVANCES_PER_CALL) {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "moving the ordering keys' lines failed; trying again shortly");
                        break;
                    }
                }
            }
        }
    })
}
