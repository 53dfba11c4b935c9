//! One shared connection's state, as the sessions and its driver see it: requests queued and
//! written, the router statements and settings it holds, the cancels asked for, and how its
//! replies are handed out (over the sans-IO [`crate::backend::pipeline`]).

use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, Weak};

use bytes::{Bytes, BytesMut};

use super::{
    now_us, us, CancelState, Cancelled, Lane, LaneState, Proving, Queued, Reply, Request, ShardMux,
    Sink, DEPTH, SLOW,
};
use crate::backend::pipeline::{Unplaced, Written};
use crate::backend::prepared::PreparedSet;
use crate::protocol::frame::next_frame;

/// Bits of a request's number that count the lane's requests (the rest number the lane):
/// a lane wraps after 2^40 requests, about 12 days at a million a second, long after any reply
/// to an old number could still be waiting in a session's channel.
const SEQ_BITS: u32 = 40;

/// A run of whole reply frames for one request: its sink, its number, and where the frames
/// are in the read buffer.
pub(super) type Run = (Sink, u64, std::ops::Range<usize>);

/// What a driver's turn at the lane ([`Lane::turn`]) found to do.
pub(super) struct Turn {
    /// The lane is retired and empty: it closes.
    pub done: bool,
    /// Requests that waited too long, taken out: their sessions are told.
    pub expired: Vec<(Sink, u64)>,
    /// When the next queued request's wait ends ([`super::now_us`]).
    pub until: Option<u64>,
    /// The cancel to send now (see the module documentation).
    pub cancel: Option<u64>,
    /// A cancel waits for its request to have run [`SLOW`].
    pub cancel_waits: bool,
}

impl Lane {
    pub(super) fn state(&self) -> MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a complete request; `prepare` writes, for the lane's prepared set, what must
    /// precede the request (Parse/Close of router statements) and says how many messages it
    /// wrote. Returns the request's number, or `None` when the lane no longer takes requests
    /// (or `prepare` refused: the request cannot go to a shared connection).
    pub fn submit<E>(
        &self,
        mux: &ShardMux,
        req: Request<'_>,
        prepare: impl FnOnce(&mut BytesMut, &mut PreparedSet) -> Result<usize, E>,
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
        let fp = req.settings.fingerprint();
        if st.settings_fp != fp {
            let mut set = BytesMut::new();
            let Ok(readies) = req.settings.write_all(&mut set) else {
                self.retire(&mut st);
                return None;
            };
            let proves = (req.settings.is_fragile() || !mux.is_proven(fp)).then_some(fp);
            st.queued.push_back(Queued {
                seq: 0,
                proves,
                until: u64::MAX,
                bytes: set,
                readies,
                simple: true,
                hidden: 0,
                sink: None,
            });
            self.load.fetch_add(1, Ordering::Relaxed);
            st.settings_fp = fp;
            self.settings_fp.store(fp, Ordering::Relaxed);
        }
        bytes.extend_from_slice(req.bytes);
        bytes.extend_from_slice(req.tail);
        let seq = self.next_seq(&mut st);
        st.queued.push_back(Queued {
            seq,
            proves: None,
            until: now_us().saturating_add(us(req.max_wait)),
            bytes,
            readies: req.readies,
            simple: req.simple,
            hidden,
            sink: Some(req.sink),
        });
        self.load.fetch_add(1, Ordering::Relaxed);
        drop(st);
        self.wake.notify();
        Some(seq)
    }

    /// The number of the next request queued here: unique among the requests of every lane
    /// (the lane's own number is in the high bits), never 0 (the router's settings
    /// requests). A session tells its replies from those of a request it stopped waiting for
    /// by it.
    fn next_seq(&self, st: &mut LaneState) -> u64 {
        st.next += 1;
        // The lane's number in the bits left, never 0 (after 2^24 lanes, numbers repeat).
        let lane = (self.id % (1 << (64 - SEQ_BITS))).max(1);
        (lane << SEQ_BITS) | (st.next & ((1 << SEQ_BITS) - 1))
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
        self.wake.notify();
        Cancelled::Asked
    }

    /// Takes no more requests and closes once what it has is answered: what it holds is no
    /// longer known for sure.
    pub(super) fn retire(&self, st: &mut LaneState) {
        st.retiring = true;
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Whether request `seq` is the one Postgres runs (or answers) on this lane now.
    pub fn is_running(&self, seq: u64) -> bool {
        self.state().pipeline.front().is_some_and(|w| w.seq == seq)
    }

    /// Takes request `seq` out if it is still queued in the router (nothing of it written);
    /// whether it was.
    fn withdraw(&self, seq: u64) -> bool {
        let mut st = self.state();
        let Some(i) = st.queued.iter().position(|q| q.seq == seq) else {
            return false;
        };
        self.take_out(&mut st, i);
        true
    }

    /// The driver's turn at the lane, under one lock: when `wbuf` is given (nothing is left to
    /// write), moves queued requests into it; takes out those that waited too long; and says
    /// which cancel to send now.
    pub(super) fn turn(&self, wbuf: Option<&mut BytesMut>) -> Turn {
        let mut st = self.state();
        let st = &mut *st;
        let filled = wbuf.is_some();
        if let Some(wbuf) = wbuf {
            self.fill(st, wbuf);
        }
        let (expired, until) = self.expire(st);
        let cancel = self.cancel_due(st);
        Turn {
            done: filled && st.retiring && st.queued.is_empty() && st.pipeline.is_empty(),
            expired,
            until,
            cancel,
            cancel_waits: st.cancels.iter().any(|c| !c.sent),
        }
    }

    /// Moves queued requests into `wbuf`: at most [`DEPTH`] written ahead, none while a cancel
    /// waits, behind a slow request, or behind settings applied for the first time.
    fn fill(&self, st: &mut LaneState, wbuf: &mut BytesMut) {
        let pipeline = &st.pipeline;
        st.cancels
            .retain(|c| pipeline.contains(c.seq) || (c.sent && !c.delivered));
        if !st.cancels.is_empty() {
            return;
        }
        let slow = self.is_slow(now_us());
        while !slow && st.pipeline.len() < DEPTH && st.proving.is_none() {
            let Some(q) = st.queued.pop_front() else {
                break;
            };
            wbuf.extend_from_slice(&q.bytes);
            if let Some(fp) = q.proves {
                st.proving = Some(Proving { fp, error: None });
            }
            if st.pipeline.is_empty() {
                self.front_since.store(now_us(), Ordering::Relaxed);
            }
            st.pipeline.push(Written {
                seq: q.seq,
                sink: q.sink,
                readies: q.readies,
                simple: q.simple,
                hidden: q.hidden,
                answered: false,
            });
        }
    }

    /// Takes out the queued requests whose wait is over: who to tell, and when the next
    /// wait ends.
    fn expire(&self, st: &mut LaneState) -> (Vec<(Sink, u64)>, Option<u64>) {
        let mut expired = Vec::new();
        if st.queued.is_empty() {
            return (expired, None);
        }
        let now = now_us();
        let mut i = 0;
        while i < st.queued.len() {
            if st.queued[i].until > now {
                i += 1;
                continue;
            }
            let (sink, seq, kept) = self.take_out(st, i);
            expired.extend(sink.map(|s| (s, seq)));
            i += usize::from(kept);
        }
        (expired, st.queued.iter().map(|q| q.until).min())
    }

    /// Takes queued request `i` out unwritten: its sink and number, and whether something of
    /// it stays queued. Its Parse and Close messages stay (the router's preparation and the
    /// client's own), alone and ended by a Sync: the lane's record of prepared statements
    /// already counts them done, and the requests queued behind may rely on them.
    fn take_out(&self, st: &mut LaneState, i: usize) -> (Option<Sink>, u64, bool) {
        let q = &mut st.queued[i];
        let (sink, seq) = (q.sink.take(), q.seq);
        let mut kept = BytesMut::new();
        let mut acks = 0;
        let mut rest: &[u8] = &q.bytes;
        while let Ok(Some(h)) = next_frame(rest) {
            if matches!(h.tag, b'P' | b'C') {
                kept.extend_from_slice(&rest[..h.total]);
                acks += 1;
            }
            rest = &rest[h.total..];
        }
        if acks == 0 {
            st.queued.remove(i);
            self.load.fetch_sub(1, Ordering::Relaxed);
            return (sink, seq, false);
        }
        crate::protocol::request::sync(&mut kept);
        q.bytes = kept;
        q.readies = 1;
        q.simple = false;
        q.hidden = acks;
        q.until = u64::MAX;
        (sink, seq, true)
    }

    /// The cancel to send now, if any: for the request running, when nothing is written
    /// behind it, or when it has run for [`SLOW`] (see the module documentation).
    fn cancel_due(&self, st: &mut LaneState) -> Option<u64> {
        if st.cancels.is_empty() {
            return None;
        }
        let front = st.pipeline.front().map(|w| w.seq)?;
        let since = self.front_since.load(Ordering::Relaxed);
        let slow = since != 0 && now_us().saturating_sub(since) >= us(SLOW);
        let alone = st.pipeline.len() == 1;
        let c = st.cancels.iter_mut().find(|c| c.seq == front && !c.sent)?;
        if !(alone || slow) {
            return None;
        }
        c.sent = true;
        Some(c.seq)
    }

    pub(super) fn cancel_delivered(&self, seq: u64) {
        if let Some(c) = self.state().cancels.iter_mut().find(|c| c.seq == seq) {
            c.delivered = true;
        }
        self.wake.notify();
    }

    /// Hands the whole reply frames in `rbuf` to their requests: what each sink gets goes to
    /// `out`, in order (`runs`: the driver's buffer for the runs of frames, kept between turns
    /// like `out`), and returns why the connection is no longer fit to share, if it is not
    /// (with whether the server ended it before the running request answered anything):
    /// everything read before that still goes to its clients first.
    pub(super) fn demux(
        &self,
        mux: &Weak<ShardMux>,
        rbuf: &mut BytesMut,
        runs: &mut Vec<Run>,
        out: &mut Vec<(Sink, Reply)>,
    ) -> Option<(String, bool)> {
        let mut st = self.state();
        runs.clear();
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
                && !st.pipeline.is_empty()
                && crate::protocol::backend::is_shutdown(&rbuf[at..at + h.total])
            {
                // The server ends the session (a shutdown, or on purpose): nothing written
                // behind the running request ran, and the running one is not handed this as
                // its answer. When none of it finished, what it answered in this same turn is
                // not handed out either: it is sent again whole, elsewhere.
                let (code, message) =
                    crate::protocol::backend::error_fields(&rbuf[at..at + h.total]);
                shutdown = true;
                failure = Some(format!("{message} (SQLSTATE {code})"));
                if let Some(front) = st.pipeline.front().filter(|f| !f.answered) {
                    let front = front.seq;
                    runs.retain(|(_, seq, _)| *seq != front);
                }
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
            let settings_request = st
                .pipeline
                .front()
                .is_some_and(|f| f.sink.is_none() && f.seq == 0);
            if h.tag == b'E' && settings_request && st.pipeline.len() == 1 {
                if let Some(proving) = &mut st.proving {
                    // Settings applied here for the first time (nothing is written behind
                    // them): only their own requests fail, at the ReadyForQuery.
                    proving.error = Some(Bytes::copy_from_slice(&rbuf[at..at + h.total]));
                    at += h.total;
                    continue;
                }
            }
            if h.tag == b'E' && settings_request {
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
                if st.pipeline.is_empty() {
                    if let Some(proving) = st.proving.take() {
                        out.extend(self.proven(mux, &mut st, proving));
                    }
                }
                let next = if st.pipeline.is_empty() { 0 } else { now_us() };
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
        if let Some(front) = st.pipeline.front_mut() {
            // What its client is handed it may see at once, descriptions too.
            front.answered |= runs.last().is_some_and(|(_, seq, _)| *seq == front.seq);
        }
        let chunk = rbuf.split_to(at).freeze();
        out.extend(
            runs.drain(..)
                .map(|(sink, seq, range)| (sink, Reply::Frames(seq, chunk.slice(range)))),
        );
        failure.map(|why| (why, shutdown))
    }

    /// Settings applied for the first time are answered: proven for the endpoint, or failed,
    /// when the requests queued behind them with the same settings are taken out and refused
    /// with the same error (what each client would have got on a connection of its own).
    fn proven(
        &self,
        mux: &Weak<ShardMux>,
        st: &mut LaneState,
        proving: Proving,
    ) -> Vec<(Sink, Reply)> {
        let Some(error) = proving.error else {
            // A mux that is gone has no one left to tell.
            if let Some(mux) = mux.upgrade() {
                mux.prove(proving.fp);
            }
            return Vec::new();
        };
        let mut refused = Vec::new();
        let mut i = 0;
        while st.queued.get(i).is_some_and(|q| q.seq != 0) {
            let (sink, seq, kept) = self.take_out(st, i);
            refused.extend(sink.map(|s| (s, Reply::Refused(seq, error.clone()))));
            i += usize::from(kept);
        }
        if !st.queued.iter().any(|q| q.seq == 0) {
            // The reset is a Query of its own (`Settings::write_all`) and ran; Postgres rolled
            // back only the failed `SET`s. What the lane holds now is not anyone's settings:
            // the next request gets its own whatever they are.
            st.settings_fp = crate::backend::settings::UNKNOWN;
            self.settings_fp
                .store(crate::backend::settings::UNKNOWN, Ordering::Relaxed);
        }
        refused
    }

    /// Forgets that router statement `id` is prepared here: its Parse failed.
    pub fn forget_prepared(&self, id: u64) {
        self.state().prepared.remove(&id);
    }

    /// Forgets the sink of request `seq` (its client left).
    pub(super) fn forget_sink(&self, seq: u64) {
        if let Some(w) = self.state().pipeline.find_mut(seq) {
            w.sink = None;
        }
    }

    /// Ends the lane: takes nothing more, and tells every request not answered. With
    /// `shutdown`, the server said it ends the session before the running request answered:
    /// that one was `aborted`, and what was written behind it never ran.
    pub(super) fn end(&self, why: String, shutdown: bool) {
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
