//! `hookd-bench`: measures ingest, dispatch, end-to-end latency and claim cost on this
//! machine, through the real API, outbox and dispatcher code of the `hookd` library, and
//! compares ingest with what plain SQL reaches on the same pool. One entry point: [`run`].
//!
//! A crate of its own so that the `hookd` product carries no benchmark code (and none of
//! its `CREATE/DROP DATABASE` and `TRUNCATE` statements, which live in [`db`] here).
//!
//! Everything runs in this process against 127.0.0.1: the API (axum app on the real
//! listener), a load generator, the dispatcher and a fast receiver; only the e2e section's
//! "separate processes" rows start `hookd api` and `hookd dispatch` as child processes
//! (this executable run as `hookd`, see [`hookd_command`]). The database is always a
//! dedicated one (`hookd_bench_<pid>_<n>`) created on the server DATABASE_URL names, or on
//! a throwaway cluster when it is unset, and dropped at the end, so no user database ever
//! keeps the millions of rows the claim section writes.

mod cpu;
mod db;
mod lease_model;
pub mod load;
pub mod receiver;
mod sections;

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use hookd::crypto::Keyring;
use hookd::db::{DbError, PoolSettings};
use hookd::pgtemp::TempPostgres;

/// The name of this crate's executable.
pub const BIN_NAME: &str = "hookd-bench";

/// The `argv[0]` under which this executable behaves as the `hookd` binary.
const HOOKD_ARGV0: &str = "hookd";

/// Whether this process was started as `hookd` ([`hookd_command`]): its `main` then hands
/// the command line to `hookd::cli::main`, the product binary's own body.
pub fn invoked_as_hookd() -> bool {
    std::env::args_os()
        .next()
        .is_some_and(|a| Path::new(&a).file_name() == Some(OsStr::new(HOOKD_ARGV0)))
}

/// A command that runs `hookd <args>` in a child process: this executable with
/// `argv[0] = hookd`. The children are thus always the same build as the bench (no
/// second binary to find, none stale), running the product's entry point with its
/// defaults. `None` when this process is not the `hookd-bench` executable (the test
/// suite runs the bench inside a test harness, which cannot be started as `hookd`).
pub fn hookd_command() -> Option<tokio::process::Command> {
    let exe = std::env::current_exe().ok()?;
    if exe.file_stem()? != BIN_NAME {
        return None;
    }
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg0(HOOKD_ARGV0);
    Some(cmd)
}

#[derive(Debug, Clone, clap::Args)]
#[command(
    long_about = "Measures ingest throughput and ack latency, plain-SQL baselines, dispatch \
throughput, end-to-end latency and claim cost on this machine, through the real API, outbox \
and dispatcher code, a load generator and a fast receiver, all on 127.0.0.1, and prints a \
table of figures with their conditions.\n\n\
Database: when DATABASE_URL is set, the bench creates a dedicated database \
hookd_bench_<pid>_<n> on that server (the role needs CREATEDB), works only in it and drops it \
at the end (also on error or Ctrl-C); the database DATABASE_URL names is never written. When \
DATABASE_URL is unset, a throwaway PostgreSQL cluster is started and removed.\n\n\
A full run takes about 3-4 minutes on 2 cores (it writes 2 M rows for the claim figures); --quick takes \
under a minute with smaller counts and shorter runs. Build with --release: debug figures \
mean nothing."
)]
pub struct BenchArgs {
    /// Server to run on (a dedicated database is created and dropped); unset: a throwaway cluster
    // hide_env_values: `--help` would print the URL, password included
    #[arg(long = "database-url", env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// A short run (under a minute): shorter windows, smaller backlogs and fills
    #[arg(long)]
    pub quick: bool,
    /// Only these sections (repeatable or comma-separated); default: all
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub only: Vec<Section>,
    /// Connections of each component's pool (the API's and the dispatcher's; the baselines use the API's size)
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub pool_size: u32,
    /// Make the receiver verify every signature (off by default: that is the receiver's CPU, not hookd's)
    #[arg(long)]
    pub verify_signatures: bool,
    /// Print the claim statement's EXPLAIN (ANALYZE, BUFFERS) at each claim point to stderr
    #[arg(long)]
    pub explain: bool,
    /// Windows (of a minute at full scale) of the `sustained` section, which runs only when
    /// named in --only; at least 2 (the last windows are compared with the first); default 15
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..))]
    pub sustained_minutes: Option<u32>,
    /// A tiny run for the test suite (seconds in a debug build)
    #[arg(long, hide = true)]
    pub smoke: bool,
}

impl BenchArgs {
    /// Defaults, for callers that build the arguments in code (tests).
    pub fn new(database_url: Option<String>) -> Self {
        BenchArgs {
            database_url,
            quick: false,
            only: Vec::new(),
            pool_size: 16,
            verify_signatures: false,
            explain: false,
            sustained_minutes: None,
            smoke: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Section {
    Ingest,
    Baselines,
    Dispatch,
    E2e,
    Claim,
    Endpoints,
    Consumers,
    Limits,
    Ordering,
    /// Only when named in --only: a long paced run (issue 13's steady state)
    Sustained,
    /// Only when named in --only: the dispatch section's trickle pair, five times
    Trickle,
    /// Only when named in --only: a model of the claim with its lease kept apart from
    /// the queue's indexed columns, against today's (issue 32)
    LeaseModel,
}

impl Section {
    pub const ALL: [Section; 9] = [
        Section::Ingest,
        Section::Baselines,
        Section::Dispatch,
        Section::E2e,
        Section::Claim,
        Section::Endpoints,
        Section::Consumers,
        Section::Limits,
        Section::Ordering,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Section::Ingest => "ingest",
            Section::Baselines => "baselines",
            Section::Dispatch => "dispatch",
            Section::E2e => "e2e",
            Section::Claim => "claim",
            Section::Endpoints => "endpoints",
            Section::Consumers => "consumers",
            Section::Limits => "limits",
            Section::Ordering => "ordering",
            Section::Sustained => "sustained",
            Section::Trickle => "trickle",
            Section::LeaseModel => "lease-model",
        }
    }
}

/// How big a run is.
#[derive(Debug, Clone)]
pub struct Scale {
    pub name: &'static str,
    pub warmup: Duration,
    pub window: Duration,
    pub concurrencies: Vec<usize>,
    pub batch_size: usize,
    pub payload_bytes: usize,
    pub dispatch_rows: i64,
    pub dispatch_endpoints: usize,
    pub dispatch_single_rows: i64,
    /// the drain over many endpoints (issue 13: 1,000)
    pub dispatch_many_endpoints: usize,
    pub dispatch_many_rows: i64,
    /// the customer-webhook shape (issue 27): this many endpoints with one due row each,
    /// drained beside the same number of rows over 1/200 as many endpoints
    pub dispatch_trickle_endpoints: usize,
    /// dispatcher processes for the multi-dispatcher drain
    pub dispatchers: usize,
    /// ordered delivery per key (issue 34): this many keys over this many endpoints (key
    /// k always to endpoint k mod endpoints), this many events in all
    pub ordering_keys: usize,
    pub ordering_endpoints: usize,
    pub ordering_rows: i64,
    /// active endpoint counts the claim and an idle dispatcher are measured at
    pub endpoint_counts: Vec<i64>,
    /// how long an idle dispatcher's Postgres CPU is sampled
    pub idle_window: Duration,
    pub e2e_rate: f64,
    pub e2e_window: Duration,
    /// the e2e row in the customer shape (issue 32): this many consumers with an endpoint
    /// each, every event addressed to the next of them
    pub e2e_customers: usize,
    pub claim_due: Vec<i64>,
    pub claim_terminal: i64,
    pub claim_endpoints: usize,
    pub claim_samples: usize,
    /// consumers (3 endpoints each) in one tenant for the fan-out rows (issue 15)
    pub consumer_count: i64,
    /// tenant-wide endpoint counts, each of its own event type, for the matching rows;
    /// the first is the baseline
    pub typed_endpoint_counts: Vec<i64>,
    /// the sustained section: paced rate, window length and number of windows
    pub sustained_rate: f64,
    pub sustained_window: Duration,
    pub sustained_windows: usize,
}

impl Scale {
    pub fn full() -> Scale {
        Scale {
            name: "full",
            warmup: Duration::from_millis(500),
            window: Duration::from_secs(5),
            concurrencies: vec![1, 16, 64],
            batch_size: 100,
            payload_bytes: 256,
            dispatch_rows: 100_000,
            dispatch_endpoints: 8,
            dispatch_single_rows: 30_000,
            dispatch_many_endpoints: 1_000,
            dispatch_many_rows: 30_000,
            dispatch_trickle_endpoints: 10_000,
            dispatchers: 4,
            ordering_keys: 10_000,
            ordering_endpoints: 100,
            ordering_rows: 30_000,
            endpoint_counts: vec![10, 20_000, 300_000],
            idle_window: Duration::from_secs(10),
            e2e_rate: 200.0,
            e2e_window: Duration::from_secs(15),
            e2e_customers: 1_000,
            claim_due: vec![0, 100_000, 1_000_000],
            claim_terminal: 1_000_000,
            claim_endpoints: 8,
            claim_samples: 50,
            consumer_count: 100_000,
            typed_endpoint_counts: vec![2, 1_000, 10_000],
            sustained_rate: 1_000.0,
            sustained_window: Duration::from_secs(60),
            sustained_windows: 15,
        }
    }

    pub fn quick() -> Scale {
        Scale {
            name: "quick",
            warmup: Duration::from_millis(200),
            window: Duration::from_millis(1000),
            dispatch_rows: 20_000,
            dispatch_single_rows: 5_000,
            dispatch_many_rows: 10_000,
            ordering_rows: 20_000,
            endpoint_counts: vec![10, 20_000],
            idle_window: Duration::from_secs(3),
            e2e_window: Duration::from_secs(3),
            claim_due: vec![0, 10_000, 100_000],
            claim_terminal: 100_000,
            claim_samples: 20,
            consumer_count: 10_000,
            sustained_window: Duration::from_secs(10),
            sustained_windows: 6,
            ..Scale::full()
        }
    }

    /// Seconds in a debug build: proves every section runs and the counts add up.
    pub fn smoke() -> Scale {
        Scale {
            name: "smoke",
            warmup: Duration::from_millis(30),
            window: Duration::from_millis(150),
            concurrencies: vec![1, 4],
            batch_size: 5,
            dispatch_rows: 300,
            dispatch_endpoints: 3,
            dispatch_single_rows: 100,
            dispatch_many_endpoints: 20,
            dispatch_many_rows: 200,
            dispatch_trickle_endpoints: 400,
            dispatchers: 2,
            ordering_keys: 50,
            ordering_endpoints: 5,
            ordering_rows: 150,
            endpoint_counts: vec![10, 500],
            idle_window: Duration::from_millis(300),
            e2e_rate: 100.0,
            e2e_window: Duration::from_millis(500),
            e2e_customers: 20,
            claim_due: vec![0, 200, 1_000],
            claim_terminal: 1_000,
            claim_endpoints: 4,
            claim_samples: 3,
            consumer_count: 50,
            typed_endpoint_counts: vec![2, 50, 100],
            sustained_rate: 100.0,
            sustained_window: Duration::from_millis(300),
            sustained_windows: 2,
            ..Scale::full()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("throwaway PostgreSQL: {0}")]
    TempPg(#[from] hookd::pgtemp::TempPgError),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("load generator: {0}")]
    Load(String),
    #[error("setup: {0}")]
    Setup(String),
    #[error("consistency check failed: {0}")]
    Check(String),
    #[error("interrupted")]
    Interrupted,
}

/// One figure of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub section: &'static str,
    pub figure: String,
    pub value: f64,
    pub unit: &'static str,
    /// secondary figures (latency percentiles, ratios)
    pub detail: String,
    pub conditions: String,
}

/// A count that must match: what was enqueued (or acked) against what arrived (or exists).
#[derive(Debug, Clone)]
pub struct Check {
    pub what: String,
    pub expected: u64,
    pub actual: u64,
}

impl Check {
    pub fn ok(&self) -> bool {
        self.expected == self.actual
    }
}

#[derive(Debug, Clone, Default)]
pub struct Report {
    pub header: Vec<(String, String)>,
    pub rows: Vec<Row>,
    pub checks: Vec<Check>,
    pub elapsed: Duration,
}

impl Report {
    pub fn row(&self, section: &str, figure_prefix: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.section == section && r.figure.starts_with(figure_prefix))
    }

    /// The table as printed.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (k, v) in &self.header {
            let _ = writeln!(out, "{k:<22} {v}");
        }
        let _ = writeln!(out);
        let fw = self
            .rows
            .iter()
            .map(|r| r.figure.len())
            .max()
            .unwrap_or(6)
            .max(6);
        let dw = self
            .rows
            .iter()
            .map(|r| r.detail.len())
            .max()
            .unwrap_or(6)
            .max(6);
        let _ = writeln!(
            out,
            "{:<9} {:<fw$} {:>12} {:<6} {:<dw$}  conditions",
            "section", "figure", "value", "unit", "detail"
        );
        let _ = writeln!(out, "{}", "-".repeat(9 + fw + 12 + 6 + dw + 16));
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{:<9} {:<fw$} {:>12} {:<6} {:<dw$}  {}",
                r.section,
                r.figure,
                format_value(r.value),
                r.unit,
                r.detail,
                r.conditions
            );
        }
        let _ = writeln!(out);
        for c in &self.checks {
            let _ = writeln!(
                out,
                "check {:<58} expected {:>9} got {:>9}  {}",
                c.what,
                c.expected,
                c.actual,
                if c.ok() { "ok" } else { "FAILED" }
            );
        }
        let _ = writeln!(out, "total time {:.1} s", self.elapsed.as_secs_f64());
        out
    }
}

fn format_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// What every section gets.
pub(crate) struct Ctx {
    pub pool: sqlx::PgPool,
    pub pool_settings: PoolSettings,
    pub database: String,
    pub keyring: Arc<Keyring>,
    /// the keyring's key as HOOKD_ENCRYPTION_KEY text, for dispatcher and API processes
    pub key_text: zeroize::Zeroizing<String>,
    /// the signing secret of every endpoint the bench declares (`whsec_…`)
    pub signing_secret: String,
    pub scale: Scale,
    pub args: BenchArgs,
    pub shutdown: CancellationToken,
}

impl Ctx {
    /// A fresh pool on the bench database (each component gets its own, as separate
    /// processes would).
    pub fn new_pool(&self) -> Result<sqlx::PgPool, BenchError> {
        Ok(hookd::db::connect_lazy_to(
            &self.pool_settings,
            Some(&self.database),
        )?)
    }
}

/// `hookd-bench`: runs the sections, prints the table, fails if a count check failed.
pub async fn run(args: BenchArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    if cfg!(debug_assertions) && !args.smoke {
        eprintln!(
            "hookd-bench: this is a debug build; figures are not representative (cargo run --release -p hookd-bench)"
        );
    }
    let report = run_report(args, shutdown).await?;
    println!("{}", report.render());
    let failed: Vec<&Check> = report.checks.iter().filter(|c| !c.ok()).collect();
    if !failed.is_empty() {
        anyhow::bail!("{} consistency check(s) failed", failed.len());
    }
    Ok(())
}

/// Runs the benchmark and returns the report (printed by [`run`]); progress goes to stderr.
pub async fn run_report(
    args: BenchArgs,
    shutdown: CancellationToken,
) -> Result<Report, BenchError> {
    let started = Instant::now();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let scale = if args.smoke {
        Scale::smoke()
    } else if args.quick {
        Scale::quick()
    } else {
        Scale::full()
    };
    let temp = match &args.database_url {
        Some(_) => None,
        None => {
            progress("DATABASE_URL is unset; starting a throwaway PostgreSQL");
            Some(TempPostgres::start().await?)
        }
    };
    let server_url = args
        .database_url
        .clone()
        .or_else(|| temp.as_ref().map(TempPostgres::url))
        .expect("a url or a throwaway cluster");
    let admin = hookd::db::connect_lazy(&PoolSettings {
        url: server_url.clone(),
        max_connections: 2,
        acquire_timeout: Duration::from_secs(10),
    })?;
    let database = format!(
        "hookd_bench_{}_{}",
        std::process::id(),
        rand::random::<u16>()
    );
    db::create_database(&admin, &database).await?;
    progress(&format!("created database {database}"));
    let pool_settings = PoolSettings {
        url: server_url,
        max_connections: args.pool_size,
        acquire_timeout: Duration::from_secs(10),
    };

    let outcome = async {
        let pool = hookd::db::connect_lazy_to(&pool_settings, Some(&database))?;
        let key_text = hookd::crypto::generate_key_text("bench");
        let keyring = Keyring::from_config("bench", &key_text, "bench-old", "")
            .map_err(|e| BenchError::Setup(e.to_string()))?;
        let ctx = Ctx {
            pool,
            pool_settings: pool_settings.clone(),
            database: database.clone(),
            keyring: Arc::new(keyring),
            key_text,
            signing_secret: sections::random_signing_secret(),
            scale,
            args,
            shutdown: shutdown.clone(),
        };
        tokio::select! {
            r = run_sections(&ctx) => r,
            _ = shutdown.cancelled() => Err(BenchError::Interrupted),
        }
    }
    .await;

    // Always drop what we created, whatever happened above: the lease model's database
    // too (IF EXISTS: most runs make none).
    let model = db::drop_database(&admin, &lease_model::database_name(&database)).await;
    let dropped = db::drop_database(&admin, &database).await.and(model);
    admin.close().await;
    if let Some(t) = temp
        && let Err(e) = t.shutdown().await
    {
        progress(&format!("could not remove the throwaway PostgreSQL: {e}"));
    }
    let mut report = outcome?;
    dropped?;
    progress(&format!("dropped database {database}"));
    report.elapsed = started.elapsed();
    Ok(report)
}

async fn run_sections(ctx: &Ctx) -> Result<Report, BenchError> {
    hookd::db::migrate(&ctx.pool).await?;
    let mut report = Report::default();
    let mut h = |k: &str, v: String| report.header.push((k.to_string(), v));
    h(
        "hookd",
        format!(
            "{} ({} build), scale {}",
            env!("CARGO_PKG_VERSION"),
            if cfg!(debug_assertions) {
                "DEBUG"
            } else {
                "release"
            },
            ctx.scale.name
        ),
    );
    h("machine", machine());
    for (k, v) in db::server_settings(&ctx.pool).await? {
        h(&format!("pg {k}"), v);
    }
    h(
        "database",
        format!(
            "{} on {} (dropped at the end)",
            ctx.database,
            if ctx.args.database_url.is_some() {
                "the DATABASE_URL server"
            } else {
                "a throwaway cluster (default postgresql.conf)"
            }
        ),
    );
    h(
        "pools",
        format!(
            "{} connections per component (API, dispatcher; baselines use one pool of the same size)",
            ctx.pool_settings.max_connections
        ),
    );
    let sections: Vec<Section> = if ctx.args.only.is_empty() {
        Section::ALL.to_vec()
    } else {
        Section::ALL
            .into_iter()
            .chain([Section::Sustained, Section::Trickle, Section::LeaseModel])
            .filter(|s| ctx.args.only.contains(s))
            .collect()
    };
    for s in sections {
        progress(&format!("section {}", s.name()));
        let t = Instant::now();
        match s {
            Section::Ingest => sections::ingest(ctx, &mut report).await?,
            Section::Baselines => sections::baselines(ctx, &mut report).await?,
            Section::Dispatch => sections::dispatch(ctx, &mut report).await?,
            Section::E2e => sections::e2e(ctx, &mut report).await?,
            Section::Claim => sections::claim(ctx, &mut report).await?,
            Section::Endpoints => sections::endpoint_scale(ctx, &mut report).await?,
            Section::Consumers => sections::consumers(ctx, &mut report).await?,
            Section::Limits => sections::limits(ctx, &mut report).await?,
            Section::Ordering => sections::ordering(ctx, &mut report).await?,
            Section::Sustained => sections::sustained(ctx, &mut report).await?,
            Section::Trickle => sections::trickle(ctx, &mut report).await?,
            Section::LeaseModel => lease_model::lease_model(ctx, &mut report).await?,
        }
        progress(&format!(
            "section {} done in {:.1} s",
            s.name(),
            t.elapsed().as_secs_f64()
        ));
    }
    Ok(report)
}

pub(crate) fn progress(msg: &str) {
    eprintln!("{BIN_NAME}: {msg}");
}

/// CPUs and memory of this machine, from std and /proc (Linux).
fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0 / 1024.0);
    let model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|c| {
        c.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
    });
    format!(
        "{cpus} CPUs{}, {} RAM; API, dispatcher, load generator, receiver and PostgreSQL all on this machine",
        model.map(|m| format!(" ({m})")).unwrap_or_default(),
        mem_gib
            .map(|g| format!("{g:.1} GiB"))
            .unwrap_or_else(|| "? GiB".into())
    )
}
