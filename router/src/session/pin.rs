//! Holding a backend connection for the client (transaction pooling): checked out of the
//! shard's pool for a statement or a transaction, given the client's settings (and its pending
//! `BEGIN`) in the same write as the statement, and returned once the client is at rest.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use super::replies::Audience;
use super::Session;
use crate::backend::pool::PooledConn;
use crate::errors;
use crate::protocol::reply::SqlError;
use crate::server::clients::CancelTarget;
use crate::server::Checkout;
use crate::stats::RouteKind;

/// The backend connection a client holds.
pub struct Pinned {
    pub shard: usize,
    pub conn: PooledConn,
    /// Which version of the client's unnamed statement the connection holds (0: none).
    pub unnamed: u64,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// Pins a connection to `wanted` (or any shard) unless one is pinned already; with
    /// `with_begin`, a pending `BEGIN` goes out first (not for work outside the transaction,
    /// like preparing a statement).
    pub(super) async fn attach(
        &mut self,
        wanted: Option<usize>,
        with_begin: bool,
    ) -> Result<(), SqlError> {
        if self.pin.is_some() {
            return Ok(());
        }
        let shard =
            wanted.unwrap_or_else(|| self.shared.any_shard(self.routing.map.shards().len()));
        // Counted for its shard even when no connection can be had.
        self.client
            .meter
            .route(RouteKind::SingleShard, self.routing.stats_id(shard));
        let (mut conn, waited, shard) = match self.routing.checkout_timed(shard).await {
            Ok((conn, waited)) => (conn, waited, shard),
            Err(Checkout::Refused(err)) => return Err(err),
            Err(Checkout::MapChanged) => self.checkout_after_reload(shard).await?,
        };
        self.client.meter.waited(waited);
        if !self.shared.server_params_learned() {
            self.shared.learn_server_params(&conn.params);
        }
        self.slot.set_running(Some(CancelTarget {
            generation: self.routing.generation,
            shard,
            pid: conn.pid,
            secret: conn.secret,
        }));
        let fp = self.settings.fingerprint();
        if conn.settings_fp != fp {
            // The client's settings go out in the same write as its statement.
            self.out
                .query(&self.settings.apply_sql(), Audience::Silent)
                .map_err(errors::internal)?;
            conn.settings_fp = fp;
        }
        self.pin = Some(Pinned {
            shard,
            conn,
            unnamed: 0,
        });
        if with_begin {
            if let Some(begin) = self.state.take_begin() {
                // Its error, if any, is the client's; its ReadyForQuery is not.
                self.out
                    .query(&begin, Audience::Router)
                    .map_err(errors::internal)?;
            }
        }
        Ok(())
    }

    /// The shard map changed while the statement waited for its paused shard (the move a
    /// pause is for): takes the new routing, and the shard that owns the same keys in it.
    /// Nothing of the statement has reached a shard yet, and no connection is held.
    async fn checkout_after_reload(
        &mut self,
        old: usize,
    ) -> Result<(PooledConn, Duration, usize), SqlError> {
        let range = self.routing.map.shards()[old].range;
        self.routing = self.shared.routing();
        self.statements
            .replan(&self.routing.planner, &mut self.nbuf);
        let gone = || errors::map_changed_while_paused(&range.to_string());
        let shard = self
            .routing
            .map
            .shards()
            .iter()
            .position(|s| s.range == range)
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

    /// Returns the connection to its pool once the client is at rest between transactions. It
    /// keeps the client's settings; the next client with other settings resets them.
    pub(super) fn release_if_idle(&mut self) {
        if self.state.at_rest() && self.out.replies.is_empty() {
            self.release();
        }
    }

    /// Returns the pinned connection to its pool.
    pub(super) fn release(&mut self) {
        if self.pin.take().is_some() {
            self.slot.set_running(None);
        }
    }

    /// At the end of the session: a connection that is not at rest (an open transaction, a
    /// half-read reply) is closed, never handed to another client.
    pub(super) fn release_at_exit(&mut self) {
        if let Some(pin) = self.pin.take() {
            if !(self.state.at_rest() && self.out.replies.is_empty()) {
                crate::backend::pool::discard(pin.conn);
            }
            self.slot.set_running(None);
        }
    }

    /// The shard of the pinned connection.
    pub(super) fn pinned_shard(&self) -> Option<usize> {
        self.pin.as_ref().map(|p| p.shard)
    }
}
