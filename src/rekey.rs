//! `hookd rekey`: moves every signing secret to the active encryption key, online.
//!
//! Rows are walked in primary-key order in small batches, each its own short transaction
//! that locks only its rows: claims never wait (they only read secrets), an `apply` or a
//! controller write touching a row of the batch waits milliseconds. Dispatchers keep
//! delivering throughout, as long as their keyring holds both the old key (in
//! HOOKD_ENCRYPTION_OLD_KEYS) and the new one: a row is readable under either.
//!
//! Rows written before encryption at rest (migration 0004) are encrypted on the same
//! walk, and their plaintext column cleared. Running it again does nothing.

use std::collections::BTreeMap;

use sqlx::PgPool;
use uuid::Uuid;

use crate::crypto::Keyring;
use crate::db::secrets::{self, RekeyScope, Resealed};
use crate::db::{DbError, secrets::StoredSecret};

/// A row that could not be re-encrypted (its key is not in the keyring, or it does not
/// authenticate). It is left as it is.
#[derive(Debug, Clone)]
pub struct Unreadable {
    pub secret_id: i64,
    pub endpoint_id: Uuid,
    pub reason: String,
}

/// What one walk did.
#[derive(Debug, Default)]
pub struct RekeyReport {
    /// rows moved to the active key, by the key id they were under
    pub reencrypted: BTreeMap<String, u64>,
    /// legacy plaintext rows encrypted
    pub encrypted_plaintext: u64,
    pub unreadable: Vec<Unreadable>,
    /// why the table could not be compacted after plaintext was cleared, if it failed
    pub compact_error: Option<String>,
}

impl RekeyReport {
    pub fn changed(&self) -> u64 {
        self.reencrypted.values().sum::<u64>() + self.encrypted_plaintext
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RekeyError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(
        "{count} signing secret(s) could not be re-encrypted and were left as they are; first: secret {first_id} of endpoint {first_endpoint}: {first_reason}"
    )]
    Unreadable {
        count: usize,
        first_id: i64,
        first_endpoint: Uuid,
        first_reason: String,
    },
}

/// Re-encrypts every row not under the active key (and every legacy plaintext row).
pub async fn rekey(pool: &PgPool, keyring: &Keyring, batch: u32) -> Result<RekeyReport, DbError> {
    reseal(pool, keyring, RekeyScope::NotUnder, batch).await
}

/// Encrypts legacy plaintext rows only (what every dispatcher does at start). Returns
/// how many it encrypted.
pub async fn encrypt_plaintext(
    pool: &PgPool,
    keyring: &Keyring,
    batch: u32,
) -> Result<u64, DbError> {
    let report = reseal(pool, keyring, RekeyScope::PlaintextOnly, batch).await?;
    Ok(report.encrypted_plaintext)
}

async fn reseal(
    pool: &PgPool,
    keyring: &Keyring,
    scope: RekeyScope,
    batch: u32,
) -> Result<RekeyReport, DbError> {
    let mut report = RekeyReport::default();
    let mut after = 0i64;
    loop {
        let mut tx = crate::db::begin(pool).await?;
        let rows = secrets::lock_rekey_batch(
            &mut tx,
            keyring.active_key_id(),
            scope,
            after,
            i64::from(batch.max(1)),
        )
        .await?;
        let Some(last) = rows.last() else {
            tx.commit().await?;
            break;
        };
        after = last.id;
        let mut resealed = Vec::with_capacity(rows.len());
        for row in &rows {
            match open(keyring, row) {
                Ok(plain) => {
                    let sealed = keyring.encrypt(row.endpoint_id, &plain);
                    resealed.push(Resealed {
                        id: row.id,
                        key_id: sealed.key_id,
                        ciphertext: sealed.ciphertext,
                        fingerprint: keyring.fingerprint(row.endpoint_id, &plain),
                    });
                    match &row.key_id {
                        Some(k) => *report.reencrypted.entry(k.clone()).or_default() += 1,
                        None => report.encrypted_plaintext += 1,
                    }
                }
                Err(reason) => report.unreadable.push(Unreadable {
                    secret_id: row.id,
                    endpoint_id: row.endpoint_id,
                    reason,
                }),
            }
        }
        secrets::store_resealed(&mut tx, &resealed).await?;
        tx.commit().await?;
    }
    if report.encrypted_plaintext > 0 {
        match secrets::compact(pool).await {
            Ok(true) => {}
            Ok(false) => {
                report.compact_error = Some(
                    "hookd.endpoint_secrets stayed locked by other transactions, so the old \
                     row versions were not rewritten; run `hookd rekey` again"
                        .to_string(),
                )
            }
            Err(e) => report.compact_error = Some(e.to_string()),
        }
    }
    Ok(report)
}

fn open(keyring: &Keyring, row: &StoredSecret) -> Result<zeroize::Zeroizing<String>, String> {
    if let Some(plain) = &row.plaintext_secret {
        return Ok(zeroize::Zeroizing::new(plain.clone()));
    }
    match (&row.key_id, &row.ciphertext) {
        (Some(key_id), Some(ct)) => keyring
            .decrypt(row.endpoint_id, key_id, ct)
            .map_err(|e| e.to_string()),
        // the table's CHECK constraint rules this out
        _ => Err("row has neither a ciphertext nor a plaintext secret".into()),
    }
}

/// `hookd rekey`: walks the table, prints what it did, and fails (leaving those rows
/// untouched) if any row could not be opened with the configured keys.
pub async fn run(pool: &PgPool, keyring: &Keyring, batch: u32) -> Result<(), RekeyError> {
    let active = keyring.active_key_id();
    println!("rekey: active key {active}");
    let report = rekey(pool, keyring, batch).await?;
    for (from, n) in &report.reencrypted {
        println!("rekey: re-encrypted {n} secret(s) from key {from} to key {active}");
    }
    if report.encrypted_plaintext > 0 {
        println!(
            "rekey: encrypted {} secret(s) stored in plaintext before the upgrade; plaintext cleared",
            report.encrypted_plaintext
        );
        match &report.compact_error {
            None => println!(
                "rekey: compacted hookd.endpoint_secrets (VACUUM FULL), so the cleared plaintext is gone from the table's files"
            ),
            Some(e) => println!(
                "rekey: warning: could not compact hookd.endpoint_secrets ({e}); run `VACUUM FULL hookd.endpoint_secrets` so the cleared plaintext does not linger on disk"
            ),
        }
    }
    if report.changed() == 0 && report.unreadable.is_empty() {
        println!("rekey: nothing to do");
    }
    let summary: Vec<String> = secrets::count_by_key(pool)
        .await?
        .into_iter()
        .map(|(k, n)| match k {
            Some(k) => format!("{n} under key {k}"),
            None => format!("{n} in plaintext"),
        })
        .collect();
    println!(
        "rekey: signing secrets now: {}",
        if summary.is_empty() {
            "none".to_string()
        } else {
            summary.join(", ")
        }
    );
    match report.unreadable.first() {
        None => Ok(()),
        Some(first) => {
            for u in &report.unreadable {
                eprintln!(
                    "rekey: secret {} of endpoint {} left as it is: {}",
                    u.secret_id, u.endpoint_id, u.reason
                );
            }
            Err(RekeyError::Unreadable {
                count: report.unreadable.len(),
                first_id: first.secret_id,
                first_endpoint: first.endpoint_id,
                first_reason: first.reason.clone(),
            })
        }
    }
}
