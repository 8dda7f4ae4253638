//! The stable `code` of every error answer, `{"error": {"code", "message"}}`: one list for
//! every component that answers HTTP and for the OpenAPI document, where it is an enum.
//! Clients match on these; a code is never renamed or dropped (the message may change).

/// The `code` of an error answer: the codes this version sends. Later versions may add
/// codes; none is renamed or removed.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    AuthUnavailable,
    BatchTooLarge,
    BodyTooLarge,
    CommitOutcomeUnknown,
    ConsumerDeleted,
    ConsumerEndpointLimit,
    ConsumerMismatch,
    ConsumerRateLimited,
    ConsumerReadRateLimited,
    ConsumerRequestsBusy,
    ConsumerToken,
    DatabaseUnavailable,
    DeliveryLeased,
    DuplicateAuthorization,
    EmptyBatch,
    EncryptionUnavailable,
    EndpointDisabled,
    FilterNotServed,
    HeadersTooLarge,
    IdempotencyKeyConflict,
    IdempotencyKeyHeaderOnBatch,
    IdempotencyKeyInUse,
    IdempotencyKeyMismatch,
    IngestBusy,
    InsufficientScope,
    Internal,
    InvalidConsumer,
    InvalidContentLength,
    InvalidCredential,
    InvalidCursor,
    InvalidEventType,
    InvalidField,
    InvalidId,
    InvalidIdempotencyKey,
    InvalidLimit,
    InvalidQuery,
    InvalidStatus,
    InvalidTenant,
    InvalidTestEventType,
    MalformedJson,
    ManagedByKubernetes,
    MethodNotAllowed,
    MissingField,
    NotASession,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    SessionNeedsToken,
    ShuttingDown,
    SignInCodeInvalid,
    TenantEndpointLimit,
    TenantIngestBusy,
    TenantMismatch,
    Unauthenticated,
    UnsupportedMediaType,
    UriTooLong,
    WeakSecret,
    WriteConflict,
}

impl ErrorCode {
    /// Every code, in the document's order.
    pub const ALL: &[ErrorCode] = &[
        ErrorCode::AuthUnavailable,
        ErrorCode::BatchTooLarge,
        ErrorCode::BodyTooLarge,
        ErrorCode::CommitOutcomeUnknown,
        ErrorCode::ConsumerDeleted,
        ErrorCode::ConsumerEndpointLimit,
        ErrorCode::ConsumerMismatch,
        ErrorCode::ConsumerRateLimited,
        ErrorCode::ConsumerReadRateLimited,
        ErrorCode::ConsumerRequestsBusy,
        ErrorCode::ConsumerToken,
        ErrorCode::DatabaseUnavailable,
        ErrorCode::DeliveryLeased,
        ErrorCode::DuplicateAuthorization,
        ErrorCode::EmptyBatch,
        ErrorCode::EncryptionUnavailable,
        ErrorCode::EndpointDisabled,
        ErrorCode::FilterNotServed,
        ErrorCode::HeadersTooLarge,
        ErrorCode::IdempotencyKeyConflict,
        ErrorCode::IdempotencyKeyHeaderOnBatch,
        ErrorCode::IdempotencyKeyInUse,
        ErrorCode::IdempotencyKeyMismatch,
        ErrorCode::IngestBusy,
        ErrorCode::InsufficientScope,
        ErrorCode::Internal,
        ErrorCode::InvalidConsumer,
        ErrorCode::InvalidContentLength,
        ErrorCode::InvalidCredential,
        ErrorCode::InvalidCursor,
        ErrorCode::InvalidEventType,
        ErrorCode::InvalidField,
        ErrorCode::InvalidId,
        ErrorCode::InvalidIdempotencyKey,
        ErrorCode::InvalidLimit,
        ErrorCode::InvalidQuery,
        ErrorCode::InvalidStatus,
        ErrorCode::InvalidTenant,
        ErrorCode::InvalidTestEventType,
        ErrorCode::MalformedJson,
        ErrorCode::ManagedByKubernetes,
        ErrorCode::MethodNotAllowed,
        ErrorCode::MissingField,
        ErrorCode::NotASession,
        ErrorCode::NotFound,
        ErrorCode::PayloadTooLarge,
        ErrorCode::RateLimited,
        ErrorCode::RequestTimeout,
        ErrorCode::SessionNeedsToken,
        ErrorCode::ShuttingDown,
        ErrorCode::SignInCodeInvalid,
        ErrorCode::TenantEndpointLimit,
        ErrorCode::TenantIngestBusy,
        ErrorCode::TenantMismatch,
        ErrorCode::Unauthenticated,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::UriTooLong,
        ErrorCode::WeakSecret,
        ErrorCode::WriteConflict,
    ];

    /// The code as it is sent.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::AuthUnavailable => "auth_unavailable",
            ErrorCode::BatchTooLarge => "batch_too_large",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::CommitOutcomeUnknown => "commit_outcome_unknown",
            ErrorCode::ConsumerDeleted => "consumer_deleted",
            ErrorCode::ConsumerEndpointLimit => "consumer_endpoint_limit",
            ErrorCode::ConsumerMismatch => "consumer_mismatch",
            ErrorCode::ConsumerRateLimited => "consumer_rate_limited",
            ErrorCode::ConsumerReadRateLimited => "consumer_read_rate_limited",
            ErrorCode::ConsumerRequestsBusy => "consumer_requests_busy",
            ErrorCode::ConsumerToken => "consumer_token",
            ErrorCode::DatabaseUnavailable => "database_unavailable",
            ErrorCode::DeliveryLeased => "delivery_leased",
            ErrorCode::DuplicateAuthorization => "duplicate_authorization",
            ErrorCode::EmptyBatch => "empty_batch",
            ErrorCode::EncryptionUnavailable => "encryption_unavailable",
            ErrorCode::EndpointDisabled => "endpoint_disabled",
            ErrorCode::FilterNotServed => "filter_not_served",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::IdempotencyKeyConflict => "idempotency_key_conflict",
            ErrorCode::IdempotencyKeyHeaderOnBatch => "idempotency_key_header_on_batch",
            ErrorCode::IdempotencyKeyInUse => "idempotency_key_in_use",
            ErrorCode::IdempotencyKeyMismatch => "idempotency_key_mismatch",
            ErrorCode::IngestBusy => "ingest_busy",
            ErrorCode::InsufficientScope => "insufficient_scope",
            ErrorCode::Internal => "internal",
            ErrorCode::InvalidConsumer => "invalid_consumer",
            ErrorCode::InvalidContentLength => "invalid_content_length",
            ErrorCode::InvalidCredential => "invalid_credential",
            ErrorCode::InvalidCursor => "invalid_cursor",
            ErrorCode::InvalidEventType => "invalid_event_type",
            ErrorCode::InvalidField => "invalid_field",
            ErrorCode::InvalidId => "invalid_id",
            ErrorCode::InvalidIdempotencyKey => "invalid_idempotency_key",
            ErrorCode::InvalidLimit => "invalid_limit",
            ErrorCode::InvalidQuery => "invalid_query",
            ErrorCode::InvalidStatus => "invalid_status",
            ErrorCode::InvalidTenant => "invalid_tenant",
            ErrorCode::InvalidTestEventType => "invalid_test_event_type",
            ErrorCode::MalformedJson => "malformed_json",
            ErrorCode::ManagedByKubernetes => "managed_by_kubernetes",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::MissingField => "missing_field",
            ErrorCode::NotASession => "not_a_session",
            ErrorCode::NotFound => "not_found",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::SessionNeedsToken => "session_needs_token",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::SignInCodeInvalid => "sign_in_code_invalid",
            ErrorCode::TenantEndpointLimit => "tenant_endpoint_limit",
            ErrorCode::TenantIngestBusy => "tenant_ingest_busy",
            ErrorCode::TenantMismatch => "tenant_mismatch",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::UriTooLong => "uri_too_long",
            ErrorCode::WeakSecret => "weak_secret",
            ErrorCode::WriteConflict => "write_conflict",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    /// What is sent (serde) is what the code says it is, for every code.
    #[test]
    fn every_code_serializes_as_its_name() {
        for c in ErrorCode::ALL {
            assert_eq!(
                serde_json::to_value(c).unwrap(),
                serde_json::Value::from(c.as_str())
            );
        }
    }
}
