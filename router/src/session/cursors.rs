//! The client's SQL cursors (`DECLARE`, `FETCH`, `MOVE`, `CLOSE`): where each lives, and the
//! rows of those the router serves.
//!
//! - A cursor declared inside a transaction whose query runs on one shard **lives on that
//!   shard**: the DECLARE goes there, and every command naming it follows it (a transaction
//!   that spans shards moves back to that shard for it). It fetches on demand and scrolls as
//!   Postgres's own cursors do.
//! - A cursor declared inside a transaction whose query reads several shards, concatenated or
//!   sorted, is **a cursor on each of those shards** (inside the transaction, on its
//!   connections) that the router merges **step by step** (`crate::multishard::stepwise`):
//!   a FETCH asks the shards for only as many rows as it needs, so the router holds at most a
//!   batch of rows per shard, whatever the size of the result.
//! - A `WITH HOLD` cursor outlives its transaction, while the transaction's connections go back
//!   to their pools, and a grouped read across shards can only be merged whole. For those the
//!   router **holds the answer**: the query runs at DECLARE (inside the client's transaction,
//!   if one is open), merged as any read, and its rows are kept, at most
//!   `limits.max_merge_bytes` for all of a session's held cursors. Postgres itself keeps a
//!   `WITH HOLD` cursor's rows at COMMIT in the same way.
//!
//! Cursors served by the router go forward only and are served in the simple query protocol
//! (which is how psycopg, and so Django, fetch). As with Postgres's cursors, their rows are
//! those of the moment of DECLARE.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::state::{Batch, Tx};
use super::{Session, SessionError};
use crate::errors;
use crate::multishard::stepwise::Step;
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
    /// `WITH HOLD`: it outlives the transaction that declared it, if that one commits.
    hold: bool,
    /// Declared inside the transaction under way.
    pending: bool,
}

/// A cursor on several shards of the transaction, merged as FETCHes ask.
struct Steps {
    shards: Vec<usize>,
    merge: crate::multishard::stepwise::Stepwise,
    /// The RowDescription (or NoData) of the first shard's cursor.
    description: Vec<u8>,
    /// A protocol-level portal run with a row limit (the key is [`portal_key`] of the client's
    /// portal): the name of the portal on each shard, asked with Execute instead of FETCH.
    portal: Option<String>,
}

/// The key of a client's protocol-level portal among the cursors (no SQL name holds a NUL).
pub(super) fn portal_key(portal: &str) -> String {
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
enum Place {
    Shard(usize),
    Held(Held),
    Steps(Box<Steps>),
}

/// The session's cursors by name.
#[derive(Debug, Default)]
pub struct Cursors {
    places: HashMap<String, Place>,
    /// What the held cursors hold, in bytes.
    held_bytes: usize,
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

    fn retain(&mut self, mut keep: impl FnMut(&mut Place) -> bool) {
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

    fn close(&mut self, name: &str) {
        if let Some(Place::Held(h)) = self.places.remove(name) {
            self.held_bytes -= h.rows.len() + h.description.len();
        }
    }

    /// Keeps a read's answer as cursor `name`'s rows: `Ok` with the answer's ParameterDescription
    /// (extended protocol), or `Err` with the shards' error to pass on.
    fn keep(
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
            Place::Held(Held {
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

/// The step-by-step merge of `read`, whose rows the shards describe with `description` (the
/// sort keys are found in its columns).
fn stepwise_merge(
    read: &Read,
    description: &[u8],
    text_bytewise: bool,
) -> Result<crate::multishard::stepwise::Stepwise, SqlError> {
    let order = match (&read.merge, description.first()) {
        (Some(plan), Some(b'T')) => {
            let columns = crate::merge::columns(&description[5..])
                .map_err(|e| errors::internal(e.message()))?;
            let keys = crate::multishard::merged::sort_keys(plan, &columns, text_bytewise)?;
            Some((keys, columns))
        }
        _ => None,
    };
    Ok(crate::multishard::stepwise::Stepwise::new(
        read.shards.len(),
        order,
        read.offset,
        read.limit,
    ))
}

/// What the shards run for a cursor the router serves, declared by `declare` (the client's
/// DECLARE text): a DECLARE of their own for one merged step by step, else the read itself.
pub(super) fn shard_text(declare: &str, name: &str, read: &Read, stepwise: bool) -> String {
    let query = cursor::declare_query(declare).map_or(declare, |at| &declare[at..]);
    let query = read.shard_sql.as_deref().unwrap_or(query);
    if stepwise {
        shard_declare(name, query)
    } else {
        query.to_string()
    }
}

/// The router's answer to a DECLARE it ran: the batch's messages (`asked`; `params` is the
/// statement's ParameterDescription, if the shards gave one), then the command tag.
fn answer_declare(out: &mut Vec<u8>, asked: &[u8], params: &[u8]) {
    for &k in asked {
        match k {
            b'P' => reply::parse_complete(out),
            b'S' if params.is_empty() => super::extended::no_data_description(out, b'S'),
            b'S' => {
                out.extend_from_slice(params);
                crate::protocol::frame::put_frame(out, b'n', &[]);
            }
            b'B' => reply::bind_complete(out),
            b'D' => super::extended::no_data_description(out, b'P'),
            _ => reply::close_complete(out),
        }
    }
    reply::command_complete(out, "DECLARE CURSOR");
}

fn forward_only() -> SqlError {
    SqlError::new(
        errors::FEATURE_NOT_SUPPORTED,
        "a cursor the router serves (its query reads several shards, or it is WITH HOLD) only moves forward",
    )
    .with_hint("use FETCH NEXT, FETCH FORWARD n or FETCH ALL; or give the query a key, so that the cursor lives on its shard")
}

/// What each shard runs to declare its part of a cursor merged step by step.
fn shard_declare(name: &str, query: &str) -> String {
    format!("DECLARE {} NO SCROLL CURSOR FOR {query}", quote_ident(name))
}

/// A name as a quoted identifier.
pub(super) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn simple_query(sql: &str) -> Result<Vec<u8>, SessionError> {
    let mut q = bytes::BytesMut::new();
    crate::protocol::request::query(&mut q, sql)?;
    Ok(q.to_vec())
}

impl Held {
    /// FETCH (rows to `out`) or MOVE forward by `count`; writes the command tag.
    fn advance(&mut self, verb: Verb, count: Count, out: &mut Vec<u8>) -> Result<(), SqlError> {
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

/// What the session does with a cursor statement.
pub(super) enum CursorWork {
    /// Runs where this says, as any statement.
    Route(Dest),
    /// A cursor the router serves: merged step by step from cursors on the shards
    /// (`stepwise`), or its read run now and its answer kept.
    Declare {
        name: String,
        hold: bool,
        read: Read,
        stepwise: bool,
    },
    /// A command on a cursor the router serves: the router answers it.
    Serve,
    /// `CLOSE ALL` with cursors on these shards (more than one) of the transaction.
    CloseAll(Vec<usize>),
}

/// The outcome of a held cursor's DECLARE.
pub(super) enum Declared {
    Done,
    /// The client has the shards' error.
    Failed,
    /// The router's error, for the caller to raise where the transaction is.
    Refused(SqlError),
}

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// A COMMIT or ROLLBACK about to end the transaction ends what it declared too.
    pub(super) fn cursors_at(&mut self, dest: &Dest) {
        if let Dest::Commit | Dest::Rollback = dest {
            let committed = matches!(dest, Dest::Commit) && self.state.tx != Tx::Failed;
            self.cursors.ending(committed);
        }
    }

    /// What a DECLARE or a cursor command comes to (the module documentation says why).
    pub(super) fn cursor_work(&mut self, dest: Dest) -> CursorWork {
        if !self.in_transaction() {
            self.cursors.outside_transaction();
        }
        if self.state.tx == Tx::Failed && self.pin.is_some() {
            // The backend refuses it as Postgres does (25P02).
            return CursorWork::Route(Dest::Any);
        }
        match dest {
            Dest::Cursor { name: None, .. } => {
                let mut shards: Vec<usize> = Vec::new();
                for p in self.cursors.places.values() {
                    match p {
                        Place::Shard(s) => shards.push(*s),
                        Place::Steps(steps) => shards.extend_from_slice(&steps.shards),
                        Place::Held(_) => {}
                    }
                }
                shards.sort_unstable();
                shards.dedup();
                self.cursors.retain(|_| false);
                match shards.as_slice() {
                    [] if self.pin.is_some() => CursorWork::Route(Dest::Any),
                    [] => CursorWork::Serve,
                    [one] => CursorWork::Route(Dest::Shard(*one)),
                    _ => CursorWork::CloseAll(shards),
                }
            }
            Dest::Cursor {
                name: Some(name),
                close,
            } => match self.cursors.places.get(&name) {
                Some(Place::Held(_) | Place::Steps(_)) => CursorWork::Serve,
                Some(&Place::Shard(s)) => {
                    if close {
                        self.cursors.places.remove(&name);
                    }
                    CursorWork::Route(Dest::Shard(s))
                }
                // Postgres says what it thinks of a cursor no one declared.
                None => CursorWork::Route(Dest::Any),
            },
            Dest::Declare {
                name,
                hold,
                binary,
                query,
            } => {
                if self.cursors.places.contains_key(&name) {
                    return CursorWork::Route(Dest::Refused(SqlError::new(
                        errors::DUPLICATE_CURSOR,
                        format!("cursor \"{name}\" already exists"),
                    )));
                }
                let in_transaction = self.in_transaction();
                let here = self
                    .pinned_shard()
                    .unwrap_or_else(|| self.routing.map.default_shard());
                let on_shard = match *query {
                    Dest::Refused(e) => return CursorWork::Route(Dest::Refused(e)),
                    Dest::Shard(s) => Some(s),
                    Dest::Any => Some(here),
                    _ => None,
                };
                if let (Some(s), false) = (on_shard, hold) {
                    if in_transaction {
                        self.cursors.places.insert(name, Place::Shard(s));
                    }
                    // Outside a transaction Postgres refuses it, as it should be.
                    return CursorWork::Route(Dest::Shard(s));
                }
                if !hold && !in_transaction {
                    return CursorWork::Route(Dest::Refused(SqlError::new(
                        errors::NO_ACTIVE_SQL_TRANSACTION,
                        "DECLARE CURSOR can only be used in transaction blocks",
                    )));
                }
                if binary {
                    return CursorWork::Route(Dest::Refused(SqlError::new(
                        errors::FEATURE_NOT_SUPPORTED,
                        "a BINARY cursor over several shards, or WITH HOLD, is not supported: the router holds such cursors and sends their rows as text",
                    )));
                }
                let read = match (*query, on_shard) {
                    (Dest::Read(read), _) => read,
                    (_, Some(shard)) => Read {
                        shards: vec![shard],
                        keyed: true,
                        merge: None,
                        limit: None,
                        offset: 0,
                        shard_sql: None,
                        labels: false,
                    },
                    _ => {
                        return CursorWork::Route(Dest::Refused(SqlError::new(
                            errors::FEATURE_NOT_SUPPORTED,
                            "a cursor's query must be a read",
                        )))
                    }
                };
                // Merged a few rows at a time from cursors on the shards, unless it must outlive
                // the transaction or can only be merged whole.
                let stepwise =
                    !hold && !read.labels && read.merge.as_ref().is_none_or(|m| m.group.is_none());
                CursorWork::Declare {
                    name,
                    hold,
                    read,
                    stepwise,
                }
            }
            other => CursorWork::Route(other),
        }
    }

    /// Answers a FETCH, MOVE or CLOSE of a cursor the router serves (simple protocol); the
    /// router's error, if any, for the caller to raise where the transaction is (an error of a
    /// shard is the client's already, and `Ok`).
    pub(super) async fn serve_cursor(
        &mut self,
        sql: &str,
    ) -> Result<Result<(), SqlError>, SessionError> {
        let Some(command) = cursor::command(sql) else {
            return Ok(Err(SqlError::new(
                errors::SYNTAX_ERROR,
                "the router could not read this cursor command",
            )));
        };
        let Some(name) = command.name else {
            reply::command_complete(&mut self.client.out, "CLOSE CURSOR ALL");
            return Ok(Ok(()));
        };
        if command.verb == Verb::Close {
            if let Some(Place::Steps(steps)) = self.cursors.places.get(&name) {
                let shards = steps.shards.clone();
                let request = simple_query(&format!("CLOSE {}", quote_ident(&name)))?;
                if let Some(answers) = self.ask_in_transaction(&shards, request).await? {
                    if let Some(error) = answers.iter().find_map(|a| super::multi::error_frame(a)) {
                        self.client.out.extend_from_slice(error);
                        return Ok(Ok(()));
                    }
                }
            }
            self.cursors.close(&name);
            reply::command_complete(&mut self.client.out, "CLOSE CURSOR");
            return Ok(Ok(()));
        }
        match self.cursors.places.get_mut(&name) {
            Some(Place::Held(h)) => {
                Ok(h.advance(command.verb, command.count, &mut self.client.out))
            }
            Some(Place::Steps(_)) => self.step(&name, command.verb, command.count).await,
            _ => Ok(Err(SqlError::new(
                errors::INVALID_CURSOR_NAME,
                format!("cursor \"{name}\" does not exist"),
            ))),
        }
    }

    /// FETCH or MOVE of a cursor merged step by step.
    async fn step(
        &mut self,
        name: &str,
        verb: Verb,
        count: Count,
    ) -> Result<Result<(), SqlError>, SessionError> {
        let want = match count {
            Count::Forward(n) => n,
            Count::All => u64::MAX,
            Count::Other => return Ok(Err(forward_only())),
        };
        let fetch = verb == Verb::Fetch;
        let mut out = Vec::new();
        if let (true, Some(Place::Steps(steps))) = (fetch, self.cursors.places.get(name)) {
            if steps.description.first() == Some(&b'T') {
                out.extend_from_slice(&steps.description);
            }
        }
        let n = match self.pull(name, want, fetch, &mut out, false).await? {
            Ok(Some((n, _))) => n,
            Ok(None) => return Ok(Ok(())),
            Err(e) => return Ok(Err(e)),
        };
        self.client.out.append(&mut out);
        let tag = if fetch { "FETCH" } else { "MOVE" };
        reply::command_complete(&mut self.client.out, &format!("{tag} {n}"));
        Ok(Ok(()))
    }

    /// Up to `want` merged rows of the stepwise cursor `key`, appended to `out` when `keep`;
    /// the shards are asked for rows as the merge needs them. `Some((rows, more))` (`more`,
    /// learned when `peek`: a row is left), `None` when the client has a shard's error.
    async fn pull(
        &mut self,
        key: &str,
        want: u64,
        keep: bool,
        out: &mut Vec<u8>,
        peek: bool,
    ) -> Result<Result<Option<(u64, bool)>, SqlError>, SessionError> {
        let mut n = 0u64;
        loop {
            let Some(Place::Steps(steps)) = self.cursors.places.get_mut(key) else {
                return Ok(Ok(Some((n, false))));
            };
            if n == want && !peek {
                return Ok(Ok(Some((n, false))));
            }
            let need = match steps.merge.step() {
                Ok(Step::Row(row)) if n == want => {
                    steps.merge.unstep(row);
                    return Ok(Ok(Some((n, true))));
                }
                Ok(Step::Row(row)) => {
                    if keep {
                        out.extend_from_slice(&row);
                    }
                    n += 1;
                    continue;
                }
                Ok(Step::End) => return Ok(Ok(Some((n, false)))),
                Ok(Step::Need(need)) => need,
                Err(e) => {
                    return Ok(Err(SqlError::new(
                        errors::FEATURE_NOT_SUPPORTED,
                        format!("cannot merge the shards' answers: {}", e.message()),
                    )))
                }
            };
            let asked = steps.merge.batch(want.saturating_sub(n).max(1));
            let shards: Vec<usize> = need.iter().map(|&i| steps.shards[i]).collect();
            let mut request = bytes::BytesMut::new();
            match &steps.portal {
                Some(portal) => {
                    let rows = i32::try_from(asked).unwrap_or(i32::MAX);
                    crate::protocol::request::execute_portal(&mut request, portal, rows)?;
                    crate::protocol::request::sync(&mut request);
                }
                None => crate::protocol::request::query(
                    &mut request,
                    &format!("FETCH FORWARD {asked} FROM {}", quote_ident(key)),
                )?,
            }
            let Some(answers) = self.ask_in_transaction(&shards, request.to_vec()).await? else {
                return Ok(Ok(None));
            };
            let Some(Place::Steps(steps)) = self.cursors.places.get_mut(key) else {
                return Ok(Ok(Some((n, false))));
            };
            for (&i, answer) in need.iter().zip(&answers) {
                if let Err(error) = steps.merge.feed(i, answer, asked) {
                    // The transaction failed; the merge is not to be served again.
                    self.cursors.places.remove(key);
                    self.client.out.extend_from_slice(&error);
                    return Ok(Ok(None));
                }
            }
            if keep && out.len() >= super::client::FLUSH_AT {
                self.client.out.append(out);
                self.client.flush().await.map_err(SessionError::Client)?;
            }
        }
    }

    /// The first Execute, with a row limit, of a portal that reads several shards inside a
    /// transaction (pgjdbc with a fetch size): the portal is bound on each shard (`request`:
    /// Parse, Describe, Bind of `shard_portal`, Describe of it, Sync) and merged step by step;
    /// this Execute gets `max_rows` rows, then PortalSuspended, or its CommandComplete when no
    /// row is left. `asked`: the batch's messages to answer first. `Ok(true)` when it failed.
    pub(super) async fn portal_in_steps(
        &mut self,
        portal: &str,
        shard_portal: String,
        read: Read,
        request: Vec<u8>,
        max_rows: u64,
        asked: &[u8],
    ) -> Result<bool, SessionError> {
        let Some(answers) = self.ask_in_transaction(&read.shards, request).await? else {
            return Ok(true);
        };
        if let Some(error) = answers.iter().find_map(|a| super::multi::error_frame(a)) {
            self.client.out.extend_from_slice(error);
            return Ok(true);
        }
        // Shard 0's descriptions: `t` and the statement's `T`/`n` (what Describe of the
        // statement answers), then the portal's `T`/`n`.
        let (mut statement, mut portal_desc) = (Vec::new(), Vec::new());
        let mut descriptions = 0;
        for f in frames(answers.first().map_or(&[][..], |a| &a[..])).map_while(Result::ok) {
            match f[0] {
                b't' => statement.extend_from_slice(f),
                b'T' | b'n' if descriptions == 0 => {
                    statement.extend_from_slice(f);
                    descriptions += 1;
                }
                b'T' | b'n' => portal_desc = f.to_vec(),
                _ => {}
            }
        }
        let merge = match stepwise_merge(&read, &portal_desc, self.routing.text_bytewise()) {
            Ok(merge) => merge,
            Err(e) => {
                e.write(&mut self.client.out);
                return Ok(true);
            }
        };
        let key = portal_key(portal);
        self.cursors.places.insert(
            key.clone(),
            Place::Steps(Box::new(Steps {
                shards: read.shards,
                merge,
                description: portal_desc.clone(),
                portal: Some(shard_portal),
            })),
        );
        crate::multishard::gather::answer_asked(
            &mut self.client.out,
            asked,
            &statement,
            &portal_desc,
        );
        self.execute_portal(&key, max_rows).await
    }

    /// An Execute of a portal merged step by step: up to `max_rows` rows (0: all), then
    /// PortalSuspended or CommandComplete. `Ok(true)` when it failed.
    pub(super) async fn execute_portal(
        &mut self,
        key: &str,
        max_rows: u64,
    ) -> Result<bool, SessionError> {
        let want = if max_rows == 0 { u64::MAX } else { max_rows };
        let mut out = Vec::new();
        match self.pull(key, want, true, &mut out, max_rows > 0).await? {
            Ok(Some((n, more))) => {
                self.client.out.append(&mut out);
                if more {
                    crate::protocol::frame::put_frame(&mut self.client.out, b's', &[]);
                } else {
                    reply::command_complete(&mut self.client.out, &format!("SELECT {n}"));
                }
                Ok(false)
            }
            Ok(None) => Ok(true),
            Err(e) => {
                e.write(&mut self.client.out);
                Ok(true)
            }
        }
    }

    /// Whether `portal` is a client's portal merged step by step.
    pub(super) fn is_portal_in_steps(&self, portal: &str) -> bool {
        !portal.is_empty() && self.cursors.places.contains_key(&portal_key(portal))
    }

    /// Close of a portal merged step by step: closed on its shards too.
    pub(super) async fn close_portal(&mut self, portal: &str) -> Result<(), SessionError> {
        let key = portal_key(portal);
        if let Some(Place::Steps(steps)) = self.cursors.places.remove(&key) {
            if let Some(shard_portal) = &steps.portal {
                let mut request = bytes::BytesMut::new();
                crate::protocol::request::close_portal(&mut request, shard_portal)?;
                crate::protocol::request::sync(&mut request);
                self.ask_in_transaction(&steps.shards, request.to_vec())
                    .await?;
            }
        }
        reply::close_complete(&mut self.client.out);
        Ok(())
    }

    /// DECLARE of a cursor merged step by step: the cursor is declared on each shard of the
    /// read (`request`, the shards' DECLARE), and the first one's description kept.
    pub(super) async fn declare_stepwise(
        &mut self,
        name: String,
        read: Read,
        request: Vec<u8>,
        extended: Option<&[u8]>,
    ) -> Result<Declared, SessionError> {
        let Some(answers) = self.ask_in_transaction(&read.shards, request).await? else {
            return Ok(Declared::Failed);
        };
        if let Some(error) = answers.iter().find_map(|a| super::multi::error_frame(a)) {
            self.client.out.extend_from_slice(error);
            return Ok(Declared::Failed);
        }
        // The statement's ParameterDescription, when the extended DECLARE asked for one.
        let params = answers
            .first()
            .and_then(|a| frames(a).map_while(Result::ok).find(|f| f[0] == b't'))
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        let mut describe = bytes::BytesMut::new();
        crate::protocol::request::describe_named_portal(&mut describe, &name)?;
        crate::protocol::request::sync(&mut describe);
        let first = read.shards.first().copied().unwrap_or_default();
        let Some(described) = self.ask_in_transaction(&[first], describe.to_vec()).await? else {
            return Ok(Declared::Failed);
        };
        let description = described
            .first()
            .and_then(|a| {
                frames(a)
                    .map_while(Result::ok)
                    .find(|f| matches!(f[0], b'T' | b'n' | b'E'))
            })
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        if description.first() == Some(&b'E') {
            self.client.out.extend_from_slice(&description);
            return Ok(Declared::Failed);
        }
        let merge = match stepwise_merge(&read, &description, self.routing.text_bytewise()) {
            Ok(merge) => merge,
            Err(e) => return Ok(Declared::Refused(e)),
        };
        self.cursors.places.insert(
            name,
            Place::Steps(Box::new(Steps {
                shards: read.shards,
                merge,
                description,
                portal: None,
            })),
        );
        answer_declare(&mut self.client.out, extended.unwrap_or_default(), &params);
        Ok(Declared::Done)
    }

    /// Runs a held cursor's read and keeps its answer. `extended`: the client's messages of
    /// the batch to answer (`asked`), else a simple query.
    pub(super) async fn declare_held(
        &mut self,
        name: String,
        hold: bool,
        read: Read,
        request: Vec<u8>,
        extended: Option<&[u8]>,
    ) -> Result<Declared, SessionError> {
        let limit = self.routing.config.limits.max_merge_bytes;
        let room = limit.saturating_sub(self.cursors.held_bytes);
        let pending = self.in_transaction();
        // The statement's descriptions come first in an extended answer: what the client's
        // Describe messages are answered with.
        let asked: &[u8] = if extended.is_some() { b"SD" } else { b"" };
        let answer = match self.read_kept(&read, request, asked, room).await? {
            Ok(answer) => answer,
            Err(None) => return Ok(Declared::Failed),
            Err(Some(_)) => return Ok(Declared::Refused(errors::cursor_too_big(limit))),
        };
        match self.cursors.keep(name, &answer, hold, pending) {
            Err(error) => {
                self.client.out.extend_from_slice(&error);
                Ok(Declared::Failed)
            }
            Ok(params) => {
                answer_declare(&mut self.client.out, extended.unwrap_or_default(), &params);
                Ok(Declared::Done)
            }
        }
    }

    /// Describe of a portal that is a cursor the router holds, alone in its batch so far (as
    /// psycopg sends it after DECLARE): answered with its description. `false`: not such.
    pub(super) fn describe_held_cursor(&mut self, name: &str) -> bool {
        let Some(description) = self
            .cursors
            .description(name)
            .or_else(|| self.cursors.description(&portal_key(name)))
        else {
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
