//! One client's request meter, sans-IO: which requests the client has open, how each was
//! routed, and when each ends.
//!
//! A request is what the client sends up to the message Postgres answers with ReadyForQuery:
//! a simple Query, or extended-protocol messages up to Sync (PgBouncer counts queries the same
//! way). The session tells the meter when a client message arrives ([`Meter::received`]) and
//! how the request it belongs to is routed ([`Meter::route`], [`Meter::waited`]); the client's
//! writer shows it every byte sent to the client ([`Meter::sent`]). Each ReadyForQuery ends the
//! oldest open request, each ErrorResponse marks it failed. Nothing is decoded but frame
//! headers and the SQLSTATE of errors, so metering costs a few comparisons per reply frame.
//!
//! Requests stay open in order: a client may pipeline several before the first is answered.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::RouteKind;

/// A request that has ended, or an error sent to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A request ended with ReadyForQuery.
    Done(Request),
    /// An ErrorResponse went to the client, with its SQLSTATE class (`b"??"` if unreadable).
    Error([u8; 2]),
}

/// One request: when its first message arrived and how it was routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub started: Instant,
    pub kind: RouteKind,
    /// The shard's stats id ([`super::NO_SHARD`] when the request ran on no single shard).
    pub shard: u32,
    pub failed: bool,
    /// Time spent waiting for a backend connection, if one was checked out for it.
    pub waited: Option<Duration>,
    /// Time from the first message to ReadyForQuery (set when it ends).
    pub elapsed: Duration,
    /// Bytes read from and written to the client since the previous request ended.
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Requests queued without an answer beyond this are forgotten (a client that pipelines
/// without reading, or messages Postgres would skip without answering).
const MAX_OPEN: usize = 1024;

#[derive(Debug, Default)]
pub struct Meter {
    open: VecDeque<Request>,
    /// The newest open request still takes messages (its Query or Sync has not arrived).
    accepting: bool,
    /// Bytes of a frame body still to come in the next write to the client.
    skip: usize,
    /// A frame header split over two writes.
    head: [u8; 5],
    head_len: usize,
    /// Bytes read and written since a request last ended.
    bytes_in: u64,
    bytes_out: u64,
    /// How long the request that ended last took.
    last_elapsed: Option<Duration>,
}

impl Meter {
    /// A client message with tag `tag` arrived (`now` is read only when it opens a request).
    pub fn received(&mut self, tag: u8, now: impl FnOnce() -> Instant) {
        if matches!(tag, b'd' | b'c' | b'f' | b'X') {
            // COPY data outside a COPY (ignored, as Postgres does) and Terminate: no answer
            // will come, so no request opens.
            return;
        }
        if !self.accepting {
            if self.open.len() >= MAX_OPEN {
                self.open.pop_front();
            }
            self.open.push_back(Request {
                started: now(),
                kind: RouteKind::Router,
                shard: super::NO_SHARD,
                failed: false,
                waited: None,
                elapsed: Duration::ZERO,
                bytes_in: 0,
                bytes_out: 0,
            });
            self.accepting = true;
        }
        if matches!(tag, b'Q' | b'S') {
            // The next message starts another request; this one is still being routed.
            self.accepting = false;
        }
    }

    /// How long the request that ended last took, from its first message to its
    /// ReadyForQuery.
    pub fn last_elapsed(&self) -> Option<Duration> {
        self.last_elapsed
    }

    /// `n` bytes were read from the client.
    pub fn read(&mut self, n: usize) {
        self.bytes_in += n as u64;
    }

    /// The bytes read and written that no ended request has counted yet (at the session's
    /// end).
    pub fn take_bytes(&mut self) -> (u64, u64) {
        (
            std::mem::take(&mut self.bytes_in),
            std::mem::take(&mut self.bytes_out),
        )
    }

    /// The newest request runs as `kind`, on the shard with stats id `shard` if one.
    pub fn route(&mut self, kind: RouteKind, shard: u32) {
        if let Some(r) = self.open.back_mut() {
            r.kind = kind;
            r.shard = shard;
        }
    }

    /// The newest request waited `waited` for a backend connection.
    pub fn waited(&mut self, waited: Duration) {
        if let Some(r) = self.open.back_mut() {
            r.waited = Some(r.waited.unwrap_or_default() + waited);
        }
    }

    /// `bytes` are about to be written to the client; `emit` hears of every error and every
    /// request that ends in them. Frames may be split across calls.
    pub fn sent(
        &mut self,
        mut bytes: &[u8],
        mut now: impl FnMut() -> Instant,
        mut emit: impl FnMut(Event),
    ) {
        self.bytes_out += bytes.len() as u64;
        loop {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
            }
            if bytes.is_empty() {
                return;
            }
            // The header, whole here or completed from the previous write.
            let header = if self.head_len > 0 || bytes.len() < 5 {
                let n = (5 - self.head_len).min(bytes.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
                self.head_len += n;
                bytes = &bytes[n..];
                if self.head_len < 5 {
                    return;
                }
                self.head_len = 0;
                self.head
            } else {
                let h = [bytes[0], bytes[1], bytes[2], bytes[3], bytes[4]];
                bytes = &bytes[5..];
                h
            };
            let len = i32::from_be_bytes([header[1], header[2], header[3], header[4]]);
            let body_len = usize::try_from(len).unwrap_or(0).saturating_sub(4);
            match header[0] {
                b'E' => {
                    let class = bytes
                        .get(..body_len)
                        .and_then(crate::protocol::backend::sqlstate_class)
                        .unwrap_or(*b"??");
                    if let Some(r) = self.open.front_mut() {
                        r.failed = true;
                    }
                    emit(Event::Error(class));
                }
                b'Z' => {
                    if let Some(mut r) = self.open.pop_front() {
                        r.elapsed = now().saturating_duration_since(r.started);
                        self.last_elapsed = Some(r.elapsed);
                        (r.bytes_in, r.bytes_out) = self.take_bytes();
                        emit(Event::Done(r));
                    }
                    if self.open.is_empty() {
                        self.accepting = false;
                    }
                }
                _ => {}
            }
            let n = body_len.min(bytes.len());
            self.skip = body_len - n;
            bytes = &bytes[n..];
        }
    }

    /// Requests waiting for their ReadyForQuery.
    pub fn open(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::reply::{self, SqlError, TxStatus};

    fn run(meter: &mut Meter, out: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        meter.sent(out, Instant::now, |e| events.push(e));
        events
    }

    fn answer(tags: &[&str], error: Option<&'static str>) -> Vec<u8> {
        let mut out = Vec::new();
        for tag in tags {
            reply::command_complete(&mut out, tag);
        }
        if let Some(code) = error {
            SqlError::new(code, "no").write(&mut out);
        }
        reply::ready_for_query(&mut out, TxStatus::Idle);
        out
    }

    fn done(events: &[Event]) -> Vec<(RouteKind, u32, bool)> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Done(r) => Some((r.kind, r.shard, r.failed)),
                Event::Error(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_query_ends_with_its_ready_for_query() {
        let mut m = Meter::default();
        m.received(b'Q', Instant::now);
        m.route(RouteKind::SingleShard, 3);
        let events = run(&mut m, &answer(&["SELECT 1"], None));
        assert_eq!(done(&events), [(RouteKind::SingleShard, 3, false)]);
        assert_eq!(m.open(), 0);
    }

    #[test]
    fn the_last_request_to_end_gives_its_time() {
        let mut m = Meter::default();
        assert_eq!(m.last_elapsed(), None);
        let t0 = Instant::now();
        m.received(b'Q', || t0);
        m.sent(
            &answer(&["SELECT 1"], None),
            || t0 + Duration::from_millis(7),
            |_| {},
        );
        assert_eq!(m.last_elapsed(), Some(Duration::from_millis(7)));
    }

    #[test]
    fn an_extended_batch_is_one_request_up_to_sync() {
        let mut m = Meter::default();
        for tag in *b"PBDES" {
            m.received(tag, Instant::now);
        }
        m.route(RouteKind::Scatter, NO);
        assert_eq!(m.open(), 1);
        let events = run(&mut m, &answer(&["SELECT 4"], Some("42P01")));
        assert_eq!(
            events,
            [
                Event::Error(*b"42"),
                Event::Done(match events[1] {
                    Event::Done(r) => {
                        assert!(r.failed && r.kind == RouteKind::Scatter);
                        r
                    }
                    Event::Error(_) => panic!("not done"),
                })
            ]
        );
    }

    const NO: u32 = crate::stats::NO_SHARD;

    #[test]
    fn pipelined_requests_end_in_order_with_their_own_routes() {
        let mut m = Meter::default();
        m.received(b'Q', Instant::now);
        m.route(RouteKind::Router, NO);
        m.received(b'Q', Instant::now);
        m.route(RouteKind::SingleShard, 1);
        m.waited(Duration::from_millis(2));
        let mut out = answer(&["BEGIN"], None);
        out.extend(answer(&[], Some("08006")));
        let events = run(&mut m, &out);
        assert_eq!(
            done(&events),
            [
                (RouteKind::Router, NO, false),
                (RouteKind::SingleShard, 1, true)
            ]
        );
        assert!(events.contains(&Event::Error(*b"08")));
    }

    #[test]
    fn frames_split_anywhere_across_writes_are_read_whole() {
        let mut out = answer(&["SELECT 1", "SELECT 2"], None);
        out.extend(answer(&[], Some("57014")));
        for cut in 0..out.len() {
            for second in cut..out.len() {
                let mut m = Meter::default();
                m.received(b'Q', Instant::now);
                m.received(b'Q', Instant::now);
                let mut events = run(&mut m, &out[..cut]);
                events.extend(run(&mut m, &out[cut..second]));
                events.extend(run(&mut m, &out[second..]));
                assert_eq!(
                    done(&events),
                    [
                        (RouteKind::Router, NO, false),
                        (RouteKind::Router, NO, true)
                    ],
                    "cut at {cut} and {second}"
                );
                let class = events.iter().find_map(|e| match e {
                    Event::Error(c) => Some(*c),
                    Event::Done(_) => None,
                });
                // The SQLSTATE is read when the error's body arrives in one write.
                assert!(class == Some(*b"57") || class == Some(*b"??"), "{class:?}");
            }
        }
    }

    #[test]
    fn a_ready_for_query_nobody_asked_for_ends_nothing() {
        let mut m = Meter::default();
        assert!(done(&run(&mut m, &answer(&[], None))).is_empty());
        m.received(b'Q', Instant::now);
        assert_eq!(done(&run(&mut m, &answer(&[], None))).len(), 1);
    }
}
