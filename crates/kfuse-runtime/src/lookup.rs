//! The first-level in-memory lookup: (source, name, arch, extra options) → a value (a loaded
//! [`crate::GpuFunction`] in [`crate::Gpu`], a compiled module in [`crate::KernelCache`]), found
//! with one fast non-cryptographic hash of the inputs and confirmed by comparing the stored inputs
//! for equality. A hit costs that hash, a read lock, one map probe and one `memcmp` of the
//! source; it allocates nothing and needs neither NVRTC nor a GPU.
//!
//! Correctness never rests on the hash: two different inputs with the same hash share a bucket
//! and are told apart by the equality check. Within one process the NVRTC and kfuse versions and
//! the cache format are fixed, so they need not be part of this identity (the blake3
//! [`crate::CacheKey`] that names disk entries includes them). Does not handle: eviction (entries
//! live as long as the map, like the loaded modules they point to).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::RwLock;

use crate::Arch;

/// What identifies one kernel within a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupKey<'a> {
    /// The CUDA source, exactly as compiled.
    pub source: &'a str,
    /// The kernel function's name (empty where a whole module is looked up).
    pub name: &'a str,
    /// The target architecture.
    pub arch: Arch,
    /// The extra NVRTC options, in order.
    pub extra: &'a [String],
}

/// One stored entry: owned copies of the key's parts, compared on every hit.
struct Entry<V> {
    source: Box<str>,
    name: Box<str>,
    arch: Arch,
    extra: Box<[String]>,
    value: V,
}

impl<V> Entry<V> {
    fn matches(&self, key: &LookupKey<'_>) -> bool {
        // Cheap fields first; the source comparison (a memcmp) last.
        self.arch == key.arch && *self.name == *key.name && *self.extra == *key.extra && *self.source == *key.source
    }
}

/// Buckets are keyed by an already-mixed 64-bit hash: the map hashes that u64 again with
/// foldhash, which costs a couple of multiplications.
type Buckets<V> = HashMap<u64, Vec<Entry<V>>, foldhash::fast::RandomState>;

/// A thread-safe map from [`LookupKey`] to `V`, verified by equality (see the module docs).
pub struct SourceMap<V> {
    hasher: foldhash::fast::RandomState,
    buckets: RwLock<Buckets<V>>,
}

impl<V: Clone> SourceMap<V> {
    /// An empty map.
    pub fn new() -> SourceMap<V> {
        SourceMap { hasher: foldhash::fast::RandomState::default(), buckets: RwLock::new(HashMap::default()) }
    }

    fn hash(&self, key: &LookupKey<'_>) -> u64 {
        let mut h = self.hasher.build_hasher();
        // Length-prefixed fields: ("ab", "c") and ("a", "bc") hash apart (and compare apart).
        h.write_usize(key.source.len());
        h.write(key.source.as_bytes());
        h.write_usize(key.name.len());
        h.write(key.name.as_bytes());
        h.write_u32(key.arch.major);
        h.write_u32(key.arch.minor);
        h.write_u8(u8::from(key.arch.accel));
        h.write_usize(key.extra.len());
        for option in key.extra {
            h.write_usize(option.len());
            h.write(option.as_bytes());
        }
        h.finish()
    }

    /// The value stored for `key`, if any (a clone).
    pub fn get(&self, key: &LookupKey<'_>) -> Option<V> {
        let hash = self.hash(key);
        let buckets = self.buckets.read().unwrap_or_else(|e| e.into_inner());
        buckets.get(&hash)?.iter().find(|entry| entry.matches(key)).map(|entry| entry.value.clone())
    }

    /// Stores `value` for `key` unless a value is already there; returns the stored one (so
    /// racing inserters all end up with the same value).
    pub fn insert(&self, key: &LookupKey<'_>, value: V) -> V {
        let hash = self.hash(key);
        let mut buckets = self.buckets.write().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.entry(hash).or_default();
        if let Some(existing) = bucket.iter().find(|entry| entry.matches(key)) {
            return existing.value.clone();
        }
        bucket.push(Entry {
            source: key.source.into(),
            name: key.name.into(),
            arch: key.arch,
            extra: key.extra.into(),
            value: value.clone(),
        });
        value
    }

    /// Stores `value` for `key`, in place of any value already there.
    pub fn replace(&self, key: &LookupKey<'_>, value: V) {
        let hash = self.hash(key);
        let mut buckets = self.buckets.write().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.entry(hash).or_default();
        match bucket.iter_mut().find(|entry| entry.matches(key)) {
            Some(existing) => existing.value = value,
            None => bucket.push(Entry {
                source: key.source.into(),
                name: key.name.into(),
                arch: key.arch,
                extra: key.extra.into(),
                value,
            }),
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        let buckets = self.buckets.read().unwrap_or_else(|e| e.into_inner());
        buckets.values().map(Vec::len).sum()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry.
    pub fn clear(&self) {
        self.buckets.write().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Test hook: how many entries share the bucket `key` hashes to.
    #[cfg(test)]
    fn bucket_len(&self, key: &LookupKey<'_>) -> usize {
        let hash = self.hash(key);
        let buckets = self.buckets.read().unwrap_or_else(|e| e.into_inner());
        buckets.get(&hash).map_or(0, Vec::len)
    }

    /// Test hook: inserts `value` under an explicit hash, to force collisions.
    #[cfg(test)]
    fn insert_with_hash(&self, hash: u64, key: &LookupKey<'_>, value: V) {
        let mut buckets = self.buckets.write().unwrap_or_else(|e| e.into_inner());
        buckets.entry(hash).or_default().push(Entry {
            source: key.source.into(),
            name: key.name.into(),
            arch: key.arch,
            extra: key.extra.into(),
            value,
        });
    }
}

impl<V: Clone> Default for SourceMap<V> {
    fn default() -> SourceMap<V> {
        SourceMap::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SM90: Arch = Arch::new(9, 0);

    fn key<'a>(source: &'a str, name: &'a str, extra: &'a [String]) -> LookupKey<'a> {
        LookupKey { source, name, arch: SM90, extra }
    }

    #[test]
    fn finds_what_was_inserted_and_nothing_else() {
        let map = SourceMap::new();
        let none: Vec<String> = Vec::new();
        let fast = vec!["--use_fast_math".to_string()];
        assert_eq!(map.get(&key("src", "k", &none)), None);
        assert_eq!(map.insert(&key("src", "k", &none), 1), 1);
        assert_eq!(map.insert(&key("src", "k", &fast), 2), 2);
        assert_eq!(map.get(&key("src", "k", &none)), Some(1));
        assert_eq!(map.get(&key("src", "k", &fast)), Some(2));
        // Every part of the key matters.
        assert_eq!(map.get(&key("src2", "k", &none)), None);
        assert_eq!(map.get(&key("src", "k2", &none)), None);
        assert_eq!(map.get(&LookupKey { arch: Arch::new(8, 0), ..key("src", "k", &none) }), None);
        let split = vec!["-a".to_string(), "b".to_string()];
        let joined = vec!["-ab".to_string()];
        map.insert(&key("src", "k", &split), 3);
        assert_eq!(map.get(&key("src", "k", &joined)), None);
        assert_eq!(map.get(&key("srck", "", &none)), None, "fields are not concatenated");
        assert_eq!(map.len(), 3);
    }

    #[test]
    fn a_second_insert_keeps_the_first_value() {
        let map = SourceMap::new();
        assert_eq!(map.insert(&key("s", "k", &[]), 1), 1);
        assert_eq!(map.insert(&key("s", "k", &[]), 2), 1);
        assert_eq!(map.get(&key("s", "k", &[])), Some(1));
        assert_eq!(map.len(), 1);
        map.clear();
        assert!(map.is_empty());
        assert_eq!(map.get(&key("s", "k", &[])), None);
    }

    #[test]
    fn colliding_hashes_are_told_apart_by_equality() {
        let map = SourceMap::new();
        let a = key("extern \"C\" __global__ void k() { /* 1e-7 */ }", "k", &[]);
        let b = key("extern \"C\" __global__ void k() { /* 2e-7 */ }", "k", &[]);
        // Force both into the bucket `a` hashes to.
        let hash = map.hash(&a);
        map.insert_with_hash(hash, &b, 2);
        assert_eq!(map.get(&a), None, "b's entry must not answer for a");
        map.insert(&a, 1);
        assert_eq!(map.bucket_len(&a), 2);
        assert_eq!(map.get(&a), Some(1));
        assert_eq!(map.get(&b), None, "b's entry sits under a's hash, not b's");
    }
}
