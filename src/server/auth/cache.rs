//! A small map whose entries expire: the token review and authorization decisions kubelet
//! caches (apiserver's cached token authenticator and webhook authorizer caches), each entry
//! kept for the TTL its kind of answer gets. Bounded: at [`CAPACITY`] entries the expired ones
//! go first, then the ones closest to expiry.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Entries kept at most (kubelet's webhook authorizer cache holds 1024; tokens hash to more).
pub const CAPACITY: usize = 4096;

#[derive(Debug)]
pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> Default for TtlCache<K, V> {
    fn default() -> Self {
        TtlCache::with_capacity(CAPACITY)
    }
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn with_capacity(capacity: usize) -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// The value for `key` if it has not expired.
    pub fn get(&self, key: &K) -> Option<V> {
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(key) {
            Some((v, until)) if Instant::now() < *until => Some(v.clone()),
            Some(_) => {
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keep `value` for `ttl` (a zero TTL keeps nothing).
    pub fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= self.capacity && !map.contains_key(&key) {
            map.retain(|_, (_, until)| *until > now);
            while map.len() >= self.capacity {
                let Some(soonest) = map.iter().min_by_key(|(_, (_, until))| *until).map(|(k, _)| k.clone()) else {
                    break;
                };
                map.remove(&soonest);
            }
        }
        map.insert(key, (value, now + ttl));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn entries_expire_after_their_own_ttl() {
        let c: TtlCache<&str, bool> = TtlCache::default();
        c.insert("allowed", true, Duration::from_secs(300));
        c.insert("denied", false, Duration::from_secs(30));
        c.insert("never", true, Duration::ZERO);
        assert_eq!(c.get(&"allowed"), Some(true));
        assert_eq!(c.get(&"denied"), Some(false));
        assert_eq!(c.get(&"never"), None);
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(c.get(&"denied"), None);
        assert_eq!(c.get(&"allowed"), Some(true));
        tokio::time::advance(Duration::from_secs(270)).await;
        assert_eq!(c.get(&"allowed"), None);
        assert_eq!(c.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_cache_drops_the_expired_then_the_soonest_to_expire() {
        let c: TtlCache<u32, u32> = TtlCache::with_capacity(3);
        c.insert(1, 1, Duration::from_secs(10));
        c.insert(2, 2, Duration::from_secs(100));
        c.insert(3, 3, Duration::from_secs(50));
        c.insert(4, 4, Duration::from_secs(100));
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&1), None, "the soonest to expire went");
        tokio::time::advance(Duration::from_secs(60)).await;
        c.insert(5, 5, Duration::from_secs(1));
        assert_eq!(c.get(&3), None);
        assert_eq!((c.get(&2), c.get(&4), c.get(&5)), (Some(2), Some(4), Some(5)));
    }
}
