//! The API's listener: HTTP/1.1 on hyper with the limits `axum::serve` does not offer.
//!
//! - A header-read timeout, started whenever a connection is waiting for a request head
//!   (fresh, or idle after a response): a client that dribbles its headers, or opens a
//!   connection and sends nothing, is disconnected; it is also the keep-alive idle timeout.
//! - A cap on a request head's size (hyper answers 431); the JSON 414/431 of
//!   `limits::enforce` handle the ordinary cases well below it.
//! - A cap on open connections: at the cap, the accept loop waits, so further clients
//!   queue in the kernel's listen backlog instead of taking file descriptors and memory.
//!
//! Only HTTP/1.1 is served: producers and curl speak it, TLS and any HTTP/2 are terminated
//! in front of the API (ingress or mesh), and one protocol means one set of timeouts.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct ListenerLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
    pub max_head_bytes: usize,
}

/// Serves `router` until `shutdown` fires; then stops accepting, lets requests in flight
/// finish (each is bounded by the request timeout), closes idle connections and returns.
pub async fn serve_api_on(
    listener: TcpListener,
    router: Router,
    limits: ListenerLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // hyper needs its read buffer to hold a whole head
        .max_buf_size(limits.max_head_bytes.max(8192) + 8192)
        .max_header_size(limits.max_head_bytes);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => p.expect("semaphore never closed"),
            _ = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning on the error
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let conn = http.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(router.clone()),
        );
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.as_mut().await
                }
            };
            if let Err(e) = result {
                // timeouts, resets and malformed requests: the client's problem, not ours
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    // refuse new clients at once rather than leaving them in the backlog, then wait for
    // the connections still open: each holds a permit until it is done
    drop(listener);
    let _ = connections
        .acquire_many(limits.max_connections as u32)
        .await;
    Ok(())
}
