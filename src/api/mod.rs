//! The HTTP API: `app(state)` builds the router; `run` serves it until shutdown.

mod body;
mod caller;
mod consumers;
pub mod deletions;
mod deliveries;
mod endpoints;
pub mod error;
mod event_types;
mod inbound;
pub mod limits;
mod listing;
mod messages;
pub mod openapi;
pub mod server;
mod sessions;
mod settings;
mod sources;
mod tokens;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::auth::{AuthMode, Authenticator, ServiceAccounts};
use crate::config::ApiSettings;
use crate::domain::ErrorCode;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::outbox::Outbox;
use error::ApiError;
use limits::{IngestBudget, TenantRateLimiter};
pub use messages::{IngestRoute, parse_ingest_body};

/// Request limits (all configurable, see `ApiSettings`).
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_payload_bytes: usize,
    pub max_body_bytes: usize,
    pub max_batch: usize,
    pub max_batch_body_bytes: usize,
    pub request_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_url_bytes: usize,
}

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub outbox: Outbox,
    pub notifier: Notifier,
    pub metrics: Metrics,
    pub limits: Limits,
    pub auth: Authenticator,
    /// `None`: no per-tenant ingest limit
    pub rate_limiter: Option<Arc<TenantRateLimiter>>,
    /// request-body bytes in flight, per tenant and per process
    pub ingest_budget: Arc<IngestBudget>,
    /// `POST /in/{name}`'s bytes in flight before a signature is checked: a quarter of the
    /// process's, a source's share a quarter of a tenant's
    pub inbound_budget: Arc<IngestBudget>,
    /// what the endpoints API needs beyond the database
    pub manage: Arc<ManageDeps>,
    /// who may embed the customer portal (`HOOKD_PORTAL_FRAME_ANCESTORS`)
    pub portal_frame_ancestors: crate::domain::FrameAncestors,
    /// per consumer (`tenant\nuid`): the rate of consumer-token work, apart from the
    /// tenant's ingest rate (`HOOKD_CONSUMER_RATE_LIMIT`)
    pub consumer_rate: Arc<TenantRateLimiter>,
    /// per consumer (`tenant\nuid`): the rate of consumer-token reads
    /// (`HOOKD_CONSUMER_READ_RATE_LIMIT`)
    pub consumer_reads: Arc<TenantRateLimiter>,
    /// what one consumer and one tenant may have
    pub customers: CustomerLimits,
    /// the inbound sources this process verifies with, kept while it hears their changes
    pub sources: crate::inbound::cache::SourceCache,
    /// requests to each source by outcome, for the console (`hookd.source_requests`)
    pub source_requests: crate::inbound::tally::RequestTally,
    /// the event-type schemas this process compiled, for `"validate": true` at enqueue
    pub schemas: crate::catalog::SchemaCache,
}

/// Limits on what customers (consumers) and tenants may hold (issue 29).
#[derive(Debug, Clone, Copy)]
pub struct CustomerLimits {
    /// `HOOKD_CONSUMER_MAX_ENDPOINTS`
    pub consumer_max_endpoints: i64,
    /// `HOOKD_TENANT_MAX_ENDPOINTS`
    pub tenant_max_endpoints: i64,
    /// `HOOKD_CONSUMER_DELETE_BATCH`
    pub delete_batch: i64,
}

/// What the endpoints and consumers API need: the key that seals signing secrets, the
/// outbound policy URLs are checked against, and the address the portal is reached at.
pub struct ManageDeps {
    /// why there is none, when there is none (secrets cannot be stored: 503)
    pub keyring: Result<crate::crypto::Keyring, String>,
    pub allow: crate::outbound::AllowList,
    /// `HOOKD_PUBLIC_URL`: the base of portal links (default: relative links)
    pub public_url: Option<String>,
}

impl ManageDeps {
    /// No encryption key, no allow-list: endpoints can be listed but not created.
    pub fn unconfigured() -> Self {
        ManageDeps {
            keyring: Err("no encryption key was given to this process".into()),
            allow: crate::outbound::AllowList::default(),
            public_url: None,
        }
    }
}

impl AppState {
    /// Starts the ingest pipeline and assembles what the router needs. `kube` is the
    /// client TokenReviews go through; without one, ServiceAccount tokens are invalid.
    pub fn start(
        pool: PgPool,
        settings: &ApiSettings,
        kube: Option<kube::Client>,
        shutdown: CancellationToken,
    ) -> AppState {
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
                key_wait: Duration::from_millis(settings.idempotency_wait_ms),
            },
            notifier.clone(),
            metrics.clone(),
        );
        let auth = match settings.auth {
            AuthMode::None => Authenticator::disabled(),
            AuthMode::On => Authenticator::new(
                pool.clone(),
                kube.map(|c| ServiceAccounts::new(c, settings.service_account_policy())),
            ),
        };
        let (process_bytes, tenant_bytes) = settings.ingest_budget();
        let sources = crate::inbound::cache::SourceCache::start(
            pool.clone(),
            settings.notify_database_url.clone(),
            shutdown.clone(),
        );
        AppState {
            source_requests: crate::inbound::tally::RequestTally::start(
                pool.clone(),
                shutdown.clone(),
            ),
            sources,
            schemas: crate::catalog::SchemaCache::default(),
            pool,
            outbox,
            notifier,
            ingest_budget: Arc::new(
                IngestBudget::new(process_bytes, tenant_bytes, metrics.clone())
                    .with_consumer_share(settings.consumer_inflight_bytes),
            ),
            inbound_budget: Arc::new(IngestBudget::new(
                (process_bytes / 4).max(1),
                (tenant_bytes / 4).max(settings.limits().max_payload_bytes),
                metrics.clone(),
            )),
            consumer_rate: Arc::new(TenantRateLimiter::new(settings.consumer_rate_limit)),
            consumer_reads: Arc::new(TenantRateLimiter::new(settings.consumer_read_rate_limit)),
            customers: CustomerLimits {
                consumer_max_endpoints: settings.consumer_max_endpoints.max(0),
                tenant_max_endpoints: settings.tenant_max_endpoints.max(0),
                delete_batch: settings.consumer_delete_batch.clamp(1, 100_000),
            },
            metrics,
            limits: settings.limits(),
            portal_frame_ancestors: settings.portal_frame_ancestors.clone(),
            auth,
            rate_limiter: settings
                .tenant_rate_limit
                .map(|r| Arc::new(TenantRateLimiter::new(r))),
            manage: Arc::new(ManageDeps::unconfigured()),
        }
    }

    /// Gives the endpoints API its key, allow-list and public address.
    pub fn with_manage(mut self, manage: ManageDeps) -> Self {
        self.manage = Arc::new(manage);
        self
    }

    /// Admits `demand` (events per tenant) under the per-tenant rate limit, or 429.
    pub(crate) fn admit(&self, demand: &[(&str, u32)]) -> Result<(), ApiError> {
        let Some(limiter) = &self.rate_limiter else {
            return Ok(());
        };
        limiter
            .admit(demand, Instant::now())
            .map_err(|(tenant, wait)| {
                let events: u32 = demand.iter().map(|d| d.1).sum();
                self.metrics.rate_limited_events.inc_by(u64::from(events));
                ApiError::rate_limited(tenant, wait)
            })
    }
}

/// Every documented route, with its OpenAPI description, from the same `routes!` calls.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(messages::create, messages::list))
        .routes(routes!(messages::create_batch))
        .routes(routes!(messages::get))
        .routes(routes!(endpoints::create, endpoints::list))
        .routes(routes!(
            endpoints::get,
            endpoints::update,
            endpoints::delete
        ))
        .routes(routes!(endpoints::rotate_secret))
        .routes(routes!(endpoints::pause))
        .routes(routes!(endpoints::resume))
        .routes(routes!(endpoints::enable))
        .routes(routes!(endpoints::stats))
        .routes(routes!(endpoints::send_test))
        .routes(routes!(endpoints::deliveries))
        .routes(routes!(consumers::list))
        .routes(routes!(
            consumers::upsert,
            consumers::get,
            consumers::delete
        ))
        .routes(routes!(consumers::create_token))
        .routes(routes!(consumers::create_portal))
        .routes(routes!(consumers::get_deletion))
        .routes(routes!(sources::create, sources::list))
        .routes(routes!(sources::get, sources::update, sources::delete))
        .routes(routes!(sources::rotate_secret))
        .routes(routes!(sources::stats))
        .routes(routes!(event_types::create, event_types::list))
        .routes(routes!(
            event_types::get,
            event_types::update,
            event_types::delete
        ))
        .routes(routes!(inbound::receive))
        .routes(routes!(tokens::list))
        .routes(routes!(tokens::revoke))
        .routes(routes!(sessions::create, sessions::end))
        .routes(routes!(sessions::from_code))
        .routes(routes!(whoami))
        .routes(routes!(deliveries::get))
        .routes(routes!(deliveries::replay))
        .routes(routes!(deliveries::replay_endpoint))
        .routes(routes!(deliveries::dead_letters))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi::openapi_json))
}

pub fn app(state: AppState) -> Router {
    let (router, _) = routes().split_for_parts();
    router
        .merge(crate::ui::router(&state.portal_frame_ancestors))
        .fallback(|| async { ApiError::not_found("route") })
        // every error is documented as {"error": {...}}; axum's own 405 has an empty body
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                ErrorCode::MethodNotAllowed,
                format!("{method} is not allowed on this route; the Allow header lists the methods that are"),
            )
        })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            limits::enforce,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
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

/// Who the credential is: what the web console shows and offers.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WhoAmI {
    /// null with authentication off (every tenant)
    tenant: Option<String>,
    /// set for a consumer token
    consumer: Option<String>,
    scopes: Vec<String>,
    /// `token`, `serviceAccount` or `none` (authentication off)
    kind: &'static str,
}

/// GET /v1/whoami
#[utoipa::path(
    get,
    path = "/v1/whoami",
    tag = "operations",
    operation_id = "whoami",
    summary = "The tenant, consumer and scopes of the presented credential",
    responses(
        (status = 200, description = "The caller", body = WhoAmI),
        (status = 401, response = openapi::responses::Unauthorized),
        (status = 403, response = openapi::responses::Forbidden),
        (status = 429, response = openapi::responses::TooManyRequests),
        (status = 503, response = openapi::responses::Unavailable),
    ),
    security(("bearer" = []))
)]
async fn whoami(caller: caller::Caller) -> Response {
    let who = match caller {
        caller::Caller::Anonymous => WhoAmI {
            tenant: None,
            consumer: None,
            scopes: crate::auth::Scope::ALL
                .iter()
                .map(|s| s.as_str().to_owned())
                .collect(),
            kind: "none",
        },
        caller::Caller::Authenticated(p) => WhoAmI {
            tenant: Some(p.tenant),
            consumer: p.consumer,
            scopes: p.scopes.iter().map(|s| s.as_str().to_owned()).collect(),
            kind: match p.subject {
                crate::auth::Subject::Token { .. } => "token",
                crate::auth::Subject::ServiceAccount { .. } => "serviceAccount",
                // never: a source's caller exists only inside POST /in/{name}
                crate::auth::Subject::Source { .. } => "source",
            },
        },
    };
    axum::Json(who).into_response()
}

/// GET /healthz
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    operation_id = "healthz",
    summary = "Liveness: the process serves requests",
    security(()),
    responses(
        (status = 200, description = "`ok`", content_type = "text/plain", body = String),
    )
)]
async fn healthz() -> &'static str {
    crate::ops::healthz().await
}

/// GET /readyz
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    operation_id = "readyz",
    summary = "Readiness: the database is reachable",
    security(()),
    responses(
        (status = 200, description = "`ready`", content_type = "text/plain", body = String),
        (status = 503, response = openapi::responses::Unavailable),
    )
)]
async fn readyz(state: State<PgPool>) -> Response {
    crate::ops::readyz(state).await
}

/// GET /metrics
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    operation_id = "metrics",
    summary = "Prometheus metrics (OpenMetrics text)",
    description = "Open unless `HOOKD_METRICS_TOKEN` is set; then `Authorization: Bearer <that token>` is required (401 without it).",
    security((), ("metrics_token" = [])),
    responses(
        (status = 200, description = "OpenMetrics text exposition", content_type = "application/openmetrics-text", body = String),
        (status = 401, response = openapi::responses::Unauthorized),
    )
)]
async fn metrics(state: State<Metrics>, headers: axum::http::HeaderMap) -> Response {
    crate::ops::metrics(state, headers).await
}

async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    // The route template axum matched (`/v1/endpoints/{id}`), never the raw path: one
    // series per operation, whatever ids or junk a client sends.
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = crate::metrics::method_label(req.method());
    let resp = next.run(req).await;
    state
        .metrics
        .http_requests
        .get_or_create(&crate::metrics::RouteStatus {
            method,
            route,
            status: resp.status().as_u16(),
        })
        .inc();
    resp
}

/// The `{id}` of a path: 400 (JSON) when it is not a UUID or not even valid UTF-8.
pub(crate) fn path_id(
    raw: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
    what: &str,
) -> Result<Uuid, ApiError> {
    let invalid = |shown: &str| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidId,
            format!("{what} id {shown:?} is not a UUID"),
        )
    };
    let axum::extract::Path(raw) = raw.map_err(|_| invalid("(undecodable)"))?;
    raw.parse::<Uuid>().map_err(|_| invalid(&raw))
}

/// `hookd api`: the ingest pipeline, authentication and the router, until `shutdown`.
pub async fn run(
    pool: PgPool,
    settings: ApiSettings,
    manage: ManageDeps,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let kube = match settings.auth {
        AuthMode::On => crate::auth::service_account::client_from_environment().await,
        AuthMode::None => {
            tracing::warn!(
                "HOOKD_AUTH=none: authentication is OFF; any caller can enqueue, read and replay for any tenant. Use this only for local runs"
            );
            None
        }
    };
    let state = AppState::start(pool, &settings, kube, shutdown.clone()).with_manage(manage);
    tokio::spawn(deletions::sweep(
        state.pool.clone(),
        state.customers.delete_batch,
        shutdown.clone(),
    ));
    // the process facing every client: what a burst of held connections freed goes back
    crate::runtime::spawn_heap_trim(shutdown.clone());
    let listener = tokio::net::TcpListener::bind(settings.listen).await?;
    tracing::info!(listen = %settings.listen, "listening");
    server::serve_api_on(listener, app(state), settings.listener_limits(), shutdown).await?;
    Ok(())
}
