//! The HTTP API: `app(state)` builds the router; `run` serves it until shutdown.

mod body;
mod deliveries;
pub mod error;
mod messages;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::outbox::Outbox;
use error::ApiError;

/// Request limits (all configurable, see `ApiArgs`).
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_payload_bytes: usize,
    pub max_body_bytes: usize,
    pub max_batch: usize,
    pub max_batch_body_bytes: usize,
}

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub outbox: Outbox,
    pub notifier: Notifier,
    pub metrics: Metrics,
    pub limits: Limits,
}

pub fn app(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/messages", post(messages::create))
        .route("/v1/messages/batch", post(messages::create_batch))
        .route("/v1/messages/{id}", get(messages::get))
        .route("/v1/deliveries/{id}", get(deliveries::get))
        .route("/v1/deliveries/{id}/replay", post(deliveries::replay))
        .route(
            "/v1/endpoints/{id}/replay",
            post(deliveries::replay_endpoint),
        )
        .route("/v1/dead-letters", get(deliveries::dead_letters));
    v1.merge(health_routes())
        .fallback(|| async { ApiError::not_found("route") })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

/// `/healthz`, `/readyz` and `/metrics`, shared by every component that serves HTTP.
pub fn health_routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Metrics: axum::extract::FromRef<S>,
    PgPool: axum::extract::FromRef<S>,
{
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

impl axum::extract::FromRef<AppState> for Metrics {
    fn from_ref(s: &AppState) -> Self {
        s.metrics.clone()
    }
}

impl axum::extract::FromRef<AppState> for PgPool {
    fn from_ref(s: &AppState) -> Self {
        s.pool.clone()
    }
}

async fn readyz(State(pool): State<PgPool>) -> Response {
    match tokio::time::timeout(Duration::from_secs(2), crate::db::ping(&pool)).await {
        Ok(Ok(())) => "ready".into_response(),
        _ => ApiError::unavailable().into_response(),
    }
}

async fn metrics(State(m): State<Metrics>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
        .into_response()
}

async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = match req.extensions().get::<MatchedPath>().map(|p| p.as_str()) {
        Some("/v1/messages") => "messages",
        Some("/v1/messages/batch") => "messages_batch",
        Some("/v1/messages/{id}") => "message_get",
        Some("/v1/deliveries/{id}") => "delivery_get",
        Some("/v1/deliveries/{id}/replay") => "delivery_replay",
        Some("/v1/endpoints/{id}/replay") => "endpoint_replay",
        Some("/v1/dead-letters") => "dead_letters",
        Some(_) => "other",
        None => "unmatched",
    };
    let resp = next.run(req).await;
    state
        .metrics
        .http_requests
        .get_or_create(&crate::metrics::RouteStatus {
            route,
            status: resp.status().as_u16(),
        })
        .inc();
    resp
}

pub(crate) fn parse_id(raw: &str, what: &str) -> Result<Uuid, ApiError> {
    raw.parse::<Uuid>().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_id",
            format!("{what} id {raw:?} is not a UUID"),
        )
    })
}

/// Serves `router` on `listen` until `shutdown` fires, then finishes in-flight requests.
pub async fn serve(
    listen: SocketAddr,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, "listening");
    serve_on(listener, router, shutdown).await
}

pub async fn serve_on(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// `hookd api`: the ingest pipeline plus the router, until `shutdown`.
pub async fn run(
    pool: PgPool,
    settings: crate::config::ApiSettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let metrics = Metrics::new();
    let notifier = if settings.notify {
        Notifier::spawn(pool.clone(), Duration::from_millis(2), shutdown.clone())
    } else {
        Notifier::disabled()
    };
    let outbox = Outbox::start(
        pool.clone(),
        crate::outbox::OutboxConfig {
            committers: settings.ingest_committers,
            max_group: settings.ingest_max_group,
        },
        notifier.clone(),
        metrics.clone(),
    );
    let state = AppState {
        pool,
        outbox,
        notifier,
        metrics,
        limits: settings.limits(),
    };
    serve(settings.listen, app(state), shutdown).await?;
    Ok(())
}

/// State of the health-only router that non-API components serve.
#[derive(Clone)]
struct HealthState {
    pool: PgPool,
    metrics: Metrics,
}

impl axum::extract::FromRef<HealthState> for Metrics {
    fn from_ref(s: &HealthState) -> Self {
        s.metrics.clone()
    }
}

impl axum::extract::FromRef<HealthState> for PgPool {
    fn from_ref(s: &HealthState) -> Self {
        s.pool.clone()
    }
}

/// `/healthz`, `/readyz`, `/metrics` for components without the API (the dispatcher).
pub fn health_app(pool: PgPool, metrics: Metrics) -> Router {
    health_routes().with_state(HealthState { pool, metrics })
}
