//! The words of the domain, shared by every component and depending on none: tenants,
//! consumers, event types and idempotency keys (their syntax, which the API, the SQL
//! function `hookd.enqueue()` and the CRDs agree on), credential scopes, the map from
//! Kubernetes namespaces to tenants, the queue's states ([`DeliveryStatus`],
//! [`ErrorClass`], [`CircuitState`]), an endpoint's ([`EndpointState`], [`ManagedBy`]), and
//! the codes of error answers ([`ErrorCode`]).

use std::collections::HashMap;
use std::str::FromStr;

mod endpoint;
mod error_code;
mod queue;

pub use endpoint::{
    DeliveryOrder, EndpointState, ManagedBy, OnDeadLetter, RATE_BURST, RATE_BURST_CEL,
    RATE_BURST_RULE, RATE_PER_SECOND, RATE_PER_SECOND_CEL, RATE_PER_SECOND_RULE, RateLimit,
};
pub use error_code::ErrorCode;
pub use queue::{CircuitState, DeliveryStatus, ErrorClass};

/// What a credential may do. Each route needs exactly one.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// POST /v1/messages and /v1/messages/batch
    Produce,
    /// GET /v1/messages/{id}, /v1/deliveries/{id}, /v1/dead-letters
    Read,
    /// POST /v1/deliveries/{id}/replay and /v1/endpoints/{id}/replay
    Operate,
    /// the endpoints and consumers API: create, change and delete endpoints and
    /// consumers, rotate secrets, mint consumer tokens
    Manage,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Produce, Scope::Read, Scope::Operate, Scope::Manage];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Produce => "produce",
            Scope::Read => "read",
            Scope::Operate => "operate",
            Scope::Manage => "manage",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `/v1` requests need a credential (`HOOKD_AUTH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// Every /v1 request needs a credential; the tenant comes from it.
    On,
    /// No authentication: the tenant comes from the request body. Local runs only.
    None,
}

/// `namespace=tenant` overrides of the default mapping (`HOOKD_AUTH_NAMESPACE_TENANTS`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceTenants(pub HashMap<String, String>);

impl FromStr for NamespaceTenants {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut map = HashMap::new();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (ns, tenant) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not namespace=tenant"))?;
            let (ns, tenant) = (ns.trim(), tenant.trim());
            if ns.is_empty() {
                return Err(format!("{pair:?} has an empty namespace"));
            }
            validate_tenant(tenant)?;
            if map.insert(ns.to_string(), tenant.to_string()).is_some() {
                return Err(format!("namespace {ns:?} is mapped twice"));
            }
        }
        Ok(NamespaceTenants(map))
    }
}

impl NamespaceTenants {
    /// The tenant a namespace acts for: its override, else the namespace itself. The API
    /// maps ServiceAccount callers with it and the controller checks WebhookEndpoints
    /// against it, so a namespace can neither produce for nor subscribe to another
    /// tenant's events.
    pub fn tenant_of(&self, namespace: &str) -> String {
        self.0
            .get(namespace)
            .cloned()
            .unwrap_or_else(|| namespace.to_string())
    }
}

// ---- syntax: shared by the HTTP API and documented in the README ----

/// A consumer uid: the tenant-name alphabet, 1-128 characters.
pub fn validate_consumer(c: &str) -> Result<(), String> {
    validate_tenant(c).map_err(|_| {
        format!("consumer {c:?} must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
    })
}

/// Tenants are DNS-label-like (they default to a Kubernetes namespace).
pub fn validate_tenant(t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 128
        && t.as_bytes()[0].is_ascii_alphanumeric()
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tenant {t:?} is invalid: 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"
        ))
    }
}

/// Event types are dot-separated segments of letters, digits, '_' and '-'
/// (`invoice.paid`, `user.created-v2`), at most 128 characters. The same rule is in
/// `hookd.enqueue()` and the CRD's eventTypes patterns.
pub fn validate_event_type(t: &str) -> Result<(), String> {
    let segment_ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    if t.len() <= 128 && t.split('.').all(segment_ok) {
        Ok(())
    } else {
        Err(format!(
            "eventType {t:?} is invalid: dot-separated segments of letters, digits, '_' or '-', at most 128 characters"
        ))
    }
}

/// A W3C trace context (`traceparent`, `tracestate`) a producer sent with an event; kept
/// with it and sent on with each delivery, so a receiver's trace joins the producer's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub traceparent: String,
    /// only with a traceparent (W3C: tracestate without one is ignored)
    pub tracestate: Option<String>,
}

/// The longest `tracestate` kept: the W3C limit of 32 list members fits in it.
pub const MAX_TRACESTATE_BYTES: usize = 512;

impl TraceContext {
    /// The trace context of request headers, or `None` when there is none or its
    /// `traceparent` is not well-formed: W3C Trace Context says a receiver that cannot parse
    /// it ignores it (and starts a new trace), so it is never a reason to refuse an event.
    /// Repeated headers: the first of each, as `tracestate` split over several lines is
    /// rare and one line of it is still a valid list.
    pub fn from_headers(headers: &http::HeaderMap) -> Option<TraceContext> {
        let traceparent = headers.get("traceparent")?.to_str().ok()?.trim();
        if !is_traceparent(traceparent) {
            return None;
        }
        let tracestate = headers
            .get("tracestate")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|s| {
                !s.is_empty()
                    && s.len() <= MAX_TRACESTATE_BYTES
                    && s.bytes().all(|b| (0x20..0x7f).contains(&b))
            })
            .map(str::to_string);
        Some(TraceContext {
            traceparent: traceparent.to_string(),
            tracestate,
        })
    }
}

/// `{version}-{trace-id}-{parent-id}-{flags}` in lower-case hex (2-32-16-2), version not
/// `ff`, neither id all zeros: the form W3C Trace Context defines (migration 0031 checks
/// the same for `hookd.enqueue`).
pub fn is_traceparent(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let hex = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let zero = |p: &str| p.bytes().all(|b| b == b'0');
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && !zero(parts[1])
        && hex(parts[2], 16)
        && !zero(parts[2])
        && hex(parts[3], 2)
}

/// The prefix of hookd's own event types (operational events such as
/// `hookd.endpoint.disabled`, and `hookd.test`): producers and sources cannot use it, and a
/// subscription to every type does not match it (migration 0030).
pub const RESERVED_EVENT_TYPE_PREFIX: &str = "hookd.";

/// Whether `t` is `hookd` or under [`RESERVED_EVENT_TYPE_PREFIX`], in any case (so
/// `HOOKD.endpoint.disabled` cannot pass for one either); migrations 0030 and 0031 hold
/// the same rule.
pub fn is_reserved_event_type(t: &str) -> bool {
    let lower = t.to_ascii_lowercase();
    lower == "hookd" || lower.starts_with(RESERVED_EVENT_TYPE_PREFIX)
}

/// Refuses a reserved event type ([`is_reserved_event_type`]), for the doors producers and
/// sources come in by.
pub fn check_not_reserved(t: &str) -> Result<(), String> {
    if is_reserved_event_type(t) {
        Err(format!(
            "eventType {t:?} is reserved: types under hookd. are hookd's own (operational events such as hookd.endpoint.disabled)"
        ))
    } else {
        Ok(())
    }
}

/// Free text bound for Postgres (a description, a name): Postgres text cannot hold U+0000.
pub fn validate_text(field: &str, text: &str, max_chars: usize) -> Result<(), String> {
    if text.chars().count() > max_chars {
        return Err(format!("{field} is longer than {max_chars} characters"));
    }
    if text.contains('\0') {
        return Err(format!("{field} must not contain NUL characters (U+0000)"));
    }
    Ok(())
}

/// A JSON document bound for `jsonb`, which cannot hold U+0000 in a key or string.
pub fn validate_json_text(field: &str, v: &serde_json::Value) -> Result<(), String> {
    let bad = |s: &str| s.contains('\0');
    let found = match v {
        serde_json::Value::String(s) => bad(s),
        serde_json::Value::Array(a) => {
            return a.iter().try_for_each(|x| validate_json_text(field, x));
        }
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                if bad(k) {
                    return Err(format!("{field} must not contain NUL characters (U+0000)"));
                }
                validate_json_text(field, x)?;
            }
            false
        }
        _ => false,
    };
    if found {
        Err(format!("{field} must not contain NUL characters (U+0000)"))
    } else {
        Ok(())
    }
}

/// Idempotency keys: 1-255 printable ASCII characters.
pub fn validate_idempotency_key(k: &str) -> Result<(), String> {
    if !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        Ok(())
    } else {
        Err("idempotency key must be 1-255 printable ASCII characters without spaces".into())
    }
}

/// The most characters of an `orderingKey` (migration 0034's hookd.enqueue checks the same).
pub const MAX_ORDERING_KEY_CHARS: usize = 256;

/// An `orderingKey`: 1-256 characters of any text but control characters (they cannot be
/// logged or shown safely; hookd.enqueue refuses the same).
pub fn validate_ordering_key(k: &str) -> Result<(), String> {
    let n = k.chars().count();
    if (1..=MAX_ORDERING_KEY_CHARS).contains(&n) && !k.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(format!(
            "orderingKey must be 1-{MAX_ORDERING_KEY_CHARS} characters without control characters"
        ))
    }
}

/// The `frame-ancestors` source list of the customer portal's CSP
/// (`HOOKD_PORTAL_FRAME_ANCESTORS`): who may embed `/portal` in an iframe. Validated at
/// start, because it is pasted into a header: a `;` or `,` would let the setting add or
/// override other directives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameAncestors(String);

impl Default for FrameAncestors {
    fn default() -> Self {
        FrameAncestors("'none'".into())
    }
}

impl std::fmt::Display for FrameAncestors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for FrameAncestors {
    type Err = String;

    /// `'none'`, or space-separated `'self'` and origins (`https://shop.example.com`,
    /// `https://*.example.com:8443`). Sources that admit any site (`*`, a bare scheme like
    /// `https:`, `https://*`) or a scheme other than http(s) (`javascript:`, `data:`) are
    /// refused: the portal holds a customer's session, and any page that may frame it may
    /// overlay it (clickjacking).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let sources: Vec<&str> = s.split_ascii_whitespace().collect();
        if sources.is_empty() {
            return Err("is empty; use 'none' to refuse every embedding".into());
        }
        if sources.contains(&"'none'") && sources.len() > 1 {
            return Err("'none' cannot be combined with other sources".into());
        }
        for source in &sources {
            if !(matches!(*source, "'none'" | "'self'") || is_host_or_scheme_source(source)) {
                return Err(format!(
                    "{source:?} is not a CSP source ('self' or an origin like https://app.example.com)"
                ));
            }
            if !matches!(*source, "'none'" | "'self'") && !is_named_origin(source) {
                return Err(format!(
                    "{source:?} would let any site, or a non-web scheme, embed the customer portal; name the origins (https://app.example.com)"
                ));
            }
        }
        Ok(FrameAncestors(sources.join(" ")))
    }
}

/// A CSP host-source or scheme-source, from a conservative alphabet: letters, digits and
/// `.-*:/[]` (no quotes, `;`, `,` or whitespace, which would change the policy's meaning).
fn is_host_or_scheme_source(s: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || ".-*:/[]_".contains(c);
    !s.is_empty() && s.len() <= 255 && s.chars().all(allowed) && !s.contains("//*/")
}

/// A time bound of a listing or replay (`since`, `until`): an RFC 3339 time, or a date,
/// which means its midnight UTC. A date alone used to be refused with serde's "premature
/// end of input at line 1 column 21", which says neither what was wrong nor what to send.
pub fn parse_time_bound(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    Err(format!(
        "{s:?} is not a time: expected RFC 3339, e.g. 2026-12-05T13:00:00Z (or 2026-12-05T14:00:00+01:00), or a date, e.g. 2026-12-05 (its midnight UTC)"
    ))
}

/// `#[serde(default, deserialize_with = "crate::domain::time_bound")]` for an optional
/// [`parse_time_bound`] field, in a JSON body or a query string.
pub fn time_bound<'de, D: serde::Deserializer<'de>>(
    de: D,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, D::Error> {
    let s: Option<String> = serde::Deserialize::deserialize(de)?;
    s.map(|s| parse_time_bound(&s).map_err(serde::de::Error::custom))
        .transpose()
}

#[cfg(test)]
mod time_bound_tests {
    use super::parse_time_bound;

    #[test]
    fn times_and_dates() {
        assert_eq!(
            parse_time_bound("2026-12-05").unwrap().to_rfc3339(),
            "2026-12-05T00:00:00+00:00"
        );
        assert_eq!(
            parse_time_bound("2026-12-05T14:00:00+01:00")
                .unwrap()
                .to_rfc3339(),
            "2026-12-05T13:00:00+00:00"
        );
        let e = parse_time_bound("yesterday").unwrap_err();
        assert!(e.contains("RFC 3339") && e.contains("2026-12-05"), "{e}");
    }
}

/// An http(s) origin naming a host (a leading `*.` subdomain wildcard is allowed, a bare
/// `*` host is not).
fn is_named_origin(s: &str) -> bool {
    let Some(rest) = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
    else {
        return false;
    };
    let host = rest.split(['/', ':']).next().unwrap_or("");
    let named = host.strip_prefix("*.").unwrap_or(host);
    !named.is_empty() && !named.contains('*') && named.chars().any(|c| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod frame_ancestors_tests {
    use super::*;

    #[test]
    fn frame_ancestors_accepts_sources_and_refuses_directive_injection() {
        let ok = |s: &str| s.parse::<FrameAncestors>().map(|f| f.to_string());
        assert_eq!(ok("'none'").unwrap(), "'none'");
        assert_eq!(
            ok("  'self'   https://shop.example.com https://*.example.com:8443 ").unwrap(),
            "'self' https://shop.example.com https://*.example.com:8443"
        );
        for bad in [
            "*",
            "https:",
            "http:",
            "javascript:",
            "data:",
            "https://*",
            "https://*:443",
            "'self' javascript:alert(1)",
            "",
            "   ",
            "'none' https://a.example",
            "https://a.example; script-src *",
            "https://a.example,https://b.example",
            "'unsafe-inline'",
            "https://a.example\"",
        ] {
            assert!(ok(bad).is_err(), "{bad:?} must be refused");
        }
    }
}

#[cfg(test)]
mod trace_context_tests {
    use super::*;

    #[test]
    fn traceparents_of_the_w3c_form_only() {
        // the W3C recommendation's own example
        assert!(is_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ] {
            assert!(!is_traceparent(bad), "{bad}");
        }
        let mut h = http::HeaderMap::new();
        h.insert("tracestate", "congo=t61rcWkgMzE".parse().unwrap());
        assert_eq!(TraceContext::from_headers(&h), None, "tracestate alone");
        h.insert(
            "traceparent",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 "
                .parse()
                .unwrap(),
        );
        let t = TraceContext::from_headers(&h).unwrap();
        assert_eq!(
            t.traceparent,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(t.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        h.insert(
            "tracestate",
            "x".repeat(MAX_TRACESTATE_BYTES + 1).parse().unwrap(),
        );
        assert_eq!(TraceContext::from_headers(&h).unwrap().tracestate, None);
    }
}
