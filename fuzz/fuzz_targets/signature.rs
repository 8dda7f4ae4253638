//! The receiver side of Standard Webhooks: `signing::verify`, which parses the
//! `webhook-timestamp` and `webhook-signature` headers.
//!
//! Input, one field per line so the seed corpus stays readable: the secret, `webhook-id`,
//! `webhook-timestamp`, the receiver's clock (unix seconds), `webhook-signature`, then the
//! body (the rest, raw bytes). A missing line is a missing header.
#![no_main]

use hookd::signing::{SigningSecret, signature_header, verify};
use libfuzzer_sys::fuzz_target;

/// The first line of `data` (without `\n`) and the rest.
fn line(data: &[u8]) -> (Option<&[u8]>, &[u8]) {
    if data.is_empty() {
        return (None, data);
    }
    match data.iter().position(|&b| b == b'\n') {
        Some(i) => (Some(&data[..i]), &data[i + 1..]),
        None => (Some(data), &[]),
    }
}

fn text(field: Option<&[u8]>) -> Option<&str> {
    // Headers reach verify through HeaderValue::to_str, so they are always valid UTF-8
    // (visible ASCII, in fact); anything else is a missing header.
    field.and_then(|f| std::str::from_utf8(f).ok())
}

fuzz_target!(|data: &[u8]| {
    let (secret, rest) = line(data);
    let (id, rest) = line(rest);
    let (ts, rest) = line(rest);
    let (now, rest) = line(rest);
    let (sig, body) = line(rest);

    let secret = text(secret)
        .and_then(|s| SigningSecret::parse(s).ok())
        .unwrap_or_else(|| SigningSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap());
    let (id, ts, sig) = (text(id), text(ts), text(sig));
    let now: i64 = text(now).and_then(|n| n.trim().parse().ok()).unwrap_or(0);

    let verdict = verify(&secret, id, ts, sig, body, now);

    // Round trip: whatever verify accepts as id and timestamp, our own signature over them
    // must verify, alone and as one entry among others (a rotation header).
    if let (Some(id), Some(ts_text)) = (id, ts)
        && let Ok(ts_value) = ts_text.trim().parse::<i64>()
        && now.abs_diff(ts_value) <= 300
    {
        let own = secret.sign(id, ts_value, body);
        assert_eq!(
            verify(&secret, Some(id), Some(ts_text), Some(&own), body, now),
            Ok(())
        );
        let other = SigningSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        let rotation = signature_header(&[other, secret.clone()], id, ts_value, body);
        assert_eq!(
            verify(&secret, Some(id), Some(ts_text), Some(&rotation), body, now),
            Ok(())
        );
        // A header that verified for this body must not verify for another one.
        if verdict.is_ok() {
            let mut changed = body.to_vec();
            changed.push(b'x');
            assert!(verify(&secret, Some(id), Some(ts_text), sig, &changed, now).is_err());
        }
    }
});
