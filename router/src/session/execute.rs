//! The one executor of a resolved statement: whichever protocol carried it, its destination
//! ([`Dest`]) is run here, by one `match` ([`Session::execute`]).
//!
//! The protocol files decode their messages, plan and resolve the statement, and hand over the
//! destination with the statement as it came ([`Carrier`]). Where the protocols differ, the
//! carrier says how: the router's error is raised on the pinned connection as a Query or
//! skips an extended batch to its Sync; a statement on several shards runs at once for a
//! Query and at its Execute in an extended batch (`super::extended::spread`); a Query gets its
//! ReadyForQuery here, an extended batch at its Sync.
//!
//! ```text
//!  simple::query ──┐                       ┌─ one shard:      on_one → pin (attach) → outbox → relay
//!                  ├─ Dest ─▶ execute ─────┼─ several shards: several → run_spread (super::several)
//!  extended::bind ─┘                       ├─ cursors the router serves, BEGIN/COMMIT/ROLLBACK it answers
//!                                          └─ refusals, PREPARE/EXECUTE, EXPLAIN (ROUTE)
//! ```

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use super::cursors::CursorWork;
use super::extended::Msg;
use super::participants::Joined;
use super::replies::{Audience, Kind};
use super::spread::{Ran, Spread};
use super::state::Tx;
use super::statements::ClientStatement;
use super::{Session, SessionError};
use crate::errors;
use crate::multishard::split_insert;
use crate::protocol::frontend::{self, Bind};
use crate::protocol::reply::{self, SqlError};
use crate::protocol::request;
use crate::resolver::{ChangesLookups, Dest, SplitInsert};

/// A statement as the protocol that carried it gave it.
pub(super) enum Carrier<'a> {
    /// A simple Query: its whole frame, which becomes the request when one shard runs it; and
    /// whether it may go to the shard's shared connections.
    Query { frame: BytesMut, shareable: bool },
    /// A Bind of one of the client's statements.
    Bind {
        bind: Bind<'a>,
        stmt: Arc<ClientStatement>,
    },
    /// SQL `EXECUTE name (args)` (a simple Query): the client's statement `name`, and the
    /// Bind of it with the arguments as text parameters.
    SqlExecute {
        name: &'a str,
        stmt: Arc<ClientStatement>,
        bind: BytesMut,
    },
}

impl Carrier<'_> {
    /// The statement's text, as the client wrote it.
    pub(super) fn sql(&self) -> &str {
        match self {
            // Read once already (`simple::query`): it is a valid Query.
            Carrier::Query { frame, .. } => frontend::query(&frame[5..]).unwrap_or_default(),
            Carrier::Bind { stmt, .. } | Carrier::SqlExecute { stmt, .. } => stmt.sql(),
        }
    }

    /// What each shard runs for the rows of a split INSERT that belong to it.
    fn split_requests(&self, split: &SplitInsert) -> Result<Vec<(usize, Vec<u8>)>, SqlError> {
        match self {
            Carrier::Bind { bind, stmt } => {
                split_insert::requests(split, Some((bind, stmt.param_types())))
            }
            _ => split_insert::requests(split, None),
        }
    }

    /// What each shard of a write that changes lookup rows runs: its text with RETURNING, the
    /// client's parameters as they are, results in text.
    fn delete_requests(&self, delete: &ChangesLookups) -> Result<Vec<(usize, Vec<u8>)>, SqlError> {
        let params = match self {
            Carrier::Bind { bind, .. } => (0..bind.param_count).collect(),
            _ => Vec::new(),
        };
        let split = SplitInsert {
            parts: delete
                .shards
                .iter()
                .map(|&s| (s, delete.sql.clone()))
                .collect(),
            part_of_row: Vec::new(),
            params: delete.shards.iter().map(|_| params.clone()).collect(),
            values: Vec::new(),
            lookup_only: vec![false; delete.shards.len()],
            writes_lookups: true,
        };
        match self {
            Carrier::Bind { bind, stmt } => {
                split_insert::requests_as(&split, Some((bind, stmt.param_types())), true)
            }
            _ => split_insert::requests_as(&split, None, true),
        }
    }

    /// The client's parameter count, for a Bind.
    fn params(&self) -> Option<usize> {
        match self {
            Carrier::Bind { bind, .. } => Some(bind.param_count),
            _ => None,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// Runs a statement where its destination says.
    pub(super) async fn execute(
        &mut self,
        dest: Dest,
        carrier: Carrier<'_>,
    ) -> Result<(), SessionError> {
        if let Carrier::SqlExecute { name, .. } = carrier {
            if !matches!(
                dest,
                Dest::Shard(_) | Dest::Any | Dest::Refused(_) | Dest::Lookup(_)
            ) {
                let err = errors::execute_on_several_shards(name);
                return self.refuse_query(&err).await;
            }
        }
        let dest = match dest {
            Dest::Declare { .. } | Dest::Cursor { .. } => match self.cursor_work(dest) {
                CursorWork::Route(dest) => dest,
                CursorWork::Declare {
                    name,
                    hold,
                    read,
                    stepwise,
                } => {
                    let spread = Spread::Declare {
                        read,
                        name,
                        hold,
                        stepwise,
                    };
                    return self.several(spread, carrier).await;
                }
                CursorWork::Serve => return self.serve_cursor_command(&carrier).await,
                CursorWork::CloseAll(shards) => return self.close_all(&shards, &carrier).await,
            },
            dest => dest,
        };
        match dest {
            Dest::Refused(err) => self.refuse(&err, &carrier).await,
            // (The resolver refuses both in the extended protocol.)
            Dest::PreparedSql | Dest::ExplainRoute if !matches!(carrier, Carrier::Query { .. }) => {
                let err = errors::internal("a simple-protocol statement in a Bind");
                self.refuse(&err, &carrier).await
            }
            Dest::PreparedSql => self.prepared_sql(carrier.sql()).await,
            Dest::ExplainRoute => self.explain_route(carrier.sql()).await,
            Dest::Begin => self.begin(carrier).await,
            Dest::Commit => self.end(true, carrier).await,
            Dest::Rollback => self.end(false, carrier).await,
            Dest::Shard(shard) => self.on_one(Some(shard), true, carrier).await,
            Dest::Any => self.on_one(None, true, carrier).await,
            // With one shard, a session that keeps its connection runs DDL on it: it may name
            // the session's temporary objects.
            Dest::Broadcast if self.kept.any() && self.routing.map.shards().len() == 1 => {
                let shard = self.routing.map.default_shard();
                self.on_one(Some(shard), true, carrier).await
            }
            Dest::Broadcast => {
                let sql = carrier.sql().to_string();
                self.several(Spread::Broadcast { sql }, carrier).await
            }
            Dest::Read(read) => self.several(Spread::Read(read, None), carrier).await,
            Dest::Write(write) => self.several(Spread::Write(write), carrier).await,
            Dest::SplitInsert(split) => {
                let requests = carrier.split_requests(&split);
                let params = carrier.params();
                let spread = Spread::Split {
                    split,
                    requests,
                    params,
                };
                self.several(spread, carrier).await
            }
            Dest::NewKeys(new) => self.with_new_keys(new, carrier).await,
            Dest::Lookup(by) => self.by_lookup(by, carrier).await,
            Dest::ChangesLookups(delete) => {
                let requests = carrier.delete_requests(&delete);
                let params = carrier.params();
                let spread = Spread::ChangesLookups {
                    delete,
                    requests,
                    params,
                };
                self.several(spread, carrier).await
            }
            Dest::CopyIn(rows) => {
                let sql = carrier.sql().to_string();
                let spread = Spread::CopyIn { sql, rows };
                self.several(spread, carrier).await
            }
            Dest::Declare { .. } | Dest::Cursor { .. } => {
                let err = errors::internal("a cursor statement that found no cursor");
                self.refuse(&err, &carrier).await
            }
        }
    }

    /// The router's error for the statement: raised on the pinned connection, or answered
    /// (a Query gets its ReadyForQuery; an extended batch skips to its Sync).
    pub(super) async fn refuse(
        &mut self,
        err: &SqlError,
        carrier: &Carrier<'_>,
    ) -> Result<(), SessionError> {
        match carrier {
            Carrier::Bind { .. } => self.batch_error(err).await,
            Carrier::Query { .. } | Carrier::SqlExecute { .. } => self.refuse_query(err).await,
        }
    }

    /// `BEGIN`: answered by the router and sent later, in front of the transaction's first
    /// statement, on its shard; where a connection is held already, it runs there.
    async fn begin(&mut self, carrier: Carrier<'_>) -> Result<(), SessionError> {
        match carrier {
            Carrier::Query { .. } if self.pin.is_none() && self.state.tx == Tx::Idle => {
                self.state.begin(carrier.sql());
                reply::command_complete(&mut self.client.out, "BEGIN");
                self.ready();
                Ok(())
            }
            Carrier::Query { .. } | Carrier::SqlExecute { .. } => {
                self.on_one(None, false, carrier).await
            }
            // Sent with its batch (`State::sent_to_backend` notes that the batch began the
            // client's transaction).
            Carrier::Bind { .. } => self.on_one(None, false, carrier).await,
        }
    }

    /// `COMMIT` (`commit`) or `ROLLBACK`: of a transaction that never reached a shard, answered
    /// by the router; of one on several shards, ended on all of them here; otherwise run on
    /// the transaction's connection.
    async fn end(&mut self, commit: bool, carrier: Carrier<'_>) -> Result<(), SessionError> {
        let unsent = self.pin.is_none() && matches!(self.state.tx, Tx::Pending { .. } | Tx::Failed);
        match carrier {
            Carrier::Query { .. } if unsent => {
                let tag = self.state.end_unsent(commit);
                reply::command_complete(&mut self.client.out, tag);
                self.ready();
                Ok(())
            }
            Carrier::Query { .. } if self.spans_shards() => {
                // Once what an extended batch sent before this Query is answered.
                let in_step = self.bring_in_step().await?;
                let commit = commit && in_step;
                let ended = self.end_participants(commit).await;
                let tag = self.state.end_unsent(commit);
                match ended {
                    Ok(()) => reply::command_complete(&mut self.client.out, tag),
                    Err(err) => err.write(&mut self.client.out),
                }
                self.ready();
                Ok(())
            }
            Carrier::Bind { .. } if self.spans_shards() => {
                // The rest of the batch is answered by the router (`router_batch`), with no
                // connection held.
                if !self.bring_in_step().await? {
                    return Ok(());
                }
                if let Err(err) = self.end_participants(commit).await {
                    self.state.end_unsent(false);
                    return self.batch_error(&err).await;
                }
                self.on_one(None, false, carrier).await
            }
            carrier => self.on_one(None, false, carrier).await,
        }
    }

    /// A statement for one shard (`wanted`), or for any (`None`), on the pinned connection: a
    /// Query is sent and answered now; a Bind is sent once a connection is pinned, or held
    /// until its batch names a shard. `share`: the statement may go to the shard's shared
    /// connections, when its plan allows.
    async fn on_one(
        &mut self,
        wanted: Option<usize>,
        share: bool,
        carrier: Carrier<'_>,
    ) -> Result<(), SessionError> {
        match carrier {
            Carrier::Query { frame, shareable } => {
                self.may_share = share && shareable;
                let reached = self.reach_for_query(wanted).await;
                self.may_share = false;
                if !reached? {
                    return Ok(());
                }
                self.out.push_frame(frame);
                self.out.replies.push(Kind::Query, Audience::Client);
                self.exchange().await?;
                self.release_if_idle();
                Ok(())
            }
            Carrier::Bind { bind, stmt } => {
                if let Some(shard) = wanted {
                    self.may_share = share && stmt.plan.shareable && self.held_shareable();
                    let reached = self.reach(Some(shard)).await;
                    self.may_share = false;
                    match reached? {
                        Joined::Ready => {}
                        Joined::Refused(err) => return self.batch_error(&err).await,
                        // Skipping to Sync: this message too.
                        Joined::Failed => return Ok(()),
                    }
                }
                let msg = Msg::Bind {
                    portal: bind.portal.as_bytes(),
                    tail: bind.tail,
                    stmt,
                };
                self.route_or_hold(msg).await
            }
            Carrier::SqlExecute { stmt, bind, .. } => {
                if !self.reach_for_query(wanted).await? {
                    return Ok(());
                }
                self.write_sql_execute(&stmt, &bind)?;
                self.exchange().await?;
                self.release_if_idle();
                Ok(())
            }
        }
    }

    /// A statement on several shards: a Query runs it now and gets its ReadyForQuery; a Bind
    /// makes its batch one the router answers, run at its Execute.
    async fn several(&mut self, spread: Spread, carrier: Carrier<'_>) -> Result<(), SessionError> {
        let frame = match carrier {
            Carrier::Query { frame, .. } => frame,
            Carrier::Bind { bind, stmt } => return self.defer_spread(spread, &bind, &stmt).await,
            Carrier::SqlExecute { name, .. } => {
                return self
                    .refuse_query(&errors::execute_on_several_shards(name))
                    .await
            }
        };
        let sql = frontend::query(&frame[5..]).unwrap_or_default();
        let request = match &spread {
            Spread::Read(read, _) => match &read.shard_sql {
                Some(text) => request::query_message(text)?,
                None => frame.to_vec(),
            },
            Spread::Write(_) => frame.to_vec(),
            Spread::Declare {
                read,
                name,
                stepwise,
                ..
            } => request::query_message(&super::cursors::shard_text(sql, name, read, *stepwise))?,
            Spread::Broadcast { .. }
            | Spread::Split { .. }
            | Spread::ChangesLookups { .. }
            | Spread::CopyIn { .. } => Vec::new(),
        };
        match self.run_spread(spread, request, &[], 0).await? {
            Ran::Refused(err) => self.refuse_query(&err).await,
            Ran::Done | Ran::Failed => {
                self.ready();
                Ok(())
            }
        }
    }

    /// FETCH, MOVE or CLOSE of a cursor the router serves: answered in the simple protocol.
    async fn serve_cursor_command(&mut self, carrier: &Carrier<'_>) -> Result<(), SessionError> {
        if let Carrier::Bind { .. } = carrier {
            return self.batch_error(&errors::held_cursor_in_extended()).await;
        }
        match self.serve_cursor(carrier.sql()).await? {
            Ok(()) => {
                self.ready();
                Ok(())
            }
            Err(err) => self.refuse_query(&err).await,
        }
    }

    /// `CLOSE ALL` of cursors on several shards of the transaction.
    async fn close_all(
        &mut self,
        shards: &[usize],
        carrier: &Carrier<'_>,
    ) -> Result<(), SessionError> {
        if let Carrier::Bind { .. } = carrier {
            return self.batch_error(&errors::held_cursor_in_extended()).await;
        }
        if let Some(answers) = self
            .ask_in_transaction(shards, request::query_message("CLOSE ALL")?)
            .await?
        {
            match answers
                .iter()
                .find_map(|a| crate::protocol::backend::error_frame(a))
            {
                Some(error) => self.client.out.extend_from_slice(error),
                None => reply::command_complete(&mut self.client.out, "CLOSE CURSOR ALL"),
            }
        }
        self.ready();
        Ok(())
    }
}
