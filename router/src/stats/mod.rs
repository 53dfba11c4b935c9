//! What the router counts, for `/metrics` and the admin console's `SHOW STATS`.
//!
//! Recording costs a request almost nothing and shares nothing between threads: each session's
//! [`meter`] watches its client's messages and replies, and each request that ends is pushed on
//! its worker thread's [`local`] log. Every worker folds its log into the router's [`totals`]
//! once a second and whenever they are read ([`Stats::harvest`] asks every worker and waits
//! for it), so a reader sees every request that has ended. [`exposition`] renders the totals
//! in the Prometheus text format.
//!
//! Shards are counted by a stats id given per shard range ([`Stats::shard_id`]): a reload that
//! keeps a range keeps its counters, wherever its primary moved.

pub mod exposition;
pub mod local;
pub mod meter;
pub mod totals;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};

use crate::planner::CacheStats;
use totals::Totals;

/// The stats id of "no single shard" (a request the router answered or ran on several).
pub const NO_SHARD: u32 = u32::MAX;

/// How a request was routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteKind {
    /// On one shard's connection (by key, pinned by a transaction, or any shard).
    SingleShard = 0,
    /// A read on several shards, concatenated or merged.
    Scatter = 1,
    /// DDL run on every shard.
    Broadcast = 2,
    /// A write on several shards (split INSERT, UPDATE/DELETE on several, COPY).
    MultiShardWrite = 3,
    /// Answered by the router itself (a deferred BEGIN, EXPLAIN (ROUTE), an error).
    Router = 4,
}

impl RouteKind {
    pub const ALL: [RouteKind; 5] = [
        RouteKind::SingleShard,
        RouteKind::Scatter,
        RouteKind::Broadcast,
        RouteKind::MultiShardWrite,
        RouteKind::Router,
    ];

    /// The `route` label.
    pub fn label(self) -> &'static str {
        match self {
            RouteKind::SingleShard => "single_shard",
            RouteKind::Scatter => "scatter",
            RouteKind::Broadcast => "broadcast",
            RouteKind::MultiShardWrite => "multi_shard_write",
            RouteKind::Router => "router",
        }
    }
}

/// A request to fold a worker's log, answered when done.
type HarvestRequest = oneshot::Sender<()>;

#[derive(Default)]
pub struct Stats {
    shard_ids: Mutex<ShardIds>,
    totals: Mutex<Totals>,
    workers: Mutex<Vec<mpsc::UnboundedSender<HarvestRequest>>>,
    /// Clients that logged in, and connections refused (too many clients, failed logins).
    pub clients_accepted: AtomicU64,
    pub clients_refused: AtomicU64,
    pub reloads: AtomicU64,
    pub reloads_refused: AtomicU64,
    /// Plan cache counts of the planners that reloads replaced.
    retired_plans: Mutex<CacheStats>,
    /// Statements held for an unreachable shard, and sent again after a shutdown aborted them.
    pub failover: std::sync::Arc<FailoverCounters>,
}

/// What holding statements through a restart or failover did (`crate::routing::hold`).
#[derive(Default, Debug)]
pub struct FailoverCounters {
    /// Statements that waited for their shard.
    pub held: AtomicU64,
    /// ... of which failed in the end (the window passed, or too many were held).
    pub held_failed: AtomicU64,
    /// Time they waited, summed, and the longest wait, in microseconds.
    pub held_micros: AtomicU64,
    pub held_max_micros: AtomicU64,
    /// Statements sent again because Postgres aborted them at a shutdown before they ran.
    pub resent: AtomicU64,
}

impl FailoverCounters {
    /// A hold that ended after `waited`, `ok` or not.
    pub fn record(&self, waited: Duration, ok: bool) {
        let micros = waited.as_micros() as u64;
        self.held.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.held_failed.fetch_add(1, Ordering::Relaxed);
        }
        self.held_micros.fetch_add(micros, Ordering::Relaxed);
        self.held_max_micros.fetch_max(micros, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct ShardIds {
    by_range: HashMap<String, u32>,
    ranges: Vec<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Stats {
    /// The stats id of the shard owning `range` (the same for the life of the process).
    pub fn shard_id(&self, range: &str) -> u32 {
        let mut ids = lock(&self.shard_ids);
        if let Some(&id) = ids.by_range.get(range) {
            return id;
        }
        let id = ids.ranges.len() as u32;
        ids.ranges.push(range.to_string());
        ids.by_range.insert(range.to_string(), id);
        id
    }

    /// Every shard range ever served, by stats id.
    pub fn ranges(&self) -> Vec<String> {
        lock(&self.shard_ids).ranges.clone()
    }

    /// Adds a worker's log to the totals.
    pub fn fold(&self, log: &mut local::Log) {
        if log.requests.is_empty() && log.errors.is_empty() && log.bytes_in + log.bytes_out == 0 {
            return;
        }
        lock(&self.totals).fold(log, now_secs());
    }

    /// The totals, after every worker has folded its log (a worker that does not answer
    /// within a second is read as it was at its last fold).
    pub async fn harvest(&self) -> MutexGuard<'_, Totals> {
        let asked: Vec<oneshot::Receiver<()>> = lock(&self.workers)
            .iter()
            .filter_map(|w| {
                let (tx, rx) = oneshot::channel();
                w.send(tx).ok().map(|()| rx)
            })
            .collect();
        for done in asked {
            let _ = tokio::time::timeout(Duration::from_secs(1), done).await;
        }
        // The caller's own thread may be a worker with requests of its own.
        let mut log = local::Log::default();
        local::take(&mut log);
        let mut totals = lock(&self.totals);
        totals.fold(&mut log, now_secs());
        totals
    }

    /// Seconds since the epoch, as the last-minute windows count them.
    pub fn now_secs() -> u64 {
        now_secs()
    }

    /// Runs on each worker thread for the life of the router: folds the thread's log every
    /// second and when [`Stats::harvest`] asks.
    pub async fn worker(&self) {
        let (tx, mut asked) = mpsc::unbounded_channel();
        lock(&self.workers).push(tx);
        let mut log = local::Log::default();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let reply = tokio::select! {
                _ = tick.tick() => None,
                r = asked.recv() => match r {
                    Some(r) => Some(r),
                    None => return,
                },
            };
            local::take(&mut log);
            self.fold(&mut log);
            if let Some(reply) = reply {
                let _ = reply.send(());
            }
        }
    }

    /// Keeps the plan cache counts of a planner a reload replaces.
    pub fn retire_planner(&self, stats: CacheStats) {
        let mut retired = lock(&self.retired_plans);
        retired.hits += stats.hits;
        retired.misses += stats.misses;
    }

    /// Plan cache hits and misses since the start: `current`'s plus those of replaced planners.
    pub fn plan_cache(&self, current: CacheStats) -> (u64, u64) {
        let retired = lock(&self.retired_plans);
        (retired.hits + current.hits, retired.misses + current.misses)
    }

    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
