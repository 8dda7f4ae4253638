//! The two secret parsers: `whsec_` signing secrets (`SigningSecret::parse`) and
//! encryption keys (`crypto::parse_key`, `<key-id>:<base64 of 32 bytes>`). Input: the text.
#![no_main]

use hookd::crypto::KeyError;
use hookd::signing::{SigningSecret, verify};
use libfuzzer_sys::fuzz_target;

/// The documented key id format: 1-64 letters, digits, '.', '_' or '-'.
fn valid_key_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };

    // A secret that parses must sign, and verify its own signature.
    if let Ok(secret) = SigningSecret::parse(text) {
        let sig = secret.sign("msg_fuzz", 1_700_000_000, b"{}");
        assert_eq!(
            verify(
                &secret,
                Some("msg_fuzz"),
                Some("1700000000"),
                Some(&sig),
                b"{}",
                1_700_000_000
            ),
            Ok(())
        );
    }

    match hookd::crypto::parse_key("FUZZ_KEY", text) {
        Ok((id, key)) => {
            assert!(valid_key_id(&id), "key id {id:?}");
            assert_eq!(key.len(), 32);
        }
        // An error never carries the key material: only the variable's name, and the key
        // id once that is known to be valid (so it cannot hold material either).
        Err(e) => {
            let id_of_text = text.trim().split_once(':').map(|(id, _)| id);
            match &e {
                KeyError::Format { source_name } => assert_eq!(source_name, "FUZZ_KEY"),
                KeyError::NotBase64 {
                    source_name,
                    key_id,
                }
                | KeyError::Length {
                    source_name,
                    key_id,
                    ..
                } => {
                    assert_eq!(source_name, "FUZZ_KEY");
                    assert_eq!(Some(key_id.as_str()), id_of_text);
                    assert!(valid_key_id(key_id), "error with key id {key_id:?}");
                }
                KeyError::DuplicateId(_) => panic!("parse_key cannot see duplicates: {e}"),
            }
        }
    }
});
