//! The OpenAPI 3.1 document, generated from the handlers' `#[utoipa::path]` attributes and
//! the request/response types. The router and the document are built from the same
//! `routes!` calls (see `api::routes`), so a route cannot be served without being
//! documented, or documented without being served.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::error::{ErrorBody, ErrorDetail};
use crate::domain::ErrorCode;

/// The name of the bearer security scheme every `/v1` operation requires.
pub const BEARER: &str = "bearer";
/// The optional scheme of `/metrics` (`HOOKD_METRICS_TOKEN`).
pub const METRICS_TOKEN: &str = "metrics_token";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "hookd",
        description = "Webhook gateway on the transactional outbox pattern. Every /v1 route \
            needs `Authorization: Bearer <token>`: a static API token (`hookd_…`, made by \
            `hookd token create`) or a Kubernetes ServiceAccount token with audience `hookd`. \
            The tenant comes from the credential. Errors are `{\"error\": {\"code\", \"message\"}}`; \
            the codes this version sends are the `ErrorCode` schema.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(
        schemas(ErrorBody, ErrorDetail, ErrorCode),
        responses(
            responses::BadRequest,
            responses::Unauthorized,
            responses::Forbidden,
            responses::NotFound,
            responses::RequestTimeout,
            responses::Conflict,
            responses::PayloadTooLarge,
            responses::UriTooLong,
            responses::UnsupportedMediaType,
            responses::Unprocessable,
            responses::TooManyRequests,
            responses::HeadersTooLarge,
            responses::Internal,
            responses::Unavailable,
        )
    ),
    modifiers(&BearerScheme),
    tags(
        (name = "messages", description = "Enqueue events and read them back"),
        (name = "deliveries", description = "Inspect, replay and dead-letter deliveries"),
        (name = "operations", description = "Health, readiness, metrics and this document"),
        (name = "tokens", description = "List and revoke the tenant's API tokens"),
        (name = "sources", description = "Receive third-party webhooks (Stripe, GitHub, …) at POST /in/{name}, verified and enqueued like produced events"),
        (name = "event-types", description = "The event-type catalog: names, descriptions, JSON Schemas and examples customers browse, and producers may be checked against"),
    )
)]
pub struct ApiDoc;

struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format(
                        "hookd_ API token, or Kubernetes ServiceAccount JWT with audience hookd",
                    )
                    .description(Some(
                        "Missing or invalid: 401 with WWW-Authenticate. Valid but lacking the \
                         route's scope (produce, read or operate), or naming another tenant: 403.",
                    ))
                    .build(),
            ),
        );
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
            METRICS_TOKEN,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The operator's HOOKD_METRICS_TOKEN; /metrics needs it only when it is set",
                    ))
                    .build(),
            ),
        );
    }
}

/// Schema of an event type's example: any JSON value, `null` for none (kept byte for byte).
pub fn any_json_or_null() -> utoipa::openapi::schema::Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::Array(vec![
            Type::Object,
            Type::Array,
            Type::String,
            Type::Number,
            Type::Boolean,
            Type::Null,
        ]))
        .description(Some(
            "Any JSON value, kept byte for byte (key order, whitespace, big numbers); null for none",
        ))
        .build()
}

/// Schema of a payload: any JSON value except null (stored and sent byte for byte).
pub fn any_json_but_null() -> utoipa::openapi::schema::Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::Array(vec![
            Type::Object,
            Type::Array,
            Type::String,
            Type::Number,
            Type::Boolean,
        ]))
        .description(Some(
            "Any JSON value except null, kept byte for byte (key order, whitespace, big numbers)",
        ))
        .build()
}

/// The whole document (built once; `GET /openapi.json` serves these bytes).
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = super::routes().split_for_parts().1;
    camel_case_links(&mut doc);
    listener_answers(&mut doc);
    doc
}

/// The answers the listener gives before any handler runs, whatever the route
/// (`api::server`): 408 when the request's head or body is too slow, 414 for a request
/// line over the limit, 431 for headers over it. Documented here, once, on every
/// operation, rather than in each handler's list (where 26 of 37 operations lacked them).
const LISTENER_ANSWERS: [(&str, &str); 3] = [
    ("408", "RequestTimeout"),
    ("414", "UriTooLong"),
    ("431", "HeadersTooLarge"),
];

fn listener_answers(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{Ref, RefOr};
    for op in operations_mut(doc) {
        for (status, response) in LISTENER_ANSWERS {
            op.responses
                .responses
                .entry(status.to_owned())
                .or_insert_with(|| RefOr::Ref(Ref::from_response_name(response)));
        }
    }
}

/// Every operation of the document, whatever its method.
fn operations_mut(
    doc: &mut utoipa::openapi::OpenApi,
) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    doc.paths.paths.values_mut().flat_map(|item| {
        [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ]
        .into_iter()
        .flatten()
    })
}

/// utoipa 5.5 serializes a Link object's `operationId` as `operation_id` (its `Link` lacks
/// serde's camelCase renaming), which OpenAPI tools ignore: schemathesis followed none of
/// the links. The handlers' `links(...)` give only `operation_id` and `parameters`; this
/// moves the id to the field's OpenAPI name, through the extensions map that is
/// serialized flat into the Link object.
fn camel_case_links(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::RefOr;
    for op in operations_mut(doc) {
        for response in op.responses.responses.values_mut() {
            let RefOr::T(response) = response else {
                continue;
            };
            for link in response.links.values_mut() {
                let RefOr::T(link) = link else { continue };
                if link.operation_id.is_empty() {
                    continue;
                }
                let id = std::mem::take(&mut link.operation_id);
                link.extensions
                    .get_or_insert_with(Default::default)
                    .insert("operationId".into(), id.into());
            }
        }
    }
}

static DOCUMENT_JSON: LazyLock<String> = LazyLock::new(|| {
    document()
        .to_json()
        .expect("the OpenAPI document serializes")
});

/// GET /openapi.json
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    operation_id = "openapi",
    summary = "This OpenAPI 3.1 document",
    security(()),
    responses(
        (status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json", body = Object),
    )
)]
pub async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT_JSON.as_str(),
    )
        .into_response()
}

/// Reusable error responses. The types exist for the document only.
#[allow(dead_code)]
pub mod responses {
    use utoipa::ToResponse;

    use super::ErrorBody;

    /// Malformed JSON (`malformed_json`), or an id that is not a UUID (`invalid_id`)
    #[derive(ToResponse)]
    pub struct BadRequest(ErrorBody);

    /// No credential (`unauthenticated`), or one that is malformed, unknown, revoked or
    /// expired (`invalid_credential`)
    #[derive(ToResponse)]
    #[response(headers(("WWW-Authenticate" = String, description = "`Bearer realm=\"hookd\"`, with `error=\"invalid_token\"` for a bad credential")))]
    pub struct Unauthorized(ErrorBody);

    /// The credential lacks this route's scope (`insufficient_scope`), or the request names
    /// a tenant other than the credential's (`tenant_mismatch`)
    #[derive(ToResponse)]
    #[response(headers(("WWW-Authenticate" = String, description = "`Bearer error=\"insufficient_scope\", scope=\"…\"` when a scope is missing")))]
    pub struct Forbidden(ErrorBody);

    /// No such object for the caller's tenant; another tenant's object gets this same answer
    #[derive(ToResponse)]
    pub struct NotFound(ErrorBody);

    /// The request, body upload included, took longer than HOOKD_API_REQUEST_TIMEOUT_SECS
    /// (`request_timeout`)
    #[derive(ToResponse)]
    pub struct RequestTimeout(ErrorBody);

    /// The idempotency key was used with other content (`idempotency_key_conflict`), or a
    /// dispatcher is sending the delivery right now (`delivery_leased`)
    #[derive(ToResponse)]
    pub struct Conflict(ErrorBody);

    /// The body or a payload is over its limit (`body_too_large`, `payload_too_large`)
    #[derive(ToResponse)]
    pub struct PayloadTooLarge(ErrorBody);

    /// The request target is longer than HOOKD_API_MAX_URL_BYTES (`uri_too_long`)
    #[derive(ToResponse)]
    pub struct UriTooLong(ErrorBody);

    /// The body is not `application/json` (`unsupported_media_type`)
    #[derive(ToResponse)]
    pub struct UnsupportedMediaType(ErrorBody);

    /// A field or parameter is missing, unknown or invalid
    #[derive(ToResponse)]
    pub struct Unprocessable(ErrorBody);

    /// The tenant is over HOOKD_TENANT_RATE_LIMIT (`rate_limited`); nothing was written
    #[derive(ToResponse)]
    #[response(headers(("Retry-After" = u64, description = "seconds to wait")))]
    pub struct TooManyRequests(ErrorBody);

    /// The request headers are larger than HOOKD_API_MAX_HEADER_BYTES (`headers_too_large`)
    #[derive(ToResponse)]
    pub struct HeadersTooLarge(ErrorBody);

    /// An unexpected error (`internal`); nothing was written
    #[derive(ToResponse)]
    pub struct Internal(ErrorBody);

    /// The database or the Kubernetes API server (for ServiceAccount tokens) is unreachable
    /// (`database_unavailable`, `auth_unavailable`, `shutting_down`); never a 2xx
    #[derive(ToResponse)]
    #[response(headers(("Retry-After" = u64, description = "seconds to wait")))]
    pub struct Unavailable(ErrorBody);
}

#[cfg(test)]
mod tests {
    /// clients/openapi.json is the document the API serves; the producer clients in
    /// clients/ are generated from that file, so a route or field changed without it
    /// fails here (and the clients follow once it is rewritten).
    #[test]
    fn clients_openapi_json_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/openapi.json");
        // The served bytes, indented so that a change reads as a diff.
        let rendered = super::document().to_pretty_json().unwrap() + "\n";
        if std::env::var_os("HOOKD_UPDATE_DOCS").is_some() {
            std::fs::write(path, &rendered).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == rendered,
            "clients/openapi.json differs from the document the API serves; rerun with \
             HOOKD_UPDATE_DOCS=1 cargo test --lib clients_openapi_json and regenerate the \
             TypeScript types (cd clients/typescript && npm run generate)"
        );
    }

    /// The document lists every error code the server can send, and only those: the
    /// `ErrorCode` schema is the enum every error answer is built from.
    #[test]
    fn the_document_lists_every_error_code() {
        let doc = serde_json::to_value(super::document()).unwrap();
        let listed: Vec<&str> = doc["components"]["schemas"]["ErrorCode"]["enum"]
            .as_array()
            .expect("an ErrorCode enum in the document")
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let sent: Vec<&str> = crate::domain::ErrorCode::ALL
            .iter()
            .map(|c| c.as_str())
            .collect();
        assert_eq!(listed, sent);
    }

    /// Every operation documents the answers the listener gives before any handler runs.
    #[test]
    fn every_operation_documents_the_listener_answers() {
        let doc = serde_json::to_value(super::document()).unwrap();
        let mut operations = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                operations += 1;
                for (status, _) in super::LISTENER_ANSWERS {
                    assert!(
                        op["responses"].get(status).is_some(),
                        "{method} {path} does not document {status}"
                    );
                }
            }
        }
        assert!(operations >= 37, "{operations} operations");
    }
}
