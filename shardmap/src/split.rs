//! Generated maps: an even split of the keyspace into N shards, and one shard split in two.
//!
//! Boundaries use as few hex bytes as keep the split exact (powers of two, 512 → `0080`…) or,
//! where N does not divide the keyspace, within one part in 65,536 of exact (3 → `555555`).

use crate::error::MapError;
use crate::map::{Shard, ShardMap, Table};
use crate::primary::Primary;
use crate::range::KeyRange;

/// Largest N accepted by [`even_ranges`].
pub const MAX_SHARDS: usize = 4096;

/// The ranges of an even split of the keyspace into `n` shards, in keyspace order.
pub fn even_ranges(n: usize) -> Result<Vec<KeyRange>, String> {
    if n == 0 || n > MAX_SHARDS {
        return Err(format!(
            "the number of shards must be 1 to {MAX_SHARDS}, not {n}"
        ));
    }
    let n128 = n as u128;
    // Smallest number of whole bytes that splits exactly, or nearly so.
    let bytes = (1u32..=8)
        .find(|&p| {
            let units = 1u128 << (8 * p);
            units.is_multiple_of(n128) || units / n128 >= 1 << 16
        })
        .unwrap_or(8);
    let units = 1u128 << (8 * bytes);
    let shift = 64 - 8 * bytes;
    let boundary = |i: usize| -> u128 { (i as u128 * units / n128) << shift };
    Ok((0..n)
        .map(|i| KeyRange {
            start: boundary(i) as u64,
            end: (i + 1 < n).then(|| boundary(i + 1) as u64),
        })
        .collect())
}

impl ShardMap {
    /// An even split into `primaries.len()` shards, shard `i` on `primaries[i]`, version 1.
    pub fn even_split(primaries: &[String], tables: Vec<Table>) -> Result<ShardMap, MapError> {
        let origin = "<even split>";
        let ranges = even_ranges(primaries.len()).map_err(|e| MapError::single(origin, 0, e))?;
        let mut shards = Vec::with_capacity(ranges.len());
        for (range, url) in ranges.into_iter().zip(primaries) {
            let primary = Primary::parse(url).map_err(|e| MapError::single(origin, 0, e))?;
            shards.push(Shard { range, primary });
        }
        ShardMap::new(1, tables, shards, None)
    }

    /// This map with the shard of `range` split into two halves, the lower on `low_primary`
    /// and the upper on `high_primary`, and the version bumped. The default shard, if it is the
    /// one split, becomes the lower half.
    pub fn split_shard(
        &self,
        range: &KeyRange,
        low_primary: &str,
        high_primary: &str,
    ) -> Result<ShardMap, MapError> {
        let origin = "<split>";
        let fail = |msg: String| MapError::single(origin, 0, msg);
        let index = self
            .shard_by_range(range)
            .ok_or_else(|| fail(format!("no shard has the range {range}")))?;
        let (low, high) = range.halves().ok_or_else(|| {
            fail(format!(
                "shard {range} holds one keyspace ID and cannot be split"
            ))
        })?;
        let parse = |url: &str| Primary::parse(url).map_err(fail);
        let mut shards = self.shards().to_vec();
        shards[index] = Shard {
            range: low,
            primary: parse(low_primary)?,
        };
        shards.insert(
            index + 1,
            Shard {
                range: high,
                primary: parse(high_primary)?,
            },
        );
        let default = self.shards()[self.default_shard()].range;
        let default = if default == *range { low } else { default };
        ShardMap::new(
            self.version() + 1,
            self.tables().to_vec(),
            shards,
            Some(default),
        )?
        .with_references(self.references().to_vec())
    }
}

impl KeyRange {
    /// The two halves of this range, split at its midpoint; `None` for a one-ID range.
    pub fn halves(&self) -> Option<(KeyRange, KeyRange)> {
        if self.width() < 2 {
            return None;
        }
        let mid = (u128::from(self.start) + self.width() / 2) as u64;
        Some((
            KeyRange {
                start: self.start,
                end: Some(mid),
            },
            KeyRange {
                start: mid,
                end: self.end,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::KeyspaceId;

    #[test]
    fn even_splits_cover_the_keyspace_for_every_n() {
        for n in 1..=MAX_SHARDS {
            let ranges = even_ranges(n).unwrap();
            assert_eq!(ranges.len(), n);
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[n - 1].end, None);
            let ideal = (1u128 << 64) / n as u128;
            for w in ranges.windows(2) {
                assert_eq!(w[0].end, Some(w[1].start), "n={n}");
            }
            for r in &ranges {
                let off = r.width().abs_diff(ideal);
                assert!(
                    off * 65_536 <= ideal,
                    "n={n} range {r} is {off} IDs off even"
                );
            }
        }
        assert!(even_ranges(0).is_err());
        assert!(even_ranges(MAX_SHARDS + 1).is_err());
    }

    #[test]
    fn familiar_boundaries() {
        let s = |n| {
            even_ranges(n)
                .unwrap()
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(s(1), ["-"]);
        assert_eq!(s(2), ["-80", "80-"]);
        assert_eq!(s(4), ["-40", "40-80", "80-c0", "c0-"]);
        assert_eq!(s(3), ["-555555", "555555-aaaaaa", "aaaaaa-"]);
        assert_eq!(s(512)[1], "0080-0100");
    }

    #[test]
    fn halves_meet_in_the_middle() {
        let (a, b) = KeyRange::parse("40-80").unwrap().halves().unwrap();
        assert_eq!(
            (a.to_string(), b.to_string()),
            ("40-60".into(), "60-80".into())
        );
        let (a, b) = KeyRange::FULL.halves().unwrap();
        assert_eq!((a.to_string(), b.to_string()), ("-80".into(), "80-".into()));
        let (a, b) = KeyRange::parse("c0-").unwrap().halves().unwrap();
        assert_eq!(
            (a.to_string(), b.to_string()),
            ("c0-e0".into(), "e0-".into())
        );
        let one = KeyRange::parse("ffffffffffffffff-").unwrap();
        assert!(one.halves().is_none());
        assert!(one.contains(KeyspaceId(u64::MAX)));
    }

    #[test]
    fn split_shard_bumps_the_version_and_keeps_the_rest() {
        let urls: Vec<String> = (0..2).map(|i| format!("postgres://h/s{i}")).collect();
        let map = ShardMap::even_split(&urls, vec![]).unwrap();
        let split = map
            .split_shard(
                &KeyRange::parse("80-").unwrap(),
                "postgres://h/s1",
                "postgres://h/s2",
            )
            .unwrap();
        assert_eq!(split.version(), 2);
        let ranges: Vec<String> = split.shards().iter().map(|s| s.range.to_string()).collect();
        assert_eq!(ranges, ["-80", "80-c0", "c0-"]);
        assert!(map
            .split_shard(
                &KeyRange::parse("40-80").unwrap(),
                "postgres://h/a",
                "postgres://h/b"
            )
            .is_err());
    }
}
