//! Recent answers kept in memory for a time to live (`index.yaml` documents, OCI layer digests),
//! bounded in entries and in weight (bytes), expired entries dropped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Recent answers by key, each until its time to live passes; at most `max_entries` of at most
/// `max_weight` in total (the oldest go first; an answer heavier than that is not kept).
pub(super) struct Recent<V> {
    entries: Mutex<HashMap<String, Entry<V>>>,
    max_entries: usize,
    max_weight: u64,
}

struct Entry<V> {
    stored: Instant,
    /// `None`: never (a time to live too long for the clock).
    expires: Option<Instant>,
    weight: u64,
    value: V,
}

impl<V> Entry<V> {
    fn expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|at| at <= now)
    }
}

impl<V: Clone> Recent<V> {
    pub(super) fn new(max_entries: usize, max_weight: u64) -> Self {
        Self {
            entries: Mutex::default(),
            max_entries,
            max_weight,
        }
    }

    /// The answer under `key` unless it expired (then it is dropped).
    pub(super) fn get(&self, key: &str) -> Option<V> {
        let mut entries = self.entries.lock().unwrap();
        let entry = entries.get(key)?;
        if entry.expired(Instant::now()) {
            entries.remove(key);
            return None;
        }
        Some(entry.value.clone())
    }

    /// Keeps `value` under `key` for `ttl`, counting `weight` against the bound: expired
    /// entries go first, then the oldest until it fits.
    pub(super) fn put(&self, key: String, value: V, ttl: Duration, weight: u64) {
        let mut entries = self.entries.lock().unwrap();
        let now = Instant::now();
        entries.remove(&key);
        entries.retain(|_, entry| !entry.expired(now));
        if weight > self.max_weight || self.max_entries == 0 {
            return;
        }
        let mut total: u64 = entries.values().map(|e| e.weight).sum();
        while entries.len() >= self.max_entries || total + weight > self.max_weight {
            let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, e)| e.stored)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            total -= entries.remove(&oldest).map_or(0, |e| e.weight);
        }
        let expires = now.checked_add(ttl);
        entries.insert(
            key,
            Entry {
                stored: now,
                expires,
                weight,
                value,
            },
        );
    }

    /// Entries held and their total weight (expired ones not yet dropped included).
    pub(super) fn size(&self) -> (u64, u64) {
        let entries = self.entries.lock().unwrap();
        let weight = entries.values().map(|e| e.weight).sum();
        (entries.len() as u64, weight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_bounded_in_number_and_weight() {
        let recent = Recent::new(3, 100);
        let hour = Duration::from_secs(3600);
        for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
            recent.put(key.into(), i, hour, 10);
        }
        assert_eq!(recent.size(), (3, 30), "the oldest went");
        assert_eq!(recent.get("a"), None);
        assert_eq!(recent.get("d"), Some(3));
        recent.put("heavy".into(), 9, hour, 95);
        assert_eq!(recent.size(), (1, 95), "the others made room");
        recent.put("too heavy".into(), 9, hour, 101);
        assert_eq!(
            recent.get("too heavy"),
            None,
            "heavier than the bound: not kept"
        );
        assert_eq!(recent.size(), (1, 95));
        recent.put("heavy".into(), 10, hour, 5);
        assert_eq!((recent.get("heavy"), recent.size()), (Some(10), (1, 5)));
        recent.put("heavy".into(), 11, hour, 500);
        assert_eq!(
            recent.get("heavy"),
            None,
            "a replacement too heavy drops the entry"
        );
    }

    #[test]
    fn expired_entries_are_dropped() {
        let recent = Recent::new(10, 1000);
        recent.put("old".into(), 1, Duration::ZERO, 100);
        assert_eq!(recent.get("old"), None);
        assert_eq!(recent.size(), (0, 0), "dropped when found expired");
        recent.put("old".into(), 1, Duration::ZERO, 100);
        recent.put("forever".into(), 2, Duration::MAX, 1);
        assert_eq!(recent.size(), (1, 1), "dropped when anything is stored");
        assert_eq!(recent.get("forever"), Some(2));
    }
}
