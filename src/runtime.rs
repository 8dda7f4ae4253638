//! Process plumbing shared by every subcommand: logging, signals, database start-up.

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::config::{DbArgs, LogFormat};
use crate::db;

pub fn init_tracing(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
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
