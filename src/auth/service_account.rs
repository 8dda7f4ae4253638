//! Kubernetes ServiceAccount tokens: a pod presents its projected token (audience
//! `hookd`); the API checks its signature against the cluster's published keys
//! ([`super::cluster_keys`]), then asks the Kubernetes API server about it with a
//! TokenReview and maps the ServiceAccount to a tenant.
//!
//! Tenant mapping: the ServiceAccount's namespace, unless the operator's
//! `HOOKD_AUTH_NAMESPACE_TENANTS` (`namespace=tenant,…`) says otherwise. The mapping lives
//! in hookd's own configuration on purpose: a namespace annotation or label would need
//! read access to namespaces, and in many multi-tenant clusters the tenants themselves
//! can edit their namespace's metadata, which would let them claim another tenant.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;

use super::cache::TtlCache;
use super::cluster_keys::{Check, ClusterKeys};
use super::{AuthError, Principal, Scope, Subject};

/// The audience a token must be issued for (`serviceAccountToken.audience` in the pod's
/// projected volume). Tokens for other audiences, including the API server's own default
/// token, are refused: a token made for another service must not be replayable here.
pub const AUDIENCE: &str = "hookd";

/// Every Kubernetes API permission `hookd api` needs, as (apiGroup, resource, verbs):
/// the install kit's ClusterRole for the API's ServiceAccount grants exactly these.
pub const API_RBAC: &[(&str, &str, &[&str])] =
    &[("authentication.k8s.io", "tokenreviews", &["create"])];

/// How long a positive TokenReview is reused (never past the token's own `exp`). A deleted
/// ServiceAccount's token keeps working this long; Kubernetes' own webhook token
/// authenticator caches for 2 minutes by default.
pub const POSITIVE_TTL: Duration = Duration::from_secs(30);
/// How long a refusal is reused, so a client looping on a bad token costs the API server
/// one review per few seconds, not one per request.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// How long past `POSITIVE_TTL` a positive verdict may still be served, and only while the
/// review budget is spent: a flood of fresh tokens must not lock out the callers this
/// process has already verified (never past the token's own `exp`).
pub const STALE_POSITIVE_TTL: Duration = Duration::from_secs(120);
/// TokenReviews one API process sends per second at most (and in a burst). Every review
/// is a write to the Kubernetes API server, which throttles a client that sends many; an
/// unauthenticated flood of distinct tokens therefore gets 503s from hookd instead of
/// turning into a flood of reviews that would get every tenant's callers throttled.
pub const MAX_REVIEWS_PER_SEC: f64 = 20.0;
/// The part of `MAX_REVIEWS_PER_SEC` that tokens not known to be the cluster's may use:
/// tokens that could not be verified (no published keys) and whose issuer and key id are
/// not ones earlier reviews confirmed. The rest is reserved for verified (or matching)
/// tokens, which may also use this part when theirs is spent; a flood of made-up tokens
/// therefore never takes more than this from real ServiceAccounts.
pub const UNMATCHED_REVIEWS_PER_SEC: f64 = 5.0;
/// A TokenReview slower than this is treated as the API server being unreachable (503).
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
const CACHE_MAX_ENTRIES: usize = 10_000;

pub use crate::domain::NamespaceTenants;

/// What ServiceAccount callers are allowed.
#[derive(Debug, Clone)]
pub struct ServiceAccountPolicy {
    /// scopes every ServiceAccount caller gets (`HOOKD_AUTH_SA_SCOPES`)
    pub scopes: Vec<Scope>,
    pub namespace_tenants: NamespaceTenants,
}

impl ServiceAccountPolicy {
    /// The principal for an authenticated Kubernetes username, if it is a ServiceAccount.
    pub fn principal_for(&self, username: &str) -> Option<Principal> {
        let rest = username.strip_prefix("system:serviceaccount:")?;
        let (namespace, name) = rest.split_once(':')?;
        if namespace.is_empty() || name.is_empty() || name.contains(':') {
            return None;
        }
        let tenant = self.namespace_tenants.tenant_of(namespace);
        crate::domain::validate_tenant(&tenant).ok()?;
        Some(Principal {
            tenant,
            consumer: None,
            consumer_generation: None,
            consumer_since: None,
            scopes: self.scopes.clone(),
            subject: Subject::ServiceAccount {
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
        })
    }
}

/// A cached TokenReview answer: served freely until `fresh_until`, and a positive one
/// after that only while the review budget is spent (the cache entry's own expiry).
#[derive(Clone)]
struct Verdict {
    principal: Option<Principal>,
    fresh_until: Instant,
}

/// The TokenReviews one process may send: `MAX_REVIEWS_PER_SEC` in all, of which
/// tokens not known to be the cluster's get `UNMATCHED_REVIEWS_PER_SEC` at most.
struct ReviewBudget {
    reserved: Bucket,
    shared: Bucket,
}

impl ReviewBudget {
    fn new() -> Self {
        ReviewBudget {
            reserved: Bucket::new(MAX_REVIEWS_PER_SEC - UNMATCHED_REVIEWS_PER_SEC),
            shared: Bucket::new(UNMATCHED_REVIEWS_PER_SEC),
        }
    }

    /// One review for a token; `matching`: verified against the cluster's keys, or (with
    /// no keys) of an issuer and key id that reviews confirmed.
    fn take(&self, matching: bool, now: Instant) -> bool {
        (matching && self.reserved.take(now)) || self.shared.take(now)
    }
}

/// A token bucket, `rate` per second and as many in a burst.
struct Bucket {
    rate: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    fn new(rate: f64) -> Self {
        Bucket {
            rate,
            state: Mutex::new((rate, Instant::now())),
        }
    }

    fn take(&self, now: Instant) -> bool {
        let mut s = self.state.lock().expect("review budget lock");
        let tokens =
            (s.0 + now.saturating_duration_since(s.1).as_secs_f64() * self.rate).min(self.rate);
        if tokens < 1.0 {
            *s = (tokens, now);
            return false;
        }
        *s = (tokens - 1.0, now);
        true
    }
}

/// Verifies ServiceAccount tokens with TokenReviews, caching results by token hash.
pub struct ServiceAccounts {
    client: kube::Client,
    policy: ServiceAccountPolicy,
    cache: TtlCache<Verdict>,
    budget: ReviewBudget,
    keys: ClusterKeys,
}

impl ServiceAccounts {
    pub fn new(client: kube::Client, policy: ServiceAccountPolicy) -> Self {
        ServiceAccounts {
            keys: ClusterKeys::new(client.clone()),
            client,
            policy,
            cache: TtlCache::new(CACHE_MAX_ENTRIES),
            budget: ReviewBudget::new(),
        }
    }

    /// Only a token that could be a live ServiceAccount token for us (a JWT whose claims
    /// name audience `hookd` and an `exp` in the future) and that the cluster's published
    /// keys do not refute is ever sent to the API server; anything else is refused here, at
    /// no cost to anyone. Without published keys a forger can write such a token, which is
    /// what the review budget and its reserved share bound.
    pub async fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let Some(left) = plausible_token(token) else {
            tracing::debug!("not a JWT for audience hookd with a future exp; no TokenReview");
            return Err(AuthError::Invalid);
        };
        let key = super::tokens::hash(token);
        let now = Instant::now();
        let cached = self.cache.get(&key, now);
        if let Some(v) = &cached
            && v.fresh_until > now
        {
            return v.principal.clone().ok_or(AuthError::Invalid);
        }
        let matching = match self.keys.check(token).await {
            Check::Forged(why) => {
                tracing::debug!(
                    reason = why,
                    "ServiceAccount token refused by the cluster's keys; no TokenReview"
                );
                return Err(AuthError::Invalid);
            }
            Check::Verified => true,
            Check::Unverifiable { matching } => matching,
        };
        if !self.budget.take(matching, now) {
            if let Some(Verdict {
                principal: Some(p), ..
            }) = cached
            {
                return Ok(p);
            }
            return Err(AuthError::Unavailable(format!(
                "TokenReview budget ({MAX_REVIEWS_PER_SEC}/s) spent"
            )));
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![AUDIENCE.to_string()]),
            },
            ..Default::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let reviewed =
            match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
            {
                Err(_) => {
                    return Err(AuthError::Unavailable(format!(
                        "TokenReview took longer than {REVIEW_TIMEOUT:?}"
                    )));
                }
                // Any error (unreachable, 5xx, or a 403 because the API's ServiceAccount may
                // not create TokenReviews) says nothing about the caller's token: 503, not 401.
                Ok(Err(e)) => return Err(AuthError::Unavailable(format!("TokenReview: {e}"))),
                Ok(Ok(r)) => r,
            };
        let principal = self.judge(&reviewed);
        if principal.is_some() {
            self.keys.confirm(token);
        }
        let (fresh_until, until) = if principal.is_some() {
            (
                now + POSITIVE_TTL.min(left),
                now + (POSITIVE_TTL + STALE_POSITIVE_TTL).min(left),
            )
        } else {
            (now + NEGATIVE_TTL, now + NEGATIVE_TTL)
        };
        let verdict = Verdict {
            principal: principal.clone(),
            fresh_until,
        };
        self.cache.insert(key, verdict, until, now);
        principal.ok_or(AuthError::Invalid)
    }

    /// The caller a TokenReview answer vouches for, if any.
    fn judge(&self, review: &TokenReview) -> Option<Principal> {
        let status = review.status.as_ref()?;
        if status.authenticated != Some(true) {
            tracing::debug!(error = ?status.error, "TokenReview: not authenticated");
            return None;
        }
        // An empty audience list means "valid for the API server", not for us.
        if !status
            .audiences
            .as_ref()
            .is_some_and(|a| a.iter().any(|x| x == AUDIENCE))
        {
            tracing::debug!(audiences = ?status.audiences, "TokenReview: token not issued for audience hookd");
            return None;
        }
        let username = status.user.as_ref()?.username.as_deref()?;
        let principal = self.policy.principal_for(username);
        if principal.is_none() {
            tracing::debug!(%username, "TokenReview: not a ServiceAccount with a valid tenant");
        }
        principal
    }
}

/// Time left before the token's `exp`, if the token has the shape of a ServiceAccount token
/// issued for hookd: three base64url parts, a header naming a signing algorithm (not
/// `none`), claims whose `aud` includes `hookd` and whose `exp` is in the future. Nothing
/// is verified here (the TokenReview does that); this only keeps tokens that cannot pass a
/// review from costing one.
pub fn plausible_token(token: &str) -> Option<Duration> {
    let mut parts = token.split('.');
    let (header, claims, signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || signature.is_empty() {
        return None;
    }
    let json = |part: &str| -> Option<serde_json::Value> {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).ok()?).ok()
    };
    let alg = json(header)?.get("alg")?.as_str()?.to_ascii_lowercase();
    if alg == "none" {
        return None;
    }
    let claims = json(claims)?;
    let for_us = match claims.get("aud")? {
        serde_json::Value::String(a) => a == AUDIENCE,
        serde_json::Value::Array(a) => a.iter().any(|x| x.as_str() == Some(AUDIENCE)),
        _ => false,
    };
    let left = claims.get("exp")?.as_i64()? - chrono::Utc::now().timestamp();
    (for_us && left > 0).then(|| Duration::from_secs(left as u64))
}

/// A client for the cluster hookd runs in (or the one KUBECONFIG names), or `None` when
/// there is none: ServiceAccount tokens are then simply invalid.
pub async fn client_from_environment() -> Option<kube::Client> {
    // kube's rustls connector needs a process-wide provider; the outbound client uses ring too
    let _ = rustls::crypto::ring::default_provider().install_default();
    match kube::Config::infer().await {
        Ok(config) => match kube::Client::try_from(config) {
            Ok(client) => {
                tracing::info!("ServiceAccount tokens are verified with TokenReviews");
                Some(client)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no Kubernetes client; ServiceAccount tokens will be refused");
                None
            }
        },
        Err(e) => {
            tracing::info!(reason = %e, "no Kubernetes cluster configured; ServiceAccount tokens will be refused");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(map: &str) -> ServiceAccountPolicy {
        ServiceAccountPolicy {
            scopes: vec![Scope::Produce, Scope::Read],
            namespace_tenants: map.parse().unwrap(),
        }
    }

    #[test]
    fn serviceaccounts_map_to_their_namespace_unless_overridden() {
        let p = policy("billing-prod=billing, shop=retail");
        let got = p
            .principal_for("system:serviceaccount:team-a:producer")
            .unwrap();
        assert_eq!(got.tenant, "team-a");
        assert_eq!(
            got.subject,
            Subject::ServiceAccount {
                namespace: "team-a".into(),
                name: "producer".into()
            }
        );
        assert_eq!(got.scopes, vec![Scope::Produce, Scope::Read]);
        assert_eq!(
            p.principal_for("system:serviceaccount:billing-prod:x")
                .unwrap()
                .tenant,
            "billing"
        );
        for not_sa in [
            "alice",
            "system:serviceaccount:ns",
            "system:serviceaccount::x",
            "system:serviceaccount:ns:",
            "system:node:worker-1",
        ] {
            assert!(p.principal_for(not_sa).is_none(), "{not_sa}");
        }
    }

    #[test]
    fn namespace_tenant_config_is_validated() {
        assert_eq!("".parse::<NamespaceTenants>().unwrap().0.len(), 0);
        assert!("a".parse::<NamespaceTenants>().is_err());
        assert!("=t".parse::<NamespaceTenants>().is_err());
        assert!("a=bad tenant".parse::<NamespaceTenants>().is_err());
        assert!("a=x,a=y".parse::<NamespaceTenants>().is_err());
    }

    #[test]
    fn only_plausible_tokens_for_hookd_are_reviewed() {
        let now = chrono::Utc::now().timestamp();
        let b64 = |s: &str| URL_SAFE_NO_PAD.encode(s);
        let rs256 = b64(r#"{"alg":"RS256","kid":"k"}"#);
        let jwt = |header: &str, claims: String| format!("{header}.{}.c2ln", b64(&claims));
        let left = plausible_token(&jwt(
            &rs256,
            format!(r#"{{"aud":["x","hookd"],"exp":{}}}"#, now + 10),
        ))
        .unwrap();
        assert!(left <= Duration::from_secs(10) && left >= Duration::from_secs(8));
        assert!(
            plausible_token(&jwt(
                &rs256,
                format!(r#"{{"aud":"hookd","exp":{}}}"#, now + 60)
            ))
            .is_some()
        );
        for bad in [
            "not-a-jwt".to_string(),
            "a.b".to_string(),
            format!("{rs256}.{}.", b64(r#"{"aud":"hookd","exp":9999999999}"#)),
            format!(
                "{rs256}.{}.c2ln.x",
                b64(r#"{"aud":"hookd","exp":9999999999}"#)
            ),
            jwt(
                &rs256,
                format!(r#"{{"aud":["kubernetes"],"exp":{}}}"#, now + 60),
            ),
            jwt(&rs256, format!(r#"{{"exp":{}}}"#, now + 60)),
            jwt(&rs256, r#"{"aud":"hookd"}"#.to_string()),
            jwt(&rs256, format!(r#"{{"aud":"hookd","exp":{}}}"#, now - 1)),
            jwt(
                &b64(r#"{"alg":"none"}"#),
                format!(r#"{{"aud":"hookd","exp":{}}}"#, now + 60),
            ),
            jwt("e30", format!(r#"{{"aud":"hookd","exp":{}}}"#, now + 60)),
            format!("!!.{}.c2ln", b64(r#"{"aud":"hookd"}"#)),
        ] {
            assert_eq!(plausible_token(&bad), None, "{bad}");
        }
    }

    #[test]
    fn the_review_budget_keeps_a_share_for_matching_tokens() {
        let b = ReviewBudget::new();
        let t0 = Instant::now();
        let unmatched = (0..100).filter(|_| !b.take(false, t0)).count();
        assert_eq!(100 - unmatched, UNMATCHED_REVIEWS_PER_SEC as usize);
        let reserved = (0..100).filter(|_| b.take(true, t0)).count();
        assert_eq!(
            reserved,
            (MAX_REVIEWS_PER_SEC - UNMATCHED_REVIEWS_PER_SEC) as usize
        );
    }

    #[test]
    fn the_review_budget_refills_at_its_rate() {
        let b = Bucket::new(2.0);
        let t0 = Instant::now();
        assert!(b.take(t0) && b.take(t0));
        assert!(!b.take(t0));
        assert!(!b.take(t0 + Duration::from_millis(400)));
        assert!(b.take(t0 + Duration::from_millis(600)));
        assert!(!b.take(t0 + Duration::from_millis(600)));
    }
}
