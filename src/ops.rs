//! The operations listener every component serves: `/healthz` (the process is up),
//! `/readyz` (it can do its work) and `/metrics` (Prometheus text, behind
//! `HOOKD_METRICS_TOKEN` when that is set). The API serves the same handlers on its own
//! port with their OpenAPI descriptions; the dispatcher, the controller and `hookd dev`
//! serve them here.

use std::time::Duration;

use axum::Router;
use axum::extract::{FromRef, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::domain::ErrorCode;
use crate::metrics::Metrics;

/// Serves `router` on `listener` until `shutdown` fires, then finishes in-flight requests.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Binds `listen` and serves `router` there (see [`serve_on`]).
pub async fn serve(
    listen: std::net::SocketAddr,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, "listening");
    serve_on(listener, router, shutdown).await
}

/// `GET /healthz`.
pub async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz` of a component whose work needs the database: ready while it answers.
pub async fn readyz(State(pool): State<PgPool>) -> Response {
    match tokio::time::timeout(Duration::from_secs(2), crate::db::ping(&pool)).await {
        Ok(Ok(())) => "ready".into_response(),
        _ => error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::DatabaseUnavailable,
            "the database is unavailable",
        ),
    }
}

/// `GET /metrics`: 401 unless the scrape token (if one is configured) is presented, in
/// exactly one Authorization header.
pub async fn metrics(State(m): State<Metrics>, headers: HeaderMap) -> Response {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (first, second) = (values.next(), values.next());
    if second.is_some() || !m.scrape_allowed(first.map(|v| v.as_bytes())) {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            ErrorCode::InvalidCredential,
            "the credential is malformed, unknown, revoked or expired",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(r#"Bearer realm="hookd", error="invalid_token""#),
        );
        return r;
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
        .into_response()
}

/// The documented error shape, `{"error": {"code", "message"}}`.
fn error(status: StatusCode, code: ErrorCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({"error": {"code": code.as_str(), "message": message}}).to_string(),
    )
        .into_response()
}

#[derive(Clone)]
struct DbHealth {
    pool: PgPool,
    metrics: Metrics,
}

impl FromRef<DbHealth> for Metrics {
    fn from_ref(s: &DbHealth) -> Self {
        s.metrics.clone()
    }
}

impl FromRef<DbHealth> for PgPool {
    fn from_ref(s: &DbHealth) -> Self {
        s.pool.clone()
    }
}

/// The operations routes of a component that is ready while the database answers (the
/// dispatcher, `hookd dev`'s dispatcher).
pub fn router(pool: PgPool, metrics: Metrics) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(self::metrics))
        .with_state(DbHealth { pool, metrics })
}

/// The operations routes of a component with its own idea of readiness (the controller:
/// its watches have synced). `ready` answers the status and a short body saying why.
pub fn router_with_readiness<F>(ready: F, metrics: Metrics) -> Router
where
    F: Fn() -> (StatusCode, String) + Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(move || async move { ready() }))
        .route("/metrics", get(self::metrics))
        .with_state(metrics)
}
