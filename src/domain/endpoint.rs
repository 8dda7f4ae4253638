//! The closed vocabularies of an endpoint: its state and which door owns it. Each is stored
//! as `text` with a CHECK constraint (migrations 0001 and 0007 spell the same values; the
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
