//! The storage layer: every SQL statement hookd runs lives under this module, one file
//! per table. Callers get typed functions and row structs, never SQL text.

pub mod attempts;
pub mod consumers;
pub mod dead_letters;
pub mod deliveries;
pub mod endpoints;
pub mod event_types;
pub mod events;
pub mod retention;
pub mod secrets;
pub mod sign_in;
pub mod sources;
pub mod tokens;

use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use sqlx::migrate::Migrator;
use sqlx::postgres::{
    PgArguments, PgConnectOptions, PgPoolOptions, PgQueryResult, PgRow, PgStatement, PgTypeInfo,
};
use sqlx::{ConnectOptions, Execute, Executor, PgPool, Postgres};

/// The migrations compiled into this binary.
pub static MIGRATOR: Migrator = sqlx::migrate!();

/// Whose rows a read may return: a tenant, and within it possibly one consumer. `None`
/// leaves that level open (a tenant credential sees every consumer of its tenant; with
/// authentication off every tenant is open). Another audience's rows are as absent as
/// unknown ids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Audience<'a> {
    pub tenant: Option<&'a str>,
    pub consumer: Option<&'a str>,
    /// A consumer token's consumer generation: endpoints of an earlier consumer with the
    /// same uid are not its (migration 0017).
    pub consumer_generation: Option<i64>,
    /// A consumer token's floor of event and delivery ids (UUIDv7, time-ordered): the
    /// smallest id minted when its consumer was created. Older rows with the same uid are
    /// an earlier consumer's.
    pub since: Option<uuid::Uuid>,
}

impl<'a> Audience<'a> {
    pub fn tenant(tenant: Option<&'a str>) -> Self {
        Audience {
            tenant,
            ..Default::default()
        }
    }
}

/// Errors of the storage layer, classified for the layers above: an outage must be told
/// apart from a bug, because the API answers the first with 503 and the dispatcher
/// simply retries it.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    #[error("database error: {0}")]
    Query(#[source] sqlx::Error),
    /// The connection settings themselves are wrong (DATABASE_URL); the message says how.
    #[error("{0}")]
    Config(String),
}

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        if is_unavailable(&e) {
            DbError::Unavailable(e)
        } else {
            DbError::Query(e)
        }
    }
}

impl DbError {
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DbError::Unavailable(_))
    }

    /// The SQLSTATE the server answered with, if it answered.
    pub fn sqlstate(&self) -> Option<String> {
        let (DbError::Unavailable(e) | DbError::Query(e)) = self else {
            return None; // a configuration error never reached a server
        };
        match e {
            sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
            _ => None,
        }
    }

    /// A deadlock or serialization failure: the transaction was rolled back and running it
    /// again (or its parts separately) is expected to succeed.
    pub fn is_transient_conflict(&self) -> bool {
        matches!(self.sqlstate().as_deref(), Some("40001" | "40P01"))
    }

    /// A transport failure: the server may or may not have executed what was sent.
    pub fn is_transport(&self) -> bool {
        let (DbError::Unavailable(e) | DbError::Query(e)) = self else {
            return false;
        };
        matches!(
            e,
            sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::WorkerCrashed
        ) || self
            .sqlstate()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P"))
    }
}

/// Lets this transaction's commit return before its WAL is flushed. Only for writes
/// whose loss in a crash is harmless by design (lease and outcome writes: a lost one
/// re-sends a delivery, invariant 9); never for the enqueue transaction.
pub async fn set_async_commit(conn: &mut sqlx::PgConnection) -> Result<(), DbError> {
    sqlx::query("SET LOCAL synchronous_commit = off")
        .execute(on(conn))
        .await?;
    Ok(())
}

/// Wakes the dispatchers LISTENing on `channel` (NOTIFY, outside any enqueue
/// transaction). Commits asynchronously: a NOTIFY gives its transaction an id, so with
/// `synchronous_commit = on` it waited for its own WAL flush (a whole fsync, 0.5-1 ms
/// here) before the listeners heard it, on the path of every event to its receiver. A
/// notification lost in a crash costs latency only (invariant 7).
pub async fn notify(pool: &PgPool, channel: &str, payload: &str) -> Result<(), DbError> {
    sqlx::query("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)")
        .bind(channel)
        .bind(payload)
        .execute(on(pool))
        .await?;
    Ok(())
}

/// The database a connection is in: `DATABASE_URL`'s (through `pool`), or a LISTEN
/// connection's (`notify::listen` checks the two are one).
pub async fn current_database<'e>(e: impl sqlx::PgExecutor<'e>) -> Result<String, DbError> {
    Ok(sqlx::query_scalar("SELECT current_database()")
        .fetch_one(e)
        .await?)
}

/// True when the error means "the database cannot be reached right now" rather than
/// "this statement is wrong": connection failures, pool exhaustion, and the server-side
/// states a restarting or failing-over Postgres reports.
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            // 08: connection exception, 57P0x: admin/crash shutdown, cannot connect now,
            // 53: insufficient resources, 40001/40P01 are retryable too.
            code.starts_with("08")
                || code.starts_with("57P")
                || code.starts_with("53")
                || code == "40001"
                || code == "40P01"
        }
        _ => false,
    }
}

/// Set on every session hookd opens to Postgres itself; behind a pooler in transaction
/// mode, at the start of every transaction instead (see [`begin`] and [`on`]): there a
/// session setting would stay on the server connection for the next client of the pool
/// (invariant 12). Every statement
/// hookd runs is designed as index lookups and ordered index range scans, and the
/// statistics of a queue are always stale: rows arrive and leave by the thousand a
/// second, and the queue partition (migration 0014) is often nearly empty when autovacuum
/// analyzes it. Planned from such statistics, a claim read each endpoint's whole backlog
/// through a bitmap and sorted it (2,500 rows per endpoint for a quota of 32: 69 ms
/// instead of 10, and minutes of doubled latency in a sustained run), and an outcome
/// batch scanned the queue once per outcome; the plan cache keeps such a plan until the
/// next analyze. With both priced out, the planner still uses them where nothing else
/// applies. Retention's check of a whole day, which wants a bitmap of its block-range
/// index, turns bitmaps back on.
pub const INDEX_PATHS_ONLY: [(&str, &str); 2] =
    [("enable_seqscan", "off"), ("enable_bitmapscan", "off")];

/// The statement that opens every transaction hookd runs: `BEGIN` and
/// [`INDEX_PATHS_ONLY`] for that transaction only, in one round trip (one simple-protocol
/// message, so a pooler cannot split it across server connections either).
const BEGIN_INDEX_PATHS_ONLY: &str =
    "BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off";

/// [`INDEX_PATHS_ONLY`] for the rest of a transaction: what a test that reads a plan of a
/// statement hookd runs must set to see the plan hookd gets.
pub async fn index_paths_only(conn: &mut sqlx::PgConnection) -> Result<(), DbError> {
    for (name, value) in INDEX_PATHS_ONLY {
        sqlx::query("SELECT set_config($1, $2, true)")
            .bind(name)
            .bind(value)
            .execute(on(&mut *conn))
            .await?;
    }
    Ok(())
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of the constant statement `sql` with `args`, executed as
/// hookd executes it ([`INDEX_PATHS_ONLY`]) in a transaction that is rolled back, so
/// nothing it writes or locks stays. One line per plan line. For tests and benchmarks that
/// read the plan a statement gets.
pub async fn explain_analyze(
    pool: &PgPool,
    sql: &'static str,
    args: PgArguments,
) -> Result<Vec<String>, DbError> {
    let mut tx = begin(pool).await?;
    index_paths_only(&mut tx).await?;
    // the only dynamic part is a constant prefix on a constant statement text
    let plan = sqlx::query_scalar_with(
        sqlx::AssertSqlSafe(format!("EXPLAIN (ANALYZE, BUFFERS) {sql}")),
        args,
    )
    .fetch_all(on(&mut *tx))
    .await?;
    tx.rollback().await?;
    Ok(plan)
}

/// What sits between hookd and Postgres (`HOOKD_DATABASE_POOLER`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Pooler {
    /// Postgres itself, or a pooler in session mode: a connection is one server session.
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`, 1.18 and later):
    /// consecutive transactions of one connection may run on different server sessions,
    /// shared with other clients of the pool.
    Transaction,
}

/// Whether this process talks to Postgres through a transaction-mode pooler. One value
/// per process: a process talks to one database, one way, and the statements of every
/// pool it opens must follow it (see [`on`]).
static BEHIND_TRANSACTION_POOLER: AtomicBool = AtomicBool::new(false);

/// Sets how this process reaches Postgres; call before opening pools.
pub fn set_pooler(pooler: Pooler) {
    BEHIND_TRANSACTION_POOLER.store(pooler == Pooler::Transaction, Ordering::Relaxed);
}

pub fn pooler() -> Pooler {
    if BEHIND_TRANSACTION_POOLER.load(Ordering::Relaxed) {
        Pooler::Transaction
    } else {
        Pooler::None
    }
}

/// Where a statement runs, made safe for a transaction-mode pooler: every statement
/// hookd runs goes through here (`.fetch_one(on(pool))`, `.execute(on(&mut *tx))`).
/// Without a pooler ([`Pooler::None`]) it runs the statement as sqlx would, at no cost:
/// the session holds the settings and the session is hookd's alone. Behind one:
///
/// - A statement outside a transaction runs in one of its own, opened with
///   [`INDEX_PATHS_ONLY`]. sqlx sends Parse (and Describe) with a Sync of their own and
///   only then Bind and Execute with another Sync; a transaction-mode pooler hands the
///   server connection back to its pool at the first Sync that leaves it idle, so without
///   a transaction the Bind could reach another session than the Parse (binding nothing,
///   or another client's unnamed statement). Inside a transaction the session is ours
///   until COMMIT. The same transaction carries the planner settings, which a session
///   `SET` would leak to the pool's other clients.
/// - Statements are unnamed (`persistent(false)`): a
///   named statement stays on the server session after the transaction, where the next
///   session of this process that prepares the same name (`sqlx_s_1`) fails with
///   "already exists", and sqlx's cache would name statements the next session lacks.
///
/// Results of a wrapped statement are collected before its COMMIT, so they are whole or
/// an error: hookd's statements return bounded row counts.
#[derive(Debug)]
pub struct On<E>(E);

/// See [`On`].
pub fn on<E>(executor: E) -> On<E> {
    On(executor)
}

/// Opens a transaction with [`INDEX_PATHS_ONLY`] in force (behind a transaction-mode
/// pooler set for it, in the same round trip as the `BEGIN`). Every transaction hookd
/// runs starts here.
pub async fn begin(pool: &PgPool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, DbError> {
    if pooler() == Pooler::None {
        return Ok(pool.begin().await?);
    }
    Ok(pool
        .begin_with(sqlx::AssertSqlSafe(BEGIN_INDEX_PATHS_ONLY))
        .await?)
}

/// [`begin`] with `SET LOCAL` statements of the caller's after it, in the same round trip
/// (one simple-protocol message). `settings` is SQL: statements of constant text and
/// numbers the caller formatted, never input.
pub async fn begin_with_settings(
    pool: &PgPool,
    settings: &str,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, DbError> {
    let start = match pooler() {
        Pooler::None => "BEGIN",
        Pooler::Transaction => BEGIN_INDEX_PATHS_ONLY,
    };
    Ok(pool
        .begin_with(sqlx::AssertSqlSafe(format!("{start}; {settings}")))
        .await?)
}

/// [`begin`] on a connection the caller holds; a savepoint when it is in a transaction
/// already (which has the settings).
pub async fn begin_on(
    conn: &mut sqlx::PgConnection,
) -> Result<sqlx::Transaction<'_, sqlx::Postgres>, DbError> {
    use sqlx::Connection;
    if conn.is_in_transaction() || pooler() == Pooler::None {
        return Ok(conn.begin().await?);
    }
    Ok(conn
        .begin_with(sqlx::AssertSqlSafe(BEGIN_INDEX_PATHS_ONLY))
        .await?)
}

/// A statement whose preparation follows [`pooler`].
struct Statement<E> {
    inner: E,
    named: bool,
}

impl<E> Statement<E> {
    fn new(inner: E) -> Self {
        Statement {
            inner,
            named: pooler() == Pooler::None,
        }
    }
}

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Statement<E> {
    fn sql(self) -> sqlx::SqlStr {
        self.inner.sql()
    }

    fn statement(&self) -> Option<&PgStatement> {
        self.inner.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, sqlx::error::BoxDynError> {
        self.inner.take_arguments()
    }

    fn persistent(&self) -> bool {
        self.named && self.inner.persistent()
    }
}

type Item = sqlx::Either<PgQueryResult, PgRow>;

/// Runs `query` in a transaction of its own on `conn` (see [`On`]).
async fn in_own_transaction<'q, E: Execute<'q, Postgres> + 'q>(
    conn: &mut sqlx::PgConnection,
    query: Statement<E>,
) -> Result<Vec<Item>, sqlx::Error> {
    use futures::TryStreamExt;
    use sqlx::Connection;
    let mut tx = conn
        .begin_with(sqlx::AssertSqlSafe(BEGIN_INDEX_PATHS_ONLY))
        .await?;
    let items: Vec<Item> = (&mut *tx).fetch_many(query).try_collect().await?;
    tx.commit().await?;
    Ok(items)
}

fn stream_of<'e>(
    items: impl std::future::Future<Output = Result<Vec<Item>, sqlx::Error>> + Send + 'e,
) -> BoxStream<'e, Result<Item, sqlx::Error>> {
    use futures::{StreamExt, stream};
    Box::pin(stream::once(items).flat_map(|r| match r {
        Ok(items) => stream::iter(items.into_iter().map(Ok)).left_stream(),
        Err(e) => stream::iter([Err(e)]).right_stream(),
    }))
}

fn first_row(items: Vec<Item>) -> Option<PgRow> {
    items.into_iter().find_map(|i| match i {
        sqlx::Either::Right(row) => Some(row),
        sqlx::Either::Left(_) => None,
    })
}

impl<'c> Executor<'c> for On<&'c mut sqlx::PgConnection> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Item, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        use sqlx::Connection;
        let conn = self.0;
        if conn.is_in_transaction() || pooler() == Pooler::None {
            return conn.fetch_many(Statement::new(query));
        }
        stream_of(in_own_transaction(conn, Statement::new(query)))
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        use sqlx::Connection;
        let conn = self.0;
        if conn.is_in_transaction() || pooler() == Pooler::None {
            return conn.fetch_optional(Statement::new(query));
        }
        Box::pin(async move {
            Ok(first_row(
                in_own_transaction(conn, Statement::new(query)).await?,
            ))
        })
    }

    fn prepare_with<'e>(
        self,
        sql: sqlx::SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        self.0.prepare_with(sql, parameters)
    }

    fn describe<'e>(
        self,
        sql: sqlx::SqlStr,
    ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.0.describe(sql)
    }
}

impl<'p> Executor<'p> for On<&'_ PgPool> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Item, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if pooler() == Pooler::None {
            return self.0.fetch_many(query);
        }
        let pool = self.0.clone();
        stream_of(async move {
            let mut conn = pool.acquire().await?;
            in_own_transaction(&mut conn, Statement::new(query)).await
        })
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if pooler() == Pooler::None {
            return self.0.fetch_optional(query);
        }
        let pool = self.0.clone();
        Box::pin(async move {
            let mut conn = pool.acquire().await?;
            Ok(first_row(
                in_own_transaction(&mut conn, Statement::new(query)).await?,
            ))
        })
    }

    fn prepare_with<'e>(
        self,
        sql: sqlx::SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'p: 'e,
    {
        let pool = self.0.clone();
        Box::pin(async move { pool.acquire().await?.prepare_with(sql, parameters).await })
    }

    fn describe<'e>(
        self,
        sql: sqlx::SqlStr,
    ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        let pool = self.0.clone();
        Box::pin(async move { pool.acquire().await?.describe(sql).await })
    }
}

/// Connection settings shared by every component.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub url: String,
    pub max_connections: u32,
    pub acquire_timeout: Duration,
}

/// Opens a pool. Connecting is lazy so that a component started before its database
/// comes up reports "not ready" instead of crashing; `check_schema` is the gate.
pub fn connect_lazy(settings: &PoolSettings) -> Result<PgPool, DbError> {
    connect_lazy_to(settings, None)
}

/// [`connect_lazy`], on `database` instead of the URL's own when given (the benchmark's
/// dedicated database on the same server).
pub fn connect_lazy_to(settings: &PoolSettings, database: Option<&str>) -> Result<PgPool, DbError> {
    let mut opts = parse_url(&settings.url)?
        // statement logging at info would print payloads; keep it at debug
        .log_statements(tracing::log::LevelFilter::Debug)
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_millis(500));
    if let Some(db) = database {
        opts = opts.database(db);
    }
    let pool = PgPoolOptions::new();
    let pool = match pooler() {
        // No session settings: they would outlive hookd's use of the server session
        // behind the pooler. Settings are per transaction (`begin`, `on`), and there are
        // no named statements to cache (see `On`).
        Pooler::Transaction => {
            opts = opts.statement_cache_capacity(0);
            pool
        }
        // a SET after connecting rather than a startup option, which poolers in session
        // mode refuse
        Pooler::None => pool.after_connect(|conn, _meta| {
            Box::pin(async move {
                let set: Vec<String> = INDEX_PATHS_ONLY
                    .iter()
                    .map(|(name, value)| format!("SET {name} = {value}"))
                    .collect();
                // simple protocol: both in one round trip, nothing prepared
                sqlx::raw_sql(sqlx::AssertSqlSafe(set.join("; ")))
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        }),
    };
    Ok(pool
        .max_connections(settings.max_connections)
        .min_connections(0)
        .acquire_timeout(settings.acquire_timeout)
        .connect_lazy_with(opts))
}

/// An example of the URL format, for error messages.
const URL_FORMAT: &str = "postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE, e.g. postgres://postgres@localhost:5432/hookd";

/// `url` with any password replaced, for error messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Parses DATABASE_URL. Anything but a `postgres://` or `postgresql://` URL is refused
/// here: sqlx would read `localhost:5432/hookd` as a URL of scheme `localhost` and then
/// fail with `role "anonymous" does not exist`, which says nothing about the mistake.
pub fn parse_url(url: &str) -> Result<PgConnectOptions, DbError> {
    let lower = url.trim_start().to_ascii_lowercase();
    if !(lower.starts_with("postgres://") || lower.starts_with("postgresql://")) {
        return Err(DbError::Config(format!(
            "DATABASE_URL {:?} is not a postgres:// URL; expected {URL_FORMAT}",
            redact_url(url)
        )));
    }
    url.parse::<PgConnectOptions>().map_err(|e| {
        DbError::Config(format!(
            "DATABASE_URL {:?} is not a valid Postgres URL ({e}); expected {URL_FORMAT}",
            redact_url(url)
        ))
    })
}

/// Opens one connection now, so a component that cannot reach its database says at once
/// which host and database it tried, what failed and what to do, instead of a pool
/// timeout with no cause. Returns the lazy pool on success.
pub async fn connect_checked(settings: &PoolSettings) -> Result<PgPool, DbError> {
    use sqlx::Connection;
    let opts = parse_url(&settings.url)?;
    let target = format!(
        "{}:{}, database {:?}, user {:?}",
        opts.get_host(),
        opts.get_port(),
        opts.get_database().unwrap_or(opts.get_username()),
        opts.get_username()
    );
    let wait = settings.acquire_timeout.max(Duration::from_secs(1));
    let probe = tokio::time::timeout(wait, sqlx::PgConnection::connect_with(&opts)).await;
    match probe {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            connect_lazy(settings)
        }
        Ok(Err(e)) => Err(DbError::Config(describe_connect_error(&target, &opts, &e))),
        Err(_) => Err(DbError::Config(format!(
            "cannot connect to Postgres at {target}: no answer within {wait:?}; check that the host is reachable from here and the port is right"
        ))),
    }
}

/// One line: where, what failed, what to do.
fn describe_connect_error(target: &str, opts: &PgConnectOptions, e: &sqlx::Error) -> String {
    let (cause, hint) = match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => (
            "connection refused".to_string(),
            "is Postgres running and listening on that host and port?".to_string(),
        ),
        sqlx::Error::Io(io) => (
            io.to_string(),
            "check the host and port in DATABASE_URL (a name that does not resolve fails here too)"
                .to_string(),
        ),
        sqlx::Error::Tls(t) => (
            format!("TLS failed: {t}"),
            "check sslmode in DATABASE_URL and the server's TLS setup".to_string(),
        ),
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default().to_string();
            let database = opts.get_database().unwrap_or(opts.get_username());
            let hint = match code.as_str() {
                "3D000" => format!(
                    "create it first, e.g. `createdb -h {} -p {} -U {} {database}` (or `psql -c 'CREATE DATABASE {database}'` as a superuser), then run `hookd migrate`",
                    opts.get_host(),
                    opts.get_port(),
                    opts.get_username()
                ),
                "28P01" | "28000" => {
                    "check the user and password in DATABASE_URL and the server's pg_hba.conf"
                        .to_string()
                }
                "53300" => {
                    "the server has no free connection slots; try again or raise max_connections"
                        .to_string()
                }
                "57P03" => {
                    "the server is starting up or shutting down; try again in a moment".to_string()
                }
                _ => "see the server's log for details".to_string(),
            };
            (db.message().to_string(), hint)
        }
        other => (other.to_string(), "check DATABASE_URL".to_string()),
    };
    format!("cannot connect to Postgres at {target}: {cause}; {hint}")
}

/// Why a component refuses to start on this database.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "database is not migrated (missing migration {version} {description}); run `hookd migrate` first"
    )]
    Missing { version: i64, description: String },
    #[error(
        "database schema has migration {0} that this hookd binary does not know; it is newer than this binary, upgrade hookd"
    )]
    Newer(i64),
    #[error("migration {0} is marked failed (dirty); repair it and rerun `hookd migrate`")]
    Dirty(i64),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// Runs `op` again (up to [`STATEMENT_CONFLICT_RETRIES`] more times, after 1, 2, 4, …
/// ms) when it failed with a serialization failure or a deadlock. Deliveries change
/// partition when they become terminal or are replayed (migration 0014), and a statement
/// that locks a row another transaction moved meanwhile fails with 40001 ("already moved
/// to another partition"), SKIP LOCKED or not; run again, it finds the row where it is
/// now. A claim among busy claimers can meet such a row several times in a row (8 claimers
/// completing at once failed 4 immediate tries in the suite), hence the pauses. Only for
/// single statements on a pool: a failed statement inside a transaction has aborted that
/// transaction.
pub(crate) async fn retry_conflicts<T, F, Fut>(mut op: F) -> Result<T, DbError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, DbError>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Err(e) if e.is_transient_conflict() && tries < STATEMENT_CONFLICT_RETRIES => {
                tokio::time::sleep(Duration::from_millis(1 << tries)).await;
                tries += 1;
            }
            done => return done,
        }
    }
}

/// How often [`retry_conflicts`] runs a statement again (its pauses add up to 63 ms).
const STATEMENT_CONFLICT_RETRIES: u32 = 6;

/// How often a deletion or cancellation runs again after a deadlock or serialization
/// failure before the error is returned.
const CONFLICT_RETRIES: u32 = 4;

/// Ends a transaction (or savepoint) from [`begin_on`] whose work ended with `work`:
/// commits it and returns the value; or, after a deadlock or serialization failure (the
/// transaction was rolled back whole and is expected to succeed when run again), rolls it
/// back and returns `None` so the caller runs it again, at most [`CONFLICT_RETRIES`]
/// times (counted in `tries`); any other error is returned after the rollback.
/// Deletions and cancellations run this way: they update every open delivery of one or
/// more endpoints, and under load they meet outcome batches and claims on those rows.
pub(crate) async fn commit_or_retry<T>(
    tx: sqlx::Transaction<'_, Postgres>,
    work: Result<T, DbError>,
    tries: &mut u32,
    what: &'static str,
) -> Result<Option<T>, DbError> {
    match work {
        Ok(v) => {
            tx.commit().await?;
            Ok(Some(v))
        }
        Err(e) if e.is_transient_conflict() && *tries < CONFLICT_RETRIES => {
            tx.rollback().await?;
            *tries += 1;
            tracing::info!(what, tries = *tries, sqlstate = ?e.sqlstate(), "conflict with concurrent writes; running it again");
            Ok(None)
        }
        Err(e) => {
            tx.rollback().await?;
            Err(e)
        }
    }
}

/// Locks the open deliveries of `endpoints` in id order: the order outcome batches and
/// lease renewals lock them in. A cancellation that reached them in its update's scan
/// order, after the endpoint row and its queue entry, deadlocked with outcome batches
/// under load (issue 27); taking them first and in that order, it waits for a batch
/// instead.
pub(crate) async fn lock_open_deliveries(
    conn: &mut sqlx::PgConnection,
    endpoints: &[uuid::Uuid],
) -> Result<(), DbError> {
    if endpoints.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "SELECT count(*) FROM (
             SELECT 1 FROM hookd.deliveries d
             WHERE d.endpoint_id = ANY($1) AND d.status IN ('pending', 'in_progress', 'failed')
             ORDER BY d.id
             FOR UPDATE OF d) s",
    )
    .bind(endpoints)
    .execute(on(conn))
    .await?;
    Ok(())
}

/// Applies the migrations (idempotent: applied ones are skipped by version and checksum),
/// then creates the history days from today on that do not exist yet (migration 0014).
///
/// On a connection of its own whose slow statements are logged at debug, not warn: a
/// migration is expected to take seconds, and sqlx's slow-statement warning prints the
/// whole statement, so the first screen of `hookd migrate` and `hookd dev` was the 11 KB
/// text of migration 0014.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    use sqlx::Connection;
    let opts = (*pool.connect_options())
        .clone()
        .log_slow_statements(tracing::log::LevelFilter::Debug, Duration::from_millis(500));
    let mut conn = sqlx::PgConnection::connect_with(&opts)
        .await
        .map_err(sqlx::migrate::MigrateError::Execute)?;
    MIGRATOR.run(&mut conn).await?;
    sqlx::query("SELECT hookd.history_days_ensure($1)")
        .bind(retention::HISTORY_DAYS_AHEAD)
        .execute(on(&mut conn))
        .await
        .map_err(sqlx::migrate::MigrateError::Execute)?;
    let _ = conn.close().await;
    Ok(())
}

/// Refuses an unmigrated, partially migrated or newer schema with a clear message.
pub async fn check_schema(pool: &PgPool) -> Result<(), SchemaError> {
    let exists: bool =
        sqlx::query_scalar("SELECT to_regclass('public._sqlx_migrations') IS NOT NULL")
            .fetch_one(on(pool))
            .await
            .map_err(DbError::from)?;
    let applied: Vec<(i64, bool)> = if exists {
        sqlx::query_as("SELECT version, success FROM public._sqlx_migrations ORDER BY version")
            .fetch_all(on(pool))
            .await
            .map_err(DbError::from)?
    } else {
        Vec::new()
    };
    for (version, success) in &applied {
        if !success {
            return Err(SchemaError::Dirty(*version));
        }
        if !MIGRATOR.iter().any(|m| m.version == *version) {
            return Err(SchemaError::Newer(*version));
        }
    }
    for m in MIGRATOR.iter() {
        if !applied.iter().any(|(v, _)| *v == m.version) {
            return Err(SchemaError::Missing {
                version: m.version,
                description: m.description.to_string(),
            });
        }
    }
    Ok(())
}

/// Cheap liveness probe for `/readyz`.
pub async fn ping(pool: &PgPool) -> Result<(), DbError> {
    sqlx::query("SELECT 1").execute(on(pool)).await?;
    Ok(())
}

/// A warning when the server's autovacuum is off (or the queue tables have it disabled):
/// every claim and outcome leaves dead row versions behind, and without vacuum the queue
/// tables and their indexes grow without bound and claims slow down (measured for issue
/// 13: 2,000 dead tuples a second, batch latency doubled within minutes). `None` when it
/// is on.
pub async fn autovacuum_warning(pool: &PgPool) -> Result<Option<String>, DbError> {
    let (server, off_tables): (String, Vec<String>) = sqlx::query_as(
        r#"
        SELECT current_setting('autovacuum'),
               coalesce((SELECT array_agg(c.relname::text ORDER BY c.relname)
                         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE n.nspname = 'hookd'
                           AND c.reloptions @> ARRAY['autovacuum_enabled=false']), '{}')
        "#,
    )
    .fetch_one(on(pool))
    .await?;
    Ok(if server != "on" {
        Some(
            "autovacuum is off on this Postgres server: the queue tables (hookd.deliveries, \
             hookd.endpoint_queue) will bloat and dispatch will slow down without bound; turn \
             it on (ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf();) or vacuum \
             them on a schedule"
                .to_string(),
        )
    } else if !off_tables.is_empty() {
        Some(format!(
            "autovacuum is disabled on hookd tables {}: they will bloat and dispatch will slow \
             down; reset it with ALTER TABLE ... RESET (autovacuum_enabled)",
            off_tables.join(", ")
        ))
    } else {
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transaction_opens_with_the_index_paths_settings() {
        let sets: Vec<String> = INDEX_PATHS_ONLY
            .iter()
            .map(|(name, value)| format!("SET LOCAL {name} = {value}"))
            .collect();
        assert_eq!(
            BEGIN_INDEX_PATHS_ONLY,
            format!("BEGIN; {}", sets.join("; "))
        );
    }
}
