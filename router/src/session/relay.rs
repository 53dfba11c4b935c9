//! The I/O of a statement on the pinned connection: write what the [`super::outbox`] holds,
//! read the replies, hand each to [`super::replies`] and forward what the client sees, until
//! no reply is owed. Also relays COPY FROM STDIN data, enforces the router's statement timeout
//! (by cancelling on the backend, so Postgres answers 57014 as for any cancel), and logs slow
//! statements.
//!
//! A broken backend connection is discarded, never reused. The client hears about it as an
//! error; inside a transaction (which is gone with the connection) as a FATAL error that ends
//! the session, since its transaction state can no longer be what Postgres had.

use bytes::Buf;
use tokio::io::{AsyncRead, AsyncWrite};

use super::replies::{Action, Completion};
use super::state::Tx;
use super::{Session, SessionError};
use crate::backend::stream::Outgoing;
use crate::errors;
use crate::protocol::frame::next_frame;
use crate::protocol::reply::{self, SqlError, TxStatus};
use crate::protocol::request;
use crate::stats::RouteKind;

/// How an exchange failed.
enum Failed {
    Client(std::io::Error),
    /// The backend broke or sent something unexpected; the connection is unusable.
    Backend(String),
    /// The server ended the session at a shutdown before it answered anything of the request
    /// (nothing of it ran): it may be sent again elsewhere ([`super::replay`]).
    Aborted(String),
}

/// How many times one request is sent again after shutdowns aborted it.
const MAX_RESENDS: usize = 3;

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// Writes the outbox to the pinned connection and forwards replies until none are owed.
    pub(super) async fn exchange(&mut self) -> Result<(), SessionError> {
        if self.pin.as_ref().is_some_and(|p| p.conn.is_shared()) {
            if self.exchange_shared().await? {
                return Ok(());
            }
            // Not a request that stands alone: it goes to a connection of the client's own.
            tracing::debug!(statement = %truncate(&self.sql, 100), "a shared request goes to a connection of its own");
            if let Err(err) = self.unshare().await {
                return self.exchange_failed(err).await;
            }
        }
        let mut resends = 0;
        loop {
            match self.pump().await {
                Ok(()) => return Ok(()),
                Err(Failed::Client(e)) => return Err(SessionError::Client(e)),
                Err(Failed::Backend(why)) => return self.backend_lost(why).await,
                Err(Failed::Aborted(why)) if resends < MAX_RESENDS => {
                    resends += 1;
                    if let Err(err) = self.resend(&why).await {
                        return self.exchange_failed(err).await;
                    }
                }
                Err(Failed::Aborted(why)) => return self.backend_lost(why).await,
            }
        }
    }

    async fn backend_lost(&mut self, why: String) -> Result<(), SessionError> {
        let Some(pin) = self.pin.take() else {
            return Err(SessionError::BackendLost(why));
        };
        let name = self.shard_name(pin.shard);
        let endpoint = self.routing.pools().for_shard(pin.shard).endpoint.name();
        // The client's temporary objects were there: its session cannot go on without them.
        self.kept.lost |= self.kept.keeps(pin.shard);
        if let Some(conn) = pin.conn.into_own() {
            crate::backend::pool::discard(conn);
        }
        self.slot.set_running(None);
        tracing::warn!(shard = %name, %endpoint, "backend connection lost: {why}");
        self.exchange_failed(errors::shard_lost(&name, &endpoint, &why))
            .await
    }

    /// The client's answer when its request got no answer from the backend (the connection
    /// is already gone): `err`, and then what the protocol expects next.
    pub(super) async fn exchange_failed(&mut self, mut err: SqlError) -> Result<(), SessionError> {
        let owed_ready = self.out.replies.owes_client_ready();
        self.out.clear();
        // The transaction's other shards cannot go on without this one.
        self.abandon_participants();
        let in_transaction = self.state.tx != Tx::Idle;
        self.state.lost();
        if in_transaction || self.kept.lost {
            err.severity = "FATAL";
            err.write(&mut self.client.out);
            let _ = self.client.flush().await;
            return Err(SessionError::BackendLost(err.message.clone()));
        }
        err.write(&mut self.client.out);
        if owed_ready {
            reply::ready_for_query(&mut self.client.out, TxStatus::Idle);
        } else {
            // The client's Sync is still to come; it gets its ReadyForQuery then.
            self.state.skip_to_sync();
        }
        Ok(())
    }

    /// One exchange with the pinned connection of the client's own: writes the outbox,
    /// forwards replies until none is owed, relays COPY data, cancels past the statement
    /// timeout, logs a slow statement.
    async fn pump(&mut self) -> Result<(), Failed> {
        let Some(pin) = self.pin.as_mut() else {
            return Err(Failed::Backend(
                "internal: no connection to exchange with".into(),
            ));
        };
        let shard = pin.shard;
        // Only the first request on a newly pinned connection outside a transaction: later
        // ones may use a portal or transaction of an earlier one, which is gone with it. (Nor
        // one with a long message in its tail: sending again reads the request's bytes only.)
        let replayable = pin.fresh && self.state.tx == Tx::Idle && self.out.tail.is_empty();
        pin.fresh = false;
        self.client
            .meter
            .route(RouteKind::SingleShard, self.routing.stats_id(shard));
        let Some(conn) = pin.conn.own() else {
            return Err(Failed::Backend(
                "internal: a shared connection in an exchange of the client's own".into(),
            ));
        };
        // Timed per exchange: a request may hold several (Flush), and time spent waiting for a
        // connection or a paused shard is not the statement's running time.
        let started = tokio::time::Instant::now();
        let limits = &self.routing.config.limits;
        // The router's statement timeout cancels the statement on its backend, once.
        let mut deadline = limits.statement_timeout.map(|t| started + t);
        self.out.replies.drain_synthetic(&mut self.client.out);
        // While the request may be sent again, what it has answered so far stays in the
        // client's buffer from here on, to be taken back if the server aborts it.
        let mut resend = Resend {
            allowed: replayable,
            mark: self.client.out.len(),
        };
        if replayable {
            self.out.replies.record();
        }
        let written = write_at_once(conn, &self.out.bytes)?;
        let mut request = Outgoing::with_tail(&self.out.bytes, &self.out.tail, written);
        loop {
            let want_read = self.out.replies.awaits_backend();
            if request.done() && !want_read {
                break;
            }
            // Replies already read (with an earlier request's, or as a connection ended) are
            // handled before the socket is asked for more: it may have closed after them.
            let buffered = want_read && matches!(next_frame(&conn.rbuf), Ok(Some(_)));
            if !buffered {
                let io = std::future::poll_fn(|cx| {
                    conn.stream
                        .poll_exchange(cx, &mut request, &mut conn.rbuf, want_read)
                });
                tokio::select! {
                    () = until(deadline), if deadline.is_some() => {
                        deadline = None;
                        cancel_past_timeout(&self.routing, shard, conn);
                    }
                    r = io => r.map_err(|e| Failed::Backend(e.to_string()))?,
                }
            }
            let mut replies = Replying {
                replies: &mut self.out.replies,
                client: &mut self.client.out,
                state: &mut self.state,
                changes: &mut self.changes,
                settings: &mut self.settings,
                statements: &mut self.statements,
                sql: &self.sql,
            };
            let copy_in = replies.take(conn, &mut resend)?;
            if resend.allowed && self.client.out.len() > resend.mark {
                // Sent, it cannot be taken back.
                resend.allowed = false;
                self.out.replies.stop_recording();
            }
            self.client.flush().await.map_err(Failed::Client)?;
            // What was before the mark is gone to the client: the request's answers start
            // at the (now empty) buffer's start.
            resend.mark = self.client.out.len();
            if copy_in {
                relay_copy_in(&mut self.client, conn).await?;
            }
        }
        self.out.bytes.clear();
        self.out.tail = bytes::BytesMut::new();
        if resend.allowed {
            self.out.replies.stop_recording();
        }
        self.log_if_slow(shard, started.elapsed(), false);
        Ok(())
    }

    /// The slow-statement log (`[limits] slow_statement_ms`); `shared`: whether the statement
    /// ran on a shared connection.
    pub(super) fn log_if_slow(&self, shard: usize, elapsed: std::time::Duration, shared: bool) {
        let Some(threshold) = self.routing.config.limits.slow_statement else {
            return;
        };
        if elapsed >= threshold {
            tracing::warn!(
                shard = %self.routing.map.shards()[shard].range,
                elapsed_ms = elapsed.as_secs_f64() * 1e3,
                statement = %truncate(&self.sql, 300),
                shared,
                "slow statement"
            );
        }
    }
}

/// Whether the request under way may still be sent again elsewhere ([`super::replay`]), and
/// where in the client's buffer its answers start.
struct Resend {
    allowed: bool,
    mark: usize,
}

/// The parts of a session that reading replies changes (borrowed apart from the pinned
/// connection the replies come from).
struct Replying<'a> {
    replies: &'a mut super::replies::Replies,
    client: &'a mut Vec<u8>,
    state: &'a mut super::state::State,
    changes: &'a mut crate::backend::settings::Changes,
    settings: &'a mut crate::backend::settings::Settings,
    statements: &'a mut super::statements::Statements,
    sql: &'a str,
}

impl Replying<'_> {
    /// Handles every whole reply frame read so far, while replies are owed: each goes through
    /// [`super::replies`], and what the client sees is forwarded. `Ok(true)` when the backend
    /// asked for COPY data.
    fn take(
        &mut self,
        conn: &mut crate::backend::BackendConn,
        resend: &mut Resend,
    ) -> Result<bool, Failed> {
        let mut copy_in = false;
        // Whatever follows the last reply owed (a server ending the session at a shutdown
        // sends its FATAL right after a ReadyForQuery) is no answer to this request: it stays
        // unread, so the pool will not reuse the connection, and a transaction's next request
        // reads it.
        while self.replies.awaits_backend() {
            let h = match next_frame(&conn.rbuf) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => return Err(Failed::Backend(e.to_string())),
            };
            let frame = &conn.rbuf[..h.total];
            if resend.allowed
                && self.replies.is_recording()
                && h.tag == b'E'
                && crate::protocol::backend::is_shutdown(frame)
            {
                // Nothing of the request reached the client: take back what it answered so
                // far and expect its replies again.
                self.client.truncate(resend.mark);
                self.replies.rewind();
                let (code, message) = crate::protocol::backend::error_fields(frame);
                return Err(Failed::Aborted(format!("{message} (SQLSTATE {code})")));
            }
            let seen = self.client.len();
            if h.tag == b'E' {
                self.changes.failed();
            }
            let step = self
                .replies
                .on_frame(h.tag, &frame[5..])
                .map_err(|d| Failed::Backend(d.to_string()))?;
            forward(self.client, step.action, frame);
            if let Some(status) = step.ready {
                self.state.ready(status);
            }
            self.completed(step.completion, step.ready, conn);
            copy_in |= step.copy_in;
            conn.rbuf.advance(h.total);
            self.replies.drain_synthetic(self.client);
            if resend.allowed && !only_descriptions(&self.client[seen..]) {
                // Rows, a command's completion, a notice: the client must not see them twice
                // (and what completed may have run).
                resend.allowed = false;
                self.replies.stop_recording();
            }
            for (id, clients_own) in self.replies.take_failed() {
                conn.prepared.remove(&id);
                if clients_own {
                    self.statements.forget(id);
                }
            }
        }
        Ok(copy_in)
    }

    /// What a completed statement changed of the session and of the connection: settings
    /// (kept once the statement or transaction is over), prepared statements.
    fn completed(
        &mut self,
        completion: Option<Completion>,
        ready: Option<TxStatus>,
        conn: &mut crate::backend::BackendConn,
    ) {
        match completion {
            Some(Completion::Settings) => self.changes.push(self.sql),
            Some(Completion::DiscardAll) => {
                self.changes.push(self.sql);
                // Like Postgres: the client's prepared statements are gone too.
                self.statements.clear();
                conn.prepared.clear();
            }
            Some(Completion::DeallocateAll) => conn.prepared.clear(),
            Some(Completion::Rollback) => self.changes.rolled_back(self.sql),
            Some(Completion::Savepoint) => self.changes.savepoint(self.sql),
            Some(Completion::Release) => self.changes.released(self.sql),
            None => {}
        }
        if ready.is_some() {
            self.changes.query_over();
        }
        if ready == Some(TxStatus::Idle) {
            // The statement or transaction that made these changes is over and kept.
            if let Some(fp) = self.changes.settle(self.settings) {
                if fp == crate::backend::settings::UNKNOWN {
                    tracing::debug!(statement = %truncate(self.sql, 200), "a settings change the router does not follow; the connection will be reset");
                }
                conn.settings_fp = fp;
            }
        }
    }
}

/// Writes what it can of `bytes` at once. A request almost always fits the socket buffer:
/// written straight away, it needs no write while reading, which is the fallback when the
/// kernel would block (or the connection is TLS, whose records the async path writes and
/// flushes). How much was written.
fn write_at_once(conn: &mut crate::backend::BackendConn, bytes: &[u8]) -> Result<usize, Failed> {
    if bytes.is_empty() {
        return Ok(0);
    }
    match conn.stream.try_write(bytes) {
        Ok(n) => Ok(n),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(Failed::Backend(e.to_string())),
    }
}

/// Sleeps until `deadline`, or for ever without one. For a `select!` branch that is off
/// without a deadline: the future of a disabled branch is still built, and building a
/// timer costs a clock read and a registration for every statement.
pub(super) async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Cancels the statement running on `conn` (shard `shard`): the router's statement timeout
/// passed, and Postgres answers 57014 as for any cancel.
fn cancel_past_timeout(
    routing: &crate::routing::Routing,
    shard: usize,
    conn: &crate::backend::BackendConn,
) {
    let endpoint = &routing.pools().for_shard(shard).endpoint;
    let (host, port, pid, secret) = (endpoint.host.clone(), endpoint.port, conn.pid, conn.secret);
    tracing::info!(shard = %routing.map.shards()[shard].range, "statement timeout: cancelling");
    tokio::spawn(async move {
        if let Err(e) =
            crate::backend::cancel::send_cancel((host.as_str(), port), pid, secret).await
        {
            tracing::warn!("could not cancel a statement past the statement timeout: {e}");
        }
    });
}

/// Writes a reply frame for the client as [`super::replies`] says: as it came, without the
/// server's source location (an error the router raised on the backend), or not at all.
pub(super) fn forward(out: &mut Vec<u8>, action: Action, frame: &[u8]) {
    match action {
        Action::Forward => out.extend_from_slice(frame),
        Action::ForwardRaised => out.extend_from_slice(&reply::without_server_location(frame)),
        Action::Drop => {}
    }
}

/// Whether `frames` (replies on their way to the client) only acknowledge and describe:
/// ParseComplete, BindComplete, ParameterDescription, RowDescription, NoData, which the same
/// request sent again on another connection answers alike.
fn only_descriptions(mut frames: &[u8]) -> bool {
    while let Ok(Some(h)) = next_frame(frames) {
        if !crate::protocol::backend::is_description(h.tag) {
            return false;
        }
        frames = &frames[h.total..];
    }
    frames.is_empty()
}

/// Forwards the client's COPY data to the backend until CopyDone or CopyFail.
async fn relay_copy_in<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut super::client::ClientIo<S>,
    conn: &mut crate::backend::BackendConn,
) -> Result<(), Failed> {
    loop {
        let frame = match client.read_frame().await {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                return Err(Failed::Client(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the client left during COPY",
                )))
            }
            Err(e) => return Err(Failed::Client(std::io::Error::other(e))),
        };
        match frame[0] {
            b'd' | b'c' | b'f' | b'H' | b'S' => {
                conn.stream
                    .send(&frame)
                    .await
                    .map_err(|e| Failed::Backend(e.to_string()))?;
                if frame[0] == b'c' || frame[0] == b'f' {
                    return Ok(());
                }
            }
            other => {
                // Postgres ends the COPY with an error when anything else arrives; tell it so.
                let mut fail = bytes::BytesMut::new();
                let why = format!("unexpected message type {other} during COPY from stdin");
                request::copy_fail(&mut fail, &why).map_err(|e| Failed::Backend(e.to_string()))?;
                conn.stream
                    .send(&fail)
                    .await
                    .map_err(|e| Failed::Backend(e.to_string()))?;
                return Ok(());
            }
        }
    }
}

/// At most `max` bytes of `s`, cut at a character boundary, for logs.
pub(super) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
