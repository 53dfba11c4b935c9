//! A connection for a statement: from the calling worker's pool of its shard, waiting while
//! the shard is paused, and held (`[failover]`, [`super::hold`]) while its primary cannot be
//! reached; or from whichever shard can give one, for a statement that needs no particular
//! shard. Each error is the one the client gets.

use std::time::Duration;

use super::hold::{self, Hold, HoldEnd};
use super::pause::Waited;
use super::Routing;
use crate::backend::pool::{CheckoutError, PooledConn};
use crate::backend::BackendError;
use crate::errors;
use crate::protocol::reply::SqlError;

/// Why a checkout gave no connection.
#[derive(Debug)]
pub enum Checkout {
    /// The shard map changed while the statement waited for its paused shard: it must be
    /// routed again with the current routing.
    MapChanged,
    /// The error the client gets.
    Refused(SqlError),
}

impl Routing {
    /// A connection to `shard` from this worker's pool, or the error a client gets for it
    /// (53300 when the pool stays busy, 08006/08001 when the shard cannot be reached, 57P03
    /// when it stays paused or the shard map changed while it was).
    pub async fn checkout(&self, shard: usize) -> Result<PooledConn, SqlError> {
        match self.checkout_timed(shard).await {
            Ok((conn, _)) => Ok(conn),
            Err(Checkout::MapChanged) => {
                Err(errors::map_changed_while_paused(&self.shard_name(shard)))
            }
            Err(Checkout::Refused(e)) => Err(e),
        }
    }

    /// A connection for a client's statement with the client's `settings`: given first and
    /// answered when they may fail where the client's own `SET` succeeded
    /// ([`crate::backend::BackendConn::settle_settings`]), so that the statement never runs
    /// without them; otherwise [`crate::backend::settings::Settings::write_apply`] writes them
    /// in the same write as the statement, as before.
    pub async fn checkout_for(
        &self,
        shard: usize,
        settings: &crate::backend::settings::Settings,
    ) -> Result<PooledConn, SqlError> {
        let mut conn = self.checkout(shard).await?;
        match conn.settle_settings(settings).await {
            Ok(()) => Ok(conn),
            Err(problem) => {
                if problem.connection_ended {
                    crate::backend::pool::discard(conn);
                }
                Err(errors::settings_not_given(
                    &self.shard_name(shard),
                    problem.refused,
                    &problem.what,
                ))
            }
        }
    }

    /// A connection for the router's own work (lookups, two-phase recovery): without any
    /// client's settings or role, which a pooled connection may still hold (a client's `SET
    /// ROLE` would filter a lookup through row security, or forbid a recovery).
    pub async fn checkout_own(&self, shard: usize) -> Result<PooledConn, SqlError> {
        let mut conn = self.checkout(shard).await?;
        if conn.settings_fp != 0 {
            let reset = conn
                .simple_query(crate::backend::settings::RESET_SQL)
                .await
                .ok()
                .filter(|answer| answer.error.is_none());
            if reset.is_none() {
                crate::backend::pool::discard(conn);
                return Err(SqlError::new(
                    errors::CONNECTION_FAILURE,
                    format!(
                        "could not reset a connection to shard {}",
                        self.shard_name(shard)
                    ),
                ));
            }
            conn.settings_fp = 0;
        }
        Ok(conn)
    }

    /// [`Routing::checkout`], and how long the caller waited (paused, opening a connection,
    /// for a busy pool, or held while the shard could not be reached; zero, without reading a
    /// clock, when a connection was free).
    pub async fn checkout_timed(&self, shard: usize) -> Result<(PooledConn, Duration), Checkout> {
        self.checkout_from(shard, true).await
    }

    /// A connection to whichever shard can give one now, for a statement that may run on any
    /// (it touches no table, or only prepares): the next shard in turn from `start` that is up,
    /// not paused and has a free connection, else the next that is up; a shard that fails is
    /// passed over for the next, so one bad shard never fails such a statement. Returns the
    /// shard it ran on too.
    pub async fn checkout_any(
        &self,
        start: usize,
    ) -> Result<(PooledConn, Duration, usize), Checkout> {
        let n = self.map.shards().len();
        let usable = |s: usize, free: bool| {
            self.health[s].is_up()
                && !(self.pauses.any() && self.pauses.is_paused(&self.shard_name(s)))
                && (!free || {
                    let status = self.pools().for_shard(s).status();
                    status.available > 0 || status.size < status.max_size
                })
        };
        let ring = (0..n).map(|i| (start + i) % n);
        let preferred = ring
            .clone()
            .find(|&s| usable(s, true))
            .or_else(|| ring.clone().find(|&s| usable(s, false)));
        // Then every shard in turn, in case what is known of their health is stale.
        let mut last = None;
        for shard in preferred
            .into_iter()
            .chain(ring.filter(|&s| Some(s) != preferred))
        {
            match self.checkout_from(shard, false).await {
                Ok((conn, waited)) => return Ok((conn, waited, shard)),
                Err(Checkout::MapChanged) => return Err(Checkout::MapChanged),
                Err(Checkout::Refused(e)) => last = Some(e),
            }
        }
        Err(Checkout::Refused(last.unwrap_or_else(|| {
            errors::internal("the shard map has no shards")
        })))
    }

    /// A connection to `shard`; with `hold`, a shard that cannot be reached is waited for
    /// (`[failover]`, [`hold`]).
    async fn checkout_from(
        &self,
        shard: usize,
        hold: bool,
    ) -> Result<(PooledConn, Duration), Checkout> {
        let mut paused = Duration::ZERO;
        loop {
            if self.pauses.any() {
                let asked = std::time::Instant::now();
                let timeout = self.config.pool.pause_timeout;
                match self.pauses.wait(&self.shard_name(shard), timeout).await {
                    Waited::Free => {}
                    Waited::Resumed if self.pauses.generation() != self.generation => {
                        // A reload while it waited (the move a pause is for): this routing's
                        // primary for the shard may be the old one.
                        return Err(Checkout::MapChanged);
                    }
                    Waited::Resumed => paused += asked.elapsed(),
                    Waited::TimedOut => {
                        return Err(Checkout::Refused(errors::shard_paused(
                            &self.shard_name(shard),
                            timeout,
                        )))
                    }
                    Waited::Closing => {
                        return Err(Checkout::Refused(errors::shutting_down_while_paused(
                            &self.shard_name(shard),
                        )))
                    }
                }
            }
            let pool = self.pools().for_shard(shard);
            let (conn, waited) = match pool.get_timed().await {
                Ok(got) => got,
                Err(CheckoutError::Exhausted { endpoint, waited }) => {
                    return Err(Checkout::Refused(errors::pool_exhausted(
                        &self.shard_name(shard),
                        &endpoint,
                        waited,
                    )))
                }
                Err(CheckoutError::Unreachable(e)) => {
                    self.health[shard].down(&pool.endpoint.name(), &e.to_string());
                    if !(hold && hold::passes(&e) && !self.config.failover.hold.is_zero()) {
                        return Err(Checkout::Refused(unreachable(&self.shard_name(shard), &e)));
                    }
                    let held = Hold {
                        shard: &self.shard_name(shard),
                        pool,
                        health: &self.health[shard],
                        pauses: &self.pauses,
                        generation: self.generation,
                        config: &self.config.failover,
                        counters: &self.failover,
                    }
                    .wait(e)
                    .await;
                    match held {
                        Ok(got) => got,
                        Err(HoldEnd::MapChanged) => return Err(Checkout::MapChanged),
                        Err(HoldEnd::Failed(err)) => return Err(Checkout::Refused(err)),
                    }
                }
            };
            if crate::backend::pool::opened_for_this(&conn) {
                // A connection opened just now: the primary answers (reusing an idle one says
                // nothing new about it).
                self.health[shard].up(|| pool.endpoint.name());
            }
            if self.pauses.any() && self.pauses.is_paused(&self.shard_name(shard)) {
                // Paused while this checkout waited for the pool: give the connection back and
                // wait like the others, so PAUSE never sees a transaction start after it.
                drop(conn);
                continue;
            }
            return Ok((conn, paused + waited));
        }
    }
}

/// The error for a shard that could not be reached (08001 when it refused the login, 08006
/// otherwise).
fn unreachable(shard: &str, e: &BackendError) -> SqlError {
    errors::shard_unreachable(
        shard,
        matches!(
            e,
            BackendError::Refused { .. }
                | BackendError::NoPassword { .. }
                | BackendError::Tls { .. }
        ),
        &e.to_string(),
    )
}
