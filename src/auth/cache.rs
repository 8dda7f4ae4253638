//! A small expiring map keyed by the SHA-256 of a credential, so verified (and refused)
//! credentials are not checked again on every request. The key is a hash, never the
//! credential, so a heap dump of the cache holds nothing that authenticates.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

pub(crate) type Key = [u8; 32];

pub(crate) struct TtlCache<V> {
    entries: Mutex<HashMap<Key, (Instant, V)>>,
    max_entries: usize,
}

impl<V: Clone> TtlCache<V> {
    pub(crate) fn new(max_entries: usize) -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
            max_entries,
        }
    }

    pub(crate) fn get(&self, key: &Key, now: Instant) -> Option<V> {
        let entries = self.entries.lock().expect("cache lock");
        match entries.get(key) {
            Some((until, v)) if *until > now => Some(v.clone()),
            _ => None,
        }
    }

    /// Drops every entry whose value `doomed` picks.
    pub(crate) fn remove_where(&self, doomed: impl Fn(&V) -> bool) {
        let mut entries = self.entries.lock().expect("cache lock");
        entries.retain(|_, (_, v)| !doomed(v));
    }

    /// Keeps `value` until `until`. A full cache first drops what expired, and if that is
    /// not enough (a flood of distinct credentials) starts over: the cache only saves
    /// lookups, so forgetting is always safe.
    pub(crate) fn insert(&self, key: Key, value: V, until: Instant, now: Instant) {
        let mut entries = self.entries.lock().expect("cache lock");
        if entries.len() >= self.max_entries {
            entries.retain(|_, (u, _)| *u > now);
            if entries.len() >= self.max_entries {
                entries.clear();
            }
        }
        entries.insert(key, (until, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn entries_expire_and_the_cache_stays_bounded() {
        let c = TtlCache::new(2);
        let now = Instant::now();
        c.insert([1; 32], 1, now + Duration::from_secs(5), now);
        assert_eq!(c.get(&[1; 32], now), Some(1));
        assert_eq!(c.get(&[1; 32], now + Duration::from_secs(5)), None);
        c.insert([2; 32], 2, now + Duration::from_secs(1), now);
        // full: the expired entry [2] goes, [1] stays
        c.insert(
            [3; 32],
            3,
            now + Duration::from_secs(5),
            now + Duration::from_secs(2),
        );
        assert_eq!(c.get(&[1; 32], now), Some(1));
        assert_eq!(c.get(&[2; 32], now), None);
        // full of live entries: starts over
        c.insert([4; 32], 4, now + Duration::from_secs(5), now);
        assert_eq!(c.get(&[1; 32], now), None);
        assert_eq!(c.get(&[4; 32], now), Some(4));
    }
}
