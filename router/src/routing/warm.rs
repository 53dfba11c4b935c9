//! Warm start: every worker opens its first backend connections to every shard's primary when
//! the router starts, and to the primaries a reload brings before the reload takes effect, in
//! parallel and bounded, so the first statements after a start (or a split's cut-over) do not
//! wait for hundreds of logins made one by one on demand.
//!
//! With `[pool] shared_connections`, every worker opens its own shared connection to every
//! primary the same way, as far as the limit allows (with fewer allowed than workers, the
//! primaries are dealt out over the workers), so that no first statement waits for a login or
//! crosses to another worker's thread.
//!
//! A worker's connections must be opened on the worker's own event loop (their I/O stays on
//! that thread), so the warming is a job sent to each worker; whoever asked waits for all of
//! them, at most `[pool] warm_timeout_ms`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::future::join_all;
use futures_util::stream::{self, StreamExt};
use tokio::sync::{mpsc, oneshot};

use super::Routing;
use crate::backend::pool::{opened_for_this, CheckoutError};

/// Pools warmed at once per worker (each with its `warm_connections` logins).
const PARALLEL: usize = 32;

/// What a warming did, over every worker.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Warmed {
    /// Connections opened.
    pub opened: usize,
    /// Connections that could not be opened (the primary is down or slow).
    pub failed: usize,
    /// Workers that did not finish within the time allowed.
    pub late: usize,
}

impl Warmed {
    fn add(&mut self, other: Warmed) {
        self.opened += other.opened;
        self.failed += other.failed;
        self.late += other.late;
    }
}

struct Job {
    routing: Arc<Routing>,
    /// Only the pools made for this routing (a reload), or all (the start).
    only_new: bool,
    /// The primaries (by endpoint) that had no shared connection when the warming was asked:
    /// only these get one per worker (a reload's new ones, every one at the start).
    cold: Arc<HashSet<String>>,
    /// The asker stops waiting then; the worker stops warming then too.
    deadline: tokio::time::Instant,
    done: oneshot::Sender<Warmed>,
}

/// The channel to every worker.
pub struct Warmer {
    senders: Vec<mpsc::UnboundedSender<Job>>,
    receivers: Mutex<Vec<Option<mpsc::UnboundedReceiver<Job>>>>,
}

impl Warmer {
    pub fn new(workers: usize) -> Warmer {
        let (senders, receivers) = (0..workers.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::unbounded_channel();
                (tx, Some(rx))
            })
            .unzip();
        Warmer {
            senders,
            receivers: Mutex::new(receivers),
        }
    }

    /// Runs on worker `worker`'s thread for the life of the router: warms the pools it is
    /// asked to (jobs sent before it started wait in the channel).
    pub async fn worker(&self, worker: usize) {
        let taken = self
            .receivers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(worker)
            .and_then(Option::take);
        let Some(mut jobs) = taken else {
            return;
        };
        while let Some(job) = jobs.recv().await {
            let warming = warm(&job.routing, worker, job.only_new, &job.cold);
            let warmed = tokio::time::timeout_at(job.deadline, warming)
                .await
                .unwrap_or(Warmed {
                    late: 1,
                    ..Warmed::default()
                });
            let _ = job.done.send(warmed);
        }
    }

    /// Asks every worker to open `[pool] warm_connections` to each primary of `routing` that
    /// has fewer idle (with `only_new`, of the pools a reload made, not those it kept) and its
    /// own shared connection to each primary that has none open now, and waits for all of
    /// them, at most `[pool] warm_timeout_ms`.
    pub async fn warm(&self, routing: &Arc<Routing>, only_new: bool) -> Warmed {
        let mut total = Warmed::default();
        if routing.config.pool.warm_connections == 0 && routing.config.pool.shared_connections == 0
        {
            return total;
        }
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + routing.config.pool.warm_timeout;
        let cold = Arc::new(cold(routing));
        let replies: Vec<oneshot::Receiver<Warmed>> = self
            .senders
            .iter()
            .filter_map(|tx| {
                let (done, reply) = oneshot::channel();
                let job = Job {
                    routing: routing.clone(),
                    only_new,
                    cold: cold.clone(),
                    deadline,
                    done,
                };
                tx.send(job).ok().map(|()| reply)
            })
            .collect();
        for reply in replies {
            // The worker answers by the deadline itself; a little more for its reply.
            let grace = deadline + std::time::Duration::from_millis(100);
            match tokio::time::timeout_at(grace, reply).await {
                Ok(Ok(w)) => total.add(w),
                _ => total.late += 1,
            }
        }
        tracing::info!(
            opened = total.opened,
            failed = total.failed,
            late_workers = total.late,
            ms = started.elapsed().as_millis() as u64,
            "warmed the backend pools"
        );
        total
    }
}

/// Opens connections until each distinct pool of worker `worker` (with `only_new`, each pool
/// the routing made rather than kept) has `[pool] warm_connections` idle, as far as the pool
/// has room, `PARALLEL` pools at a time. A pool's connections go back to it idle as soon as
/// its own logins are done; a primary known to be down is left to the prober; a new
/// connection tells the primary's health it answered.
async fn warm(routing: &Routing, worker: usize, only_new: bool, cold: &HashSet<String>) -> Warmed {
    let per_pool = routing.config.pool.warm_connections;
    let pools = routing.pools_of(worker);
    let mut seen = HashSet::new();
    let mut wanted = Vec::new();
    for shard in 0..pools.len() {
        let pool = pools.for_shard(shard);
        let health = routing.health(shard);
        let down = health.answered() && !health.is_up();
        if !seen.insert(pool.endpoint.name()) || (only_new && !pool.is_new()) || down {
            continue;
        }
        if pool.status().available < per_pool {
            wanted.push((pool.clone(), health.clone()));
        }
    }
    let counts: Vec<Warmed> = stream::iter(wanted)
        .map(|(pool, health)| async move {
            // Held together, so the idle ones are taken and the rest opened; none waits for a
            // busy pool (clients come first).
            let got = join_all((0..per_pool).map(|_| pool.get_now())).await;
            let mut w = Warmed::default();
            for g in &got {
                match g {
                    Ok(Some(conn)) if opened_for_this(conn) => {
                        w.opened += 1;
                        health.up(|| pool.endpoint.name());
                    }
                    Ok(_) => {}
                    Err(CheckoutError::Unreachable(e)) => {
                        w.failed += 1;
                        health.down(&pool.endpoint.name(), &e.to_string());
                    }
                    Err(CheckoutError::Exhausted { .. }) => {}
                }
            }
            w
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let mut total = Warmed::default();
    for w in counts {
        total.add(w);
    }
    total.add(warm_shared(routing, worker, cold).await);
    total
}

/// The endpoints of `routing`'s primaries that have no shared connection open.
fn cold(routing: &Routing) -> HashSet<String> {
    (0..routing.map.shards().len())
        .filter_map(|shard| routing.mux(shard))
        .filter(|mux| mux.open_lanes() == 0)
        .map(|mux| mux.endpoint.name())
        .collect()
}

/// Opens this worker's first shared connection (`[pool] shared_connections`) to every `cold`
/// primary it takes part in, `PARALLEL` at a time. As many workers take part per primary as the
/// limit allows (every worker when it allows one each), the primaries rotated over the workers:
/// the lanes the first statements would otherwise open on demand, one login each, or (past the
/// limit) share across threads.
async fn warm_shared(routing: &Routing, worker: usize, cold: &HashSet<String>) -> Warmed {
    let workers = routing.workers().max(1);
    let mut seen = HashSet::new();
    let mut muxes = Vec::new();
    for shard in 0..routing.map.shards().len() {
        let Some(mux) = routing.mux(shard) else {
            return Warmed::default();
        };
        let name = mux.endpoint.name();
        if !seen.insert(name.clone()) {
            continue;
        }
        let health = routing.health(shard);
        let down = health.answered() && !health.is_up();
        if cold.contains(&name) && !down && takes_part(seen.len() - 1, worker, workers, mux.limit())
        {
            muxes.push(mux.clone());
        }
    }
    let results: Vec<Option<bool>> = stream::iter(muxes)
        .map(|mux| async move { mux.warm().await })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let mut w = Warmed::default();
    for r in results {
        match r {
            Some(true) => w.opened += 1,
            Some(false) => w.failed += 1,
            None => {}
        }
    }
    w
}

/// Whether worker `worker` of `workers` warms a lane to the `primary`-th distinct primary of
/// `limit` lanes: the `limit` workers from `primary % workers` on, wrapping.
fn takes_part(primary: usize, worker: usize, workers: usize, limit: usize) -> bool {
    (worker + workers - primary % workers) % workers < limit.min(workers)
}

#[cfg(test)]
mod tests {
    use super::takes_part;

    fn parts(primary: usize, workers: usize, limit: usize) -> Vec<usize> {
        (0..workers)
            .filter(|&w| takes_part(primary, w, workers, limit))
            .collect()
    }

    #[test]
    fn each_primary_is_warmed_by_as_many_workers_as_its_limit_allows_rotated() {
        // One lane per primary: dealt out over the workers.
        assert_eq!(parts(0, 4, 1), [0]);
        assert_eq!(parts(5, 4, 1), [1]);
        // Two: the next worker too, wrapping.
        assert_eq!(parts(3, 4, 2), [0, 3]);
        assert_eq!(parts(6, 4, 2), [2, 3]);
        // As many as the workers or more: every worker its own.
        assert_eq!(parts(7, 2, 2), [0, 1]);
        assert_eq!(parts(1, 3, 8), [0, 1, 2]);
        // One worker.
        assert_eq!(parts(9, 1, 2), [0]);
    }
}
