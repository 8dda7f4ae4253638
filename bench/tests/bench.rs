//! `hookd-bench` at a tiny scale (the hidden `--smoke`): every section runs through the
//! real API, dispatcher and claim code, the table has every row with sane numbers, the
//! counts add up (delivered == enqueued, acked == committed), and the dedicated database
//! is gone afterwards.

use hookd_bench::{BenchArgs, Report, Section, run_report};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

fn init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// A `postgres://` URL of the server behind `pool` (the bench creates its own database
/// there).
fn database_url(pool: &PgPool) -> String {
    let o = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        o.get_username(),
        o.get_host(),
        o.get_port(),
        o.get_database().unwrap_or("postgres")
    )
}

/// The bench's arguments for a tiny run (`--smoke`) of `only` (all sections when empty)
/// on the server behind `pool`.
fn smoke_args(pool: &PgPool, only: &[Section]) -> BenchArgs {
    let mut args = BenchArgs::new(Some(database_url(pool)));
    args.smoke = true;
    args.only = only.to_vec();
    args
}

/// The databases this process's bench runs made (`hookd_bench_<pid>_<n>`, the bench's
/// naming) that end in `suffix`: other tests run their benches beside this one.
async fn bench_databases(pool: &PgPool, suffix: &str) -> Vec<String> {
    let all: Vec<String> = sqlx::query_scalar(
        "SELECT datname::text FROM pg_database WHERE datname LIKE 'hookd_bench_%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mine = format!("hookd_bench_{}_", std::process::id());
    all.into_iter()
        .filter(|d| d.starts_with(&mine) && d.ends_with(suffix))
        .collect()
}

fn assert_row(report: &Report, section: &str, figure: &str) -> f64 {
    let row = report
        .row(section, figure)
        .unwrap_or_else(|| panic!("no row {section} / {figure}:\n{}", report.render()));
    assert!(
        row.value.is_finite() && row.value > 0.0,
        "{section} / {figure} = {}:\n{}",
        row.value,
        report.render()
    );
    assert!(
        !row.conditions.is_empty(),
        "{section} / {figure} has no conditions"
    );
    row.value
}

#[sqlx::test]
async fn smoke_run_has_every_row_and_counts_add_up(pool: PgPool) {
    init();
    let args = smoke_args(&pool, &[]);
    let report = run_report(args, CancellationToken::new()).await.unwrap();
    let table = report.render();

    for c in [1, 4] {
        for fanout in [1, 5] {
            assert_row(&report, "ingest", &format!("single c={c} fan-out {fanout}"));
            assert_row(
                &report,
                "ingest",
                &format!("batch(5) c={c} fan-out {fanout}"),
            );
        }
    }
    assert_row(&report, "ingest", "single c=4 fan-out 1 +auth");
    assert_row(&report, "baselines", "plain SQL 1 ev/tx c=4");
    assert_row(&report, "baselines", "plain SQL 64 ev/tx c=4");
    assert_row(&report, "baselines", "ratio ingest single / 1 ev/tx");
    assert_row(&report, "baselines", "ratio ingest batch / 64 ev/tx");
    assert_row(&report, "dispatch", "drain 300 to 3 endpoint(s)");
    assert_row(&report, "dispatch", "drain 100 to 1 endpoint(s)");
    // issue 13: several dispatchers, many endpoints, cost against the endpoint count
    assert_row(
        &report,
        "dispatch",
        "drain 300 to 3 endpoint(s), 2 dispatchers",
    );
    assert_row(&report, "dispatch", "drain 200 to 20 endpoint(s)");
    // issue 27: the trickle pair and its ratio
    assert_row(&report, "dispatch", "drain 400 to 2 endpoint(s)");
    assert_row(&report, "dispatch", "drain 400 to 400 endpoint(s)");
    assert_row(
        &report,
        "dispatch",
        "drain of 400 endpoints x 1 row against 2 endpoints x 200 rows",
    );
    assert_row(&report, "e2e", "fsync: synchronous commit p50");
    // issue 34: what a rate limit costs where it does not bind, and how it binds
    assert_row(
        &report,
        "limits",
        "limited where it does not bind / unlimited",
    );
    assert_row(
        &report,
        "limits",
        "most one endpoint received in a second (10/s, burst 5)",
    );
    // issue 34: ordered delivery per key beside unordered delivery, in one run
    for by in ["", ", 2 dispatchers"] {
        assert_row(
            &report,
            "ordering",
            &format!("drain 150 keyed to 5 endpoints, ordering none{by}"),
        );
        assert_row(
            &report,
            "ordering",
            &format!("drain 150 keyed to 5 endpoints, ordering perKey{by}"),
        );
        assert_row(&report, "ordering", &format!("perKey / none{by}"));
    }
    for count in [10, 500] {
        assert_row(
            &report,
            "endpoints",
            &format!("claim, nothing due, {count} endpoints"),
        );
        assert_row(
            &report,
            "endpoints",
            &format!("claim 100 rows, {count} endpoints"),
        );
        assert_row(
            &report,
            "endpoints",
            &format!("next_due, {count} endpoints"),
        );
        let idle = report
            .row("endpoints", &format!("idle dispatcher, {count} endpoints"))
            .unwrap_or_else(|| panic!("no idle dispatcher row:\n{table}"));
        assert!(!idle.conditions.is_empty());
    }
    let p50 = assert_row(&report, "e2e", "latency p50");
    let p99 = assert_row(&report, "e2e", "latency p99");
    assert!(p50 <= p99, "{table}");
    // issue 32: the same load addressed to many customers, an endpoint each
    assert_row(&report, "e2e", "latency p50, 20 customer endpoints");
    assert_row(&report, "e2e", "latency p99, 20 customer endpoints");
    for figure in ["0 due", "200 due", "1000 due", "1000 due + 1000 terminal"] {
        let row = report
            .rows
            .iter()
            .find(|r| r.section == "claim" && r.figure == figure)
            .unwrap_or_else(|| panic!("no claim row {figure}:\n{table}"));
        assert!(row.value > 0.0, "{table}");
    }
    // a claim with due rows leases some (4 endpoints x 32, or all that are left)
    assert!(
        report
            .rows
            .iter()
            .any(|r| r.figure == "1000 due" && r.detail.contains("128 rows/claim")),
        "{table}"
    );

    // the consistency checks: delivered == enqueued, acked == committed
    assert!(report.checks.len() >= 8, "{table}");
    for c in &report.checks {
        assert!(
            c.ok(),
            "{}: expected {} got {}\n{table}",
            c.what,
            c.expected,
            c.actual
        );
        assert!(c.expected > 0, "{}: nothing counted\n{table}", c.what);
    }
    for s in Section::ALL {
        assert!(
            report.rows.iter().any(|r| r.section == s.name()),
            "no {} rows:\n{table}",
            s.name()
        );
    }
    assert!(table.contains("synchronous_commit"), "{table}");

    // nothing left behind on the server
    let leftover = bench_databases(&pool, "").await;
    assert!(
        leftover.is_empty(),
        "bench database not dropped: {leftover:?}"
    );
}

#[sqlx::test]
async fn only_runs_the_named_sections(pool: PgPool) {
    init();
    let args = smoke_args(&pool, &[Section::Claim]);
    let report = run_report(args, CancellationToken::new()).await.unwrap();
    assert!(
        report.rows.iter().all(|r| r.section == "claim"),
        "{}",
        report.render()
    );
    assert_eq!(report.rows.len(), 4, "{}", report.render());
}

/// Flags whose value the bench could not honour are refused when parsed, with the range
/// in the message, instead of being raised silently (a run of `--sustained-minutes 0` ran
/// two windows).
#[test]
fn flags_out_of_range_are_refused() {
    use clap::Parser;
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }
    for (flag, value, range) in [
        ("--sustained-minutes", "0", "2.."),
        ("--sustained-minutes", "1", "2.."),
        ("--pool-size", "0", "1.."),
    ] {
        let err = Cli::try_parse_from(["hookd-bench", flag, value]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{err}");
        assert!(err.to_string().contains(range), "{flag} {value}: {err}");
    }
    let ok = Cli::try_parse_from([
        "hookd-bench",
        "--sustained-minutes",
        "2",
        "--pool-size",
        "1",
    ])
    .unwrap();
    assert_eq!(ok.bench.sustained_minutes, Some(2));
    assert_eq!(ok.bench.pool_size, 1);
}

/// The sustained section runs only when named, and reports every window and the last
/// windows against the first.
#[sqlx::test]
async fn sustained_runs_when_named(pool: PgPool) {
    init();
    let mut args = smoke_args(&pool, &[Section::Sustained]);
    args.sustained_minutes = Some(3);
    let report = run_report(args, CancellationToken::new()).await.unwrap();
    assert!(
        report.rows.iter().all(|r| r.section == "sustained"),
        "{}",
        report.render()
    );
    for w in 1..=3 {
        assert_row(&report, "sustained", &format!("window {w} throughput"));
    }
    assert_row(&report, "sustained", "throughput, last 1 / first 1 windows");
    assert_row(
        &report,
        "sustained",
        "latency p99, last 1 / first 1 windows",
    );
    // issue 32's WAL goal is per delivery at a steady rate: every window says it
    assert_row(
        &report,
        "sustained",
        "WAL per delivery, last 1 / first 1 windows",
    );
    for w in 1..=3 {
        let row = report
            .row("sustained", &format!("window {w} throughput"))
            .unwrap();
        assert!(row.detail.contains(" B per delivery"), "{}", row.detail);
    }
    assert!(report.checks.len() >= 3, "{}", report.render());
    assert!(
        report.checks.iter().all(|c| c.expected == c.actual),
        "{}",
        report.render()
    );
}

/// The lease model runs only when named, in a database of its own that is gone
/// afterwards: every variant drains every row, today's claim is never HOT (it moves
/// indexed columns) and the claim with its lease apart is, given room on the page.
#[sqlx::test]
async fn lease_model_runs_when_named(pool: PgPool) {
    init();
    let args = smoke_args(&pool, &[Section::LeaseModel]);
    let report = run_report(args, CancellationToken::new()).await.unwrap();
    assert!(
        report.rows.iter().all(|r| r.section == "lease-model"),
        "{}",
        report.render()
    );
    assert_eq!(report.checks.len(), 10, "{}", report.render());
    assert!(report.checks.iter().all(|c| c.ok()), "{}", report.render());
    for figure in [
        "WAL per delivery, lease in indexed columns (today), fillfactor 80",
        "WAL per delivery, lease apart, fillfactor 30",
        "WAL, lease apart, fillfactor 30 / lease in indexed columns (today), fillfactor 80",
    ] {
        assert_row(&report, "lease-model", figure);
    }
    let hot = |figure: &str| report.row("lease-model", figure).unwrap().value;
    assert_eq!(
        hot("claims HOT, lease in indexed columns (today), fillfactor 80"),
        0.0,
        "{}",
        report.render()
    );
    assert!(
        hot("claims HOT, lease apart, fillfactor 30") >= 90.0,
        "{}",
        report.render()
    );
    let left = bench_databases(&pool, "_model").await;
    assert!(left.is_empty(), "model databases left: {left:?}");
}

/// A run interrupted while the lease model works leaves neither database behind.
#[sqlx::test]
async fn an_interrupted_lease_model_leaves_no_database(pool: PgPool) {
    init();
    let args = smoke_args(&pool, &[Section::LeaseModel]);
    let stop = CancellationToken::new();
    let models = || bench_databases(&pool, "_model");
    // interrupt the run once the model's database exists (both polled by this task)
    let interrupt = async {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while models().await.is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the model's database never appeared"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        stop.cancel();
    };
    let (outcome, ()) = tokio::join!(run_report(args, stop.clone()), interrupt);
    assert!(outcome.is_err(), "an interrupted run reports it");
    let left = models().await;
    assert!(left.is_empty(), "left: {left:?}");
    let bench = bench_databases(&pool, "").await;
    assert!(bench.is_empty(), "left: {bench:?}");
}

/// The trickle section runs only when named: the dispatch section's trickle pair five
/// times over, each pair's ratio and their median, every delivery counted, and each
/// drain's WAL per delivery.
#[sqlx::test]
async fn trickle_runs_when_named(pool: PgPool) {
    init();
    let args = smoke_args(&pool, &[Section::Trickle]);
    let report = run_report(args, CancellationToken::new()).await.unwrap();
    assert!(
        report.rows.iter().all(|r| r.section == "trickle"),
        "{}",
        report.render()
    );
    assert_eq!(report.rows.len(), 5 * 3 + 1, "{}", report.render());
    for round in 1..=5 {
        assert_row(
            &report,
            "trickle",
            &format!("round {round}: 400 endpoints x 1 row"),
        );
    }
    assert_row(&report, "trickle", "median of 5: 400 endpoints x 1 row");
    // issue 32's interface: every drain row says the WAL written per delivery
    let drains: Vec<_> = report
        .rows
        .iter()
        .filter(|r| r.figure.starts_with("drain "))
        .collect();
    assert_eq!(drains.len(), 10, "{}", report.render());
    for r in drains {
        let wal: f64 = r
            .detail
            .split("WAL ")
            .nth(1)
            .and_then(|w| w.strip_suffix(" B per delivery"))
            .and_then(|b| b.parse().ok())
            .unwrap_or_else(|| panic!("no WAL per delivery in {:?}", r.detail));
        assert!(wal > 0.0, "{:?}", r.detail);
    }
    assert_eq!(report.checks.len(), 10 * 2, "{}", report.render());
    assert!(
        report.checks.iter().all(|c| c.expected == c.actual),
        "{}",
        report.render()
    );
}

/// `hookd-bench --help` never prints the value of DATABASE_URL (a password).
#[test]
fn help_hides_the_database_password() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookd-bench"))
        .arg("--help")
        .env("DATABASE_URL", "postgres://hookd:hunter2@db:5432/hookd")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--database-url"), "{help}");
    assert!(!help.contains("hunter2"), "{help}");
}
