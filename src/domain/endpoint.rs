//! The closed vocabularies of an endpoint: its state, which door owns it, how it orders
//! keyed deliveries and what a dead letter does to a key, and its rate limit. Each is stored
//! as `text` with a CHECK constraint (migrations 0001, 0007 and 0034 spell the same values; the
//! test `sql_literals_are_the_values_of_the_queue_enums` in tests/dispatch.rs ties them)
//! and shown as the same string in the JSON API.

use std::fmt;

// `hookd.endpoints.state`. The doc line below is the OpenAPI description.
/// Whether an endpoint is sent to.
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
pub enum EndpointState {
    // subscribed and sent to (its circuit may still hold deliveries back)
    Active,
    // subscribed, deliveries kept until it is resumed: paused by its owner, or held by the
    // controller while its Secret or spec cannot be used
    Paused,
    // not subscribed: its receiver answered 410, or it was removed with its consumer or
    // its declaration; the reason says which
    Disabled,
}

impl EndpointState {
    pub const ALL: [EndpointState; 3] = [
        EndpointState::Active,
        EndpointState::Paused,
        EndpointState::Disabled,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            EndpointState::Active => "active",
            EndpointState::Paused => "paused",
            EndpointState::Disabled => "disabled",
        }
    }

    pub fn parse(s: &str) -> Option<EndpointState> {
        EndpointState::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

impl fmt::Display for EndpointState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// `hookd.endpoints.managed_by`. The doc line below is the OpenAPI description.
/// Which door owns an endpoint: a WebhookEndpoint object (or `hookd apply`), or the API.
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
pub enum ManagedBy {
    // declared: changed only by its declaration, read-only through the API
    Kubernetes,
    // created through the endpoints API or the portal
    Api,
}

impl ManagedBy {
    pub const ALL: [ManagedBy; 2] = [ManagedBy::Kubernetes, ManagedBy::Api];

    pub const fn as_str(self) -> &'static str {
        match self {
            ManagedBy::Kubernetes => "kubernetes",
            ManagedBy::Api => "api",
        }
    }
}

impl fmt::Display for ManagedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `as_str` (Display, the SQL literals) and serde (the JSON API) spell every value alike.
    #[test]
    fn serde_and_as_str_agree() {
        for s in EndpointState::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
            assert_eq!(EndpointState::parse(s.as_str()), Some(s));
        }
        for m in ManagedBy::ALL {
            assert_eq!(serde_json::to_value(m).unwrap(), m.as_str());
        }
    }
}

/// Bounds of a rate limit (migration 0032's CHECK states the same numbers).
pub const RATE_PER_SECOND: (f64, f64) = (0.01, 100_000.0);

/// The CRD's rule for `spec.rateLimit` (the schema's `minimum` alone is not enough: the API
/// server compares an integer value with a bound cast to an integer, so `perSecond: 0` passed
/// `minimum: 0.01` on a real kube-apiserver), and the one refusal of a rate in every door.
pub const RATE_PER_SECOND_CEL: &str = "self.perSecond >= 0.01 && self.perSecond <= 100000.0";
pub const RATE_PER_SECOND_RULE: &str =
    "rateLimit.perSecond must be between 0.01 and 100000 (deliveries a second)";
/// The CRD's rule for a burst too small for the rate: tokens are handed out in steps of
/// 50 ms (migration 0032), so a burst below a twentieth of the rate would make every step
/// a claim of fewer rows than the step allows (measured: 240 a second at 1000/s, burst 1).
pub const RATE_BURST_CEL: &str = "!has(self.burst) || double(self.burst) >= self.perSecond * 0.05";
pub const RATE_BURST_RULE: &str = "rateLimit.burst must be at least perSecond / 20 (hookd hands out a rate's deliveries in steps of 50 ms, and a burst must hold one step)";
pub const RATE_BURST: (u32, u32) = (1, 100_000);

/// At most `per_second` deliveries a second to one endpoint, across every dispatcher
/// replica, with bursts of up to `burst` after a quiet spell (a token bucket the claim
/// charges: migration 0032). Deliveries held back wait unleased; they are not attempts.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimit {
    /// Most deliveries a second, 0.01-100000 (0.5: one every two seconds).
    #[schemars(range(min = 0.01, max = 100000.0))]
    #[schema(minimum = 0.01, maximum = 100000)]
    pub per_second: f64,
    /// Most deliveries sent at once after a quiet spell, 1-100000. Default: perSecond
    /// rounded up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    #[schema(minimum = 1, maximum = 100000)]
    pub burst: Option<u32>,
}

impl RateLimit {
    /// The burst, or its default: `per_second` rounded up (at least 1).
    pub fn burst_or_default(&self) -> u32 {
        self.burst
            .unwrap_or_else(|| (self.per_second.ceil() as u32).clamp(RATE_BURST.0, RATE_BURST.1))
    }

    /// The limit as stored (burst resolved), or the first broken rule as
    /// `rateLimit.field: problem`.
    pub fn validate(&self) -> Result<RateLimit, String> {
        let (lo, hi) = RATE_PER_SECOND;
        if !self.per_second.is_finite() || self.per_second < lo || self.per_second > hi {
            // {:?}: 1e-300 as written, not as 300 digits
            return Err(format!("{RATE_PER_SECOND_RULE}; got {:?}", self.per_second));
        }
        let burst = self.burst_or_default();
        let (lo, hi) = RATE_BURST;
        if burst < lo || burst > hi {
            return Err(format!("rateLimit.burst {burst} is outside {lo}-{hi}"));
        }
        if f64::from(burst) < self.per_second * 0.05 {
            return Err(format!(
                "{RATE_BURST_RULE}; got {burst} for {:?}/s",
                self.per_second
            ));
        }
        Ok(RateLimit {
            per_second: self.per_second,
            burst: Some(burst),
        })
    }
}

// `hookd.endpoints.ordering` (migration 0034).
/// Whether an endpoint is sent the deliveries of one `orderingKey` in order.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    sqlx::Type,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase")]
#[sqlx(type_name = "text", rename_all = "camelCase")]
pub enum DeliveryOrder {
    /// deliveries are sent as they come due, several at once (the default)
    #[default]
    None,
    /// the deliveries of one ordering key are sent one at a time, in the order their
    /// events committed; deliveries without a key are not held
    PerKey,
}

impl DeliveryOrder {
    pub const ALL: [DeliveryOrder; 2] = [DeliveryOrder::None, DeliveryOrder::PerKey];

    pub const fn as_str(self) -> &'static str {
        match self {
            DeliveryOrder::None => "none",
            DeliveryOrder::PerKey => "perKey",
        }
    }
}

// `hookd.endpoints.on_dead_letter` (migration 0034).
/// What an endpoint that orders by key does after a delivery of a key is dead-lettered.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    sqlx::Type,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase")]
#[sqlx(type_name = "text", rename_all = "camelCase")]
pub enum OnDeadLetter {
    /// the key's next delivery is sent (the default)
    #[default]
    Continue,
    /// the key stops until the dead delivery is replayed or the endpoint says `continue`
    Hold,
}

impl OnDeadLetter {
    pub const ALL: [OnDeadLetter; 2] = [OnDeadLetter::Continue, OnDeadLetter::Hold];

    pub const fn as_str(self) -> &'static str {
        match self {
            OnDeadLetter::Continue => "continue",
            OnDeadLetter::Hold => "hold",
        }
    }
}
