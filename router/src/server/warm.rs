//! Warm start: every worker opens its first backend connections to every shard's primary when
//! the router starts, and to the primaries a reload brings before the reload takes effect, in
//! parallel and bounded, so the first statements after a start (or a split's cut-over) do not
//! wait for hundreds of logins made one by one on demand.
//!
//! A worker's connections must be opened on the worker's own event loop (their I/O stays on
//! that thread), so the warming is a job sent to each worker; whoever asked waits for all of
//! them, at most `[pool] warm_timeout_ms`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::stream::{self, StreamExt};
use tokio::sync::{mpsc, oneshot};

use super::Routing;
use crate::backend::pool::CheckoutError;
use deadpool::managed::Object;

/// Logins in flight at once per worker while warming.
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
            let warmed = warm(&job.routing, worker).await;
            let _ = job.done.send(warmed);
        }
    }

    /// Asks every worker to open `[pool] warm_connections` to each primary of `routing` that
    /// has fewer, and waits for all of them, at most `[pool] warm_timeout_ms`.
    pub async fn warm(&self, routing: &Arc<Routing>) -> Warmed {
        let mut total = Warmed::default();
        if routing.config.pool.warm_connections == 0 {
            return total;
        }
        let started = Instant::now();
        let replies: Vec<oneshot::Receiver<Warmed>> = self
            .senders
            .iter()
            .filter_map(|tx| {
                let (done, reply) = oneshot::channel();
                let job = Job {
                    routing: routing.clone(),
                    done,
                };
                tx.send(job).ok().map(|()| reply)
            })
            .collect();
        let limit = routing.config.pool.warm_timeout;
        for reply in replies {
            let left = limit.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, reply).await {
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

/// Opens connections until each distinct pool of worker `worker` has `[pool]
/// warm_connections` idle (or is full), `PARALLEL` logins at a time; the connections go back to
/// their pools idle, and each primary's health learns whether it answered.
async fn warm(routing: &Routing, worker: usize) -> Warmed {
    let per_pool = routing.config.pool.warm_connections;
    let pools = routing.pools_of(worker);
    let mut seen = std::collections::HashSet::new();
    let mut wanted = Vec::new();
    for shard in 0..pools.len() {
        let pool = pools.for_shard(shard);
        if !seen.insert(pool.endpoint.name()) {
            continue;
        }
        // Holding `per_pool` checkouts at once leaves the pool with that many idle ones after
        // (idle ones are reused, the rest opened), as far as the connections busy elsewhere
        // leave room.
        let status = pool.status();
        if status.available >= per_pool {
            continue;
        }
        let busy = status.size.saturating_sub(status.available);
        let held = per_pool.min(status.max_size.saturating_sub(busy));
        for _ in 0..held {
            wanted.push((pool.clone(), routing.health(shard).clone()));
        }
    }
    // Held until every login is done, so each checkout opens a new connection rather than
    // reusing the one just opened.
    let opened: Vec<_> = stream::iter(wanted)
        .map(|(pool, health)| async move {
            let got = pool.get().await;
            match &got {
                Ok(_) => health.up(|| pool.endpoint.name()),
                Err(CheckoutError::Unreachable(e)) => {
                    health.down(&pool.endpoint.name(), &e.to_string())
                }
                // Busy with clients already: up, and warm enough.
                Err(CheckoutError::Exhausted { .. }) => {}
            }
            got
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let fresh = opened
        .iter()
        .filter(|r| {
            r.as_ref()
                .is_ok_and(|c| Object::metrics(c).recycled.is_none())
        })
        .count();
    Warmed {
        opened: fresh,
        failed: opened.iter().filter(|r| r.is_err()).count(),
        late: 0,
    }
}
