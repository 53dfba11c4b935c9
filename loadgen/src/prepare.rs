//! `loadgen prepare`: creates table kv where it is missing and loads `--rows-per-shard` rows
//! into every shard (the keys of [`ShardKeys::assign`]), in parallel across shards, then
//! checks every shard's count.
//!
//! Straight to the primaries (`--shardmap` alone, or one plain database with `--target`)
//! rows go in with COPY. Through routers (`--target` and `--shardmap`) COPY into a sharded
//! table is not routable, so rows go in as multi-row INSERTs whose keys all belong to one
//! shard. Either way a shard that already holds exactly its rows is left alone: running
//! prepare twice with the same arguments does nothing the second time, and says so.

use std::pin::pin;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use futures_util::stream::{self, StreamExt};
use futures_util::SinkExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio_postgres::Client;

use crate::keys::ShardKeys;
use crate::target::{self, Mode, Topology};
use crate::workload::value_for;
use crate::{INSERT_KEY_BASE, SCHEMA_SQL};

/// Everything `prepare` needs.
#[derive(Debug, Clone)]
pub struct PrepareConfig {
    pub topology: Topology,
    pub rows_per_shard: usize,
    pub value_size: usize,
    /// Shards loaded at the same time.
    pub jobs: usize,
    /// Empty kv on every shard first (direct only).
    pub reset: bool,
    pub timeout: Duration,
    /// Draw the progress bar (only on a terminal in any case).
    pub progress: bool,
}

/// What prepare did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareOutcome {
    /// Rows written.
    pub loaded: u64,
    /// Every shard already held its rows: nothing was written.
    pub nothing_to_do: bool,
    /// Rows of the loaded key range on each shard after loading.
    pub counts: Vec<u64>,
}

/// Where one shard stands before loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Done,
    Empty,
    /// Some of its rows are there (an interrupted prepare): load the rest.
    Partial(u64),
}

/// Rows in the loaded key range of a shard (inserts of runs use keys above it).
const COUNT_SQL: &str =
    "SELECT count(*), coalesce(max(id), 0) FROM kv WHERE id >= 1 AND id < 1099511627776";

const _: () = assert!(INSERT_KEY_BASE == 1_099_511_627_776);

/// Runs prepare; progress and per-shard results go to stderr.
pub async fn prepare(cfg: &PrepareConfig) -> Result<PrepareOutcome, crate::Error> {
    let keys = ShardKeys::assign(&cfg.topology.map, cfg.rows_per_shard)?;
    let shards = keys.shards();
    let via_router = cfg.topology.via_router();
    if via_router && cfg.reset {
        return Err("--reset works only straight to the shards (--shardmap without --target): a router cannot empty a sharded table".into());
    }
    let jobs = cfg.jobs.clamp(1, shards.max(1));
    let n = cfg.rows_per_shard as u64;

    // 1. Schema and where every shard stands.
    let states: Vec<Result<State, crate::Error>> = stream::iter(0..shards)
        .map(|s| {
            let keys = &keys;
            async move {
                let client = open(cfg, s).await?;
                if via_router {
                    router_state(&client, keys, s, cfg).await
                } else {
                    direct_state(&client, keys, s, cfg).await
                }
            }
        })
        .buffered(jobs)
        .collect()
        .await;
    let states = states.into_iter().collect::<Result<Vec<_>, _>>()?;
    if states.iter().all(|s| *s == State::Done) {
        eprintln!(
            "loadgen prepare: kv already holds {n} rows on each of the {shards} shard{}: nothing to do",
            if shards == 1 { "" } else { "s" }
        );
        return Ok(PrepareOutcome {
            loaded: 0,
            nothing_to_do: true,
            counts: vec![n; shards],
        });
    }

    // 2. Load.
    let to_load: u64 = states
        .iter()
        .map(|s| match s {
            State::Done => 0,
            State::Empty => n,
            State::Partial(have) => n - have,
        })
        .sum();
    let bar = if cfg.progress {
        ProgressBar::with_draw_target(Some(to_load), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {human_pos}/{human_len} rows ({per_sec}, eta {eta}) {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(format!("{shards} shards, {jobs} at a time"));
    let loaded: Vec<Result<u64, crate::Error>> = stream::iter(states.iter().copied().enumerate())
        .filter(|(_, st)| std::future::ready(*st != State::Done))
        .map(|(s, st)| {
            let (keys, bar) = (&keys, &bar);
            async move {
                let client = open(cfg, s).await?;
                let r = if via_router {
                    insert_rows(&client, keys, s, cfg, bar).await
                } else {
                    copy_rows(&client, keys, s, st, cfg, bar).await
                };
                r.map_err(|e| format!("loading shard {s}: {e}"))
            }
        })
        .buffer_unordered(jobs)
        .collect()
        .await;
    bar.finish_and_clear();
    let loaded: u64 = loaded
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .iter()
        .sum();

    // 3. Check.
    let counts: Vec<Result<u64, crate::Error>> = stream::iter(0..shards)
        .map(|s| {
            let keys = &keys;
            async move {
                let client = open(cfg, s).await?;
                if via_router {
                    router_count(&client, keys, s).await
                } else {
                    direct_count(&client).await.map(|(c, _)| c)
                }
            }
        })
        .buffered(jobs)
        .collect()
        .await;
    let counts = counts.into_iter().collect::<Result<Vec<_>, _>>()?;
    let ranges: Vec<String> = cfg
        .topology
        .map
        .shards()
        .iter()
        .map(|s| s.range.to_string())
        .collect();
    let mut wrong = Vec::new();
    for (s, &c) in counts.iter().enumerate() {
        let mark = if c == n { "ok" } else { "WRONG" };
        eprintln!("  shard {s:>4} {:<18} {c:>12} rows  {mark}", ranges[s]);
        if c != n {
            wrong.push(format!("shard {s} ({}) has {c}", ranges[s]));
        }
    }
    if !wrong.is_empty() {
        return Err(format!(
            "after loading, {} of {shards} shards do not hold {n} rows: {}",
            wrong.len(),
            wrong.join("; ")
        ));
    }
    eprintln!(
        "loadgen prepare: loaded {loaded} rows; every one of the {shards} shard{} holds {n} rows ({})",
        if shards == 1 { "" } else { "s" },
        if via_router { "counted through the router" } else { "counted on each shard" }
    );
    Ok(PrepareOutcome {
        loaded,
        nothing_to_do: false,
        counts,
    })
}

/// A connection for work on shard `s` (its primary, or a router).
async fn open(cfg: &PrepareConfig, s: usize) -> Result<Client, crate::Error> {
    let url = cfg.topology.url_for(s, s);
    tokio::time::timeout(
        cfg.timeout.max(Duration::from_secs(5)),
        target::connect(url, cfg.timeout),
    )
    .await
    .map_err(|_| format!("connecting to {} timed out", target::redact(url)))?
    .map_err(|e| target::sql_err(&format!("cannot connect to {}", target::redact(url)), &e))
}

fn sql_err(what: &str, e: tokio_postgres::Error) -> crate::Error {
    target::sql_err(what, &e)
}

async fn direct_count(client: &Client) -> Result<(u64, i64), crate::Error> {
    let row = client
        .query_one(COUNT_SQL, &[])
        .await
        .map_err(|e| sql_err("counting rows of kv", e))?;
    let count: i64 = row.get(0);
    let max: i64 = row.get(1);
    Ok((count.max(0) as u64, max))
}

async fn direct_state(
    client: &Client,
    keys: &ShardKeys,
    s: usize,
    cfg: &PrepareConfig,
) -> Result<State, crate::Error> {
    client
        .batch_execute(SCHEMA_SQL)
        .await
        .map_err(|e| sql_err(&format!("creating table kv on shard {s}"), e))?;
    if cfg.reset {
        client
            .batch_execute("TRUNCATE kv")
            .await
            .map_err(|e| sql_err(&format!("emptying kv on shard {s}"), e))?;
        return Ok(State::Empty);
    }
    let (count, max) = direct_count(client).await?;
    let n = cfg.rows_per_shard as u64;
    let last = keys.of(s).last().unwrap_or(0);
    match count {
        0 => Ok(State::Empty),
        c if c == n && max == last => Ok(State::Done),
        c if c < n && max <= last => Ok(State::Partial(c)),
        c => Err(format!(
            "shard {s} ({}) already holds {c} rows of kv with ids up to {max}, not the {n} rows (ids up to {last}) this prepare loads; rerun with the --rows-per-shard it was loaded with, or add --reset to empty kv first",
            cfg.topology.map.shards()[s].range
        )),
    }
}

/// COPY the shard's rows in (through a temporary table that skips present rows when
/// resuming a partial load).
async fn copy_rows(
    client: &Client,
    keys: &ShardKeys,
    s: usize,
    state: State,
    cfg: &PrepareConfig,
    bar: &ProgressBar,
) -> Result<u64, crate::Error> {
    let resume = matches!(state, State::Partial(_));
    let table = if resume {
        client
            .batch_execute("CREATE TEMP TABLE kv_load (LIKE kv)")
            .await
            .map_err(|e| sql_err("creating a temporary table", e))?;
        "kv_load"
    } else {
        "kv"
    };
    let sink = client
        .copy_in(&format!("COPY {table} (id, v) FROM STDIN"))
        .await
        .map_err(|e| sql_err("starting COPY", e))?;
    let mut sink = pin!(sink);
    let mut buf = BytesMut::with_capacity(1 << 17);
    let mut rows_in_buf = 0u64;
    for id in keys.of(s) {
        buf.put_slice(id.to_string().as_bytes());
        buf.put_u8(b'\t');
        buf.put_slice(value_for(id, cfg.value_size).as_bytes());
        buf.put_u8(b'\n');
        rows_in_buf += 1;
        if buf.len() >= 1 << 16 {
            sink.send(buf.split().freeze())
                .await
                .map_err(|e| sql_err("sending COPY data", e))?;
            if !resume {
                bar.inc(rows_in_buf);
            }
            rows_in_buf = 0;
        }
    }
    if !buf.is_empty() {
        sink.send(buf.split().freeze())
            .await
            .map_err(|e| sql_err("sending COPY data", e))?;
    }
    if !resume {
        bar.inc(rows_in_buf);
    }
    let copied = sink
        .as_mut()
        .finish()
        .await
        .map_err(|e| sql_err("finishing COPY", e))?;
    if !resume {
        return Ok(copied);
    }
    let inserted = client
        .execute(
            "INSERT INTO kv SELECT * FROM kv_load ON CONFLICT (id) DO NOTHING",
            &[],
        )
        .await
        .map_err(|e| sql_err("moving rows from the temporary table", e))?;
    bar.inc(inserted);
    Ok(inserted)
}

/// Keys per `IN (...)` count through a router.
const COUNT_BATCH: usize = 1000;
/// Rows per multi-row INSERT through a router.
const INSERT_BATCH: usize = 500;

/// How many of shard `s`'s keys are in kv, asked through a router: every statement names
/// keys of one shard only, so the router sends it there.
async fn router_count(client: &Client, keys: &ShardKeys, s: usize) -> Result<u64, crate::Error> {
    let ids: Vec<i64> = keys.of(s).collect();
    let mut total = 0u64;
    for chunk in ids.chunks(COUNT_BATCH) {
        let list: Vec<String> = chunk.iter().map(i64::to_string).collect();
        let sql = format!("SELECT count(*) FROM kv WHERE id IN ({})", list.join(","));
        let rows = client
            .simple_query(&sql)
            .await
            .map_err(|e| sql_err(&format!("counting shard {s}'s rows through the router"), e))?;
        for m in rows {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                total += r.get(0).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    Ok(total)
}

async fn router_state(
    client: &Client,
    keys: &ShardKeys,
    s: usize,
    cfg: &PrepareConfig,
) -> Result<State, crate::Error> {
    let first = match router_count(client, keys, s).await {
        Ok(c) => c,
        Err(e) if e.contains("42P01") => {
            // No table yet: a router that broadcasts DDL can create it everywhere.
            client.batch_execute(SCHEMA_SQL).await.map_err(|e| {
                sql_err(
                    "table kv does not exist and the router could not create it on every shard (create it on the shards, e.g. with `loadgen prepare --shardmap FILE` or deploy/local/schema.sql)",
                    e,
                )
            })?;
            router_count(client, keys, s).await?
        }
        Err(e) => return Err(e),
    };
    let n = cfg.rows_per_shard as u64;
    Ok(match first {
        0 => State::Empty,
        c if c == n => State::Done,
        c => State::Partial(c),
    })
}

/// Multi-row INSERTs of one shard's keys (present rows are skipped).
async fn insert_rows(
    client: &Client,
    keys: &ShardKeys,
    s: usize,
    cfg: &PrepareConfig,
    bar: &ProgressBar,
) -> Result<u64, crate::Error> {
    let ids: Vec<i64> = keys.of(s).collect();
    let mut inserted = 0u64;
    for chunk in ids.chunks(INSERT_BATCH) {
        let values: Vec<String> = chunk
            .iter()
            .map(|id| format!("({id},'{}')", value_for(*id, cfg.value_size)))
            .collect();
        let sql = format!(
            "INSERT INTO kv (id, v) VALUES {} ON CONFLICT (id) DO NOTHING",
            values.join(",")
        );
        let replies = client
            .simple_query(&sql)
            .await
            .map_err(|e| sql_err("inserting rows through the router", e))?;
        for m in replies {
            if let tokio_postgres::SimpleQueryMessage::CommandComplete(n) = m {
                inserted += n;
            }
        }
        bar.inc(chunk.len() as u64);
    }
    Ok(inserted)
}

/// For messages: where prepare writes.
pub fn describe(t: &Topology) -> String {
    match &t.mode {
        Mode::Direct => format!("{} shard primaries, with COPY", t.map.shards().len()),
        Mode::Routers(_) => format!("{} through the router, with INSERT", t.describe()),
    }
}
