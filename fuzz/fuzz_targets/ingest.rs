//! The ingest body: what `POST /v1/messages` and `POST /v1/messages/batch` do with the
//! body bytes before rate limiting and the database (`api::parse_ingest_body`, the code
//! the handlers run).
//!
//! Input: one mode byte, then the body. The mode byte's low bits pick the route (bit 0:
//! batch), whether a credential for tenant `acme` is present (bit 1; without it the body
//! names the tenant, as with `HOOKD_AUTH=none`) and whether an `Idempotency-Key: k-1`
//! header is sent (bit 2, single route only). The seeds use `0`..`7`.
#![no_main]

use std::time::Duration;

use hookd::api::{IngestRoute, Limits, parse_ingest_body};
use hookd::outbox::{validate_event_type, validate_idempotency_key, validate_tenant};
use libfuzzer_sys::fuzz_target;

/// Small limits, so the fuzzer reaches the size checks with short inputs.
const LIMITS: Limits = Limits {
    max_payload_bytes: 64,
    max_body_bytes: 1024,
    max_batch: 4,
    max_batch_body_bytes: 4096,
    request_timeout: Duration::from_secs(30),
    max_header_bytes: 16 * 1024,
    max_url_bytes: 4096,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let route = if mode & 1 == 0 {
        IngestRoute::Single
    } else {
        IngestRoute::Batch
    };
    let tenant = (mode & 2 != 0).then_some("acme");
    let header_key = (mode & 4 != 0 && route == IngestRoute::Single).then_some("k-1");

    match parse_ingest_body(route, body, tenant, header_key, &LIMITS) {
        Ok(messages) => {
            assert!(!messages.is_empty() && messages.len() <= LIMITS.max_batch);
            if route == IngestRoute::Single {
                assert_eq!(messages.len(), 1);
            }
            for m in &messages {
                // What is accepted is what the database and the dispatcher rely on.
                assert!(validate_tenant(&m.tenant).is_ok(), "{:?}", m.tenant);
                if let Some(t) = tenant {
                    assert_eq!(m.tenant, t, "a body tenant overrode the credential");
                }
                assert!(
                    validate_event_type(&m.event_type).is_ok(),
                    "{:?}",
                    m.event_type
                );
                if let Some(k) = &m.idempotency_key {
                    assert!(validate_idempotency_key(k).is_ok(), "{k:?}");
                }
                assert!(m.payload.len() <= LIMITS.max_payload_bytes);
                // Stored and signed byte for byte: it must be JSON, and not null.
                let v: serde_json::Value = serde_json::from_str(&m.payload)
                    .unwrap_or_else(|e| panic!("payload {:?} is not JSON: {e}", m.payload));
                assert!(!v.is_null());
            }
        }
        Err(e) => {
            // Bad input is the client's fault: a 4xx from the list the OpenAPI document
            // gives for these routes, never a 5xx.
            assert!(
                matches!(e.status.as_u16(), 400 | 403 | 413 | 422),
                "status {} for {e:?}",
                e.status
            );
        }
    }
});
