//! Which keys each shard holds, and how a run draws them.
//!
//! `prepare` and `run` agree on the keys without talking to each other: ids 1, 2, 3, ... are
//! hashed with the shard map (Postgres's own hash, via the shardmap crate) and each id goes to
//! its shard until every shard has `rows_per_shard` ids. A run picks the shard first (so every
//! shard gets its share exactly) and then a key of that shard, uniformly or zipfian.

use rand::Rng;
use rand_distr::{Distribution, Zipf};
use shardmap::{Key, ShardMap};

use crate::INSERT_KEY_BASE;

/// The loaded keys of every shard, in shard order; each list ascending.
#[derive(Debug, Clone)]
pub struct ShardKeys {
    /// Ids are stored as u32 (4 bytes a key: 512 shards of 231k keys take 475 MB, not 950).
    keys: Vec<Vec<u32>>,
}

impl ShardKeys {
    /// The first `per_shard` ids of every shard of `map`.
    pub fn assign(map: &ShardMap, per_shard: usize) -> Result<ShardKeys, crate::Error> {
        let shards = map.shards().len();
        let mut keys: Vec<Vec<u32>> = (0..shards).map(|_| Vec::with_capacity(per_shard)).collect();
        if per_shard == 0 {
            return Ok(ShardKeys { keys });
        }
        let mut missing = shards;
        // A shard with a sliver of the keyspace fills slowly; give up long after even shards.
        let limit = (per_shard as u64)
            .saturating_mul(shards as u64)
            .saturating_mul(64)
            .saturating_add(1_000_000)
            .min(u64::from(u32::MAX));
        let mut id: u64 = 1;
        while missing > 0 {
            if id > limit {
                let (short, have) = keys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| (i, k.len()))
                    .min_by_key(|&(_, n)| n)
                    .unwrap_or((0, 0));
                return Err(format!(
                    "shard {short} ({}) got only {have} of {per_shard} keys among ids 1..={limit}: its range is too narrow for this many rows per shard",
                    map.shards()[short].range
                ));
            }
            let shard = map.shard_for_key(&Key::Int(id as i64));
            let list = &mut keys[shard];
            if list.len() < per_shard {
                list.push(id as u32);
                if list.len() == per_shard {
                    missing -= 1;
                }
            }
            id += 1;
        }
        Ok(ShardKeys { keys })
    }

    pub fn shards(&self) -> usize {
        self.keys.len()
    }

    pub fn per_shard(&self) -> usize {
        self.keys.first().map_or(0, Vec::len)
    }

    /// The keys of `shard`, ascending.
    pub fn of(&self, shard: usize) -> impl ExactSizeIterator<Item = i64> + '_ {
        self.keys[shard].iter().map(|&k| i64::from(k))
    }

    /// Key `i` of `shard`.
    pub fn get(&self, shard: usize, i: usize) -> i64 {
        i64::from(self.keys[shard][i])
    }
}

/// How a key is picked within a shard.
#[derive(Debug, Clone)]
pub enum KeyDist {
    Uniform,
    /// Rank 1 (the shard's lowest id) is the hottest.
    Zipf(Zipf<f64>),
}

impl KeyDist {
    /// Uniform for `None`, else zipfian with exponent `s` over `n` keys.
    pub fn new(zipf: Option<f64>, n: usize) -> Result<KeyDist, crate::Error> {
        match zipf {
            None => Ok(KeyDist::Uniform),
            Some(s) if !(s >= 0.0 && s.is_finite()) => Err(format!(
                "--zipf {s}: the exponent must be a number >= 0 (1.0 is classic zipf, 0 is uniform)"
            )),
            Some(_) if n == 0 => Err("--zipf needs at least one row per shard".into()),
            Some(s) => Zipf::new(n as f64, s)
                .map(KeyDist::Zipf)
                .map_err(|e| format!("--zipf {s}: {e}")),
        }
    }

    /// An index in `0..n`.
    pub fn index<R: Rng>(&self, rng: &mut R, n: usize) -> usize {
        match self {
            KeyDist::Uniform => rng.random_range(0..n),
            KeyDist::Zipf(z) => (z.sample(rng) as usize).clamp(1, n) - 1,
        }
    }
}

/// A fresh key for an insert that lands on `shard`: random ids from [`INSERT_KEY_BASE`] up,
/// drawn until one hashes to the shard (about one try per shard in the map).
pub fn insert_key<R: Rng>(map: &ShardMap, shard: usize, rng: &mut R) -> i64 {
    let mut id = INSERT_KEY_BASE;
    for _ in 0..1_000_000 {
        id = rng.random_range(INSERT_KEY_BASE..i64::MAX);
        if map.shard_for_key(&Key::Int(id)) == shard {
            return id;
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardmap::{KeyType, Table};

    fn map(n: usize) -> ShardMap {
        let urls: Vec<String> = (0..n).map(|i| format!("postgres://h/s{i}")).collect();
        ShardMap::even_split(&urls, vec![Table::new("kv", "id", KeyType::BigInt)]).expect("map")
    }

    #[test]
    fn every_shard_gets_exactly_n_keys_of_its_own() {
        let m = map(8);
        let k = ShardKeys::assign(&m, 500).expect("assign");
        let mut all = Vec::new();
        for s in 0..8 {
            assert_eq!(k.of(s).len(), 500);
            for id in k.of(s) {
                assert_eq!(m.shard_for_key(&Key::Int(id)), s);
                all.push(id);
            }
        }
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 4000);
        // The first ids are taken in order: every id up to the smallest shard's last key is used.
        let lowest_last = (0..8).map(|s| k.get(s, 499)).min().unwrap_or(0);
        assert!(all
            .iter()
            .take(lowest_last as usize)
            .enumerate()
            .all(|(i, &id)| id == i as i64 + 1));
    }

    #[test]
    fn zipf_prefers_low_ranks_and_stays_in_range() {
        let d = KeyDist::new(Some(1.1), 1000).expect("zipf");
        let mut rng = rand::rng();
        let mut low = 0;
        for _ in 0..10_000 {
            let i = d.index(&mut rng, 1000);
            assert!(i < 1000);
            if i < 10 {
                low += 1;
            }
        }
        assert!(low > 3000, "{low}");
        assert!(KeyDist::new(Some(-1.0), 10).is_err());
    }

    #[test]
    fn insert_keys_land_on_the_requested_shard() {
        let m = map(4);
        let mut rng = rand::rng();
        for s in 0..4 {
            let id = insert_key(&m, s, &mut rng);
            assert!(id >= INSERT_KEY_BASE);
            assert_eq!(m.shard_for_key(&Key::Int(id)), s);
        }
    }
}
