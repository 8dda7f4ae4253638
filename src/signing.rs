//! Standard Webhooks (Svix-compatible) signing and verification.
//!
//! Signed content is `{webhook-id}.{webhook-timestamp}.{raw body}`, HMAC-SHA256 keyed with
//! the base64-decoded part of a `whsec_` secret, sent as `v1,<base64>` entries separated by
//! spaces in the `webhook-signature` header.

use base64::Engine;
use base64::alphabet;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

const SECRET_PREFIX: &str = "whsec_";
const SIGNATURE_VERSION: &str = "v1";
const TOLERANCE_SECS: u64 = 300;
const MIN_KEY_LEN: usize = 24;
const MAX_KEY_LEN: usize = 64;

/// Secrets and signatures come from many tools; some strip `=` padding, some keep it.
/// Accepting both avoids rejecting otherwise valid input for a cosmetic difference.
const LENIENT_STANDARD: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A decoded signing key, kept as a pre-keyed HMAC so the hot signing path only clones
/// the keyed state instead of re-deriving the padded key blocks per message.
#[derive(Clone)]
pub struct SigningSecret {
    mac: HmacSha256,
}

// Manual impl so the key can never leak into logs through `{:?}`.
impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(..)")
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("secret must start with whsec_")]
    MissingPrefix,
    #[error("secret after whsec_ is not valid base64")]
    NotBase64,
    #[error("secret must decode to 24-64 bytes, got {0}")]
    BadLength(usize),
}

/// The Standard Webhooks test-vector secrets: published, so anyone can forge signatures
/// made with them. Refusing them would break copy-pasted tutorials silently elsewhere;
/// `hookd apply` and the controller warn instead.
const PUBLISHED_SECRETS: [&str; 2] = [
    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
];

/// How long a rotated-out secret keeps signing or verifying unless told otherwise (1 day),
/// and at most when told through the API (7 days): one policy for endpoints' signing
/// secrets and sources' verification secrets.
pub const DEFAULT_ROTATION_GRACE_SECS: u32 = 86_400;
pub const MAX_ROTATION_GRACE_SECS: i64 = 604_800;

/// A fresh signing secret: `whsec_` + base64 of 32 random bytes.
pub fn generate_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
    format!("whsec_{}", STANDARD.encode(bytes))
}

/// Whether `secret` is one of the published test-vector secrets.
pub fn is_published_test_secret(secret: &str) -> bool {
    PUBLISHED_SECRETS.contains(&secret.trim())
}

/// Secrets printed in this project's own README and examples: as public as the test
/// vectors.
const DOCUMENTED_SECRETS: [&str; 2] = [
    "whsec_Qk3pV2m0nZ7yJd8tXr5aLw1cHs9uE6gB",
    "whsec_4L7nuLYb52h6oEpc5KNRA/vP3w3CyYGcEuj5mLBcRhk=",
];

/// Why a well-formed secret is no secret, if it is not: published (the Standard Webhooks
/// test vectors, this project's README and examples) or degenerate (every byte the same,
/// as an all-zero key). `hookd apply` and the controller warn about these (a declaration
/// may be a copy-pasted tutorial); the endpoints API, where customers choose secrets,
/// refuses them.
pub fn weak_secret_reason(secret: &str) -> Option<&'static str> {
    let s = secret.trim();
    if PUBLISHED_SECRETS.contains(&s) {
        return Some("it is a published Standard Webhooks test-vector secret");
    }
    if DOCUMENTED_SECRETS.contains(&s) {
        return Some("it is printed in hookd's README or examples");
    }
    let key = s
        .strip_prefix(SECRET_PREFIX)
        .and_then(|e| LENIENT_STANDARD.decode(e).ok())?;
    if key.windows(2).all(|w| w[0] == w[1]) {
        return Some("every byte of its key is the same (an all-zero key, for one)");
    }
    None
}

impl SigningSecret {
    /// Parses `whsec_<base64>`. Surrounding whitespace is ignored because secrets stored
    /// with `echo` or in env files routinely carry a trailing newline.
    pub fn parse(s: &str) -> Result<Self, SecretError> {
        let encoded = s
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::MissingPrefix)?;
        let key = LENIENT_STANDARD
            .decode(encoded)
            .map_err(|_| SecretError::NotBase64)?;
        if !(MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()) {
            return Err(SecretError::BadLength(key.len()));
        }
        // HMAC accepts keys of any length, so this cannot fail; mapping keeps the code
        // panic-free without an `expect`.
        let mac =
            HmacSha256::new_from_slice(&key).map_err(|_| SecretError::BadLength(key.len()))?;
        Ok(Self { mac })
    }

    /// Returns `v1,<base64 signature>` for one message.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = self.tag(msg_id, timestamp, body);
        let mut out = String::with_capacity(SIGNATURE_VERSION.len() + 1 + 44);
        out.push_str(SIGNATURE_VERSION);
        out.push(',');
        STANDARD.encode_string(tag, &mut out);
        out
    }

    /// Raw HMAC tag. The parts are fed separately so a large body is never copied into an
    /// intermediate `"{id}.{ts}.{body}"` buffer.
    fn tag(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
        let mut mac = self.mac.clone();
        let mut ts_buf = [0u8; 20];
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(format_i64(timestamp, &mut ts_buf));
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }
}

/// Formats an i64 in decimal into a stack buffer, avoiding a heap allocation per
/// signature on the hot path. 20 bytes fit `i64::MIN` ("-9223372036854775808").
fn format_i64(value: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut n = value.unsigned_abs();
    let mut pos = buf.len();
    loop {
        pos -= 1;
        // `n % 10` is always < 10, so the cast cannot truncate.
        buf[pos] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if value < 0 {
        pos -= 1;
        buf[pos] = b'-';
    }
    &buf[pos..]
}

/// Builds the `webhook-signature` header value: one `v1,` entry per secret, in order, so
/// receivers keep verifying during a secret rotation whichever secret they hold.
pub fn signature_header(
    secrets: &[SigningSecret],
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    let mut out = String::with_capacity(secrets.len() * 48);
    for (i, secret) in secrets.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(SIGNATURE_VERSION);
        out.push(',');
        STANDARD.encode_string(secret.tag(msg_id, timestamp, body), &mut out);
    }
    out
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    #[error("webhook-timestamp is not an integer")]
    BadTimestamp,
    #[error("webhook-timestamp is outside the allowed tolerance")]
    TimestampOutOfTolerance,
    #[error("no matching signature")]
    NoMatchingSignature,
}

/// Verifies a received webhook. `now_unix` is injected so callers (and tests) control the
/// clock; timestamps more than 300 s away in either direction are rejected to limit
/// replay of captured requests.
pub fn verify(
    secret: &SigningSecret,
    msg_id: Option<&str>,
    timestamp: Option<&str>,
    signature_header: Option<&str>,
    body: &[u8],
    now_unix: i64,
) -> Result<(), VerifyError> {
    let msg_id = msg_id.ok_or(VerifyError::MissingHeader("webhook-id"))?;
    let timestamp = timestamp.ok_or(VerifyError::MissingHeader("webhook-timestamp"))?;
    let signature_header =
        signature_header.ok_or(VerifyError::MissingHeader("webhook-signature"))?;

    let ts: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| VerifyError::BadTimestamp)?;
    if now_unix.abs_diff(ts) > TOLERANCE_SECS {
        return Err(VerifyError::TimestampOutOfTolerance);
    }

    let expected = secret.tag(msg_id, ts, body);
    // Evaluate every entry rather than returning on the first match, so timing does not
    // reveal which entry position matched.
    let mut matched = false;
    for entry in signature_header.split_ascii_whitespace() {
        let Some((version, value)) = entry.split_once(',') else {
            continue;
        };
        if version != SIGNATURE_VERSION {
            continue;
        }
        let Ok(decoded) = LENIENT_STANDARD.decode(value) else {
            continue;
        };
        matched |= constant_time_eq(&decoded, &expected);
    }
    if matched {
        Ok(())
    } else {
        Err(VerifyError::NoMatchingSignature)
    }
}

/// Length mismatch returns early (the length of a tag is public); equal-length inputs are
/// compared without data-dependent branches. Rejecting short inputs is what makes partial
/// (truncated) signatures fail.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const A_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const A_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const A_TS: i64 = 1614265330;
    const A_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const A_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    const B_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const B_ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const B_TS: i64 = 1649367553;
    const B_BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const B_SIG: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    const DECOYS: &str = "v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ= v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q= v1,9DfC1c3eeOrXB6w/5dIDydLNQaEyww5KalE5jLBZucE=";

    fn secret(s: &str) -> SigningSecret {
        SigningSecret::parse(s).unwrap()
    }

    fn verify_a(sig: &str) -> Result<(), VerifyError> {
        let ts = A_TS.to_string();
        verify(
            &secret(A_SECRET),
            Some(A_ID),
            Some(&ts),
            Some(sig),
            A_BODY,
            A_TS,
        )
    }

    #[test]
    fn vector_a_signs_exactly() {
        assert_eq!(secret(A_SECRET).sign(A_ID, A_TS, A_BODY), A_SIG);
    }

    #[test]
    fn vector_b_signs_exactly() {
        assert_eq!(secret(B_SECRET).sign(B_ID, B_TS, B_BODY), B_SIG);
    }

    #[test]
    fn vectors_verify() {
        assert_eq!(verify_a(A_SIG), Ok(()));
        let ts = B_TS.to_string();
        assert_eq!(
            verify(
                &secret(B_SECRET),
                Some(B_ID),
                Some(&ts),
                Some(B_SIG),
                B_BODY,
                B_TS
            ),
            Ok(())
        );
    }

    #[test]
    fn wrong_signatures_fail() {
        assert_eq!(
            verify_a("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="),
            Err(VerifyError::NoMatchingSignature)
        );
        let ts = B_TS.to_string();
        assert_eq!(
            verify(
                &secret(B_SECRET),
                Some(B_ID),
                Some(&ts),
                Some("v1,R3PTzyfHASBKHH98a7yexTwaJ4yNIcGhFQc1yuN+BPU="),
                B_BODY,
                B_TS
            ),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn decoys_fail_and_pass_with_valid_added() {
        assert_eq!(verify_a(DECOYS), Err(VerifyError::NoMatchingSignature));
        assert_eq!(verify_a(&format!("{DECOYS} {A_SIG}")), Ok(()));
        assert_eq!(verify_a(&format!("{A_SIG} {DECOYS}")), Ok(()));
    }

    #[test]
    fn non_v1_entry_is_skipped() {
        let v2 = A_SIG.replacen("v1,", "v2,", 1);
        assert_eq!(verify_a(&v2), Err(VerifyError::NoMatchingSignature));
        assert_eq!(verify_a(&format!("{v2} {A_SIG}")), Ok(()));
    }

    #[test]
    fn partial_signatures_fail() {
        assert_eq!(verify_a("v1,"), Err(VerifyError::NoMatchingSignature));
        assert_eq!(verify_a(&A_SIG[..8]), Err(VerifyError::NoMatchingSignature));
        // A prefix that still decodes as base64 (whole 4-char groups) must fail too.
        assert_eq!(
            verify_a(&A_SIG[..23]),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(verify_a("v1"), Err(VerifyError::NoMatchingSignature));
        assert_eq!(verify_a(""), Err(VerifyError::NoMatchingSignature));
    }

    #[test]
    fn unpadded_signature_accepted() {
        assert_eq!(verify_a(A_SIG.trim_end_matches('=')), Ok(()));
    }

    #[test]
    fn missing_headers() {
        let s = secret(A_SECRET);
        let ts = A_TS.to_string();
        assert_eq!(
            verify(&s, None, Some(&ts), Some(A_SIG), A_BODY, A_TS),
            Err(VerifyError::MissingHeader("webhook-id"))
        );
        assert_eq!(
            verify(&s, Some(A_ID), None, Some(A_SIG), A_BODY, A_TS),
            Err(VerifyError::MissingHeader("webhook-timestamp"))
        );
        assert_eq!(
            verify(&s, Some(A_ID), Some(&ts), None, A_BODY, A_TS),
            Err(VerifyError::MissingHeader("webhook-signature"))
        );
    }

    #[test]
    fn bad_timestamp() {
        let s = secret(A_SECRET);
        assert_eq!(
            verify(&s, Some(A_ID), Some("hello"), Some(A_SIG), A_BODY, A_TS),
            Err(VerifyError::BadTimestamp)
        );
    }

    #[test]
    fn timestamp_tolerance() {
        let s = secret(A_SECRET);
        let ts = A_TS.to_string();
        let check = |now| verify(&s, Some(A_ID), Some(&ts), Some(A_SIG), A_BODY, now);
        assert_eq!(check(A_TS + 301), Err(VerifyError::TimestampOutOfTolerance));
        assert_eq!(check(A_TS - 301), Err(VerifyError::TimestampOutOfTolerance));
        assert_eq!(check(A_TS + 300), Ok(()));
        assert_eq!(check(A_TS - 300), Ok(()));
        // Extreme values must not overflow.
        assert_eq!(check(i64::MIN), Err(VerifyError::TimestampOutOfTolerance));
        assert_eq!(check(i64::MAX), Err(VerifyError::TimestampOutOfTolerance));
    }

    #[test]
    fn header_with_two_secrets_verifies_with_each() {
        let secrets = [secret(A_SECRET), secret(B_SECRET)];
        let header = signature_header(&secrets, A_ID, A_TS, A_BODY);
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], A_SIG);
        assert_eq!(parts[1], secrets[1].sign(A_ID, A_TS, A_BODY));
        for s in &secrets {
            assert_eq!(verify_a_with(s, &header), Ok(()));
        }
        assert_eq!(signature_header(&[], A_ID, A_TS, A_BODY), "");
    }

    fn verify_a_with(s: &SigningSecret, header: &str) -> Result<(), VerifyError> {
        let ts = A_TS.to_string();
        verify(s, Some(A_ID), Some(&ts), Some(header), A_BODY, A_TS)
    }

    #[test]
    fn official_standardwebhooks_crate_accepts_our_header() {
        // The official verifier reads the wall clock, so sign with the current time.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let body = br#"{"type":"invoice.paid","data":{"id":42}}"#;
        let id = "msg_2b8cKzH1";
        let secrets = [secret(A_SECRET), secret(B_SECRET)];
        let header = signature_header(&secrets, id, now, body);

        let mut headers = http::HeaderMap::new();
        headers.insert("webhook-id", id.parse().unwrap());
        headers.insert("webhook-timestamp", now.to_string().parse().unwrap());
        headers.insert("webhook-signature", header.parse().unwrap());

        for raw in [A_SECRET, B_SECRET] {
            let wh = standardwebhooks::Webhook::new(raw).unwrap();
            wh.verify(body, &headers).unwrap();
        }
        // Sanity: the official crate rejects a secret we did not sign with.
        let other =
            standardwebhooks::Webhook::new("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").unwrap();
        assert!(other.verify(body, &headers).is_err());
    }

    #[test]
    fn signing_matches_official_crate() {
        let wh = standardwebhooks::Webhook::new(B_SECRET).unwrap();
        for ts in [0, -1, 1, i64::MAX, i64::MIN, 1_700_000_000] {
            assert_eq!(
                secret(B_SECRET).sign(B_ID, ts, B_BODY),
                wh.sign(B_ID, ts, B_BODY).unwrap()
            );
        }
    }

    #[test]
    fn format_i64_matches_std() {
        for v in [0, 1, -1, 9, 10, -10, 1614265330, i64::MAX, i64::MIN] {
            let mut buf = [0u8; 20];
            assert_eq!(format_i64(v, &mut buf), v.to_string().as_bytes());
        }
    }

    #[test]
    fn secret_errors() {
        assert_eq!(
            SigningSecret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_err(),
            SecretError::MissingPrefix
        );
        assert_eq!(
            SigningSecret::parse("whsec_not*base64!").unwrap_err(),
            SecretError::NotBase64
        );
        let b16 = format!("whsec_{}", STANDARD.encode([7u8; 16]));
        assert_eq!(
            SigningSecret::parse(&b16).unwrap_err(),
            SecretError::BadLength(16)
        );
        let b65 = format!("whsec_{}", STANDARD.encode([7u8; 65]));
        assert_eq!(
            SigningSecret::parse(&b65).unwrap_err(),
            SecretError::BadLength(65)
        );
        for ok in [24usize, 32, 64] {
            let s = format!("whsec_{}", STANDARD.encode(vec![7u8; ok]));
            assert!(SigningSecret::parse(&s).is_ok(), "{ok} bytes");
        }
        assert_eq!(
            SecretError::BadLength(16).to_string(),
            "secret must decode to 24-64 bytes, got 16"
        );
    }

    #[test]
    fn secret_whitespace_and_padding_tolerated() {
        let with_newline = format!("{A_SECRET}\n");
        assert_eq!(secret(&with_newline).sign(A_ID, A_TS, A_BODY), A_SIG);
        assert_eq!(
            secret(&format!("  {A_SECRET}\r\n")).sign(A_ID, A_TS, A_BODY),
            A_SIG
        );
        // 25 bytes encode with padding; both padded and unpadded forms must parse.
        let padded = format!("whsec_{}", STANDARD.encode([9u8; 25]));
        assert!(padded.ends_with('='));
        assert!(SigningSecret::parse(&padded).is_ok());
        assert!(SigningSecret::parse(padded.trim_end_matches('=')).is_ok());
    }

    #[test]
    fn debug_does_not_leak_key() {
        assert_eq!(format!("{:?}", secret(A_SECRET)), "SigningSecret(..)");
    }
}
