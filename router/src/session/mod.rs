//! One client's session after login: the statement loop of transaction pooling.
//!
//! The loop ([`Session::run`]) reads whatever the client sent and handles each whole message:
//! a simple Query ([`simple`]) or an extended-protocol message ([`extended`]). Either way the
//! statement is planned (`crate::planner`) and resolved to a target (`crate::resolver`), and
//! the protocol file hands the target to the one executor ([`execute`]), which runs it: on the
//! pinned backend connection ([`attach`], [`outbox`], [`relay`]), by the router itself
//! (`BEGIN`, cursors it serves), or on several shards ([`several`], over
//! `crate::multishard`). What the session is doing is its [`State`]; what it knows of the
//! client's statements is in [`statements`].
//!
//! | file | job |
//! |---|---|
//! | [`client`] | the client's socket and buffers |
//! | [`state`] | transaction and batch state, every transition (sans-IO) |
//! | [`simple`] | Query messages: decode, plan, resolve |
//! | [`extended`] | Parse, Bind, Describe, Execute, Close, Flush, Sync (`held`: messages held until their batch has a shard; `scatter`: batches of a statement on several shards) |
//! | [`execute`] | the one executor of a resolved statement, for both protocols |
//! | [`statements`] | the client's named and unnamed statements |
//! | [`outbox`] | client messages rewritten for the pinned connection (sans-IO) |
//! | [`replies`] | which backend replies the client sees (sans-IO) |
//! | [`relay`] | the I/O of one exchange with the pinned connection, COPY relay |
//! | [`replay`] | a request aborted by a server shutdown, made fit for another connection (sans-IO) |
//! | [`pinned`] | the connection a client holds (its own, or the shard's shared ones) |
//! | [`attach`] | checking a connection out for the client, sending again after a shutdown, returning it |
//! | [`shared`] | a request on the shard's shared connections (multiplexed) |
//! | [`spread`] | a statement on several shards as data ([`spread::Spread`]) |
//! | [`several`] | running a statement on several shards (`run_spread`) |
//! | [`participants`] | a transaction that goes on to other shards |
//! | [`prepared_sql`] | SQL-level PREPARE / EXECUTE / DEALLOCATE |
//! | [`cursors`] | SQL cursors: on their shard, or held by the router |
//! | [`explain`] | `EXPLAIN (ROUTE)`, answered by the router |
//!
//! The session is generic over its client stream, so its state machine also runs over an
//! in-memory pipe (`tests`).

mod attach;
mod client;
mod cursors;
mod execute;
mod explain;
mod extended;
mod lookup;
mod lookup_write;
mod new_keys;
mod outbox;
mod participants;
mod pinned;
mod prepared_sql;
mod relay;
mod replay;
mod replies;
mod several;
mod shared;
mod simple;
mod spread;
mod state;
mod statements;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

pub use client::{ClientError, ClientIo};

use crate::backend::settings::{Changes, Settings};
use crate::errors;
use crate::planner::NormalizeBuf;
use crate::protocol::frontend::Bind;
use crate::protocol::frontend::Malformed;
use crate::protocol::reply::SqlError;
use crate::resolver::{self, Context, Dest, Reroute, Target};
use crate::routing::clients::ClientSlot;
use crate::routing::Phase;
use crate::routing::{Router, Routing};
use outbox::Outbox;
use pinned::{Kept, Pinned};
use state::State;
use statements::Statements;

/// Why a session ended abnormally (the client has been told where it could be).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("client connection: {0}")]
    Client(std::io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("backend connection lost inside a transaction: {0}")]
    BackendLost(String),
    /// A message longer than `limits.max_message_bytes`: the client gets `54000` and the
    /// connection closes (the rest of the message is never read).
    #[error("message too long: {len} bytes, limit {limit}")]
    TooLong { len: usize, limit: usize },
}

impl From<Malformed> for SessionError {
    fn from(m: Malformed) -> Self {
        SessionError::Protocol(m.to_string())
    }
}

impl From<client::ClientError> for SessionError {
    fn from(e: client::ClientError) -> Self {
        match e {
            client::ClientError::Io(e) => SessionError::Client(e),
            client::ClientError::Protocol(e) => SessionError::Protocol(e.to_string()),
            client::ClientError::TooLong { len, limit } => SessionError::TooLong { len, limit },
        }
    }
}

/// Who the client is and its settings as its next statement sees them: the session's, changed
/// by the statement or transaction under way (a `SET` inside a transaction, a `SET LOCAL`).
#[derive(Clone, Copy)]
struct Seen<'a> {
    user: &'a str,
    settings: &'a Settings,
    changes: &'a Changes,
    /// The session keeps a connection for its temporary objects (`pinned::Kept`): its
    /// transactions stay on one shard, so that the kept connection never becomes one part
    /// of several, which end together and go back to their pools.
    keeps: bool,
}

impl<'a> Seen<'a> {
    fn get(&self, name: &str) -> Option<&'a str> {
        self.changes.current(self.settings, name)
    }

    /// [`Seen::get`] for a custom setting (a name with a dot, like the router's own
    /// `shardgate.*`), which costs nothing when the session has set none and changes none.
    fn get_custom(&self, name: &str) -> Option<&'a str> {
        debug_assert!(name.contains('.'));
        if self.changes.is_empty() && !self.settings.has_custom() {
            return None;
        }
        self.get(name)
    }
}

pub struct Session<S> {
    shared: Arc<Router>,
    /// The config, shard map, planner and pools the session uses: the current ones whenever
    /// it is at rest, so a transaction finishes on the ones it started with.
    routing: Arc<Routing>,
    /// The router's phase: when it closes for a drain, the session ends at rest.
    phase: tokio::sync::watch::Receiver<Phase>,
    client: ClientIo<S>,
    slot: Arc<ClientSlot>,
    state: State,
    /// The backend connection the client holds, if any.
    pin: Option<Pinned>,
    /// The connections of the transaction's other shards, when it went on to several (each
    /// at rest inside the transaction).
    others: Vec<Pinned>,
    /// The connections the session keeps between transactions for its temporary objects.
    kept: Kept,
    /// What goes to the pinned connection next.
    out: Outbox,
    statements: Statements,
    /// The client's session settings, applied to whichever connection serves it.
    settings: Settings,
    /// Settings changes of the statement or transaction under way.
    changes: Changes,
    nbuf: NormalizeBuf,
    /// The text of the statement being run (for the slow-statement log and settings changes).
    sql: String,
    /// How the statement being attached finds its shard if a reload splits the paused shard
    /// it waits for: the half owning its key, or the new default shard.
    reroute: Reroute,
    /// The client's SQL cursors.
    cursors: cursors::Cursors,
    /// The statement about to be attached may go to the shard's shared connections (its
    /// caller found it shareable); [`Session::attach`] takes it.
    may_share: bool,
    /// Where replies of shared requests arrive (made at the first).
    channel: Option<crate::backend::mux::Channel>,
    /// A Query with the keys the router gave is being run (`new_keys`): it must not need keys.
    writing_keys: bool,
    /// A simple Query (whose text is `sql`) is being routed, rather than extended messages:
    /// when it is one `SET` or `RESET`, it is the client's way out of settings a connection
    /// can no longer be given ([`Session::attach`]).
    in_query: bool,
    /// The user the client logged in as (whether it may pin statements by hand is the
    /// config's say, at each statement: a reload may change it).
    user: String,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// A session for a logged-in client; `rbuf` holds what it sent after its login.
    pub fn new(
        shared: Arc<Router>,
        stream: S,
        rbuf: BytesMut,
        slot: Arc<ClientSlot>,
        settings: Settings,
        user: String,
    ) -> Session<S> {
        let routing = shared.routing();
        let mut client = ClientIo::new(stream, rbuf);
        client.max_message = routing.config.limits.max_message_bytes;
        Session {
            routing,
            phase: shared.lifecycle.subscribe(),
            shared,
            client,
            slot,
            state: State::default(),
            pin: None,
            others: Vec::new(),
            kept: Kept::default(),
            out: Outbox::default(),
            statements: Statements::default(),
            settings,
            changes: Default::default(),
            nbuf: NormalizeBuf::new(),
            sql: String::new(),
            reroute: Reroute::No,
            cursors: Default::default(),
            may_share: false,
            channel: None,
            writing_keys: false,
            in_query: false,
            user,
        }
    }

    /// Runs until the client leaves; a pinned connection that is not at rest is discarded.
    pub async fn run(mut self) -> Result<(), SessionError> {
        let result = self.serve().await;
        if let Err(SessionError::Protocol(why)) = &result {
            // Like Postgres: a FATAL protocol-violation error, then the connection closes.
            self.client.out.clear();
            SqlError::fatal(errors::PROTOCOL_VIOLATION, why.clone()).write(&mut self.client.out);
            let _ = self.client.flush().await;
        }
        if let Err(SessionError::TooLong { len, limit }) = &result {
            self.client.out.clear();
            let mut err = errors::message_too_long(*len, *limit);
            err.severity = "FATAL";
            err.write(&mut self.client.out);
            let _ = self.client.flush().await;
            self.client
                .discard_refused(std::time::Duration::from_secs(2))
                .await;
        }
        self.release_at_exit();
        result
    }

    async fn serve(&mut self) -> Result<(), SessionError> {
        // A drain closes sessions that wait at rest. The wait is made once, not per message:
        // registering a waiter with the phase's channel on every wait cost as much as a tenth
        // of routing a statement.
        let mut phase = self.phase.clone();
        let closing = phase.wait_for(|p| *p == Phase::Closing);
        tokio::pin!(closing);
        let mut closed = false;
        loop {
            while let Some(frame) = self.client.next_frame()? {
                self.client
                    .meter
                    .received(frame[0], std::time::Instant::now);
                // Replies the router made up for earlier messages go first: nothing is owed
                // by a backend between messages, so they are next in line.
                self.out.replies.drain_synthetic(&mut self.client.out);
                if self.at_rest() {
                    if self.shared.lifecycle.closing() {
                        return self.terminate().await;
                    }
                    self.follow_reload();
                    if self.kept.lost {
                        return self.end_for_lost_objects().await;
                    }
                }
                match frame[0] {
                    b'Q' => self.query(frame).await?,
                    b'P' | b'B' | b'D' | b'E' | b'C' | b'H' | b'S' => self.extended(&frame).await?,
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
            self.out.replies.drain_synthetic(&mut self.client.out);
            self.client.flush().await.map_err(SessionError::Client)?;
            self.trim();
            if self.at_rest() && self.shared.lifecycle.closing() {
                return self.terminate().await;
            }
            let at_rest = self.at_rest();
            tokio::select! {
                biased;
                more = self.client.fill() => {
                    if !more.map_err(SessionError::Client)? {
                        return Ok(());
                    }
                }
                _ = &mut closing, if at_rest && !closed => closed = true,
            }
        }
    }

    /// No transaction, no batch, no connection held, nothing owed: the session may switch to a
    /// reloaded routing, or end for a drain.
    fn at_rest(&self) -> bool {
        self.pin.is_none()
            && !self.spans_shards()
            && self.state.at_rest()
            && self.out.replies.is_empty()
    }

    /// Gives back the memory a long message made the session's buffers grow to (see
    /// [`client::ClientIo::trim`]); a few comparisons when nothing grew.
    fn trim(&mut self) {
        self.client.trim();
        if self.sql.capacity() > client::KEEP_AT_REST {
            self.sql = String::new();
        }
        self.nbuf.trim(client::KEEP_AT_REST);
        if self.out.bytes.is_empty() && self.out.bytes.capacity() > client::KEEP_AT_REST {
            self.out.bytes = Default::default();
        }
    }

    /// Ends the session for a drain, as Postgres ends sessions at a fast shutdown.
    async fn terminate(&mut self) -> Result<(), SessionError> {
        SqlError::fatal(
            errors::ADMIN_SHUTDOWN,
            "terminating connection due to administrator command",
        )
        .with_hint("the router is shutting down: connect again (to another router)")
        .write(&mut self.client.out);
        let _ = self.client.flush().await;
        Ok(())
    }

    /// Takes the current routing when a reload replaced the session's (the session is at
    /// rest). The client's prepared statements are planned again with the new planner, since
    /// the tables of the shard map may have changed.
    fn follow_reload(&mut self) {
        if self.shared.generation() == self.routing.generation {
            return;
        }
        let old = std::mem::replace(&mut self.routing, self.shared.routing());
        if self.kept.any() && !self.kept.follow(&old.map, &self.routing.map) {
            tracing::info!(
                "a reload moved the shard of a session's temporary objects: the session ends"
            );
        }
        self.client.max_message = self.routing.config.limits.max_message_bytes;
        self.statements
            .replan(&self.routing.planner, &mut self.nbuf);
    }

    /// A reload moved the shard that held the client's temporary objects: they are gone, so
    /// the session ends as Postgres would end it, with a FATAL error.
    async fn end_for_lost_objects(&mut self) -> Result<(), SessionError> {
        let why = "the shard map changed under this session's temporary objects: they are gone";
        let mut err = SqlError::new(crate::errors::ADMIN_SHUTDOWN, why);
        err.severity = "FATAL";
        err.write(&mut self.client.out);
        let _ = self.client.flush().await;
        Err(SessionError::BackendLost(why.into()))
    }

    /// Resolves one statement of the client against its transaction (`pinned`: the shard of
    /// the pinned connection).
    fn resolve<'a>(
        routing: &'a Routing,
        settings: Seen<'a>,
        state: &State,
        pinned: Option<usize>,
        stmt: &resolver::Statement<'a>,
    ) -> Target<'a> {
        let cx = Self::context(routing, settings, state, pinned);
        resolver::resolve(stmt, &cx)
    }

    /// What besides a statement decides its target: the map, the transaction, the session's
    /// settings and the config.
    fn context<'a>(
        routing: &'a Routing,
        settings: Seen<'a>,
        state: &State,
        pinned: Option<usize>,
    ) -> Context<'a> {
        Context {
            map: &routing.map,
            transaction: state.transaction(pinned),
            pins: resolver::manual::Pins {
                shard: settings.get_custom(resolver::manual::SETTING),
                key: settings.get_custom(resolver::manual::KEY_SETTING),
                allowed: !routing.config.hints_for_admins_only
                    || routing.config.user(settings.user).is_some_and(|u| u.admin),
            },
            allow_scatter_writes: match settings.get_custom("shardgate.allow_scatter_writes") {
                Some(v) => matches!(
                    v.trim().trim_matches('\'').to_ascii_lowercase().as_str(),
                    "on" | "true" | "1" | "yes"
                ),
                None => routing.config.transactions.scatter_writes,
            },
            cross_shard: routing.config.transactions.cross_shard
                != crate::config::CrossShard::Refuse
                && !settings.keeps,
            keeps: state.keeps(pinned),
        }
    }

    /// Resolves one of the client's statements with a Bind's parameters.
    fn resolve_bound(&mut self, stmt: &statements::ClientStatement, bind: &Bind<'_>) -> Dest {
        let resolved = resolver::Statement {
            sql: stmt.sql(),
            plan: &stmt.plan,
            params: stmt.params(Some(bind)),
        };
        let pinned = self.pinned_shard();
        let seen = Seen {
            user: &self.user,
            settings: &self.settings,
            changes: &self.changes,
            keeps: self.kept.any(),
        };
        let target = Self::resolve(&self.routing, seen, &self.state, pinned, &resolved);
        self.reroute = target.reroute();
        target.dest
    }

    /// Whether the floats the shards print are their exact values, which a sum across shards
    /// needs: `extra_float_digits` above 0 (the default, 1) as the client's settings leave it.
    /// A server or role default below 1 is not seen here (docs/compatibility.md).
    fn floats_exact(&self) -> bool {
        let seen = Seen {
            user: &self.user,
            settings: &self.settings,
            changes: &self.changes,
            keeps: self.kept.any(),
        };
        let above_0 = |v: Option<&str>| {
            v.is_none_or(|v| {
                v.trim()
                    .trim_matches('\'')
                    .parse::<i32>()
                    .is_ok_and(|d| d > 0)
            })
        };
        // A RESET under way reads as "not set" though it goes back to a startup value: the
        // session's own value must pass too.
        above_0(seen.get("extra_float_digits")) && above_0(self.settings.get("extra_float_digits"))
    }

    fn shard_name(&self, shard: usize) -> String {
        self.routing.map.shards()[shard].range.to_string()
    }

    /// Answers with the router's error, without any backend: a transaction fails, as on
    /// Postgres.
    fn refuse_here(&mut self, err: &SqlError) {
        err.write(&mut self.client.out);
        self.state.refused();
    }
}

impl From<crate::protocol::request::Unwritable> for SessionError {
    /// A message the router could not write for the backend (a NUL inside a string): nothing
    /// sensible can follow, as after a malformed message.
    fn from(e: crate::protocol::request::Unwritable) -> Self {
        SessionError::Protocol(e.to_string())
    }
}
