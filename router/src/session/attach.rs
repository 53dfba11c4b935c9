//! Holding a backend connection for the client (transaction pooling): checked out of the
//! shard's pool for a statement or a transaction ([`super::pinned::Pinned`]), given the
//! client's settings (and its pending `BEGIN`) in the same write as the statement (fragile
//! settings first, answered: `BackendConn::settle_settings`), and returned
//! once the client is at rest; sent again on another connection when a shutdown aborted it.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use super::pinned::{Link, Pinned};
use super::replay;
use super::replies::Audience;
use super::Session;
use crate::backend::conn::PreludeProblem;
use crate::backend::pool::PooledConn;
use crate::backend::prepared::PreparedSet;
use crate::errors;
use crate::protocol::reply::SqlError;
use crate::resolver::{Dest, Reroute};
use crate::routing::clients::CancelTarget;
use crate::routing::Checkout;
use crate::stats::{RouteKind, Stats};

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// Pins a connection to `wanted` (or any shard) unless one is pinned already; with
    /// `with_begin`, a pending `BEGIN` goes out first (not for work outside the transaction,
    /// like preparing a statement).
    pub(super) async fn attach(
        &mut self,
        wanted: Option<usize>,
        with_begin: bool,
    ) -> Result<(), SqlError> {
        if let Some(pin) = &self.pin {
            if wanted.is_some_and(|s| s != pin.shard) {
                // Never run a statement on a shard it was not routed to.
                return Err(errors::internal(
                    "a statement for another shard than the connection held",
                ));
            }
            return Ok(());
        }
        let may_share = std::mem::take(&mut self.may_share);
        if let Some(mut pin) = self.kept.take(wanted) {
            // Its temporary objects are there: never sent again elsewhere.
            pin.fresh = false;
            if let Some(conn) = pin.conn.own() {
                self.client
                    .meter
                    .route(RouteKind::SingleShard, self.routing.stats_id(pin.shard));
                if let Err(err) = self.apply_settings(conn, pin.shard).await {
                    drop(self.kept.put_back(pin));
                    return Err(err);
                }
            }
            self.pin = Some(pin);
            return self.pinned(with_begin);
        }
        if may_share && !wanted.is_some_and(|s| self.kept.keeps(s)) {
            if let Some(shard) = self.shareable_shard(wanted) {
                self.client
                    .meter
                    .route(RouteKind::SingleShard, self.routing.stats_id(shard));
                self.pin = Some(Pinned {
                    shard,
                    conn: Link::Shared {
                        generation: self.routing.generation,
                        assumed: PreparedSet::everything(),
                        any: wanted.is_none(),
                        bound: Vec::new(),
                    },
                    unnamed: 0,
                    fresh: true,
                });
                self.point_cancel_at_pin();
                return Ok(());
            }
        }
        let (mut conn, waited, shard) = match wanted {
            Some(shard) => {
                // Counted for its shard even when no connection can be had.
                self.client
                    .meter
                    .route(RouteKind::SingleShard, self.routing.stats_id(shard));
                match self.routing.checkout_timed(shard).await {
                    Ok((conn, waited)) => (conn, waited, shard),
                    Err(Checkout::Refused(err)) => return Err(err),
                    // Shards of the transaction are held under the map it started with.
                    Err(Checkout::MapChanged) if self.spans_shards() => {
                        return Err(errors::map_changed_while_paused(&self.shard_name(shard)))
                    }
                    Err(Checkout::MapChanged) => self.checkout_after_reload(shard).await?,
                }
            }
            None => self.checkout_any().await?,
        };
        self.client.meter.waited(waited);
        if !self.shared.server_params_learned() {
            self.shared.learn_server_params(&conn.params);
        }
        self.apply_settings(&mut conn, shard).await?;
        self.pin = Some(Pinned {
            shard,
            conn: Link::Own(conn),
            unnamed: 0,
            fresh: true,
        });
        self.pinned(with_begin)
    }

    /// The client's settings, when `conn` holds others: in the same write as its statement,
    /// or first on their own when they may fail ([`crate::backend::BackendConn::settle_settings`]).
    async fn apply_settings(
        &mut self,
        conn: &mut crate::backend::BackendConn,
        shard: usize,
    ) -> Result<(), SqlError> {
        if let Err(mut problem) = conn.settle_settings(&self.settings).await {
            // The client's way out: a Query that is one `SET` or `RESET` runs when the settings
            // it leaves behind can be given (it is what it changes that failed, say).
            let after = problem.refused.as_ref().and(self.settings_after_query());
            if let Some(after) = after {
                match conn.give_settings(&after).await {
                    Ok(()) => return Ok(()),
                    Err(again) => problem.connection_ended |= again.connection_ended,
                }
            }
            conn.broken |= problem.connection_ended;
            let name = self.shard_name(shard);
            return Err(errors::settings_not_given(
                &name,
                problem.refused,
                &problem.what,
            ));
        }
        let fp = self.settings.fingerprint();
        if conn.settings_fp != fp {
            // Two Queries (`Settings::write_all`): the reset cannot be undone by a SET.
            self.out
                .query(crate::backend::settings::RESET_SQL, Audience::Silent)
                .map_err(errors::internal)?;
            let sets = self.settings.set_sql();
            if !sets.is_empty() {
                self.out
                    .query(&sets, Audience::Silent)
                    .map_err(errors::internal)?;
            }
            conn.settings_fp = fp;
        }
        Ok(())
    }

    /// The client's settings as they will be after the Query being routed, when that is one
    /// `SET` or `RESET` the router follows. Not for extended messages: what a batch held
    /// before its Bind would run first, and a Bind need not be executed.
    fn settings_after_query(&self) -> Option<crate::backend::settings::Settings> {
        use crate::backend::settings::{parse_change, Change};
        if !self.in_query {
            return None;
        }
        let change = parse_change(&self.sql);
        if !matches!(
            change,
            Change::Set { .. } | Change::Reset { .. } | Change::ResetAll | Change::DiscardAll
        ) {
            return None;
        }
        let mut after = self.settings.clone();
        after.apply(&change).then_some(after)
    }

    /// What follows the pinning of a connection: cancels go to it, and with `with_begin`, a
    /// pending `BEGIN` goes out first.
    fn pinned(&mut self, with_begin: bool) -> Result<(), SqlError> {
        self.point_cancel_at_pin();
        if with_begin {
            // Other shards the transaction goes on to begin it the same way.
            if let Some(begin) = self.state.take_begin() {
                // Its error, if any, is the client's; its ReadyForQuery is not.
                self.out
                    .query(&begin, Audience::Router)
                    .map_err(errors::internal)?;
            }
        }
        Ok(())
    }

    /// A connection to any shard that can give one (the statement needs no particular shard),
    /// and the shard.
    async fn checkout_any(&mut self) -> Result<(PooledConn, Duration, usize), SqlError> {
        // A transaction that a statement needing no shard opens (a SAVEPOINT, a catalog query)
        // opens on the default shard, where statements on tables outside the map must run: an
        // ORM's catalog query after its SAVEPOINT then stays in the transaction.
        let start = if self.state.in_transaction() {
            self.routing.map.default_shard()
        } else {
            self.shared.any_shard(self.routing.map.shards().len())
        };
        let got = match self.routing.checkout_any(start).await {
            Err(Checkout::MapChanged) => {
                // Waited for paused shards through a reload: any shard of the new map will do.
                self.routing = self.shared.routing();
                self.statements
                    .replan(&self.routing.planner, &mut self.nbuf);
                self.routing.checkout_any(start).await
            }
            got => got,
        };
        match got {
            Ok((conn, waited, shard)) => {
                self.client
                    .meter
                    .route(RouteKind::SingleShard, self.routing.stats_id(shard));
                Ok((conn, waited, shard))
            }
            Err(Checkout::Refused(err)) => Err(err),
            Err(Checkout::MapChanged) => Err(errors::map_changed_while_paused("any")),
        }
    }

    /// The shard map changed while the statement waited for its paused shard (the move a
    /// pause is for): takes the new routing, and the shard that owns the same keys in it, or,
    /// when the shard was split, the half that owns the statement's key. Nothing of the
    /// statement has reached a shard yet, and no connection is held.
    pub(super) async fn checkout_after_reload(
        &mut self,
        old: usize,
    ) -> Result<(PooledConn, Duration, usize), SqlError> {
        let range = self.routing.map.shards()[old].range;
        self.routing = self.shared.routing();
        self.statements
            .replan(&self.routing.planner, &mut self.nbuf);
        let gone = || errors::map_changed_while_paused(&range.to_string());
        let same = self
            .routing
            .map
            .shards()
            .iter()
            .position(|s| s.range == range);
        let shard = same
            .or_else(|| self.reroute.shard(&self.routing.map))
            .ok_or_else(gone)?;
        self.client
            .meter
            .route(RouteKind::SingleShard, self.routing.stats_id(shard));
        match self.routing.checkout_timed(shard).await {
            Ok((conn, waited)) => Ok((conn, waited, shard)),
            Err(Checkout::MapChanged) => Err(gone()),
            Err(Checkout::Refused(err)) => Err(err),
        }
    }

    /// Sends the request in the outbox again on another connection to the same shard (held
    /// until the shard answers: `[failover]`), after the server aborted it at a shutdown
    /// before running any of it (`why`). The new connection first gets what the request
    /// assumes of the old one: the client's settings and the router statements it uses.
    pub(super) async fn resend(&mut self, why: &str) -> Result<(), SqlError> {
        let Some(old) = self.pin.take() else {
            return Err(errors::internal("a resend without a connection"));
        };
        let name = self.shard_name(old.shard);
        if let Some(conn) = old.conn.into_own() {
            crate::backend::pool::discard(conn);
        }
        self.slot.set_running(None);
        let ep = &self.routing.pools().for_shard(old.shard).endpoint;
        let endpoint = ep.name();
        let lost = |why: &str| errors::shard_lost(&name, &endpoint, why);
        let uses = replay::uses(&self.out.bytes).map_err(|e| lost(&format!("{why}; {}", e.0)))?;
        // A shutdown refuses new logins from the moment it ends the sessions; a server that
        // still takes one ended only this session (`pg_terminate_backend`), on purpose.
        if crate::backend::BackendConn::connect(ep).await.is_ok() {
            return Err(errors::ended_by_server(&name, why));
        }
        Stats::count(&self.shared.stats.failover.resent);
        tracing::info!(shard = %name, "sending a statement again that a shutdown aborted before it ran: {why}");
        // The connection that gets it may itself be ended by the same shutdown before the
        // request is written to it (while it is being prepared): then another is taken.
        let mut attempt = 0;
        // The shard's index in the session's current map (a reload while it waited moves it).
        let mut target = old.shard;
        // A request sent again may hold several statements: a split of their shard must not
        // send them all to the half of one of their keys (nothing of it ran: 57P03, run again).
        self.reroute = Reroute::No;
        let (conn, shard) = loop {
            attempt += 1;
            let (conn, _, shard) = match self.routing.checkout_timed(target).await {
                Ok((conn, waited)) => (conn, waited, target),
                Err(Checkout::Refused(err)) => return Err(err),
                Err(Checkout::MapChanged) => self.checkout_after_reload(target).await?,
            };
            target = shard;
            match self.fit(conn, &uses, &[]).await {
                Ok(conn) => break (conn, shard),
                Err(p) if p.connection_ended && attempt < PRELUDE_ATTEMPTS => continue,
                Err(p) => {
                    return Err(lost(&format!(
                        "{why}; preparing another connection: {}",
                        p.what
                    )))
                }
            }
        };
        self.pin = Some(Pinned {
            shard,
            conn: Link::Own(conn),
            unnamed: old.unnamed,
            fresh: true,
        });
        self.point_cancel_at_pin();
        Ok(())
    }

    /// `conn` made fit for a request written for another connection ([`Self::fitting_prelude`],
    /// run on it); a connection that could not be is discarded, never reused (its record of
    /// prepared statements may be wrong).
    pub(super) async fn fit(
        &self,
        mut conn: PooledConn,
        uses: &replay::Uses,
        bound: &[Arc<crate::backend::registry::Statement>],
    ) -> Result<PooledConn, PreludeProblem> {
        let fp = self.settings.fingerprint();
        let (prelude, readies) = match self.fitting_prelude(&mut conn, uses, bound) {
            Ok(fit) => fit,
            Err(what) => {
                crate::backend::pool::discard(conn);
                return Err(PreludeProblem {
                    what,
                    refused: None,
                    connection_ended: false,
                });
            }
        };
        if readies > 0 {
            if let Some(problem) = conn.run_prelude(&prelude, readies).await {
                crate::backend::pool::discard(conn);
                return Err(problem);
            }
            conn.settings_fp = fp;
        }
        Ok(conn)
    }

    /// What makes `conn` fit a request written for another connection (`uses`): the client's
    /// settings when the connection holds others, and the router statements the request uses
    /// that it lacks (`bound` first, then the client's statements, give their texts); the
    /// prelude and how many ReadyForQuery frames it answers with.
    pub(super) fn fitting_prelude(
        &self,
        conn: &mut crate::backend::BackendConn,
        uses: &replay::Uses,
        bound: &[Arc<crate::backend::registry::Statement>],
    ) -> Result<(bytes::BytesMut, usize), String> {
        let mut prelude = bytes::BytesMut::new();
        let mut readies = 0;
        readies += self
            .settings
            .write_apply(conn.settings_fp, &mut prelude)
            .map_err(|e| e.to_string())?;
        let statements = &self.statements;
        let wrote = replay::prelude(&mut prelude, uses, &mut conn.prepared, |id| {
            bound
                .iter()
                .find(|s| s.id == id)
                .or_else(|| statements.router_statement(id))
                .map(|s| (&*s.sql, &*s.param_types))
        })
        .map_err(|e| e.0.to_string())?;
        Ok((prelude, readies + usize::from(wrote)))
    }

    /// A cancel request of the client goes to the pinned connection's statement.
    pub(super) fn point_cancel_at_pin(&self) {
        match &self.pin {
            Some(Pinned {
                shard,
                conn: Link::Own(conn),
                ..
            }) => self.slot.set_running(Some(CancelTarget {
                generation: self.routing.generation,
                shard: *shard,
                pid: conn.pid,
                secret: conn.secret,
            })),
            // A statement on a shared connection is cancelled by the session itself
            // (`ClientSlot::ask_cancel`), which knows which of the connection's it is.
            Some(_) | None => self.slot.set_running(None),
        }
    }

    /// Returns the connection to its pool once the client is at rest between transactions. It
    /// keeps the client's settings; the next client with other settings resets them.
    pub(super) fn release_if_idle(&mut self) {
        if self.state.at_rest() && self.out.replies.is_empty() && !self.spans_shards() {
            self.release();
        }
    }

    /// Returns the pinned connection to its pool (or to the session's kept connections).
    pub(super) fn release(&mut self) {
        if let Some(pin) = self.pin.take() {
            drop(self.kept.put_back(pin));
            self.slot.set_running(None);
        }
    }

    /// `dest` of a statement whose plan `keeps` (it makes a temporary object outliving its
    /// transaction): from now on the session keeps its connection there. Refused (the new
    /// destination) in a transaction that spans shards or runs on another shard, whose
    /// connections it could not keep apart from the transaction's end. Any other statement's
    /// `dest` is returned as it is.
    pub(super) fn keep_connection(&mut self, keeps: bool, dest: Dest) -> Dest {
        if !keeps {
            return dest;
        }
        let default = self.routing.map.default_shard();
        let shard = match dest {
            Dest::Shard(shard) => shard,
            Dest::Any => self.pinned_shard().unwrap_or(default),
            // A temporary function (in `pg_temp`): with one shard, on it.
            Dest::Broadcast if self.routing.map.shards().len() == 1 => default,
            Dest::Broadcast => {
                return Dest::Refused(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "a temporary function would be made on every shard, each on a connection of its own that is gone after the statement",
                ))
            }
            other => return other,
        };
        if self.spans_shards() || self.pinned_shard().is_some_and(|p| p != shard) {
            return Dest::Refused(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                "a temporary object cannot be made in a transaction that runs on several shards, or on another shard than the object's",
            )
            .with_hint("make it outside the transaction, or in one that stays on the default shard"));
        }
        self.kept.keep(shard);
        if let Some(Pinned {
            conn: Link::Own(conn),
            shard: s,
            ..
        }) = &mut self.pin
        {
            if *s == shard {
                conn.broken = true;
            }
        }
        Dest::Shard(shard)
    }

    /// At the end of the session: a connection that is not at rest (an open transaction, a
    /// half-read reply) is closed, never handed to another client.
    pub(super) fn release_at_exit(&mut self) {
        self.abandon_participants();
        if let Some(pin) = self.pin.take() {
            if !(self.state.at_rest() && self.out.replies.is_empty()) {
                // (A shared connection drops the replies of a client that left.)
                if let Some(conn) = pin.conn.into_own() {
                    crate::backend::pool::discard(conn);
                }
            }
            self.slot.set_running(None);
        }
    }

    /// The shard of the pinned connection.
    pub(super) fn pinned_shard(&self) -> Option<usize> {
        self.pin.as_ref().map(|p| p.shard)
    }
}

/// How many connections a prelude is tried on (a shutdown may end several taken from the pool
/// before a request is written to them).
pub(super) const PRELUDE_ATTEMPTS: usize = 3;
