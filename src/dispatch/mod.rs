//! `hookd dispatch`: claims due deliveries with leases and sends them.
//!
//! One claimer loop leases as many rows as there are free slots (a global semaphore)
//! and spawns a task per delivery, so a slow endpoint only ever occupies its own slots
//! (bounded per endpoint by the claim's quota) and never delays another endpoint's
//! deliveries. Outcomes go to the batch completer.
//!
//! New deliveries are handed over: the API's NOTIFY names them, and the loop leases
//! exactly those by primary key ([`db::deliveries::claim_handed`]). Everything else is
//! found by a scan of the queue ([`db::deliveries::claim_shared`]), run only when
//! something may be due that no handed id names: a notification without ids, a handed
//! delivery not leased, lines moved, retries written, a slot freed by an endpoint,
//! consumer or tenant at its cap (also one freed while a claim filled it:
//! [`InFlight::claimed`]), a full batch, the timer to the next due row, or the poll.

mod classify;
mod completer;
mod config;
mod deliver;
mod duties;
mod in_flight;
mod lines;
pub mod policy;
mod process;
pub mod secrets;

pub use config::{ConfigError, DispatchConfig, MIN_LEASE_SECS, Stage, StageHook};
pub use in_flight::share_cap;
use in_flight::{HeldLease, InFlight, spawn_lease_renewer};
pub use process::{run, run_on};

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use rand::SeedableRng;
use sqlx::PgPool;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::crypto::Keyring;
use crate::db::{
    self,
    deliveries::{ClaimRequest, ClaimedDelivery, Release},
};
use crate::metrics::{Metrics, Outcome};
use crate::notify::Wakeup;
use crate::outbound::{self, ClientOptions};
use completer::Finished;

/// The most rows one claim asks for, however many slots are free.
const MAX_CLAIM_BATCH: usize = 1000;

/// How long a dispatcher whose slots were all taken waits for more to free up before it
/// claims (see [`Dispatcher::gather_free_slots`]): short beside a delivery's own time,
/// and only ever paid when every slot is busy.
const CLAIM_GATHER: Duration = Duration::from_millis(2);

/// How long a [`Dispatcher::next_due`] answer is reused.
const NEXT_DUE_EVERY: Duration = Duration::from_millis(50);

/// The dispatcher loop, until `shutdown`; then drains in-flight deliveries within the
/// grace period, hands back the leases of any it had to abandon, and flushes outcomes.
pub async fn run_dispatcher(
    pool: PgPool,
    cfg: DispatchConfig,
    keyring: Arc<Keyring>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let mut d = Dispatcher::start(pool, cfg, keyring, metrics, &shutdown);
    while !shutdown.is_cancelled() {
        // reap finished tasks so the JoinSet does not grow
        while d.tasks.try_join_next().is_some() {}
        if d.slots.available_permits() == 0 {
            tokio::select! {
                _ = d.slot_freed.notified() => {}
                _ = shutdown.cancelled() => {}
            }
            // Every slot was taken: let a few more free up before claiming, so a busy
            // dispatcher claims in batches instead of once per freed slot (each claim
            // has a fixed cost of two statements, and at thousands of deliveries a
            // second that cost, not the receivers, bounded the drain). What waited
            // behind the full slots is found by a scan.
            d.gather_free_slots(&shutdown).await;
            d.scan_needed = true;
            continue;
        }
        if d.freed_at_cap() {
            // a slot freed while the loop was not waiting for one (its permit taken
            // by the gathering above, say)
            d.scan_needed = true;
        }
        let (handed, asked) = d.wakeup.take();
        let mut kick_lines = asked;
        if asked {
            // whatever asked may have moved the next turn too
            d.next_due_read = None;
            d.scan_needed = true;
        }
        if !handed.is_empty() && !d.claim_handed(&handed).await {
            // Not all leased: an endpoint at its cap, a share used up, a circuit, or a
            // key's line (an enqueue may have queued behind a line that is free by
            // now: the line mover looks). The scan finds the rest.
            d.scan_needed = true;
            kick_lines = true;
        }
        if kick_lines {
            d.lines.notify_one();
        }
        let free = d.slots.available_permits();
        if d.scan_needed && free > 0 {
            d.scan_needed = false;
            let limit = free.min(MAX_CLAIM_BATCH);
            let Some(leased) = d.claim(limit, &shutdown).await else {
                d.scan_needed = true;
                continue;
            };
            let got = leased.rows.len();
            d.backlogged = got == limit;
            d.spawn_all(leased);
            if d.backlogged {
                d.scan_needed = true;
                continue; // a full batch: more is probably due right now
            }
        }
        d.sleep_until_due(&shutdown).await;
    }
    d.drain_and_release().await;
}

/// Rows one claim leased, and when it was sent.
struct Leased {
    rows: Vec<ClaimedDelivery>,
    at: Instant,
}

/// The claimer loop's state, shared with the delivery tasks it spawns; one method per
/// step of the loop.
struct Dispatcher {
    pool: PgPool,
    cfg: Arc<DispatchConfig>,
    client: Arc<reqwest::Client>,
    metrics: Metrics,
    /// one permit per delivery in flight, up to `concurrency`
    slots: Arc<Semaphore>,
    in_flight: Arc<Mutex<InFlight>>,
    /// what woke the loop: deliveries handed over (NOTIFY), or a scan asked for
    wakeup: Arc<Wakeup>,
    /// the next turn scans the queue (see the module's documentation)
    scan_needed: bool,
    /// the last scan filled its batch: new deliveries queue behind that backlog, so
    /// handed ones are left to the scan, which serves tenants by their turns
    backlogged: bool,
    /// The last [`MAX_CLAIM_BATCH`] to twice as many deliveries this loop leased. A claim
    /// leases new deliveries whose NOTIFY has not come yet (a scan, or a handed claim
    /// taking its endpoint's other due rows), and when their ids do come, that is no
    /// reason to scan: each such scan leased the next ones, and at 200 events/s the
    /// chain made most leases scans (78 of 600 handed).
    leased_lately: [HashSet<Uuid>; 2],
    slot_freed: Arc<Notify>,
    secret_cache: secrets::SecretCache,
    done_tx: mpsc::Sender<Finished>,
    completer: JoinHandle<()>,
    renewer_stop: CancellationToken,
    renewer: JoinHandle<()>,
    /// kicks the task that moves the ordering keys' lines ([`lines`])
    lines: Arc<Notify>,
    line_mover: JoinHandle<()>,
    tasks: JoinSet<()>,
    error_backoff: Duration,
    /// the last [`Dispatcher::next_due`] answer and when it was read
    next_due_read: Option<(Instant, Option<chrono::DateTime<Utc>>)>,
    /// When the last scan started: the poll counts from it, not from the last wake-up
    last_scan: Instant,
}

impl Dispatcher {
    /// Builds the HTTP client and starts the tasks that serve the loop: the NOTIFY
    /// listener, the completer and the lease renewer. (The process's maintenance duties
    /// are started beside it by [`run_on`].)
    fn start(
        pool: PgPool,
        cfg: DispatchConfig,
        keyring: Arc<Keyring>,
        metrics: Metrics,
        shutdown: &CancellationToken,
    ) -> Dispatcher {
        let cfg = Arc::new(cfg);
        let secret_cache = secrets::SecretCache::new(keyring, metrics.clone());
        let client = Arc::new(outbound::build_client(ClientOptions {
            allow: cfg.allow.clone(),
            resolver: cfg.resolver.clone(),
            connect_timeout: Duration::from_secs(5).min(cfg.request_timeout),
            user_agent: format!("hookd/{}", env!("CARGO_PKG_VERSION")),
            // Idle connections are kept per host, not per endpoint: several endpoints on one
            // receiver host share them. Capping them at one endpoint's in-flight limit made
            // every delivery beyond it open a fresh connection (measured by `hookd-bench`:
            // 8 endpoints on one host, connect + close per request).
            pool_max_idle_per_host: cfg.concurrency,
        }));
        let slots = Arc::new(Semaphore::new(cfg.concurrency));
        let in_flight = Arc::new(Mutex::new(InFlight::default()));
        let wakeup = Arc::new(Wakeup::default());
        let slot_freed = Arc::new(Notify::new());
        let lines = Arc::new(Notify::new());
        let line_mover = lines::spawn_line_mover(
            pool.clone(),
            lines.clone(),
            wakeup.clone(),
            cfg.poll_interval,
            shutdown.clone(),
        );
        if cfg.notify {
            crate::notify::spawn_listener(
                pool.clone(),
                cfg.notify_url.clone(),
                wakeup.clone(),
                shutdown.clone(),
            );
        }
        let (done_tx, completer) = completer::spawn(
            pool.clone(),
            completer::CompleterConfig {
                max_batch: 512,
                queue: cfg.concurrency.max(512) * 2,
                circuit_threshold: i32::try_from(cfg.circuit_threshold).unwrap_or(i32::MAX),
                circuit_cooldown: cfg.circuit_cooldown,
                shutdown_grace: cfg.shutdown_grace,
                line_moved: lines.clone(),
                rescan: wakeup.clone(),
            },
            metrics.clone(),
            shutdown.clone(),
        );
        // Renewal keeps running through the shutdown drain, until every send has ended.
        let renewer_stop = CancellationToken::new();
        let renewer = spawn_lease_renewer(
            pool.clone(),
            cfg.lease,
            in_flight.clone(),
            renewer_stop.clone(),
        );
        Dispatcher {
            pool,
            cfg,
            client,
            metrics,
            slots,
            in_flight,
            wakeup,
            scan_needed: true,
            backlogged: false,
            leased_lately: Default::default(),
            slot_freed,
            secret_cache,
            done_tx,
            completer,
            renewer_stop,
            renewer,
            lines,
            line_mover,
            tasks: JoinSet::new(),
            error_backoff: Duration::from_millis(100),
            next_due_read: None,
            last_scan: Instant::now(),
        }
    }

    /// Leases up to `limit` deliveries within every tenant's and consumer's share: those
    /// `handed` names, or (without) what a scan finds due. One statement; also when, by
    /// this host's clock, it was sent (what leases are counted from).
    async fn lease(&self, limit: usize, handed: Option<&[Uuid]>) -> Result<Leased, db::DbError> {
        let (busy, shares) = {
            let mut f = self.in_flight.lock().expect("in-flight lock");
            f.claiming(handed.is_none());
            (
                f.per_endpoint.iter().map(|(k, v)| (*k, *v)).collect(),
                f.shares(self.cfg.concurrency),
            )
        };
        let cfg = &self.cfg;
        let started = Instant::now();
        let span = crate::telemetry::enabled().then(|| {
            tracing::info_span!(
                target: crate::telemetry::TARGET,
                "hookd.claim",
                hookd.limit = limit,
                hookd.handed = handed.map_or(0, <[_]>::len),
                hookd.rows = tracing::field::Empty,
            )
        });
        let req = ClaimRequest {
            worker_id: cfg.worker_id,
            limit: limit as i64,
            lease_secs: cfg.lease.as_secs_f64(),
            per_endpoint_cap: i32::try_from(cfg.endpoint_concurrency).unwrap_or(i32::MAX),
            busy,
            now: None,
            default_max_attempts: i32::try_from(cfg.retry.max_attempts).unwrap_or(i32::MAX),
        };
        let claimed = match handed {
            Some(ids) => db::deliveries::claim_handed(&self.pool, &req, &shares, ids).await,
            None => db::deliveries::claim_shared(&self.pool, &req, &shares).await,
        };
        self.metrics
            .claim_seconds
            .observe(started.elapsed().as_secs_f64());
        if let (Some(span), Ok(rows)) = (&span, &claimed) {
            span.record("hookd.rows", rows.len());
        }
        let rows = match claimed {
            Ok(rows) => rows,
            Err(e) => {
                self.claimed(&[]);
                return Err(e);
            }
        };
        self.metrics.claimed.inc_by(rows.len() as u64);
        Ok(Leased { rows, at: started })
    }

    /// Scans for up to `limit` due deliveries ([`Dispatcher::lease`]). `None` when the
    /// claim failed; it returns after the error backoff, or at shutdown.
    async fn claim(&mut self, limit: usize, shutdown: &CancellationToken) -> Option<Leased> {
        self.last_scan = Instant::now();
        match self.lease(limit, None).await {
            Ok(leased) => {
                self.error_backoff = Duration::from_millis(100);
                Some(leased)
            }
            Err(e) => {
                tracing::warn!(error = %e, "claim failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(self.error_backoff) => {}
                    _ = shutdown.cancelled() => return None,
                }
                self.error_backoff = (self.error_backoff * 2).min(Duration::from_secs(5));
                None
            }
        }
    }

    /// Leases the handed deliveries (and their endpoints' older due rows) and starts
    /// sending them. Whether every handed one was leased: false sends the loop to scan,
    /// as does a backlog (new deliveries wait their tenant's turn behind it) and an error
    /// (the scan's own error handling takes over).
    async fn claim_handed(&mut self, handed: &[Uuid]) -> bool {
        let free = self.slots.available_permits();
        if self.backlogged || free == 0 {
            return false;
        }
        match self.lease(free.min(MAX_CLAIM_BATCH), Some(handed)).await {
            Ok(leased) => {
                self.metrics.claimed_handed.inc_by(leased.rows.len() as u64);
                self.spawn_all(leased);
                let [last, before] = &self.leased_lately;
                handed
                    .iter()
                    .all(|id| last.contains(id) || before.contains(id))
            }
            Err(e) => {
                tracing::debug!(error = %e, "leasing handed deliveries failed; scanning instead");
                false
            }
        }
    }

    /// Starts sending every row of a lease, and remembers them (see
    /// [`Dispatcher::leased_lately`]).
    fn spawn_all(&mut self, leased: Leased) {
        if self.leased_lately[0].len() + leased.rows.len() > MAX_CLAIM_BATCH {
            self.leased_lately.swap(0, 1);
            self.leased_lately[0].clear();
        }
        self.leased_lately[0].extend(leased.rows.iter().map(|r| r.id));
        self.claimed(&leased.rows);
        for row in leased.rows {
            self.spawn(row, leased.at);
        }
    }

    /// Counts a claim's rows in flight, and ends the claim ([`InFlight::claimed`]; no rows
    /// when it failed).
    fn claimed(&self, rows: &[ClaimedDelivery]) {
        let mut f = self.in_flight.lock().expect("in-flight lock");
        for row in rows {
            f.take(row);
        }
        f.claimed(
            rows,
            i32::try_from(self.cfg.endpoint_concurrency).unwrap_or(i32::MAX),
            self.cfg.concurrency,
        );
    }

    /// Whether a slot given back since the last scan may let a claim take what it held
    /// back ([`InFlight::freed_at_cap`]).
    fn freed_at_cap(&self) -> bool {
        self.in_flight.lock().expect("in-flight lock").freed_at_cap
    }

    /// Takes a slot and the lease of one claimed row (counted in flight by
    /// [`Dispatcher::spawn_all`]), and spawns the task that sends it.
    fn spawn(&mut self, row: ClaimedDelivery, claimed_at: Instant) {
        let signing = self.secret_cache.open(&row);
        let permit = self
            .slots
            .clone()
            .try_acquire_owned()
            .expect("claimed no more rows than free slots");
        let stop = CancellationToken::new();
        {
            let mut f = self.in_flight.lock().expect("in-flight lock");
            f.leases.insert(
                row.id,
                HeldLease {
                    claim_token: row.claim_token,
                    started: false,
                    until: claimed_at + self.cfg.lease,
                    stop: stop.clone(),
                },
            );
        }
        self.metrics.deliveries_in_flight.inc();
        let task = DeliveryTask {
            cfg: self.cfg.clone(),
            client: self.client.clone(),
            done_tx: self.done_tx.clone(),
            in_flight: self.in_flight.clone(),
            slot_freed: self.slot_freed.clone(),
            metrics: self.metrics.clone(),
            permit,
            stop,
        };
        self.tasks.spawn(task.run(row, signing));
    }

    /// Waits until at least [`Dispatcher::min_claim`] slots are free, or
    /// [`CLAIM_GATHER`] has passed, or shutdown.
    async fn gather_free_slots(&self, shutdown: &CancellationToken) {
        let want = self.min_claim();
        let deadline = tokio::time::Instant::now() + CLAIM_GATHER;
        while self.slots.available_permits() < want {
            tokio::select! {
                _ = self.slot_freed.notified() => {}
                _ = tokio::time::sleep_until(deadline) => return,
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// The free slots worth a claim when every slot was taken: an eighth of them, at most
    /// 64 (1 when there are fewer than 16).
    fn min_claim(&self) -> usize {
        (self.cfg.concurrency / 8).clamp(1, 64)
    }

    /// Nothing more is claimable now: sleeps until something may be (the next due row,
    /// a NOTIFY, a freed slot, the poll interval) or shutdown.
    async fn sleep_until_due(&mut self, shutdown: &CancellationToken) {
        let next_due = self.next_due().await;
        // The poll is the backstop for whatever no wake-up names, so it is counted from
        // the last scan: counted from each wake-up, handed deliveries coming more often
        // than the poll interval kept it from ever running out, and a row due with no
        // wake-up of its own waited for them to stop.
        let mut sleep_for = self
            .cfg
            .poll_interval
            .saturating_sub(self.last_scan.elapsed());
        if let Some(at) = next_due
            && let Ok(d) = (at - Utc::now()).to_std()
        {
            sleep_for = sleep_for.min(d + Duration::from_millis(1));
        }
        tokio::select! {
            // the loop takes what woke it
            _ = self.wakeup.notified() => {}
            _ = tokio::time::sleep(sleep_for) => self.scan_needed = true,
            // A freed slot may unblock an endpoint (or a tenant, or a consumer) that was
            // at its cap ([`InFlight::freed_at_cap`]); a short pause lets several
            // completions accumulate into one claim. Judged by the slots given back
            // since the last scan read what was in flight, not by what is in flight
            // now: sends that ended during a scan had emptied it, and a loop that
            // looked after the scan slept through their slots with a tenant's backlog
            // due (225 deliveries a second in `hookd-bench`'s crowd row, 60,000 in 15 s
            // before). A stale permit costs one claim.
            _ = self.slot_freed.notified() => {
                if self.backlogged || self.freed_at_cap() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    self.scan_needed = true;
                }
            }
            _ = shutdown.cancelled() => {}
        }
    }

    /// When the next endpoint's turn comes, read at most every [`NEXT_DUE_EVERY`]: a busy
    /// dispatcher sleeps between claims hundreds of times a second, and a timer a few
    /// milliseconds late costs nothing (what becomes due meanwhile through new work
    /// wakes the dispatcher by NOTIFY anyway).
    async fn next_due(&mut self) -> Option<chrono::DateTime<Utc>> {
        if let Some((read_at, at)) = self.next_due_read
            && read_at.elapsed() < NEXT_DUE_EVERY
            // a turn that has come since is read again: it may have been claimed
            && at.is_none_or(|at| at > Utc::now())
        {
            return at;
        }
        let at = db::deliveries::next_due(&self.pool).await.ok().flatten();
        self.next_due_read = Some((Instant::now(), at));
        at
    }

    /// Shutdown: no more claims. Lets in-flight deliveries finish within the grace
    /// period, hands back the leases of those it had to abandon, then flushes outcomes.
    async fn drain_and_release(mut self) {
        let pending = self.tasks.len();
        if pending > 0 {
            tracing::info!(in_flight = pending, grace = ?self.cfg.shutdown_grace, "draining in-flight deliveries");
        }
        let drained = tokio::time::timeout(self.cfg.shutdown_grace, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
            let leases: Vec<Release> = {
                let f = self.in_flight.lock().expect("in-flight lock");
                f.leases
                    .iter()
                    .map(|(id, l)| Release {
                        delivery_id: *id,
                        claim_token: l.claim_token,
                        started: l.started,
                    })
                    .collect()
            };
            match db::deliveries::release(&self.pool, &leases).await {
                Ok(n) => tracing::warn!(
                    released = n,
                    "grace period over; handed back leases of unfinished deliveries"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "could not hand back leases; they lapse by themselves")
                }
            }
        }
        self.renewer_stop.cancel();
        let _ = self.renewer.await;
        // stopped by the same shutdown; what it had not taken stays for other dispatchers
        let _ = self.line_mover.await;
        // the last sender: the completer writes what is queued and exits
        drop(self.done_tx);
        let _ = self.completer.await;
        tracing::info!("dispatcher stopped");
    }
}

/// One delivery's task: its handles on the loop's shared state, its slot, and the token
/// that stops its send when its lease is lost.
struct DeliveryTask {
    cfg: Arc<DispatchConfig>,
    client: Arc<reqwest::Client>,
    done_tx: mpsc::Sender<Finished>,
    in_flight: Arc<Mutex<InFlight>>,
    slot_freed: Arc<Notify>,
    metrics: Metrics,
    permit: OwnedSemaphorePermit,
    stop: CancellationToken,
}

impl DeliveryTask {
    /// Sends the delivery, reports the outcome to the completer, and gives back its slot.
    async fn run(
        self,
        row: ClaimedDelivery,
        signing: Result<Vec<crate::signing::SigningSecret>, secrets::SecretUnreadable>,
    ) {
        let DeliveryTask {
            cfg,
            client,
            done_tx,
            in_flight,
            slot_freed,
            metrics,
            permit,
            stop,
        } = self;
        let endpoint_id = row.endpoint_id;
        let delivery_id = row.id;
        let owner = (row.tenant.clone(), row.consumer.clone());
        let endpoint_cap = in_flight::endpoint_cap(
            &row,
            i32::try_from(cfg.endpoint_concurrency).unwrap_or(i32::MAX),
        );
        if let Some(l) = in_flight
            .lock()
            .expect("in-flight lock")
            .leases
            .get_mut(&delivery_id)
        {
            l.started = true;
        }
        let attempt = async {
            if let Some(hook) = &cfg.stage_hook {
                hook(Stage::Claimed, delivery_id).await;
            }
            let finished = deliver_one(&cfg, &client, &metrics, row, signing).await;
            if let Some(hook) = &cfg.stage_hook {
                hook(Stage::Sent, delivery_id).await;
            }
            finished
        };
        let finished = tokio::select! {
            f = attempt => Some(f),
            _ = stop.cancelled() => None,
        };
        match finished {
            // Waits while the completer's queue is full: this slot stays taken, so
            // the claimer slows down rather than outcomes piling up in memory.
            Some(finished) => {
                let _ = done_tx.send(finished).await;
            }
            None => {
                metrics.leases_lost.inc();
                tracing::warn!(delivery = %delivery_id, "lease lost or not renewed in time; send abandoned (the delivery is sent again by whoever holds it next)");
            }
        }
        {
            let mut f = in_flight.lock().expect("in-flight lock");
            f.give_back(endpoint_id, owner, endpoint_cap, cfg.concurrency);
            f.leases.remove(&delivery_id);
        }
        metrics.deliveries_in_flight.dec();
        drop(permit);
        slot_freed.notify_one();
    }
}

/// One attempt: preflight and request ([`deliver`]), then classification ([`classify`]).
async fn deliver_one(
    cfg: &DispatchConfig,
    client: &reqwest::Client,
    metrics: &Metrics,
    row: ClaimedDelivery,
    signing: Result<Vec<crate::signing::SigningSecret>, secrets::SecretUnreadable>,
) -> Finished {
    let sender = deliver::Sender {
        client,
        allow: &cfg.allow,
        max_timeout: cfg.request_timeout,
        snippet_bytes: cfg.snippet_bytes,
    };
    let report = sender.send(&row, signing).await;
    metrics
        .delivery_seconds
        .observe(report.duration.as_secs_f64());
    let mut rng = rand::rngs::SmallRng::from_os_rng();
    let (finished, outcome) = classify::classify(&cfg.retry, &row, report, &mut rng);
    metrics
        .delivery_attempts
        .get_or_create(&Outcome { outcome })
        .inc();
    finished
}

/// A claimed row of `endpoint_id` for unit tests: a tenant-wide endpoint's first attempt
/// of an empty event, with no secrets.
#[cfg(test)]
fn claimed_row(endpoint_id: Uuid, tenant: &str) -> ClaimedDelivery {
    let now = chrono::Utc::now();
    ClaimedDelivery {
        id: Uuid::now_v7(),
        event_id: Uuid::now_v7(),
        endpoint_id,
        tenant: tenant.into(),
        consumer: None,
        attempts: 1,
        claim_token: Uuid::now_v7(),
        attempt_seq: 1,
        config_version: 1,
        lease_until: now,
        event_type: "a.b".into(),
        payload: "{}".into(),
        event_created_at: now,
        source: None,
        source_event_id: None,
        traceparent: None,
        tracestate: None,
        ordered: false,
        url: "https://example.com".into(),
        headers: sqlx::types::Json(serde_json::json!({})),
        timeout_ms: None,
        max_attempts: None,
        retry_schedule_secs: None,
        max_in_flight: None,
        secret_ids: vec![],
        secret_key_ids: vec![],
        secret_ciphertexts: vec![],
    }
}
