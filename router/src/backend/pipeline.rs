//! Which request a reply frame of a shared backend connection answers. Pure: frames in, their
//! fate out; [`super::mux`] does the I/O.
//!
//! Requests of many clients are written one after another on one connection. Each ends in its
//! own Sync or is one Query, so Postgres answers each up to its own ReadyForQuery, and an error
//! skips only the rest of its own request, exactly as between a single client's Syncs. The
//! pipeline is the FIFO of requests written and not yet answered: every reply frame belongs to
//! the front one, which ends with its last ReadyForQuery.
//!
//! A request may start with the router's own preparation of statements the connection lacks
//! (Parse and Close of `sg_<id>`, no Sync of their own, so a failing Parse fails the client's
//! request as it would on Postgres): their acknowledgements are hidden from the client, an
//! error among them is not.

use std::collections::VecDeque;

/// A request written on the connection, waiting for its replies.
#[derive(Debug)]
pub struct Written<S> {
    /// Numbers the requests of one mux, so that a client matches its replies and a cancel its
    /// request.
    pub seq: u64,
    /// Where its replies go; `None` for the router's own requests (settings), whose replies
    /// nobody reads, and for a client that left.
    pub sink: Option<S>,
    /// ReadyForQuery frames still to come.
    pub readies: usize,
    /// It holds a Query, whose statements Postgres commits before the last CommandComplete;
    /// an extended-protocol request commits only at its Sync (its ReadyForQuery).
    pub simple: bool,
    /// Acknowledgements (ParseComplete, CloseComplete) of the router's preparation still to
    /// come at its start.
    pub hidden: usize,
    /// A reply of its own has come that shows part of it may have taken effect
    /// ([`finishes_nothing`]), or any reply has been handed to its client: a shutdown that ends
    /// the session now may have cut it after part of it took effect, or after its client saw
    /// part of it.
    pub answered: bool,
}

/// What to do with one reply frame.
#[derive(Debug, PartialEq, Eq)]
pub struct Routed {
    /// Hand it to the front request's sink (false: drop it).
    pub deliver: bool,
    /// It was the front request's last reply: pop it.
    pub ended: bool,
    /// The router's preparation at the front request's start failed (this frame is its
    /// ErrorResponse): the connection's record of what it has prepared is now wrong.
    pub preparation_failed: bool,
    /// A ReadyForQuery whose status is not idle: the connection is inside a transaction,
    /// which no shared connection may be.
    pub not_idle: bool,
}

/// A reply the pipeline cannot place.
#[derive(Debug, PartialEq, Eq)]
pub enum Unplaced {
    /// Nothing was waiting for it (an ErrorResponse there is the server ending the session).
    Unasked(u8),
}

/// The requests written and not yet answered, oldest first.
#[derive(Debug)]
pub struct Pipeline<S> {
    written: VecDeque<Written<S>>,
}

impl<S> Default for Pipeline<S> {
    fn default() -> Self {
        Pipeline {
            written: VecDeque::new(),
        }
    }
}

impl<S> Pipeline<S> {
    pub fn push(&mut self, w: Written<S>) {
        self.written.push_back(w);
    }

    pub fn len(&self) -> usize {
        self.written.len()
    }

    pub fn is_empty(&self) -> bool {
        self.written.is_empty()
    }

    /// The request Postgres is answering (or running) now.
    pub fn front(&self) -> Option<&Written<S>> {
        self.written.front()
    }

    pub fn front_mut(&mut self) -> Option<&mut Written<S>> {
        self.written.front_mut()
    }

    pub fn pop_front(&mut self) -> Option<Written<S>> {
        self.written.pop_front()
    }

    /// Whether request `seq` is written and not yet answered.
    pub fn contains(&self, seq: u64) -> bool {
        self.written.iter().any(|w| w.seq == seq)
    }

    /// The request numbered `seq`, if written and not yet answered.
    pub fn find_mut(&mut self, seq: u64) -> Option<&mut Written<S>> {
        self.written.iter_mut().find(|w| w.seq == seq)
    }

    /// Every request written and not answered, oldest first, leaving the pipeline empty.
    pub fn drain(&mut self) -> impl Iterator<Item = Written<S>> + '_ {
        self.written.drain(..)
    }

    /// The fate of reply frame `tag` (`status`: a ReadyForQuery's status byte).
    pub fn route(&mut self, tag: u8, status: Option<u8>) -> Result<Routed, Unplaced> {
        let Some(front) = self.written.front_mut() else {
            // A notice or a parameter change may come while nothing runs; anything else is no
            // answer to anything.
            return match tag {
                b'N' | b'S' | b'A' => Ok(Routed {
                    deliver: false,
                    ended: false,
                    preparation_failed: false,
                    not_idle: false,
                }),
                other => Err(Unplaced::Unasked(other)),
            };
        };
        let mut routed = Routed {
            deliver: front.sink.is_some(),
            ended: false,
            preparation_failed: false,
            not_idle: false,
        };
        if front.hidden > 0 {
            match tag {
                b'1' | b'3' => {
                    front.hidden -= 1;
                    routed.deliver = false;
                    return Ok(routed);
                }
                b'E' => {
                    // Postgres skips the rest of the request: the client sees the error of the
                    // Parse its Bind needed, then its ReadyForQuery.
                    front.hidden = 0;
                    routed.preparation_failed = true;
                }
                // Notices may come at any time.
                _ => {}
            }
        }
        front.answered |= !finishes_nothing(tag, front.simple);
        if tag == b'Z' {
            front.readies = front.readies.saturating_sub(1);
            routed.ended = front.readies == 0;
            routed.not_idle = status != Some(b'I');
        }
        Ok(routed)
    }
}

/// Whether a reply shows that nothing of its request has taken effect yet, so that a session
/// ended after it rolled the request back. Postgres commits an autocommit request at its Sync
/// (extended protocol: until its ReadyForQuery, nothing has) or before a Query's last
/// CommandComplete (`simple`: only descriptions, rows of a statement still running and notices
/// show nothing finished). Statements that commit on their own (VACUUM and the like) are never
/// shared.
pub fn finishes_nothing(tag: u8, simple: bool) -> bool {
    if simple {
        crate::protocol::backend::is_description(tag) || matches!(tag, b'D' | b'N')
    } else {
        tag != b'Z'
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(seq: u64, readies: usize, hidden: usize) -> Written<&'static str> {
        Written {
            seq,
            sink: Some("client"),
            readies,
            simple: false,
            hidden,
            answered: false,
        }
    }

    fn fates(p: &mut Pipeline<&'static str>, frames: &[(u8, Option<u8>)]) -> Vec<(u64, bool)> {
        let mut out = Vec::new();
        for &(tag, status) in frames {
            let seq = p.front().map(|w| w.seq).unwrap_or(0);
            let r = p.route(tag, status).unwrap();
            out.push((seq, r.deliver));
            if r.ended {
                p.pop_front();
            }
        }
        out
    }

    #[test]
    fn replies_go_to_their_requests_in_order() {
        let mut p = Pipeline::default();
        p.push(written(1, 1, 0));
        p.push(written(2, 1, 0));
        let got = fates(
            &mut p,
            &[
                (b'2', None),
                (b'D', None),
                (b'C', None),
                (b'Z', Some(b'I')),
                (b'E', None),
                (b'Z', Some(b'I')),
            ],
        );
        assert_eq!(
            got,
            vec![
                (1, true),
                (1, true),
                (1, true),
                (1, true),
                (2, true),
                (2, true)
            ]
        );
        assert!(p.is_empty());
    }

    #[test]
    fn the_routers_preparation_is_hidden_unless_it_fails() {
        let mut p = Pipeline::default();
        p.push(written(1, 1, 2));
        assert!(!p.route(b'3', None).unwrap().deliver);
        assert!(!p.route(b'1', None).unwrap().deliver);
        assert!(p.route(b'2', None).unwrap().deliver);
        p.route(b'Z', Some(b'I')).unwrap();
        p.pop_front();
        p.push(written(2, 1, 1));
        let failed = p.route(b'E', None).unwrap();
        assert!(failed.deliver && failed.preparation_failed);
        let z = p.route(b'Z', Some(b'I')).unwrap();
        assert!(z.deliver && z.ended && !z.not_idle);
    }

    #[test]
    fn a_request_of_several_syncs_ends_at_its_last_ready() {
        let mut p = Pipeline::default();
        p.push(written(1, 2, 0));
        assert!(!p.route(b'Z', Some(b'I')).unwrap().ended);
        assert!(p.route(b'Z', Some(b'I')).unwrap().ended);
    }

    #[test]
    fn the_routers_own_requests_are_dropped_and_a_transaction_is_noticed() {
        let mut p: Pipeline<&'static str> = Pipeline::default();
        p.push(Written {
            seq: 1,
            sink: None,
            readies: 1,
            simple: true,
            hidden: 0,
            answered: false,
        });
        assert!(!p.route(b'C', None).unwrap().deliver);
        let z = p.route(b'Z', Some(b'T')).unwrap();
        assert!(z.ended && z.not_idle && !z.deliver);
    }

    #[test]
    fn a_reply_nobody_asked_for_is_refused_but_notices_pass() {
        let mut p: Pipeline<&'static str> = Pipeline::default();
        assert!(!p.route(b'N', None).unwrap().deliver);
        assert_eq!(p.route(b'E', None), Err(Unplaced::Unasked(b'E')));
    }

    #[test]
    fn a_request_is_answered_once_part_of_it_may_have_taken_effect() {
        let mut p: Pipeline<&'static str> = Pipeline::default();
        // Extended protocol: nothing commits before the Sync.
        p.push(written(1, 1, 0));
        for tag in [b'2', b'D', b'C'] {
            p.route(tag, None).unwrap();
            assert!(!p.front().unwrap().answered);
        }
        p.route(b'Z', Some(b'I')).unwrap();
        p.pop_front();
        // Two Syncs: the first one's ReadyForQuery committed its part.
        p.push(written(2, 2, 0));
        p.route(b'Z', Some(b'I')).unwrap();
        assert!(p.front().unwrap().answered);
        p.route(b'Z', Some(b'I')).unwrap();
        p.pop_front();
        // A Query commits before its last CommandComplete.
        let mut simple = written(3, 1, 0);
        simple.simple = true;
        p.push(simple);
        p.route(b'T', None).unwrap();
        p.route(b'D', None).unwrap();
        assert!(!p.front().unwrap().answered);
        p.route(b'C', None).unwrap();
        assert!(p.front().unwrap().answered);
    }
}
