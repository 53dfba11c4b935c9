//! The chaos run's data and the invariants checked on it at the end.
//!
//! Three tables, all sharded by `id`: accounts whose balances move in transfers (their total
//! never changes), counters that only go up by one, and events that are only inserted, each
//! with an id used once. Setup and the checks talk to every shard's primary directly (from the
//! shard map as it is at that moment: a failover or a split during the run changes it), so the
//! checks see what the shards hold, not what a router says they hold.
//!
//! A request that failed may still have been applied (the connection broke after the commit),
//! so the checks allow for the *ambiguous* ones: an acknowledged insert must be there exactly
//! once, an ambiguous one at most once; a counter lies between its acknowledged increments and
//! those plus its ambiguous ones.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use shardmap::{Key, ShardMap};
use tokio_postgres::Client;

use crate::target::{connect, redact, sql_err};

pub const TABLES: [&str; 3] = ["chaos_accounts", "chaos_counters", "chaos_events"];

const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS chaos_accounts (id bigint PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE IF NOT EXISTS chaos_counters (id bigint PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE IF NOT EXISTS chaos_events (id bigint PRIMARY KEY, writer bigint NOT NULL);
TRUNCATE chaos_accounts, chaos_counters, chaos_events";

/// How much data a run starts with.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Size {
    pub accounts: i64,
    pub counters: i64,
    pub initial_balance: i64,
}

/// Reads the shard map and checks it shards the three tables by `id`.
pub fn load_map(path: &Path) -> Result<ShardMap, String> {
    let map = shardmap::load(path).map_err(|e| e.to_string())?;
    for t in TABLES {
        if map.table_by_name(t).is_none() {
            return Err(format!(
                "{}: the shard map has no table {t}; add [[tables]] name = \"{t}\", key = \"id\", type = \"bigint\"",
                path.display()
            ));
        }
    }
    Ok(map)
}

/// Ids 1..=n grouped by the shard that owns them.
fn by_shard(map: &ShardMap, n: i64) -> Vec<Vec<i64>> {
    let mut out = vec![Vec::new(); map.shards().len()];
    for id in 1..=n {
        out[map.shard_for_key(&Key::Int(id))].push(id);
    }
    out
}

async fn primary(map: &ShardMap, shard: usize, timeout: Duration) -> Result<Client, String> {
    let url = map.shards()[shard].primary.url();
    connect(url, timeout)
        .await
        .map_err(|e| sql_err(&format!("connecting to {}", redact(url)), &e))
}

/// Creates the tables on every shard (emptying them) and loads accounts and counters.
pub async fn setup(map: &ShardMap, size: Size, timeout: Duration) -> Result<(), String> {
    let accounts = by_shard(map, size.accounts);
    let counters = by_shard(map, size.counters);
    for shard in 0..map.shards().len() {
        let c = primary(map, shard, timeout).await?;
        let range = &map.shards()[shard].range;
        c.batch_execute(SCHEMA)
            .await
            .map_err(|e| sql_err(&format!("creating the tables on {range}"), &e))?;
        c.execute(
            "INSERT INTO chaos_accounts (id, balance) SELECT id, $2 FROM unnest($1::bigint[]) AS id",
            &[&accounts[shard], &size.initial_balance],
        )
        .await
        .map_err(|e| sql_err(&format!("loading accounts on {range}"), &e))?;
        c.execute(
            "INSERT INTO chaos_counters (id, n) SELECT id, 0 FROM unnest($1::bigint[]) AS id",
            &[&counters[shard]],
        )
        .await
        .map_err(|e| sql_err(&format!("loading counters on {range}"), &e))?;
    }
    Ok(())
}

/// What the load claims it did.
#[derive(Debug, Default)]
pub struct Claims {
    /// Per counter id (index id - 1): increments acknowledged, and failed ones that may have
    /// been applied.
    pub increments: Vec<(u64, u64)>,
    pub inserted: Vec<i64>,
    pub maybe_inserted: Vec<i64>,
    /// Statements that succeeded with an answer that cannot be right (a transfer or an
    /// increment that updated no row).
    pub anomalies: Vec<String>,
}

/// One invariant and whether it held.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub held: bool,
    pub detail: String,
}

/// What the shards hold, each row counted on the shard that owns it under the final map.
#[derive(Default, PartialEq)]
struct Holdings {
    /// By id: the value (balance, count; 0 for events) and on how many shards it was found.
    balances: HashMap<i64, (i64, u32)>,
    counters: HashMap<i64, (i64, u32)>,
    events: HashMap<i64, (i64, u32)>,
    /// Rows on a shard that does not own their id (left by a split that was not cleaned up, or
    /// written to the wrong shard).
    strays: u64,
}

async fn read_shard(
    map: &ShardMap,
    shard: usize,
    c: &Client,
    h: &mut Holdings,
) -> Result<(), String> {
    let range = &map.shards()[shard].range;
    let owned = |id: i64| map.shard_for_key(&Key::Int(id)) == shard;
    for (table, sql, held) in [
        (
            "accounts",
            "SELECT id, balance FROM chaos_accounts",
            &mut h.balances,
        ),
        (
            "counters",
            "SELECT id, n FROM chaos_counters",
            &mut h.counters,
        ),
        (
            "events",
            "SELECT id, 0::bigint FROM chaos_events",
            &mut h.events,
        ),
    ] {
        let rows = c
            .query(sql, &[])
            .await
            .map_err(|e| sql_err(&format!("reading {table} on {range}"), &e))?;
        for row in rows {
            let id: i64 = row.get(0);
            if !owned(id) {
                h.strays += 1;
                continue;
            }
            let e = held.entry(id).or_insert((0, 0));
            e.0 += row.get::<_, i64>(1);
            e.1 += 1;
        }
    }
    Ok(())
}

/// Prepared transactions on the shards' servers (every database: a split's source is no longer
/// in the map but may hold one), polled until none are left or `settle` has passed (a router
/// that restarts resolves the ones its predecessor left in doubt).
async fn prepared_left(primaries: &[Client], settle: Duration) -> Result<Check, String> {
    let deadline = Instant::now() + settle;
    loop {
        // Servers hold several shards: each transaction counted once.
        let mut left = HashSet::new();
        for c in primaries {
            let rows = c
                .query("SELECT database::text, gid FROM pg_prepared_xacts", &[])
                .await
                .map_err(|e| sql_err("reading pg_prepared_xacts", &e))?;
            for row in rows {
                left.insert((row.get::<_, String>(0), row.get::<_, String>(1)));
            }
        }
        if left.is_empty() || Instant::now() >= deadline {
            return Ok(Check {
                name: "no prepared transaction left",
                held: left.is_empty(),
                detail: format!("{} left on the shards' servers", left.len()),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the shards hold, read again until two reads in a row agree: a commit that was still
/// finishing when the load stopped lands between two reads, not inside one (the shards are
/// read one after another, with no snapshot across them).
async fn settled(map: &ShardMap, primaries: &[Client]) -> Result<Holdings, String> {
    let read_all = || async {
        let mut h = Holdings::default();
        for (shard, c) in primaries.iter().enumerate() {
            read_shard(map, shard, c, &mut h).await?;
        }
        Ok::<_, String>(h)
    };
    let mut last = read_all().await?;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = read_all().await?;
        if now == last {
            break;
        }
        last = now;
    }
    Ok(last)
}

/// Checks every invariant against the shards of the map in `map_path` as it is now.
pub async fn check(
    map_path: &Path,
    size: Size,
    claims: &Claims,
    settle: Duration,
    timeout: Duration,
) -> Result<Vec<Check>, String> {
    let map = load_map(map_path)?;
    // One connection per shard for every read of the checks.
    let mut primaries = Vec::with_capacity(map.shards().len());
    for shard in 0..map.shards().len() {
        primaries.push(primary(&map, shard, timeout).await?);
    }
    let mut checks = vec![prepared_left(&primaries, settle).await?];
    let h = settled(&map, &primaries).await?;
    checks.push(bank(&h, size));
    checks.push(events(&h, claims));
    checks.push(counters(&h, size, claims));
    checks.push(Check {
        name: "every row on the shard that owns it",
        held: h.strays == 0,
        detail: format!("{} rows on a shard that does not own their id", h.strays),
    });
    checks.push(Check {
        name: "no impossible answer",
        held: claims.anomalies.is_empty(),
        detail: match claims.anomalies.first() {
            None => "none".into(),
            Some(first) => format!("{} (first: {first})", claims.anomalies.len()),
        },
    });
    Ok(checks)
}

fn bank(h: &Holdings, size: Size) -> Check {
    let total: i64 = h.balances.values().map(|b| b.0).sum();
    let expected = size.accounts * size.initial_balance;
    let twice = h.balances.values().filter(|b| b.1 > 1).count();
    let missing = size.accounts - h.balances.len() as i64;
    Check {
        name: "bank total exact",
        held: total == expected && twice == 0 && missing == 0,
        detail: format!(
            "total {total}, expected {expected}; {missing} accounts missing, {twice} held twice"
        ),
    }
}

fn events(h: &Holdings, claims: &Claims) -> Check {
    let missing = claims
        .inserted
        .iter()
        .filter(|id| !h.events.contains_key(id))
        .count();
    let twice = h.events.values().filter(|e| e.1 > 1).count();
    let maybe_present = claims
        .maybe_inserted
        .iter()
        .filter(|id| h.events.contains_key(id))
        .count();
    let sent: HashSet<i64> = claims
        .inserted
        .iter()
        .chain(&claims.maybe_inserted)
        .copied()
        .collect();
    let unknown = h.events.keys().filter(|id| !sent.contains(id)).count();
    Check {
        name: "every acknowledged insert present exactly once",
        held: missing == 0 && twice == 0 && unknown == 0,
        detail: format!(
            "{} acknowledged: {missing} missing; {twice} ids held twice; {maybe_present} of {} ambiguous present; {unknown} never sent",
            claims.inserted.len(),
            claims.maybe_inserted.len()
        ),
    }
}

fn counters(h: &Holdings, size: Size, claims: &Claims) -> Check {
    let (mut below, mut above, mut missing, mut acked, mut ambiguous, mut counted) =
        (0, 0, 0, 0, 0, 0);
    for id in 1..=size.counters {
        let (ok, maybe) = claims
            .increments
            .get((id - 1) as usize)
            .copied()
            .unwrap_or((0, 0));
        acked += ok;
        ambiguous += maybe;
        let Some(&(n, copies)) = h.counters.get(&id) else {
            missing += 1;
            continue;
        };
        if copies > 1 {
            missing += 1;
        }
        counted += n.max(0) as u64;
        if (n as u64) < ok {
            below += 1;
        } else if n as u64 > ok + maybe {
            above += 1;
        }
    }
    Check {
        name: "counters equal the acknowledged increments",
        held: below == 0 && above == 0 && missing == 0,
        detail: format!(
            "{acked} acknowledged, {ambiguous} ambiguous, {counted} counted; {below} counters below, {above} above, {missing} missing or doubled"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holdings(events: &[(i64, u32)]) -> Holdings {
        Holdings {
            events: events.iter().map(|&(id, n)| (id, (0, n))).collect(),
            ..Holdings::default()
        }
    }

    #[test]
    fn inserts_acknowledged_must_be_there_once_and_nothing_else() {
        let claims = Claims {
            inserted: vec![1, 2],
            maybe_inserted: vec![3, 4],
            ..Claims::default()
        };
        assert!(events(&holdings(&[(1, 1), (2, 1), (3, 1)]), &claims).held);
        assert!(!events(&holdings(&[(1, 1)]), &claims).held, "2 is missing");
        assert!(
            !events(&holdings(&[(1, 2), (2, 1)]), &claims).held,
            "1 twice"
        );
        let c = events(&holdings(&[(1, 1), (2, 1), (9, 1)]), &claims);
        assert!(!c.held && c.detail.contains("1 never sent"), "{}", c.detail);
    }

    #[test]
    fn counters_lie_between_acknowledged_and_ambiguous() {
        let size = Size {
            accounts: 0,
            counters: 2,
            initial_balance: 0,
        };
        let claims = Claims {
            increments: vec![(3, 1), (0, 0)],
            ..Claims::default()
        };
        let mut h = Holdings::default();
        h.counters.insert(1, (4, 1));
        h.counters.insert(2, (0, 1));
        assert!(counters(&h, size, &claims).held);
        h.counters.insert(1, (2, 1));
        assert!(
            !counters(&h, size, &claims).held,
            "an acknowledged increment lost"
        );
        h.counters.insert(1, (5, 1));
        assert!(
            !counters(&h, size, &claims).held,
            "an increment applied twice"
        );
        h.counters.remove(&2);
        h.counters.insert(1, (3, 1));
        assert!(!counters(&h, size, &claims).held, "a counter missing");
    }

    #[test]
    fn the_bank_total_counts_every_account_once() {
        let size = Size {
            accounts: 2,
            counters: 0,
            initial_balance: 100,
        };
        let mut h = Holdings::default();
        h.balances.insert(1, (150, 1));
        h.balances.insert(2, (50, 1));
        assert!(bank(&h, size).held);
        h.balances.insert(2, (51, 1));
        assert!(!bank(&h, size).held);
        h.balances.insert(2, (50, 2));
        assert!(!bank(&h, size).held);
    }
}
