//! Opening claimed signing secrets, with a cache.
//!
//! A claim returns each live secret of the endpoint still sealed. Opening one costs an
//! XChaCha20-Poly1305 decryption, a base64 decode and an HMAC key schedule; at 10k
//! deliveries/s that would be 10k+ of each per second for a handful of distinct rows.
//! The cache keeps the ready-to-sign `SigningSecret` per secret row, so the hot path is
//! one hash lookup and a byte compare of the ciphertext per secret.
//!
//! The cache is owned by the claimer loop (one task), so it needs no lock. An entry is
//! reused only when the row's key id and ciphertext are byte-identical to the ones it
//! was opened from, so a rekeyed or rewritten row is opened afresh; failures are cached
//! too, so a misconfigured key is logged once per row rather than once per delivery.

use std::collections::HashMap;
use std::sync::Arc;

use uuid::Uuid;

use crate::crypto::Keyring;
use crate::db::deliveries::ClaimedDelivery;
use crate::metrics::Metrics;
use crate::signing::SigningSecret;

/// Entries kept before the cache is emptied and refilled on demand. Each is a few hundred
/// bytes; secret rows are a few per endpoint.
const MAX_ENTRIES: usize = 50_000;

/// Why a claimed delivery's secrets cannot be used. Names rows and key ids only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("signing secret {secret_id} of endpoint {endpoint_id} cannot be decrypted: {reason}")]
pub struct SecretUnreadable {
    pub secret_id: i64,
    pub endpoint_id: Uuid,
    pub reason: String,
}

struct Entry {
    key_id: String,
    ciphertext: Vec<u8>,
    opened: Result<SigningSecret, SecretUnreadable>,
}

pub struct SecretCache {
    keyring: Arc<Keyring>,
    metrics: Metrics,
    entries: HashMap<i64, Entry>,
}

impl SecretCache {
    pub fn new(keyring: Arc<Keyring>, metrics: Metrics) -> Self {
        SecretCache {
            keyring,
            metrics,
            entries: HashMap::new(),
        }
    }

    /// The signing secrets of one claimed delivery, newest first. Any secret that cannot
    /// be opened fails the whole set: signing with only some of them could send a
    /// delivery the receiver cannot verify during a rotation.
    pub fn open(&mut self, d: &ClaimedDelivery) -> Result<Vec<SigningSecret>, SecretUnreadable> {
        let mut out = Vec::with_capacity(d.secret_ids.len());
        for ((&id, key_id), ciphertext) in d
            .secret_ids
            .iter()
            .zip(&d.secret_key_ids)
            .zip(&d.secret_ciphertexts)
        {
            out.push(self.open_one(d.endpoint_id, id, key_id, ciphertext)?);
        }
        Ok(out)
    }

    fn open_one(
        &mut self,
        endpoint_id: Uuid,
        id: i64,
        key_id: &str,
        ciphertext: &[u8],
    ) -> Result<SigningSecret, SecretUnreadable> {
        if let Some(e) = self.entries.get(&id)
            && e.key_id == key_id
            && e.ciphertext == ciphertext
        {
            return e.opened.clone();
        }
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.clear();
        }
        self.metrics.secret_decryptions.inc();
        let unreadable = |reason: String| SecretUnreadable {
            secret_id: id,
            endpoint_id,
            reason,
        };
        let opened = self
            .keyring
            .decrypt(endpoint_id, key_id, ciphertext)
            .map_err(|e| unreadable(e.to_string()))
            .and_then(|plain| {
                SigningSecret::parse(&plain)
                    .map_err(|e| unreadable(format!("the decrypted secret is malformed: {e}")))
            });
        if let Err(e) = &opened {
            self.metrics.secret_decrypt_failures.inc();
            tracing::error!(error = %e, "deliveries of this endpoint are held until the key is configured");
        }
        self.entries.insert(
            id,
            Entry {
                key_id: key_id.to_string(),
                ciphertext: ciphertext.to_vec(),
                opened: opened.clone(),
            },
        );
        opened
    }
}
