//! One shared connection's state, as the sessions and its driver see it: requests queued and
//! written, the router statements and settings it holds, the cancels asked for, and how its
//! replies are handed out (over the sans-IO [`crate::backend::pipeline`]).

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use bytes::BytesMut;

use super::{
    CancelState, Cancelled, Lane, LaneState, Queued, Reply, Request, ShardMux, Sink, DEPTH, SLOW,
};
use crate::backend::pipeline::{Unplaced, Written};
use crate::backend::prepared::PreparedSet;
use crate::protocol::frame::next_frame;

impl Lane {
    pub(super) fn state(&self) -> MutexGuard<'_, LaneState> {
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
                simple: true,
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
            simple: req.simple,
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
    pub(super) fn fill(&self, mux: &ShardMux, wbuf: &mut BytesMut) -> bool {
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
                    simple: q.simple,
                    hidden: q.hidden,
                    answered: false,
                });
            }
        }
        st.retiring && st.queued.is_empty() && st.pipeline.is_empty()
    }

    /// The cancel to send now, if any: for the request running, when nothing is written
    /// behind it, or when it has run for [`SLOW`] (see the module documentation).
    pub(super) fn cancel_due(&self, mux: &ShardMux) -> Option<u64> {
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
    pub(super) fn cancel_waits(&self) -> bool {
        self.state().cancels.iter().any(|c| !c.sent)
    }

    pub(super) fn cancel_delivered(&self, seq: u64) {
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
    pub(super) fn demux(
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
        if let Some(front) = st.pipeline.front_mut() {
            // What its client is handed it may see at once, descriptions too.
            front.answered |= runs.last().is_some_and(|(_, seq, _)| *seq == front.seq);
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
