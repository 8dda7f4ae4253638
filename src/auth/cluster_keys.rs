//! The cluster's published ServiceAccount signing keys, so a ServiceAccount token's
//! signature is checked here before it may cost a TokenReview (issue 29 item 7).
//!
//! Where the keys come from: the API server's service account issuer discovery
//! (`GET /.well-known/openid-configuration`, then its `jwks_uri`), both fetched through the
//! API server with hookd's own credentials (the `system:service-account-issuer-discovery`
//! ClusterRole, bound to every ServiceAccount by default). A `jwks_uri` that names another
//! host (an issuer published elsewhere) is still read from the API server, which serves
//! the same set at `/openid/v1/jwks`.
//!
//! What a check decides (see [`Check`]): a token signed by a published key is *verified*
//! and reviewed from the budget's reserved share; a token that no published key signed
//! (wrong key, `alg` not the key's, HMAC keyed with the public key, or a key id missing
//! from a set read after the token was issued) is refused here, at no cost to the API
//! server. A key id missing from a set that may predate it (the last read failed, or the
//! token is newer than the set and a re-read is not due) is left to the API server, from
//! the shared budget: a genuine token of a rotated-in key is never refused here. When no
//! keys could be read (discovery unreachable, forbidden, not served, or no usable key),
//! nothing can be verified: tokens are reviewed from the budget as before, the reserved
//! share only for those whose issuer and key id match what earlier reviews confirmed. Both
//! are public, so that share stops tokens made up at random, not a flood that copies them
//! (docs/control-plane.md).
//!
//! The TokenReview still follows every local verification: only the API server knows
//! whether the ServiceAccount, its pod or its secret still exist.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::service_account::{AUDIENCE, REVIEW_TIMEOUT};

/// How long a key set is used before it is read again.
pub const KEYS_MAX_AGE: Duration = Duration::from_secs(60 * 60);
/// The least time between two reads of the keys: after a failed read, and when a token
/// names a key id the set lacks (a key rotation). A flood of made-up key ids therefore
/// costs the API server one read per this interval, not one per token.
pub const MIN_REFRESH: Duration = Duration::from_secs(30);
/// Where the API server serves the key set whatever `jwks_uri` says.
const API_SERVER_JWKS_PATH: &str = "/openid/v1/jwks";
const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// Issuer/key-id pairs remembered from reviewed tokens (while no keys are published).
const MAX_KNOWN: usize = 64;

/// What the local check of one token found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// signed by a key the cluster publishes
    Verified,
    /// no published keys to check against; `matching`: its issuer and key id are ones
    /// earlier reviews confirmed
    Unverifiable { matching: bool },
    /// no published key signed it: refused without a review
    Forged(&'static str),
}

/// One usable published key.
struct Key {
    kid: String,
    alg: Algorithm,
    key: DecodingKey,
}

#[derive(Default)]
struct State {
    /// the last key set read, if any read ever succeeded (kept when a later read fails)
    keys: Option<Arc<Vec<Key>>>,
    /// when the keys were last read successfully, and when a read was last tried
    read_at: Option<Instant>,
    tried_at: Option<Instant>,
    /// the wall-clock time of the last successful read (compared with a token's `iat`)
    read_wall: Option<std::time::SystemTime>,
    /// (issuer, key id) of tokens a TokenReview authenticated
    known: HashSet<(String, String)>,
}

/// The published keys of one cluster, read lazily and cached.
pub struct ClusterKeys {
    client: kube::Client,
    state: Mutex<State>,
    /// one read at a time; the others use what is there
    reading: tokio::sync::Mutex<()>,
}

#[derive(Deserialize)]
struct Discovery {
    jwks_uri: String,
}

/// The unverified claims of a JWT.
fn unverified_claims(token: &str) -> Option<serde_json::Value> {
    let claims = token.split('.').nth(1)?;
    use base64::Engine;
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(claims)
            .ok()?,
    )
    .ok()
}

/// The unverified `iss` claim and `kid` header of a JWT, for the matching share.
fn issuer_and_kid(token: &str) -> Option<(String, String)> {
    let header = jsonwebtoken::decode_header(token).ok()?;
    let claims = unverified_claims(token)?;
    Some((claims.get("iss")?.as_str()?.to_string(), header.kid?))
}

impl ClusterKeys {
    pub fn new(client: kube::Client) -> Self {
        ClusterKeys {
            client,
            state: Mutex::new(State::default()),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    /// Checks `token` against the published keys, reading them first if they are missing
    /// or old, or once more if the token names a key id the set lacks.
    pub async fn check(&self, token: &str) -> Check {
        let header = match jsonwebtoken::decode_header(token) {
            Ok(h) => h,
            // an algorithm jsonwebtoken does not know (`none` among them), or no header
            Err(_) => return Check::Forged("no usable JWT header"),
        };
        let mut keys = self.keys_for(None).await;
        if let (Some(set), Some(kid)) = (&keys, &header.kid)
            && !set.iter().any(|k| &k.kid == kid)
        {
            // perhaps a key rotation: read again (at most once per MIN_REFRESH)
            keys = self.keys_for(Some(kid)).await;
        }
        let Some(keys) = keys else {
            let matching = issuer_and_kid(token).is_some_and(|pair| {
                self.state
                    .lock()
                    .expect("cluster keys lock")
                    .known
                    .contains(&pair)
            });
            return Check::Unverifiable { matching };
        };
        let Some(kid) = header.kid else {
            return Check::Forged("no key id");
        };
        let Some(key) = keys.iter().find(|k| k.kid == kid) else {
            if self.set_is_current_for(token) {
                return Check::Forged("a key id the cluster does not publish");
            }
            // the set may predate the key (the last read failed, or the token is newer
            // than the set and a re-read is not due yet): the API server decides, from the
            // shared budget, rather than a genuine token being refused with a 401
            return Check::Unverifiable { matching: false };
        };
        // the key decides the algorithm, never the token: an HS256 token "signed" with the
        // public key, or any other algorithm, is refused before any verification
        if header.alg != key.alg {
            return Check::Forged("an algorithm other than its key's");
        }
        let mut validation = Validation::new(key.alg);
        validation.set_audience(&[AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "aud"]);
        match jsonwebtoken::decode::<serde_json::Value>(token, &key.key, &validation) {
            Ok(_) => Check::Verified,
            Err(_) => Check::Forged("signature or claims do not verify"),
        }
    }

    /// Whether the key set in hand says what the cluster published when `token` was
    /// issued: the last read succeeded, and after the token's `iat` (a token without one
    /// is judged by the set in hand). A key is published before anything is signed with it.
    fn set_is_current_for(&self, token: &str) -> bool {
        let s = self.state.lock().expect("cluster keys lock");
        let succeeded = match (s.read_at, s.tried_at) {
            (Some(read), Some(tried)) => read >= tried,
            (Some(_), None) => true,
            _ => false,
        };
        let iat = unverified_claims(token)
            .and_then(|c| c.get("iat").and_then(serde_json::Value::as_u64))
            .map(|secs| std::time::UNIX_EPOCH + Duration::from_secs(secs));
        succeeded
            && match (iat, s.read_wall) {
                (Some(iat), Some(read)) => iat <= read,
                _ => true,
            }
    }

    /// Remembers the issuer and key id of a token the API server authenticated, for the
    /// reserved share while no keys are published.
    pub fn confirm(&self, token: &str) {
        if let Some(pair) = issuer_and_kid(token) {
            let mut s = self.state.lock().expect("cluster keys lock");
            if s.known.len() >= MAX_KNOWN && !s.known.contains(&pair) {
                s.known.clear();
            }
            s.known.insert(pair);
        }
    }

    /// The current keys, read again when there are none or they are old (or, with
    /// `missing_kid`, when that key id is not among them), but never more often than
    /// MIN_REFRESH.
    async fn keys_for(&self, missing_kid: Option<&str>) -> Option<Arc<Vec<Key>>> {
        let due = |s: &State, now: Instant| {
            let stale = match (&s.keys, s.read_at) {
                (Some(keys), Some(at)) => {
                    now.saturating_duration_since(at) >= KEYS_MAX_AGE
                        || missing_kid.is_some_and(|kid| !keys.iter().any(|k| k.kid == kid))
                }
                _ => true,
            };
            stale
                && s.tried_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= MIN_REFRESH)
        };
        {
            let s = self.state.lock().expect("cluster keys lock");
            if !due(&s, Instant::now()) {
                return s.keys.clone();
            }
        }
        let _reading = self.reading.lock().await;
        // another request may have read them while this one waited
        {
            let mut s = self.state.lock().expect("cluster keys lock");
            if !due(&s, Instant::now()) {
                return s.keys.clone();
            }
            s.tried_at = Some(Instant::now());
        }
        let read = self.read().await;
        let mut s = self.state.lock().expect("cluster keys lock");
        match read {
            // a set with no key hookd can use verifies nothing: as if none were published
            Ok(keys) if keys.is_empty() => {
                tracing::warn!(
                    "the cluster publishes no ServiceAccount signing key hookd can use; tokens are reviewed unverified, within the TokenReview budget"
                );
            }
            Ok(keys) => {
                tracing::info!(
                    keys = keys.len(),
                    "read the cluster's ServiceAccount signing keys; tokens are verified before any TokenReview"
                );
                s.keys = Some(Arc::new(keys));
                s.read_at = Some(Instant::now());
                s.read_wall = Some(std::time::SystemTime::now());
            }
            Err(e) => match &s.keys {
                Some(_) => {
                    tracing::warn!(error = %e, "cannot read the cluster's ServiceAccount signing keys again; using the last ones read")
                }
                None => tracing::warn!(
                    error = %e,
                    "cannot read the cluster's ServiceAccount signing keys (service account issuer discovery); \
                     tokens are reviewed unverified, within the TokenReview budget"
                ),
            },
        }
        s.keys.clone()
    }

    async fn read(&self) -> Result<Vec<Key>, String> {
        let discovery: Discovery = serde_json::from_str(&self.get(DISCOVERY_PATH).await?)
            .map_err(|e| format!("{DISCOVERY_PATH}: {e}"))?;
        // the path of jwks_uri, read from the API server (see the module comment)
        let path = discovery
            .jwks_uri
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.path_and_query().map(|p| p.as_str().to_string()))
            .filter(|p| p.starts_with('/'))
            .unwrap_or_else(|| API_SERVER_JWKS_PATH.to_string());
        let text = match self.get(&path).await {
            Ok(t) => t,
            Err(_) if path != API_SERVER_JWKS_PATH => self.get(API_SERVER_JWKS_PATH).await?,
            Err(e) => return Err(e),
        };
        let set: JwkSet = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
        Ok(usable_keys(&set))
    }

    async fn get(&self, path: &str) -> Result<String, String> {
        let request = http::Request::get(path)
            // the API server serves the key set as application/jwk-set+json and answers 406
            // to a request that accepts only application/json
            .header(
                http::header::ACCEPT,
                "application/json, application/jwk-set+json",
            )
            .body(Vec::new())
            .map_err(|e| format!("{path}: {e}"))?;
        match tokio::time::timeout(REVIEW_TIMEOUT, self.client.request_text(request)).await {
            Err(_) => Err(format!("{path}: no answer within {REVIEW_TIMEOUT:?}")),
            Ok(Err(e)) => Err(format!("{path}: {e}")),
            Ok(Ok(text)) => Ok(text),
        }
    }
}

/// The keys of a set that can verify a ServiceAccount token: asymmetric ones with a key id,
/// each with the one algorithm it is used with. A symmetric (`oct`) key in a published set
/// would let anyone who read the set sign with it: never used.
fn usable_keys(set: &JwkSet) -> Vec<Key> {
    set.keys
        .iter()
        .filter_map(|jwk: &Jwk| {
            let kid = jwk.common.key_id.clone()?;
            // an encryption key signs nothing
            if jwk.common.public_key_use == Some(jsonwebtoken::jwk::PublicKeyUse::Encryption) {
                return None;
            }
            // a named algorithm that is not a signature one (RSA-OAEP) rules the key out;
            // only an unnamed one defaults to its type's usual algorithm
            let named = match jwk.common.key_algorithm {
                Some(a) => Some(a.to_string().parse::<Algorithm>().ok()?),
                None => None,
            };
            let alg = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => match named {
                    Some(
                        a @ (Algorithm::RS256
                        | Algorithm::RS384
                        | Algorithm::RS512
                        | Algorithm::PS256
                        | Algorithm::PS384
                        | Algorithm::PS512),
                    ) => a,
                    None => Algorithm::RS256,
                    Some(_) => return None,
                },
                AlgorithmParameters::EllipticCurve(p) => match p.curve {
                    EllipticCurve::P256 => Algorithm::ES256,
                    EllipticCurve::P384 => Algorithm::ES384,
                    _ => return None,
                },
                AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
                AlgorithmParameters::OctetKey(_) => return None,
            };
            let key = DecodingKey::from_jwk(jwk).ok()?;
            Some(Key { kid, alg, key })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_asymmetric_signing_keys_with_an_id_are_used() {
        let set: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "r", "n": "sXch", "e": "AQAB"},
            {"kty": "RSA", "n": "sXch", "e": "AQAB"},
            {"kty": "oct", "kid": "h", "k": "c2VjcmV0"},
            {"kty": "RSA", "kid": "o", "alg": "RSA-OAEP", "n": "sXch", "e": "AQAB"},
            {"kty": "RSA", "kid": "u", "use": "enc", "n": "sXch", "e": "AQAB"},
            {"kty": "EC", "kid": "e", "crv": "P-256",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
             "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
        ]}))
        .unwrap();
        let keys = usable_keys(&set);
        let got: Vec<(&str, Algorithm)> = keys.iter().map(|k| (k.kid.as_str(), k.alg)).collect();
        assert_eq!(got, vec![("r", Algorithm::RS256), ("e", Algorithm::ES256)]);
    }
}
