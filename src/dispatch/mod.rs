//! `hookd dispatch`: claims due deliveries with leases and sends them.
//!
//! One claimer loop leases as many rows as there are free slots (a global semaphore)
//! and spawns a task per delivery, so a slow endpoint only ever occupies its own slots
//! (bounded per endpoint by the claim's quota) and never delays another endpoint's
//! deliveries. Outcomes go to the batch completer. Wake-ups come from NOTIFY, a timer to
//! the next due row, freed slots, and a poll fallback.

mod classify;
mod completer;
mod deliver;
pub mod policy;
pub mod secrets;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::future::BoxFuture;
use rand::SeedableRng;
use sqlx::PgPool;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::{DispatchSettings, RetentionSettings};
use crate::crypto::Keyring;
use crate::db::{
    self,
    deliveries::{ClaimRequest, ClaimedDelivery, ConsumerBusy, Release, TenantBusy, TenantShares},
};
use crate::metrics::{Metrics, Outcome};
use crate::outbound::{self, AllowList, ClientOptions, HostResolver};
use completer::Finished;
use policy::RetryPolicy;

/// The shortest lease accepted. Leases are renewed (fenced on the claim token) every
/// quarter lease while a request runs, so a lease need not outlive the request timeout;
/// short leases are what lets a replacement take over a killed dispatcher's deliveries
/// within seconds (issue 13).
pub const MIN_LEASE_SECS: u64 = 2;

/// Validated dispatcher configuration.
#[derive(Clone)]
pub struct DispatchConfig {
    pub worker_id: Uuid,
    pub lease: Duration,
    pub request_timeout: Duration,
    pub concurrency: usize,
    pub endpoint_concurrency: usize,
    pub allow: AllowList,
    pub retry: RetryPolicy,
    pub circuit_threshold: u32,
    pub circuit_cooldown: Duration,
    pub poll_interval: Duration,
    pub notify: bool,
    /// A direct URL for LISTEN (see `DispatchSettings::notify_database_url`)
    pub notify_url: Option<String>,
    pub shutdown_grace: Duration,
    pub snippet_bytes: usize,
    /// DNS for receiver host names; `None` is the system resolver. Tests script answers
    /// here (e.g. DNS rebinding); whatever it answers still passes the outbound guard.
    pub resolver: Option<Arc<dyn HostResolver>>,
    /// Told each delivery a worker reaches a [`Stage`] with, and awaited before the
    /// worker goes on: tests set it to hold a worker between claim and completion (as
    /// River's test signals do) and look at the queue meanwhile. `None` outside tests,
    /// where it costs one branch per stage. A held worker keeps its slot and its lease
    /// (still renewed), and is stopped like a send if the lease is lost.
    pub stage_hook: Option<StageHook>,
}

/// Where a worker is with a claimed delivery, as [`DispatchConfig::stage_hook`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// leased and about to be sent
    Claimed,
    /// sent and classified; the outcome is not yet handed to the completer
    Sent,
}

/// See [`DispatchConfig::stage_hook`]: called with the stage and the delivery's id.
pub type StageHook = Arc<dyn Fn(Stage, Uuid) -> BoxFuture<'static, ()> + Send + Sync>;

impl std::fmt::Debug for DispatchConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchConfig")
            .field("worker_id", &self.worker_id)
            .field("lease", &self.lease)
            .field("request_timeout", &self.request_timeout)
            .field("concurrency", &self.concurrency)
            .field("endpoint_concurrency", &self.endpoint_concurrency)
            .field("allow", &self.allow)
            .field("retry", &self.retry)
            .field("resolver", &self.resolver.as_ref().map(|_| "custom"))
            .field("stage_hook", &self.stage_hook.as_ref().map(|_| "set"))
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "HOOKD_LEASE_SECS ({lease}s) must be at least {MIN_LEASE_SECS}s: a lease is renewed every quarter of it while its request runs, and a shorter one would lapse between renewals"
    )]
    LeaseTooShort { lease: u64 },
    #[error("HOOKD_ALLOWED_DESTINATIONS: {0}")]
    AllowList(String),
    #[error(
        "HOOKD_RETRY_SCHEDULE: {0:?} is not a comma-separated list of seconds, each from 1 to 2592000 (30 days)"
    )]
    Schedule(String),
    #[error("{0} must be at least 1")]
    Zero(&'static str),
}

impl DispatchConfig {
    pub fn from_settings(s: &DispatchSettings) -> Result<Self, ConfigError> {
        if s.lease_secs < MIN_LEASE_SECS {
            return Err(ConfigError::LeaseTooShort {
                lease: s.lease_secs,
            });
        }
        if s.concurrency == 0 {
            return Err(ConfigError::Zero("HOOKD_CONCURRENCY"));
        }
        if s.endpoint_concurrency == 0 {
            return Err(ConfigError::Zero("HOOKD_ENDPOINT_CONCURRENCY"));
        }
        let schedule = s
            .retry_schedule
            .split(',')
            .map(|p| {
                p.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|v| *v > 0 && *v <= policy::MAX_RETRY_DELAY.as_secs())
                    .map(Duration::from_secs)
            })
            .collect::<Option<Vec<_>>>()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ConfigError::Schedule(s.retry_schedule.clone()))?;
        let max_attempts = s
            .max_attempts
            .unwrap_or(u32::try_from(schedule.len() + 1).unwrap_or(u32::MAX));
        Ok(DispatchConfig {
            worker_id: Uuid::now_v7(),
            lease: Duration::from_secs(s.lease_secs),
            request_timeout: Duration::from_secs(s.request_timeout_secs),
            concurrency: s.concurrency,
            endpoint_concurrency: s.endpoint_concurrency,
            allow: AllowList::parse(&s.allowed_destinations).map_err(ConfigError::AllowList)?,
            retry: RetryPolicy {
                schedule,
                max_attempts: max_attempts.max(1),
                jitter: s.retry_jitter.clamp(0.0, 1.0),
                max_retry_after: Duration::from_secs(s.max_retry_after_secs),
            },
            circuit_threshold: s.circuit_failures.max(1),
            circuit_cooldown: Duration::from_secs(s.circuit_cooldown_secs),
            poll_interval: Duration::from_millis(s.poll_ms.max(10)),
            notify: s.notify,
            notify_url: s.notify_database_url.clone(),
            shutdown_grace: Duration::from_secs(s.shutdown_grace_secs),
            snippet_bytes: s.response_snippet_bytes,
            resolver: None,
            stage_hook: None,
        })
    }
}

/// `hookd dispatch`: the dispatcher, its background duties (history days, the retention
/// pruner, the backlog sampler, the straggler sweep; awaited together at shutdown) and its
/// health/metrics listener.
pub async fn run(
    pool: PgPool,
    settings: DispatchSettings,
    keyring: Keyring,
    retention: RetentionSettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(settings.listen).await?;
    run_on(listener, pool, settings, keyring, retention, shutdown).await
}

/// [`run`] on a listener already bound (`hookd dev` binds its ports first, so a clash is
/// reported before anything starts).
pub async fn run_on(
    listener: tokio::net::TcpListener,
    pool: PgPool,
    settings: DispatchSettings,
    keyring: Keyring,
    retention: RetentionSettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let cfg = DispatchConfig::from_settings(&settings)?;
    let policy = crate::retention::RetentionPolicy::from_settings(&retention)?;
    let metrics = Metrics::new();
    // before the health listener: a dispatcher that reports ready has left no
    // plaintext secret behind
    encrypt_legacy_secrets(&pool, &keyring).await;
    let health = crate::ops::router(pool.clone(), metrics.clone());
    tracing::info!(listen = %settings.listen, worker = %cfg.worker_id, key_id = keyring.active_key_id(), "dispatcher starting");
    let server = tokio::spawn(crate::ops::serve_on(listener, health, shutdown.clone()));
    let keyring = Arc::new(keyring);
    let mut duties = crate::runtime::Duties::new();
    duties.start(
        "history days",
        crate::retention::run_history_days(pool.clone(), shutdown.clone()),
    );
    if retention.prune_interval_secs > 0 {
        duties.start(
            "retention pruner",
            crate::retention::run_pruner(
                pool.clone(),
                policy,
                Duration::from_secs(retention.prune_interval_secs),
                metrics.clone(),
                shutdown.clone(),
            ),
        );
    }
    duties.start(
        "backlog sampler",
        run_backlog_sampler(pool.clone(), metrics.clone(), shutdown.clone()),
    );
    duties.start(
        "straggler sweep",
        run_straggler_sweep(pool.clone(), shutdown.clone()),
    );
    run_dispatcher(pool, cfg, keyring, metrics, shutdown).await;
    duties.join().await;
    server.await??;
    Ok(())
}

/// Secrets stored before encryption at rest (migration 0004) are never handed to a
/// worker in plaintext: encrypt them now, so an upgrade leaves none readable even if
/// nobody runs `hookd rekey`. Idempotent and cheap when there are none; a failure is
/// logged and left to `hookd rekey`, since it must not keep deliveries from flowing.
pub async fn encrypt_legacy_secrets(pool: &PgPool, keyring: &Keyring) {
    match crate::rekey::encrypt_plaintext(pool, keyring, 100).await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            encrypted = n,
            key_id = keyring.active_key_id(),
            "encrypted signing secrets left in plaintext by an upgrade"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "could not encrypt plaintext signing secrets; run `hookd rekey`")
        }
    }
}

/// In-flight bookkeeping shared by the claimer, the lease renewer and delivery tasks.
#[derive(Default)]
struct InFlight {
    per_endpoint: HashMap<Uuid, i32>,
    per_tenant: HashMap<String, i32>,
    /// by tenant and consumer (None: the tenant's tenant-wide endpoints)
    per_consumer: HashMap<(String, Option<String>), i32>,
    /// to renew leases, and to hand them back if the shutdown deadline passes
    leases: HashMap<Uuid, HeldLease>,
}

struct HeldLease {
    claim_token: Uuid,
    /// whether the send had begun
    started: bool,
    /// until when the lease is surely ours: measured from before the statement that set
    /// it, on this host's monotonic clock, so the database's expiry is never earlier
    until: Instant,
    /// stops the send when the lease is lost, or about to lapse unrenewed, so no other
    /// worker can send the delivery while this one still is
    stop: CancellationToken,
}

/// The most of `slots` one holder may take, given how many holders have deliveries in
/// flight here (issue 19): an equal share of the slots, less a reserve that no single
/// holder can take, so a holder whose receivers are slow can never take every slot and
/// another's delivery waits for a free slot, not for those receivers. A holder alone may
/// use all but the reserve. Applied twice: tenants share the worker's slots, and the
/// consumers of a tenant share that tenant's share.
pub fn share_cap(slots: usize, holders_in_flight: usize) -> i32 {
    let reserve = if slots > 1 { (slots / 16).max(1) } else { 0 };
    let shared = slots - reserve;
    let cap = shared.div_ceil(holders_in_flight.max(1)).max(1);
    i32::try_from(cap).unwrap_or(i32::MAX)
}

impl InFlight {
    /// Every tenant's and consumer's share for the next claim.
    fn shares(&self, concurrency: usize) -> TenantShares {
        let cap = share_cap(concurrency, self.per_tenant.len());
        let tenant_slots = usize::try_from(cap).unwrap_or(usize::MAX);
        let mut groups: HashMap<&str, usize> = HashMap::new();
        for (tenant, _) in self.per_consumer.keys() {
            *groups.entry(tenant.as_str()).or_default() += 1;
        }
        TenantShares {
            cap,
            busy: self
                .per_tenant
                .iter()
                .map(|(tenant, n)| TenantBusy {
                    tenant: tenant.clone(),
                    in_flight: *n,
                    consumer_cap: share_cap(
                        tenant_slots,
                        groups.get(tenant.as_str()).copied().unwrap_or(0),
                    ),
                })
                .collect(),
            consumer_cap: share_cap(tenant_slots, 0),
            consumers_busy: self
                .per_consumer
                .iter()
                .map(|((tenant, consumer), n)| ConsumerBusy {
                    tenant: tenant.clone(),
                    consumer: consumer.clone(),
                    in_flight: *n,
                })
                .collect(),
        }
    }

    fn take(&mut self, row: &ClaimedDelivery) {
        *self.per_endpoint.entry(row.endpoint_id).or_insert(0) += 1;
        *self.per_tenant.entry(row.tenant.clone()).or_insert(0) += 1;
        *self
            .per_consumer
            .entry((row.tenant.clone(), row.consumer.clone()))
            .or_insert(0) += 1;
    }

    fn give_back(&mut self, endpoint_id: Uuid, owner: (String, Option<String>)) {
        fn dec<K: std::hash::Hash + Eq>(map: &mut HashMap<K, i32>, key: &K) {
            if let Some(n) = map.get_mut(key) {
                *n -= 1;
                if *n <= 0 {
                    map.remove(key);
                }
            }
        }
        dec(&mut self.per_endpoint, &endpoint_id);
        dec(&mut self.per_tenant, &owner.0);
        dec(&mut self.per_consumer, &owner);
    }
}

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
        let free = d.slots.available_permits();
        if free == 0 {
            tokio::select! {
                _ = d.slot_freed.notified() => {}
                _ = shutdown.cancelled() => {}
            }
            // Every slot was taken: let a few more free up before claiming, so a busy
            // dispatcher claims in batches instead of once per freed slot (each claim
            // has a fixed cost of two statements, and at thousands of deliveries a
            // second that cost, not the receivers, bounded the drain).
            d.gather_free_slots(&shutdown).await;
            continue;
        }
        let limit = free.min(MAX_CLAIM_BATCH);
        let Some((rows, claimed_at)) = d.claim(limit, &shutdown).await else {
            continue;
        };
        let got = rows.len();
        for row in rows {
            d.spawn(row, claimed_at);
        }
        if got == limit {
            continue; // a full batch: more is probably due right now
        }
        d.sleep_until_due(&shutdown).await;
    }
    d.drain_and_release().await;
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
    /// NOTIFY: something may have become due
    wake: Arc<Notify>,
    slot_freed: Arc<Notify>,
    secret_cache: secrets::SecretCache,
    done_tx: mpsc::Sender<Finished>,
    completer: JoinHandle<()>,
    renewer_stop: CancellationToken,
    renewer: JoinHandle<()>,
    tasks: JoinSet<()>,
    error_backoff: Duration,
    /// the last [`Dispatcher::next_due`] answer and when it was read
    next_due_read: Option<(Instant, Option<chrono::DateTime<Utc>>)>,
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
        let wake = Arc::new(Notify::new());
        let slot_freed = Arc::new(Notify::new());
        if cfg.notify {
            crate::notify::spawn_listener(
                pool.clone(),
                cfg.notify_url.clone(),
                wake.clone(),
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
            wake,
            slot_freed,
            secret_cache,
            done_tx,
            completer,
            renewer_stop,
            renewer,
            tasks: JoinSet::new(),
            error_backoff: Duration::from_millis(100),
            next_due_read: None,
        }
    }

    /// Claims up to `limit` due deliveries within every tenant's and consumer's share,
    /// and when, by this host's clock, the statement was sent (what leases are counted
    /// from). `None` when the claim failed; it returns after the error backoff, or at
    /// shutdown.
    async fn claim(
        &mut self,
        limit: usize,
        shutdown: &CancellationToken,
    ) -> Option<(Vec<ClaimedDelivery>, Instant)> {
        let (busy, shares) = {
            let f = self.in_flight.lock().expect("in-flight lock");
            (
                f.per_endpoint.iter().map(|(k, v)| (*k, *v)).collect(),
                f.shares(self.cfg.concurrency),
            )
        };
        let cfg = &self.cfg;
        let started = Instant::now();
        let claimed = db::deliveries::claim_shared(
            &self.pool,
            &ClaimRequest {
                worker_id: cfg.worker_id,
                limit: limit as i64,
                lease_secs: cfg.lease.as_secs_f64(),
                per_endpoint_cap: i32::try_from(cfg.endpoint_concurrency).unwrap_or(i32::MAX),
                busy,
                now: None,
                default_max_attempts: i32::try_from(cfg.retry.max_attempts).unwrap_or(i32::MAX),
            },
            &shares,
        )
        .await;
        self.metrics
            .claim_seconds
            .observe(started.elapsed().as_secs_f64());
        match claimed {
            Ok(rows) => {
                self.error_backoff = Duration::from_millis(100);
                self.metrics.claimed.inc_by(rows.len() as u64);
                Some((rows, started))
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

    /// Takes a slot and the in-flight bookkeeping for one claimed row, and spawns the
    /// task that sends it.
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
            f.take(&row);
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
        let mut sleep_for = self.cfg.poll_interval;
        if let Some(at) = next_due
            && let Ok(d) = (at - Utc::now()).to_std()
        {
            sleep_for = sleep_for.min(d + Duration::from_millis(1));
        }
        tokio::select! {
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(sleep_for) => {}
            // A freed slot may unblock an endpoint (or a tenant, or a consumer) that was
            // at its cap; a short pause lets several completions accumulate into one
            // claim. Always armed: a slot freed after the claim read what was in flight
            // left its permit here, and ignoring it because nothing is in flight by now
            // slept a dispatcher with due rows for a whole poll interval (seen at once
            // per second in `hookd-bench` drains). A stale permit costs one claim.
            _ = self.slot_freed.notified() => {
                tokio::time::sleep(Duration::from_millis(1)).await;
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
            f.give_back(endpoint_id, owner);
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

/// Renews the leases of deliveries in flight every quarter lease, fenced on their claim
/// tokens. A send whose lease was taken over is stopped at once; one whose lease could not
/// be renewed (database unreachable) is stopped shortly before the lease could lapse, so a
/// slow receiver is never sent the same delivery by two workers at once.
fn spawn_lease_renewer(
    pool: PgPool,
    lease: Duration,
    in_flight: Arc<Mutex<InFlight>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let every = lease / 4;
    // stop a send this long before its lease could lapse: a stopped request is dropped
    // at once, but the margin also covers a renewal statement still in flight
    let margin = (lease / 4).min(Duration::from_secs(1));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled() => return,
            }
            let held: Vec<(Uuid, Uuid)> = {
                let f = in_flight.lock().expect("in-flight lock");
                f.leases
                    .iter()
                    .map(|(id, l)| (*id, l.claim_token))
                    .collect()
            };
            if !held.is_empty() {
                let sent = Instant::now();
                let renewal = tokio::time::timeout(
                    every.max(Duration::from_millis(500)),
                    db::deliveries::renew_leases(&pool, &held, lease.as_secs_f64()),
                )
                .await;
                match renewal {
                    Ok(Ok(renewed)) => {
                        let renewed: std::collections::HashSet<Uuid> =
                            renewed.into_iter().collect();
                        let mut f = in_flight.lock().expect("in-flight lock");
                        for (id, token) in &held {
                            if let Some(l) = f.leases.get_mut(id)
                                && l.claim_token == *token
                            {
                                if renewed.contains(id) {
                                    l.until = sent + lease;
                                } else {
                                    // taken over (or completed meanwhile, when nothing is
                                    // left to stop)
                                    l.stop.cancel();
                                }
                            }
                        }
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "renewing leases failed"),
                    Err(_) => tracing::warn!("renewing leases timed out"),
                }
            }
            let now = Instant::now();
            let f = in_flight.lock().expect("in-flight lock");
            for l in f.leases.values() {
                if l.until.saturating_duration_since(now) <= margin && !l.stop.is_cancelled() {
                    l.stop.cancel();
                }
            }
        }
    })
}

/// Samples backlog gauges every few seconds with bounded, index-only queries, so a
/// scrape never costs a table scan. A background duty of `hookd dispatch`.
async fn run_backlog_sampler(pool: PgPool, metrics: Metrics, shutdown: CancellationToken) {
    loop {
        if let Ok((backlog, oldest)) = db::deliveries::backlog_sample(&pool).await {
            metrics.backlog.set(backlog);
            metrics.oldest_due_age_seconds.set(oldest);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Cancels, every 10 s, deliveries an enqueue committed for an endpoint while it was being
/// removed (see [`db::deliveries::cancel_stragglers`]). A background duty of
/// `hookd dispatch`.
async fn run_straggler_sweep(pool: PgPool, shutdown: CancellationToken) {
    loop {
        match db::deliveries::cancel_stragglers(&pool).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                cancelled = n,
                "cancelled deliveries committed for endpoints while they were being removed"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "straggler sweep failed; retrying in 10 s")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
