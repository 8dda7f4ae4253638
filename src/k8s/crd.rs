//! The `WebhookEndpoint` custom resource (hookd.dev/v1alpha1).
//!
//! Validation lives in the schema (OpenAPI ranges and CEL rules) so `kubectl apply`
//! refuses a bad spec with a clear message; `#[kube(cel)]` lets `hookd apply` run the same
//! rules without a cluster.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Event-type filter patterns: `*`, an exact type, or `prefix.*`. (The CEL regex is the
/// same grammar as `outbox::validate_event_type`, plus the wildcard forms.)
pub const EVENT_TYPE_PATTERN_RULE: &str = r"self.all(t, size(t) <= 128 && t.matches('^(\\*|[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*(\\.\\*)?)$'))";

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "hookd.dev",
    version = "v1alpha1",
    kind = "WebhookEndpoint",
    namespaced,
    shortname = "whep",
    status = "WebhookEndpointStatus",
    cel,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Circuit","type":"string","jsonPath":".status.circuit"}"#,
    printcolumn = r#"{"name":"Backlog","type":"integer","jsonPath":".status.backlog"}"#,
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".spec.url","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct WebhookEndpointSpec {
    /// Where deliveries are POSTed: an absolute http:// or https:// URL.
    #[x_kube(validation = Rule::new(r"self.matches('^https?://[^/?#\\s@]+([/?#][^\\s]*)?$')").message("url must be an absolute http:// or https:// URL without spaces or credentials"))]
    #[schemars(length(min = 8, max = 2048))]
    pub url: String,

    /// Event types this endpoint receives: exact (`invoice.paid`), a prefix
    /// (`invoice.*`), or `*`. Empty or absent: every event type of the tenant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new(EVENT_TYPE_PATTERN_RULE).message("each eventTypes entry must be '*', an event type like 'invoice.paid', or a prefix like 'invoice.*'"))]
    #[schemars(length(max = 64))]
    pub event_types: Vec<String>,

    /// The Secret (same namespace) holding the signing secret, `whsec_` + base64 of
    /// 24-64 random bytes.
    pub secret_ref: SecretKeyRef,

    /// Tenant whose events this endpoint receives. Default: the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(r"self.matches('^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$')").message("tenant must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"))]
    pub tenant: Option<String>,

    /// Hold deliveries (they are still created, and sent once unpaused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,

    /// Request timeout in seconds (capped by the dispatcher's own timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 300))]
    pub timeout_seconds: Option<u32>,

    /// Attempts before a delivery is dead-lettered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub max_attempts: Option<u32>,

    /// Delays before each retry, in seconds. Default: 5s, 5m, 30m, 2h, 5h, 10h, 10h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.all(s, s >= 1 && s <= 604800)").message("retrySchedule entries must be between 1 and 604800 seconds"))]
    #[schemars(length(min = 1, max = 50))]
    pub retry_schedule: Option<Vec<u32>>,

    /// Most deliveries in flight to this endpoint per dispatcher process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_in_flight: Option<u32>,

    /// Extra headers sent with every delivery (cannot override webhook-* or content headers).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new(r"self.all(k, k.matches('^[A-Za-z0-9-]{1,64}$') && !k.lowerAscii().startsWith('webhook-') && !(k.lowerAscii() in ['content-type', 'content-length', 'host', 'idempotency-key', 'user-agent', 'transfer-encoding', 'connection']))").message("headers keys must be header names (letters, digits, '-') and must not set webhook-*, content-type, content-length, host, idempotency-key, user-agent, transfer-encoding or connection"))]
    pub headers: BTreeMap<String, String>,

    /// After the Secret changes, how long the previous secret keeps signing (seconds).
    /// Default 86400 (24 h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2592000))]
    pub secret_rotation_grace_seconds: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    /// Name of a Secret in the endpoint's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key within the Secret. Default `secret`.
    #[serde(default = "default_secret_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_secret_key() -> String {
    "secret".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookEndpointStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_secrets: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letters: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<Time>,
}
