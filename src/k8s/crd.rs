//! The custom resources (hookd.dev/v1alpha1): `WebhookEndpoint`, `WebhookDispatcher` and
//! `WebhookSource`.
//!
//! Validation lives in the schema (OpenAPI ranges and CEL rules) so `kubectl apply`
//! refuses a bad spec with a clear message; `#[kube(cel)]` lets `hookd apply` run the same
//! rules without a cluster.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Event-type filter patterns: `*`, an exact type, or `prefix.*`. (The CEL regex is the
/// same grammar as `outbox::validate_event_type`, plus the wildcard forms.)
pub const EVENT_TYPE_PATTERN_RULE: &str = r"self.all(t, size(t) <= 128 && t.matches('^(\\*|[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*(\\.\\*)?)$'))";

/// A tenant or consumer, as `domain::validate_tenant` and `validate_consumer` take them.
pub const IDENTIFIER_CEL: &str = r"self.matches('^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$')";
pub const TENANT_RULE: &str =
    "tenant must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit";
pub const CONSUMER_RULE: &str =
    "consumer must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit";

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
    // why it is not ready (EndpointDisabled after a 410, Paused, SecretNotFound, …), so
    // `kubectl get` says it without a describe; the message is in `-o wide`
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Circuit","type":"string","jsonPath":".status.circuit"}"#,
    printcolumn = r#"{"name":"Backlog","type":"integer","jsonPath":".status.backlog"}"#,
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".spec.url","priority":1}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct WebhookEndpointSpec {
    /// Where deliveries are POSTed: an absolute http:// or https:// URL.
    // the rule of every door (crate::endpoints), with its message
    #[x_kube(validation = Rule::new(crate::endpoints::URL_CEL).message(crate::endpoints::URL_RULE))]
    #[schemars(length(min = 8, max = 2048))]
    pub url: String,

    /// Event types this endpoint receives: exact (`invoice.paid`), a prefix
    /// (`invoice.*`), or `*`. Empty or absent: every event type of the tenant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new(EVENT_TYPE_PATTERN_RULE).message(crate::endpoints::EVENT_TYPES_RULE))]
    // Items are bounded for the API server's CEL cost estimate: an unbounded string is
    // assumed 3 MiB, which priced this rule at ~241 M against a 10 M limit.
    #[schemars(length(max = 64), inner(length(min = 1, max = 128)))]
    pub event_types: Vec<String>,

    /// The Secret (same namespace) holding the signing secret, `whsec_` + base64 of
    /// 24-64 random bytes.
    pub secret_ref: SecretKeyRef,

    /// Tenant whose events this endpoint receives. Default: the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(IDENTIFIER_CEL).message(TENANT_RULE))]
    #[schemars(length(min = 1, max = 128))]
    pub tenant: Option<String>,

    /// The consumer (customer) this endpoint belongs to: it then receives only events
    /// addressed to that consumer. Absent: events without a consumer (tenant-wide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(IDENTIFIER_CEL).message(CONSUMER_RULE))]
    #[schemars(length(min = 1, max = 128))]
    pub consumer: Option<String>,

    /// Hold deliveries (they are still created, and sent once unpaused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,

    /// Request timeout in seconds (capped by the dispatcher's own timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = crate::endpoints::TIMEOUT_SECONDS.0, max = crate::endpoints::TIMEOUT_SECONDS.1))]
    pub timeout_seconds: Option<u32>,

    /// Attempts before a delivery is dead-lettered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = crate::endpoints::MAX_ATTEMPTS.0, max = crate::endpoints::MAX_ATTEMPTS.1))]
    pub max_attempts: Option<u32>,

    /// Delays before each retry, in seconds. Default: 5s, 5m, 30m, 2h, 5h, 10h, 10h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.all(s, s >= 1 && s <= 604800)").message("retrySchedule entries must be between 1 and 604800 seconds"))]
    #[schemars(length(min = crate::endpoints::RETRY_SCHEDULE_LEN.0, max = crate::endpoints::RETRY_SCHEDULE_LEN.1))]
    pub retry_schedule: Option<Vec<u32>>,

    /// Most deliveries in flight to this endpoint per dispatcher process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = crate::endpoints::MAX_IN_FLIGHT.0, max = crate::endpoints::MAX_IN_FLIGHT.1))]
    pub max_in_flight: Option<u32>,

    /// At most `perSecond` deliveries a second to this endpoint across every dispatcher,
    /// with bursts of up to `burst` (default: perSecond rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::domain::RATE_PER_SECOND_CEL).message(crate::domain::RATE_PER_SECOND_RULE))]
    #[x_kube(validation = Rule::new(crate::domain::RATE_BURST_CEL).message(crate::domain::RATE_BURST_RULE))]
    pub rate_limit: Option<crate::endpoints::RateLimit>,

    /// `perKey`: deliveries of one message `orderingKey` are sent one at a time, in the
    /// order their events committed. Default `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering: Option<crate::endpoints::DeliveryOrder>,

    /// With `ordering: perKey`, after a delivery of a key is dead-lettered: `continue` with
    /// the key's next delivery (default), or `hold` the key until the dead one is replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_dead_letter: Option<crate::endpoints::OnDeadLetter>,

    /// Extra headers sent with every delivery (cannot set webhook-*, content or framing headers).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    // a value with CR, LF or another control character cannot be sent (the HTTP client
    // drops it): refused at `kubectl apply` as `hookd apply` refuses it
    #[x_kube(validation = Rule::new(r"self.all(k, !self[k].matches('[\\x00-\\x08\\x0a-\\x1f\\x7f]'))").message(crate::endpoints::HEADER_VALUE_RULE))]
    // the names the API and `hookd apply` refuse, with their message (crate::endpoints)
    #[x_kube(validation = Rule::new(crate::endpoints::HEADER_NAME_CEL).message(crate::endpoints::HEADER_NAME_RULE))]
    // A map without maxProperties is assumed to hold 393,215 entries by the CEL cost
    // estimate (this rule: ~12 M, over the 10 M limit).
    #[schemars(extend("maxProperties" = 32, "additionalProperties" = {"type": "string", "maxLength": 4096}))]
    pub headers: BTreeMap<String, String>,

    /// After the Secret changes, how long the previous secret keeps signing (seconds).
    /// Default 86400 (24 h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = crate::endpoints::SECRET_GRACE_SECONDS.0, max = crate::endpoints::SECRET_GRACE_SECONDS.1))]
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

impl WebhookEndpointSpec {
    /// The spec as the endpoint rules (`crate::endpoints`) judge it.
    pub fn declared(&self) -> crate::endpoints::Declared<'_> {
        crate::endpoints::Declared {
            url: &self.url,
            event_types: &self.event_types,
            headers: &self.headers,
            tenant: self.tenant.as_deref(),
            consumer: self.consumer.as_deref(),
            timeout_seconds: self.timeout_seconds,
            max_attempts: self.max_attempts,
            retry_schedule: self.retry_schedule.as_deref(),
            max_in_flight: self.max_in_flight,
            rate_limit: self.rate_limit.as_ref(),
            secret_rotation_grace_seconds: self.secret_rotation_grace_seconds,
        }
    }
}

impl WebhookEndpoint {
    /// What a Kubernetes API server would say of this object: the CRD's CEL rules
    /// (evaluated locally with kube's `cel` feature) and its schema's bounds, which
    /// `validate_cel` does not check. `hookd apply` runs it so a file it accepts is one
    /// `kubectl apply` accepts too.
    pub fn validate_as_api_server(&self) -> Result<(), String> {
        self.validate_cel().map_err(|e| e.to_string())?;
        schema_bounds(&WebhookEndpoint::crd(), self)
    }
}

impl WebhookSource {
    /// What a Kubernetes API server would say of this object (see
    /// [`WebhookEndpoint::validate_as_api_server`]); `hookd apply` runs it.
    pub fn validate_as_api_server(&self) -> Result<(), String> {
        self.validate_cel().map_err(|e| e.to_string())?;
        schema_bounds(&WebhookSource::crd(), self)
    }
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

/// A WebhookSource's name is its route (`/in/{name}`): a DNS label of at most 63
/// characters. The API server already holds object names to lower-case letters, digits,
/// '-' and '.'; a pattern over `metadata.name` (unbounded to CEL's cost estimate) would
/// cost 2.8 M, so the dot is refused by the controller (`inbound::sources::validate_name`,
/// `Ready=False InvalidSpec`).
pub const SOURCE_NAME_RULE: &str = "self.metadata.name.size() <= 63";

/// `spec.provider`: one of `inbound::sources::PROVIDERS` (a unit test ties the two).
pub const SOURCE_PROVIDER_RULE: &str =
    "self in ['standard-webhooks', 'stripe', 'github', 'shopify', 'slack', 'hmac']";

/// An inbound source (hookd.dev/v1alpha1 WebhookSource): one provider's webhooks received
/// at `POST /in/{metadata.name}`, verified with the secret in the referenced Secret, and
/// enqueued for the namespace's tenant. The controller keeps one source row per object.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "hookd.dev",
    version = "v1alpha1",
    kind = "WebhookSource",
    namespaced,
    shortname = "whsrc",
    status = "WebhookSourceStatus",
    cel,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider"}"#,
    printcolumn = r#"{"name":"Path","type":"string","jsonPath":".status.path"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new(SOURCE_NAME_RULE).message("a WebhookSource name must be at most 63 characters (lower-case letters, digits or '-'): it is the route, /in/{name}"),
    validation = Rule::new("(self.spec.provider == 'hmac') == has(self.spec.hmac)").message("spec.hmac is required for provider hmac, and only for it")
)]
#[serde(rename_all = "camelCase")]
pub struct WebhookSourceSpec {
    /// `standard-webhooks` (Svix too), `stripe`, `github`, `shopify`, `slack`, or `hmac`.
    #[x_kube(validation = Rule::new(SOURCE_PROVIDER_RULE).message("provider must be one of standard-webhooks, stripe, github, shopify, slack, hmac"))]
    #[schemars(length(min = 1, max = 32))]
    pub provider: String,

    /// The Secret (same namespace) holding the verification secret exactly as the
    /// provider shows it. A new value there becomes current; the previous one keeps
    /// verifying for `secretRotationGraceSeconds`.
    pub secret_ref: SecretKeyRef,

    /// For provider `hmac`: the header, algorithm, encoding, prefix and which headers
    /// carry the timestamp, id and type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hmac: Option<crate::inbound::sources::HmacSpec>,

    /// Tenant whose endpoints receive its events. Default: the namespace's tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(IDENTIFIER_CEL).message(TENANT_RULE))]
    #[schemars(length(min = 1, max = 128))]
    pub tenant: Option<String>,

    /// Its events are for this consumer only. Absent: tenant-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(IDENTIFIER_CEL).message(CONSUMER_RULE))]
    #[schemars(length(min = 1, max = 128))]
    pub consumer: Option<String>,

    /// Its events' types are `{prefix}.{provider's type}`. Default: the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub event_type_prefix: Option<String>,

    /// The largest body taken (bytes; the API also caps it at its HOOKD_MAX_PAYLOAD_BYTES).
    /// Default 1 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::inbound::sources::MAX_DECLARED_BODY_BYTES))]
    pub max_body_bytes: Option<i32>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1000))]
    pub description: Option<String>,

    /// After the Secret changes, how long the previous secret keeps verifying (seconds).
    /// Default 86400 (24 h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = crate::signing::MAX_ROTATION_GRACE_SECS))]
    pub secret_rotation_grace_seconds: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookSourceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_id: Option<String>,
    /// where the provider must send, relative to the API: `/in/{name}`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// `spec.name` of a WebhookEventType: an event type (`domain::validate_event_type`), not
/// hookd's own (`hookd` or under `hookd.`, in any case).
pub const EVENT_TYPE_NAME_CEL: &str = r"self.matches('^[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*$') && !self.matches('^[Hh][Oo][Oo][Kk][Dd]([.].*)?$')";
pub const EVENT_TYPE_NAME_RULE: &str = "name must be an event type (dot-separated segments of letters, digits, '_' or '-'), not under hookd. (reserved)";

/// An entry of a tenant's event-type catalog (hookd.dev/v1alpha1 WebhookEventType): what
/// customers see in the portal, and what a producer's message is checked against when it
/// asks (`"validate": true`). The tenant is the namespace's; the controller keeps one
/// catalog entry per object, read-only through the API.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "hookd.dev",
    version = "v1alpha1",
    kind = "WebhookEventType",
    namespaced,
    shortname = "whet",
    status = "WebhookEventTypeStatus",
    cel,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Event Type","type":"string","jsonPath":".status.eventType"}"#,
    printcolumn = r#"{"name":"Deprecated","type":"boolean","jsonPath":".spec.deprecated"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct WebhookEventTypeSpec {
    /// The event type, e.g. `invoice.paid`. Default: the object's name (object names cannot
    /// hold '_' or upper case; event types can).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(EVENT_TYPE_NAME_CEL).message(EVENT_TYPE_NAME_RULE))]
    #[schemars(length(min = 1, max = 128))]
    pub name: Option<String>,

    /// What the event means, for the customers who subscribe to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1000))]
    pub description: Option<String>,

    /// A JSON Schema (draft 2020-12 unless its `$schema` says otherwise) that payloads of
    /// this type match, at most 64 KiB; it must compile, and its `$ref`s must point into it
    /// without recursion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub schema: Option<serde_json::Value>,

    /// An example payload (any JSON value); it must match the schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json_value")]
    pub example: Option<serde_json::Value>,

    /// Still accepted, but new subscriptions should move on (see deprecationNote).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deprecated: bool,

    /// What to use instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1000))]
    pub deprecation_note: Option<String>,
}

/// An object whose fields the API server keeps as they are (a JSON Schema).
fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Any JSON value, kept as it is (an example payload).
fn any_json_value(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-preserve-unknown-fields": true
    })
}

impl WebhookEventType {
    /// The event type it declares: `spec.name`, or the object's name.
    pub fn event_type(&self) -> String {
        self.spec
            .name
            .clone()
            .unwrap_or_else(|| kube::ResourceExt::name_any(self))
    }

    /// What a Kubernetes API server would say of this object (see
    /// [`WebhookEndpoint::validate_as_api_server`]); `hookd apply` runs it.
    pub fn validate_as_api_server(&self) -> Result<(), String> {
        self.validate_cel().map_err(|e| e.to_string())?;
        schema_bounds(&WebhookEventType::crd(), self)
    }

    /// The object as the catalog rules judge it, for `tenant` (its namespace's).
    pub fn declared<'a>(
        &'a self,
        namespace: &'a str,
        tenant: &'a str,
        name: &'a str,
    ) -> crate::catalog::Declared<'a> {
        let s = &self.spec;
        crate::catalog::Declared {
            namespace,
            object: self.metadata.name.as_deref().unwrap_or_default(),
            tenant,
            name,
            fields: crate::catalog::Fields {
                description: s.description.clone(),
                schema: s.schema.clone(),
                // YAML has no bytes to keep: the example as compact JSON
                example: s.example.as_ref().map(|e| e.to_string()),
                deprecated: s.deprecated,
                deprecation_note: s.deprecation_note.clone(),
            },
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookEventTypeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// the catalog entry it keeps
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
}

/// A WebhookDispatcher's name is the `app.kubernetes.io/instance` label value of its
/// Deployment, selector and pods; label values stop at 63 characters while object names go
/// to 253, so a longer name would make every apply fail with 422.
pub const DISPATCHER_NAME_MAX: usize = 63;
pub const DISPATCHER_NAME_RULE: &str = "self.metadata.name.size() <= 63";

/// Settings a WebhookDispatcher may pass to `hookd dispatch` through `env`: tuning knobs
/// only. Whoever may create a WebhookDispatcher runs pods that can read the encryption key,
/// so the database, key, listen address and anything naming a file stay the controller's.
pub const DISPATCHER_ENV_ALLOWED: &[&str] = &[
    "HOOKD_LOG",
    "HOOKD_LOG_FORMAT",
    "HOOKD_DB_MAX_CONNECTIONS",
    "HOOKD_DB_ACQUIRE_TIMEOUT_MS",
    "HOOKD_CONCURRENCY",
    "HOOKD_ENDPOINT_CONCURRENCY",
    "HOOKD_LEASE_SECS",
    "HOOKD_REQUEST_TIMEOUT_SECS",
    "HOOKD_RETRY_SCHEDULE",
    "HOOKD_MAX_ATTEMPTS",
    "HOOKD_RETRY_JITTER",
    "HOOKD_MAX_RETRY_AFTER_SECS",
    "HOOKD_CIRCUIT_FAILURES",
    "HOOKD_CIRCUIT_COOLDOWN_SECS",
    "HOOKD_POLL_MS",
    "HOOKD_NOTIFY",
    "HOOKD_SHUTDOWN_GRACE_SECS",
    "HOOKD_RESPONSE_SNIPPET_BYTES",
    // retention: every dispatcher prunes (one at a time), so these reach them from
    // ConfigMap hookd-config; listing them here lets one pool differ (e.g. pruning off)
    "HOOKD_RETENTION_DAYS",
    "HOOKD_TENANT_RETENTION",
    "HOOKD_PRUNE_INTERVAL_SECS",
    "HOOKD_PRUNE_BATCH",
];

/// The `env` rule: plain values of allowed settings only (no `valueFrom`, which could read
/// any Secret of the namespace into a pod). `startsWith`/`in` cost the same whatever the
/// length of `name`, which k8s-openapi's EnvVar schema leaves unbounded.
pub const DISPATCHER_ENV_RULE: &str = "self.all(e, !has(e.valueFrom) && e.name in ['HOOKD_LOG', 'HOOKD_LOG_FORMAT', 'HOOKD_DB_MAX_CONNECTIONS', 'HOOKD_DB_ACQUIRE_TIMEOUT_MS', 'HOOKD_CONCURRENCY', 'HOOKD_ENDPOINT_CONCURRENCY', 'HOOKD_LEASE_SECS', 'HOOKD_REQUEST_TIMEOUT_SECS', 'HOOKD_RETRY_SCHEDULE', 'HOOKD_MAX_ATTEMPTS', 'HOOKD_RETRY_JITTER', 'HOOKD_MAX_RETRY_AFTER_SECS', 'HOOKD_CIRCUIT_FAILURES', 'HOOKD_CIRCUIT_COOLDOWN_SECS', 'HOOKD_POLL_MS', 'HOOKD_NOTIFY', 'HOOKD_SHUTDOWN_GRACE_SECS', 'HOOKD_RESPONSE_SNIPPET_BYTES', 'HOOKD_RETENTION_DAYS', 'HOOKD_TENANT_RETENTION', 'HOOKD_PRUNE_INTERVAL_SECS', 'HOOKD_PRUNE_BATCH'])";

/// A pool of dispatcher pods (hookd.dev/v1alpha1 WebhookDispatcher). The controller
/// server-side-applies one owned Deployment running `hookd dispatch` per object and, with
/// `autoscaling`, sets its replicas from the due backlog in Postgres.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "hookd.dev",
    version = "v1alpha1",
    kind = "WebhookDispatcher",
    namespaced,
    shortname = "whd",
    status = "WebhookDispatcherStatus",
    cel,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    // why pods are missing (FailedCreate, CreateContainerConfigError, Unschedulable, …);
    // the message is in `-o wide`
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Backlog","type":"integer","jsonPath":".status.backlog"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new(DISPATCHER_NAME_RULE).message("a WebhookDispatcher name must be at most 63 characters: it becomes the app.kubernetes.io/instance label of its Deployment and pods")
)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDispatcherSpec {
    /// Dispatcher pods when `autoscaling` is not set. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: Option<i32>,

    /// Scale between min and max replicas from the due backlog in Postgres.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<DispatcherAutoscaling>,

    /// Deliveries in flight at once per pod (HOOKD_CONCURRENCY). Default 256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub concurrency: Option<u32>,

    /// Deliveries in flight at once per endpoint per pod (HOOKD_ENDPOINT_CONCURRENCY). Default 32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub endpoint_concurrency: Option<u32>,

    /// Lease on a claimed delivery, in seconds (HOOKD_LEASE_SECS). Default 5. The
    /// dispatcher renews it while a request runs, so it may be shorter than the request
    /// timeout; it bounds how long a killed pod's deliveries wait before they are sent again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 3600))]
    pub lease_seconds: Option<u32>,

    /// Timeout of one delivery request, in seconds (HOOKD_REQUEST_TIMEOUT_SECS). Default 15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 300))]
    pub request_timeout_seconds: Option<u32>,

    /// Container image. Default: the controller's own image (HOOKD_IMAGE). Other images
    /// must be on the controller's HOOKD_DISPATCHER_IMAGES allow-list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// Image pull policy: Always, IfNotPresent or Never. Default IfNotPresent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['Always', 'IfNotPresent', 'Never']").message("imagePullPolicy must be Always, IfNotPresent or Never"))]
    #[schemars(length(max = 16))]
    pub image_pull_policy: Option<String>,

    /// The Secret (same namespace) holding the database URL. Default key `url`.
    pub database_secret_ref: DatabaseSecretRef,

    /// The Secret holding HOOKD_ENCRYPTION_KEY, which decrypts signing secrets.
    /// Default: Secret `hookd-encryption`, key `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_key_secret_ref: Option<EncryptionKeySecretRef>,

    /// Destinations admitted despite the outbound policy (CIDRs), e.g. in-cluster receivers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new(r"self.all(c, c.matches('^[0-9A-Fa-f:.]+/[0-9]{1,3}$'))").message("allowedDestinations entries must be CIDRs such as 10.0.0.0/8 or fd00::/8"))]
    // an IPv6 CIDR is at most 43 characters; the bound keeps the rule's cost estimate small
    #[schemars(length(max = 64), inner(length(min = 1, max = 64)))]
    pub allowed_destinations: Vec<String>,

    /// Compute resources of the dispatcher container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,

    /// Service account of the pods. Default `hookd-dispatcher` (no API access needed).
    /// Others must be on the controller's HOOKD_DISPATCHER_SERVICE_ACCOUNTS allow-list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,

    /// Extra environment: plain values of `hookd dispatch` tuning settings (e.g.
    /// HOOKD_RETRY_SCHEDULE, HOOKD_CONCURRENCY); no `valueFrom`, no database, key or listen settings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new(DISPATCHER_ENV_RULE).message("env entries must be plain values (no valueFrom) of hookd dispatch tuning settings: HOOKD_LOG, HOOKD_LOG_FORMAT, HOOKD_DB_MAX_CONNECTIONS, HOOKD_DB_ACQUIRE_TIMEOUT_MS, HOOKD_CONCURRENCY, HOOKD_ENDPOINT_CONCURRENCY, HOOKD_LEASE_SECS, HOOKD_REQUEST_TIMEOUT_SECS, HOOKD_RETRY_SCHEDULE, HOOKD_MAX_ATTEMPTS, HOOKD_RETRY_JITTER, HOOKD_MAX_RETRY_AFTER_SECS, HOOKD_CIRCUIT_FAILURES, HOOKD_CIRCUIT_COOLDOWN_SECS, HOOKD_POLL_MS, HOOKD_NOTIFY, HOOKD_SHUTDOWN_GRACE_SECS, HOOKD_RESPONSE_SNIPPET_BYTES, HOOKD_RETENTION_DAYS, HOOKD_TENANT_RETENTION, HOOKD_PRUNE_INTERVAL_SECS, HOOKD_PRUNE_BATCH"))]
    #[schemars(length(max = 64))]
    pub env: Vec<k8s_openapi::api::core::v1::EnvVar>,

    /// Secrets (same namespace) with the credentials to pull `image` from a private
    /// registry (the pods' imagePullSecrets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<k8s_openapi::api::core::v1::LocalObjectReference>,

    /// Node labels the pods must be scheduled on (the pods' nodeSelector).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub node_selector: BTreeMap<String, String>,

    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,

    /// Node affinity, pod affinity and anti-affinity of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<k8s_openapi::api::core::v1::Affinity>,

    /// PriorityClass of the pods. The `system-` classes are the cluster's own and are
    /// refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("autoscaling.minReplicas must not exceed maxReplicas"))]
#[serde(rename_all = "camelCase")]
pub struct DispatcherAutoscaling {
    #[schemars(range(min = 0, max = 100))]
    pub min_replicas: i32,
    #[schemars(range(min = 1, max = 100))]
    pub max_replicas: i32,
    /// Due deliveries one pod is expected to handle; replicas = ceil(backlog / this).
    #[schemars(range(min = 1, max = 1000000))]
    pub target_backlog_per_replica: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct DatabaseSecretRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key within the Secret. Default `url`.
    #[serde(default = "default_database_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_database_key() -> String {
    "url".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct EncryptionKeySecretRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key within the Secret. Default `key`.
    #[serde(default = "default_encryption_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_encryption_key() -> String {
    "key".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDispatcherStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The Deployment this object manages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// Replicas the controller asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Due and in-flight deliveries of claimable endpoints, as last sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<i64>,
    /// When the autoscaler last changed `replicas` (scale-down waits for a quiet period).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
}

/// Every CRD hookd defines, as `hookd crd` prints them and `crds/` holds them: what the
/// derives generate, with each `format` the API server does not know rewritten.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        WebhookEndpoint::crd(),
        WebhookDispatcher::crd(),
        WebhookSource::crd(),
        WebhookEventType::crd(),
    ];
    for crd in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                known_formats_only(schema);
            }
        }
    }
    crds
}

/// Formats a Kubernetes API server recognizes in a CRD schema
/// (k8s.io/apiextensions-apiserver pkg/apiserver/validation/formats.go, compared with the
/// dashes removed), plus the OpenAPI number formats it accepts without a warning.
pub const KNOWN_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "int32",
    "int64",
    "float",
    "double",
];

/// Whether the API server recognizes `format` (it compares without dashes: `date-time`).
pub fn format_is_known(format: &str) -> bool {
    KNOWN_FORMATS.contains(&format.replace('-', "").as_str())
}

/// Rewrites the formats schemars emits for Rust's integer types (`uint32`, `uint8`, ...),
/// which the API server does not know: from 1.34 each one is a warning on every
/// `kubectl apply` of the CRDs, and it validates nothing. An integer keeps `int32` when
/// its bounds fit (they are declared beside it), else `int64`; any other unknown format is
/// dropped. The bounds (`minimum`, `maximum`) stay, so validation is unchanged.
fn known_formats_only(s: &mut JSONSchemaProps) {
    if let Some(format) = s.format.as_deref()
        && !format_is_known(format)
    {
        s.format = match s.type_.as_deref() {
            Some("integer") => {
                let fits = |v: Option<f64>| {
                    v.is_some_and(|v| (f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&v))
                };
                Some(if fits(s.minimum) && fits(s.maximum) {
                    "int32".into()
                } else {
                    "int64".into()
                })
            }
            _ => None,
        };
    }
    for p in s.properties.iter_mut().flat_map(|p| p.values_mut()) {
        known_formats_only(p);
    }
    match s.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(items)) => known_formats_only(items),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => {
            items.iter_mut().for_each(known_formats_only)
        }
        None => {}
    }
    if let Some(JSONSchemaPropsOrBool::Schema(a)) = s.additional_properties.as_mut() {
        known_formats_only(a);
    }
    for list in [&mut s.all_of, &mut s.any_of, &mut s.one_of]
        .into_iter()
        .flatten()
    {
        list.iter_mut().for_each(known_formats_only);
    }
    if let Some(not) = s.not.as_mut() {
        known_formats_only(not);
    }
}

/// The OpenAPI schema of `crd`'s (first and only) version, as JSON; null when it has none.
pub fn openapi_schema(crd: &CustomResourceDefinition) -> serde_json::Value {
    crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .unwrap_or_default()
}

/// Checks `object` against the OpenAPI bounds of `crd`'s schema (what the API server
/// refuses before any CEL rule runs: minimum/maximum, lengths, item and entry counts).
/// Returns every violation, `path: problem`, joined.
fn schema_bounds(crd: &CustomResourceDefinition, object: &impl Serialize) -> Result<(), String> {
    use serde_json::Value;

    fn walk(schema: &Value, v: &Value, path: &str, errs: &mut Vec<String>) {
        let num = |k: &str| schema.get(k).and_then(Value::as_f64);
        let len = |k: &str| schema.get(k).and_then(Value::as_u64);
        match v {
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or_default();
                if let Some(min) = num("minimum").filter(|m| x < *m) {
                    errs.push(format!("{path}: {n} is less than the minimum {min}"));
                }
                if let Some(max) = num("maximum").filter(|m| x > *m) {
                    errs.push(format!("{path}: {n} is greater than the maximum {max}"));
                }
            }
            Value::String(s) => {
                let n = s.chars().count() as u64;
                if let Some(min) = len("minLength").filter(|m| n < *m) {
                    errs.push(format!("{path}: must be at least {min} characters"));
                }
                if let Some(max) = len("maxLength").filter(|m| n > *m) {
                    errs.push(format!("{path}: must be at most {max} characters"));
                }
            }
            Value::Array(items) => {
                let n = items.len() as u64;
                if let Some(min) = len("minItems").filter(|m| n < *m) {
                    errs.push(format!("{path}: must have at least {min} items"));
                }
                if let Some(max) = len("maxItems").filter(|m| n > *m) {
                    errs.push(format!("{path}: must have at most {max} items"));
                }
                if let Some(item) = schema.get("items") {
                    for (i, x) in items.iter().enumerate() {
                        walk(item, x, &format!("{path}[{i}]"), errs);
                    }
                }
            }
            Value::Object(map) => {
                let n = map.len() as u64;
                if let Some(max) = len("maxProperties").filter(|m| n > *m) {
                    errs.push(format!("{path}: must have at most {max} entries"));
                }
                let props = schema.get("properties").and_then(Value::as_object);
                let extra = schema.get("additionalProperties").filter(|a| a.is_object());
                for (k, x) in map {
                    let sub = props.and_then(|p| p.get(k)).or(extra);
                    if let Some(sub) = sub {
                        let p = if path.is_empty() {
                            k.clone()
                        } else {
                            format!("{path}.{k}")
                        };
                        walk(sub, x, &p, errs);
                    }
                }
            }
            Value::Null | Value::Bool(_) => {}
        }
    }

    let schema = openapi_schema(crd);
    let object = serde_json::to_value(object).map_err(|e| e.to_string())?;
    let mut errs = Vec::new();
    walk(&schema, &object, "", &mut errs);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}
