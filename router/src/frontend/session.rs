//! One client's session after login: the statement loop of transaction pooling.
//!
//! Messages are handled as they arrive. A simple `Query` is routed as a whole; extended
//! protocol messages are held until the first `Bind` that names a shard (or the `Sync` that
//! ends the batch), then everything goes to that shard's connection in one write. Replies are
//! streamed back as raw frames; [`Replies`] says which to forward. At `ReadyForQuery` with
//! status idle the connection goes back to its pool; inside a transaction it stays pinned.
//!
//! `BEGIN` alone is answered by the router and sent later, in front of the transaction's first
//! statement, on the shard that statement names. A statement for a second shard inside a
//! transaction is refused *on the pinned backend* (a `RAISE` with SQLSTATE 0A000), so that
//! Postgres's transaction state and the client's stay the same.
//!
//! Statements that need more than one shard leave this loop for their own paths, outside any
//! transaction: DDL for every shard ([`super::broadcast`]), reads merged from several shards
//! ([`super::scatter`]), and COPY FROM STDIN split by key ([`super::copy_in`], with the
//! per-shard `CopyTarget` below).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use deadpool::managed::Object;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::broadcast::{self, Combined};
use super::copy_in;
use super::replies::{Audience, Completion, Kind, Replies};
use super::routing::{self, Decision};
use super::scatter;
use super::settings::{self, Change, Settings};
use crate::backend::pool::PooledConn;
use crate::errors;
use crate::planner::{NormalizeBuf, Plan};
use crate::protocol::frame::{begin_frame, end_frame, frames, next_frame, put_frame, put_query};
use crate::protocol::frontend::{self, Bind, Malformed, Parse, Target};
use crate::protocol::reply::{self, SqlError, TxStatus};
use crate::shared::{CancelTarget, ClientSlot, Shared};
use crate::statements::Statement;

mod merged;
mod prepared_sql;
mod split_insert;

/// A backend connection held by this client.
struct Pinned {
    shard: usize,
    conn: PooledConn,
}

/// A client's named prepared statement.
struct Named {
    stmt: Arc<Statement>,
    plan: Arc<Plan>,
    /// How many `$n` the client's text had (the rest of the plan's parameters are literals).
    params_before: usize,
    literals: Vec<Box<str>>,
}

/// The client's unnamed statement: kept in reused buffers, since drivers replace it with
/// every execution.
#[derive(Default)]
struct Unnamed {
    sql: String,
    param_types: Vec<u8>,
    plan: Option<Arc<Plan>>,
    params_before: usize,
    literals: Vec<Box<str>>,
}

/// Why a session ended abnormally (the client has been told where it could be).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("client connection: {0}")]
    Client(std::io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("backend connection lost inside a transaction: {0}")]
    BackendLost(String),
}

impl From<Malformed> for SessionError {
    fn from(m: Malformed) -> Self {
        SessionError::Protocol(m.to_string())
    }
}

/// Outcome of a backend exchange that failed.
enum ExchangeError {
    Client(std::io::Error),
    /// The backend broke or sent something unexpected; the connection is unusable.
    Backend(String),
}

pub struct Session {
    shared: Arc<Shared>,
    client: TcpStream,
    slot: Arc<ClientSlot>,
    cbuf: BytesMut,
    cout: Vec<u8>,
    bout: Vec<u8>,
    pinned: Option<Pinned>,
    replies: Replies,
    /// The transaction status the client was last told.
    tx: TxStatus,
    /// A `BEGIN` the client sent that no backend has seen yet.
    pending_begin: Option<String>,
    /// After a router error mid-batch: drop client messages until `Sync`.
    skip_until_sync: bool,
    /// Extended messages waiting for a route.
    held: Vec<u8>,
    /// Extended messages were sent since the last `Sync`: the connection must stay.
    in_batch: bool,
    /// A Bind, Execute or portal Close was sent since the last `Sync`: the batch has run
    /// something on its connection and cannot move to another shard.
    batch_executes: bool,
    named: HashMap<String, Named>,
    unnamed: Unnamed,
    /// The pinned connection holds the client's current unnamed statement.
    unnamed_on_conn: bool,
    nbuf: NormalizeBuf,
    /// The text of the statement being run, for the slow-statement log (buffer reused).
    last_sql: String,
    /// The client's session settings, applied to whichever connection serves it.
    settings: Settings,
    /// Setting changes of the open transaction: kept at COMMIT, dropped at ROLLBACK.
    tx_changes: Vec<Change>,
    /// An extended-protocol batch that runs DDL on every shard: the statement text. The batch
    /// is answered by the router until its Sync.
    broadcast: Option<String>,
    /// An extended-protocol batch that reads across all shards, until its Sync.
    scatter: Option<ScatterBatch>,
    /// The router raised its own error on the pinned connection: the next error forwarded is
    /// that one, and loses the server's PL/pgSQL context.
    raised: bool,
}

/// What a scattered extended-protocol batch has asked so far, to answer in order at Execute.
struct ScatterBatch {
    /// Parse + Bind + Describe(portal) + Execute + Sync for every shard.
    request: Vec<u8>,
    /// The shards to ask (all, or those of the statement's keys).
    shards: Vec<usize>,
    gather: Gather,
    /// The client's messages so far, to answer in order: Parse, Describe statement, Bind,
    /// Describe portal, Close.
    asked: Vec<u8>,
}

/// How the answers of a scattered statement combine (see [`Decision::Scatter`]).
#[derive(Clone, Debug)]
struct Gather {
    /// Sorted, grouped or aggregated: the merge engine's plan.
    plan: Option<Arc<crate::planner::MergePlan>>,
    limit: Option<u64>,
    offset: u64,
    /// A write: each shard's part in a transaction, all committed only if all succeeded.
    write: bool,
}

impl Session {
    pub fn new(
        shared: Arc<Shared>,
        client: TcpStream,
        cbuf: BytesMut,
        slot: Arc<ClientSlot>,
        settings: Settings,
    ) -> Session {
        Session {
            shared,
            client,
            slot,
            cbuf,
            cout: Vec::with_capacity(16 * 1024),
            bout: Vec::with_capacity(4 * 1024),
            pinned: None,
            replies: Replies::default(),
            tx: TxStatus::Idle,
            pending_begin: None,
            skip_until_sync: false,
            held: Vec::new(),
            in_batch: false,
            batch_executes: false,
            named: HashMap::new(),
            unnamed: Unnamed::default(),
            unnamed_on_conn: false,
            nbuf: NormalizeBuf::new(),
            last_sql: String::new(),
            settings,
            tx_changes: Vec::new(),
            broadcast: None,
            scatter: None,
            raised: false,
        }
    }

    /// Runs until the client leaves; a pinned connection that is not clean is discarded.
    pub async fn run(mut self) -> Result<(), SessionError> {
        let result = self.serve().await;
        if let Err(SessionError::Protocol(why)) = &result {
            // Like Postgres: a FATAL protocol-violation error, then the connection closes.
            self.cout.clear();
            SqlError::fatal(errors::PROTOCOL_VIOLATION, why.clone()).write(&mut self.cout);
            let _ = self.flush_client().await;
        }
        if let Some(p) = self.pinned.take() {
            let clean = self.tx == TxStatus::Idle && !self.in_batch && self.replies.is_empty();
            if !clean {
                // Never hand another client an open transaction or a half-read reply.
                drop(Object::take(p.conn));
            }
        }
        result
    }

    async fn serve(&mut self) -> Result<(), SessionError> {
        loop {
            while let Some(h) =
                next_frame(&self.cbuf).map_err(|e| SessionError::Protocol(e.to_string()))?
            {
                let frame = self.cbuf.split_to(h.total);
                // Replies the router made up for earlier messages go first: nothing is owed
                // by a backend between messages, so they are next in line.
                self.replies.drain_synthetic(&mut self.cout);
                match h.tag {
                    b'Q' => self.simple_query(&frame).await?,
                    b'P' | b'B' | b'D' | b'E' | b'C' | b'H' | b'S' => {
                        self.extended(h.tag, &frame).await?
                    }
                    b'X' => return Ok(()),
                    // Stray COPY messages after a failed COPY are ignored, as Postgres does.
                    b'd' | b'c' | b'f' => {}
                    other => {
                        return Err(SessionError::Protocol(format!(
                            "invalid frontend message type {other}"
                        )));
                    }
                }
            }
            self.replies.drain_synthetic(&mut self.cout);
            self.flush_client().await.map_err(SessionError::Client)?;
            if self.cbuf.capacity() - self.cbuf.len() < 4096 {
                self.cbuf.reserve(16 * 1024);
            }
            if self
                .client
                .read_buf(&mut self.cbuf)
                .await
                .map_err(SessionError::Client)?
                == 0
            {
                return Ok(());
            }
        }
    }

    async fn flush_client(&mut self) -> std::io::Result<()> {
        write_client(&mut self.client, &mut self.cout).await
    }

    fn shard_name(&self, shard: usize) -> String {
        self.shared.map.shards()[shard].range.to_string()
    }

    // ---- simple query ------------------------------------------------------------------

    async fn simple_query(&mut self, frame: &[u8]) -> Result<(), SessionError> {
        let sql = frontend::query(&frame[5..])?;
        self.last_sql.clear();
        self.last_sql.push_str(sql);
        let allow = self.allow_scatter_writes();
        let planned = self.shared.planner.plan(sql, &mut self.nbuf);
        let params_before = planned.params_before();
        let decision = routing::decide(
            &planned,
            None,
            params_before,
            &planned,
            &self.shared.map,
            allow,
        );
        drop(planned);
        let decision =
            match routing::manual_shard(sql, self.settings.get(MANUAL_SHARD), &self.shared.map) {
                Ok(manual) => routing::with_manual(decision, manual),
                Err(e) => Err(e),
            };

        // A transaction that failed before reaching any shard accepts only its end.
        if self.tx == TxStatus::Failed && self.pinned.is_none() {
            return match decision {
                Ok(Decision::Commit | Decision::Rollback) => {
                    self.end_virtual_transaction();
                    reply::command_complete(&mut self.cout, "ROLLBACK");
                    reply::ready_for_query(&mut self.cout, TxStatus::Idle);
                    Ok(())
                }
                _ => {
                    self.router_error_simple(in_failed_transaction());
                    Ok(())
                }
            };
        }
        let decision = match decision {
            Ok(d) => d,
            Err(err) => return self.refuse_simple(err).await,
        };
        if decision == Decision::PreparedSql {
            let sql = sql.to_string();
            return self.prepared_sql(&sql).await;
        }
        if decision == Decision::SplitInsert {
            let sql = sql.to_string();
            return self.split_insert(&sql).await;
        }
        if let Decision::CopyIn { key_type, format } = decision {
            if self.pinned.is_some() || self.tx != TxStatus::Idle {
                let err = SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "COPY into a sharded table cannot run inside a transaction, which stays on one shard",
                );
                return self.refuse_simple(err).await;
            }
            let sql = sql.to_string();
            self.copy_in(&sql, key_type, format).await?;
            reply::ready_for_query(&mut self.cout, TxStatus::Idle);
            return Ok(());
        }
        if let Decision::Scatter {
            combine,
            limit,
            offset,
            keyed,
            write,
        } = decision
        {
            if self.pinned.is_some() || self.tx != TxStatus::Idle {
                return self.refuse_simple(scatter_in_transaction()).await;
            }
            let planned = self.shared.planner.plan(sql, &mut self.nbuf);
            let shards = if keyed {
                routing::keyed_shards(
                    &planned,
                    None,
                    planned.params_before(),
                    &planned,
                    &self.shared.map,
                )
            } else {
                Ok((0..self.shared.map.shards().len()).collect())
            };
            let plan = combine.then(|| routing::merge_plan(&planned)).flatten();
            drop(planned);
            let shards = match shards {
                Ok(s) => s,
                Err(e) => return self.refuse_simple(e).await,
            };
            let request = match &plan {
                Some(p) if p.rewrite => match crate::planner::shard_sql(sql) {
                    Ok(text) => {
                        let mut q = Vec::with_capacity(text.len() + 6);
                        put_query(&mut q, &text);
                        q
                    }
                    Err(why) => return self.refuse_simple(cannot_rewrite(why)).await,
                },
                _ => frame.to_vec(),
            };
            let gather = Gather {
                plan,
                limit,
                offset,
                write,
            };
            self.run_scatter(&shards, request, gather, &[]).await?;
            reply::ready_for_query(&mut self.cout, TxStatus::Idle);
            return Ok(());
        }
        if decision == Decision::Broadcast {
            if self.pinned.is_some() || self.tx != TxStatus::Idle {
                return self.refuse_simple(ddl_in_transaction()).await;
            }
            let sql = sql.to_string();
            let answer = self.run_broadcast(&sql).await;
            self.cout.extend_from_slice(&answer);
            reply::ready_for_query(&mut self.cout, TxStatus::Idle);
            return Ok(());
        }
        if self.pinned.is_none() {
            match decision {
                Decision::Begin if self.tx == TxStatus::Idle => {
                    self.pending_begin = Some(sql.to_string());
                    self.tx = TxStatus::InTransaction;
                    reply::command_complete(&mut self.cout, "BEGIN");
                    reply::ready_for_query(&mut self.cout, self.tx);
                    return Ok(());
                }
                Decision::Commit | Decision::Rollback if self.pending_begin.is_some() => {
                    self.end_virtual_transaction();
                    let tag = if decision == Decision::Commit {
                        "COMMIT"
                    } else {
                        "ROLLBACK"
                    };
                    reply::command_complete(&mut self.cout, tag);
                    reply::ready_for_query(&mut self.cout, TxStatus::Idle);
                    return Ok(());
                }
                _ => {}
            }
        }
        let wanted = match decision {
            Decision::Shard(s) => Some(s),
            _ => None,
        };
        if let Err(err) = self.attach(wanted).await {
            self.router_error_simple(err);
            return Ok(());
        }
        if let (Some(p), Some(w)) = (&self.pinned, wanted) {
            if p.shard != w {
                let err =
                    errors::cross_shard_transaction(&self.shard_name(p.shard), &self.shard_name(w));
                return self.refuse_simple(err).await;
            }
        }
        self.bout.extend_from_slice(frame);
        self.replies.push(Kind::Query, Audience::Client);
        self.exchange().await?;
        self.release_if_idle().await;
        Ok(())
    }

    /// An error found by the router for a simple query. Inside a transaction on a backend it
    /// is raised there, so the backend's transaction fails exactly as the client is told.
    async fn refuse_simple(&mut self, err: SqlError) -> Result<(), SessionError> {
        if self.pinned.is_some() {
            self.push_raise_query(&err, Audience::Client);
            self.exchange().await?;
            self.release_if_idle().await;
            return Ok(());
        }
        self.router_error_simple(err);
        Ok(())
    }

    /// Answers a simple query with an error, without any backend.
    fn router_error_simple(&mut self, err: SqlError) {
        err.write(&mut self.cout);
        if self.tx != TxStatus::Idle {
            self.tx = TxStatus::Failed;
        }
        reply::ready_for_query(&mut self.cout, self.tx);
    }

    fn end_virtual_transaction(&mut self) {
        self.pending_begin = None;
        self.tx = TxStatus::Idle;
    }

    // ---- extended protocol -------------------------------------------------------------

    async fn extended(&mut self, tag: u8, frame: &[u8]) -> Result<(), SessionError> {
        if self.skip_until_sync && tag != b'S' {
            return Ok(());
        }
        let body = &frame[5..];
        if self.broadcast.is_some() {
            return self.extended_broadcast(tag, body).await;
        }
        if self.scatter.is_some() {
            return self.extended_scatter(tag, body).await;
        }
        match tag {
            b'P' => {
                let parse = frontend::parse(body)?;
                if let Err(err) = self.admit_parse(&parse) {
                    return self.batch_error(err).await;
                }
                self.route_or_hold(frame).await
            }
            b'B' => {
                let bind = frontend::bind(body)?;
                self.note_sql(bind.statement);
                let decision = match self.decide_bind(&bind) {
                    Ok(d) => d,
                    Err(err) => return self.batch_error(err).await,
                };
                if matches!(decision, Decision::Broadcast | Decision::Scatter { .. })
                    && self.batch_only_prepared()
                {
                    // A Flush made a shard answer the batch's Parse/Describe: that is no
                    // transaction, so finish it there and run on every shard.
                    self.finish_preparation().await?;
                }
                if decision == Decision::Broadcast {
                    if self.pinned.is_some() || self.tx != TxStatus::Idle {
                        return self.batch_error(ddl_in_transaction()).await;
                    }
                    return self.begin_broadcast_batch();
                }
                if decision == Decision::PreparedSql {
                    let err = SqlError::new(
                        errors::FEATURE_NOT_SUPPORTED,
                        "PREPARE, EXECUTE and DEALLOCATE are supported in the simple query protocol only",
                    )
                    .with_hint("use the driver's own prepared statements, or send the command as a simple query");
                    return self.batch_error(err).await;
                }
                if let Decision::CopyIn { .. } = decision {
                    let err = SqlError::new(
                        errors::FEATURE_NOT_SUPPORTED,
                        "COPY into a sharded table is supported in the simple query protocol only",
                    )
                    .with_hint("send COPY ... FROM STDIN as a simple query, as psql's \\copy does");
                    return self.batch_error(err).await;
                }
                if let Decision::Scatter {
                    combine,
                    limit,
                    offset,
                    keyed,
                    write,
                } = decision
                {
                    if self.pinned.is_some() || self.tx != TxStatus::Idle {
                        return self.batch_error(scatter_in_transaction()).await;
                    }
                    let shards = if keyed {
                        match self.bind_shards(&bind) {
                            Ok(s) => s,
                            Err(e) => return self.batch_error(e).await,
                        }
                    } else {
                        (0..self.shared.map.shards().len()).collect()
                    };
                    let plan = combine
                        .then(|| self.plan_of(bind.statement))
                        .flatten()
                        .and_then(|p| routing::merge_plan(&p));
                    let gather = Gather {
                        plan,
                        limit,
                        offset,
                        write,
                    };
                    let shard_text = match gather.plan.as_deref() {
                        Some(p) if p.rewrite => {
                            match crate::planner::shard_sql(&self.sql_of(bind.statement)) {
                                Ok(text) => Some(text),
                                Err(why) => return self.batch_error(cannot_rewrite(why)).await,
                            }
                        }
                        _ => None,
                    };
                    return self.begin_scatter_batch(&bind, gather, shards, shard_text);
                }
                if let Decision::Shard(shard) = decision {
                    match &self.pinned {
                        Some(_) if self.batch_only_prepared() => {
                            // The connection only prepared statements for this batch (a Flush
                            // needed answers before the key was known): finish that there and
                            // move to the key's shard.
                            self.finish_preparation().await?;
                            if let Err(err) = self.attach(Some(shard)).await {
                                return self.batch_error(err).await;
                            }
                        }
                        Some(p) if p.shard != shard => {
                            let err = errors::cross_shard_transaction(
                                &self.shard_name(p.shard),
                                &self.shard_name(shard),
                            );
                            return self.batch_error(err).await;
                        }
                        Some(_) => {}
                        None => {
                            if let Err(err) = self.attach(Some(shard)).await {
                                return self.batch_error(err).await;
                            }
                        }
                    }
                }
                self.route_or_hold(frame).await
            }
            b'D' | b'C' => {
                let target =
                    frontend::target(body, if tag == b'D' { "Describe" } else { "Close" })?;
                if target.kind == b'S'
                    && !target.name.is_empty()
                    && !self.named.contains_key(target.name)
                {
                    if tag == b'C' {
                        // Closing a statement that does not exist is not an error in Postgres.
                        return self.route_or_hold(frame).await;
                    }
                    let err = SqlError::new(
                        errors::UNDEFINED_PREPARED_STATEMENT,
                        format!("prepared statement \"{}\" does not exist", target.name),
                    );
                    return self.batch_error(err).await;
                }
                self.route_or_hold(frame).await
            }
            b'E' => self.route_or_hold(frame).await,
            b'H' => {
                if self.pinned.is_none() && self.held_needs_backend()? {
                    // Answering only Parse/Describe does not start the client's transaction.
                    let with_begin = !self.held_only_prepares()?;
                    if let Err(err) = self.attach_conn(None, with_begin).await {
                        return self.batch_error(err).await;
                    }
                }
                self.release_held().await?;
                if self.pinned.is_some() {
                    self.bout.extend_from_slice(frame);
                    self.exchange().await?;
                }
                Ok(())
            }
            b'S' => self.sync(frame).await,
            _ => Ok(()),
        }
    }

    /// Runs DDL on every shard and returns the client's answer (without ReadyForQuery).
    async fn run_broadcast(&mut self, sql: &str) -> Vec<u8> {
        let started = std::time::Instant::now();
        let outcomes = broadcast::run(&self.shared, sql, &self.settings).await;
        let names: Vec<String> = self
            .shared
            .map
            .shards()
            .iter()
            .map(|s| s.range.to_string())
            .collect();
        let mut out = Vec::new();
        let combined = broadcast::combine(&outcomes, &names);
        match combined {
            Combined::Done(tags) => {
                // The DDL may have changed a sharded table's columns.
                super::catalog::learn_key_positions(&self.shared).await;
                out = tags
            }
            Combined::PostgresError(frame) => out = frame,
            Combined::Error(e) => {
                tracing::warn!(statement = %truncate(sql, 300), "DDL failed on some shards: {}", e.message);
                e.write(&mut out);
            }
        }
        tracing::info!(shards = names.len(), elapsed_ms = started.elapsed().as_secs_f64() * 1e3, statement = %truncate(sql, 300), "DDL broadcast");
        out
    }

    /// A Bind of DDL for every shard: answer what was held (the driver's Parse/Describe) and
    /// the Bind itself; the Execute runs the broadcast.
    fn begin_broadcast_batch(&mut self) -> Result<(), SessionError> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        for frame in frames(&held) {
            let frame = frame.map_err(protocol_error)?;
            let body = &frame[5..];
            match frame[0] {
                b'P' => reply::parse_complete(&mut out),
                b'D' => no_data_description(&mut out, frontend::target(body, "Describe")?.kind),
                b'C' => {
                    let t = frontend::target(body, "Close")?;
                    self.close_statement(&t);
                    reply::close_complete(&mut out);
                }
                _ => {}
            }
        }
        reply::bind_complete(&mut out);
        self.replies.push_synthetic(out);
        self.broadcast = Some(self.last_sql.clone());
        Ok(())
    }

    /// The rest of a DDL batch, up to its Sync.
    async fn extended_broadcast(&mut self, tag: u8, body: &[u8]) -> Result<(), SessionError> {
        let mut out = Vec::new();
        match tag {
            b'D' => no_data_description(&mut out, frontend::target(body, "Describe")?.kind),
            b'C' => {
                let t = frontend::target(body, "Close")?;
                self.close_statement(&t);
                reply::close_complete(&mut out);
            }
            b'E' => {
                let sql = self.broadcast.clone().unwrap_or_default();
                out = self.run_broadcast(&sql).await;
                if out.first() == Some(&b'E') {
                    self.skip_until_sync = true;
                }
            }
            b'S' => {
                self.broadcast = None;
                self.skip_until_sync = false;
                reply::ready_for_query(&mut out, TxStatus::Idle);
            }
            b'H' => {}
            _ => {
                self.broadcast = None;
                SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "DDL that goes to every shard must be the only statement of its batch",
                )
                .with_hint("send a Sync after the DDL's Execute")
                .write(&mut out);
                self.skip_until_sync = true;
                self.replies.push_synthetic(out);
                // The rest of the batch is dropped; the Sync still answers.
                self.broadcast = None;
                return Ok(());
            }
        }
        self.replies.push_synthetic(out);
        Ok(())
    }

    /// Runs a read on every shard and streams the merged answer to the client (without
    /// ReadyForQuery); `true` when it ended with an error. For the extended protocol `asked`
    /// lists the client's messages of the batch, to answer in order before the rows: `P`
    /// (Parse), `S` (Describe statement), `B` (Bind), `D` (Describe portal), `C` (Close); the
    /// descriptions come from shard 0.
    async fn run_scatter(
        &mut self,
        shards: &[usize],
        request: Vec<u8>,
        gather: Gather,
        asked: &[u8],
    ) -> Result<bool, SessionError> {
        let Gather {
            plan,
            limit,
            offset,
            write,
        } = gather;
        if let Some(plan) = plan {
            return self
                .run_merged(shards, request, plan, limit, offset, asked)
                .await;
        }
        // Dropped on every early return below, which rolls back a write everywhere.
        let commit = write.then(|| tokio::sync::watch::channel(None).0);
        let mut receivers = scatter::start(
            &self.shared,
            shards,
            request,
            &self.settings,
            commit.as_ref(),
        );
        let extended = !asked.is_empty();
        let (mut statement_desc, mut portal_desc) = (Vec::new(), Vec::new());
        let mut descriptions = 0;
        let mut answered = !extended;
        let mut rows_sent: u64 = 0;
        // The command of the shards' CommandComplete (SELECT, UPDATE, DELETE) and the sum of
        // their row counts.
        let mut verb: Option<String> = None;
        let mut tagged: u64 = 0;
        let mut copy_out = false;
        for (shard, rx) in receivers.iter_mut().enumerate() {
            loop {
                let chunk = match rx.recv().await {
                    Some(Ok(chunk)) => chunk,
                    Some(Err(err)) => {
                        err.write(&mut self.cout);
                        return Ok(true);
                    }
                    None => {
                        SqlError::new(
                            errors::CONNECTION_FAILURE,
                            "internal: a shard's read ended early",
                        )
                        .write(&mut self.cout);
                        return Ok(true);
                    }
                };
                let mut done = false;
                for frame in frames(&chunk).map_while(Result::ok) {
                    match frame[0] {
                        // The first error ends the read; the other shards' connections are
                        // dropped when their channels close.
                        b'E' => {
                            self.cout.extend_from_slice(frame);
                            return Ok(true);
                        }
                        b't' if extended && shard == 0 => statement_desc.extend_from_slice(frame),
                        b'T' | b'n' if extended && shard == 0 => {
                            if descriptions == 0 {
                                statement_desc.extend_from_slice(frame);
                            } else {
                                portal_desc.extend_from_slice(frame);
                            }
                            descriptions += 1;
                        }
                        b'T' if !extended && shard == 0 => self.cout.extend_from_slice(frame),
                        b'D' => {
                            if !answered {
                                answer_asked(&mut self.cout, asked, &statement_desc, &portal_desc);
                                answered = true;
                            }
                            if limit.is_none_or(|l| rows_sent < l) {
                                self.cout.extend_from_slice(frame);
                                rows_sent += 1;
                            }
                        }
                        b'C' => {
                            let body = &frame[5..];
                            tagged += scatter::rows_in_tag(body);
                            if verb.is_none() {
                                let text = String::from_utf8_lossy(
                                    body.strip_suffix(b"\0").unwrap_or(body),
                                )
                                .into_owned();
                                let word = text
                                    .rsplit_once(' ')
                                    .map_or(text.as_str(), |(w, _)| w)
                                    .to_string();
                                verb = Some(word);
                            }
                        }
                        // COPY ... TO STDOUT: one CopyOutResponse, every shard's data, one
                        // CopyDone at the end.
                        b'H' => {
                            if !answered {
                                answer_asked(&mut self.cout, asked, &statement_desc, &portal_desc);
                                answered = true;
                            }
                            if shard == 0 {
                                self.cout.extend_from_slice(frame);
                                copy_out = true;
                            }
                        }
                        b'd' => self.cout.extend_from_slice(frame),
                        b'Z' => done = true,
                        _ => {}
                    }
                }
                if self.cout.len() >= 64 * 1024 {
                    self.flush_client().await.map_err(SessionError::Client)?;
                }
                if done {
                    break;
                }
            }
            if !answered {
                answer_asked(&mut self.cout, asked, &statement_desc, &portal_desc);
                answered = true;
            }
        }
        if let Some(commit) = commit {
            if let Err(err) = self
                .commit_everywhere(&commit, &mut receivers, shards)
                .await
            {
                err.write(&mut self.cout);
                return Ok(true);
            }
        }
        if copy_out {
            put_frame(&mut self.cout, b'c', &[]);
        }
        match verb.as_deref() {
            // A read's count is what the client got (a LIMIT may have cut the rows).
            None | Some("SELECT") => {
                reply::command_complete(&mut self.cout, &format!("SELECT {rows_sent}"))
            }
            Some(verb) => reply::command_complete(&mut self.cout, &format!("{verb} {tagged}")),
        }
        Ok(false)
    }

    /// Tells every shard of a write to COMMIT and waits for all; the error names the shards
    /// that committed and those that did not.
    async fn commit_everywhere(
        &self,
        commit: &tokio::sync::watch::Sender<Option<bool>>,
        receivers: &mut [tokio::sync::mpsc::Receiver<scatter::Chunk>],
        shards: &[usize],
    ) -> Result<(), SqlError> {
        let _ = commit.send(Some(true));
        let mut failed = Vec::new();
        let mut first = String::new();
        for (i, rx) in receivers.iter_mut().enumerate() {
            match rx.recv().await {
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    failed.push(i);
                    if first.is_empty() {
                        first = e.message.clone();
                    }
                }
                None => failed.push(i),
            }
        }
        if failed.is_empty() {
            return Ok(());
        }
        let names = |pick: &dyn Fn(usize) -> bool| -> String {
            (0..shards.len())
                .filter(|&i| pick(i))
                .map(|i| self.shard_name(shards[i]))
                .collect::<Vec<_>>()
                .join(", ")
        };
        Err(SqlError::new(
            errors::CONNECTION_FAILURE,
            format!(
                "the write committed on shards {} but its COMMIT failed on {}: {first}",
                names(&|i| !failed.contains(&i)),
                names(&|i| failed.contains(&i)),
            ),
        )
        .with_hint("the failed shards' part of the write may be missing: check those rows and run it there again"))
    }

    /// COPY FROM STDIN into a sharded table: the client's rows are split by key and streamed
    /// to the shards that own them, each shard running the same COPY statement in its own
    /// transaction; the client gets one answer (without ReadyForQuery).
    async fn copy_in(
        &mut self,
        sql: &str,
        key_type: shardmap::KeyType,
        format: copy_in::Format,
    ) -> Result<(), SessionError> {
        let mut g = Vec::with_capacity(8 + 2 * format.columns);
        g.push(0);
        g.extend_from_slice(&(format.columns as i16).to_be_bytes());
        for _ in 0..format.columns {
            g.extend_from_slice(&0i16.to_be_bytes());
        }
        put_frame(&mut self.cout, b'G', &g);
        self.flush_client().await.map_err(SessionError::Client)?;

        let shard_count = self.shared.map.shards().len();
        let mut targets: Vec<Option<CopyTarget>> = (0..shard_count).map(|_| None).collect();
        let mut rows = copy_in::Rows::new(format);
        let mut header: Option<Vec<u8>> = None;
        let mut failure: Option<SqlError> = None;
        let mut batch: Vec<Vec<u8>> = Vec::new();
        let client_failed: Option<String> = loop {
            let h = loop {
                match next_frame(&self.cbuf).map_err(|e| SessionError::Protocol(e.to_string()))? {
                    Some(h) => break h,
                    None => {
                        if self
                            .client
                            .read_buf(&mut self.cbuf)
                            .await
                            .map_err(SessionError::Client)?
                            == 0
                        {
                            // The client left mid-COPY: nothing is committed anywhere.
                            for t in targets.iter_mut().flatten() {
                                t.abandon();
                            }
                            return Err(SessionError::Client(std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                "the client left during COPY",
                            )));
                        }
                    }
                }
            };
            let frame = self.cbuf.split_to(h.total);
            match h.tag {
                b'd' => rows.feed(&frame[5..], |row| batch.push(row.to_vec())),
                b'c' => {
                    rows.finish(|row| batch.push(row.to_vec()));
                }
                b'f' => {
                    let msg = String::from_utf8_lossy(
                        frame[5..].strip_suffix(b"\0").unwrap_or(&frame[5..]),
                    )
                    .into_owned();
                    break Some(msg);
                }
                b'H' | b'S' => {}
                other => {
                    return Err(SessionError::Protocol(format!(
                        "unexpected message type {} during COPY from stdin",
                        other as char
                    )))
                }
            }
            for row in batch.drain(..) {
                if failure.is_some() {
                    continue;
                }
                if format.header && header.is_none() {
                    header = Some(row);
                    continue;
                }
                let shard = match copy_in::key_of(&row, &format) {
                    // A NULL key is refused by Postgres itself (it is the primary key); let the
                    // default shard say so.
                    None => self.shared.map.default_shard(),
                    Some(text) => match key_type.parse_key(&text) {
                        Ok(key) => self.shared.map.shard_for_key(&key),
                        Err(e) => {
                            failure = Some(SqlError::new(
                                errors::INVALID_TEXT_REPRESENTATION,
                                e.to_string(),
                            ));
                            continue;
                        }
                    },
                };
                if targets[shard].is_none() {
                    match CopyTarget::open(
                        &self.shared,
                        shard,
                        sql,
                        &self.settings,
                        header.as_deref(),
                    )
                    .await
                    {
                        Ok(t) => targets[shard] = Some(t),
                        Err(e) => {
                            failure = Some(e);
                            continue;
                        }
                    }
                }
                if let Some(t) = targets[shard].as_mut() {
                    t.push(&row).await;
                }
            }
            if h.tag == b'c' {
                break None;
            }
        };

        let mut outcomes = Vec::new();
        let mut names = Vec::new();
        for (shard, t) in targets.into_iter().enumerate() {
            if let Some(t) = t {
                outcomes.push(
                    t.finish(
                        client_failed
                            .as_deref()
                            .or(failure.as_ref().map(|_| "rejected by the router")),
                    )
                    .await,
                );
                names.push(self.shared.map.shards()[shard].range.to_string());
            }
        }
        if let Some(msg) = client_failed {
            SqlError::new("57014", format!("COPY from stdin failed: {msg}")).write(&mut self.cout);
            return Ok(());
        }
        if let Some(err) = failure {
            // Nothing was committed: every shard's COPY was failed on purpose.
            err.write(&mut self.cout);
            return Ok(());
        }
        match broadcast::combine(&outcomes, &names) {
            Combined::Done(_) => {
                let rows: u64 = outcomes
                    .iter()
                    .map(|o| match o {
                        broadcast::Outcome::Done(tags) => {
                            scatter::rows_in_tag(tags.get(5..).unwrap_or_default())
                        }
                        _ => 0,
                    })
                    .sum();
                reply::command_complete(&mut self.cout, &format!("COPY {rows}"));
            }
            Combined::PostgresError(frame) => self.cout.extend_from_slice(&frame),
            Combined::Error(e) => e.write(&mut self.cout),
        }
        Ok(())
    }

    /// A Bind of a read across all shards: the rest of the batch is answered from all shards
    /// at Execute.
    fn begin_scatter_batch(
        &mut self,
        bind: &Bind<'_>,
        gather: Gather,
        shards: Vec<usize>,
        shard_text: Option<String>,
    ) -> Result<(), SessionError> {
        let (sql, types) = if bind.statement.is_empty() {
            (self.unnamed.sql.clone(), self.unnamed.param_types.clone())
        } else {
            match self.named.get(bind.statement) {
                Some(n) => (n.stmt.sql.to_string(), n.stmt.param_types.to_vec()),
                None => (String::new(), vec![0, 0]),
            }
        };
        // The shards run the rewritten text when the merge needs one.
        let sql = shard_text.unwrap_or(sql);
        let mut request = Vec::new();
        write_parse(&mut request, b"\0", &sql, &types);
        put_frame(&mut request, b'D', b"S\0");
        let at = begin_frame(&mut request, b'B');
        request.extend_from_slice(b"\0\0");
        match gather.plan.as_deref().and_then(|p| p.group.as_deref()) {
            // One format code per column, and the shards answer more columns than the client
            // sees (each `avg` is asked as `sum` and `count`): one code per shard column.
            Some(out) if bind.result_format_count() > 1 => {
                request.extend_from_slice(bind.without_result_formats());
                let codes: Vec<i16> = out
                    .iter()
                    .enumerate()
                    .flat_map(|(i, o)| {
                        let code = i16::from(bind.result_binary(i));
                        let n = if matches!(o, crate::merge::Out::Avg { .. }) {
                            2
                        } else {
                            1
                        };
                        std::iter::repeat_n(code, n)
                    })
                    .collect();
                request.extend_from_slice(&(codes.len() as i16).to_be_bytes());
                for c in codes {
                    request.extend_from_slice(&c.to_be_bytes());
                }
            }
            _ => request.extend_from_slice(bind.tail),
        }
        end_frame(&mut request, at);
        put_frame(&mut request, b'D', b"P\0");
        put_frame(&mut request, b'E', b"\0\0\0\0\0");
        put_frame(&mut request, b'S', &[]);
        let mut asked = Vec::new();
        let held = std::mem::take(&mut self.held);
        for frame in frames(&held) {
            let frame = frame.map_err(protocol_error)?;
            let body = &frame[5..];
            match frame[0] {
                b'P' => asked.push(b'P'),
                b'D' => asked.push(if frontend::target(body, "Describe")?.kind == b'S' {
                    b'S'
                } else {
                    b'D'
                }),
                b'C' => {
                    let t = frontend::target(body, "Close")?;
                    self.close_statement(&t);
                    asked.push(b'C');
                }
                _ => {}
            }
        }
        asked.push(b'B');
        self.scatter = Some(ScatterBatch {
            request,
            shards,
            gather,
            asked,
        });
        Ok(())
    }

    /// The rest of a scattered batch, up to its Sync.
    async fn extended_scatter(&mut self, tag: u8, body: &[u8]) -> Result<(), SessionError> {
        match tag {
            b'D' => {
                let kind = frontend::target(body, "Describe")?.kind;
                if let Some(b) = self.scatter.as_mut() {
                    b.asked.push(if kind == b'S' { b'S' } else { b'D' });
                }
            }
            b'C' => {
                let t = frontend::target(body, "Close")?;
                self.close_statement(&t);
                if let Some(b) = self.scatter.as_mut() {
                    b.asked.push(b'C');
                }
            }
            b'E' => {
                self.replies.drain_synthetic(&mut self.cout);
                let Some(batch) = self.scatter.as_mut() else {
                    return Ok(());
                };
                let request = std::mem::take(&mut batch.request);
                if request.is_empty() {
                    return Ok(());
                }
                let gather = batch.gather.clone();
                let asked = std::mem::take(&mut batch.asked);
                let shards = std::mem::take(&mut batch.shards);
                if self.run_scatter(&shards, request, gather, &asked).await? {
                    self.skip_until_sync = true;
                }
            }
            b'S' => {
                if let Some(batch) = self.scatter.take() {
                    // A batch that never executed: answer what it asked.
                    answer_asked(&mut self.cout, &batch.asked, &[], &[]);
                }
                self.skip_until_sync = false;
                reply::ready_for_query(&mut self.cout, TxStatus::Idle);
            }
            b'H' => {}
            _ => {
                self.scatter = None;
                SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "a read across all shards must be the only statement of its batch",
                )
                .with_hint("send a Sync after its Execute")
                .write(&mut self.cout);
                self.skip_until_sync = true;
            }
        }
        Ok(())
    }

    /// Sends a message now when a connection is pinned, or holds it until the route is known.
    async fn route_or_hold(&mut self, frame: &[u8]) -> Result<(), SessionError> {
        if self.pinned.is_some() {
            self.release_held().await?;
            self.send(frame)?;
            Ok(())
        } else {
            self.held.extend_from_slice(frame);
            Ok(())
        }
    }

    async fn sync(&mut self, frame: &[u8]) -> Result<(), SessionError> {
        if self.skip_until_sync {
            self.skip_until_sync = false;
            self.held.clear();
            if self.pinned.is_some() {
                self.bout.extend_from_slice(frame);
                self.replies.push(Kind::Sync, Audience::Client);
                self.exchange().await?;
            } else {
                self.replies.push_synthetic(ready_bytes(self.tx));
            }
            self.in_batch = false;
            self.batch_executes = false;
            self.release_if_idle().await;
            return Ok(());
        }
        if self.pinned.is_none() {
            if let Some(outcome) = self.virtual_batch()? {
                self.held.clear();
                self.replies.push_synthetic(outcome);
                return Ok(());
            }
            if self.pending_begin.is_some() && self.held_only_prepares()? {
                return self.prepare_outside_transaction(frame).await;
            }
            if self.held_needs_backend()? {
                if let Err(err) = self.attach(None).await {
                    self.held.clear();
                    err.write(&mut self.cout);
                    self.replies.push_synthetic(ready_bytes(self.tx));
                    return Ok(());
                }
            }
        }
        self.release_held().await?;
        if self.pinned.is_some() {
            self.bout.extend_from_slice(frame);
            self.replies.push(Kind::Sync, Audience::Client);
            self.exchange().await?;
            self.in_batch = false;
            self.batch_executes = false;
            self.release_if_idle().await;
        } else {
            self.replies.push_synthetic(ready_bytes(self.tx));
        }
        Ok(())
    }

    /// A batch of only `BEGIN`, `COMMIT` or `ROLLBACK` with no connection pinned is answered
    /// by the router, as in the simple protocol. Returns the replies, or `None` when the
    /// batch needs a backend.
    fn virtual_batch(&mut self) -> Result<Option<Vec<u8>>, SessionError> {
        if self.held.is_empty() {
            return Ok(None);
        }
        let held = std::mem::take(&mut self.held);
        let result = self.virtual_batch_of(&held);
        self.held = held;
        result
    }

    fn virtual_batch_of(&mut self, held: &[u8]) -> Result<Option<Vec<u8>>, SessionError> {
        let mut out = Vec::new();
        let mut effect: Option<(Decision, String)> = None;
        let mut bound: Option<(Decision, String)> = None;
        for frame in frames(held) {
            let frame = frame.map_err(protocol_error)?;
            let body = &frame[5..];
            match frame[0] {
                b'P' => {
                    let p = frontend::parse(body)?;
                    if txn_control(&self.plan_of(p.name)).is_none() {
                        return Ok(None);
                    }
                    reply::parse_complete(&mut out);
                }
                b'B' => {
                    let b = frontend::bind(body)?;
                    let plan = self.plan_of(b.statement);
                    let Some(d) = txn_control(&plan) else {
                        return Ok(None);
                    };
                    bound = Some((d, self.sql_of(b.statement)));
                    reply::bind_complete(&mut out);
                }
                b'D' => no_data_description(&mut out, frontend::target(body, "Describe")?.kind),
                b'E' => {
                    let Some((d, sql)) = bound.clone() else {
                        return Ok(None);
                    };
                    let tag = match d {
                        Decision::Begin => "BEGIN",
                        Decision::Commit if self.tx != TxStatus::Failed => "COMMIT",
                        _ => "ROLLBACK",
                    };
                    reply::command_complete(&mut out, tag);
                    effect = Some((d, sql));
                }
                b'C' => {
                    let t = frontend::target(body, "Close")?;
                    self.close_statement(&t);
                    reply::close_complete(&mut out);
                }
                _ => return Ok(None),
            }
        }
        match effect {
            Some((Decision::Begin, sql)) if self.tx == TxStatus::Idle => {
                self.pending_begin = Some(sql);
                self.tx = TxStatus::InTransaction;
            }
            Some((Decision::Begin, _)) => return Ok(None),
            Some(_) => self.end_virtual_transaction(),
            None => {}
        }
        reply::ready_for_query(&mut out, self.tx);
        Ok(Some(out))
    }

    fn plan_of(&self, statement: &str) -> Option<Arc<Plan>> {
        if statement.is_empty() {
            self.unnamed.plan.clone()
        } else {
            self.named.get(statement).map(|n| n.plan.clone())
        }
    }

    fn sql_of(&self, statement: &str) -> String {
        if statement.is_empty() {
            self.unnamed.sql.clone()
        } else {
            self.named
                .get(statement)
                .map(|n| n.stmt.sql.to_string())
                .unwrap_or_default()
        }
    }

    /// Drivers prepare a statement (Parse, Describe, Sync) before its first Bind, also right
    /// after BEGIN. Preparing is not part of the transaction, so it runs on any shard, outside
    /// it, and the transaction is still free to start on the shard its first statement names.
    async fn prepare_outside_transaction(&mut self, sync: &[u8]) -> Result<(), SessionError> {
        if let Err(err) = self.attach_conn(None, false).await {
            self.held.clear();
            err.write(&mut self.cout);
            self.tx = TxStatus::Failed;
            self.replies.push_synthetic(ready_bytes(self.tx));
            return Ok(());
        }
        self.release_held().await?;
        self.bout.extend_from_slice(sync);
        self.replies.push(Kind::Sync, Audience::Router);
        self.replies.push_synthetic(ready_bytes(self.tx));
        self.exchange().await?;
        self.in_batch = false;
        self.batch_executes = false;
        if self.replies.is_empty() {
            self.release();
        }
        Ok(())
    }

    /// Whether the pinned connection holds nothing of the client's but statements prepared in
    /// the current batch: no transaction, nothing executed.
    fn batch_only_prepared(&self) -> bool {
        self.pinned.is_some()
            && self.in_batch
            && !self.batch_executes
            && (self.tx == TxStatus::Idle || self.pending_begin.is_some())
    }

    /// Ends the current batch on the pinned connection with a Sync the client does not see
    /// and returns the connection to its pool.
    async fn finish_preparation(&mut self) -> Result<(), SessionError> {
        let mut sync = Vec::with_capacity(5);
        put_frame(&mut sync, b'S', &[]);
        self.bout.extend_from_slice(&sync);
        self.replies.push(Kind::Sync, Audience::Silent);
        self.exchange().await?;
        self.in_batch = false;
        self.batch_executes = false;
        self.release();
        Ok(())
    }

    /// Whether the held messages only prepare, describe or close statements.
    fn held_only_prepares(&self) -> Result<bool, SessionError> {
        for frame in frames(&self.held) {
            let frame = frame.map_err(protocol_error)?;
            let ok = match frame[0] {
                b'P' => true,
                b'D' | b'C' => frontend::target(&frame[5..], "Describe")?.kind == b'S',
                _ => false,
            };
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether the held messages need a backend at all (Close of a statement does not).
    fn held_needs_backend(&self) -> Result<bool, SessionError> {
        for frame in frames(&self.held) {
            let frame = frame.map_err(protocol_error)?;
            if frame[0] != b'C' || frontend::target(&frame[5..], "Close")?.kind != b'S' {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Sends the held messages, in order, now that a connection is pinned (or answers them
    /// itself when none is needed).
    async fn release_held(&mut self) -> Result<(), SessionError> {
        if self.held.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        for frame in frames(&held) {
            self.send(frame.map_err(protocol_error)?)?;
        }
        self.held = held;
        self.held.clear();
        Ok(())
    }

    /// Registers a client Parse; the statement is prepared on a backend when one is chosen.
    fn admit_parse(&mut self, p: &Parse<'_>) -> Result<(), SqlError> {
        let planned = self.shared.planner.plan(p.sql, &mut self.nbuf);
        let literals = stored_literals(&planned);
        let plan = planned.plan().clone();
        let params_before = planned.params_before();
        drop(planned);
        if p.name.is_empty() {
            self.unnamed.sql.clear();
            self.unnamed.sql.push_str(p.sql);
            self.unnamed.param_types.clear();
            self.unnamed.param_types.extend_from_slice(p.param_types);
            self.unnamed.plan = Some(plan);
            self.unnamed.params_before = params_before;
            self.unnamed.literals = literals;
            return Ok(());
        }
        if self.named.contains_key(p.name) {
            return Err(SqlError::new(
                errors::DUPLICATE_PREPARED_STATEMENT,
                format!("prepared statement \"{}\" already exists", p.name),
            ));
        }
        let stmt = self.shared.statements.intern(p.sql, p.param_types);
        self.named.insert(
            p.name.to_string(),
            Named {
                stmt,
                plan,
                params_before,
                literals,
            },
        );
        Ok(())
    }

    /// Whether UPDATE/DELETE without a key may run on every shard: the config, or the
    /// client's `SET shardgate.allow_scatter_writes`.
    fn allow_scatter_writes(&self) -> bool {
        match self.settings.get("shardgate.allow_scatter_writes") {
            Some(v) => matches!(
                v.trim().trim_matches('\'').to_ascii_lowercase().as_str(),
                "on" | "true" | "1" | "yes"
            ),
            None => self.shared.config.limits.allow_scatter_writes,
        }
    }

    /// Remembers the text of the statement a Bind runs, for the slow-statement log.
    fn note_sql(&mut self, statement: &str) {
        self.last_sql.clear();
        if statement.is_empty() {
            self.last_sql.push_str(&self.unnamed.sql);
        } else if let Some(n) = self.named.get(statement) {
            self.last_sql.push_str(&n.stmt.sql);
        }
    }

    fn decide_bind(&self, b: &Bind<'_>) -> Result<Decision, SqlError> {
        let sql = if b.statement.is_empty() {
            Some(self.unnamed.sql.as_str())
        } else {
            self.named.get(b.statement).map(|n| &*n.stmt.sql)
        };
        let manual = match sql {
            Some(sql) => {
                routing::manual_shard(sql, self.settings.get(MANUAL_SHARD), &self.shared.map)?
            }
            None => None,
        };
        routing::with_manual(self.decide_bind_by_plan(b), manual)
    }

    /// The shards of the keys a Bind gives its statement.
    fn bind_shards(&self, b: &Bind<'_>) -> Result<Vec<usize>, SqlError> {
        let map = &self.shared.map;
        if b.statement.is_empty() {
            return match &self.unnamed.plan {
                Some(plan) => routing::keyed_shards(
                    plan,
                    Some(b),
                    self.unnamed.params_before,
                    &self.unnamed.literals[..],
                    map,
                ),
                None => Ok(Vec::new()),
            };
        }
        match self.named.get(b.statement) {
            Some(n) => {
                routing::keyed_shards(&n.plan, Some(b), n.params_before, &n.literals[..], map)
            }
            None => Ok(Vec::new()),
        }
    }

    fn decide_bind_by_plan(&self, b: &Bind<'_>) -> Result<Decision, SqlError> {
        let map = &self.shared.map;
        if b.statement.is_empty() {
            let Some(plan) = &self.unnamed.plan else {
                return Err(SqlError::new(
                    errors::UNDEFINED_PREPARED_STATEMENT,
                    "unnamed prepared statement does not exist",
                ));
            };
            return routing::decide(
                plan,
                Some(b),
                self.unnamed.params_before,
                &self.unnamed.literals[..],
                map,
                self.allow_scatter_writes(),
            );
        }
        match self.named.get(b.statement) {
            Some(n) => routing::decide(
                &n.plan,
                Some(b),
                n.params_before,
                &n.literals[..],
                map,
                self.allow_scatter_writes(),
            ),
            None => Err(SqlError::new(
                errors::UNDEFINED_PREPARED_STATEMENT,
                format!("prepared statement \"{}\" does not exist", b.statement),
            )),
        }
    }

    fn close_statement(&mut self, t: &Target<'_>) {
        if t.kind == b'S' {
            if t.name.is_empty() {
                self.unnamed.plan = None;
            } else {
                self.named.remove(t.name);
            }
        }
    }

    /// Writes one extended message to the backend buffer, rewritten for the pinned
    /// connection, and records the replies it will produce. Without a connection only
    /// messages the router answers itself can be sent.
    fn send(&mut self, frame: &[u8]) -> Result<(), SessionError> {
        let tag = frame[0];
        let body = &frame[5..];
        let has_conn = self.pinned.is_some();
        match tag {
            b'P' => {
                let p = frontend::parse(body)?;
                if p.name.is_empty() {
                    self.bout.extend_from_slice(frame);
                    self.replies.push(Kind::Parse, Audience::Client);
                    self.unnamed_on_conn = true;
                } else if let Some(named) = self.named.get(p.name) {
                    let stmt = named.stmt.clone();
                    let Some(pinned) = self.pinned.as_mut() else {
                        return Err(SessionError::Protocol(
                            "internal: Parse without a connection".into(),
                        ));
                    };
                    if pinned.conn.prepared.contains(&stmt.id) {
                        self.replies.push_synthetic(parse_complete_bytes());
                    } else {
                        prepare_on(
                            &mut self.bout,
                            &mut self.replies,
                            &mut pinned.conn,
                            &stmt,
                            Audience::Client,
                        );
                    }
                }
                self.in_batch = true;
            }
            b'B' => {
                let b = frontend::bind(body)?;
                let name = self.prepare_for_use(b.statement)?;
                let at = begin_frame(&mut self.bout, b'B');
                self.bout.extend_from_slice(b.portal.as_bytes());
                self.bout.push(0);
                self.bout.extend_from_slice(&name);
                self.bout.extend_from_slice(b.tail);
                end_frame(&mut self.bout, at);
                self.replies.push(Kind::Bind, Audience::Client);
                self.in_batch = true;
                self.batch_executes = true;
            }
            b'D' => {
                let t = frontend::target(body, "Describe")?;
                if t.kind == b'S' {
                    let name = self.prepare_for_use(t.name)?;
                    let at = begin_frame(&mut self.bout, b'D');
                    self.bout.push(b'S');
                    self.bout.extend_from_slice(&name);
                    end_frame(&mut self.bout, at);
                    self.replies.push(Kind::DescribeStatement, Audience::Client);
                } else {
                    self.bout.extend_from_slice(frame);
                    self.replies.push(Kind::DescribePortal, Audience::Client);
                }
                self.in_batch = true;
            }
            b'E' => {
                self.bout.extend_from_slice(frame);
                self.replies.push(Kind::Execute, Audience::Client);
                self.in_batch = true;
                self.batch_executes = true;
            }
            b'C' => {
                let t = frontend::target(body, "Close")?;
                if t.kind == b'S' || !has_conn {
                    // Statements stay prepared on backends for whoever needs them next; only
                    // the client's name goes.
                    self.close_statement(&t);
                    self.replies.push_synthetic(close_complete_bytes());
                } else {
                    self.bout.extend_from_slice(frame);
                    self.replies.push(Kind::Close, Audience::Client);
                    self.in_batch = true;
                    self.batch_executes = true;
                }
            }
            _ => {
                return Err(SessionError::Protocol(format!(
                    "internal: cannot send message {}",
                    tag as char
                )))
            }
        }
        Ok(())
    }

    /// Makes sure the pinned connection has the client's statement `name` prepared (injecting
    /// a Parse the client does not see if not) and returns its backend name, NUL-terminated.
    fn prepare_for_use(&mut self, name: &str) -> Result<Vec<u8>, SessionError> {
        let Some(pinned) = self.pinned.as_mut() else {
            return Err(SessionError::Protocol(
                "internal: statement use without a connection".into(),
            ));
        };
        if name.is_empty() {
            if !self.unnamed_on_conn && self.unnamed.plan.is_some() {
                write_parse(
                    &mut self.bout,
                    b"\0",
                    &self.unnamed.sql,
                    &self.unnamed.param_types,
                );
                self.replies.push(Kind::Parse, Audience::Router);
                self.unnamed_on_conn = true;
            }
            return Ok(vec![0]);
        }
        let Some(named) = self.named.get(name) else {
            // Checked when the message arrived; a Close in between can only come later.
            return Ok(format!("{name}\0").into_bytes());
        };
        let stmt = &named.stmt;
        if !pinned.conn.prepared.contains(&stmt.id) {
            prepare_on(
                &mut self.bout,
                &mut self.replies,
                &mut pinned.conn,
                stmt,
                Audience::Router,
            );
        }
        Ok(stmt.backend_name.to_vec())
    }

    /// An error the router finds in the middle of an extended batch. With a connection pinned
    /// the error is raised on it (so the backend skips to Sync like the client); without one
    /// it is answered directly. Either way the client's messages are dropped until `Sync`.
    async fn batch_error(&mut self, err: SqlError) -> Result<(), SessionError> {
        self.held.clear();
        self.skip_until_sync = true;
        if self.pinned.is_some() {
            let raise = raise_sql(&err);
            self.raised = true;
            write_parse(&mut self.bout, b"\0", &raise, &[0, 0]);
            self.replies.push(Kind::Parse, Audience::Silent);
            let at = begin_frame(&mut self.bout, b'B');
            self.bout.extend_from_slice(b"\0\0\0\0\0\0\0\0");
            end_frame(&mut self.bout, at);
            self.replies.push(Kind::Bind, Audience::Silent);
            let at = begin_frame(&mut self.bout, b'E');
            self.bout.extend_from_slice(b"\0\0\0\0\0");
            end_frame(&mut self.bout, at);
            self.replies.push(Kind::Execute, Audience::Router);
            self.unnamed_on_conn = false;
            self.in_batch = true;
            self.exchange().await
        } else {
            err.write(&mut self.cout);
            if self.tx != TxStatus::Idle {
                self.tx = TxStatus::Failed;
            }
            Ok(())
        }
    }

    // ---- connections -------------------------------------------------------------------

    /// Pins a connection for `wanted` (or any shard) unless one is pinned already, sending a
    /// pending `BEGIN` first.
    async fn attach(&mut self, wanted: Option<usize>) -> Result<(), SqlError> {
        self.attach_conn(wanted, true).await
    }

    /// Pins a connection; `with_begin` sends a pending `BEGIN` on it first (not wanted for work
    /// that does not belong to the transaction, like preparing a statement).
    async fn attach_conn(
        &mut self,
        wanted: Option<usize>,
        with_begin: bool,
    ) -> Result<(), SqlError> {
        if self.pinned.is_some() {
            return Ok(());
        }
        let shard = wanted.unwrap_or_else(|| self.shared.any_shard());
        let conn = self.shared.checkout(shard).await?;
        if !self.shared.server_params_learned() {
            self.shared.learn_server_params(&conn.params);
        }
        *self
            .slot
            .running_on
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(CancelTarget {
            shard,
            pid: conn.pid,
            secret: conn.secret,
        });
        let fp = self.settings.fingerprint();
        let mut conn = conn;
        if conn.settings_fp != fp {
            // The client's settings go out in the same write as its statement.
            put_query(&mut self.bout, &self.settings.apply_sql());
            self.replies.push(Kind::Query, Audience::Silent);
            conn.settings_fp = fp;
        }
        self.pinned = Some(Pinned { shard, conn });
        self.unnamed_on_conn = false;
        if let Some(begin) = with_begin.then(|| self.pending_begin.take()).flatten() {
            put_query(&mut self.bout, &begin);
            // Its error, if any, is the client's; its ReadyForQuery is not.
            self.replies.push(Kind::Query, Audience::Router);
        }
        Ok(())
    }

    /// Returns the connection to its pool once the client is idle between transactions. It
    /// keeps the client's settings; the next client with other settings resets them.
    async fn release_if_idle(&mut self) {
        let idle = self.tx == TxStatus::Idle
            && !self.in_batch
            && self.replies.is_empty()
            && self.held.is_empty();
        if !idle || self.pinned.is_none() {
            return;
        }
        self.release();
    }

    /// Returns the pinned connection to its pool.
    fn release(&mut self) {
        *self
            .slot
            .running_on
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        self.pinned = None;
    }

    /// Writes what is buffered for the backend and forwards replies until none are owed.
    /// A broken backend is discarded; the client hears about it as an error, or, inside a
    /// transaction (which is gone with the connection), as a FATAL error that ends the session.
    async fn exchange(&mut self) -> Result<(), SessionError> {
        let result = self.pump().await;
        match result {
            Ok(()) => Ok(()),
            Err(ExchangeError::Client(e)) => Err(SessionError::Client(e)),
            Err(ExchangeError::Backend(why)) => {
                let Some(p) = self.pinned.take() else {
                    return Err(SessionError::BackendLost(why));
                };
                let name = self.shard_name(p.shard);
                let endpoint = self.shared.pools().for_shard(p.shard).endpoint.name();
                drop(Object::take(p.conn));
                *self
                    .slot
                    .running_on
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = None;
                self.replies = Replies::default();
                self.bout.clear();
                self.in_batch = false;
                self.batch_executes = false;
                self.unnamed_on_conn = false;
                tracing::warn!(shard = %name, %endpoint, "backend connection lost: {why}");
                let was_in_transaction = self.tx != TxStatus::Idle;
                let mut err = errors::shard_lost(&name, &endpoint, &why);
                if was_in_transaction {
                    err.severity = "FATAL";
                    err.write(&mut self.cout);
                    let _ = self.flush_client().await;
                    return Err(SessionError::BackendLost(why));
                }
                err.write(&mut self.cout);
                self.skip_until_sync = false;
                reply::ready_for_query(&mut self.cout, TxStatus::Idle);
                Ok(())
            }
        }
    }

    async fn pump(&mut self) -> Result<(), ExchangeError> {
        let Some(pinned) = self.pinned.as_mut() else {
            return Err(ExchangeError::Backend(
                "internal: no connection to exchange with".into(),
            ));
        };
        let shard = pinned.shard;
        let conn = &mut *pinned.conn;
        let mut written = 0;
        let started = tokio::time::Instant::now();
        let limits = &self.shared.config.limits;
        // The router's statement timeout cancels the statement on its backend, once; Postgres
        // then answers 57014 like for any cancel, and the exchange ends normally.
        let mut deadline = limits.statement_timeout.map(|t| started + t);
        self.replies.drain_synthetic(&mut self.cout);
        // A request almost always fits the socket buffer: write it straight away, and only
        // fall back to writing while reading (below) when the kernel would block.
        if !self.bout.is_empty() {
            match conn.stream.try_write(&self.bout) {
                Ok(n) => written = n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(ExchangeError::Backend(e.to_string())),
            }
        }
        loop {
            let want_read = self.replies.awaits_backend();
            if written == self.bout.len() && !want_read {
                break;
            }
            let (mut rd, mut wr) = conn.stream.split();
            tokio::select! {
                _ = tokio::time::sleep_until(deadline.unwrap_or(started)), if deadline.is_some() => {
                    deadline = None;
                    let endpoint = &self.shared.pools().for_shard(shard).endpoint;
                    let (host, port, pid, secret) = (endpoint.host.clone(), endpoint.port, conn.pid, conn.secret);
                    tracing::info!(shard = %self.shared.map.shards()[shard].range, "statement timeout: cancelling");
                    tokio::spawn(async move {
                        if let Err(e) = crate::backend::conn::send_cancel((host.as_str(), port), pid, secret).await {
                            tracing::warn!("could not cancel a statement past the statement timeout: {e}");
                        }
                    });
                }
                r = wr.write(&self.bout[written..]), if written < self.bout.len() => {
                    match r {
                        Ok(0) => return Err(ExchangeError::Backend("the server closed the connection".into())),
                        Ok(n) => written += n,
                        Err(e) => return Err(ExchangeError::Backend(e.to_string())),
                    }
                }
                r = rd.read_buf(&mut conn.rbuf), if want_read => {
                    match r {
                        Ok(0) => return Err(ExchangeError::Backend("the server closed the connection".into())),
                        Ok(_) => {}
                        Err(e) => return Err(ExchangeError::Backend(e.to_string())),
                    }
                }
            }
            let mut copy_in = false;
            loop {
                let h = match next_frame(&conn.rbuf) {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(e) => return Err(ExchangeError::Backend(e.to_string())),
                };
                let step = self
                    .replies
                    .on_frame(h.tag, &conn.rbuf[5..h.total])
                    .map_err(|d| ExchangeError::Backend(d.to_string()))?;
                if step.action == super::replies::Action::Forward {
                    if h.tag == b'E' && std::mem::take(&mut self.raised) {
                        self.cout.extend_from_slice(&reply::without_server_location(
                            &conn.rbuf[..h.total],
                        ));
                    } else {
                        self.cout.extend_from_slice(&conn.rbuf[..h.total]);
                    }
                }
                if let Some(status) = step.ready {
                    self.tx = status;
                }
                if step.ready.is_some() {
                    // A raised error that never came (dropped with a skipped batch) must not
                    // strip a later, real one.
                    self.raised = false;
                }
                if let Some(c) = step.completion {
                    match c {
                        Completion::Settings | Completion::DiscardAll => {
                            self.tx_changes.push(settings::parse_change(&self.last_sql));
                        }
                        Completion::Rollback => self.tx_changes.clear(),
                        Completion::DeallocateAll => {}
                    }
                    if c == Completion::DiscardAll {
                        // Like Postgres: the client's prepared statements are gone too.
                        self.named.clear();
                    }
                    if matches!(c, Completion::DiscardAll | Completion::DeallocateAll) {
                        conn.prepared.clear();
                    }
                }
                if step.ready == Some(TxStatus::Idle) && !self.tx_changes.is_empty() {
                    // The statement or transaction that made these changes is over and kept.
                    let mut known = true;
                    for change in self.tx_changes.drain(..) {
                        known &= self.settings.apply(&change);
                    }
                    conn.settings_fp = if known {
                        self.settings.fingerprint()
                    } else {
                        settings::UNKNOWN
                    };
                    if !known {
                        tracing::debug!(statement = %truncate(&self.last_sql, 200), "a settings change the router does not follow; the connection will be reset");
                    }
                }
                copy_in |= step.copy_in;
                conn.rbuf.advance(h.total);
                self.replies.drain_synthetic(&mut self.cout);
                for (id, clients_own) in self.replies.take_failed() {
                    conn.prepared.remove(&id);
                    if clients_own {
                        self.named.retain(|_, n| n.stmt.id != id);
                    }
                }
            }
            write_client(&mut self.client, &mut self.cout)
                .await
                .map_err(ExchangeError::Client)?;
            if copy_in {
                relay_copy_in(&mut self.client, &mut self.cbuf, conn).await?;
            }
        }
        self.bout.clear();
        if let Some(threshold) = limits.slow_statement {
            let elapsed = started.elapsed();
            if elapsed >= threshold {
                tracing::warn!(
                    shard = %self.shared.map.shards()[shard].range,
                    elapsed_ms = elapsed.as_secs_f64() * 1e3,
                    statement = %truncate(&self.last_sql, 300),
                    "slow statement"
                );
            }
        }
        Ok(())
    }
}

/// At most `max` bytes of `s`, cut at a character boundary, for logs.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Writes what is buffered for the client.
async fn write_client(client: &mut TcpStream, cout: &mut Vec<u8>) -> std::io::Result<()> {
    if cout.is_empty() {
        return Ok(());
    }
    if tracing::enabled!(tracing::Level::TRACE) {
        let tags: String = frames(cout)
            .map_while(Result::ok)
            .map(|f| f[0] as char)
            .collect();
        tracing::trace!(%tags, "to client");
    }
    client.write_all(cout).await?;
    cout.clear();
    Ok(())
}

/// Forwards the client's COPY data to the backend until CopyDone or CopyFail.
async fn relay_copy_in(
    client: &mut TcpStream,
    cbuf: &mut BytesMut,
    conn: &mut crate::backend::BackendConn,
) -> Result<(), ExchangeError> {
    loop {
        while let Some(h) =
            next_frame(cbuf).map_err(|e| ExchangeError::Client(std::io::Error::other(e)))?
        {
            let frame = cbuf.split_to(h.total);
            match h.tag {
                b'd' | b'c' | b'f' | b'H' | b'S' => {
                    conn.stream
                        .write_all(&frame)
                        .await
                        .map_err(|e| ExchangeError::Backend(e.to_string()))?;
                    if h.tag == b'c' || h.tag == b'f' {
                        return Ok(());
                    }
                }
                other => {
                    // Postgres ends the COPY with an error when anything else arrives; tell it so.
                    let mut fail = Vec::new();
                    put_frame(
                        &mut fail,
                        b'f',
                        format!("unexpected message type {other} during COPY from stdin\0")
                            .as_bytes(),
                    );
                    conn.stream
                        .write_all(&fail)
                        .await
                        .map_err(|e| ExchangeError::Backend(e.to_string()))?;
                    return Ok(());
                }
            }
        }
        if client.read_buf(cbuf).await.map_err(ExchangeError::Client)? == 0 {
            return Err(ExchangeError::Client(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the client left during COPY",
            )));
        }
    }
}

/// One shard's end of a split COPY FROM STDIN.
struct CopyTarget {
    conn: PooledConn,
    /// Rows not sent yet (sent in CopyData messages of about 64 KiB).
    buf: Vec<u8>,
    /// The shard refused the COPY (its ErrorResponse); its rows are dropped.
    error: Option<Vec<u8>>,
    /// The connection broke.
    lost: Option<SqlError>,
    /// The shard already answered with ReadyForQuery (its COPY failed at the start).
    ended: bool,
}

impl CopyTarget {
    /// Starts the client's COPY statement on `shard` and waits for its CopyInResponse.
    async fn open(
        shared: &Shared,
        shard: usize,
        sql: &str,
        settings: &Settings,
        header: Option<&[u8]>,
    ) -> Result<CopyTarget, SqlError> {
        let mut conn = shared.checkout(shard).await?;
        let lost = |e: std::io::Error| {
            let name = shared.map.shards()[shard].range.to_string();
            errors::shard_lost(
                &name,
                &shared.pools().for_shard(shard).endpoint.name(),
                &e.to_string(),
            )
        };
        let mut out = Vec::new();
        let mut settings_ready = usize::from(settings.write_apply(conn.settings_fp, &mut out));
        put_query(&mut out, sql);
        conn.stream.write_all(&out).await.map_err(lost)?;
        conn.settings_fp = settings.fingerprint();
        let mut target = CopyTarget {
            conn,
            buf: Vec::with_capacity(64 * 1024),
            error: None,
            lost: None,
            ended: false,
        };
        loop {
            let c = &mut *target.conn;
            while let Some(h) = next_frame(&c.rbuf).map_err(|e| lost(std::io::Error::other(e)))? {
                let tag = c.rbuf[0];
                let frame = c.rbuf[..h.total].to_vec();
                c.rbuf.advance(h.total);
                if settings_ready > 0 {
                    if tag == b'Z' {
                        settings_ready -= 1;
                    }
                    continue;
                }
                match tag {
                    b'G' => {
                        if let Some(header) = header {
                            target.buf.extend_from_slice(header);
                        }
                        return Ok(target);
                    }
                    b'E' => target.error = Some(frame),
                    b'Z' => {
                        target.ended = true;
                        return Ok(target);
                    }
                    _ => {}
                }
            }
            if c.stream.read_buf(&mut c.rbuf).await.map_err(lost)? == 0 {
                return Err(lost(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )));
            }
        }
    }

    async fn push(&mut self, row: &[u8]) {
        if self.error.is_some() || self.lost.is_some() {
            return;
        }
        self.buf.extend_from_slice(row);
        if self.buf.len() >= 64 * 1024 {
            self.send_buffered().await;
        }
    }

    async fn send_buffered(&mut self) {
        if self.buf.is_empty() || self.lost.is_some() {
            return;
        }
        let mut frame = Vec::with_capacity(self.buf.len() + 5);
        put_frame(&mut frame, b'd', &self.buf);
        self.buf.clear();
        if let Err(e) = self.conn.stream.write_all(&frame).await {
            self.lost = Some(SqlError::new(
                errors::CONNECTION_FAILURE,
                format!("lost the shard during COPY: {e}"),
            ));
        }
    }

    /// Ends this shard's COPY: CopyDone, or CopyFail with `fail` (so nothing is committed).
    async fn finish(mut self, fail: Option<&str>) -> broadcast::Outcome {
        if self.error.is_none() && self.lost.is_none() {
            let mut end = Vec::new();
            match fail {
                None => {
                    self.send_buffered().await;
                    put_frame(&mut end, b'c', &[]);
                }
                Some(why) => put_frame(&mut end, b'f', format!("{why}\0").as_bytes()),
            }
            if let Err(e) = self.conn.stream.write_all(&end).await {
                self.lost = Some(SqlError::new(
                    errors::CONNECTION_FAILURE,
                    format!("lost the shard during COPY: {e}"),
                ));
            }
        }
        if let Some(e) = self.lost.take() {
            self.abandon();
            return broadcast::Outcome::Unavailable(e);
        }
        let mut tags = Vec::new();
        let mut error = self.error.take();
        if self.ended {
            let frame = error.unwrap_or_default();
            let (code, message) = broadcast::error_fields(&frame);
            return broadcast::Outcome::Failed {
                frame,
                code,
                message,
            };
        }
        let c = &mut *self.conn;
        loop {
            while let Ok(Some(h)) = next_frame(&c.rbuf) {
                let tag = c.rbuf[0];
                let frame = c.rbuf[..h.total].to_vec();
                c.rbuf.advance(h.total);
                match tag {
                    b'C' => tags.extend_from_slice(&frame),
                    b'E' if error.is_none() => error = Some(frame),
                    b'Z' => {
                        return match error {
                            None => broadcast::Outcome::Done(tags),
                            Some(frame) => {
                                let (code, message) = broadcast::error_fields(&frame);
                                broadcast::Outcome::Failed {
                                    frame,
                                    code,
                                    message,
                                }
                            }
                        };
                    }
                    _ => {}
                }
            }
            match c.stream.read_buf(&mut c.rbuf).await {
                Ok(n) if n > 0 => {}
                _ => {
                    drop(Object::take(self.conn));
                    return broadcast::Outcome::Unavailable(SqlError::new(
                        errors::CONNECTION_FAILURE,
                        "lost the shard at the end of COPY",
                    ));
                }
            }
        }
    }

    /// Drops the connection mid-COPY: Postgres rolls the shard's COPY back.
    fn abandon(&mut self) {
        self.lost
            .get_or_insert_with(|| SqlError::new(errors::CONNECTION_FAILURE, "abandoned"));
        self.conn.broken = true;
    }
}

/// The router's answers to a scattered batch's messages, in order; descriptions from shard 0.
fn answer_asked(out: &mut Vec<u8>, asked: &[u8], statement_desc: &[u8], portal_desc: &[u8]) {
    for &k in asked {
        match k {
            b'P' => reply::parse_complete(out),
            b'S' => out.extend_from_slice(statement_desc),
            b'B' => reply::bind_complete(out),
            b'D' => out.extend_from_slice(portal_desc),
            b'C' => reply::close_complete(out),
            _ => {}
        }
    }
}

/// The session setting that pins a client's statements to one shard (operators only).
const MANUAL_SHARD: &str = "shardgate.shard";

/// A merged read whose text the router could not rewrite for the shards.
fn cannot_rewrite(why: &str) -> SqlError {
    SqlError::new(
        errors::FEATURE_NOT_SUPPORTED,
        format!("this read across shards cannot be rewritten for the shards: {why}"),
    )
}

fn scatter_in_transaction() -> SqlError {
    SqlError::new(
        errors::FEATURE_NOT_SUPPORTED,
        "a read across all shards cannot run inside a transaction, which stays on one shard",
    )
    .with_hint("run it outside BEGIN ... COMMIT, or add the sharding key to read one shard")
}

fn ddl_in_transaction() -> SqlError {
    SqlError::new(
        errors::FEATURE_NOT_SUPPORTED,
        "DDL that goes to every shard cannot run inside a transaction",
    )
    .with_hint(
        "run it on its own, outside BEGIN ... COMMIT; each shard applies it in its own transaction",
    )
}

/// The answer to Describe of DDL: a statement without parameters (`t` with none) and without
/// rows (`n`); a portal only `n`.
fn no_data_description(out: &mut Vec<u8>, kind: u8) {
    if kind == b'S' {
        put_frame(out, b't', &0i16.to_be_bytes());
    }
    put_frame(out, b'n', &[]);
}

fn protocol_error(e: crate::protocol::FrameError) -> SessionError {
    SessionError::Protocol(e.to_string())
}

fn in_failed_transaction() -> SqlError {
    SqlError::new(
        errors::IN_FAILED_TRANSACTION,
        "current transaction is aborted, commands ignored until end of transaction block",
    )
}

/// `Some` when the plan is only a BEGIN, COMMIT or ROLLBACK.
fn txn_control(plan: &Option<Arc<Plan>>) -> Option<Decision> {
    let plan = plan.as_ref()?;
    match plan.statements.as_slice() {
        [crate::planner::Route::Begin] => Some(Decision::Begin),
        [crate::planner::Route::Commit] => Some(Decision::Commit),
        [crate::planner::Route::Rollback] => Some(Decision::Rollback),
        _ => None,
    }
}

/// The literal values of a planned text, kept with a prepared statement for its Binds. Most
/// prepared statements have none, and then nothing is allocated.
fn stored_literals(planned: &crate::planner::PlanRef<'_>) -> Vec<Box<str>> {
    (0..)
        .map_while(|i| planned.literal(i))
        .map(Box::from)
        .collect()
}

/// Prepares router statement `stmt` on a connection (the Parse goes into `bout`), closing the
/// connection's least recently used statement first when it holds too many.
fn prepare_on(
    bout: &mut Vec<u8>,
    replies: &mut Replies,
    conn: &mut crate::backend::BackendConn,
    stmt: &Statement,
    audience: Audience,
) {
    if let Some(old) = conn.prepared.insert(stmt.id) {
        let at = begin_frame(bout, b'C');
        bout.push(b'S');
        bout.extend_from_slice(format!("sg_{old}\0").as_bytes());
        end_frame(bout, at);
        replies.push(Kind::Close, Audience::Silent);
    }
    write_parse(bout, &stmt.backend_name, &stmt.sql, &stmt.param_types);
    replies.push_parse(stmt.id, audience);
}

fn write_parse(out: &mut Vec<u8>, name_nul: &[u8], sql: &str, param_types: &[u8]) {
    let at = begin_frame(out, b'P');
    out.extend_from_slice(name_nul);
    out.extend_from_slice(sql.as_bytes());
    out.push(0);
    out.extend_from_slice(param_types);
    end_frame(out, at);
}

fn ready_bytes(status: TxStatus) -> Vec<u8> {
    let mut v = Vec::with_capacity(6);
    reply::ready_for_query(&mut v, status);
    v
}

fn parse_complete_bytes() -> Vec<u8> {
    let mut v = Vec::with_capacity(5);
    reply::parse_complete(&mut v);
    v
}

fn close_complete_bytes() -> Vec<u8> {
    let mut v = Vec::with_capacity(5);
    reply::close_complete(&mut v);
    v
}

/// A statement that fails on the backend with the router's error, so that the backend's
/// transaction is aborted exactly when the client is told it is.
fn raise_sql(err: &SqlError) -> String {
    let lit = |s: &str| format!("'{}'", s.replace('\'', "''").replace("$sg$", "$ sg$"));
    let mut sql = format!(
        "DO $sg$BEGIN RAISE EXCEPTION USING ERRCODE = {}, MESSAGE = {}",
        lit(&err.code),
        lit(&err.message)
    );
    if let Some(h) = &err.hint {
        sql.push_str(&format!(", HINT = {}", lit(h)));
    }
    sql.push_str("; END$sg$");
    sql
}

impl Session {
    /// Pushes a simple-protocol raise of `err` for the pinned connection.
    fn push_raise_query(&mut self, err: &SqlError, audience: Audience) {
        self.raised = true;
        put_query(&mut self.bout, &raise_sql(err));
        self.replies.push(Kind::Query, audience);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raise_sql_quotes_everything() {
        let err = SqlError::new("0A000", "it's $sg$ bad").with_hint("don't");
        let sql = raise_sql(&err);
        assert_eq!(
            sql,
            "DO $sg$BEGIN RAISE EXCEPTION USING ERRCODE = '0A000', MESSAGE = 'it''s $ sg$ bad', HINT = 'don''t'; END$sg$"
        );
    }
}
