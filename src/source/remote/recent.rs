//! Recent answers kept in memory for a time to live (`index.yaml` documents, OCI layer digests).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Recent answers by key, each valid for a time to live; beyond `max` the oldest is dropped.
pub(super) struct Recent<V> {
    entries: Mutex<HashMap<String, (Instant, V)>>,
    max: usize,
}

impl<V: Clone> Recent<V> {
    pub(super) fn new(max: usize) -> Self {
        Self {
            entries: Mutex::default(),
            max,
        }
    }

    pub(super) fn get(&self, key: &str, ttl: Duration) -> Option<V> {
        let entries = self.entries.lock().unwrap();
        let (at, value) = entries.get(key)?;
        (at.elapsed() < ttl).then(|| value.clone())
    }

    pub(super) fn put(&self, key: String, value: V) {
        let mut entries = self.entries.lock().unwrap();
        if entries.len() >= self.max
            && !entries.contains_key(&key)
            && let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
        {
            entries.remove(&oldest);
        }
        entries.insert(key, (Instant::now(), value));
    }
}
