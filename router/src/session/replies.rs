//! Matching a backend's reply stream to what the client asked for, sans-IO.
//!
//! Every message the router sends to a backend is recorded, in order, as an [`Expect`]: which
//! replies it produces, and whether the client sees them (its own messages) or not (messages
//! the router injected, such as a `Parse` of a statement the connection has not seen yet).
//! Replies the router makes up itself (a `ParseComplete` for a statement that is already
//! prepared on the connection) sit in the same queue, so everything reaches the client in
//! the order Postgres would have sent it. Only the tags of reply frames are read (and the
//! bodies of CommandComplete and ReadyForQuery).

use std::collections::VecDeque;

use crate::protocol::reply::TxStatus;

/// What one message sent to the backend will answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `P` → `1`
    Parse,
    /// `B` → `2`
    Bind,
    /// `C` → `3`
    Close,
    /// `D` of a statement → `t` then `T` or `n`
    DescribeStatement,
    /// `D` of a portal → `T` or `n`
    DescribePortal,
    /// `D` of a portal for a simple query's client (SQL `EXECUTE`) → `T`, or `n`, which such a
    /// client does not expect and never sees
    DescribeRows,
    /// `E` → rows, then `C`, `I` or `s` (or a COPY sub-protocol)
    Execute,
    /// `Q` → anything, ending with `Z`
    Query,
    /// `S` → `Z`
    Sync,
}

/// Who sees a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// The client's own message: forward every reply.
    Client,
    /// Injected by the router: forward nothing, but an error still reaches the client (it
    /// is the error of the client statement that needed the injection).
    Router,
    /// Injected, and even its errors stay hidden.
    Silent,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// `stmt` is the router-wide id of the statement a Parse prepares (0 for none), so a
    /// Parse that fails or is skipped can be forgotten again.
    Reply {
        kind: Kind,
        audience: Audience,
        stmt: u64,
        /// The router's own error, raised on the backend so that its transaction fails with
        /// it: the error is forwarded without the server's PL/pgSQL location.
        raised: bool,
    },
    /// Bytes the router answers itself, sent when the queue reaches them.
    Synthetic(Vec<u8>),
}

/// What to do with one reply frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Forward,
    /// Forward the error without the fields that say where in the server it arose.
    ForwardRaised,
    Drop,
}

/// A reply that fits no outstanding request: the connection's state is unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected reply {tag:?} from the backend while expecting {expecting}")]
pub struct Desync {
    pub tag: char,
    pub expecting: String,
}

/// Outcome of handing one frame to [`Replies::on_frame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub action: Action,
    /// Set by `Z`: the transaction status the backend reported.
    pub ready: Option<TxStatus>,
    /// The backend switched to COPY FROM STDIN: the client's CopyData must now be relayed.
    pub copy_in: bool,
    /// A client statement completed with a tag that matters to the session (SET, ROLLBACK, ...).
    pub completion: Option<Completion>,
}

/// Command tags the session follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// `SET`, `RESET`: session settings changed (or, for `SET LOCAL`, the transaction's).
    Settings,
    /// `DISCARD ALL`: settings reset and every prepared statement of the connection gone.
    DiscardAll,
    /// `DEALLOCATE ALL`: every prepared statement of the connection gone.
    DeallocateAll,
    /// `ROLLBACK`, also `ROLLBACK TO SAVEPOINT`: what the transaction (or the savepoint)
    /// changed is undone.
    Rollback,
    /// `SAVEPOINT`
    Savepoint,
    /// `RELEASE`
    Release,
}

impl Completion {
    fn of(body: &[u8]) -> Option<Completion> {
        match body.strip_suffix(b"\0").unwrap_or(body) {
            b"SET" | b"RESET" => Some(Completion::Settings),
            b"DISCARD ALL" => Some(Completion::DiscardAll),
            b"DEALLOCATE ALL" => Some(Completion::DeallocateAll),
            b"ROLLBACK" => Some(Completion::Rollback),
            b"SAVEPOINT" => Some(Completion::Savepoint),
            b"RELEASE" => Some(Completion::Release),
            _ => None,
        }
    }
}

#[derive(Default, Debug)]
pub struct Replies {
    queue: VecDeque<Expect>,
    /// Inside the rows of an Execute or Query, or between `t` and `T`/`n` of a Describe.
    mid: bool,
    /// Statements whose Parse failed or was skipped: not prepared after all. The flag says
    /// whether it was the client's own Parse (so the client's name is gone too).
    failed: Vec<(u64, bool)>,
    /// While recording: the expectations answered so far (by replies the client has not been
    /// sent yet), so that a request the server aborted can be expected again
    /// ([`Replies::rewind`]).
    journal: Vec<Expect>,
    recording: bool,
    /// An extended-protocol message failed since [`Replies::take_error`] last asked: the
    /// backend skips to the next Sync.
    errored: bool,
}

impl Replies {
    /// Starts keeping the expectations that replies answer, for a [`Replies::rewind`].
    pub fn record(&mut self) {
        self.journal.clear();
        self.recording = true;
    }

    /// Stops keeping them (a reply the client must not see twice was sent: the request can
    /// no longer be sent again).
    pub fn stop_recording(&mut self) {
        self.journal.clear();
        self.recording = false;
    }

    /// Whether the expectations answered since [`Replies::record`] are all kept (an error in
    /// between ends that).
    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// Expects again what the replies since [`Replies::record`] answered: the request is sent
    /// again from its start.
    pub fn rewind(&mut self) {
        while let Some(e) = self.journal.pop() {
            self.queue.push_front(e);
        }
        self.mid = false;
        self.recording = false;
    }

    pub fn push(&mut self, kind: Kind, audience: Audience) {
        self.queue.push_back(Expect::Reply {
            kind,
            audience,
            stmt: 0,
            raised: false,
        });
    }

    /// A statement that raises the router's own error on the backend.
    pub fn push_raised(&mut self, kind: Kind, audience: Audience) {
        self.queue.push_back(Expect::Reply {
            kind,
            audience,
            stmt: 0,
            raised: true,
        });
    }

    /// A Parse that prepares router statement `stmt`.
    pub fn push_parse(&mut self, stmt: u64, audience: Audience) {
        self.queue.push_back(Expect::Reply {
            kind: Kind::Parse,
            audience,
            stmt,
            raised: false,
        });
    }

    /// Whether a ReadyForQuery the client waits for is owed by the backend: the client's own
    /// Sync or Query is among the expected replies.
    pub fn owes_client_ready(&self) -> bool {
        self.queue.iter().any(|e| match e {
            Expect::Reply {
                kind: Kind::Sync | Kind::Query,
                audience: Audience::Client,
                ..
            } => true,
            // The router's own answer to the client's Sync or Query (its status is the
            // router's to tell).
            Expect::Synthetic(bytes) => {
                crate::protocol::frame::frames(bytes).any(|f| f.is_ok_and(|f| f[0] == b'Z'))
            }
            _ => false,
        })
    }

    /// Whether an extended-protocol message failed since the last call.
    pub fn take_error(&mut self) -> bool {
        std::mem::take(&mut self.errored)
    }

    /// Statements whose Parse turned out not to happen since the last call.
    pub fn take_failed(&mut self) -> std::vec::Drain<'_, (u64, bool)> {
        self.failed.drain(..)
    }

    pub fn push_synthetic(&mut self, bytes: Vec<u8>) {
        self.queue.push_back(Expect::Synthetic(bytes));
    }

    /// Whether replies are still owed (synthetic ones included).
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether a backend reply is still owed (as opposed to only synthetic ones).
    pub fn awaits_backend(&self) -> bool {
        self.queue.iter().any(|e| matches!(e, Expect::Reply { .. }))
    }

    /// Moves the synthetic replies at the head of the queue to `out`.
    #[inline]
    pub fn drain_synthetic(&mut self, out: &mut Vec<u8>) {
        // Called for every message and reply frame; there is rarely one.
        if matches!(self.queue.front(), Some(Expect::Synthetic(_))) {
            self.move_synthetic(out);
        }
    }

    fn move_synthetic(&mut self, out: &mut Vec<u8>) {
        while matches!(self.queue.front(), Some(Expect::Synthetic(_))) {
            let Some(e) = self.queue.pop_front() else {
                break;
            };
            if let Expect::Synthetic(bytes) = &e {
                out.extend_from_slice(bytes);
            }
            if self.recording {
                self.journal.push(e);
            }
        }
    }

    /// Decides what to do with a reply frame; `body` is only read for `Z` and `C`.
    pub fn on_frame(&mut self, tag: u8, body: &[u8]) -> Result<Step, Desync> {
        let mut step = Step {
            action: Action::Forward,
            ready: None,
            copy_in: false,
            completion: None,
        };
        let front = match self.queue.front() {
            Some(Expect::Reply {
                kind,
                audience,
                stmt,
                raised,
            }) => Some((*kind, *audience, *stmt, *raised)),
            _ => None,
        };
        // Asynchronous messages may come at any time; they reach the client unless the
        // router's own silent exchange (a RESET after the client is done) caused them.
        if matches!(tag, b'N' | b'A' | b'S') {
            if matches!(front, Some((_, Audience::Silent, _, _))) {
                step.action = Action::Drop;
            }
            return Ok(step);
        }
        let (kind, audience, stmt, raised) = match front {
            Some(f) => f,
            None => {
                return Err(Desync {
                    tag: char::from(tag),
                    expecting: format!("{:?}", self.queue.front()),
                })
            }
        };
        // The router's injected messages stay hidden, except that their errors are the
        // client's errors (a failed injected Parse is why the client's Bind fails).
        step.action = match audience {
            Audience::Client | Audience::Router if tag == b'E' && raised => Action::ForwardRaised,
            Audience::Client => Action::Forward,
            Audience::Router if tag == b'E' => Action::Forward,
            _ => Action::Drop,
        };
        let done = match (kind, tag) {
            (_, b'E') if kind != Kind::Query && kind != Kind::Sync => {
                // Extended protocol: everything up to the next Sync is skipped by Postgres,
                // so drop the expectations (and synthetic replies) in between. What failed is
                // forgotten below: the request can no longer be sent again as it was.
                self.stop_recording();
                self.errored = true;
                if stmt != 0 {
                    self.failed.push((stmt, audience == Audience::Client));
                }
                self.queue.pop_front();
                while let Some(e) = self.queue.front() {
                    match e {
                        Expect::Reply {
                            kind: Kind::Sync, ..
                        } => break,
                        Expect::Reply { stmt, audience, .. } if *stmt != 0 => {
                            self.failed.push((*stmt, *audience == Audience::Client))
                        }
                        _ => {}
                    }
                    self.queue.pop_front();
                }
                self.mid = false;
                return Ok(step);
            }
            (Kind::Parse, b'1') | (Kind::Bind, b'2') | (Kind::Close, b'3') => true,
            (Kind::DescribeStatement, b't') if !self.mid => {
                self.mid = true;
                false
            }
            (Kind::DescribeStatement, b'T' | b'n') if self.mid => true,
            (Kind::DescribePortal, b'T' | b'n') => true,
            (Kind::DescribeRows, b'T') => true,
            (Kind::DescribeRows, b'n') => {
                step.action = Action::Drop;
                true
            }
            (Kind::Execute, b'D' | b'd' | b'c' | b'H' | b'W') => false,
            (Kind::Execute, b'G') => {
                step.copy_in = true;
                false
            }
            (Kind::Execute, b'C' | b'I' | b's') => {
                if tag == b'C' && audience == Audience::Client {
                    step.completion = Completion::of(body);
                }
                true
            }
            (Kind::Query, b'Z') | (Kind::Sync, b'Z') => {
                // Only the client's own Sync or Query speaks for its transaction status; the
                // router's exchanges (an injected BEGIN, a Sync outside the client's
                // transaction) do not.
                if audience == Audience::Client {
                    step.ready = body.first().copied().and_then(TxStatus::from_byte);
                    // The client's batch is over, and its errors with it.
                    self.errored = false;
                }
                true
            }
            (Kind::Query, b'E') => false,
            (Kind::Query, b'G') => {
                step.copy_in = true;
                false
            }
            (Kind::Query, b'C') => {
                if audience == Audience::Client {
                    step.completion = Completion::of(body);
                }
                false
            }
            (Kind::Query, _) => false,
            (Kind::Sync, b'E') => false,
            _ => {
                return Err(Desync {
                    tag: char::from(tag),
                    expecting: format!("{kind:?}"),
                })
            }
        };
        if done {
            self.mid = false;
            if let Some(e) = self.queue.pop_front() {
                if self.recording {
                    self.journal.push(e);
                }
            }
        }
        Ok(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(r: &mut Replies, frames: &[(u8, &[u8])]) -> Vec<Action> {
        frames
            .iter()
            .map(|(t, b)| r.on_frame(*t, b).unwrap().action)
            .collect()
    }

    #[test]
    fn a_rewind_expects_again_what_was_answered_since_recording_began() {
        let mut r = Replies::default();
        r.push(Kind::Parse, Audience::Router);
        r.push(Kind::Bind, Audience::Client);
        r.push_synthetic(b"n".to_vec());
        r.push(Kind::Execute, Audience::Client);
        r.push(Kind::Sync, Audience::Client);
        r.record();
        let mut out = Vec::new();
        assert_eq!(
            feed(&mut r, &[(b'1', b""), (b'2', b"")]),
            [Action::Drop, Action::Forward]
        );
        r.drain_synthetic(&mut out);
        assert_eq!(out, b"n");
        // The server aborted the request: all of it is expected again, in order, synthetic
        // reply included, and answered the same way.
        r.rewind();
        let mut again = Vec::new();
        assert_eq!(
            feed(&mut r, &[(b'1', b""), (b'2', b"")]),
            [Action::Drop, Action::Forward]
        );
        r.drain_synthetic(&mut again);
        assert_eq!(again, b"n");
        feed(&mut r, &[(b'C', b"SELECT 1\0"), (b'Z', b"I")]);
        assert!(r.is_empty());
        // Not recording: nothing is kept, and a rewind restores nothing.
        r.push(Kind::Sync, Audience::Client);
        feed(&mut r, &[(b'Z', b"I")]);
        r.rewind();
        assert!(r.is_empty());
    }

    #[test]
    fn injected_parse_is_hidden_and_synthetic_replies_keep_their_place() {
        let mut r = Replies::default();
        r.push_synthetic(b"1".to_vec());
        r.push(Kind::Parse, Audience::Router);
        r.push(Kind::Bind, Audience::Client);
        r.push(Kind::Execute, Audience::Client);
        r.push(Kind::Sync, Audience::Client);
        let mut out = Vec::new();
        r.drain_synthetic(&mut out);
        assert_eq!(out, b"1");
        let actions = feed(
            &mut r,
            &[
                (b'1', b""),
                (b'2', b""),
                (b'D', b"row"),
                (b'C', b"SELECT 1\0"),
                (b'Z', b"I"),
            ],
        );
        assert_eq!(
            actions,
            [
                Action::Drop,
                Action::Forward,
                Action::Forward,
                Action::Forward,
                Action::Forward
            ]
        );
        assert!(r.is_empty());
    }

    #[test]
    fn an_error_skips_to_sync() {
        let mut r = Replies::default();
        r.push(Kind::Parse, Audience::Router);
        r.push(Kind::Bind, Audience::Client);
        r.push_synthetic(b"x".to_vec());
        r.push(Kind::Execute, Audience::Client);
        r.push(Kind::Sync, Audience::Client);
        let e = r.on_frame(b'E', b"").unwrap();
        assert_eq!(
            e.action,
            Action::Forward,
            "an injected Parse's error is the client's error"
        );
        let z = r.on_frame(b'Z', b"I").unwrap();
        assert_eq!(z.ready, Some(TxStatus::Idle));
        assert!(r.is_empty());
    }

    #[test]
    fn failed_and_skipped_parses_are_reported() {
        let mut r = Replies::default();
        r.push_parse(7, Audience::Client);
        r.push(Kind::Bind, Audience::Client);
        r.push_parse(8, Audience::Router);
        r.push(Kind::Sync, Audience::Client);
        r.on_frame(b'1', b"").unwrap();
        r.on_frame(b'E', b"").unwrap();
        assert_eq!(r.take_failed().collect::<Vec<_>>(), [(8, false)]);
        r.on_frame(b'Z', b"I").unwrap();
        assert!(r.is_empty());
    }

    #[test]
    fn describe_statement_takes_two_replies() {
        let mut r = Replies::default();
        r.push(Kind::DescribeStatement, Audience::Client);
        r.push(Kind::Sync, Audience::Client);
        feed(&mut r, &[(b't', b""), (b'T', b"")]);
        assert!(r.awaits_backend(), "the Sync's ReadyForQuery is still owed");
        feed(&mut r, &[(b'Z', b"T")]);
        assert!(r.is_empty());
    }

    #[test]
    fn query_runs_until_ready_and_notes_set_and_copy() {
        let mut r = Replies::default();
        r.push(Kind::Query, Audience::Client);
        let s = r.on_frame(b'C', b"SET\0").unwrap();
        assert_eq!(s.completion, Some(Completion::Settings));
        let s = r.on_frame(b'G', b"").unwrap();
        assert!(s.copy_in);
        r.on_frame(b'E', b"").unwrap();
        let s = r.on_frame(b'Z', b"E").unwrap();
        assert_eq!(s.ready, Some(TxStatus::Failed));
        assert!(r.is_empty());
    }

    #[test]
    fn raised_errors_are_marked_and_the_client_ready_is_tracked() {
        let mut r = Replies::default();
        r.push(Kind::Parse, Audience::Silent);
        r.push(Kind::Bind, Audience::Silent);
        r.push_raised(Kind::Execute, Audience::Router);
        assert!(!r.owes_client_ready(), "no Sync of the client yet");
        r.on_frame(b'1', b"").unwrap();
        r.on_frame(b'2', b"").unwrap();
        assert_eq!(r.on_frame(b'E', b"").unwrap().action, Action::ForwardRaised);
        assert!(r.is_empty());
        r.push(Kind::Sync, Audience::Client);
        assert!(r.owes_client_ready());
        let mut r = Replies::default();
        r.push(Kind::Sync, Audience::Silent);
        assert!(!r.owes_client_ready());
        r.push_synthetic(b"Z\0\0\0\x05I".to_vec());
        assert!(
            r.owes_client_ready(),
            "the router's own ReadyForQuery for the client"
        );
    }

    #[test]
    fn silent_queries_hide_everything_and_stray_replies_are_desyncs() {
        let mut r = Replies::default();
        r.push(Kind::Query, Audience::Silent);
        assert_eq!(
            feed(&mut r, &[(b'C', b"BEGIN\0"), (b'E', b""), (b'Z', b"T")]),
            [Action::Drop; 3]
        );
        assert!(r.on_frame(b'D', b"").is_err());
        assert_eq!(r.on_frame(b'N', b"").unwrap().action, Action::Forward);
    }
}
