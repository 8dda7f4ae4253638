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

/// What a listener heard on its channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// LISTEN took effect (first, or after a reconnect): notifications from now on arrive;
    /// any sent before, while nobody listened, are lost
    Listening,
    /// a notification
    Notified,
    /// the connection dropped: nothing is heard until the next `Listening`
    Lost,
}

/// Listens on `channel` and tells `on` what it hears, reconnecting after a lost
/// connection. On `direct_url` when given. A LISTEN is session state: through a pooler in
/// transaction mode it would stay on a server session other clients then use (and
/// receive hookd's notifications on) while hookd heard nothing, so there it needs a
/// direct URL or is left out: then nothing is spawned, `without` is logged, and `false`
/// is returned.
pub fn listen(
    pool: PgPool,
    direct_url: Option<String>,
    channel: &'static str,
    without: &'static str,
    mut on: impl FnMut(Heard) + Send + 'static,
    shutdown: CancellationToken,
) -> bool {
    // a direct URL must name the database DATABASE_URL does: a LISTEN on another one
    // succeeds and hears nothing, which a cache would take for "nothing changed"
    let main = direct_url.is_some().then(|| pool.clone());
    let pool = match (direct_url, db::pooler()) {
        (Some(url), _) => match db::connect_lazy(&db::PoolSettings {
            url,
            max_connections: 1,
            acquire_timeout: Duration::from_secs(5),
        }) {
            Ok(direct) => direct,
            Err(e) => {
                tracing::warn!(error = %e, "HOOKD_NOTIFY_DATABASE_URL: no LISTEN; {without}");
                return false;
            }
        },
        (None, db::Pooler::Transaction) => {
            tracing::info!(
                "DATABASE_URL goes through a pooler in transaction mode and HOOKD_NOTIFY_DATABASE_URL is not set: no LISTEN; {without}"
            );
            return false;
        }
        (None, db::Pooler::None) => pool,
    };
    tokio::spawn(async move {
        let retry = Duration::from_secs(1);
        loop {
            let listener = match PgListener::connect_with(&pool).await {
                Ok(mut l) => match l.listen(channel).await {
                    Ok(()) if same_database(main.as_ref(), &mut l).await => Some(l),
                    Ok(()) => {
                        tracing::error!(
                            channel,
                            "HOOKD_NOTIFY_DATABASE_URL names another database than DATABASE_URL: not listening there (it would hear nothing); retrying in 10 s"
                        );
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(10)) => continue,
                            _ = shutdown.cancelled() => return,
                        }
                    }
                    Err(e) => {
                        tracing::debug!(channel, error = %e, "LISTEN failed; retrying");
                        None
                    }
                },
                Err(e) => {
                    tracing::debug!(channel, error = %e, "LISTEN connect failed; retrying");
                    None
                }
            };
            let Some(mut listener) = listener else {
                tokio::select! {
                    _ = tokio::time::sleep(retry) => continue,
                    _ = shutdown.cancelled() => return,
                }
            };
            on(Heard::Listening);
            loop {
                tokio::select! {
                    // Ok(None) is a dropped connection that sqlx would quietly re-establish
                    // on the next call: reconnect here instead, so `Listening` is told
                    msg = listener.try_recv() => match msg {
                        Ok(Some(_)) => on(Heard::Notified),
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(channel, error = %e, "LISTEN connection lost");
                            break;
                        }
                    },
                    _ = shutdown.cancelled() => return,
                }
            }
            on(Heard::Lost);
        }
    });
    true
}

/// Whether `listener` is connected to the database `main` is (true without `main`: the
/// listener is one of its own connections). Unknown (a query failed) counts as the same:
/// the next reconnect asks again.
async fn same_database(main: Option<&PgPool>, listener: &mut PgListener) -> bool {
    let Some(main) = main else { return true };
    let ours = db::current_database(db::on(main)).await;
    let theirs = db::current_database(&mut *listener).await;
    match (ours, theirs) {
        (Ok(a), Ok(b)) => a == b,
        _ => true,
    }
}

/// Pokes `wake` on every notification of new deliveries, and also after a reconnect
/// (notifications sent while disconnected are lost, so assume work arrived).
pub fn spawn_listener(
    pool: PgPool,
    direct_url: Option<String>,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    listen(
        pool,
        direct_url,
        CHANNEL,
        "dispatch polls for new deliveries (HOOKD_POLL_MS)",
        move |heard| {
            if heard != Heard::Lost {
                wake.notify_one();
            }
        },
        shutdown,
    );
}
