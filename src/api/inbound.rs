//! `POST /in/{name}`: a provider's webhook to an inbound source. Public: the provider's
//! signature is the credential. The request is verified with the source's secrets, then
//! its exact body and its deliveries commit in one transaction (the outbox's) before the
//! 202; a provider's retry of one event is a duplicate that writes nothing. An unknown
//! source and a bad signature get the same 401 and store nothing.

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use super::openapi::responses;
use crate::auth::{Principal, Scope, Subject};
use crate::db::sources::SourceRow;
use crate::domain::ErrorCode;
use crate::inbound::cache::{OpenError, Ready};
use crate::inbound::{providers, sources};
use crate::metrics::InboundOutcome;
use crate::outbox::EnqueueError;

/// What a source answers a request it took.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboundOut {
    event_id: Uuid,
    delivery_ids: Vec<Uuid>,
    /// true when this provider event was taken before: nothing was written
    duplicate: bool,
}

/// Slack's check of a Request URL, answered.
#[derive(Serialize, ToSchema)]
pub struct ChallengeOut {
    /// the challenge of the signed `url_verification` request, echoed
    challenge: String,
}

/// One answer for an unknown source and for a request its provider did not sign: a
/// scanner learns nothing about which names exist.
fn unauthorized() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        ErrorCode::InboundUnauthorized,
        "no source takes this request: the name is unknown, or the request is not signed with the source's secret (a stale or missing signature included)",
    )
}

/// Counts a request in the metrics and, for a source that exists, on its console page.
fn count(state: &AppState, source: Option<&SourceRow>, outcome: &'static str) {
    state
        .metrics
        .inbound_requests
        .get_or_create(&InboundOutcome {
            source: source.map_or("(unknown)", |s| s.name.as_str()).to_string(),
            outcome,
        })
        .inc();
    if let Some(s) = source {
        state.source_requests.count(s.id, outcome);
    }
}

/// Without a listener (see `inbound::cache`), how slow a body read must be for the source
/// to be read again before the request is verified.
const REREAD_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// The source named `name`, ready to verify with; an unknown one is the one 401, and what
/// keeps a known one from verifying is answered (and counted) here.
async fn open(
    state: &AppState,
    keyring: &crate::crypto::Keyring,
    name: &str,
) -> Result<std::sync::Arc<Ready>, ApiError> {
    match state.sources.get(&state.pool, keyring, name).await {
        Ok(Some(ready)) => Ok(ready),
        Ok(None) => {
            count(state, None, "unknown_source");
            Err(unauthorized())
        }
        Err(e) => {
            count(state, None, "unavailable");
            match e {
                OpenError::Db(e) => Err(e.into()),
                OpenError::Corrupt(_) => {
                    tracing::error!(source = %name, error = %e, "a stored source cannot be read");
                    Err(ApiError::internal())
                }
                // every secret is sealed under a key this process lacks: not the sender's
                // fault, and the provider retries a 503
                OpenError::Sealed => Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::EncryptionUnavailable,
                    "this API process cannot open the source's secrets (its HOOKD_ENCRYPTION_KEY or HOOKD_ENCRYPTION_OLD_KEYS lacks the key they were sealed with); nothing was written, retry later",
                )),
            }
        }
    }
}

/// POST /in/{name}
#[utoipa::path(
    post,
    path = "/in/{name}",
    tag = "sources",
    operation_id = "receiveInbound",
    summary = "A provider's webhook to an inbound source (no hookd token: the signature is the credential)",
    description = "Verified with the source's provider rules and secrets, then committed with \
        its deliveries before the 202. A provider event taken before answers 202 with \
        duplicate: true and writes nothing. Unknown source and bad signature: the same 401.",
    params(("name" = String, Path, description = "The source's name")),
    request_body(content = serde_json::Value, content_type = "application/json", description = "The provider's body, forwarded byte for byte"),
    responses(
        (status = 200, description = "A Slack source's signed url_verification: its challenge (not an event)", body = ChallengeOut),
        (status = 202, description = "Taken (or taken before)", body = InboundOut),
        (status = 401, response = responses::Unauthorized),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 429, response = responses::TooManyRequests),
        (status = 500, response = responses::Internal),
        (status = 503, response = responses::Unavailable),
    ),
    security(())
)]
pub async fn receive(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = match name {
        Ok(Path(n)) if sources::validate_name(&n).is_ok() => n,
        _ => {
            count(&state, None, "unknown_source");
            return Err(unauthorized());
        }
    };
    let keyring = super::endpoints::keyring(&state)?;
    let generation = state.sources.generation();
    let first = open(&state, keyring, &name).await?;
    let source = &first.source;
    // Admitted on its head as the source itself (`in:{name}`, never a tenant's name: a
    // tenant has no ':'), from the inbound budget: its own share of body bytes in flight
    // and its own rate bucket, so requests nobody signed, slow or many, cost the source
    // they are sent to and never the producers' ingest. The tenant's rate is charged once
    // the request is verified.
    let caller = Caller::Authenticated(Principal {
        tenant: format!("in:{}", source.name),
        consumer: None,
        consumer_generation: None,
        consumer_since: None,
        scopes: vec![Scope::Produce],
        subject: Subject::Source { id: source.id },
    });
    // a body is at most what an event's payload may be
    let max = usize::try_from(source.max_body_bytes).unwrap_or(0);
    let refused = |e: ApiError| {
        count(&state, Some(source), "not_admitted");
        e
    };
    let mut admitted = state
        .admit_inbound(&caller, &headers, max.min(state.limits.max_payload_bytes))
        .map_err(refused)?;
    let read_started = std::time::Instant::now();
    let bytes = admitted.read(body).await.map_err(refused)?;
    // A change heard while the body was read (a rotation without grace, a deletion)
    // applies to this request too: it is verified with the source as it is now. Without a
    // listener nothing is heard, so a slow body reads the source again.
    let ready = if state.sources.generation() != generation
        || (!state.sources.is_live() && read_started.elapsed() > REREAD_AFTER)
    {
        open(&state, keyring, &name).await?
    } else {
        first.clone()
    };
    let (source, provider) = (&ready.source, &ready.provider);
    let now = chrono::Utc::now();
    let refs = ready.secrets_at(now);
    let verified =
        providers::verify(provider, &refs, &headers, &bytes, now).map_err(|refusal| {
            count(&state, Some(source), refusal.reason());
            unauthorized()
        })?;
    if let Some(challenge) = sources::slack_url_verification(provider, &bytes) {
        // Slack checks a Request URL once, with a signed challenge it wants echoed; it is
        // not an event
        count(&state, Some(source), "url_verification");
        return Ok(Json(ChallengeOut { challenge }).into_response());
    }
    let event = sources::event(source, provider, &verified, &headers, &bytes).map_err(|e| {
        count(&state, Some(source), "not_json");
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::InboundNotJson,
            e.to_string(),
        )
    })?;
    drop(bytes);
    let msg = crate::outbox::NewMessage {
        tenant: source.tenant.clone(),
        event_type: event.event_type,
        payload: event.payload,
        idempotency_key: Some(event.idempotency_key),
        consumer: source.consumer.clone(),
        origin: Some(event.origin),
        // a provider that traces its webhooks (most do not) joins the receiver's trace
        trace: crate::domain::TraceContext::from_headers(&headers),
        ordering_key: None,
    };
    // verified but not committed (the tenant's rate, an outage): counted, and the
    // provider retries what it was not given a 2xx for
    let taken = async {
        admitted.admit_events(&state, &[(msg.tenant.as_str(), 1)])?;
        let key = (
            msg.tenant.clone(),
            msg.idempotency_key.clone().unwrap_or_default(),
        );
        match admitted.enqueue_outcome(&state, vec![msg]).await? {
            Ok(done) => {
                let e = done.into_iter().next().expect("one result per message");
                Ok((e.event_id, e.delivery_ids, e.created))
            }
            // the provider sent this event id before with another body: it is the same
            // event (ids are the provider's promise), taken once
            Err(EnqueueError::KeyConflict { .. }) => {
                let mut conn = state
                    .pool
                    .acquire()
                    .await
                    .map_err(crate::db::DbError::from)?;
                let found = crate::db::events::find_by_keys(&mut conn, &[key]).await?;
                let e = found.into_iter().next().ok_or_else(ApiError::internal)?;
                Ok((e.event_id, e.delivery_ids, false))
            }
            Err(e) => Err(ApiError::from(e)),
        }
    };
    let (event_id, delivery_ids, created) = taken
        .await
        .inspect_err(|_: &ApiError| count(&state, Some(source), "not_taken"))?;
    if created {
        state.metrics.count_enqueued(delivery_ids.len());
    }
    count(
        &state,
        Some(source),
        if created { "accepted" } else { "duplicate" },
    );
    Ok((
        StatusCode::ACCEPTED,
        Json(InboundOut {
            event_id,
            delivery_ids,
            duplicate: !created,
        }),
    )
        .into_response())
}
