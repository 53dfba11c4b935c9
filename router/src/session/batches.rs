//! Extended-protocol batches whose statement runs on several shards (DDL on every shard, a
//! read or write across shards, a split INSERT, a DECLARE of a cursor the router serves): from
//! the statement's Bind to its Sync the router answers the batch's messages itself, and its
//! Execute runs the statement (`super::multi` has the runners). Inside a transaction a read's
//! Execute with a row limit runs its portal step by step (`super::cursors`).

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use super::extended::no_data_description;
use super::state::Batch;
use super::statements::ClientStatement;
use super::{Session, SessionError};
use crate::errors;
use crate::merge::Out;
use crate::multishard::{self, split_insert};
use crate::protocol::frame::{begin_frame, end_frame};
use crate::protocol::frontend::{self, Bind};
use crate::protocol::reply::{self, SqlError, TxStatus};
use crate::protocol::request;
use crate::resolver::{Dest, Read, SplitInsert};

/// A statement on several shards in an extended batch, run at its Execute.
#[derive(Debug)]
pub struct ScatterBatch {
    /// Parse + Describe + Bind + Describe + Execute + Sync of the statement, for every shard.
    request: Vec<u8>,
    run: Spread,
    /// The client's messages of the batch so far, to answer in order: `P` Parse, `S` Describe
    /// statement, `B` Bind, `D` Describe portal, `C` Close.
    asked: Vec<u8>,
    /// Its Execute has run.
    executed: bool,
}

/// A read's portal as the client bound it, for running it with a row limit on every shard.
#[derive(Debug)]
struct Portal {
    name: String,
    sql: String,
    param_types: Vec<u8>,
    /// The client's Bind after the statement name (parameters, formats).
    bind_tail: Vec<u8>,
}

#[derive(Debug)]
enum Spread {
    Read(Read, Option<Box<Portal>>),
    Write(Vec<usize>),
    /// `DECLARE` of a cursor the router holds: its query's read, whose answer is kept.
    Declare {
        read: Read,
        name: String,
        hold: bool,
        stepwise: bool,
    },
    /// A multi-row INSERT split by shard, with each part's messages (made at the Bind) and the
    /// client's parameter count.
    Split {
        split: SplitInsert,
        requests: Result<Vec<(usize, Vec<u8>)>, SqlError>,
        params: usize,
    },
}

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// What the batch's held messages and its Bind asked the router to answer, in order.
    fn asked_with_bind(&mut self) -> Vec<u8> {
        let held = self.state.take_held();
        let mut asked: Vec<u8> = held.asked().collect();
        self.state.keep_held(held);
        asked.push(b'B');
        asked
    }

    /// The Bind of a statement on several shards in an extended batch: the held messages and
    /// the Bind are answered by the router, until the batch's Execute runs it.
    pub(super) fn begin_multi_batch(
        &mut self,
        dest: Dest,
        bind: &Bind<'_>,
        stmt: &Arc<ClientStatement>,
    ) -> Result<(), SessionError> {
        let asked = self.asked_with_bind();
        let run = match dest {
            Dest::Broadcast => {
                let mut out = Vec::new();
                for k in &asked {
                    match k {
                        b'P' => reply::parse_complete(&mut out),
                        b'S' => no_data_description(&mut out, b'S'),
                        b'D' => no_data_description(&mut out, b'P'),
                        b'B' => reply::bind_complete(&mut out),
                        _ => reply::close_complete(&mut out),
                    }
                }
                self.out.replies.push_synthetic(out);
                self.state.set_batch(Batch::Broadcast {
                    sql: stmt.sql().to_string(),
                });
                return Ok(());
            }
            Dest::Read(read) => {
                // Inside a transaction a row limit at Execute runs the portal step by step.
                let steps = self.in_transaction()
                    && !read.labels
                    && read.merge.as_ref().is_none_or(|m| m.group.is_none());
                let portal = steps.then(|| {
                    Box::new(Portal {
                        name: bind.portal.to_string(),
                        sql: read
                            .shard_sql
                            .clone()
                            .unwrap_or_else(|| stmt.sql().to_string()),
                        param_types: stmt.param_types().to_vec(),
                        bind_tail: bind.tail.to_vec(),
                    })
                });
                Spread::Read(read, portal)
            }
            Dest::Write(write) => Spread::Write(write.shards),
            Dest::SplitInsert(split) => {
                let requests = split_insert::requests(&split, Some((bind, stmt.param_types())));
                self.state.set_batch(Batch::Scatter(Box::new(ScatterBatch {
                    request: Vec::new(),
                    run: Spread::Split {
                        split,
                        requests,
                        params: bind.param_count,
                    },
                    asked,
                    executed: false,
                })));
                return Ok(());
            }
            _ => {
                return Err(SessionError::Protocol(
                    "internal: not a multi-shard batch".into(),
                ))
            }
        };
        let (sql, group) = match &run {
            Spread::Read(r, _) => (
                r.shard_sql.as_deref().unwrap_or(stmt.sql()),
                r.merge.as_ref().and_then(|m| m.group.as_deref()),
            ),
            Spread::Write(_) | Spread::Split { .. } | Spread::Declare { .. } => (stmt.sql(), None),
        };
        let request = shard_request(sql, stmt.param_types(), bind, group)?;
        self.state.set_batch(Batch::Scatter(Box::new(ScatterBatch {
            request,
            run,
            asked,
            executed: false,
        })));
        Ok(())
    }

    /// The Bind of a DECLARE of a cursor the router serves ([`super::cursors`]): the batch is
    /// answered by the router, and its Execute runs, with the client's parameters, the DECLARE
    /// on each shard (`stepwise`), or the cursor's query with text results (what FETCH sends
    /// in the simple protocol), whose answer is kept.
    pub(super) fn begin_held_declare(
        &mut self,
        name: String,
        hold: bool,
        read: Read,
        stepwise: bool,
        bind: &Bind<'_>,
        stmt: &Arc<ClientStatement>,
    ) -> Result<(), SessionError> {
        let asked = self.asked_with_bind();
        let text = super::cursors::shard_text(stmt.sql(), &name, &read, stepwise);
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
        self.state.set_batch(Batch::Scatter(Box::new(ScatterBatch {
            request: request.to_vec(),
            run: Spread::Declare {
                read,
                name,
                hold,
                stepwise,
            },
            asked,
            executed: false,
        })));
        Ok(())
    }

    /// A read's portal with a row limit inside a transaction: bound on every shard as
    /// `sg_<portal>` and merged step by step ([`Session::portal_in_steps`]).
    async fn portal_run_in_steps(
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
            b'D' => no_data_description(&mut out, frontend::target(body, "Describe")?.kind),
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
                out = self.run_broadcast(&sql).await;
                if out.first() == Some(&b'E') {
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
                let run = std::mem::replace(&mut batch.run, Spread::Write(Vec::new()));
                self.out.replies.drain_synthetic(&mut self.client.out);
                let in_transaction = self.in_transaction();
                let limit = frontend::execute_target(body).map_or(0, |(_, n)| n);
                let read = matches!(run, Spread::Read(..));
                let failed = match run {
                    Spread::Read(read, Some(portal)) if limit > 0 => {
                        self.portal_run_in_steps(read, *portal, limit as u64, &asked)
                            .await?
                    }
                    Spread::Read(read, _) => self.run_read(read, request, &asked).await?,
                    Spread::Declare {
                        read,
                        name,
                        hold,
                        stepwise,
                    } => {
                        let declared = if stepwise {
                            self.declare_stepwise(name, read, request, Some(&asked))
                                .await?
                        } else {
                            self.declare_held(name, hold, read, request, Some(&asked))
                                .await?
                        };
                        match declared {
                            super::cursors::Declared::Done => false,
                            super::cursors::Declared::Failed => true,
                            super::cursors::Declared::Refused(err) => {
                                self.batch_error(&err).await?;
                                return Ok(());
                            }
                        }
                    }
                    Spread::Write(shards) => self.run_write(shards, request, &asked).await?,
                    Spread::Split {
                        split,
                        requests,
                        params,
                    } => {
                        self.run_split_insert(&split, requests, Some(params), &asked)
                            .await?
                    }
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
                if self.parts.implicit {
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
    let mut out = BytesMut::new();
    request::parse(&mut out, "", sql, param_types)?;
    request::describe_statement(&mut out, "")?;
    match group {
        Some(columns) if bind.result_format_count() > 1 => {
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
        }
        _ => request::rebind(&mut out, b"", "", bind.tail),
    }
    request::describe_portal(&mut out);
    request::execute(&mut out);
    request::sync(&mut out);
    Ok(out.to_vec())
}
