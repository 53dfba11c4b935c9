//! Extended-protocol batches whose statement runs on several shards (DDL on every shard, a
//! read or write across shards, a split INSERT, a DECLARE of a cursor the router serves): from
//! the statement's Bind to its Sync the router answers the batch's messages itself, and its
//! Execute runs the statement (`crate::session::several::Session::run_spread`). Inside a
//! transaction a read's Execute with a row limit runs its portal step by step
//! (`crate::session::cursors`).

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::errors;
use crate::merge::Out;
use crate::multishard;
use crate::protocol::frame::{begin_frame, end_frame};
use crate::protocol::frontend::{self, Bind};
use crate::protocol::reply::{self, SqlError, TxStatus};
use crate::protocol::request;
use crate::resolver::Read;
use crate::session::spread::{Portal, Ran, ScatterBatch, Spread};
use crate::session::state::{Batch, Tx};
use crate::session::statements::ClientStatement;
use crate::session::{Session, SessionError};

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// What the batch's held messages and its Bind asked the router to answer, in order.
    fn asked_with_bind(&mut self) -> Vec<u8> {
        let held = self.state.take_held();
        let mut asked: Vec<u8> = held.asked().collect();
        self.state.keep_held(held);
        asked.push(b'B');
        asked
    }

    /// The Bind of a statement on several shards: the batch becomes one the router answers,
    /// run at its Execute. Inside a transaction (or after statements of its batch that ran on
    /// the pinned connection) it joins the transaction; a write, or a read after such
    /// statements, makes the batch one transaction over every shard it touches, committed at
    /// its Sync.
    pub(in crate::session) async fn defer_spread(
        &mut self,
        spread: Spread,
        bind: &Bind<'_>,
        stmt: &Arc<ClientStatement>,
    ) -> Result<(), SessionError> {
        match spread {
            Spread::Declare { .. } => {
                if self.mixed_batch() {
                    return self.batch_error(&errors::not_alone_in_batch()).await;
                }
                return self.begin_held_declare(spread, bind, stmt);
            }
            Spread::CopyIn { .. } => {
                let err = errors::internal("a simple-protocol statement in a Bind");
                return self.batch_error(&err).await;
            }
            Spread::Broadcast { .. } => {}
            Spread::Read(..)
            | Spread::Write(_)
            | Spread::Split { .. }
            | Spread::ChangesLookups { .. } => {
                // Inside a transaction it may follow other statements of its batch (a
                // driver's BEGIN in front of it, earlier statements on the pinned shard):
                // those run first, and it joins the transaction.
                self.absorb_held_begin();
                if self.state.began_in_batch()
                    && matches!(self.state.batch, Batch::OnBackend { executed: true })
                {
                    // The batch's BEGIN ran on the pinned connection.
                    self.state.ready(TxStatus::InTransaction);
                }
            }
        }
        // (A session that keeps a connection for its temporary objects stays on one shard.)
        let spanning = self.routing.config.transactions.cross_shard
            != crate::config::CrossShard::Refuse
            && !self.kept.any();
        let after_others = matches!(self.state.batch, Batch::OnBackend { executed: true });
        if spanning
            && self.state.tx == Tx::Idle
            && (matches!(
                spread,
                Spread::Write(_) | Spread::Split { .. } | Spread::ChangesLookups { .. }
            ) || matches!(spread, Spread::Read(..)) && after_others)
            && (!self.bring_in_step().await? || !self.open_on_first_shard(false).await?)
        {
            return Ok(());
        }
        if self.mixed_batch() {
            return self.batch_error(&errors::not_alone_in_batch()).await;
        }
        self.begin_spread_batch(spread, bind, stmt)
    }

    /// The batch of a statement on several shards: the held messages and the Bind are
    /// answered by the router, until the batch's Execute runs it.
    fn begin_spread_batch(
        &mut self,
        spread: Spread,
        bind: &Bind<'_>,
        stmt: &Arc<ClientStatement>,
    ) -> Result<(), SessionError> {
        let asked = self.asked_with_bind();
        let (sql, group) = match spread {
            Spread::Broadcast { sql } => {
                let mut out = Vec::new();
                for k in &asked {
                    match k {
                        b'P' => reply::parse_complete(&mut out),
                        b'S' => reply::no_data_description(&mut out, b'S'),
                        b'D' => reply::no_data_description(&mut out, b'P'),
                        b'B' => reply::bind_complete(&mut out),
                        _ => reply::close_complete(&mut out),
                    }
                }
                self.out.replies.push_synthetic(out);
                self.state.set_batch(Batch::Broadcast { sql });
                return Ok(());
            }
            Spread::Split { .. } | Spread::ChangesLookups { .. } => {
                // Each part's request was made with the Bind.
                self.set_scatter(Vec::new(), spread, asked);
                return Ok(());
            }
            Spread::Read(read, _) => {
                // Inside a transaction a row limit at Execute runs the portal step by step; a
                // read in two stages runs whole, its second stage with the client's Bind.
                let staged = read.staged.is_some();
                let steps = !staged
                    && self.state.in_transaction()
                    && !read.labels
                    && read.merge.as_ref().is_none_or(|m| m.group.is_none());
                let sql = read.shard_sql.as_deref().unwrap_or(stmt.sql());
                let group = read.merge.as_ref().and_then(|m| m.group.as_deref());
                let request = shard_request(sql, stmt.param_types(), bind, group)?;
                let portal = (steps || staged).then(|| {
                    Box::new(Portal {
                        name: bind.portal.to_string(),
                        // Both stages are made from the client's text.
                        sql: if staged { stmt.sql() } else { sql }.to_string(),
                        param_types: stmt.param_types().to_vec(),
                        bind_tail: bind.tail.to_vec(),
                        param_count: bind.param_count,
                        params_end: bind.without_result_formats().len(),
                    })
                });
                self.set_scatter(request, Spread::Read(read, portal), asked);
                return Ok(());
            }
            Spread::Write(_) | Spread::Declare { .. } | Spread::CopyIn { .. } => (stmt.sql(), None),
        };
        let request = shard_request(sql, stmt.param_types(), bind, group)?;
        self.set_scatter(request, spread, asked);
        Ok(())
    }

    fn set_scatter(&mut self, request: Vec<u8>, run: Spread, asked: Vec<u8>) {
        self.state.set_batch(Batch::Scatter(Box::new(ScatterBatch {
            request,
            run,
            asked,
            executed: false,
        })));
    }

    /// The Bind of a DECLARE of a cursor the router serves ([`crate::session::cursors`]): the
    /// batch is answered by the router, and its Execute runs, with the client's parameters, the
    /// DECLARE on each shard (`stepwise`), or the cursor's query with text results (what FETCH
    /// sends in the simple protocol), whose answer is kept.
    fn begin_held_declare(
        &mut self,
        declare: Spread,
        bind: &Bind<'_>,
        stmt: &Arc<ClientStatement>,
    ) -> Result<(), SessionError> {
        let Spread::Declare {
            read,
            name,
            stepwise,
            ..
        } = &declare
        else {
            return Err(SessionError::Protocol("internal: not a DECLARE".into()));
        };
        let stepwise = *stepwise;
        let asked = self.asked_with_bind();
        let text = crate::session::cursors::shard_text(stmt.sql(), name, read, stepwise);
        let mut request = BytesMut::new();
        request::parse(&mut request, "", &text, stmt.param_types())?;
        request::describe_statement(&mut request, "")?;
        let at = begin_frame(&mut request, b'B');
        request.extend_from_slice(b"\0\0");
        request.extend_from_slice(bind.without_result_formats());
        request.extend_from_slice(&0i16.to_be_bytes());
        end_frame(&mut request, at);
        if !stepwise {
            request::describe_portal(&mut request);
        }
        request::execute(&mut request);
        request::sync(&mut request);
        self.set_scatter(request.to_vec(), declare, asked);
        Ok(())
    }

    /// A read's portal with a row limit inside a transaction: bound on every shard as
    /// `sg_<portal>` and merged step by step ([`Session::portal_in_steps`]).
    pub(in crate::session) async fn portal_run_in_steps(
        &mut self,
        read: Read,
        portal: Portal,
        max_rows: u64,
        asked: &[u8],
    ) -> Result<bool, SessionError> {
        let shard_portal = format!("sg_{}", portal.name);
        let mut request = BytesMut::new();
        request::parse(&mut request, "", &portal.sql, &portal.param_types)?;
        request::describe_statement(&mut request, "")?;
        request::rebind(&mut request, shard_portal.as_bytes(), "", &portal.bind_tail);
        request::describe_named_portal(&mut request, &shard_portal)?;
        request::sync(&mut request);
        self.portal_in_steps(
            &portal.name,
            shard_portal,
            read,
            request.to_vec(),
            max_rows,
            asked,
        )
        .await
    }

    /// The rest of a DDL batch, up to its Sync.
    pub(super) async fn in_broadcast_batch(&mut self, frame: &[u8]) -> Result<(), SessionError> {
        let body = &frame[5..];
        let mut out = Vec::new();
        match frame[0] {
            b'D' => reply::no_data_description(&mut out, frontend::target(body, "Describe")?.kind),
            b'C' => {
                let t = frontend::target(body, "Close")?;
                if t.kind == b'S' {
                    self.statements.close(t.name);
                }
                reply::close_complete(&mut out);
            }
            b'E' => {
                let sql = match &self.state.batch {
                    Batch::Broadcast { sql } => sql.clone(),
                    _ => String::new(),
                };
                // Its answer follows what the router answered for the batch so far.
                self.out.replies.drain_synthetic(&mut self.client.out);
                let spread = Spread::Broadcast { sql };
                if !matches!(
                    self.run_spread(spread, Vec::new(), &[], 0).await?,
                    Ran::Done
                ) {
                    self.state.skip_to_sync();
                }
            }
            b'S' => {
                self.state.synced();
                reply::ready_for_query(&mut out, TxStatus::Idle);
            }
            b'H' => {}
            _ => {
                SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "DDL that goes to every shard must be the only statement of its batch",
                )
                .with_hint("send a Sync after the DDL's Execute")
                .write(&mut out);
                self.state.skip_to_sync();
            }
        }
        self.out.replies.push_synthetic(out);
        Ok(())
    }

    /// The rest of a batch on several shards, up to its Sync.
    pub(super) async fn in_scatter_batch(&mut self, frame: &[u8]) -> Result<(), SessionError> {
        let body = &frame[5..];
        let Batch::Scatter(batch) = &mut self.state.batch else {
            return Ok(());
        };
        match frame[0] {
            b'D' => {
                let kind = frontend::target(body, "Describe")?.kind;
                batch.asked.push(if kind == b'S' { b'S' } else { b'D' });
            }
            b'C' => {
                let t = frontend::target(body, "Close")?;
                if t.kind == b'S' {
                    self.statements.close(t.name);
                }
                batch.asked.push(b'C');
            }
            b'E' if !batch.executed => {
                batch.executed = true;
                let request = std::mem::take(&mut batch.request);
                let asked = std::mem::take(&mut batch.asked);
                let run = std::mem::replace(
                    &mut batch.run,
                    Spread::Write(crate::resolver::Write {
                        shards: Vec::new(),
                        keyed: false,
                        replicas: false,
                    }),
                );
                self.out.replies.drain_synthetic(&mut self.client.out);
                let in_transaction = self.state.in_transaction();
                let max_rows = frontend::execute_target(body).map_or(0, |(_, n)| n);
                let read = matches!(run, Spread::Read(..));
                let ran = self
                    .run_spread(run, request, &asked, u64::try_from(max_rows).unwrap_or(0))
                    .await?;
                let failed = match ran {
                    Ran::Done => false,
                    Ran::Failed => true,
                    Ran::Refused(err) => return self.batch_error(&err).await,
                };
                if failed {
                    self.state.skip_to_sync();
                } else if in_transaction && self.pin.is_some() {
                    // Part of a transaction: the batch goes on, on the transaction's shards.
                    self.state.set_batch(Batch::OnBackend { executed: true });
                } else if read && !in_transaction {
                    // A read changes nothing: the rest of the batch runs as if it came after
                    // the read's own batch.
                    self.state.set_batch(Batch::Idle);
                }
            }
            b'E' => {
                // The statement ran at the first Execute; the portal is done.
                reply::command_complete(&mut self.client.out, "SELECT 0");
            }
            b'S' => {
                if !batch.executed {
                    // A batch that never executed: answer what it asked.
                    let asked = std::mem::take(&mut batch.asked);
                    multishard::gather::answer_asked(&mut self.client.out, &asked, &[], &[]);
                }
                if self.state.tx == Tx::Implicit {
                    return self.sync_on_every_shard().await;
                }
                self.state.synced();
                reply::ready_for_query(&mut self.client.out, self.state.status());
            }
            b'H' => {}
            _ => {
                SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "a statement on several shards must be the only statement of its batch",
                )
                .with_hint("send a Sync after its Execute")
                .write(&mut self.client.out);
                self.state.skip_to_sync();
            }
        }
        Ok(())
    }
}

/// What every shard runs for a statement on several shards in an extended batch: Parse of the
/// (possibly rewritten) text, Describe of it, the client's Bind, Describe of the portal,
/// Execute and Sync. When the shards answer more columns than the client sees (each `avg` is
/// asked as `sum` and `count`), the Bind gets one result format per shard column.
fn shard_request(
    sql: &str,
    param_types: &[u8],
    bind: &Bind<'_>,
    group: Option<&[Out]>,
) -> Result<Vec<u8>, SessionError> {
    let Some(columns) = group.filter(|_| bind.result_format_count() > 1) else {
        return Ok(request::bound(sql, param_types, bind.tail)?);
    };
    let mut out = BytesMut::new();
    request::parse(&mut out, "", sql, param_types)?;
    request::describe_statement(&mut out, "")?;
    // The client's result formats per column, each avg's twice (its sum and count).
    let at = begin_frame(&mut out, b'B');
    out.extend_from_slice(b"\0\0");
    out.extend_from_slice(bind.without_result_formats());
    let codes: Vec<i16> = columns
        .iter()
        .enumerate()
        .flat_map(|(i, o)| {
            let code = i16::from(bind.result_binary(i));
            let n = if matches!(o, Out::Avg { .. }) { 2 } else { 1 };
            std::iter::repeat_n(code, n)
        })
        .collect();
    out.extend_from_slice(&(codes.len() as i16).to_be_bytes());
    for c in codes {
        out.extend_from_slice(&c.to_be_bytes());
    }
    end_frame(&mut out, at);
    request::describe_portal(&mut out);
    request::execute(&mut out);
    request::sync(&mut out);
    Ok(out.to_vec())
}
