//! The plan cache: statement text → plan, shared by every client session of a router.
//!
//! Sessions on all cores look plans up on every statement, so there is no global lock: the
//! cache is split into [`SHARDS`] independent maps, each behind its own `RwLock`, chosen by
//! the text's hash. The hash is computed once per lookup and reused for the map probe
//! (hashbrown's raw entry API), and lookups borrow the text, so a hit allocates nothing.
//!
//! Bounded in entries and in bytes: each shard holds at most `capacity / SHARDS` plans and
//! `bytes / SHARDS` bytes (rounded up), counting each entry as its text plus [`ENTRY_COST`].
//! Texts longer than [`MAX_CACHED_TEXT`] are never cached: such statements are rare, a parse
//! costs little next to reading them, and caching them let a client fill the router's memory
//! with a few distinct huge texts. When an insert finds its shard full, half of that shard's entries are dropped, every other one in table
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

/// The longest statement text (after normalization) that is cached: 64 KiB, far above what
/// applications repeat, far below what would let a few texts fill the cache.
pub const MAX_CACHED_TEXT: usize = 64 << 10;

/// What an entry costs besides its text: the plan, its `Arc`, the map slot (an estimate).
pub const ENTRY_COST: usize = 256;

type Map = HashMap<Box<str>, Arc<Plan>, DefaultHashBuilder>;

/// One part's plans and the bytes they are counted as.
struct Entries {
    map: Map,
    bytes: usize,
}

fn cost(text: &str) -> usize {
    text.len() + ENTRY_COST
}

/// One part of the cache, alone on its cache lines so that hits on different parts do not
/// contend for the same memory.
#[repr(align(128))]
struct Shard {
    map: RwLock<Entries>,
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
    /// Bytes they are counted as (texts plus [`ENTRY_COST`] each).
    pub bytes: usize,
}

/// A bounded, sharded map from statement text to plan.
pub struct PlanCache {
    shards: Box<[Shard]>,
    hasher: DefaultHashBuilder,
    per_shard: usize,
    bytes_per_shard: usize,
}

impl PlanCache {
    /// A cache of about `capacity` plans (at least one per shard) and about `bytes` bytes;
    /// 0 for either keeps none.
    pub fn new(capacity: usize, bytes: usize) -> PlanCache {
        let hasher = DefaultHashBuilder::default();
        let bytes_per_shard = bytes.div_ceil(SHARDS);
        // A part too small for one entry keeps none.
        let per_shard = if bytes_per_shard < ENTRY_COST {
            0
        } else {
            capacity.div_ceil(SHARDS)
        };
        let shards = (0..SHARDS)
            .map(|_| Shard {
                // Every shard hashes with the same seed: one hash picks the shard and probes it.
                map: RwLock::new(Entries {
                    map: HashMap::with_hasher(hasher.clone()),
                    bytes: 0,
                }),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                evictions: AtomicU64::new(0),
            })
            .collect();
        PlanCache {
            shards,
            hasher,
            per_shard,
            bytes_per_shard,
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
            .map
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
    /// Texts longer than [`MAX_CACHED_TEXT`] are not cached.
    pub fn insert(&self, text: &str, plan: Arc<Plan>) -> Arc<Plan> {
        let cost = cost(text);
        if self.per_shard == 0 || text.len() > MAX_CACHED_TEXT || cost > self.bytes_per_shard {
            return plan;
        }
        let (hash, shard) = self.locate(text);
        let mut entries = shard.map.write().unwrap_or_else(|e| e.into_inner());
        if let Some((_, existing)) = entries.map.raw_entry().from_hash(hash, |k| **k == *text) {
            return Arc::clone(existing);
        }
        // Halving until the new entry fits (once, but for entries far above the average).
        while !entries.map.is_empty()
            && (entries.map.len() >= self.per_shard || entries.bytes + cost > self.bytes_per_shard)
        {
            let before = entries.map.len();
            let (mut keep, mut kept_bytes) = (false, 0);
            entries.map.retain(|k, _| {
                keep = !keep;
                if keep {
                    kept_bytes += self::cost(k);
                }
                keep
            });
            entries.bytes = kept_bytes;
            shard
                .evictions
                .fetch_add((before - entries.map.len()) as u64, Ordering::Relaxed);
        }
        match entries
            .map
            .raw_entry_mut()
            .from_hash(hash, |k| **k == *text)
        {
            RawEntryMut::Occupied(o) => Arc::clone(o.get()),
            RawEntryMut::Vacant(v) => {
                v.insert_hashed_nocheck(hash, text.into(), Arc::clone(&plan));
                entries.bytes += cost;
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
            let mut entries = shard.map.write().unwrap_or_else(|p| p.into_inner());
            entries.map.clear();
            // Give the table's memory back too: a burst of texts must not stay resident.
            entries.map.shrink_to_fit();
            entries.bytes = 0;
        }
    }

    pub fn stats(&self) -> CacheStats {
        let mut stats = CacheStats::default();
        for shard in self.shards.iter() {
            stats.hits += shard.hits.load(Ordering::Relaxed);
            stats.misses += shard.misses.load(Ordering::Relaxed);
            stats.evictions += shard.evictions.load(Ordering::Relaxed);
            let entries = shard.map.read().unwrap_or_else(|e| e.into_inner());
            stats.len += entries.map.len();
            stats.bytes += entries.bytes;
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_returns_the_same_plan() {
        let cache = PlanCache::new(100, 1 << 20);
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
        let c = PlanCache::new(0, 1 << 20);
        let p = Plan::empty();
        let kept = c.insert("SELECT 1", p.clone());
        assert!(Arc::ptr_eq(&kept, &p));
        assert!(c.get("SELECT 1").is_none());
        assert_eq!(c.stats().len, 0);
    }

    #[test]
    fn stays_bounded() {
        let cache = PlanCache::new(64, 1 << 20);
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
        let cache = Arc::new(PlanCache::new(1000, 1 << 20));
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

    #[test]
    fn bounded_in_bytes_and_long_texts_not_cached() {
        // 100 distinct 5 MB statements: none is cached.
        let cache = PlanCache::new(10_000, 1 << 20);
        let huge = "x".repeat(5 << 20);
        for i in 0..3 {
            cache.insert(&format!("SELECT {i} {huge}"), Plan::empty());
        }
        assert_eq!(
            cache.stats().len,
            0,
            "texts above MAX_CACHED_TEXT are not cached"
        );
        let longest = "y".repeat(MAX_CACHED_TEXT - 20);
        let text = format!("SELECT 1 {longest}");
        assert!(text.len() <= MAX_CACHED_TEXT);
        // Many distinct 1 KB texts: the entry bound (10,000) is far, the byte bound (1 MiB) is
        // what holds.
        let filler = "z".repeat(1000);
        for i in 0..5000 {
            cache.insert(&format!("SELECT {i} {filler}"), Plan::empty());
        }
        let s = cache.stats();
        assert!(s.bytes <= 1 << 20, "{s:?}");
        assert!(s.len < 5000 && s.len > 100, "{s:?}");
        // An entry of the largest cached size fits in a part, even after others.
        let part = (1usize << 20).div_ceil(SHARDS);
        let cache = PlanCache::new(10_000, SHARDS * (MAX_CACHED_TEXT + ENTRY_COST));
        cache.insert(&text, Plan::empty());
        assert!(cache.get(&text).is_some());
        assert!(
            cost(&text) > part,
            "the byte bound per part is what evicts here"
        );
        // Clearing gives the bytes back.
        cache.clear();
        assert_eq!(cache.stats().bytes, 0);
    }
}
