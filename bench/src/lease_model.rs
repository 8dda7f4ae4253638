//! The `lease-model` section (only when named): what a claim would cost if the lease
//! were kept apart from the queue partition's indexed columns, measured on hookd's own
//! tables and indexes rather than argued (issue 32).
//!
//! Today's claim moves a row's `status` and `visible_at`, which indexes hold, so its
//! update can never be HOT: every index of the queue partition gets a new entry. The
//! model drains the same rows twice over, once with that claim and once with a claim
//! that writes its lease into a column no index holds, and reads the server's own
//! counters: WAL, Postgres CPU, and the share of claims that were HOT. It is a model,
//! not hookd's code: one backend claims and completes, and what both designs share
//! (queue triggers, attempt rows, the endpoint row) is left out of both.

use super::{BenchError, Check, Ctx, Report, Row};
use crate::load::mean_of_all;
use crate::{cpu, db};

/// (lease apart from the indexed columns, the queue partition's fillfactor)
const VARIANTS: [(bool, i32); 5] = [(false, 80), (true, 80), (true, 50), (true, 30), (false, 30)];
/// The rows of [`VARIANTS`] compared at the end: today's claim and the design.
const TODAY: usize = 0;
const DESIGN: usize = 3;
/// Each variant drains this often, the variants interleaved.
const ROUNDS: usize = 2;
/// Batches of 32 in flight while the next are claimed (32 per endpoint over 8).
const DEPTH: i32 = 8;

fn label(apart: bool, fillfactor: i32) -> String {
    if apart {
        format!("lease apart, fillfactor {fillfactor}")
    } else {
        format!("lease in indexed columns (today), fillfactor {fillfactor}")
    }
}

#[derive(Debug, Clone, Copy)]
struct Run {
    wal: Option<f64>,
    postgres_us: Option<f64>,
    hot_share: f64,
}

/// The model's own database beside the bench's `database`.
pub(crate) fn database_name(database: &str) -> String {
    format!("{database}_model")
}

/// The section. Its database is dropped where the bench's own is, at the end of the run
/// whatever happened (`run_report`), so an error or an interruption leaves none behind.
pub(crate) async fn lease_model(ctx: &Ctx, report: &mut Report) -> Result<(), BenchError> {
    let name = database_name(&ctx.database);
    db::create_database(&ctx.pool, &name).await?;
    measure(ctx, &name, report).await
}

async fn measure(ctx: &Ctx, name: &str, report: &mut Report) -> Result<(), BenchError> {
    let settings = hookd::db::PoolSettings {
        max_connections: 2,
        ..ctx.pool_settings.clone()
    };
    let pool = hookd::db::connect_lazy_to(&settings, Some(name))?;
    let outcome = async {
        let (rows, endpoints) = (ctx.scale.dispatch_rows, ctx.scale.dispatch_endpoints);
        hookd::db::migrate(&pool).await?;
        let mut conn = pool
            .acquire()
            .await
            .map_err(hookd::db::DbError::from)?;
        hookd::db::retention::ensure_history_days(&mut conn, 1).await?;
        db::model_prepare(&pool, endpoints as i64).await?;
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); VARIANTS.len()];
        let mut checkpointed = true;
        for round in 1..=ROUNDS {
            for (i, &(apart, fillfactor)) in VARIANTS.iter().enumerate() {
                checkpointed &= db::model_fill(&pool, fillfactor, rows).await?;
                let meter = cpu::Meter::start(&pool, &[]).await;
                let drain = db::model_drain(&mut conn, apart, DEPTH).await?;
                let spent = meter.stop(&pool).await;
                report.checks.push(Check {
                    what: format!(
                        "lease model round {round}, {}: rows moved to history == rows",
                        label(apart, fillfactor)
                    ),
                    expected: rows as u64,
                    actual: drain.succeeded as u64,
                });
                let n = rows.max(1) as f64;
                runs[i].push(Run {
                    wal: spent.wal_bytes.map(|b| b / n),
                    postgres_us: spent.postgres.map(|s| s / n * 1e6),
                    hot_share: drain.hot_updates as f64 / drain.updates.max(1) as f64,
                });
            }
        }
        let conditions = format!(
            "a model on hookd's tables and indexes, not hookd's code: {rows} due rows over {endpoints} endpoints, one backend claiming up to 32 rows of the next endpoint per transaction (FOR UPDATE SKIP LOCKED), each batch moved to history when {DEPTH} newer ones are out; no queue triggers, attempt rows or endpoint writes in either; synchronous_commit off; {} {ROUNDS} rounds, the variants interleaved",
            if checkpointed {
                "each drain after a CHECKPOINT;"
            } else {
                "no CHECKPOINT (the role may not);"
            }
        );
        let mut means = Vec::new();
        for (i, &(apart, fillfactor)) in VARIANTS.iter().enumerate() {
            let r = &runs[i];
            let wal = mean_of_all(r.iter().map(|r| r.wal));
            let cpu = mean_of_all(r.iter().map(|r| r.postgres_us));
            let hot = mean_of_all(r.iter().map(|r| Some(r.hot_share))).unwrap_or(0.0);
            let each: Vec<String> = r
                .iter()
                .map(|r| r.wal.map_or("n/a".into(), |b| format!("{b:.0}")))
                .collect();
            report.rows.push(Row {
                section: "lease-model",
                figure: format!("WAL per delivery, {}", label(apart, fillfactor)),
                value: wal.unwrap_or(f64::NAN),
                unit: "B",
                detail: format!(
                    "runs {} B; Postgres {} per delivery",
                    each.join(", "),
                    cpu.map_or("CPU not measured".into(), |us| format!("{us:.0} us")),
                ),
                conditions: conditions.clone(),
            });
            report.rows.push(Row {
                section: "lease-model",
                figure: format!("claims HOT, {}", label(apart, fillfactor)),
                value: hot * 100.0,
                unit: "%",
                detail: "updates of the queue partition that wrote no index entry".into(),
                conditions: conditions.clone(),
            });
            means.push((wal, cpu));
        }
        // the design against today, both as measured above
        let (today, best) = (means[TODAY], means[DESIGN]);
        for (what, a, b, unit) in [
            ("WAL", today.0, best.0, "B"),
            ("Postgres CPU", today.1, best.1, "us"),
        ] {
            if let (Some(a), Some(b)) = (a, b) {
                report.rows.push(Row {
                    section: "lease-model",
                    figure: format!(
                        "{what}, {} / {}",
                        label(VARIANTS[DESIGN].0, VARIANTS[DESIGN].1),
                        label(VARIANTS[TODAY].0, VARIANTS[TODAY].1)
                    ),
                    value: b / a.max(f64::MIN_POSITIVE),
                    unit: "x",
                    detail: format!("{b:.0} / {a:.0} {unit} per delivery"),
                    conditions: conditions.clone(),
                });
            }
        }
        Ok::<(), BenchError>(())
    }
    .await;
    pool.close().await;
    outcome
}
