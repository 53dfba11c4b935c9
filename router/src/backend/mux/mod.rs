//! Shared backend connections: the autocommit statements of many clients pipelined over a
//! few connections per shard and router (`[pool] shared_connections`), instead of one pooled
//! connection per statement in flight.
//!
//! A [`ShardMux`] holds the shared connections ("lanes") of one (host, port, database) for the
//! whole router; each lane's connection is driven by one task on the worker that opened it,
//! and sessions of every worker hand it complete requests ([`Lane::submit`]). The driver
//! writes every request queued since its last turn in one write, each ending in its own Sync
//! (or being one Query), and hands the replies back in order ([`super::pipeline`]) through
//! each client's channel. A lane carries no client's state: a request whose settings differ
//! from what the lane will hold when it runs is preceded by the router's `RESET ALL` and the
//! client's `SET`s, and router statements it uses are prepared on the lane in front of it.
//!
//! A slow statement must not hold many others: a lane writes at most [`DEPTH`] requests ahead,
//! and none behind a request that has run for [`SLOW`]; then new requests go to another lane,
//! opened up to the limit (each worker within its share of it first, [`ShardMux::take_slot`]).
//! A cancel reaches only its own request: one still queued is taken
//! out, one written is cancelled on the backend only while it is the one running, and the
//! lane writes nothing new until that cancel has been delivered.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use tokio::sync::Notify;

use super::conn::{BackendConn, Endpoint};
use super::pipeline::Pipeline;
use super::prepared::PreparedSet;

mod driver;
mod lane;
mod signal;
mod sink;

pub use sink::{Channel, Inbox, Sink, UNREAD_LIMIT};

/// Most requests written ahead on one lane: past it, requests wait in the router, where a
/// cancel can still take them out.
pub const DEPTH: usize = 16;

/// A request running this long on a lane stops further writes there, and the next requests
/// look for (or open) another lane.
pub const SLOW: Duration = Duration::from_millis(20);

/// How often a driver with a cancel waiting checks whether it may send it.
const CANCEL_CHECK: Duration = Duration::from_millis(2);

/// What a session receives for its request.
#[derive(Debug)]
pub enum Reply {
    /// Whole reply frames of request `seq`, in order.
    Frames(u64, Bytes),
    /// The lane's connection ended before request `seq` was answered. `sent`: it may have
    /// run (it was written, and the server did not say otherwise). `aborted`: it was the one
    /// running when the server ended the connection with a shutdown error, before it answered
    /// anything: nothing of it ran, unless the server ended the session on purpose, which only
    /// a server that still takes logins does.
    Lost {
        seq: u64,
        why: String,
        sent: bool,
        aborted: bool,
    },
    /// The client read request `seq`'s replies too slowly ([`UNREAD_LIMIT`]): the rest of
    /// them are dropped.
    Overflow(u64),
    /// Request `seq` waited in the router (behind a full or slow lane) longer than it may
    /// ([`Request::max_wait`]): taken out, nothing of it ran.
    Expired(u64),
    /// Request `seq` was never written: the client's settings, applied on the lane in front
    /// of it for the first time, failed with this ErrorResponse frame (the client's error, as
    /// on a connection of its own).
    Refused(u64, Bytes),
    /// A cancel request arrived for the session (its count is in the client's slot): a
    /// wake-up on the channel the session already waits on, rather than a second one.
    CancelAsked,
}

/// The answer to a cancel of a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// It was still queued in the router: taken out, nothing of it ran.
    Removed,
    /// Written: cancelled on the backend when it runs (Postgres answers `57014`).
    Asked,
    /// Already answered.
    Over,
}

/// The shared connections of one endpoint, for the whole router.
pub struct ShardMux {
    pub endpoint: Endpoint,
    /// The primary's health, which lanes opened or refused keep current like checkouts do.
    health: Arc<super::health::Health>,
    /// Most lanes (connections) this router opens to the endpoint.
    limit: usize,
    /// The open lanes, each with the worker that drives it. Read on every statement by the
    /// sessions of every worker, so read without a lock (a lock word written by every worker
    /// would move between their caches on every statement); changed only when a lane opens
    /// or closes.
    lanes: ArcSwap<Lanes>,
    /// Lanes being opened.
    opening: AtomicUsize,
    /// Lanes open or being opened: taken before an opening, so that workers opening at the
    /// same moment never pass the limit together.
    taken: AtomicUsize,
    /// The same for each worker. A worker opens lanes within its share of the limit
    /// ([`ShardMux::share`]), past it only when no lane takes a request at once, and gives one
    /// back to a worker left without ([`ShardMux::rebalance`]): else a worker whose lane was
    /// slow for a moment at the start would keep the lane another worker's sessions need, and
    /// they would cross to its thread for every statement, for as long as the lanes last.
    taken_by: Box<[AtomicUsize]>,
    /// A lane was added, or an opening failed.
    changed: Notify,
    /// Settings fingerprints a lane of this endpoint has applied without an error: a switch
    /// to one of them is written with the requests behind it, any other alone first
    /// ([`LaneState::proving`]).
    proven: Mutex<HashSet<u64>>,
}

/// The number of the next lane opened in the process: a lane numbers its requests itself
/// ([`Lane::next_seq`]), with its own number in the high bits, so that no counter is written by
/// every worker, and numbers stay unique across muxes (a session's channel serves them all).
static LANE_IDS: AtomicU64 = AtomicU64::new(1);

/// Most fingerprints [`ShardMux::proven`] keeps; past it, it starts again empty.
const PROVEN_KEPT: usize = 4096;

/// One shared connection.
pub struct Lane {
    pub pid: i32,
    pub secret: i32,
    /// This lane's number in the process ([`LANE_IDS`]).
    id: u64,
    state: Mutex<LaneState>,
    /// Something for the driver to do: a request queued, a cancel asked, the mux gone.
    wake: signal::Signal,
    /// Requests queued or written and not answered.
    load: AtomicUsize,
    /// When the request now running began, in coarse µs ([`now_us`]; 0: none).
    front_since: AtomicU64,
    /// The settings fingerprint the lane holds once what is queued has run.
    settings_fp: AtomicU64,
    closed: AtomicBool,
}

struct LaneState {
    /// The next request's number in this lane ([`Lane::next_seq`]).
    next: u64,
    queued: VecDeque<Queued>,
    pipeline: Pipeline<Sink>,
    prepared: PreparedSet,
    settings_fp: u64,
    /// Cancels asked for written requests, not yet over; nothing new is written meanwhile.
    cancels: Vec<CancelState>,
    /// Why the connection ended; nothing is accepted after.
    ended: Option<String>,
    /// A preparation failed here: what the lane has prepared is unknown; it takes nothing new
    /// and closes once answered.
    retiring: bool,
    /// Settings never applied on this endpoint before, and fragile ones every time
    /// (`Settings::is_fragile`), are written alone: nothing is written behind them until they
    /// are answered, so that a client's bad setting fails only its own requests (those queued
    /// behind it with the same settings) and never the lane, and no request runs without them.
    proving: Option<Proving>,
}

/// Settings being proven, written and not yet answered.
struct Proving {
    fp: u64,
    /// The ErrorResponse it failed with.
    error: Option<Bytes>,
}

struct Queued {
    seq: u64,
    /// The router's settings request for this fingerprint, to be proven
    /// ([`LaneState::proving`]).
    proves: Option<u64>,
    /// Past this ([`now_us`]) it is taken out unwritten ([`Reply::Expired`]).
    until: u64,
    bytes: BytesMut,
    readies: usize,
    simple: bool,
    hidden: usize,
    sink: Option<Sink>,
}

struct CancelState {
    seq: u64,
    sent: bool,
    delivered: bool,
}

/// A complete request for a lane.
pub struct Request<'a> {
    pub bytes: &'a [u8],
    /// A long message written after `bytes`.
    pub tail: &'a [u8],
    /// ReadyForQuery frames that end it (its Syncs and Queries).
    pub readies: usize,
    /// It holds a Query ([`crate::backend::pipeline::Written::simple`]).
    pub simple: bool,
    /// The client's settings: written in front of the request when the lane holds others,
    /// and proven on their own each time when they may fail (`Settings::is_fragile`).
    pub settings: &'a crate::backend::settings::Settings,
    pub sink: Sink,
    /// How long it may wait in the router before it is written (`checkout_timeout_ms`).
    pub max_wait: Duration,
}

/// Now, in µs of the coarse monotonic clock (never 0). The lanes' clock: whether a request
/// has run for [`SLOW`] or waited past a checkout timeout needs milliseconds, not the fine
/// clock's nanoseconds, and the coarse one is read from memory without the fine clock's
/// conversion, several times a statement.
fn now_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC_COARSE exists on every
    // Linux the router supports, and clock_gettime only writes `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    let us = u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000
        + u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000;
    us.max(1)
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl ShardMux {
    /// The mux of `endpoint` for a router of `workers` worker threads, opening at most `limit`
    /// lanes.
    pub fn new(
        endpoint: Endpoint,
        limit: usize,
        workers: usize,
        health: Arc<super::health::Health>,
    ) -> ShardMux {
        ShardMux {
            endpoint,
            health,
            limit,
            lanes: ArcSwap::default(),
            opening: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
            taken_by: (0..workers.max(1)).map(|_| AtomicUsize::new(0)).collect(),
            changed: Notify::new(),
            proven: Mutex::new(HashSet::new()),
        }
    }

    /// Most lanes this router opens to the endpoint.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn lanes(&self) -> arc_swap::Guard<Arc<Lanes>> {
        self.lanes.load()
    }

    /// Lanes open now.
    pub fn open_lanes(&self) -> usize {
        self.lanes().len()
    }

    /// Each open lane's backend pid, the worker thread it belongs to, and how many requests it
    /// has queued or running (admin console, `SHOW SERVERS`).
    pub fn lane_loads(&self) -> Vec<(i32, usize, usize)> {
        self.lanes()
            .iter()
            .map(|(w, l)| (l.pid, *w, l.load.load(Ordering::Relaxed)))
            .collect()
    }

    /// The lane for a request with settings `fp`, opening one when none can take it at once
    /// and the limit allows. `None` when no lane could be opened in time: the caller uses a
    /// connection of its own instead (which reports why the shard cannot be reached).
    pub async fn lane(self: &Arc<Self>, fp: u64, wait: Duration) -> Option<Arc<Lane>> {
        // Nearly always a lane can take it at once: no wake-up is set up for that.
        if let (best, true) = self.pick(fp) {
            return best;
        }
        let deadline = tokio::time::Instant::now() + wait;
        let mut opened = false;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (best, usable) = self.pick(fp);
            if usable {
                return best;
            }
            // Past its share only when no lane can take the request at once: a slow statement
            // must not hold the statements of its worker behind it.
            let beyond = !best.as_ref().is_some_and(|l| l.takes_at_once(now_us()));
            if !opened && (self.take_slot(false) || beyond && self.take_slot(true)) {
                // One opening per request: a host that refuses is left to the caller's own
                // connection, which waits for it as `[failover]` says.
                self.open(None);
                opened = true;
            } else if self.opening.load(Ordering::Relaxed) == 0 {
                // At the limit, or this request's opening is over: the best there is (every
                // lane slow or full: it queues).
                return best;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.pick(fp).0;
            }
        }
    }

    /// The best lane and whether it can take the request at once (not slow, not full).
    fn pick(&self, fp: u64) -> (Option<Arc<Lane>>, bool) {
        let now = now_us();
        let here = crate::backend::worker::worker();
        let lanes = self.lanes();
        // A lane of this worker that can take the request wins over any of another worker,
        // whose counters (written by their own worker on every statement) are then not read.
        let own = best(lanes.iter().filter(|(w, _)| *w == here), here, fp, now);
        if let Some((
            Fit {
                slow: false,
                full: false,
                ..
            },
            lane,
        )) = own
        {
            return (Some(lane.clone()), true);
        }
        // A lane of another worker costs a wake-up of that thread per statement each way: it
        // takes the request at once only when this worker may not open one of its own.
        let room = self.may_open(here);
        if own.is_none() && !room && self.limit > self.share() {
            // No lane of its own and none to be had: another worker's may be past its share.
            self.rebalance(&lanes);
        }
        match best(lanes.iter(), here, fp, now) {
            Some((f, lane)) => (Some(lane.clone()), !(f.slow || f.full || f.remote && room)),
            None => (None, false),
        }
    }

    /// Opens this worker's first lane now, unless it has one or no room for one: a warm start,
    /// so the first statements neither wait for a login nor cross to another worker's lane.
    /// `Some(true)` when it opened one, `Some(false)` when the primary refused, `None` when
    /// nothing was to do.
    pub async fn warm(self: &Arc<Self>) -> Option<bool> {
        let here = crate::backend::worker::worker();
        if self.lanes().iter().any(|(w, _)| *w == here) || !self.take_slot(false) {
            return None;
        }
        let (done, opened) = tokio::sync::oneshot::channel();
        self.open(Some(done));
        // The task reports either way; dropped unanswered only when the runtime goes.
        Some(opened.await.unwrap_or(false))
    }

    /// Takes room for one more lane of this worker: within its share of the limit, or with
    /// `beyond_share` only within the limit.
    fn take_slot(&self, beyond_share: bool) -> bool {
        let below = |limit: usize| move |n: usize| (n < limit).then_some(n + 1);
        let mine = &self.taken_by[crate::backend::worker::worker() % self.taken_by.len()];
        let share = if beyond_share {
            usize::MAX
        } else {
            self.share()
        };
        if mine
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, below(share))
            .is_err()
        {
            return false;
        }
        let taken = self
            .taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, below(self.limit));
        if taken.is_err() {
            mine.fetch_sub(1, Ordering::AcqRel);
        }
        taken.is_ok()
    }

    /// Gives back the room of a lane of worker `worker` (closed, or its opening failed).
    fn give_slot(&self, worker: usize) {
        self.taken_by[worker % self.taken_by.len()].fetch_sub(1, Ordering::AcqRel);
        self.taken.fetch_sub(1, Ordering::AcqRel);
    }

    /// Most lanes one worker opens: its share of the limit, rounded up (so that with fewer
    /// lanes than workers, each lane is still opened by a different worker).
    fn share(&self) -> usize {
        self.limit.div_ceil(self.taken_by.len())
    }

    /// This worker has no lane and the limit is reached: a worker that holds more than its
    /// share (it went past it while its lanes were slow or full) gives one back, if it keeps
    /// another that takes requests at once. The least loaded such lane takes nothing new and
    /// closes once answered; this worker opens its own then, and meanwhile uses the others'.
    /// (While a worker's only other lane is slow it keeps both: a slow statement must not
    /// hold its worker's others, and this worker's requests go to the lane kept meanwhile.)
    fn rebalance(&self, lanes: &Lanes) {
        let share = self.share();
        let now = now_us();
        let open = |l: &Lane| !l.closed.load(Ordering::Relaxed);
        let taking = |w: usize| lanes.iter().filter(|(x, l)| *x == w && open(l)).count();
        let keeps_another = |w: usize, lane: &Arc<Lane>| {
            lanes
                .iter()
                .any(|(x, l)| *x == w && !Arc::ptr_eq(l, lane) && open(l) && l.takes_at_once(now))
        };
        let over = lanes
            .iter()
            .filter(|(w, l)| open(l) && taking(*w) > share && keeps_another(*w, l))
            .min_by_key(|(_, l)| l.load.load(Ordering::Relaxed));
        if let Some((w, lane)) = over {
            tracing::debug!(endpoint = %self.endpoint.name(), pid = lane.pid, worker = w, "a shared connection past its worker's share closes for another worker's");
            lane.retire(&mut lane.state());
            lane.wake.notify();
        }
    }

    /// Whether worker `here` may open another lane now.
    fn may_open(&self, here: usize) -> bool {
        self.taken.load(Ordering::Relaxed) < self.limit
            && self.taken_by[here % self.taken_by.len()].load(Ordering::Relaxed) < self.share()
    }

    /// Opens one more lane in the background, on this worker (its room already taken), and
    /// tells `done` whether it did.
    fn open(self: &Arc<Self>, done: Option<tokio::sync::oneshot::Sender<bool>>) {
        self.opening.fetch_add(1, Ordering::Relaxed);
        let mux = self.clone();
        // The worker whose room was taken: the task runs on it (one event loop per worker).
        let worker = crate::backend::worker::worker();
        tokio::spawn(async move {
            let opened = BackendConn::connect(&mux.endpoint).await;
            mux.opening.fetch_sub(1, Ordering::Relaxed);
            match opened {
                Ok(conn) => {
                    mux.health.up(|| mux.endpoint.name());
                    let lane = Arc::new(Lane::new(conn.pid, conn.secret));
                    mux.lanes.rcu(|lanes| {
                        let mut lanes = Vec::clone(lanes);
                        lanes.push((worker, lane.clone()));
                        lanes
                    });
                    tracing::debug!(endpoint = %mux.endpoint.name(), pid = lane.pid, "opened a shared connection");
                    let weak = Arc::downgrade(&mux);
                    mux.changed.notify_waiters();
                    drop(mux);
                    if let Some(done) = done {
                        let _ = done.send(true);
                    }
                    driver::drive(weak, lane, conn).await;
                }
                Err(e) => {
                    tracing::warn!(endpoint = %mux.endpoint.name(), "could not open a shared connection: {e}");
                    mux.health.down(&mux.endpoint.name(), &e.to_string());
                    mux.give_slot(worker);
                    mux.changed.notify_waiters();
                    if let Some(done) = done {
                        let _ = done.send(false);
                    }
                }
            }
        });
    }

    fn proven(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.proven.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether settings `fp` applied without an error on a lane here before.
    fn is_proven(&self, fp: u64) -> bool {
        fp == 0 || self.proven().contains(&fp)
    }

    fn prove(&self, fp: u64) {
        let mut proven = self.proven();
        if proven.len() >= PROVEN_KEPT {
            proven.clear();
        }
        proven.insert(fp);
    }

    fn remove(&self, lane: &Arc<Lane>) {
        let mut removed = None;
        self.lanes.rcu(|lanes| {
            removed = lanes
                .iter()
                .find(|(_, l)| Arc::ptr_eq(l, lane))
                .map(|(w, _)| *w);
            lanes
                .iter()
                .filter(|(_, l)| !Arc::ptr_eq(l, lane))
                .cloned()
                .collect::<Vec<_>>()
        });
        if let Some(worker) = removed {
            self.give_slot(worker);
        }
        self.changed.notify_waiters();
    }
}

/// A mux's open lanes, each with the worker that drives it.
type Lanes = Vec<(usize, Arc<Lane>)>;

/// How a lane fits a request.
#[derive(Clone, Copy)]
struct Fit {
    /// Its running request has run for [`SLOW`].
    slow: bool,
    /// It has [`DEPTH`] requests queued or written.
    full: bool,
    /// Another worker drives it.
    remote: bool,
}

/// The best of `lanes` for a request with settings `fp` on worker `here`, and how it fits: the
/// open lane first that is not slow, then not full, then this worker's, then already holds the
/// settings, then has the least queued.
fn best<'a>(
    lanes: impl Iterator<Item = &'a (usize, Arc<Lane>)>,
    here: usize,
    fp: u64,
    now: u64,
) -> Option<(Fit, &'a Arc<Lane>)> {
    lanes
        .filter(|(_, l)| !l.closed.load(Ordering::Relaxed))
        .map(|(worker, l)| {
            let slow = l.is_slow(now);
            let load = l.load.load(Ordering::Relaxed);
            let rank = (
                slow,
                load >= DEPTH,
                *worker != here,
                l.settings_fp.load(Ordering::Relaxed) != fp,
                load,
            );
            (rank, l)
        })
        .min_by_key(|(rank, _)| *rank)
        .map(|((slow, full, remote, _, _), l)| (Fit { slow, full, remote }, l))
}

impl Lane {
    /// Its running request has run for [`SLOW`] at `now` ([`now_us`]).
    fn is_slow(&self, now: u64) -> bool {
        let since = self.front_since.load(Ordering::Relaxed);
        since != 0 && now.saturating_sub(since) > us(SLOW)
    }

    /// It is neither slow nor full: a request given it now is written at once.
    fn takes_at_once(&self, now: u64) -> bool {
        !self.is_slow(now) && self.load.load(Ordering::Relaxed) < DEPTH
    }

    /// A lane for the connection of backend `pid`, holding nothing yet.
    fn new(pid: i32, secret: i32) -> Lane {
        Lane {
            pid,
            secret,
            id: LANE_IDS.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(LaneState {
                next: 0,
                queued: VecDeque::new(),
                pipeline: Pipeline::default(),
                prepared: PreparedSet::default(),
                settings_fp: 0,
                cancels: Vec::new(),
                ended: None,
                retiring: false,
                proving: None,
            }),
            wake: Default::default(),
            load: AtomicUsize::new(0),
            front_since: AtomicU64::new(0),
            settings_fp: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }
    }
}

impl Drop for ShardMux {
    /// The drivers hold the mux only weakly: each is woken to see that it is gone and end
    /// its lane (no driver polls for that on a timer).
    fn drop(&mut self) {
        for (_, lane) in self.lanes().iter() {
            lane.wake.notify();
        }
    }
}

#[cfg(test)]
mod tests;
