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

mod portal;
mod table;

use shardmap::sql::quote_ident_always;
use tokio::io::{AsyncRead, AsyncWrite};

use table::{forward_only, Place, Steps};
pub(super) use table::{portal_key, Cursors, Keep};

use super::state::{Batch, Tx};
use super::{Session, SessionError};
use crate::errors;
use crate::multishard::stepwise::Step;
use crate::planner::cursor::{self, Count, Verb};
use crate::protocol::frame::frames;
use crate::protocol::reply::{self, SqlError};
use crate::resolver::{Dest, Read};

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
            b'S' if params.is_empty() => reply::no_data_description(out, b'S'),
            b'S' => {
                out.extend_from_slice(params);
                crate::protocol::frame::put_frame(out, b'n', &[]);
            }
            b'B' => reply::bind_complete(out),
            b'D' => reply::no_data_description(out, b'P'),
            _ => reply::close_complete(out),
        }
    }
    reply::command_complete(out, "DECLARE CURSOR");
}

/// What each shard runs to declare its part of a cursor merged step by step.
fn shard_declare(name: &str, query: &str) -> String {
    format!(
        "DECLARE {} NO SCROLL CURSOR FOR {query}",
        quote_ident_always(name)
    )
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
        if !self.state.in_transaction() {
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
                let in_transaction = self.state.in_transaction();
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
                if hold && on_shard.is_some_and(|s| self.kept.keeps(s)) {
                    // The router would read it on connections of its own, which do not see
                    // the session's temporary tables (or see a table they hide).
                    return CursorWork::Route(Dest::Refused(SqlError::new(
                        errors::FEATURE_NOT_SUPPORTED,
                        "a WITH HOLD cursor is not supported in a session that keeps its connection for temporary tables",
                    ).with_hint("declare it without WITH HOLD inside a transaction")));
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
                    (_, Some(shard)) => Read::concatenated(vec![shard], true),
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
                let request = crate::protocol::request::query_message(&format!(
                    "CLOSE {}",
                    quote_ident_always(&name)
                ))?;
                if let Some(answers) = self.ask_in_transaction(&shards, request).await? {
                    if let Some(error) = answers
                        .iter()
                        .find_map(|a| crate::protocol::backend::error_frame(a))
                    {
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
                    &format!("FETCH FORWARD {asked} FROM {}", quote_ident_always(key)),
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
        if let Some(error) = answers
            .iter()
            .find_map(|a| crate::protocol::backend::error_frame(a))
        {
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
        let pending = self.state.in_transaction();
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
