//! The client's SQL cursors (`DECLARE`, `FETCH`, `MOVE`, `CLOSE`): where each lives, and the
//! rows of those the router holds.
//!
//! A cursor declared inside a transaction whose query runs on one shard lives on that shard:
//! the DECLARE goes there, and every command naming it follows it (a transaction that spans
//! shards moves back to that shard for it), so it fetches on demand, scrolls, and sees what
//! Postgres's own cursor sees. Two kinds no single shard can hold, the router holds itself:
//! a cursor whose query reads several shards, and a `WITH HOLD` cursor, which outlives its
//! transaction while the connection goes back to its pool. For those the query runs at
//! DECLARE, as a read across shards merged as always (inside the client's transaction, on its
//! connections), and its answer is kept, at most `limits.max_merge_bytes` for all of a
//! session's held cursors; FETCH and MOVE go forward through it. As with Postgres's cursors,
//! the rows are those of the moment of DECLARE. Held cursors are served in the simple query
//! protocol (which is how psycopg, and so Django, fetch), and go only forward.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::state::Batch;
use super::{Session, SessionError};
use crate::errors;
use crate::planner::cursor::{self, Count, Verb};
use crate::protocol::frame::frames;
use crate::protocol::reply::{self, SqlError};
use crate::resolver::{Dest, Read};

/// Where a statement's answer goes when the router keeps it: bytes, up to a limit (a write past
/// it fails, which stops the read).
#[derive(Default)]
pub struct Keep {
    bytes: Vec<u8>,
    limit: usize,
}

impl Keep {
    pub fn new(limit: usize) -> Keep {
        Keep {
            bytes: Vec::new(),
            limit,
        }
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

impl AsyncWrite for Keep {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.bytes.len() + buf.len() > self.limit {
            return Poll::Ready(Err(std::io::Error::other("over the cursor's limit")));
        }
        self.bytes.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Keep {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // Nothing is ever read from a kept answer: end of stream.
        Poll::Ready(Ok(()))
    }
}

/// A cursor the router holds.
#[derive(Debug)]
struct Held {
    /// Its RowDescription (or NoData).
    description: Vec<u8>,
    /// Its DataRow frames, back to back.
    rows: Vec<u8>,
    /// Where the next row starts in `rows`.
    at: usize,
    /// `WITH HOLD`: it outlives the transaction that declared it.
    hold: bool,
}

#[derive(Debug)]
enum Place {
    Shard(usize),
    Held(Held),
}

/// The session's cursors by name.
#[derive(Debug, Default)]
pub struct Cursors {
    places: HashMap<String, Place>,
    /// What the held cursors hold, in bytes.
    held_bytes: usize,
}

impl Cursors {
    /// Forgets what the end of a transaction closed: cursors on shards, held ones without HOLD.
    pub fn transaction_ended(&mut self) {
        if self.places.is_empty() {
            return;
        }
        let mut freed = 0;
        self.places.retain(|_, p| match p {
            Place::Held(h) if h.hold => true,
            Place::Held(h) => {
                freed += h.rows.len() + h.description.len();
                false
            }
            Place::Shard(_) => false,
        });
        self.held_bytes -= freed;
    }

    fn held(&self, name: &str) -> Option<&Held> {
        match self.places.get(name) {
            Some(Place::Held(h)) => Some(h),
            _ => None,
        }
    }

    /// The RowDescription of a cursor the router holds (for Describe of its portal).
    pub fn description(&self, name: &str) -> Option<&[u8]> {
        self.held(name).map(|h| &h.description[..])
    }

    fn close(&mut self, name: &str) -> bool {
        match self.places.remove(name) {
            Some(Place::Held(h)) => {
                self.held_bytes -= h.rows.len() + h.description.len();
                true
            }
            Some(Place::Shard(_)) => true,
            None => false,
        }
    }

    /// Keeps a read's answer as cursor `name`'s rows: `Ok` with the answer's ParameterDescription
    /// (extended protocol), or `Err` with the shards' error to pass on.
    fn keep(&mut self, name: String, answer: &[u8], hold: bool) -> Result<Vec<u8>, Vec<u8>> {
        let mut params = Vec::new();
        let mut description = Vec::new();
        let mut rows = Vec::with_capacity(answer.len());
        for frame in frames(answer).map_while(Result::ok) {
            match frame[0] {
                b't' => params = frame.to_vec(),
                // The last one is the portal's (extended) or the only one (simple).
                b'T' | b'n' => description = frame.to_vec(),
                b'D' => rows.extend_from_slice(frame),
                b'E' => return Err(frame.to_vec()),
                _ => {}
            }
        }
        self.held_bytes += rows.len() + description.len();
        self.places.insert(
            name,
            Place::Held(Held {
                description,
                rows,
                at: 0,
                hold,
            }),
        );
        Ok(params)
    }
}

impl Held {
    /// FETCH (rows to `out`) or MOVE forward by `count`; writes the command tag.
    fn advance(&mut self, verb: Verb, count: Count, out: &mut Vec<u8>) -> Result<(), SqlError> {
        let want = match count {
            Count::Forward(n) => n,
            Count::All => u64::MAX,
            Count::Other => {
                return Err(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "a cursor the router holds (its query reads several shards, or it is WITH HOLD) only moves forward",
                )
                .with_hint("use FETCH NEXT, FETCH FORWARD n or FETCH ALL; or give the query a key, so that the cursor lives on its shard"))
            }
        };
        if verb == Verb::Fetch && self.description.first() == Some(&b'T') {
            out.extend_from_slice(&self.description);
        }
        let mut n = 0u64;
        let mut end = self.at;
        for frame in frames(&self.rows[self.at..]).map_while(Result::ok) {
            if n == want {
                break;
            }
            end += frame.len();
            n += 1;
        }
        if verb == Verb::Fetch {
            out.extend_from_slice(&self.rows[self.at..end]);
        }
        self.at = end;
        let tag = if verb == Verb::Fetch { "FETCH" } else { "MOVE" };
        reply::command_complete(out, &format!("{tag} {n}"));
        Ok(())
    }
}

/// What the session does with a cursor statement.
pub(super) enum CursorWork {
    /// Runs where this says, as any statement.
    Route(Dest),
    /// Runs the read now and keeps its answer as cursor `name`.
    Declare {
        name: String,
        hold: bool,
        read: Read,
    },
    /// A command on a cursor the router holds (or `CLOSE ALL` with none on a shard): the router
    /// answers it.
    Serve,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// What a DECLARE or a cursor command comes to (the module documentation says why).
    pub(super) fn cursor_work(&mut self, dest: Dest) -> CursorWork {
        if !self.in_transaction() {
            self.cursors.transaction_ended();
        }
        match dest {
            Dest::Cursor { name: None } => {
                let on_shards = self
                    .cursors
                    .places
                    .values()
                    .any(|p| matches!(p, Place::Shard(_)));
                let held: Vec<String> = self.cursors.places.keys().cloned().collect();
                for name in held {
                    self.cursors.close(&name);
                }
                if on_shards && self.pin.is_some() {
                    CursorWork::Route(Dest::Any)
                } else {
                    CursorWork::Serve
                }
            }
            Dest::Cursor { name: Some(name) } => match self.cursors.places.get(&name) {
                Some(Place::Held(_)) => CursorWork::Serve,
                Some(Place::Shard(s)) => CursorWork::Route(Dest::Shard(*s)),
                // Postgres says what it thinks of a cursor no one declared.
                None => CursorWork::Route(Dest::Any),
            },
            Dest::Declare { name, hold, query } => {
                if self.cursors.held(&name).is_some() {
                    return CursorWork::Route(Dest::Refused(SqlError::new(
                        errors::DUPLICATE_CURSOR,
                        format!("cursor \"{name}\" already exists"),
                    )));
                }
                let in_transaction = self.in_transaction();
                let one = |shard: usize| Read {
                    shards: vec![shard],
                    keyed: true,
                    merge: None,
                    limit: None,
                    offset: 0,
                    shard_sql: None,
                    labels: false,
                };
                match *query {
                    Dest::Refused(e) => CursorWork::Route(Dest::Refused(e)),
                    Dest::Shard(s) if !hold => {
                        if in_transaction {
                            self.cursors.places.insert(name, Place::Shard(s));
                        }
                        // Outside a transaction Postgres refuses it, as it should be.
                        CursorWork::Route(Dest::Shard(s))
                    }
                    Dest::Any if !hold => CursorWork::Route(Dest::Any),
                    _ if !hold && !in_transaction => {
                        CursorWork::Route(Dest::Refused(SqlError::new(
                            errors::NO_ACTIVE_SQL_TRANSACTION,
                            "DECLARE CURSOR can only be used in transaction blocks",
                        )))
                    }
                    Dest::Read(read) => CursorWork::Declare { name, hold, read },
                    Dest::Shard(s) => CursorWork::Declare {
                        name,
                        hold,
                        read: one(s),
                    },
                    Dest::Any => {
                        let shard = self
                            .pinned_shard()
                            .unwrap_or_else(|| self.routing.map.default_shard());
                        CursorWork::Declare {
                            name,
                            hold,
                            read: one(shard),
                        }
                    }
                    _ => CursorWork::Route(Dest::Refused(SqlError::new(
                        errors::FEATURE_NOT_SUPPORTED,
                        "a cursor's query must be a read",
                    ))),
                }
            }
            other => CursorWork::Route(other),
        }
    }

    /// Answers a FETCH, MOVE or CLOSE of a cursor the router holds (simple protocol).
    pub(super) fn serve_cursor(&mut self, sql: &str) {
        let Some(command) = cursor::command(sql) else {
            return self.refuse_here(&SqlError::new(
                errors::SYNTAX_ERROR,
                "the router could not read this cursor command",
            ));
        };
        let Some(name) = command.name else {
            reply::command_complete(&mut self.client.out, "CLOSE CURSOR");
            return;
        };
        if command.verb == Verb::Close {
            self.cursors.close(&name);
            reply::command_complete(&mut self.client.out, "CLOSE CURSOR");
            return;
        }
        let result = match self.cursors.places.get_mut(&name) {
            Some(Place::Held(h)) => h.advance(command.verb, command.count, &mut self.client.out),
            _ => Err(SqlError::new(
                "34000",
                format!("cursor \"{name}\" does not exist"),
            )),
        };
        if let Err(e) = result {
            self.refuse_here(&e);
        }
    }

    /// Runs a held cursor's read and keeps its answer. `extended`: the client's messages of
    /// the batch to answer (`asked`), else a simple query. `Ok(true)` when it failed (the
    /// client has the error).
    pub(super) async fn declare_held(
        &mut self,
        name: String,
        hold: bool,
        read: Read,
        request: Vec<u8>,
        extended: Option<&[u8]>,
    ) -> Result<bool, SessionError> {
        let limit = self.routing.config.limits.max_merge_bytes;
        let room = limit.saturating_sub(self.cursors.held_bytes);
        // The statement's descriptions come first in an extended answer: what the client's
        // Describe messages are answered with.
        let asked: &[u8] = if extended.is_some() { b"SD" } else { b"" };
        let answer = match self.read_kept(&read, request, asked, room).await? {
            Ok(answer) => answer,
            Err(None) => return Ok(true),
            Err(Some(e)) => {
                let e = if room < limit {
                    errors::cursor_too_big(limit)
                } else {
                    e
                };
                self.refuse_here(&e);
                return Ok(true);
            }
        };
        match self.cursors.keep(name, &answer, hold) {
            Err(error) => {
                self.client.out.extend_from_slice(&error);
                Ok(true)
            }
            Ok(params) => {
                let out = &mut self.client.out;
                for &k in extended.unwrap_or_default() {
                    match k {
                        b'P' => reply::parse_complete(out),
                        b'S' => {
                            if params.is_empty() {
                                super::extended::no_data_description(out, b'S');
                            } else {
                                out.extend_from_slice(&params);
                                crate::protocol::frame::put_frame(out, b'n', &[]);
                            }
                        }
                        b'B' => reply::bind_complete(out),
                        b'D' => super::extended::no_data_description(out, b'P'),
                        _ => reply::close_complete(out),
                    }
                }
                reply::command_complete(out, "DECLARE CURSOR");
                Ok(false)
            }
        }
    }

    /// Describe of a portal that is a cursor the router holds, alone in its batch so far (as
    /// psycopg sends it after DECLARE): answered with its description. `false`: not such.
    pub(super) fn describe_held_cursor(&mut self, name: &str) -> bool {
        let Some(description) = self.cursors.description(name) else {
            return false;
        };
        if matches!(self.state.batch, Batch::Held) && !self.state.held().is_empty() {
            return false;
        }
        let description = description.to_vec();
        self.out.replies.push_synthetic(description);
        true
    }
}
