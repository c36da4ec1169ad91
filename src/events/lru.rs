//! A map of at most `capacity` entries that forgets the least recently used one first (the
//! groupcache LRU client-go's event correlator keeps its state in, 4096 entries).

use std::collections::{BTreeMap, HashMap};

#[derive(Debug)]
pub struct Lru<V> {
    capacity: usize,
    entries: HashMap<String, (V, u64)>,
    /// Use tick -> key: the first entry is the least recently used.
    order: BTreeMap<u64, String>,
    tick: u64,
}

impl<V> Lru<V> {
    pub fn new(capacity: usize) -> Lru<V> {
        Lru {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
        }
    }

    fn touch(&mut self, key: &str) {
        if let Some((_, t)) = self.entries.get_mut(key) {
            self.order.remove(t);
            self.tick += 1;
            *t = self.tick;
            self.order.insert(self.tick, key.to_string());
        }
    }

    /// The entry for `key`, now the most recently used.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.touch(key);
        self.entries.get_mut(key).map(|(v, _)| v)
    }

    /// Set the entry for `key`, now the most recently used; the least recently used goes when
    /// the map is over capacity.
    pub fn insert(&mut self, key: String, value: V) {
        self.tick += 1;
        if let Some((_, old)) = self.entries.insert(key.clone(), (value, self.tick)) {
            self.order.remove(&old);
        }
        self.order.insert(self.tick, key);
        while self.entries.len() > self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_the_least_recently_used() {
        let mut l = Lru::new(2);
        l.insert("a".into(), 1);
        l.insert("b".into(), 2);
        assert_eq!(l.get_mut("a"), Some(&mut 1));
        l.insert("c".into(), 3);
        assert_eq!(l.len(), 2);
        assert!(l.get_mut("b").is_none());
        assert_eq!(l.get_mut("a"), Some(&mut 1));
        l.insert("a".into(), 4);
        assert_eq!(l.get_mut("a"), Some(&mut 4));
        assert_eq!(l.len(), 2);
    }
}
