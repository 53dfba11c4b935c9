//! Extended-protocol messages: Parse, Bind, Describe, Execute, Close, Flush and Sync.
//!
//! Each message is decoded once into a [`Msg`]. Until a Bind names the batch's shard, messages
//! are held; then the held ones and the rest of the batch go to that shard's connection, in
//! one write with its Sync. Drivers prepare (Parse, Describe, then Sync or only Flush) before
//! they bind: that runs on any shard, outside the client's transaction, and a later Bind for
//! another shard finishes it there and moves. A batch of only BEGIN/COMMIT/ROLLBACK is answered
//! by the router, as in the simple protocol. An error found by the router mid-batch skips the
//! client's messages to its Sync, as Postgres does.

mod held;
mod scatter;

pub(super) use held::{Held, Msg};

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use super::execute::Carrier;
use super::outbox::{synthetic, ConnStatements};
use super::replies::{Audience, Kind};
use super::state::{anchor_of, Batch, Tx};
use super::statements::ClientStatement;
use super::{Session, SessionError};
use crate::errors;
use crate::planner::Control;
use crate::protocol::frontend;
use crate::protocol::reply::{self, SqlError};
use crate::resolver::Dest;

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    pub(super) async fn extended(&mut self, frame: &[u8]) -> Result<(), SessionError> {
        let tag = frame[0];
        if self.state.skipping() && tag != b'S' {
            return Ok(());
        }
        match self.state.batch {
            Batch::Broadcast { .. } => return self.in_broadcast_batch(frame).await,
            Batch::Scatter(_) => return self.in_scatter_batch(frame).await,
            _ => {}
        }
        let body = &frame[5..];
        match tag {
            b'P' => {
                let epoch = self.routing.planner.epoch();
                if let Some(stmt) = self.statements.parse_again(body, epoch) {
                    return self.route_or_hold(Msg::Parse(stmt)).await;
                }
                let p = frontend::parse(body)?;
                let planned = self.routing.planner.plan(p.sql, &mut self.nbuf);
                let parsed = self.statements.parse(
                    p.name,
                    p.sql,
                    p.param_types,
                    &planned,
                    epoch,
                    &self.shared.statements,
                    self.routing.config.limits.max_prepared_bytes,
                );
                match parsed {
                    Ok(stmt) => self.route_or_hold(Msg::Parse(stmt)).await,
                    Err(err) => self.batch_error(&err).await,
                }
            }
            b'B' => self.bind(body).await,
            b'D' => {
                let t = frontend::target(body, "Describe")?;
                if t.kind != b'S' && !t.name.is_empty() && self.describe_held_cursor(t.name) {
                    return Ok(());
                }
                if t.kind != b'S' {
                    let msg = Msg::Forward {
                        frame,
                        kind: Kind::DescribePortal,
                        executes: false,
                    };
                    return self.route_or_hold(msg).await;
                }
                match self.statements.get(t.name).cloned() {
                    Some(stmt) => self.route_or_hold(Msg::DescribeStatement(stmt)).await,
                    None => self.batch_error(&errors::undefined_statement(t.name)).await,
                }
            }
            b'C' => {
                let t = frontend::target(body, "Close")?;
                if t.kind == b'P' && self.is_portal_in_steps(t.name) {
                    if !self.portal_in_step_order().await? {
                        return Ok(());
                    }
                    return self.close_portal(t.name).await;
                }
                if t.kind == b'S' {
                    // Closing a statement that does not exist is not an error in Postgres.
                    // Backends keep the statement for whoever needs it next.
                    self.statements.close(t.name);
                    return self.route_or_hold(Msg::CloseStatement).await;
                }
                let msg = Msg::Forward {
                    frame,
                    kind: Kind::Close,
                    executes: true,
                };
                self.route_or_hold(msg).await
            }
            b'E' => {
                let (portal, max_rows) = frontend::execute_target(body)?;
                if self.is_portal_in_steps(portal) {
                    // A later Execute of a portal the router runs on several shards.
                    if !self.portal_in_step_order().await? {
                        return Ok(());
                    }
                    let key = super::cursors::portal_key(portal);
                    if self
                        .execute_portal(&key, u64::try_from(max_rows).unwrap_or(0))
                        .await?
                    {
                        self.state.skip_to_sync();
                    }
                    return Ok(());
                }
                let msg = Msg::Forward {
                    frame,
                    kind: Kind::Execute,
                    executes: true,
                };
                self.route_or_hold(msg).await
            }
            b'H' => self.flush(frame).await,
            b'S' => self.sync().await,
            _ => Ok(()),
        }
    }

    /// A Bind: the statement it runs is found once, resolved with the Bind's parameters, and
    /// the batch goes where the target says.
    async fn bind(&mut self, body: &[u8]) -> Result<(), SessionError> {
        let b = frontend::bind(body)?;
        let Some(stmt) = self.statements.get(b.statement).cloned() else {
            return self
                .batch_error(&errors::undefined_statement(b.statement))
                .await;
        };
        self.bind_statement(b, stmt).await
    }

    /// A Bind of `stmt` (the client's, or the router's text of it: `super::new_keys`).
    pub(in crate::session) async fn bind_statement(
        &mut self,
        b: frontend::Bind<'_>,
        stmt: Arc<ClientStatement>,
    ) -> Result<(), SessionError> {
        self.sql.clear();
        self.sql.push_str(stmt.sql());
        let dest = self.resolve_bound(&stmt, &b);
        // A named portal lives on its shard until the transaction ends.
        self.state
            .anchor(anchor_of(&stmt.plan, &dest, !b.portal.is_empty()));
        if self.pin.is_some() && self.state.only_prepared() {
            // The connection only prepared statements for this batch (a Flush needed answers
            // before the key was known), and the resolver saw no transaction there. A statement
            // that needs no particular shard may run there too, unless a BEGIN is pending (it
            // must go first, on the transaction's shard); anything else finishes the
            // preparation there and moves.
            let stays = matches!(
                dest,
                Dest::Any | Dest::Begin | Dest::Commit | Dest::Rollback
            ) && !matches!(self.state.tx, Tx::Pending { .. });
            if !stays {
                self.finish_preparation().await?;
            }
        }
        let dest = self.keep_connection(stmt.plan.keeps_connection, dest);
        self.cursors_at(&dest);
        if matches!(dest, Dest::Declare { .. }) {
            // A driver's BEGIN in front of it (pgjdbc) begins the transaction it declares in.
            self.absorb_held_begin();
        }
        self.execute(dest, Carrier::Bind { bind: b, stmt }).await
    }

    /// Sends a message now when a connection is pinned, or holds it until the batch's shard
    /// is known.
    pub(super) async fn route_or_hold(&mut self, msg: Msg<&[u8]>) -> Result<(), SessionError> {
        let unshareable = matches!(&msg, Msg::Bind { stmt, .. } if !stmt.plan.shareable);
        if unshareable && self.pin.as_ref().is_some_and(|p| p.conn.is_shared()) {
            // The rest of the batch needs a connection of the client's own.
            if let Err(err) = self.unshare().await {
                return self.batch_error(&err).await;
            }
        }
        if self.pin.is_some() {
            self.release_held()?;
            self.send(msg)
        } else {
            self.state.held_mut().push(msg);
            let limit = self.client.max_message;
            if self.state.held().bytes() > limit {
                // Dropped with the batch, which skips to its Sync like any batch error.
                return self.batch_error(&errors::held_too_long(limit)).await;
            }
            Ok(())
        }
    }

    /// Writes one message for the pinned connection (or answers it, for the Close of a
    /// statement, which needs none).
    fn send(&mut self, msg: Msg<&[u8]>) -> Result<(), SessionError> {
        let executes = match &msg {
            Msg::Bind { .. } => true,
            Msg::Forward { executes, .. } => *executes,
            _ => false,
        };
        match self.pin.as_mut() {
            Some(pin) => {
                if let Msg::Bind { stmt, .. } | Msg::DescribeStatement(stmt) = &msg {
                    pin.conn.note_bound(stmt);
                }
                let mut conn = ConnStatements {
                    prepared: pin.conn.prepared(),
                    unnamed: &mut pin.unnamed,
                };
                let begins = match &msg {
                    Msg::Bind { stmt, .. } if is_begin(&stmt.plan) => Some(stmt.clone()),
                    _ => None,
                };
                self.out.send(&mut conn, msg)?;
                self.state
                    .sent_to_backend(executes, begins.as_deref().map(ClientStatement::sql));
            }
            None => match msg {
                Msg::CloseStatement => self
                    .out
                    .replies
                    .push_synthetic(synthetic(reply::close_complete)),
                _ => {
                    return Err(SessionError::Protocol(
                        "internal: a message for a backend without a connection".into(),
                    ))
                }
            },
        }
        Ok(())
    }

    /// Whether what the batch holds so far may go to a shared connection.
    pub(super) fn held_shareable(&self) -> bool {
        !matches!(self.state.batch, Batch::Held) || self.state.held().shareable()
    }

    /// Sends the held messages, in order, now that a connection is pinned (or answers them
    /// when none is needed).
    fn release_held(&mut self) -> Result<(), SessionError> {
        if !matches!(self.state.batch, Batch::Held) {
            // Nothing held (the common case: the batch's shard was known at its first Bind).
            return Ok(());
        }
        let mut held = self.state.take_held();
        let sent = held.drain(|msg| self.send(msg));
        self.state.keep_held(held);
        sent
    }

    async fn flush(&mut self, frame: &[u8]) -> Result<(), SessionError> {
        // (Nothing is held unless the batch waits for its shard.)
        let held = self.state.held();
        if self.pin.is_none() && held.needs_backend() {
            // Answering only Parse/Describe does not start the client's transaction.
            let with_begin = !held.only_prepares();
            if let Err(err) = self.attach(None, with_begin).await {
                return self.batch_error(&err).await;
            }
        }
        self.release_held()?;
        if self.pin.is_some() {
            self.out.bytes.extend_from_slice(frame);
            self.exchange().await?;
        }
        Ok(())
    }

    async fn sync(&mut self) -> Result<(), SessionError> {
        let synced = self.sync_batch().await;
        // The batch is over, and what failed in it with it.
        self.out.replies.take_error();
        self.state.batch_over();
        synced
    }

    async fn sync_batch(&mut self) -> Result<(), SessionError> {
        if self.state.tx == Tx::Implicit {
            return self.sync_on_every_shard().await;
        }
        if self.state.skipping() {
            self.state.synced();
            if self.pin.is_some() {
                self.out.sync(Audience::Client);
                self.exchange().await?;
            } else {
                self.answer_ready();
            }
            self.release_if_idle();
            return Ok(());
        }
        if self.pin.is_none() {
            if let Some(answer) = self.router_batch() {
                self.state.synced();
                self.out.replies.push_synthetic(answer);
                return Ok(());
            }
            if matches!(self.state.batch, Batch::Held) {
                let held = self.state.held();
                if matches!(self.state.tx, Tx::Pending { .. }) && held.only_prepares() {
                    return self.prepare_outside_transaction().await;
                }
                if held.needs_backend() {
                    self.may_share = self.held_shareable();
                    let attached = self.attach(None, true).await;
                    self.may_share = false;
                    if let Err(err) = attached {
                        self.state.synced();
                        self.refuse_here(&err);
                        self.answer_ready();
                        return Ok(());
                    }
                }
            }
        }
        self.release_held()?;
        if self.pin.is_some() {
            self.out.sync(Audience::Client);
            self.exchange().await?;
            self.state.synced();
            self.release_if_idle();
        } else {
            self.state.synced();
            self.answer_ready();
        }
        Ok(())
    }

    /// The Sync of a batch that ran on several shards outside a transaction: as on one
    /// Postgres, everything it did commits, on every shard, or nothing does when any of its
    /// messages failed.
    pub(super) async fn sync_on_every_shard(&mut self) -> Result<(), SessionError> {
        let mut failed = self.state.skipping() || self.pin.is_none();
        if self.pin.is_none() {
            let held = self.state.take_held();
            self.state.keep_held(held);
        } else {
            self.release_held()?;
            // Its ReadyForQuery is the router's to answer (the shard is inside the block the
            // batch became), its errors the client's.
            self.out.sync(Audience::Router);
            self.exchange().await?;
        }
        failed |= self.out.replies.take_error() || self.pin.is_none();
        let ended = self.end_participants(!failed).await;
        self.state.synced();
        // Whatever the shards' blocks said, the client's batch was no transaction of its own.
        self.state.ready(crate::protocol::reply::TxStatus::Idle);
        if let Err(err) = ended {
            if !failed {
                let mut out = Vec::new();
                err.write(&mut out);
                self.out.replies.push_synthetic(out);
            }
        }
        self.answer_ready();
        Ok(())
    }

    /// When the batch so far holds a `BEGIN` (Parse, Bind, Describe, Execute of it, as pgjdbc
    /// sends it in front of a transaction's first statement) followed only by messages that
    /// prepare, answers the `BEGIN` as the router answers a lone one: the transaction is
    /// pending, and the statement that follows may begin it on every shard it needs. The
    /// preparing messages stay held.
    fn absorb_held_begin(&mut self) {
        if !matches!(self.state.batch, Batch::Held) || self.state.tx != Tx::Idle {
            return;
        }
        let mut begin: Option<Arc<ClientStatement>> = None;
        let mut executed = false;
        let mut out = Vec::new();
        let mut prefix = 0;
        for m in self.state.held().iter() {
            let of_begin = !executed
                && match m {
                    Msg::Parse(s) | Msg::DescribeStatement(s) => is_begin(&s.plan),
                    Msg::Bind { stmt, .. } => begin.is_none() && is_begin(&stmt.plan),
                    Msg::Forward {
                        kind: Kind::DescribePortal | Kind::Execute,
                        ..
                    } => begin.is_some(),
                    _ => false,
                };
            if of_begin {
                match m {
                    Msg::Parse(_) => reply::parse_complete(&mut out),
                    Msg::DescribeStatement(_) => reply::no_data_description(&mut out, b'S'),
                    Msg::Bind { stmt, .. } => {
                        begin = Some(stmt.clone());
                        reply::bind_complete(&mut out);
                    }
                    Msg::Forward {
                        kind: Kind::DescribePortal,
                        ..
                    } => reply::no_data_description(&mut out, b'P'),
                    _ => {
                        executed = true;
                        reply::command_complete(&mut out, "BEGIN");
                    }
                }
                prefix += 1;
                continue;
            }
            // After the BEGIN, only messages that prepare.
            if !executed || !matches!(m, Msg::Parse(_) | Msg::DescribeStatement(_)) {
                return;
            }
        }
        let (Some(stmt), true) = (begin, executed) else {
            return;
        };
        let mut held = self.state.take_held();
        let mut i = 0;
        let _ = held.drain(|msg| -> Result<(), ()> {
            if i >= prefix {
                self.state.held_mut().push(msg);
            }
            i += 1;
            Ok(())
        });
        self.state.keep_held(held);
        self.state.begin(stmt.sql());
        self.out.replies.push_synthetic(out);
    }

    /// A ReadyForQuery the router answers, in its place among the replies.
    fn answer_ready(&mut self) {
        let status = self.state.status();
        self.out
            .replies
            .push_synthetic(synthetic(|o| reply::ready_for_query(o, status)));
    }

    /// Before the router answers a message about a portal it runs on several shards: the
    /// answers owed for what came before are the client's first. `false` when the batch
    /// failed (its error is the client's) or holds messages it cannot answer around.
    async fn portal_in_step_order(&mut self) -> Result<bool, SessionError> {
        if matches!(self.state.batch, Batch::Held) && !self.state.held().is_empty() {
            self.batch_error(&errors::not_alone_in_batch()).await?;
            return Ok(false);
        }
        if !self.bring_in_step().await? {
            return Ok(false);
        }
        self.out.replies.drain_synthetic(&mut self.client.out);
        Ok(true)
    }

    /// The batch so far ran statements a statement on several shards cannot follow: outside a
    /// transaction, or held ones that run something.
    fn mixed_batch(&self) -> bool {
        matches!(self.state.batch, Batch::OnBackend { executed: true })
            && !self.state.in_transaction()
            || matches!(self.state.batch, Batch::Held)
                && self
                    .state
                    .held()
                    .iter()
                    .any(|m| matches!(m, Msg::Bind { .. } | Msg::Forward { executes: true, .. }))
    }

    /// A batch of only `BEGIN`, `COMMIT` or `ROLLBACK` with no connection pinned is answered by
    /// the router, as in the simple protocol: the answers, or `None` when it needs a backend.
    fn router_batch(&mut self) -> Option<Vec<u8>> {
        if !matches!(self.state.batch, Batch::Held) {
            return None;
        }
        let held = self.state.held();
        let control = |s: &ClientStatement| s.plan.control();
        let mut out = Vec::new();
        /// What the batch does to the client's transaction.
        enum Effect {
            Begin(Arc<ClientStatement>),
            End { commit: bool },
        }
        let mut bound: Option<(Control, Arc<ClientStatement>)> = None;
        let mut effect: Option<Effect> = None;
        for m in held.iter() {
            match m {
                Msg::Parse(s) => {
                    control(s)?;
                    reply::parse_complete(&mut out);
                }
                Msg::Bind { stmt, .. } => {
                    bound = Some((control(stmt)?, stmt.clone()));
                    reply::bind_complete(&mut out);
                }
                Msg::DescribeStatement(_) => reply::no_data_description(&mut out, b'S'),
                Msg::Forward {
                    kind: Kind::DescribePortal,
                    ..
                } => reply::no_data_description(&mut out, b'P'),
                Msg::Forward {
                    kind: Kind::Execute,
                    ..
                } => {
                    let (c, stmt) = bound.as_ref()?;
                    let tag = match c {
                        Control::Begin => "BEGIN",
                        Control::Commit if self.state.tx != Tx::Failed => "COMMIT",
                        _ => "ROLLBACK",
                    };
                    reply::command_complete(&mut out, tag);
                    effect = Some(match c {
                        Control::Begin => Effect::Begin(stmt.clone()),
                        c => Effect::End {
                            commit: *c == Control::Commit,
                        },
                    });
                }
                Msg::Forward {
                    kind: Kind::Close, ..
                }
                | Msg::CloseStatement => reply::close_complete(&mut out),
                Msg::Forward { .. } => return None,
            }
        }
        match effect {
            Some(Effect::Begin(stmt)) if self.state.tx == Tx::Idle => self.state.begin(stmt.sql()),
            Some(Effect::Begin(_)) => return None,
            Some(Effect::End { commit }) => {
                self.state.end_unsent(commit);
            }
            None => {}
        }
        reply::ready_for_query(&mut out, self.state.status());
        Some(out)
    }

    /// Drivers prepare a statement (Parse, Describe, Sync) before its first Bind, also right
    /// after BEGIN. Preparing is not part of the transaction, so it runs on any shard, outside
    /// it, and the transaction is still free to start on the shard its first statement names.
    async fn prepare_outside_transaction(&mut self) -> Result<(), SessionError> {
        if let Err(err) = self.attach(None, false).await {
            let held = self.state.take_held();
            self.state.keep_held(held);
            self.state.synced();
            self.refuse_here(&err);
            self.answer_ready();
            return Ok(());
        }
        self.release_held()?;
        self.out.sync(Audience::Router);
        self.answer_ready();
        self.exchange().await?;
        self.state.synced();
        if self.out.replies.is_empty() {
            self.release();
        }
        Ok(())
    }

    /// Ends the current batch on the pinned connection with a Sync the client does not see
    /// and returns the connection to its pool.
    pub(super) async fn finish_preparation(&mut self) -> Result<(), SessionError> {
        self.out.sync(Audience::Silent);
        self.exchange().await?;
        self.state.synced();
        self.release();
        Ok(())
    }

    /// An error the router finds in the middle of an extended batch. With a connection pinned
    /// the error is raised on it (so the backend skips to Sync like the client); without one
    /// it is answered directly. Either way the client's messages are dropped until `Sync`.
    pub(super) async fn batch_error(&mut self, err: &SqlError) -> Result<(), SessionError> {
        let held = self.state.take_held();
        self.state.keep_held(held);
        self.state.skip_to_sync();
        match self.pin.as_mut() {
            Some(pin) => {
                let mut conn = ConnStatements {
                    prepared: pin.conn.prepared(),
                    unnamed: &mut pin.unnamed,
                };
                self.out.raise_extended(&mut conn, err)?;
                self.exchange().await
            }
            None => {
                self.refuse_here(err);
                Ok(())
            }
        }
    }
}

fn is_begin(plan: &crate::planner::Plan) -> bool {
    plan.control() == Some(Control::Begin)
}
