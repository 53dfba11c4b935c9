//! Keys for the rows of INSERTs that leave out a sharded table's key (`Route::NewKeys`): unique
//! across every router of the fleet, with no round trip per INSERT.
//!
//! The default shard keeps one row per table in `shardgate.key_blocks`: the next key no router
//! has taken. A router reserves a block of keys with one `UPDATE ... RETURNING` (the row's lock
//! is held for that statement only) and hands them out from memory. Each key of a block belongs
//! to one shard (by its hash), so the keys in hand are kept by shard ([`Held`]): all the rows of
//! one INSERT get keys of one shard, so a multi-row INSERT needs no split, and an INSERT in a
//! transaction gets keys of the transaction's shard and stays there. Keys a router holds when
//! it stops (or reloads its map) are never used: gaps, as a Postgres sequence's cache leaves.
//! No clock and no router id is involved, so restarts, clock steps and a fleet of any size
//! cannot repeat a key.
//!
//! The first block of a table starts above the largest key already on any shard, so rows
//! written before (by the router with their keys, or loaded on the shards) are not repeated.
//! A key a client gives later that a block already handed out fails on its shard (`23505`),
//! as it would against a Postgres sequence.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use shardmap::sql::{quote_ident, quote_literal};
use shardmap::{Key, ShardMap, Table};

use crate::backend::BackendConn;
use crate::errors;
use crate::protocol::reply::SqlError;
use crate::routing::Routing;

/// The fewest keys reserved at once: one round trip to the default shard per this many
/// INSERTs at most.
pub const BLOCK: i64 = 1000;

/// The most keys a router holds for one table; past it, the keys in hand are dropped (gaps)
/// before the next block, so memory stays bounded whatever the INSERTs ask.
const MAX_HELD: usize = 1 << 20;

/// Reservations tried for one INSERT before giving up (the keys of a block fall on shards at
/// random: a block may give a shard fewer than expected).
const ATTEMPTS: usize = 6;

/// The SQL that makes the table of next keys, once per fleet: under a transaction-level
/// advisory lock, as the two-phase schema is, so routers starting together do not collide on
/// the catalog's unique index.
const SCHEMA_SQL: &str = "BEGIN; SELECT pg_advisory_xact_lock(hashtext('shardgate.key_blocks')); \
    CREATE SCHEMA IF NOT EXISTS shardgate; \
    CREATE TABLE IF NOT EXISTS shardgate.key_blocks (name text PRIMARY KEY, next bigint NOT NULL)";

/// Every sharded table's keys in hand, for one shard map.
#[derive(Default)]
pub struct Ids {
    tables: HashMap<String, TableIds>,
}

#[derive(Default)]
struct TableIds {
    held: Mutex<Held>,
    /// One reservation at a time per table; the connection to the default shard is kept for
    /// the next.
    reserving: tokio::sync::Mutex<Option<BackendConn>>,
}

impl Ids {
    /// Room for every sharded table of `map`.
    pub fn new(map: &ShardMap) -> Ids {
        let tables = map
            .tables()
            .iter()
            .map(|t| (t.qualified_name(), TableIds::default()))
            .collect();
        Ids { tables }
    }
}

impl Routing {
    /// `rows` new keys of `table` (as named in the map), all on one shard: `shard` when given
    /// (the transaction's), otherwise the shard of which the most keys are in hand.
    pub async fn new_keys(
        &self,
        table: &str,
        shard: Option<usize>,
        rows: usize,
    ) -> Result<(usize, Vec<i64>), SqlError> {
        let (Some(ids), Some(t)) = (self.ids.tables.get(table), self.map.table_by_name(table))
        else {
            return Err(errors::internal(format!("no keys are kept for {table}")));
        };
        if rows == 0 {
            return Ok((shard.unwrap_or(self.map.default_shard()), Vec::new()));
        }
        for _ in 0..ATTEMPTS {
            if let Some(taken) = lock(&ids.held).take(shard, rows) {
                return Ok(taken);
            }
            let mut conn = ids.reserving.lock().await;
            // Another session may have reserved a block while this one waited.
            if let Some(taken) = lock(&ids.held).take(shard, rows) {
                return Ok(taken);
            }
            let count = lock(&ids.held).block_for(shard, rows, self.map.shards().len());
            let first = match self.reserve(&mut conn, t, count).await {
                Ok(first) => first,
                Err(e) => {
                    *conn = None;
                    return Err(e);
                }
            };
            lock(&ids.held).add(&self.map, first, count);
        }
        Err(SqlError::new(
            errors::PROGRAM_LIMIT_EXCEEDED,
            format!("the router could not find {rows} new keys of {table} on one shard"),
        )
        .with_hint("insert fewer rows at a time"))
    }

    /// The first of `count` keys of `table` no router has taken, reserved on the default shard
    /// (the table's row made first if it has none).
    async fn reserve(
        &self,
        conn: &mut Option<BackendConn>,
        table: &Table,
        count: i64,
    ) -> Result<i64, SqlError> {
        let name = table.qualified_name();
        let take = format!(
            "UPDATE shardgate.key_blocks SET next = next + {count} WHERE name = {} RETURNING next - {count}",
            quote_literal(&name)
        );
        for _ in 0..2 {
            let shard = self.map.default_shard();
            let answer = self.ask(conn, shard, &take).await?;
            let missing = match &answer.error {
                Some((code, _)) if code == "42P01" || code == "3F000" => true,
                Some((code, message)) => {
                    return Err(SqlError::with_code(code.clone(), message.clone()))
                }
                None => answer.first_column.is_empty(),
            };
            if !missing {
                let first = answer.first_column[0].parse::<i64>().map_err(|_| {
                    errors::internal(format!("shardgate.key_blocks answered {answer:?}"))
                })?;
                return within(table, first, count);
            }
            self.first_block(conn, table).await?;
        }
        Err(errors::internal(format!(
            "shardgate.key_blocks has no row for {name}"
        )))
    }

    /// Makes `table`'s row of next keys: above the largest key on any shard.
    async fn first_block(
        &self,
        conn: &mut Option<BackendConn>,
        table: &Table,
    ) -> Result<(), SqlError> {
        let largest = format!(
            "SELECT coalesce(max({})::bigint, 0) FROM {}",
            quote_ident(&table.key),
            table.quoted_name()
        );
        let mut next = 1i64;
        for shard in 0..self.map.shards().len() {
            let mut own = None;
            let answer = self.ask(&mut own, shard, &largest).await?;
            if let Some((code, message)) = answer.error {
                return Err(SqlError::with_code(code, message));
            }
            let max: i64 = answer
                .first_column
                .first()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            next = next.max(max.saturating_add(1));
        }
        let make = format!(
            "{SCHEMA_SQL}; INSERT INTO shardgate.key_blocks VALUES ({}, {next}) ON CONFLICT (name) DO NOTHING; COMMIT",
            quote_literal(&table.qualified_name())
        );
        let answer = self.ask(conn, self.map.default_shard(), &make).await?;
        match answer.error {
            Some((code, message)) => Err(SqlError::with_code(code, message)),
            None => Ok(()),
        }
    }

    /// Runs `sql` on `shard` over `conn` (connecting first when it is `None`).
    async fn ask(
        &self,
        conn: &mut Option<BackendConn>,
        shard: usize,
        sql: &str,
    ) -> Result<crate::backend::conn::Answer, SqlError> {
        let unreachable = |e: String| {
            SqlError::new(
                errors::CONNECTION_FAILURE,
                format!(
                    "the router could not reserve new keys on shard {}: {e}",
                    self.shard_name(shard)
                ),
            )
        };
        if conn.is_none() {
            let endpoint = &self.pools_of(0).for_shard(shard).endpoint;
            let c = BackendConn::connect(endpoint)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            *conn = Some(c);
        }
        let Some(c) = conn.as_mut() else {
            return Err(errors::internal("no connection to reserve keys on"));
        };
        match c.simple_query(sql).await {
            Ok(answer) => Ok(answer),
            Err(e) => {
                *conn = None;
                Err(unreachable(e.to_string()))
            }
        }
    }
}

/// `first`, when the `count` keys from it fit the key's type.
fn within(table: &Table, first: i64, count: i64) -> Result<i64, SqlError> {
    let max = table.key_type.integer_max().unwrap_or(i64::MAX);
    match first.checked_add(count - 1) {
        Some(last) if last <= max => Ok(first),
        _ => Err(SqlError::new(
            errors::SEQUENCE_LIMIT_EXCEEDED,
            format!(
                "the router has given out every key of {}.{}: the next would be past {max}, the largest {}",
                table.qualified_name(),
                table.key,
                table.key_type
            ),
        )),
    }
}

fn lock(held: &Mutex<Held>) -> std::sync::MutexGuard<'_, Held> {
    held.lock().unwrap_or_else(|p| p.into_inner())
}

/// The keys of one table in hand, by shard, each shard's in the order reserved. Pure.
#[derive(Default, Debug)]
pub(crate) struct Held {
    by_shard: Vec<VecDeque<i64>>,
    count: usize,
}

impl Held {
    /// Adds `count` keys from `first`, each to its shard in `map`. Drops what was held first
    /// when it would hold more than [`MAX_HELD`].
    pub(crate) fn add(&mut self, map: &ShardMap, first: i64, count: i64) {
        let shards = map.shards().len();
        if self.by_shard.len() != shards || self.count + count as usize > MAX_HELD {
            self.by_shard = vec![VecDeque::new(); shards];
            self.count = 0;
        }
        for key in first..first.saturating_add(count) {
            self.by_shard[map.shard_for_key(&Key::Int(key))].push_back(key);
            self.count += 1;
        }
    }

    /// `rows` keys of one shard (`shard`, or the one of which most are held), oldest first;
    /// `None` when that shard has fewer.
    pub(crate) fn take(&mut self, shard: Option<usize>, rows: usize) -> Option<(usize, Vec<i64>)> {
        let shard = match shard {
            Some(s) => s,
            None => (0..self.by_shard.len())
                .max_by_key(|&s| (self.by_shard[s].len(), usize::MAX - s))?,
        };
        let keys = self.by_shard.get_mut(shard)?;
        if keys.len() < rows || rows == 0 {
            return None;
        }
        self.count -= rows;
        Some((shard, keys.drain(..rows).collect()))
    }

    /// How many keys to reserve so that a shard likely gets `rows` more: enough for `shard`
    /// (or any) when keys fall on `shards` shards evenly, with room for chance.
    pub(crate) fn block_for(&self, shard: Option<usize>, rows: usize, shards: usize) -> i64 {
        let have = match shard {
            Some(s) => self.by_shard.get(s).map_or(0, VecDeque::len),
            None => self.by_shard.iter().map(VecDeque::len).max().unwrap_or(0),
        };
        let short = rows.saturating_sub(have) as i64;
        let shards = shards.max(1) as i64;
        (short * shards * 5 / 4 + 8 * shards).max(BLOCK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardmap::KeyType;

    fn map(shards: usize) -> ShardMap {
        let urls: Vec<String> = (0..shards).map(|i| format!("postgres://h/s{i}")).collect();
        ShardMap::even_split(&urls, vec![Table::new("kv", "id", KeyType::BigInt)]).unwrap()
    }

    #[test]
    fn keys_are_handed_out_once_each_all_of_one_shard_per_take() {
        let map = map(4);
        let mut held = Held::default();
        held.add(&map, 1, 1000);
        let mut seen = std::collections::HashSet::new();
        while let Some((shard, keys)) = held.take(None, 7) {
            assert_eq!(keys.len(), 7);
            for k in keys {
                assert_eq!(map.shard_for_key(&Key::Int(k)), shard);
                assert!(seen.insert(k), "key {k} handed out twice");
            }
        }
        // What is left is less than 7 on every shard; a pinned take gets only its shard's.
        assert!(seen.len() > 1000 - 4 * 7);
        let left = held.count;
        assert_eq!(seen.len() + left, 1000);
        if let Some((shard, keys)) = held.take(Some(2), 1) {
            assert_eq!((shard, map.shard_for_key(&Key::Int(keys[0]))), (2, 2));
        }
    }

    #[test]
    fn a_block_is_sized_for_the_rows_a_shard_is_short_of() {
        let map = map(8);
        let mut held = Held::default();
        assert_eq!(held.block_for(Some(3), 1, 8), BLOCK);
        let n = held.block_for(Some(3), 5000, 8);
        assert!(n >= 5000 * 8, "{n}");
        held.add(&map, 1, n);
        assert!(held.take(Some(3), 5000).is_some());
        assert_eq!(held.take(Some(3), 0), None);
    }

    #[test]
    fn holding_is_bounded() {
        let map = map(2);
        let mut held = Held::default();
        held.add(&map, 1, MAX_HELD as i64);
        held.add(&map, MAX_HELD as i64 + 1, 10);
        assert_eq!(held.count, 10);
        assert!(held.by_shard.iter().flatten().all(|&k| k > MAX_HELD as i64));
    }

    #[test]
    fn keys_past_the_type_are_refused() {
        let t = Table::new("kv", "id", KeyType::SmallInt);
        assert_eq!(within(&t, 32000, 768).ok(), Some(32000));
        assert_eq!(within(&t, 32001, 768).unwrap_err().code, "2200H");
        let big = Table::new("kv", "id", KeyType::BigInt);
        assert!(within(&big, i64::MAX, 2).is_err());
    }
}
