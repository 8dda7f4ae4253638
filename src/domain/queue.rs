//! The closed vocabularies of the queue: a delivery's status, the class of a failed
//! attempt, a circuit breaker's state. Each is stored as `text` (the spellings below are
//! the SQL literals, held to them by the CHECK constraints of migration 0001 where there
//! is one) and shown as the same string in the JSON API. The test
//! `sql_literals_are_the_values_of_the_queue_enums` (tests/dispatch.rs) pins the enums to
//! the constraints, partial-index predicates, functions and triggers of a migrated
//! database and to the statements of `src/db/`.

use std::fmt;

// `hookd.deliveries.status`. The doc line below is the OpenAPI description.
/// The states of a delivery.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    sqlx::Type,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum DeliveryStatus {
    // created, or replayed, and not tried yet
    Pending,
    // leased by a dispatcher (until `visible_at`, after which any claim may take it)
    InProgress,
    // an attempt failed; due again at `visible_at`
    Failed,
    Succeeded,
    // exhausted or refused for good; dead-lettered
    Dead,
    // its endpoint or consumer was removed before it was sent
    Cancelled,
}

impl DeliveryStatus {
    pub const ALL: [DeliveryStatus; 6] = [
        DeliveryStatus::Pending,
        DeliveryStatus::InProgress,
        DeliveryStatus::Failed,
        DeliveryStatus::Succeeded,
        DeliveryStatus::Dead,
        DeliveryStatus::Cancelled,
    ];

    /// What a window replay may select: every status but one a dispatcher holds.
    pub const REPLAYABLE: [DeliveryStatus; 5] = [
        DeliveryStatus::Pending,
        DeliveryStatus::Failed,
        DeliveryStatus::Succeeded,
        DeliveryStatus::Dead,
        DeliveryStatus::Cancelled,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::InProgress => "in_progress",
            DeliveryStatus::Failed => "failed",
            DeliveryStatus::Succeeded => "succeeded",
            DeliveryStatus::Dead => "dead",
            DeliveryStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<DeliveryStatus> {
        DeliveryStatus::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Waiting for its next attempt (whose time `visible_at` holds).
    pub fn is_waiting(self) -> bool {
        matches!(self, DeliveryStatus::Pending | DeliveryStatus::Failed)
    }
}

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an attempt failed: `hookd.delivery_attempts.error_class`, as the dispatcher
/// classifies it. The API shows it as a string, so a class added later is not a breaking
/// change of the document.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, sqlx::Type,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum ErrorClass {
    /// the request (connect included) took longer than the endpoint's timeout
    Timeout,
    /// the connection could not be made
    Connect,
    /// the receiver's host name did not resolve
    Dns,
    /// the response body could not be read
    Body,
    /// any other failure to send the request
    Request,
    /// the destination is refused by the outbound policy (never retried)
    DestinationForbidden,
    /// the endpoint's URL does not parse (never retried)
    InvalidUrl,
    /// the receiver answered with a status other than 2xx and 410
    HttpStatus,
    /// the receiver answered 410 Gone: the endpoint is disabled
    Gone,
    /// the endpoint had no usable signing secret when the attempt was made
    NoSigningSecret,
    /// a signing secret could not be decrypted here (a key missing from this
    /// dispatcher's keyring, or a tampered row): nothing was sent
    SecretUnreadable,
}

impl ErrorClass {
    pub const ALL: [ErrorClass; 11] = [
        ErrorClass::Timeout,
        ErrorClass::Connect,
        ErrorClass::Dns,
        ErrorClass::Body,
        ErrorClass::Request,
        ErrorClass::DestinationForbidden,
        ErrorClass::InvalidUrl,
        ErrorClass::HttpStatus,
        ErrorClass::Gone,
        ErrorClass::NoSigningSecret,
        ErrorClass::SecretUnreadable,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Timeout => "timeout",
            ErrorClass::Connect => "connect",
            ErrorClass::Dns => "dns",
            ErrorClass::Body => "body",
            ErrorClass::Request => "request",
            ErrorClass::DestinationForbidden => "destination_forbidden",
            ErrorClass::InvalidUrl => "invalid_url",
            ErrorClass::HttpStatus => "http_status",
            ErrorClass::Gone => "gone",
            ErrorClass::NoSigningSecret => "no_signing_secret",
            ErrorClass::SecretUnreadable => "secret_unreadable",
        }
    }

    pub fn parse(s: &str) -> Option<ErrorClass> {
        ErrorClass::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `hookd.endpoints.circuit_state`: an endpoint's circuit breaker.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, sqlx::Type,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum CircuitState {
    /// deliveries flow
    Closed,
    /// deliveries are held until `circuit_open_until`, when one probe is sent
    Open,
    /// one probe delivery is in flight and decides whether the circuit closes
    HalfOpen,
}

impl CircuitState {
    pub const ALL: [CircuitState; 3] = [
        CircuitState::Closed,
        CircuitState::Open,
        CircuitState::HalfOpen,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }

    pub fn parse(s: &str) -> Option<CircuitState> {
        CircuitState::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

impl fmt::Display for CircuitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `as_str` (Display, parse, the SQL literals) and serde (the JSON API) spell every
    /// value alike; sqlx's own rename is checked against the database in
    /// tests/dispatch.rs.
    fn spelled_alike<T>(all: &[T], as_str: fn(&T) -> &'static str, parse: fn(&str) -> Option<T>)
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + fmt::Debug + fmt::Display,
    {
        for v in all {
            let s = as_str(v);
            assert_eq!(serde_json::to_value(v).unwrap(), serde_json::json!(s));
            assert_eq!(
                &serde_json::from_value::<T>(serde_json::json!(s)).unwrap(),
                v
            );
            assert_eq!(parse(s).as_ref(), Some(v));
            assert_eq!(v.to_string(), s);
        }
        assert_eq!(parse("Pending"), None, "spellings are exact");
    }

    #[test]
    fn each_value_has_one_spelling() {
        spelled_alike(&DeliveryStatus::ALL, |v| v.as_str(), DeliveryStatus::parse);
        spelled_alike(&ErrorClass::ALL, |v| v.as_str(), ErrorClass::parse);
        spelled_alike(&CircuitState::ALL, |v| v.as_str(), CircuitState::parse);
    }

    #[test]
    fn replayable_is_every_status_a_dispatcher_does_not_hold() {
        let held: Vec<_> = DeliveryStatus::ALL
            .into_iter()
            .filter(|s| !DeliveryStatus::REPLAYABLE.contains(s))
            .collect();
        assert_eq!(held, [DeliveryStatus::InProgress]);
    }
}
