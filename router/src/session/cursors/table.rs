//! A session's cursors as data (sans-IO): where each lives, the rows of those the router holds
//! (and going forward through them), the merge of those it serves step by step, and what a
//! transaction's end takes away. The session's cursor statements (`super`) decide and do the
//! I/O.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::errors;
use crate::planner::cursor::{Count, Verb};
use crate::protocol::frame::frames;
use crate::protocol::reply::{self, SqlError};

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

/// A cursor the router holds: its answer, kept.
#[derive(Debug)]
pub(super) struct Kept {
    /// Its RowDescription (or NoData).
    pub(super) description: Vec<u8>,
    /// Its DataRow frames, back to back.
    pub(super) rows: Vec<u8>,
    /// Where the next row starts in `rows`.
    pub(super) at: usize,
    /// `WITH HOLD`: it outlives the transaction that declared it, if that one commits.
    pub(super) hold: bool,
    /// Declared inside the transaction under way.
    pub(super) pending: bool,
}

/// A cursor on several shards of the transaction, merged as FETCHes ask.
pub(super) struct Steps {
    pub(super) shards: Vec<usize>,
    pub(super) merge: crate::multishard::stepwise::Stepwise,
    /// The RowDescription (or NoData) of the first shard's cursor.
    pub(super) description: Vec<u8>,
    /// A protocol-level portal run with a row limit (the key is [`portal_key`] of the client's
    /// portal): the name of the portal on each shard, asked with Execute instead of FETCH.
    pub(super) portal: Option<String>,
}

/// The key of a client's protocol-level portal among the cursors (no SQL name holds a NUL).
pub(in crate::session) fn portal_key(portal: &str) -> String {
    format!("\0{portal}")
}

impl std::fmt::Debug for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steps")
            .field("shards", &self.shards)
            .finish()
    }
}

#[derive(Debug)]
pub(super) enum Place {
    Shard(usize),
    Held(Kept),
    Steps(Box<Steps>),
}

/// The session's cursors by name.
#[derive(Debug, Default)]
pub struct Cursors {
    pub(super) places: HashMap<String, Place>,
    /// What the held cursors hold, in bytes.
    pub(super) held_bytes: usize,
}

impl Cursors {
    /// The transaction under way ends (`committed`: with a COMMIT that takes effect): what it
    /// declared goes with it, except `WITH HOLD` cursors of a transaction that commits; cursors
    /// on shards end with it in any case.
    pub fn ending(&mut self, committed: bool) {
        self.retain(|p| match p {
            Place::Held(h) if h.hold && (committed || !h.pending) => {
                h.pending = false;
                true
            }
            _ => false,
        });
    }

    /// No transaction is open (it ended in a way the session did not see as COMMIT or
    /// ROLLBACK: a batch's Sync, a lost connection): what only lived in it is gone.
    pub fn outside_transaction(&mut self) {
        self.retain(|p| match p {
            Place::Held(h) if h.hold => {
                h.pending = false;
                true
            }
            _ => false,
        });
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&mut Place) -> bool) {
        if self.places.is_empty() {
            return;
        }
        let mut freed = 0;
        self.places.retain(|_, p| {
            let kept = keep(p);
            if let (false, Place::Held(h)) = (kept, &*p) {
                freed += h.rows.len() + h.description.len();
            }
            kept
        });
        self.held_bytes -= freed;
    }

    /// The RowDescription of a cursor the router serves (for Describe of its portal).
    pub fn description(&self, name: &str) -> Option<&[u8]> {
        match self.places.get(name) {
            Some(Place::Held(h)) => Some(&h.description),
            Some(Place::Steps(s)) => Some(&s.description),
            _ => None,
        }
    }

    pub(super) fn close(&mut self, name: &str) {
        if let Some(Place::Held(h)) = self.places.remove(name) {
            self.held_bytes -= h.rows.len() + h.description.len();
        }
    }

    /// Keeps a read's answer as cursor `name`'s rows: `Ok` with the answer's ParameterDescription
    /// (extended protocol), or `Err` with the shards' error to pass on.
    pub(super) fn keep(
        &mut self,
        name: String,
        answer: &[u8],
        hold: bool,
        pending: bool,
    ) -> Result<Vec<u8>, Vec<u8>> {
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
        self.close(&name);
        self.held_bytes += rows.len() + description.len();
        self.places.insert(
            name,
            Place::Held(Kept {
                description,
                rows,
                at: 0,
                hold,
                pending,
            }),
        );
        Ok(params)
    }
}

pub(super) fn forward_only() -> SqlError {
    SqlError::new(
        errors::FEATURE_NOT_SUPPORTED,
        "a cursor the router serves (its query reads several shards, or it is WITH HOLD) only moves forward",
    )
    .with_hint("use FETCH NEXT, FETCH FORWARD n or FETCH ALL; or give the query a key, so that the cursor lives on its shard")
}

impl Kept {
    /// FETCH (rows to `out`) or MOVE forward by `count`; writes the command tag.
    pub(super) fn advance(
        &mut self,
        verb: Verb,
        count: Count,
        out: &mut Vec<u8>,
    ) -> Result<(), SqlError> {
        let want = match count {
            Count::Forward(n) => n,
            Count::All => u64::MAX,
            Count::Other => return Err(forward_only()),
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
