//! A simple-protocol Query: planned and resolved as a whole (every statement in it must agree
//! on one shard), then answered by the router, run on the pinned connection, or run on several
//! shards.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use super::cursors::{CursorWork, Declared};
use super::replies::{Audience, Kind};
use super::state::Tx;
use super::{Session, SessionError};
use crate::protocol::reply::{self, SqlError};
use crate::protocol::{frontend, LONG};
use crate::resolver::{self, Dest, Reroute};

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    pub(super) async fn query(&mut self, frame: BytesMut) -> Result<(), SessionError> {
        let sql = frontend::query(&frame[5..])?;
        // A Query ends what came before it, as a Sync does.
        self.out.replies.take_error();
        // Kept for the settings a statement changes and for the logs; a long text only as its
        // start, unless it may change settings (below).
        self.sql.clear();
        self.sql.push_str(prefix(sql));
        if self.pin.is_some() && self.state.only_prepared() {
            // A Query in the middle of an extended batch that only prepared statements: finish
            // that there, so the Query is routed on its own.
            self.finish_preparation().await?;
        }
        let pinned = self.pinned();
        let shareable;
        let dest = {
            let planned = self.routing.planner.plan(sql, &mut self.nbuf);
            shareable = planned.shareable;
            let stmt = resolver::Statement::from_text(sql, &planned);
            let target = Self::resolve(&self.routing, &self.settings, &self.state, pinned, &stmt);
            // Several statements may hold several keys of the shard: after a split they could
            // need both halves, so only a single statement's key re-routes a held Query.
            self.reroute = if planned.statements.len() == 1 {
                target.reroute()
            } else {
                Reroute::No
            };
            self.parts
                .note_savepoint(&planned, &target.dest, self.state.tx != Tx::Idle);
            target.dest
        };
        // A text the normalizer gave up on (too long to plan) may still be routed by hand
        // (`/* shard: .. */`): keep it whole, as its words are unknown.
        if self.sql.len() < sql.len()
            && (self.nbuf.too_long() || may_change_settings(self.nbuf.normalized()))
        {
            self.sql.clear();
            self.sql.push_str(sql);
        }
        self.cursors_at(&dest);
        let dest = match dest {
            Dest::Declare { .. } | Dest::Cursor { .. } => match self.cursor_work(dest) {
                CursorWork::Route(dest) => dest,
                CursorWork::Serve => {
                    return match self.serve_cursor(sql).await? {
                        Ok(()) => {
                            self.ready();
                            Ok(())
                        }
                        Err(err) => self.refuse_query(&err).await,
                    };
                }
                CursorWork::Declare {
                    name,
                    hold,
                    read,
                    stepwise,
                } => {
                    let text = super::cursors::shard_text(sql, &name, &read, stepwise);
                    let mut request = bytes::BytesMut::new();
                    crate::protocol::request::query(&mut request, &text)?;
                    let request = request.to_vec();
                    let declared = if stepwise {
                        self.declare_stepwise(name, read, request, None).await?
                    } else {
                        self.declare_held(name, hold, read, request, None).await?
                    };
                    return match declared {
                        Declared::Done | Declared::Failed => {
                            self.ready();
                            Ok(())
                        }
                        Declared::Refused(err) => self.refuse_query(&err).await,
                    };
                }
                CursorWork::CloseAll(shards) => {
                    let mut close = bytes::BytesMut::new();
                    crate::protocol::request::query(&mut close, "CLOSE ALL")?;
                    if let Some(answers) = self.ask_in_transaction(&shards, close.to_vec()).await? {
                        match answers.iter().find_map(|a| super::multi::error_frame(a)) {
                            Some(error) => self.client.out.extend_from_slice(error),
                            None => {
                                reply::command_complete(&mut self.client.out, "CLOSE CURSOR ALL")
                            }
                        }
                    }
                    self.ready();
                    return Ok(());
                }
            },
            dest => dest,
        };
        match dest {
            Dest::Refused(err) => return self.refuse_query(&err).await,
            Dest::PreparedSql => return self.prepared_sql(sql).await,
            Dest::ExplainRoute => return self.explain_route(sql).await,
            Dest::Begin if self.pin.is_none() && self.state.tx == Tx::Idle => {
                // Sent later, in front of the transaction's first statement, on its shard.
                self.state.begin(sql);
                reply::command_complete(&mut self.client.out, "BEGIN");
                self.ready();
                return Ok(());
            }
            Dest::Commit | Dest::Rollback
                if self.pin.is_none()
                    && matches!(self.state.tx, Tx::Pending { .. } | Tx::Failed) =>
            {
                // The transaction never reached a shard.
                let tag = self.state.end_unsent(matches!(dest, Dest::Commit));
                reply::command_complete(&mut self.client.out, tag);
                self.ready();
                return Ok(());
            }
            Dest::Commit | Dest::Rollback if !self.parts.is_empty() => {
                // A transaction on several shards ends on all of them, here, once what an
                // extended batch sent before this Query is answered.
                let in_step = self.bring_in_step().await?;
                let commit = matches!(dest, Dest::Commit) && in_step;
                let ended = self.end_participants(commit).await;
                let tag = self.state.end_unsent(commit);
                match ended {
                    Ok(()) => reply::command_complete(&mut self.client.out, tag),
                    Err(err) => err.write(&mut self.client.out),
                }
                self.ready();
                return Ok(());
            }
            Dest::Broadcast => {
                let answer = self.run_broadcast(sql).await;
                self.client.out.extend_from_slice(&answer);
            }
            Dest::Read(read) => {
                let request = match &read.shard_sql {
                    Some(text) => {
                        let mut q = bytes::BytesMut::new();
                        crate::protocol::request::query(&mut q, text)?;
                        q.to_vec()
                    }
                    None => frame[..].to_vec(),
                };
                self.run_read(read, request, &[]).await?;
            }
            Dest::Write(write) => {
                self.run_write(write.shards, frame[..].to_vec(), &[])
                    .await?;
            }
            Dest::SplitInsert(split) => {
                let requests = crate::multishard::split_insert::requests(&split, None);
                self.run_split_insert(&split, requests, None, &[]).await?;
            }
            Dest::CopyIn { key_type, format } => self.run_copy_in(sql, key_type, format).await?,
            Dest::Shard(_)
            | Dest::Any
            | Dest::Begin
            | Dest::Commit
            | Dest::Rollback
            | Dest::Declare { .. }
            | Dest::Cursor { .. } => {
                let wanted = match dest {
                    Dest::Shard(s) => Some(s),
                    _ => None,
                };
                self.may_share = shareable && matches!(dest, Dest::Shard(_) | Dest::Any);
                let reached = self.reach_for_query(wanted).await;
                self.may_share = false;
                if !reached? {
                    return Ok(());
                }
                self.out.push_frame(frame);
                self.out.replies.push(Kind::Query, Audience::Client);
                self.exchange().await?;
                self.release_if_idle();
                return Ok(());
            }
        }
        self.ready();
        Ok(())
    }

    /// The router's error for a simple query. With a connection pinned it is raised there, so
    /// that the backend's transaction fails exactly as the client is told.
    pub(super) async fn refuse_query(&mut self, err: &SqlError) -> Result<(), SessionError> {
        if self.pin.is_some() {
            self.out.raise_query(err)?;
            self.exchange().await?;
            self.release_if_idle();
            return Ok(());
        }
        self.refuse_here(err);
        self.ready();
        Ok(())
    }

    /// A ReadyForQuery with the client's transaction status, answered by the router.
    pub(super) fn ready(&mut self) {
        reply::ready_for_query(&mut self.client.out, self.state.status());
    }
}

/// `sql`, or its first [`LONG`] bytes (at a character boundary) when it is longer.
fn prefix(sql: &str) -> &str {
    if sql.len() <= LONG {
        return sql;
    }
    let mut end = LONG;
    while !sql.is_char_boundary(end) {
        end -= 1;
    }
    &sql[..end]
}

/// Whether a statement whose normalized text is `normalized` may complete as `SET`, `RESET` or
/// `DISCARD` (what the session's settings tracking reads the text for): only statements that
/// begin with those words do, and normalization keeps every word outside literals and
/// comments. A word inside a quoted identifier counts too, which only costs a copy.
fn may_change_settings(normalized: &str) -> bool {
    normalized
        .split(|c: char| !c.is_ascii_alphabetic())
        .any(|w| {
            w.eq_ignore_ascii_case("set")
                || w.eq_ignore_ascii_case("reset")
                || w.eq_ignore_ascii_case("discard")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_text_is_kept_whole_only_when_it_may_change_settings() {
        let long = format!("SELECT 1 /* {} */", "é".repeat(LONG));
        assert!(prefix(&long).len() <= LONG && long.starts_with(prefix(&long)));
        assert_eq!(prefix("SELECT 1"), "SELECT 1");
        assert!(may_change_settings("SET search_path = $1"));
        assert!(may_change_settings("select $1; reset all"));
        assert!(may_change_settings("DISCARD ALL"));
        assert!(!may_change_settings("SELECT v FROM kv WHERE id = $1  "));
        assert!(!may_change_settings("SELECT settings FROM offset_t"));
    }
}
