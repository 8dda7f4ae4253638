//! Wake-ups between the API and dispatchers: a coalesced NOTIFY sender that names the
//! new deliveries, and a LISTEN waker that hands them to the dispatcher. Both are
//! optimisations only (invariant 7): a lost or garbled notification costs latency, never
//! a delivery, because dispatchers also scan, poll and keep a timer to the next due row.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use crate::db;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub const CHANNEL: &str = "hookd_deliveries";

/// The most delivery ids one notification names: 3,300 bytes of payload, well inside
/// Postgres's 8,000. A window with more sends an empty payload, which asks dispatchers
/// to scan: past this many, one scan costs less than naming them.
pub const MAX_HANDED: usize = 100;

/// Sends at most one NOTIFY per `window` however many commits asked for one, naming the
/// deliveries they committed (see [`MAX_HANDED`]). Callers call `hand()` or `wake()`
/// after their commit; neither blocks or touches the database on the caller's task, so
/// the response path does not wait for it.
#[derive(Clone)]
pub struct Notifier {
    pending: Option<Arc<Pending>>,
}

struct Pending {
    signal: Notify,
    handed: Mutex<Handed>,
}

/// What the next notification says.
#[derive(Default)]
struct Handed {
    ids: Vec<Uuid>,
    /// a commit named nothing (`wake`) or there were too many ids: ask for a scan
    scan: bool,
}

impl Notifier {
    /// A notifier that never sends (NOTIFY disabled).
    pub fn disabled() -> Self {
        Notifier { pending: None }
    }

    pub fn spawn(pool: PgPool, window: Duration, shutdown: CancellationToken) -> Self {
        let pending = Arc::new(Pending {
            signal: Notify::new(),
            handed: Mutex::new(Handed::default()),
        });
        let sender = pending.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = sender.signal.notified() => {}
                    _ = shutdown.cancelled() => break,
                }
                let payload = {
                    let mut h = sender.handed.lock().expect("notifier lock");
                    let h = std::mem::take(&mut *h);
                    if h.scan {
                        String::new()
                    } else {
                        encode_handed(&h.ids)
                    }
                };
                if let Err(e) = crate::db::notify(&pool, CHANNEL, &payload).await {
                    tracing::debug!(error = %e, "NOTIFY failed; dispatchers fall back to polling");
                }
                tokio::time::sleep(window).await;
            }
        });
        Notifier {
            pending: Some(pending),
        }
    }

    /// Something may have become due that has no new delivery to name (a replay, an
    /// endpoint resumed): dispatchers scan.
    pub fn wake(&self) {
        if let Some(p) = &self.pending {
            p.handed.lock().expect("notifier lock").scan = true;
            // notify_one stores a single permit when nobody waits: that is the coalescing
            p.signal.notify_one();
        }
    }

    /// New deliveries committed: a waiting dispatcher leases exactly these. Nothing is
    /// sent for none (a message no endpoint subscribes to).
    pub fn hand(&self, ids: impl IntoIterator<Item = Uuid>) {
        let Some(p) = &self.pending else { return };
        let mut h = p.handed.lock().expect("notifier lock");
        let before = h.ids.len();
        h.ids.extend(ids);
        if h.ids.len() == before {
            return;
        }
        if h.ids.len() > MAX_HANDED {
            h.ids = Vec::new();
            h.scan = true;
        }
        drop(h);
        p.signal.notify_one();
    }
}

/// The payload naming `ids`: simple hex, comma-separated.
fn encode_handed(ids: &[Uuid]) -> String {
    let mut out = String::with_capacity(ids.len() * 33);
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(id.simple().encode_lower(&mut Uuid::encode_buffer()));
    }
    out
}

/// The delivery ids a payload names, at most [`MAX_HANDED`]; anything that is not an id
/// is skipped (anyone who can NOTIFY on the channel writes here). Empty asks for a scan.
fn decode_handed(payload: &str) -> Vec<Uuid> {
    payload
        .split(',')
        .filter_map(|s| Uuid::try_parse(s.trim()).ok())
        .take(MAX_HANDED)
        .collect()
}

/// The most handed ids a dispatcher keeps between two turns of its loop; past them it
/// scans instead (a dispatcher that fell behind its notifications).
const MAX_HELD: usize = 1000;

/// What woke a dispatcher: new deliveries it was handed, or a request to scan for due
/// work (a notification without ids, a reconnected listener, lines moved, retries
/// written). The loop takes both at once with [`Wakeup::take`].
#[derive(Debug, Default)]
pub struct Wakeup {
    signal: Notify,
    state: Mutex<Woken>,
}

#[derive(Debug, Default)]
struct Woken {
    handed: Vec<Uuid>,
    scan: bool,
}

impl Wakeup {
    /// Something may be due that no handed id names.
    pub fn scan(&self) {
        self.state.lock().expect("wakeup lock").scan = true;
        self.signal.notify_one();
    }

    /// New deliveries to lease; none means scan.
    pub fn hand(&self, ids: Vec<Uuid>) {
        let mut w = self.state.lock().expect("wakeup lock");
        if ids.is_empty() || w.handed.len() + ids.len() > MAX_HELD {
            w.handed = Vec::new();
            w.scan = true;
        } else {
            w.handed.extend(ids);
        }
        drop(w);
        self.signal.notify_one();
    }

    /// Resolves once `scan` or `hand` was called since the last time it resolved.
    pub async fn notified(&self) {
        self.signal.notified().await
    }

    /// The ids handed since the last take (sorted, without repeats) and whether a scan
    /// was asked for.
    pub fn take(&self) -> (Vec<Uuid>, bool) {
        let w = std::mem::take(&mut *self.state.lock().expect("wakeup lock"));
        let mut ids = w.handed;
        ids.sort_unstable();
        ids.dedup();
        (ids, w.scan)
    }
}

/// What a listener heard on its channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard<'a> {
    /// LISTEN took effect (first, or after a reconnect): notifications from now on arrive;
    /// any sent before, while nobody listened, are lost
    Listening,
    /// a notification, with its payload
    Notified(&'a str),
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
    mut on: impl FnMut(Heard<'_>) + Send + 'static,
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
                        Ok(Some(n)) => on(Heard::Notified(n.payload())),
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

/// Hands `wakeup` the deliveries each notification names (a scan when it names none),
/// and asks for a scan after a reconnect (notifications sent while disconnected are
/// lost, so assume work arrived).
pub fn spawn_listener(
    pool: PgPool,
    direct_url: Option<String>,
    wakeup: Arc<Wakeup>,
    shutdown: CancellationToken,
) {
    listen(
        pool,
        direct_url,
        CHANNEL,
        "dispatch polls for new deliveries (HOOKD_POLL_MS)",
        move |heard| match heard {
            Heard::Notified(payload) => wakeup.hand(decode_handed(payload)),
            Heard::Listening => wakeup.scan(),
            Heard::Lost => {}
        },
        shutdown,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_names_the_ids_it_was_given() {
        let ids: Vec<Uuid> = (0..MAX_HANDED).map(|_| Uuid::now_v7()).collect();
        let payload = encode_handed(&ids);
        assert!(
            payload.len() < 8000,
            "NOTIFY refuses payloads of 8,000 bytes"
        );
        assert_eq!(decode_handed(&payload), ids);
        assert!(decode_handed("").is_empty());
    }

    #[test]
    fn a_hostile_payload_names_at_most_its_share_of_ids() {
        let id = Uuid::now_v7();
        let payload = format!("x,{},,'; DROP TABLE x,{}", id.simple(), "z".repeat(7000));
        assert_eq!(decode_handed(&payload), vec![id]);
        let many = vec![id.simple().to_string(); 5 * MAX_HANDED].join(",");
        assert_eq!(decode_handed(&many).len(), MAX_HANDED);
    }

    #[test]
    fn a_wakeup_gives_its_ids_once_and_falls_back_to_a_scan() {
        let w = Wakeup::default();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        w.hand(vec![a, b]);
        w.hand(vec![a]);
        let (mut ids, scan) = w.take();
        let mut want = vec![a, b];
        want.sort();
        ids.sort();
        assert_eq!((ids, scan), (want, false));
        assert_eq!(w.take(), (vec![], false));
        w.hand(vec![]);
        assert_eq!(w.take(), (vec![], true));
        w.hand((0..MAX_HELD + 1).map(|_| Uuid::now_v7()).collect());
        assert_eq!(w.take(), (vec![], true), "more than it keeps: a scan");
    }
}
