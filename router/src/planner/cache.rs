//! The plan cache: statement text → plan, shared by every client session of a router.
//!
//! Sessions on all cores look plans up on every statement, so there is no global lock: the
//! cache is split into [`SHARDS`] independent maps, each behind its own `RwLock`, chosen by
//! the text's hash. The hash is computed once per lookup and reused for the map probe
//! (hashbrown's raw entry API), and lookups borrow the text, so a hit allocates nothing.
//!
//! Bounded: each shard holds at most `capacity / SHARDS` plans (rounded up). When an insert
//! finds its shard full, half of that shard's entries are dropped, every other one in table
//! order, which is effectively random with respect to use. That is O(shard size) once per
//! `size / 2` inserts, and keeps no per-hit bookkeeping (an LRU would make every hit a write).
//! A plan evicted while a session still uses it stays alive through its `Arc`.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use hashbrown::hash_map::RawEntryMut;
use hashbrown::DefaultHashBuilder;
use hashbrown::HashMap;

use super::Plan;

/// Number of independently locked parts.
pub const SHARDS: usize = 32;

type Map = HashMap<Box<str>, Arc<Plan>, DefaultHashBuilder>;

/// One part of the cache, alone on its cache lines so that hits on different parts do not
/// contend for the same memory.
#[repr(align(128))]
struct Shard {
    map: RwLock<Map>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Plans dropped to stay within capacity.
    pub evictions: u64,
    /// Plans held now.
    pub len: usize,
}

/// A bounded, sharded map from statement text to plan.
pub struct PlanCache {
    shards: Box<[Shard]>,
    hasher: DefaultHashBuilder,
    per_shard: usize,
}

impl PlanCache {
    /// A cache of about `capacity` plans (at least one per shard); 0 keeps none.
    pub fn new(capacity: usize) -> PlanCache {
        let hasher = DefaultHashBuilder::default();
        let per_shard = capacity.div_ceil(SHARDS);
        let shards = (0..SHARDS)
            .map(|_| Shard {
                // Every shard hashes with the same seed: one hash picks the shard and probes it.
                map: RwLock::new(HashMap::with_hasher(hasher.clone())),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                evictions: AtomicU64::new(0),
            })
            .collect();
        PlanCache {
            shards,
            hasher,
            per_shard,
        }
    }

    fn locate(&self, text: &str) -> (u64, &Shard) {
        let hash = self.hasher.hash_one(text);
        // Bits the maps do not use for their buckets (low bits) or tags (top seven bits).
        let index = (hash >> 32) as usize % SHARDS;
        (hash, &self.shards[index])
    }

    /// The cached plan for `text`, counting a hit or a miss.
    pub fn get(&self, text: &str) -> Option<Arc<Plan>> {
        let (hash, shard) = self.locate(text);
        // A panic while holding the lock cannot leave the map of `Arc`s half-updated in a way
        // that matters, so a poisoned lock is used as it is.
        let map = shard.map.read().unwrap_or_else(|e| e.into_inner());
        let found = map
            .raw_entry()
            .from_hash(hash, |k| **k == *text)
            .map(|(_, plan)| Arc::clone(plan));
        drop(map);
        let counter = if found.is_some() {
            &shard.hits
        } else {
            &shard.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Caches `plan` for `text` and returns the plan now cached: when another session
    /// inserted one first, that one, so that every session shares a single plan.
    pub fn insert(&self, text: &str, plan: Arc<Plan>) -> Arc<Plan> {
        if self.per_shard == 0 {
            return plan;
        }
        let (hash, shard) = self.locate(text);
        let mut map = shard.map.write().unwrap_or_else(|e| e.into_inner());
        if let Some((_, existing)) = map.raw_entry().from_hash(hash, |k| **k == *text) {
            return Arc::clone(existing);
        }
        if map.len() >= self.per_shard {
            let before = map.len();
            let mut keep = false;
            map.retain(|_, _| {
                keep = !keep;
                keep
            });
            shard
                .evictions
                .fetch_add((before - map.len()) as u64, Ordering::Relaxed);
        }
        match map.raw_entry_mut().from_hash(hash, |k| **k == *text) {
            RawEntryMut::Occupied(o) => Arc::clone(o.get()),
            RawEntryMut::Vacant(v) => {
                v.insert_hashed_nocheck(hash, text.into(), Arc::clone(&plan));
                plan
            }
        }
    }

    /// Whether it keeps plans at all (`plan_cache_size = 0` keeps none).
    pub fn keeps_plans(&self) -> bool {
        self.per_shard > 0
    }

    /// Forgets every plan.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            shard.map.write().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    pub fn stats(&self) -> CacheStats {
        let mut stats = CacheStats::default();
        for shard in self.shards.iter() {
            stats.hits += shard.hits.load(Ordering::Relaxed);
            stats.misses += shard.misses.load(Ordering::Relaxed);
            stats.evictions += shard.evictions.load(Ordering::Relaxed);
            stats.len += shard.map.read().unwrap_or_else(|e| e.into_inner()).len();
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_returns_the_same_plan() {
        let cache = PlanCache::new(100);
        assert!(cache.get("a").is_none());
        let p = cache.insert("a", Plan::empty());
        let q = cache.get("a").unwrap();
        assert!(Arc::ptr_eq(&p, &q));
        // A second insert of the same text keeps the first plan.
        let r = cache.insert("a", Plan::empty());
        assert!(Arc::ptr_eq(&p, &r));
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.len), (1, 1, 1));
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let c = PlanCache::new(0);
        let p = Plan::empty();
        let kept = c.insert("SELECT 1", p.clone());
        assert!(Arc::ptr_eq(&kept, &p));
        assert!(c.get("SELECT 1").is_none());
        assert_eq!(c.stats().len, 0);
    }

    #[test]
    fn stays_bounded() {
        let cache = PlanCache::new(64);
        for i in 0..10_000 {
            cache.insert(&format!("SELECT {i}"), Plan::empty());
        }
        let s = cache.stats();
        assert!(s.len <= 64, "{s:?}");
        assert!(s.evictions >= 10_000 - 64, "{s:?}");
        // The newest entry always survives its own insert.
        assert!(cache.get("SELECT 9999").is_some());
    }

    #[test]
    fn shared_across_threads() {
        let cache = Arc::new(PlanCache::new(1000));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let cache = Arc::clone(&cache);
                std::thread::spawn(move || {
                    for i in 0..500 {
                        let text = format!("q{}", (i + t) % 50);
                        if cache.get(&text).is_none() {
                            cache.insert(&text, Plan::empty());
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(cache.stats().len, 50);
    }
}
