//! Process plumbing shared by every subcommand: logging, signals, database start-up.

use std::future::Future;

use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{DbArgs, LogFormat};
use crate::db;

/// Logs to stderr at `filter`, and traces over OTLP when the environment asks for them
/// (`telemetry`; hold the returned value until the process ends, so the last spans are
/// flushed). `service` names the process in traces.
pub fn init_tracing(filter: &str, format: LogFormat, service: &str) -> crate::telemetry::Exporting {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Json => logs.json().with_filter(filter).boxed(),
        LogFormat::Text => logs.with_filter(filter).boxed(),
    };
    // the log filter does not apply to spans: HOOKD_LOG=warn must not turn traces off
    let (otlp, exporting) = crate::telemetry::layer(service);
    let otlp = otlp.map(|l| {
        l.with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(crate::telemetry::TARGET, tracing::Level::INFO),
        )
    });
    tracing_subscriber::registry().with(logs).with(otlp).init();
    exporting
}

/// A token cancelled on the first SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("install SIGTERM handler");
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutdown requested");
        t.cancel();
    });
    token
}

/// How often [`spawn_heap_trim`] hands freed heap back to the system.
const HEAP_TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// Hands the heap glibc keeps after a burst back to the system, every 30 s until
/// `shutdown`. glibc's malloc keeps freed memory inside its heaps: from outside, 4,000
/// connections held against `hookd api` for a minute left it at 105-128 MB with about
/// 1 MB of it in use (the level of the next burst, not a leak), and `malloc_trim`
/// returned it to 37 MB. A trim is a few milliseconds of the allocator's locks. A no-op
/// on other C libraries.
pub fn spawn_heap_trim(shutdown: CancellationToken) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(HEAP_TRIM_EVERY) => {}
                _ = shutdown.cancelled() => return,
            }
            // SAFETY: malloc_trim only walks and shrinks glibc's own heaps, under their locks.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    });
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (shutdown, HEAP_TRIM_EVERY);
}

/// Connects and refuses to go on with an unmigrated or newer schema.
pub async fn open_checked(db_args: &DbArgs) -> anyhow::Result<PgPool> {
    db::set_pooler(db_args.database_pooler);
    let pool = db::connect_checked(&db_args.pool_settings()).await?;
    db::check_schema(&pool).await?;
    if let Ok(Some(warning)) = db::autovacuum_warning(&pool).await {
        tracing::warn!("{warning}");
    }
    Ok(pool)
}

/// An error and its causes on one line, each cause once: layered errors often repeat
/// their source in their own message, and `{:#}` would then print it two or three times.
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

/// A listener that could not be bound, named with what wanted it and the flag and
/// variable that move it: "Address already in use (os error 98)" alone says neither.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} for the {what} ({flag}): {source}; {}", listen_hint(.source))]
pub struct ListenError {
    pub addr: std::net::SocketAddr,
    pub what: &'static str,
    pub flag: &'static str,
    #[source]
    pub source: std::io::Error,
}

fn listen_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => "stop what is using it or choose another address",
        std::io::ErrorKind::PermissionDenied => {
            "ports below 1024 need privileges; choose another port"
        }
        std::io::ErrorKind::AddrNotAvailable => {
            "that address is not one of this machine's; choose another (0.0.0.0 for every interface)"
        }
        _ => "choose another address",
    }
}

/// Binds `addr` for the component `what`, whose address is set by `flag`.
pub async fn bind(
    addr: std::net::SocketAddr,
    what: &'static str,
    flag: &'static str,
) -> Result<tokio::net::TcpListener, ListenError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ListenError {
            addr,
            what,
            flag,
            source,
        })
}

/// A process's background duties (maintenance that runs beside its main loop): each is
/// started here under a name, runs until the shutdown token it was given is cancelled, and
/// all are awaited together by [`Duties::join`]: the process exits only after each has
/// returned (the pruner abandons a pass on shutdown, its transaction rolling back; the
/// others finish the statement they are in), and none outlives it unnoticed.
#[derive(Default)]
pub struct Duties {
    running: JoinSet<&'static str>,
}

impl Duties {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts `duty`, which must return once its shutdown token is cancelled.
    pub fn start<F>(&mut self, name: &'static str, duty: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tracing::debug!(duty = name, "background duty started");
        self.running.spawn(async move {
            duty.await;
            name
        });
    }

    /// How many are still running.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Waits for every duty to return (after the shutdown it watches). One that panicked
    /// is logged; the others are still awaited.
    pub async fn join(mut self) {
        while let Some(done) = self.running.join_next().await {
            match done {
                Ok(name) => tracing::debug!(duty = name, "background duty stopped"),
                Err(e) => tracing::error!(error = %e, "a background duty failed"),
            }
        }
    }
}

#[cfg(test)]
mod duties_tests {
    use super::Duties;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio_util::sync::CancellationToken;

    /// `join` returns only when every duty has finished its work after the shutdown,
    /// including one that takes a while to wind down, and survives one that panics.
    #[tokio::test]
    async fn join_waits_for_every_duty_to_wind_down() {
        let shutdown = CancellationToken::new();
        let finished = Arc::new(AtomicUsize::new(0));
        let mut duties = Duties::new();
        for wind_down_ms in [0u64, 50, 200] {
            let (stop, done) = (shutdown.clone(), finished.clone());
            duties.start("test", async move {
                stop.cancelled().await;
                tokio::time::sleep(std::time::Duration::from_millis(wind_down_ms)).await;
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        duties.start("panics", async { panic!("a duty that fails") });
        assert_eq!(duties.len(), 4);
        shutdown.cancel();
        duties.join().await;
        assert_eq!(finished.load(Ordering::SeqCst), 3);
    }
}
