//! The sources one API process verifies inbound requests with, kept between requests with
//! their secrets opened: without it every `POST /in/{name}` paid a database read and an
//! AEAD open before its HMAC (inbound ingest measured 0.66x of outbound).
//!
//! Kept only while this process listens on [`CHANNEL`], which migration 0028 notifies on
//! every change to a source or its secrets: a notification forgets everything kept, so a
//! deleted, changed or rotated source stops verifying in every replica as soon as the
//! notification arrives. While the listener is down (connecting, reconnecting, or no
//! LISTEN possible behind a transaction-mode pooler without HOOKD_NOTIFY_DATABASE_URL)
//! every request reads the database, as it would without a cache.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use zeroize::Zeroizing;

use super::providers::Provider;
use super::sources::provider_of;
use crate::crypto::Keyring;
use crate::db::{self, DbError, sources::SourceRow};
use crate::notify::{self, Heard};

/// Where migration 0028's trigger announces a change to `hookd.sources` or
/// `hookd.source_secrets`.
pub const CHANNEL: &str = "hookd_sources";

/// How long a kept source is trusted without a notification: a bound on a lost
/// notification the listener did not notice, never the way changes arrive.
const MAX_AGE: Duration = Duration::from_secs(60);

/// Most sources kept (a tenant may have 100): past it, the cache starts over. Only names
/// that exist are kept, so a scanner's made-up names cost it nothing here.
const MAX_ENTRIES: usize = 10_000;

/// A source ready to verify with.
pub struct Ready {
    pub source: SourceRow,
    pub provider: Provider,
    secrets: Vec<(Zeroizing<String>, Option<DateTime<Utc>>)>,
}

impl Ready {
    /// The secrets that verify at `now`, current first (one in its grace period stops when
    /// its time is up, whether or not the source was read again since).
    pub fn secrets_at(&self, now: DateTime<Utc>) -> Vec<&str> {
        self.secrets
            .iter()
            .filter(|(_, not_after)| not_after.is_none_or(|t| t > now))
            .map(|(s, _)| s.as_str())
            .collect()
    }
}

/// Why a source that exists cannot verify.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Db(#[from] DbError),
    /// the stored row does not read back (a bug or a hand edit)
    #[error("the stored source cannot be read: {0}")]
    Corrupt(String),
    /// every secret is sealed under a key this process lacks
    #[error("no secret of the source opens with this process's keys")]
    Sealed,
}

/// Cheap to clone; one per API process. Starts keeping nothing (not live).
#[derive(Clone, Default)]
pub struct SourceCache {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// the listener is connected: what is kept is kept up to date
    live: AtomicBool,
    /// moves on every change heard (and every connect or loss): a read that started
    /// before a change is not kept after it
    generation: AtomicU64,
    entries: Mutex<HashMap<String, (Instant, Arc<Ready>)>>,
}

impl SourceCache {
    /// A cache kept while a listener on [`CHANNEL`] runs (on `direct_url` when given);
    /// without one it keeps nothing.
    pub fn start(pool: PgPool, direct_url: Option<String>, shutdown: CancellationToken) -> Self {
        let cache = SourceCache::default();
        let heard = cache.clone();
        notify::listen(
            pool,
            direct_url,
            CHANNEL,
            "every inbound request reads its source from the database",
            move |h| heard.heard(h),
            shutdown,
        );
        cache
    }

    /// Moves on every change heard (and every connect or loss of the listener): a request
    /// that read its source at one value and sees another later knows the source may have
    /// changed meanwhile.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Whether sources are being kept (the listener is connected).
    pub fn is_live(&self) -> bool {
        self.inner.live.load(Ordering::Acquire)
    }

    fn heard(&self, heard: Heard) {
        if heard == Heard::Lost {
            self.inner.live.store(false, Ordering::Release);
        }
        self.forget_all();
        if heard == Heard::Listening {
            self.inner.live.store(true, Ordering::Release);
        }
    }

    /// Forgets every source kept. Also called by this process's own changes, so they take
    /// effect here before the notification comes back.
    pub fn forget_all(&self) {
        let mut entries = self.inner.entries.lock().expect("source cache lock");
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        entries.clear();
    }

    /// The source named `name`, ready to verify with; `None` when there is none.
    pub async fn get(
        &self,
        pool: &PgPool,
        keyring: &Keyring,
        name: &str,
    ) -> Result<Option<Arc<Ready>>, OpenError> {
        let now = Instant::now();
        let live = self.is_live();
        if live {
            let entries = self.inner.entries.lock().expect("source cache lock");
            if let Some((read_at, ready)) = entries.get(name)
                && now.duration_since(*read_at) < MAX_AGE
            {
                return Ok(Some(ready.clone()));
            }
        }
        let generation = self.inner.generation.load(Ordering::Acquire);
        let Some((source, sealed)) = db::sources::for_ingest(pool, name).await? else {
            return Ok(None);
        };
        let provider = provider_of(&source).map_err(OpenError::Corrupt)?;
        let secrets: Vec<_> = sealed
            .iter()
            .filter_map(
                |s| match keyring.decrypt(source.id, &s.key_id, &s.ciphertext) {
                    Ok(secret) => Some((secret, s.not_after)),
                    Err(e) => {
                        tracing::warn!(source = %source.name, error = %e, "a source secret cannot be opened with this process's keys");
                        None
                    }
                },
            )
            .collect();
        if secrets.is_empty() && !sealed.is_empty() {
            return Err(OpenError::Sealed);
        }
        let ready = Arc::new(Ready {
            source,
            provider,
            secrets,
        });
        if live {
            let mut entries = self.inner.entries.lock().expect("source cache lock");
            // kept only if nothing changed since the read began and the listener is still
            // up (both are checked under the lock `forget_all` takes)
            if self.is_live() && self.inner.generation.load(Ordering::Acquire) == generation {
                if entries.len() >= MAX_ENTRIES {
                    entries.clear();
                }
                entries.insert(name.to_string(), (now, ready.clone()));
            }
        }
        Ok(Some(ready))
    }
}
