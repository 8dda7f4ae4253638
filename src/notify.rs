//! Wake-ups between the API and dispatchers: a coalesced NOTIFY sender and a LISTEN
//! waker. Both are optimisations only (invariant 7): a lost notification costs latency,
//! never a delivery, because dispatchers also poll and keep a timer to the next due row.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::db;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub const CHANNEL: &str = "hookd_deliveries";

/// Sends at most one NOTIFY per `window` however many commits asked for one. Callers
/// call `wake()` after their commit; it never blocks and never touches the database on
/// the caller's task, so the response path does not wait for it.
#[derive(Clone)]
pub struct Notifier {
    pending: Option<Arc<Notify>>,
}

impl Notifier {
    /// A notifier that never sends (NOTIFY disabled).
    pub fn disabled() -> Self {
        Notifier { pending: None }
    }

    pub fn spawn(pool: PgPool, window: Duration, shutdown: CancellationToken) -> Self {
        let pending = Arc::new(Notify::new());
        let signal = pending.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = signal.notified() => {}
                    _ = shutdown.cancelled() => break,
                }
                if let Err(e) = crate::db::notify(&pool, CHANNEL).await {
                    tracing::debug!(error = %e, "NOTIFY failed; dispatchers fall back to polling");
                }
                tokio::time::sleep(window).await;
            }
        });
        Notifier {
            pending: Some(pending),
        }
    }

    pub fn wake(&self) {
        if let Some(p) = &self.pending {
            // notify_one stores a single permit when nobody waits: that is the coalescing
            p.notify_one();
        }
    }
}

/// Listens on the channel and pokes `wake` on every notification, and also after a
/// reconnect (notifications sent while disconnected are lost, so assume work arrived).
/// On `direct_url` when given. A LISTEN is session state: through a pooler in
/// transaction mode it would stay on a server session other clients then use (and
/// receive hookd's notifications on) while hookd heard nothing, so there it needs a
/// direct URL or is left out; the poll and the next-due timer find the work without it
/// (invariant 7).
pub fn spawn_listener(
    pool: PgPool,
    direct_url: Option<String>,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let pool = match (direct_url, db::pooler()) {
        (Some(url), _) => match db::connect_lazy(&db::PoolSettings {
            url,
            max_connections: 1,
            acquire_timeout: Duration::from_secs(5),
        }) {
            Ok(direct) => direct,
            Err(e) => {
                tracing::warn!(error = %e, "HOOKD_NOTIFY_DATABASE_URL: no LISTEN; dispatch polls for new deliveries");
                return;
            }
        },
        (None, db::Pooler::Transaction) => {
            tracing::info!(
                "DATABASE_URL goes through a pooler in transaction mode and HOOKD_NOTIFY_DATABASE_URL is not set: no LISTEN; dispatch polls for new deliveries (HOOKD_POLL_MS)"
            );
            return;
        }
        (None, db::Pooler::None) => pool,
    };
    tokio::spawn(async move {
        loop {
            let mut listener = match PgListener::connect_with(&pool).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::debug!(error = %e, "LISTEN connect failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        _ = shutdown.cancelled() => return,
                    }
                }
            };
            if let Err(e) = listener.listen(CHANNEL).await {
                tracing::debug!(error = %e, "LISTEN failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = shutdown.cancelled() => return,
                }
            }
            wake.notify_one();
            loop {
                tokio::select! {
                    msg = listener.try_recv() => match msg {
                        Ok(Some(_)) => wake.notify_one(),
                        // None: the connection dropped; reconnect and assume we missed some
                        Ok(None) => { wake.notify_one(); continue; }
                        Err(e) => {
                            tracing::debug!(error = %e, "LISTEN connection lost");
                            break;
                        }
                    },
                    _ = shutdown.cancelled() => return,
                }
            }
        }
    });
}
