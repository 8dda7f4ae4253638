//! The benchmark's receiver: answers every POST 204 at once, counts deliveries and
//! records each `webhook-id` with its arrival time (for end-to-end latency and for the
//! delivered == enqueued check). Signature verification is off unless asked for
//! (`--verify-signatures`): it is the receiver's cost, not hookd's.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use hookd::signing::SigningSecret;

#[derive(Default)]
struct Shared {
    arrivals: Mutex<Vec<(Uuid, Instant)>>,
    /// deliveries whose webhook-id was missing or not a UUID
    malformed: std::sync::atomic::AtomicU64,
    /// deliveries that failed verification (only with verification on)
    bad_signatures: std::sync::atomic::AtomicU64,
    verify: Option<SigningSecret>,
}

#[derive(Clone)]
pub struct FastReceiver {
    shared: Arc<Shared>,
    pub addr: SocketAddr,
}

impl FastReceiver {
    /// Serves on an ephemeral 127.0.0.1 port until `shutdown`. With `verify`, every
    /// delivery's signature is checked against that secret (failures are answered 401
    /// and counted).
    pub async fn start(
        verify: Option<SigningSecret>,
        shutdown: CancellationToken,
    ) -> std::io::Result<FastReceiver> {
        let shared = Arc::new(Shared {
            verify,
            ..Shared::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let router = Router::new()
            .fallback(axum::routing::post(deliver))
            .with_state(shared.clone());
        let limits = hookd::api::server::ListenerLimits {
            header_timeout: Duration::from_secs(60),
            max_connections: 4096,
            max_head_bytes: 64 * 1024,
        };
        tokio::spawn(hookd::api::server::serve_api_on(
            listener, router, limits, shutdown,
        ));
        Ok(FastReceiver { shared, addr })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Deliveries received (duplicates included).
    pub fn count(&self) -> usize {
        self.shared.arrivals.lock().expect("receiver lock").len()
    }

    /// Takes every (webhook id, arrival) recorded so far, leaving none.
    pub fn take(&self) -> Vec<(Uuid, Instant)> {
        std::mem::take(&mut *self.shared.arrivals.lock().expect("receiver lock"))
    }

    pub fn malformed(&self) -> u64 {
        self.shared
            .malformed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn bad_signatures(&self) -> u64 {
        self.shared
            .bad_signatures
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

async fn deliver(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let at = Instant::now();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Some(id) = header("webhook-id").and_then(|v| v.parse::<Uuid>().ok()) else {
        shared
            .malformed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return StatusCode::BAD_REQUEST;
    };
    if let Some(secret) = &shared.verify {
        let verified = hookd::signing::verify(
            secret,
            header("webhook-id"),
            header("webhook-timestamp"),
            header("webhook-signature"),
            &body,
            chrono::Utc::now().timestamp(),
        );
        if verified.is_err() {
            shared
                .bad_signatures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return StatusCode::UNAUTHORIZED;
        }
    }
    shared
        .arrivals
        .lock()
        .expect("receiver lock")
        .push((id, at));
    StatusCode::NO_CONTENT
}
