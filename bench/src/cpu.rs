//! CPU time of the processes a figure depends on, read from /proc: how much of the
//! machine's cores PostgreSQL, the dispatcher processes and this process (the receiver)
//! spent on a run, so the bench can say per delivery where the time goes and what the
//! cores allow at most; and the write-ahead log the server wrote meanwhile.

use std::collections::HashMap;

use sqlx::PgPool;

/// CPU seconds (user + system) of one process so far; `None` when it cannot be read.
pub(crate) fn process_seconds(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // fields after the command name, which is in parentheses and may hold spaces
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ, 100 on every Linux build
    Some(ticks as f64 / 100.0)
}

/// CPU seconds of these processes together; `None` when any cannot be read (the server
/// is elsewhere).
pub(crate) fn cpu_seconds(pids: &[i32]) -> Option<f64> {
    pids.iter().map(|p| process_seconds(*p)).sum()
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    // state, then ppid
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The server's postmaster and every process it started (backends, WAL writer,
/// checkpointer, autovacuum), when the server runs on this machine and its data directory
/// is readable here; `None` otherwise.
pub(crate) async fn postgres_processes(pool: &PgPool) -> Option<Vec<i32>> {
    let dir: String = sqlx::query_scalar("SHOW data_directory")
        .fetch_one(pool)
        .await
        .ok()?;
    let pid_file = std::fs::read_to_string(format!("{dir}/postmaster.pid")).ok()?;
    let postmaster: i32 = pid_file.lines().next()?.trim().parse().ok()?;
    let mut pids = vec![postmaster];
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        if let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            && parent_of(pid) == Some(postmaster)
        {
            pids.push(pid);
        }
    }
    Some(pids)
}

/// CPU spent by PostgreSQL, the dispatchers and this process between [`Meter::start`] and
/// [`Meter::stop`].
pub(crate) struct Meter {
    postgres: Option<HashMap<i32, f64>>,
    dispatchers: Vec<(i32, f64)>,
    own: Option<f64>,
    wal_from: Option<String>,
}

/// CPU seconds spent over a run, by whom.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spent {
    pub postgres: Option<f64>,
    pub dispatchers: Option<f64>,
    pub own: Option<f64>,
    /// write-ahead log of the whole server, bytes: on a server the bench does not have to
    /// itself, other databases' writes count too
    pub wal_bytes: Option<f64>,
}

async fn postgres_snapshot(pool: &PgPool) -> Option<HashMap<i32, f64>> {
    let pids = postgres_processes(pool).await?;
    Some(
        pids.into_iter()
            .filter_map(|p| Some((p, process_seconds(p)?)))
            .collect(),
    )
}

impl Meter {
    /// `dispatchers`: pids of dispatcher processes (empty when they run in this process).
    pub(crate) async fn start(pool: &PgPool, dispatchers: &[i32]) -> Meter {
        Meter {
            postgres: postgres_snapshot(pool).await,
            dispatchers: dispatchers
                .iter()
                .map(|p| (*p, process_seconds(*p).unwrap_or(0.0)))
                .collect(),
            own: process_seconds(std::process::id() as i32),
            wal_from: crate::db::wal_position(pool).await.ok(),
        }
    }

    pub(crate) async fn stop(self, pool: &PgPool) -> Spent {
        // backends started during the run (a dispatcher's pool connects lazily) count
        // from zero; one that ended during the run is missed (none do: pools keep theirs)
        let postgres = self
            .postgres
            .zip(postgres_snapshot(pool).await)
            .map(|(before, after)| {
                after
                    .iter()
                    .map(|(pid, s)| s - before.get(pid).copied().unwrap_or(0.0))
                    .sum()
            });
        let dispatchers = if self.dispatchers.is_empty() {
            None
        } else {
            self.dispatchers
                .iter()
                .map(|(pid, before)| process_seconds(*pid).map(|s| s - before))
                .sum()
        };
        let wal_bytes = match &self.wal_from {
            Some(from) => crate::db::wal_bytes_since(pool, from).await.ok(),
            None => None,
        };
        Spent {
            postgres,
            dispatchers,
            own: self
                .own
                .zip(process_seconds(std::process::id() as i32))
                .map(|(b, a)| a - b),
            wal_bytes,
        }
    }
}

impl Spent {
    /// "Postgres 61 µs, dispatcher 40 µs, receiver 12 µs per delivery: 113 µs, at most
    /// 17,700/s on 2 cores; WAL 2,310 B per delivery" (parts not measurable are left out
    /// and said so).
    pub(crate) fn per_item(&self, items: u64, own_label: &str) -> String {
        let n = items.max(1) as f64;
        let us = |s: f64| s / n * 1e6;
        let mut parts = Vec::new();
        let mut total = 0.0;
        for (label, v) in [
            ("Postgres", self.postgres),
            ("dispatcher", self.dispatchers),
            (own_label, self.own),
        ] {
            match v {
                Some(s) => {
                    parts.push(format!("{label} {:.0} us", us(s)));
                    total += us(s);
                }
                None => parts.push(format!("{label} not measured")),
            }
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let wal = match self.wal_bytes {
            Some(b) => format!("WAL {:.0} B per delivery", b / n),
            None => "WAL not measured".to_string(),
        };
        format!(
            "CPU per delivery: {} = {:.0} us, so at most {:.0}/s on {cores} cores; {wal}",
            parts.join(", "),
            total,
            cores as f64 / total.max(0.001) * 1e6
        )
    }
}
