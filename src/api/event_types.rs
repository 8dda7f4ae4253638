//! `/v1/event-types`: the tenant's event-type catalog. Reading is open to every credential
//! with scope `read`, consumer tokens (the portal) included; writing needs a tenant
//! credential with scope `manage`. A message sent with `"validate": true` is checked
//! against it (`catalog::check`, called by `api::messages`).

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::body::{not_null, nullable};
use super::caller::Caller;
use super::error::ApiError;
use super::listing::{page_limit, query};
use super::openapi::responses;
use crate::auth::Scope;
use crate::catalog::{self, Fields};
use crate::db;
use crate::db::event_types::EventTypeRow;
use crate::domain::ErrorCode;

/// A schema and an example of 64 KiB each, a description and a note, with room for JSON's
/// escapes.
const BODY_LIMIT: usize = 256 * 1024;

/// An event type as the API shows it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeOut {
    /// e.g. `invoice.paid`
    name: String,
    /// null for hookd's own (reserved) types
    tenant: Option<String>,
    description: Option<String>,
    /// the JSON Schema a payload of this type matches (when the producer asks for the
    /// check, `"validate": true`)
    #[schema(value_type = Option<Object>)]
    schema: Option<serde_json::Value>,
    /// an example payload, exactly as it was declared
    #[schema(schema_with = super::openapi::any_json_or_null)]
    example: Option<Box<RawValue>>,
    /// still accepted; new subscriptions should move on (see deprecationNote)
    deprecated: bool,
    deprecation_note: Option<String>,
    /// `api`, `kubernetes` (declared by a WebhookEventType object, read-only here: 409
    /// `managed_by_kubernetes`) or `hookd` (hookd's own operational events, read-only)
    managed_by: &'static str,
    /// null for hookd's own types
    created_at: Option<DateTime<Utc>>,
    updated_at: Option<DateTime<Utc>>,
}

fn out(r: EventTypeRow) -> EventTypeOut {
    EventTypeOut {
        // stored as the declarer sent it, which was checked to be JSON
        example: r.example.and_then(|e| RawValue::from_string(e).ok()),
        name: r.name,
        tenant: Some(r.tenant),
        description: r.description,
        schema: r.schema.map(|s| s.0),
        deprecated: r.deprecated,
        deprecation_note: r.deprecation_note,
        managed_by: r.managed_by.as_str(),
        created_at: Some(r.created_at),
        updated_at: Some(r.updated_at),
    }
}

fn reserved_out(r: &catalog::ReservedType) -> EventTypeOut {
    EventTypeOut {
        name: r.name.to_string(),
        tenant: None,
        description: Some(r.description.to_string()),
        schema: None,
        example: RawValue::from_string(r.example.to_string()).ok(),
        deprecated: false,
        deprecation_note: None,
        managed_by: "hookd",
        created_at: None,
        updated_at: None,
    }
}

/// A new event type. Unknown fields are refused (422).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EventTypeIn {
    /// an event type (`invoice.paid`), not under `hookd.` (reserved)
    #[schema(pattern = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$", max_length = 128)]
    name: String,
    /// required with authentication off; otherwise the credential's tenant
    tenant: Option<String>,
    /// at most 1000 characters
    description: Option<String>,
    /// a JSON Schema object (draft 2020-12 unless its `$schema` says otherwise), at most
    /// 64 KiB; it must compile, and its `$ref`s must point into itself without recursion
    #[schema(value_type = Option<Object>)]
    schema: Option<serde_json::Value>,
    /// an example payload (kept byte for byte, at most 64 KiB); it must match the schema
    #[schema(schema_with = super::openapi::any_json_or_null)]
    example: Option<Box<RawValue>>,
    deprecated: Option<bool>,
    /// what to use instead; at most 1000 characters
    deprecation_note: Option<String>,
}

/// POST /v1/event-types
#[utoipa::path(
    post,
    path = "/v1/event-types",
    tag = "event-types",
    operation_id = "createEventType",
    summary = "Declare an event type (scope: manage)",
    description = "At most 1000 types per tenant. A schema is compiled here: one that does not \
        compile answers 422 invalid_schema naming the problem, and an example must match it.",
    request_body(content = EventTypeIn, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = EventTypeOut),
        (status = 400, response = responses::BadRequest),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
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
pub async fn create(
    caller: Caller,
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    state.admit_work(&caller, 0)?;
    let input: EventTypeIn = state
        .read_json_body(&caller, &headers, body, BODY_LIMIT, false)
        .await?;
    let tenant = caller
        .resolve_tenant(input.tenant)?
        .ok_or_else(|| ApiError::unprocessable(ErrorCode::MissingField, "tenant is required"))?;
    let fields = Fields {
        description: input.description,
        schema: input.schema,
        example: input.example.map(|e| e.get().to_string()),
        deprecated: input.deprecated.unwrap_or(false),
        deprecation_note: input.deprecation_note,
    };
    let row = catalog::create(&state.pool, &tenant, &input.name, &fields).await?;
    tracing::info!(event_type = %row.name, tenant = %row.tenant, "event type declared through the API");
    Ok((StatusCode::CREATED, Json(out(row))).into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct EventTypeListParams {
    /// With authentication off: only this tenant's
    tenant: Option<String>,
    /// also deprecated types (default false)
    include_deprecated: Option<bool>,
    /// page size, 1 to 1000 (default 100)
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// `nextCursor` of the previous page
    cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypePage {
    /// in name order; a tenant credential also sees hookd's own operational types
    /// (`hookd.endpoint.*`, managedBy `hookd`)
    items: Vec<EventTypeOut>,
    next_cursor: Option<String>,
}

/// GET /v1/event-types
#[utoipa::path(
    get,
    path = "/v1/event-types",
    tag = "event-types",
    operation_id = "listEventTypes",
    summary = "The tenant's event-type catalog, by name (scope: read; consumer tokens too)",
    params(EventTypeListParams),
    responses(
        (status = 200, description = "A page of event types", body = EventTypePage),
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
    params: Result<Query<EventTypeListParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let p = query(params)?;
    let tenant = caller.resolve_tenant(p.tenant)?;
    let limit = page_limit(p.limit)?;
    if let Some(c) = &p.cursor {
        crate::domain::validate_event_type(c).map_err(|_| {
            ApiError::unprocessable(ErrorCode::InvalidCursor, "cursor is not an event type")
        })?;
    }
    let rows = db::event_types::list(
        &state.pool,
        tenant.as_deref(),
        p.cursor.as_deref(),
        p.include_deprecated.unwrap_or(false),
        limit,
    )
    .await?;
    let mut items: Vec<EventTypeOut> = rows.into_iter().map(out).collect();
    // hookd's own types go to the tenant's own endpoints only, never a customer's: a
    // consumer token is not shown them
    if caller.consumer_scope().is_none() {
        items.extend(
            catalog::RESERVED
                .iter()
                .filter(|r| p.cursor.as_deref().is_none_or(|c| r.name > c))
                .map(reserved_out),
        );
        items.sort_by(|a, b| a.name.cmp(&b.name));
        items.truncate(limit as usize);
    }
    let next_cursor = super::listing::next_cursor(&items, limit, |t| t.name.clone());
    Ok(Json(EventTypePage { items, next_cursor }).into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventTypeTenantParam {
    /// With authentication off: whose type (required then)
    tenant: Option<String>,
}

/// The tenant a route by name acts for, and the `{name}` of its path (a name that cannot
/// be an event type is as absent as an unknown one).
fn target(
    caller: &Caller,
    name: Result<Path<String>, PathRejection>,
    params: Result<Query<EventTypeTenantParam>, QueryRejection>,
) -> Result<(String, String), ApiError> {
    let p = query(params)?;
    let tenant = caller
        .resolve_tenant(p.tenant)?
        .ok_or_else(|| ApiError::unprocessable(ErrorCode::MissingField, "tenant is required"))?;
    let Ok(Path(name)) = name else {
        return Err(ApiError::not_found("event type"));
    };
    crate::domain::validate_event_type(&name).map_err(|_| ApiError::not_found("event type"))?;
    Ok((tenant, name))
}

/// GET /v1/event-types/{name}
#[utoipa::path(
    get,
    path = "/v1/event-types/{name}",
    tag = "event-types",
    operation_id = "getEventType",
    summary = "One event type, with its schema and example (scope: read; consumer tokens too)",
    params(("name" = String, Path, description = "The event type"), EventTypeTenantParam),
    responses(
        (status = 200, description = "The event type", body = EventTypeOut),
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
pub async fn get(
    caller: Caller,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    params: Result<Query<EventTypeTenantParam>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let (tenant, name) = target(&caller, name, params)?;
    if caller.consumer_scope().is_none()
        && let Some(r) = catalog::reserved(&name)
    {
        return Ok(Json(reserved_out(r)).into_response());
    }
    let row = db::event_types::get(&state.pool, &tenant, &name)
        .await?
        .ok_or_else(|| ApiError::not_found("event type"))?;
    Ok(Json(out(row)).into_response())
}

/// A change; absent fields stay as they are. The name stays: a new name is a new type.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EventTypePatchIn {
    /// `null` clears it
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>)]
    description: Option<Option<String>>,
    /// `null` removes the schema (payloads are then not checked, only the type's existence)
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Object>)]
    schema: Option<Option<serde_json::Value>>,
    /// `null` clears it
    #[serde(default, deserialize_with = "nullable")]
    #[schema(schema_with = super::openapi::any_json_or_null)]
    example: Option<Option<Box<RawValue>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<bool>)]
    deprecated: Option<Option<bool>>,
    /// `null` clears it
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>)]
    deprecation_note: Option<Option<String>>,
}

/// PATCH /v1/event-types/{name}
#[utoipa::path(
    patch,
    path = "/v1/event-types/{name}",
    tag = "event-types",
    operation_id = "updateEventType",
    summary = "Change an event type (scope: manage)",
    description = "Checked as a whole after the change (an example kept must match a new \
        schema). The next message sent with validate is checked against what is written, in \
        every API process.",
    params(("name" = String, Path, description = "The event type"), EventTypeTenantParam),
    request_body(content = EventTypePatchIn, content_type = "application/json"),
    responses(
        (status = 200, description = "The event type as changed", body = EventTypeOut),
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
    name: Result<Path<String>, PathRejection>,
    params: Result<Query<EventTypeTenantParam>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    state.admit_work(&caller, 0)?;
    let (tenant, name) = target(&caller, name, params)?;
    catalog::validate_name(&name)?;
    let input: EventTypePatchIn = state
        .read_json_body(&caller, &headers, body, BODY_LIMIT, false)
        .await?;
    let patch = db::event_types::EventTypePatch {
        description: input.description,
        schema: input.schema,
        example: input.example.map(|e| e.map(|raw| raw.get().to_string())),
        deprecated: not_null("deprecated", input.deprecated)?,
        deprecation_note: input.deprecation_note,
    };
    let row = catalog::change(&state.pool, &tenant, &name, patch)
        .await?
        .ok_or_else(|| ApiError::not_found("event type"))?;
    Ok(Json(out(row)).into_response())
}

/// DELETE /v1/event-types/{name}
#[utoipa::path(
    delete,
    path = "/v1/event-types/{name}",
    tag = "event-types",
    operation_id = "deleteEventType",
    summary = "Remove an event type from the catalog (scope: manage)",
    description = "Events of the type, and endpoints subscribed to it, stay; a message sent \
        with validate is refused (422 unknown_event_type) from then on.",
    params(("name" = String, Path, description = "The event type"), EventTypeTenantParam),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, response = responses::Unauthorized),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::NotFound),
        (status = 409, response = responses::Conflict),
        (status = 422, response = responses::Unprocessable),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    caller: Caller,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    params: Result<Query<EventTypeTenantParam>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Manage)?;
    caller.require_tenant_wide()?;
    state.admit_work(&caller, 0)?;
    let (tenant, name) = target(&caller, name, params)?;
    catalog::validate_name(&name)?;
    if !catalog::delete(&state.pool, &tenant, &name).await? {
        return Err(ApiError::not_found("event type"));
    }
    tracing::info!(event_type = %name, %tenant, "event type deleted through the API");
    Ok(StatusCode::NO_CONTENT.into_response())
}
