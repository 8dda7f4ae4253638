//! `/v1/endpoints`: the endpoints API (scope `manage` to change, `read` to look), for
//! per-customer endpoints that do not belong in a cluster. Endpoints declared by
//! WebhookEndpoint objects are listed too, read-only.

use std::collections::BTreeMap;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::body::{not_null, nullable};
use super::caller::Caller;
use super::error::ApiError;
use super::listing::{check_consumer_filter, page_limit, parse_status, query, uuid_cursor};
use super::messages::DeliverySummary;
use super::openapi::responses;
use super::{AppState, path_id};
use crate::auth::Scope;
use crate::db::{self, endpoints::ApiState, endpoints::EndpointView, endpoints::PatchRefused};
use crate::domain::ErrorCode;
use crate::domain::{self, CircuitState, DeliveryStatus, EndpointState, ManagedBy};
use crate::domain::{DeliveryOrder, OnDeadLetter, RateLimit};

/// Largest request body of these routes.
const BODY_LIMIT: usize = 64 * 1024;

/// The type of test events, reserved: a test event's type is this or below it.
pub const TEST_EVENT_TYPE: &str = "hookd.test";

fn is_test_event_type(t: &str) -> bool {
    t == TEST_EVENT_TYPE
        || t.strip_prefix(TEST_EVENT_TYPE)
            .is_some_and(|rest| rest.starts_with('.'))
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CircuitOut {
    /// `closed`, `open` or `half_open`
    #[schema(value_type = String)]
    state: CircuitState,
    /// while open: when one probe delivery is tried
    open_until: Option<DateTime<Utc>>,
}

/// A dispatcher holds the endpoint's deliveries (not sent, attempts not counted, tried
/// again every minute) because it cannot decrypt the endpoint's signing secret: a key
/// missing from its HOOKD_ENCRYPTION_KEY/HOOKD_ENCRYPTION_OLD_KEYS, or a damaged row.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretUnreadableOut {
    /// what the dispatcher reported
    error: String,
    /// when deliveries were first held for this
    since: Option<DateTime<Utc>>,
}

fn secret_unreadable(
    error: Option<String>,
    since: Option<DateTime<Utc>>,
) -> Option<SecretUnreadableOut> {
    error.map(|error| SecretUnreadableOut { error, since })
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesRef {
    namespace: String,
    name: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointOut {
    id: Uuid,
    tenant: String,
    consumer: Option<String>,
    url: String,
    /// empty: every event type
    event_types: Vec<String>,
    description: Option<String>,
    #[schema(value_type = BTreeMap<String, String>)]
    headers: serde_json::Value,
    state: EndpointState,
    /// why it is paused or disabled (a receiver's 410, a deleted consumer, …)
    state_reason: Option<String>,
    /// why it is disabled, when it is
    disabled_reason: Option<String>,
    managed_by: ManagedBy,
    /// the declaring object, for `managedBy: kubernetes`
    kubernetes: Option<KubernetesRef>,
    circuit: CircuitOut,
    /// present while a dispatcher holds the deliveries because it cannot decrypt the
    /// signing secret
    secret_unreadable: Option<SecretUnreadableOut>,
    /// the most deliveries a second it is sent, with its burst; null: no limit
    rate_limit: Option<RateLimit>,
    /// `perKey`: the deliveries of one `orderingKey` are sent one at a time, in order
    ordering: DeliveryOrder,
    /// with `ordering: perKey`, what a dead-lettered delivery does to its key's line
    on_dead_letter: OnDeadLetter,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl From<EndpointView> for EndpointOut {
    fn from(e: EndpointView) -> Self {
        EndpointOut {
            disabled_reason: (e.state == EndpointState::Disabled)
                .then(|| e.state_reason.clone())
                .flatten(),
            rate_limit: e.rate_limit(),
            ordering: e.ordering,
            on_dead_letter: e.on_dead_letter,
            kubernetes: match (e.k8s_namespace, e.k8s_name) {
                (Some(namespace), Some(name)) => Some(KubernetesRef { namespace, name }),
                _ => None,
            },
            id: e.id,
            tenant: e.tenant,
            consumer: e.consumer,
            url: e.url,
            event_types: e.event_types,
            description: e.description,
            headers: e.headers.0,
            state: e.state,
            state_reason: e.state_reason,
            managed_by: e.managed_by,
            circuit: CircuitOut {
                state: e.circuit_state,
                open_until: e.circuit_open_until,
            },
            secret_unreadable: secret_unreadable(e.secret_unreadable, e.secret_unreadable_since),
            created_at: e.created_at,
            updated_at: e.updated_at,
        }
    }
}

/// A new endpoint. Unknown fields are refused (422).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointIn {
    /// An absolute http(s) URL; private, loopback, link-local and metadata addresses are
    /// refused unless the operator allows them (HOOKD_ALLOWED_DESTINATIONS)
    #[schema(max_length = 2048)]
    url: String,
    /// The consumer (customer) the endpoint is for; it then receives only events
    /// addressed to that consumer. Created if unknown. A consumer token's own consumer.
    #[schema(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    consumer: Option<String>,
    /// `*`, exact types (`invoice.paid`) or prefixes (`invoice.*`); empty or absent: all
    #[schema(max_items = 64)]
    event_types: Option<Vec<String>>,
    /// `whsec_` + base64 of 24-64 bytes; generated when absent
    secret: Option<String>,
    #[schema(max_length = 1000)]
    description: Option<String>,
    /// extra headers sent with every delivery
    headers: Option<BTreeMap<String, String>>,
    /// create it paused (deliveries are created and held)
    paused: Option<bool>,
    /// at most `perSecond` deliveries a second across every dispatcher, bursts of up to
    /// `burst` (default: perSecond rounded up); absent: no limit
    rate_limit: Option<RateLimit>,
    /// `perKey`: send the deliveries of one message `orderingKey` one at a time, in the
    /// order their events committed (default `none`)
    ordering: Option<DeliveryOrder>,
    /// with `ordering: perKey`, after a dead letter: `continue` with the key's next
    /// delivery (default) or `hold` the key until the dead one is replayed
    on_dead_letter: Option<OnDeadLetter>,
    /// With authentication on, the credential's tenant (another is a 403); required when
    /// authentication is off
    tenant: Option<String>,
}

/// The endpoint and its signing secret, shown this once.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedEndpointOut {
    #[serde(flatten)]
    endpoint: EndpointOut,
    /// the signing secret: store it now, it is never shown again
    secret: String,
}

/// A change; absent fields stay as they are.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointPatchIn {
    // `null` is refused for these (422) rather than read as "leave it": only
    // `description` can be cleared
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, max_length = 2048)]
    url: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Vec<String>>)]
    event_types: Option<Option<Vec<String>>>,
    /// `null` clears it
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>)]
    description: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    headers: Option<Option<BTreeMap<String, String>>>,
    /// true pauses; false resumes (and re-enables an endpoint a receiver's 410 disabled)
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<bool>)]
    paused: Option<Option<bool>>,
    /// at most `perSecond` deliveries a second across every dispatcher, bursts of up to
    /// `burst`; `null` removes the limit. A change starts with a full bucket.
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<RateLimit>, nullable = true)]
    rate_limit: Option<Option<RateLimit>>,
    /// `perKey` or `none`; switching to `none` releases every delivery waiting in line
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<DeliveryOrder>)]
    ordering: Option<Option<DeliveryOrder>>,
    /// `continue` or `hold`; switching to `continue` lets every held key move on
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<OnDeadLetter>)]
    on_dead_letter: Option<Option<OnDeadLetter>>,
}

/// 422 `invalid_field`; the message names the field.
fn invalid(e: String) -> ApiError {
    ApiError::unprocessable(ErrorCode::InvalidField, e)
}

pub(super) fn keyring(state: &AppState) -> Result<&crate::crypto::Keyring, ApiError> {
    state.manage.keyring.as_ref().map_err(|reason| {
        tracing::warn!(%reason, "a signing secret cannot be stored");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::EncryptionUnavailable,
            "this API process has no encryption key for signing secrets (HOOKD_ENCRYPTION_KEY); nothing was written",
        )
    })
}

/// POST /v1/endpoints
#[utoipa::path(
    post,
    path = "/v1/endpoints",
    tag = "endpoints",
    operation_id = "createEndpoint",
    summary = "Create an endpoint (scope: manage)",
    description = "hookd generates the signing secret unless one is given, and returns it in \
        this answer only; it is stored encrypted. Deliveries start with the next event.",
    request_body(content = EndpointIn, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = CreatedEndpointOut, links(
            ("getEndpoint" = (operation_id = "getEndpoint", parameters(("id" = "$response.body#/id")), description = "The endpoint")),
        )),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    caller: Caller,
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    state.admit_work(&caller, 0)?;
    let input: EndpointIn = state
        .read_json_body(&caller, &headers, body, BODY_LIMIT, false)
        .await?;
    let tenant = caller
        .resolve_tenant(input.tenant)?
        .ok_or_else(|| ApiError::unprocessable(ErrorCode::MissingField, "tenant is required"))?;
    let consumer = caller.resolve_consumer(input.consumer)?;
    let keyring = keyring(&state)?;
    let limits = crate::endpoints::EndpointLimits {
        per_consumer: state.customers.consumer_max_endpoints,
        per_tenant: state.customers.tenant_max_endpoints,
    };
    let (id, secret) = crate::endpoints::create_api(
        &state.pool,
        keyring,
        &state.manage.allow,
        limits,
        caller.audience(),
        crate::endpoints::NewEndpoint {
            tenant: tenant.clone(),
            consumer: consumer.clone(),
            url: input.url,
            event_types: input.event_types.unwrap_or_default(),
            description: input.description,
            headers: input.headers.unwrap_or_default(),
            paused: input.paused.unwrap_or(false),
            rate_limit: input.rate_limit,
            ordering: input.ordering.unwrap_or_default(),
            on_dead_letter: input.on_dead_letter.unwrap_or_default(),
            secret: input.secret,
        },
    )
    .await?;
    let view = db::endpoints::get_visible(&state.pool, id, caller.audience())
        .await?
        .ok_or_else(ApiError::internal)?;
    tracing::info!(endpoint = %id, tenant = %tenant, consumer = ?consumer, "endpoint created through the API");
    Ok((
        StatusCode::CREATED,
        Json(CreatedEndpointOut {
            endpoint: view.into(),
            secret,
        }),
    )
        .into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// only this consumer's endpoints
    #[param(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    consumer: Option<String>,
    /// page size, 1 to 1000 (default 100)
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// `nextCursor` of the previous page
    cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPage {
    items: Vec<EndpointOut>,
    /// pass as `cursor` for the next page; null on the last page
    next_cursor: Option<String>,
}

/// GET /v1/endpoints
#[utoipa::path(
    get,
    path = "/v1/endpoints",
    tag = "endpoints",
    operation_id = "listEndpoints",
    summary = "The caller's endpoints, keyset-paginated (scope: read)",
    params(ListParams),
    responses(
        (status = 200, description = "A page of endpoints", body = EndpointPage),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    caller: Caller,
    State(state): State<AppState>,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let p = query(params)?;
    let limit = page_limit(p.limit)?;
    check_consumer_filter(p.consumer.as_deref())?;
    let after = uuid_cursor(p.cursor.as_deref())?;
    let rows = db::endpoints::list(
        &state.pool,
        caller.audience(),
        p.consumer.as_deref(),
        after,
        limit,
    )
    .await?;
    let next_cursor = super::listing::next_cursor(&rows, limit, |r| r.id.to_string());
    Ok(Json(EndpointPage {
        items: rows.into_iter().map(Into::into).collect(),
        next_cursor,
    })
    .into_response())
}

/// GET /v1/endpoints/{id}
#[utoipa::path(
    get,
    path = "/v1/endpoints/{id}",
    tag = "endpoints",
    operation_id = "getEndpoint",
    summary = "An endpoint (scope: read)",
    params(("id" = Uuid, Path, description = "The endpoint id")),
    responses(
        (status = 200, description = "The endpoint", body = EndpointOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let id = path_id(id, "endpoint")?;
    let e = visible(&state, &caller, id).await?;
    Ok(Json(EndpointOut::from(e)).into_response())
}

async fn visible(state: &AppState, caller: &Caller, id: Uuid) -> Result<EndpointView, ApiError> {
    db::endpoints::get_visible(&state.pool, id, caller.audience())
        .await?
        .ok_or_else(|| ApiError::not_found("endpoint"))
}

/// Applies a change through [`crate::endpoints::patch_api`] and answers with the
/// endpoint; `headers` are the new headers, for their check.
async fn patch_and_answer(
    state: &AppState,
    caller: &Caller,
    id: Uuid,
    patch: db::endpoints::EndpointPatch,
    headers: Option<&BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let activated = patch.state == Some(ApiState::Active);
    let view = crate::endpoints::patch_api(
        &state.pool,
        &state.manage.allow,
        caller.audience(),
        id,
        patch,
        headers,
    )
    .await?;
    if activated {
        // held deliveries may be due now
        state.notifier.wake();
    }
    Ok(Json(EndpointOut::from(view)).into_response())
}

/// PATCH /v1/endpoints/{id}
#[utoipa::path(
    patch,
    path = "/v1/endpoints/{id}",
    tag = "endpoints",
    operation_id = "updateEndpoint",
    summary = "Change an endpoint (scope: manage)",
    description = "A new URL closes the circuit: the failures belonged to the old destination. \
        Endpoints declared by WebhookEndpoint objects answer 409 managed_by_kubernetes.",
    params(("id" = Uuid, Path, description = "The endpoint id")),
    request_body(content = EndpointPatchIn, content_type = "application/json"),
    responses(
        (status = 200, description = "The endpoint as changed", body = EndpointOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 409, response = responses::Conflict),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn update(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    let id = path_id(id, "endpoint")?;
    state.admit_work(&caller, 0)?;
    let input: EndpointPatchIn = state
        .read_json_body(&caller, &headers, body, BODY_LIMIT, false)
        .await?;
    let url = not_null("url", input.url)?;
    let event_types = not_null("eventTypes", input.event_types)?;
    let hdrs = not_null("headers", input.headers)?;
    let paused = not_null("paused", input.paused)?;
    let ordering = not_null("ordering", input.ordering)?;
    let on_dead_letter = not_null("onDeadLetter", input.on_dead_letter)?;
    let patch = db::endpoints::EndpointPatch {
        url,
        event_types,
        description: input.description,
        headers: hdrs
            .as_ref()
            .map(|h| serde_json::to_value(h).unwrap_or_default()),
        state: paused.map(|p| {
            if p {
                ApiState::Paused
            } else {
                ApiState::Active
            }
        }),
        rate_limit: input.rate_limit,
        ordering,
        on_dead_letter,
    };
    patch_and_answer(&state, &caller, id, patch, hdrs.as_ref()).await
}

/// DELETE /v1/endpoints/{id}
#[utoipa::path(
    delete,
    path = "/v1/endpoints/{id}",
    tag = "endpoints",
    operation_id = "deleteEndpoint",
    summary = "Delete an endpoint (scope: manage)",
    description = "It stops receiving at once; its pending deliveries are cancelled (visible as \
        `cancelled` with a reason); its history is kept until retention removes it.",
    params(("id" = Uuid, Path, description = "The endpoint id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 409, response = responses::Conflict),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    let id = path_id(id, "endpoint")?;
    state.admit_work(&caller, 0)?;
    let cancelled = crate::endpoints::delete_api(&state.pool, caller.audience(), id).await?;
    tracing::info!(endpoint = %id, cancelled, "endpoint deleted through the API");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Pause, resume, re-enable: the same change as PATCH `paused`.
async fn set_state(
    caller: Caller,
    state: AppState,
    id: Result<Path<String>, PathRejection>,
    to: ApiState,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    let id = path_id(id, "endpoint")?;
    state.admit_work(&caller, 0)?;
    let patch = db::endpoints::EndpointPatch {
        state: Some(to),
        ..Default::default()
    };
    patch_and_answer(&state, &caller, id, patch, None).await
}

/// POST /v1/endpoints/{id}/pause
#[utoipa::path(
    post,
    path = "/v1/endpoints/{id}/pause",
    tag = "endpoints",
    operation_id = "pauseEndpoint",
    summary = "Hold an endpoint's deliveries (scope: manage)",
    description = "Deliveries are still created and wait; resume sends them.",
    params(("id" = Uuid, Path, description = "The endpoint id")),
    responses(
        (status = 200, description = "The endpoint", body = EndpointOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 409, response = responses::Conflict),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn pause(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    set_state(caller, state, id, ApiState::Paused).await
}

/// POST /v1/endpoints/{id}/resume
#[utoipa::path(
    post,
    path = "/v1/endpoints/{id}/resume",
    tag = "endpoints",
    operation_id = "resumeEndpoint",
    summary = "Send an endpoint's deliveries again (scope: manage)",
    params(("id" = Uuid, Path, description = "The endpoint id")),
    responses(
        (status = 200, description = "The endpoint", body = EndpointOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 409, response = responses::Conflict),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn resume(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    set_state(caller, state, id, ApiState::Active).await
}

/// POST /v1/endpoints/{id}/enable
#[utoipa::path(
    post,
    path = "/v1/endpoints/{id}/enable",
    tag = "endpoints",
    operation_id = "enableEndpoint",
    summary = "Re-enable an endpoint a receiver's 410 disabled (scope: manage)",
    description = "Events sent while it was disabled reached it not; replay them from the \
        event if needed.",
    params(("id" = Uuid, Path, description = "The endpoint id")),
    responses(
        (status = 200, description = "The endpoint", body = EndpointOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 409, response = responses::Conflict),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn enable(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    set_state(caller, state, id, ApiState::Active).await
}

#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RotateIn {
    /// the new secret; generated when absent
    secret: Option<String>,
    /// how long the previous secret keeps signing, in seconds (default 86400, at most 604800)
    #[schema(minimum = 0, maximum = 604800)]
    grace_seconds: Option<i64>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretOut {
    /// the new signing secret: store it now, it is never shown again
    secret: String,
    /// until when the previous secret still signs
    previous_valid_until: DateTime<Utc>,
}

/// POST /v1/endpoints/{id}/secret/rotate
#[utoipa::path(
    post,
    path = "/v1/endpoints/{id}/secret/rotate",
    tag = "endpoints",
    operation_id = "rotateEndpointSecret",
    summary = "Rotate an endpoint's signing secret (scope: manage)",
    description = "Deliveries are signed with the new and the previous secret until the grace \
        period ends, so receivers can switch without losing a webhook.",
    params(("id" = Uuid, Path, description = "The endpoint id")),
    request_body(content = Option<RotateIn>, content_type = "application/json"),
    responses(
        (status = 201, description = "The new secret", body = SecretOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 409, response = responses::Conflict),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn rotate_secret(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    let id = path_id(id, "endpoint")?;
    state.admit_work(&caller, 0)?;
    let input: RotateIn = state
        .read_json_body(&caller, &headers, body, BODY_LIMIT, true)
        .await?;
    let grace = input
        .grace_seconds
        .unwrap_or(crate::signing::DEFAULT_ROTATION_GRACE_SECS.into());
    let keyring = keyring(&state)?;
    let secret = crate::endpoints::rotate_api(
        &state.pool,
        keyring,
        caller.audience(),
        id,
        input.secret,
        grace,
    )
    .await?;
    tracing::info!(endpoint = %id, grace_seconds = grace, "signing secret rotated through the API");
    Ok((
        StatusCode::CREATED,
        Json(SecretOut {
            secret,
            previous_valid_until: Utc::now() + chrono::Duration::seconds(grace),
        }),
    )
        .into_response())
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Outcomes {
    succeeded: i64,
    failed: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HourOut {
    hour: DateTime<Utc>,
    succeeded: i64,
    failed: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastAttemptOut {
    at: DateTime<Utc>,
    status_code: Option<i32>,
    error: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatsOut {
    endpoint_id: Uuid,
    state: EndpointState,
    state_reason: Option<String>,
    circuit: CircuitOut,
    /// deliveries waiting or in flight (counted up to 100,000)
    backlog: i64,
    /// dead letters not replayed (counted up to 100,000)
    dead_letters: i64,
    /// deliveries created in the last hour, by how they ended so far
    last_hour: Outcomes,
    last_day: Outcomes,
    /// the last 24 hours, oldest first (deliveries by creation hour; a sample of the
    /// newest 50,000 on a busy endpoint)
    hourly: Vec<HourOut>,
    last_success: Option<LastAttemptOut>,
    last_failure: Option<LastAttemptOut>,
    /// present while a dispatcher holds the deliveries because it cannot decrypt the
    /// signing secret
    secret_unreadable: Option<SecretUnreadableOut>,
}

/// GET /v1/endpoints/{id}/stats
#[utoipa::path(
    get,
    path = "/v1/endpoints/{id}/stats",
    tag = "endpoints",
    operation_id = "getEndpointStats",
    summary = "Recent outcomes, circuit and backlog of an endpoint (scope: read)",
    params(("id" = Uuid, Path, description = "The endpoint id")),
    responses(
        (status = 200, description = "The figures", body = EndpointStatsOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn stats(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let id = path_id(id, "endpoint")?;
    visible(&state, &caller, id).await?;
    let s = db::endpoints::stats(&state.pool, id, 100_000)
        .await?
        .ok_or_else(|| ApiError::not_found("endpoint"))?;
    let hourly = db::endpoints::hourly_outcomes(&state.pool, id, 50_000).await?;
    let last_failure = db::endpoints::last_failure(&state.pool, id).await?;
    let sum = |from: usize| Outcomes {
        succeeded: hourly.iter().skip(from).map(|h| h.succeeded).sum(),
        failed: hourly.iter().skip(from).map(|h| h.failed).sum(),
    };
    let last = |a: db::endpoints::LastAttempt| LastAttemptOut {
        at: a.started_at,
        status_code: a.status_code,
        error: a.error,
    };
    Ok(Json(EndpointStatsOut {
        endpoint_id: id,
        state: s.state,
        state_reason: s.state_reason,
        circuit: CircuitOut {
            state: s.circuit_state,
            open_until: s.circuit_open_until,
        },
        backlog: s.backlog,
        dead_letters: s.dead_letters,
        last_hour: sum(hourly.len().saturating_sub(1)),
        last_day: sum(0),
        hourly: hourly
            .iter()
            .map(|h| HourOut {
                hour: h.hour,
                succeeded: h.succeeded,
                failed: h.failed,
            })
            .collect(),
        last_success: s.last_success.map(last),
        last_failure: last_failure.map(last),
        secret_unreadable: secret_unreadable(s.secret_unreadable, s.secret_unreadable_since),
    })
    .into_response())
}

#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TestEventIn {
    /// `hookd.test` (the default) or a type below it (`hookd.test.invoice`): test events are
    /// always told apart from the producer's
    event_type: Option<String>,
    /// any JSON value but null; default `{"test": true, "endpointId": …}`
    #[serde(default, deserialize_with = "nullable")]
    #[schema(schema_with = super::openapi::any_json_but_null)]
    payload: Option<Option<Box<serde_json::value::RawValue>>>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TestEventOut {
    event_id: Uuid,
    delivery_id: Uuid,
}

/// POST /v1/endpoints/{id}/test
#[utoipa::path(
    post,
    path = "/v1/endpoints/{id}/test",
    tag = "endpoints",
    operation_id = "sendTestEvent",
    summary = "Send a test event to this endpoint only (scope: manage)",
    description = "A real event and delivery, signed like every other, addressed to this \
        endpoint alone whatever its event-type filter.",
    params(("id" = Uuid, Path, description = "The endpoint id")),
    request_body(content = Option<TestEventIn>, content_type = "application/json"),
    responses(
        (status = 201, description = "Enqueued", body = TestEventOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 409, response = responses::Conflict),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn send_test(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    let id = path_id(id, "endpoint")?;
    let input: TestEventIn = state
        .read_json_body(&caller, &headers, body, BODY_LIMIT, true)
        .await?;
    let event_type = input.event_type.unwrap_or_else(|| TEST_EVENT_TYPE.into());
    domain::validate_event_type(&event_type).map_err(invalid)?;
    // A test event must be told apart from the producer's events, by its receiver and in
    // every listing: its type is the reserved `hookd.test` or below it.
    if !is_test_event_type(&event_type) {
        return Err(ApiError::unprocessable(
            ErrorCode::InvalidTestEventType,
            format!(
                "a test event's type is {TEST_EVENT_TYPE} or starts with {TEST_EVENT_TYPE}. (got {event_type:?}); the producer's own types are sent with POST /v1/messages"
            ),
        ));
    }
    let payload = match input.payload {
        Some(None) => return Err(invalid("payload must not be null".into())),
        Some(Some(p)) => p.get().to_owned(),
        None => format!(r#"{{"test":true,"endpointId":"{id}"}}"#),
    };
    let e = visible(&state, &caller, id).await?;
    if e.managed_by != ManagedBy::Api {
        // the producer's own endpoint (a WebhookEndpoint object): read-only through this API
        return Err(
            crate::endpoints::EndpointError::Refused(PatchRefused::ManagedByKubernetes).into(),
        );
    }
    if e.state == EndpointState::Disabled {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::EndpointDisabled,
            format!(
                "the endpoint is disabled ({}); enable it first",
                e.state_reason.as_deref().unwrap_or("no reason recorded")
            ),
        ));
    }
    if caller.tenant_scope().is_some() {
        state.admit_work(&caller, 1)?;
    } else {
        state.admit(&[(e.tenant.as_str(), 1)])?;
    }
    let event = db::events::NewEvent {
        id: Uuid::now_v7(),
        request_hash: crate::outbox::request_hash(
            &event_type,
            &payload,
            e.consumer.as_deref(),
            None,
        ),
        tenant: e.tenant,
        event_type,
        payload,
        idempotency_key: None,
        consumer: e.consumer,
        origin: None,
        trace: None,
        ordering_key: None,
    };
    let (event_id, delivery_id) = db::events::insert_for_endpoint(&state.pool, &event, id).await?;
    state.notifier.wake();
    Ok((
        StatusCode::CREATED,
        Json(TestEventOut {
            event_id,
            delivery_id,
        }),
    )
        .into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct DeliveryListParams {
    #[param(value_type = Option<DeliveryStatus>)]
    status: Option<String>,
    /// created at or after
    #[serde(default, deserialize_with = "crate::domain::time_bound")]
    since: Option<DateTime<Utc>>,
    /// created before
    #[serde(default, deserialize_with = "crate::domain::time_bound")]
    until: Option<DateTime<Utc>>,
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointDeliveryOut {
    #[serde(flatten)]
    delivery: DeliverySummary,
    event_id: Uuid,
    event_type: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointDeliveryPage {
    items: Vec<EndpointDeliveryOut>,
    next_cursor: Option<String>,
}

/// GET /v1/endpoints/{id}/deliveries
#[utoipa::path(
    get,
    path = "/v1/endpoints/{id}/deliveries",
    tag = "endpoints",
    operation_id = "listEndpointDeliveries",
    summary = "An endpoint's deliveries, newest first (scope: read)",
    params(("id" = Uuid, Path, description = "The endpoint id"), DeliveryListParams),
    responses(
        (status = 200, description = "A page of deliveries", body = EndpointDeliveryPage),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn deliveries(
    caller: Caller,
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    params: Result<Query<DeliveryListParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let id = path_id(id, "endpoint")?;
    let p = query(params)?;
    let limit = page_limit(p.limit)?;
    let status = parse_status(p.status.as_deref())?;
    let before = uuid_cursor(p.cursor.as_deref())?;
    visible(&state, &caller, id).await?;
    let rows = db::deliveries::list_for_endpoint(
        &state.pool,
        &db::deliveries::EndpointDeliveryQuery {
            endpoint_id: id,
            status,
            before,
            since: p.since,
            until: p.until,
            limit,
        },
    )
    .await?;
    let next_cursor = super::listing::next_cursor(&rows, limit, |r| r.row.id.to_string());
    Ok(Json(EndpointDeliveryPage {
        items: rows
            .into_iter()
            .map(|r| EndpointDeliveryOut {
                event_id: r.row.event_id,
                event_type: r.event_type,
                delivery: r.row.into(),
            })
            .collect(),
        next_cursor,
    })
    .into_response())
}
