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
//! opened up to the limit. A cancel reaches only its own request: one still queued is taken
//! out, one written is cancelled on the backend only while it is the one running, and the
//! lane writes nothing new until that cancel has been delivered.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, Notify};

use super::conn::{BackendConn, Endpoint};
use super::pipeline::{Pipeline, Unplaced, Written};
use super::prepared::PreparedSet;
use super::stream::Outgoing;
use crate::protocol::frame::next_frame;

/// Most requests written ahead on one lane: past it, requests wait in the router, where a
/// cancel can still take them out.
pub const DEPTH: usize = 16;

/// A request running this long on a lane stops further writes there, and the next requests
/// look for (or open) another lane.
pub const SLOW: Duration = Duration::from_millis(20);

/// How often a driver with a cancel waiting checks whether it may send it.
const CANCEL_CHECK: Duration = Duration::from_millis(2);

/// How often an idle driver checks that its mux is still in use.
const IDLE_CHECK: Duration = Duration::from_secs(1);

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
}

/// Where a session receives its replies. Sending never waits: a lane must not stop for a
/// client that reads slowly. What a session has not taken yet is counted instead, and a request
/// whose replies pile up past [`UNREAD_LIMIT`] is failed alone ([`Reply::Overflow`]).
#[derive(Clone, Debug)]
pub struct Sink {
    tx: mpsc::UnboundedSender<Reply>,
    unread: Arc<AtomicUsize>,
}

/// The session's end of a [`Sink`].
#[derive(Debug)]
pub struct Inbox {
    rx: mpsc::UnboundedReceiver<Reply>,
    unread: Arc<AtomicUsize>,
}

/// A session's channel for the replies of its shared requests.
pub fn channel() -> (Sink, Inbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    let unread = Arc::new(AtomicUsize::new(0));
    (
        Sink {
            tx,
            unread: unread.clone(),
        },
        Inbox { rx, unread },
    )
}

impl Sink {
    /// Hands `reply` over; false when the session is gone, or when frames would pile up past
    /// [`UNREAD_LIMIT`] (then the session is told so instead).
    fn deliver(&self, reply: Reply) -> bool {
        if let Reply::Frames(seq, frames) = &reply {
            let len = frames.len();
            if self.unread.fetch_add(len, Ordering::AcqRel) + len > UNREAD_LIMIT {
                self.unread.fetch_sub(len, Ordering::AcqRel);
                let _ = self.tx.send(Reply::Overflow(*seq));
                return false;
            }
        }
        self.tx.send(reply).is_ok()
    }
}

impl Inbox {
    pub async fn recv(&mut self) -> Option<Reply> {
        let reply = self.rx.recv().await?;
        if let Reply::Frames(_, frames) = &reply {
            self.unread.fetch_sub(frames.len(), Ordering::AcqRel);
        }
        Some(reply)
    }
}

/// Reply bytes a shared request may have waiting for its client: a client that reads a large
/// result slower than Postgres sends it is failed (`54000`) rather than let the lane stop for
/// everyone behind it, or the router hold the result.
pub const UNREAD_LIMIT: usize = 16 << 20;

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
    lanes: Mutex<Vec<Arc<Lane>>>,
    /// Lanes being opened.
    opening: AtomicUsize,
    /// Lanes open or being opened: taken before an opening, so that workers opening at the
    /// same moment never pass the limit together.
    taken: AtomicUsize,
    /// A lane was added, or an opening failed.
    changed: Notify,
    seq: AtomicU64,
    epoch: Instant,
}

/// One shared connection.
pub struct Lane {
    pub pid: i32,
    pub secret: i32,
    worker: usize,
    state: Mutex<LaneState>,
    wake: Notify,
    /// Requests queued or written and not answered.
    load: AtomicUsize,
    /// When the request now running began, in µs since the mux's epoch (0: none).
    front_since: AtomicU64,
    /// The settings fingerprint the lane holds once what is queued has run.
    settings_fp: AtomicU64,
    closed: AtomicBool,
}

struct LaneState {
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
}

struct Queued {
    seq: u64,
    bytes: BytesMut,
    readies: usize,
    hidden: usize,
    sink: Option<Sink>,
    /// It prepares or closes statements: the lane's record already counts them done.
    touches_prepared: bool,
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
    pub settings_fp: u64,
    pub sink: Sink,
    /// The request itself prepares or closes router statements (the client's own Parse).
    pub touches_prepared: bool,
}

impl ShardMux {
    pub fn new(endpoint: Endpoint, limit: usize, health: Arc<super::health::Health>) -> ShardMux {
        ShardMux {
            endpoint,
            health,
            limit,
            lanes: Mutex::new(Vec::new()),
            opening: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
            changed: Notify::new(),
            seq: AtomicU64::new(1),
            epoch: Instant::now(),
        }
    }

    /// Most lanes this router opens to the endpoint.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn lanes(&self) -> MutexGuard<'_, Vec<Arc<Lane>>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lanes open now.
    pub fn open_lanes(&self) -> usize {
        self.lanes().len()
    }

    /// The backend pids of the open lanes and what each has queued or running (admin console).
    pub fn lane_loads(&self) -> Vec<(i32, usize)> {
        self.lanes()
            .iter()
            .map(|l| (l.pid, l.load.load(Ordering::Relaxed)))
            .collect()
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The lane for a request with settings `fp`, opening one when none can take it at once
    /// and the limit allows. `None` when no lane could be opened in time: the caller uses a
    /// connection of its own instead (which reports why the shard cannot be reached).
    pub async fn lane(self: &Arc<Self>, fp: u64, wait: Duration) -> Option<Arc<Lane>> {
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
            if !opened && self.take_slot() {
                // One opening per request: a host that refuses is left to the caller's own
                // connection, which waits for it as `[failover]` says.
                self.open();
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
        let now = self.now_us();
        let slow_us = u64::try_from(SLOW.as_micros()).unwrap_or(u64::MAX);
        let here = crate::server::worker();
        let lanes = self.lanes();
        let best = lanes
            .iter()
            .filter(|l| !l.closed.load(Ordering::Relaxed))
            .map(|l| {
                let since = l.front_since.load(Ordering::Relaxed);
                let slow = since != 0 && now.saturating_sub(since) > slow_us;
                let load = l.load.load(Ordering::Relaxed);
                let full = load >= DEPTH;
                let rank = (
                    slow,
                    full,
                    l.worker != here,
                    l.settings_fp.load(Ordering::Relaxed) != fp,
                    load,
                );
                (rank, l)
            })
            .min_by_key(|(rank, _)| *rank);
        // A lane of another worker costs a wake-up of that thread per statement each way: it
        // takes the request at once only when this worker may not open one of its own.
        let room = self.taken.load(Ordering::Relaxed) < self.limit;
        match best {
            Some(((slow, full, remote, _, _), lane)) => {
                (Some(lane.clone()), !(slow || full || remote && room))
            }
            None => (None, false),
        }
    }

    /// Opens a first lane now, on this worker, unless one is open or being opened: a warm
    /// start, so the first statements do not wait for a login. `Some(true)` when it opened
    /// one, `Some(false)` when the primary refused, `None` when nothing was to do.
    pub async fn warm(self: &Arc<Self>) -> Option<bool> {
        if !self.lanes().is_empty() || self.opening.load(Ordering::Relaxed) > 0 {
            return None;
        }
        if !self.take_slot() {
            return None;
        }
        let changed = self.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        self.open();
        loop {
            changed.as_mut().await;
            changed.set(self.changed.notified());
            changed.as_mut().enable();
            if !self.lanes().is_empty() {
                return Some(true);
            }
            if self.opening.load(Ordering::Relaxed) == 0 {
                return Some(false);
            }
        }
    }

    /// Takes room for one more lane, if the limit allows.
    fn take_slot(&self) -> bool {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// Opens one more lane in the background, on this worker (its room already taken).
    fn open(self: &Arc<Self>) {
        self.opening.fetch_add(1, Ordering::Relaxed);
        let mux = self.clone();
        tokio::spawn(async move {
            let opened = BackendConn::connect(&mux.endpoint).await;
            mux.opening.fetch_sub(1, Ordering::Relaxed);
            match opened {
                Ok(conn) => {
                    mux.health.up(|| mux.endpoint.name());
                    let lane = Arc::new(Lane {
                        pid: conn.pid,
                        secret: conn.secret,
                        worker: crate::server::worker(),
                        state: Mutex::new(LaneState {
                            queued: VecDeque::new(),
                            pipeline: Pipeline::default(),
                            prepared: PreparedSet::default(),
                            settings_fp: 0,
                            cancels: Vec::new(),
                            ended: None,
                            retiring: false,
                        }),
                        wake: Notify::new(),
                        load: AtomicUsize::new(0),
                        front_since: AtomicU64::new(0),
                        settings_fp: AtomicU64::new(0),
                        closed: AtomicBool::new(false),
                    });
                    mux.lanes().push(lane.clone());
                    tracing::debug!(endpoint = %mux.endpoint.name(), pid = lane.pid, "opened a shared connection");
                    let weak = Arc::downgrade(&mux);
                    mux.changed.notify_waiters();
                    drop(mux);
                    drive(weak, lane, conn).await;
                }
                Err(e) => {
                    tracing::warn!(endpoint = %mux.endpoint.name(), "could not open a shared connection: {e}");
                    mux.health.down(&mux.endpoint.name(), &e.to_string());
                    mux.taken.fetch_sub(1, Ordering::AcqRel);
                    mux.changed.notify_waiters();
                }
            }
        });
    }

    fn remove(&self, lane: &Arc<Lane>) {
        let mut lanes = self.lanes();
        let before = lanes.len();
        lanes.retain(|l| !Arc::ptr_eq(l, lane));
        if lanes.len() < before {
            self.taken.fetch_sub(1, Ordering::AcqRel);
        }
        drop(lanes);
        self.changed.notify_waiters();
    }
}

impl Lane {
    fn state(&self) -> MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a complete request; `prepare` writes, for the lane's prepared set, what must
    /// precede the request (Parse/Close of router statements) and says how many messages it
    /// wrote, and `settings` the SQL that gives the lane the client's settings. Returns the
    /// request's number, or `None` when the lane no longer takes requests (or `prepare`
    /// refused: the request cannot go to a shared connection).
    pub fn submit<E>(
        &self,
        mux: &ShardMux,
        req: Request<'_>,
        prepare: impl FnOnce(&mut BytesMut, &mut PreparedSet) -> Result<usize, E>,
        settings: impl FnOnce() -> String,
    ) -> Option<u64> {
        let mut st = self.state();
        if st.ended.is_some() || st.retiring {
            return None;
        }
        let mut bytes = BytesMut::with_capacity(req.bytes.len() + req.tail.len() + 64);
        let Ok(hidden) = prepare(&mut bytes, &mut st.prepared) else {
            // It may have changed the record part-way: what the lane holds is unknown now.
            self.retire(&mut st);
            return None;
        };
        if st.settings_fp != req.settings_fp {
            let mut set = BytesMut::new();
            if crate::protocol::request::query(&mut set, &settings()).is_err() {
                self.retire(&mut st);
                return None;
            }
            st.queued.push_back(Queued {
                seq: 0,
                bytes: set,
                readies: 1,
                hidden: 0,
                sink: None,
                touches_prepared: false,
            });
            self.load.fetch_add(1, Ordering::Relaxed);
            st.settings_fp = req.settings_fp;
            self.settings_fp.store(req.settings_fp, Ordering::Relaxed);
        }
        bytes.extend_from_slice(req.bytes);
        bytes.extend_from_slice(req.tail);
        let seq = mux.seq.fetch_add(1, Ordering::Relaxed);
        st.queued.push_back(Queued {
            seq,
            bytes,
            readies: req.readies,
            hidden,
            sink: Some(req.sink),
            touches_prepared: hidden > 0 || req.touches_prepared,
        });
        self.load.fetch_add(1, Ordering::Relaxed);
        drop(st);
        self.wake.notify_one();
        Some(seq)
    }

    /// Cancels request `seq` (see the module documentation).
    pub fn cancel(&self, seq: u64) -> Cancelled {
        if self.withdraw(seq) {
            return Cancelled::Removed;
        }
        let mut st = self.state();
        if !st.pipeline.contains(seq) {
            return Cancelled::Over;
        }
        if !st.cancels.iter().any(|c| c.seq == seq) {
            st.cancels.push(CancelState {
                seq,
                sent: false,
                delivered: false,
            });
        }
        drop(st);
        self.wake.notify_one();
        Cancelled::Asked
    }

    /// Takes no more requests and closes once what it has is answered: what it holds is no
    /// longer known for sure.
    fn retire(&self, st: &mut LaneState) {
        st.retiring = true;
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Whether request `seq` still waits in the router (not written yet).
    pub fn is_queued(&self, seq: u64) -> bool {
        self.state().queued.iter().any(|q| q.seq == seq)
    }

    /// Takes request `seq` out if it is still queued in the router (nothing of it written);
    /// whether it was.
    pub fn withdraw(&self, seq: u64) -> bool {
        let mut st = self.state();
        match st.queued.iter().position(|q| q.seq == seq) {
            Some(i) => {
                if st.queued.remove(i).is_some_and(|q| q.touches_prepared) {
                    // The record counts its Parse or Close done: no longer true.
                    self.retire(&mut st);
                }
                self.load.fetch_sub(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Moves queued requests into `wbuf` (at most [`DEPTH`] written ahead; none while a cancel
    /// waits, or behind a slow request). Returns whether the lane is done: retired and empty.
    fn fill(&self, mux: &ShardMux, wbuf: &mut BytesMut) -> bool {
        let mut st = self.state();
        let st = &mut *st;
        let pipeline = &st.pipeline;
        st.cancels
            .retain(|c| pipeline.contains(c.seq) || (c.sent && !c.delivered));
        if st.cancels.is_empty() {
            let since = self.front_since.load(Ordering::Relaxed);
            let slow = since != 0
                && mux.now_us().saturating_sub(since)
                    > u64::try_from(SLOW.as_micros()).unwrap_or(u64::MAX);
            while !slow && st.pipeline.len() < DEPTH {
                let Some(q) = st.queued.pop_front() else {
                    break;
                };
                wbuf.extend_from_slice(&q.bytes);
                if st.pipeline.is_empty() {
                    self.front_since.store(mux.now_us(), Ordering::Relaxed);
                }
                st.pipeline.push(Written {
                    seq: q.seq,
                    sink: q.sink,
                    readies: q.readies,
                    hidden: q.hidden,
                    answered: false,
                });
            }
        }
        st.retiring && st.queued.is_empty() && st.pipeline.is_empty()
    }

    /// The cancel to send now, if any: for the request running, when nothing is written
    /// behind it, or when it has run for [`SLOW`] (see the module documentation).
    fn cancel_due(&self, mux: &ShardMux) -> Option<u64> {
        let mut st = self.state();
        let st = &mut *st;
        if st.cancels.is_empty() {
            return None;
        }
        let front = st.pipeline.front().map(|w| w.seq)?;
        let since = self.front_since.load(Ordering::Relaxed);
        let slow = since != 0
            && mux.now_us().saturating_sub(since)
                >= u64::try_from(SLOW.as_micros()).unwrap_or(u64::MAX);
        let alone = st.pipeline.len() == 1;
        let c = st.cancels.iter_mut().find(|c| c.seq == front && !c.sent)?;
        if !(alone || slow) {
            return None;
        }
        c.sent = true;
        Some(c.seq)
    }

    /// Whether a cancel waits for its request to have run [`SLOW`].
    fn cancel_waits(&self) -> bool {
        self.state().cancels.iter().any(|c| !c.sent)
    }

    fn cancel_delivered(&self, seq: u64) {
        if let Some(c) = self.state().cancels.iter_mut().find(|c| c.seq == seq) {
            c.delivered = true;
        }
        self.wake.notify_one();
    }

    /// Hands the whole reply frames in `rbuf` to their requests: what each sink gets, in
    /// order, and why the connection is no longer fit to share, if it is not (with whether
    /// the server ended it before the running request answered anything): everything read
    /// before that still goes to its clients first.
    #[allow(clippy::type_complexity)]
    fn demux(
        &self,
        mux: &ShardMux,
        rbuf: &mut BytesMut,
    ) -> (Vec<(Sink, Reply)>, Option<(String, bool)>) {
        let mut st = self.state();
        let mut runs: Vec<(Sink, u64, std::ops::Range<usize>)> = Vec::new();
        let mut at = 0;
        let mut failure = None;
        let mut shutdown = false;
        loop {
            let h = match next_frame(&rbuf[at..]) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    failure = Some(format!("the server sent a malformed message: {e}"));
                    break;
                }
            };
            let status = (h.tag == b'Z').then(|| rbuf.get(at + 5).copied()).flatten();
            if h.tag == b'E'
                && st.pipeline.front().is_some_and(|f| !f.answered)
                && crate::protocol::backend::is_shutdown(&rbuf[at..at + h.total])
            {
                // The server ends the session (a shutdown, or on purpose) before the running
                // request answered anything: it is not handed this as its answer.
                let (code, message) =
                    crate::protocol::backend::error_fields(&rbuf[at..at + h.total]);
                shutdown = true;
                failure = Some(format!("{message} (SQLSTATE {code})"));
                break;
            }
            let routed = match st.pipeline.route(h.tag, status) {
                Ok(r) => r,
                Err(Unplaced::Unasked(tag)) => {
                    let what = if tag == b'E' {
                        let (code, message) =
                            crate::protocol::backend::error_fields(&rbuf[at..at + h.total]);
                        format!("{message} (SQLSTATE {code})")
                    } else {
                        format!("an unexpected message '{}'", tag as char)
                    };
                    failure = Some(format!("the server sent {what} while nothing ran"));
                    break;
                }
            };
            if routed.deliver {
                if let Some(front) = st.pipeline.front() {
                    let seq = front.seq;
                    match runs.last_mut() {
                        Some((_, s, range)) if *s == seq && range.end == at => {
                            range.end = at + h.total
                        }
                        _ => {
                            if let Some(sink) = &front.sink {
                                runs.push((sink.clone(), seq, at..at + h.total));
                            }
                        }
                    }
                }
            }
            if routed.preparation_failed {
                self.retire(&mut st);
            }
            if h.tag == b'E'
                && st
                    .pipeline
                    .front()
                    .is_some_and(|f| f.sink.is_none() && f.seq == 0)
            {
                // The router's own request (the client's settings) failed: the connection does
                // not hold what the request behind it assumes. Closed before it runs further.
                failure = Some("applying a client's settings on a shared connection failed".into());
                at += h.total;
                break;
            }
            at += h.total;
            if routed.ended {
                st.pipeline.pop_front();
                self.load.fetch_sub(1, Ordering::Relaxed);
                let next = if st.pipeline.is_empty() {
                    0
                } else {
                    mux.now_us()
                };
                self.front_since.store(next, Ordering::Relaxed);
                if routed.not_idle {
                    // Nothing shared may run inside a transaction: the requests behind it
                    // must not join it. The connection is closed (Postgres rolls back).
                    failure =
                        Some("a shared statement left its connection inside a transaction".into());
                    break;
                }
            }
        }
        let chunk = rbuf.split_to(at).freeze();
        let out = runs
            .into_iter()
            .map(|(sink, seq, range)| (sink, Reply::Frames(seq, chunk.slice(range))))
            .collect();
        (out, failure.map(|why| (why, shutdown)))
    }

    /// Forgets that router statement `id` is prepared here: its Parse failed.
    pub fn forget_prepared(&self, id: u64) {
        self.state().prepared.remove(&id);
    }

    /// Forgets the sink of request `seq` (its client left).
    fn forget_sink(&self, seq: u64) {
        if let Some(w) = self.state().pipeline.find_mut(seq) {
            w.sink = None;
        }
    }

    /// Ends the lane: takes nothing more, and tells every request not answered. With
    /// `shutdown`, the server said it ends the session before the running request answered:
    /// that one was `aborted`, and what was written behind it never ran.
    fn end(&self, why: String, shutdown: bool) {
        self.closed.store(true, Ordering::Relaxed);
        let mut st = self.state();
        if st.ended.is_some() {
            return;
        }
        st.ended = Some(why.clone());
        let written: Vec<_> = st.pipeline.drain().collect();
        let queued: Vec<_> = st.queued.drain(..).collect();
        self.load.store(0, Ordering::Relaxed);
        self.front_since.store(0, Ordering::Relaxed);
        drop(st);
        let lost = written
            .into_iter()
            .enumerate()
            .filter_map(|(i, w)| {
                let sent = !shutdown || w.answered;
                let aborted = shutdown && i == 0 && !w.answered;
                w.sink.map(|s| (s, w.seq, sent, aborted))
            })
            .chain(
                queued
                    .into_iter()
                    .filter_map(|q| q.sink.map(|s| (s, q.seq, false, false))),
            );
        for (sink, seq, sent, aborted) in lost {
            let reply = Reply::Lost {
                seq,
                why: why.clone(),
                sent,
                aborted,
            };
            sink.deliver(reply);
        }
    }
}

/// Runs one lane's connection until it ends or its mux is gone.
async fn drive(mux: Weak<ShardMux>, lane: Arc<Lane>, mut conn: BackendConn) {
    let why = match run(&mux, &lane, &mut conn).await {
        Ok(()) => "the shared connection was retired".to_string(),
        Err(why) => why,
    };
    tracing::debug!(pid = lane.pid, "shared connection ends: {why}");
    lane.end(why, false);
    if let Some(mux) = mux.upgrade() {
        mux.remove(&lane);
    }
}

async fn run(mux: &Weak<ShardMux>, lane: &Arc<Lane>, conn: &mut BackendConn) -> Result<(), String> {
    let mut wbuf = BytesMut::with_capacity(16 * 1024);
    let mut written = 0;
    // Kept across polls like `written`: a TLS stream may take the bytes and flush later.
    let mut flushed = true;
    let mut cancels: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    loop {
        let Some(m) = mux.upgrade() else {
            return Ok(());
        };
        if written == wbuf.len() && flushed {
            wbuf.clear();
            written = 0;
            if lane.fill(&m, &mut wbuf) {
                return Ok(());
            }
        }
        if let Some(seq) = lane.cancel_due(&m) {
            let (host, port) = (m.endpoint.host.clone(), m.endpoint.port);
            let (pid, secret) = (conn.pid, conn.secret);
            let l = lane.clone();
            cancels.retain(|c| !c.is_finished());
            cancels.push(tokio::spawn(async move {
                if let Err(e) = super::cancel::send_cancel((host.as_str(), port), pid, secret).await
                {
                    tracing::warn!(
                        pid,
                        "could not cancel a statement on a shared connection: {e}"
                    );
                }
                l.cancel_delivered(seq);
            }));
        }
        let idle = lane.load.load(Ordering::Relaxed) == 0;
        let cancel_waits = lane.cancel_waits();
        drop(m);
        let io = std::future::poll_fn(|cx| {
            let mut out = Outgoing::new(&wbuf, written);
            out.flushed = flushed;
            // Always reading: a server that ends an idle connection is noticed at once.
            let r = conn
                .stream
                .poll_exchange(cx, &mut out, &mut conn.rbuf, true);
            written = out.written;
            flushed = out.flushed;
            r
        });
        tokio::select! {
            r = io => r.map_err(|e| e.to_string())?,
            _ = lane.wake.notified() => continue,
            _ = tokio::time::sleep(IDLE_CHECK), if idle => continue,
            _ = tokio::time::sleep(CANCEL_CHECK), if cancel_waits => continue,
        }
        let Some(m) = mux.upgrade() else {
            return Ok(());
        };
        let (replies, failure) = lane.demux(&m, &mut conn.rbuf);
        drop(m);
        for (sink, reply) in replies {
            let seq = match &reply {
                Reply::Frames(seq, _) | Reply::Lost { seq, .. } | Reply::Overflow(seq) => *seq,
            };
            if !sink.deliver(reply) {
                // The client left: the rest of its replies are dropped.
                lane.forget_sink(seq);
            }
        }
        if let Some((why, shutdown)) = failure {
            lane.end(why.clone(), shutdown);
            return Err(why);
        }
    }
}
