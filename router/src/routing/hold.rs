//! Holding statements for a shard whose primary cannot be reached (`[failover]`): instead of
//! failing at once, a checkout that could not connect waits, up to `hold_ms`, until the
//! primary answers again or a reload names a new one, so that a restart or a failover shows
//! clients latency instead of errors (as Vitess's vtgate buffering and Neki's routers do).
//!
//! Only failures that pass are held: a refused or reset TCP connection, a connect timeout, a
//! login the server refused for now (57P01/57P02/57P03 while it shuts down or starts, 53300).
//! A wrong password or a missing database fails at once: waiting would not fix it. The held
//! statements of one primary take turns trying it ([`Health::take_turn`]) and all wake when
//! it is seen up; at most `hold_max_statements` are held per primary, more fail at once, so a
//! long outage cannot pile up unbounded work.

use std::time::{Duration, Instant};

use super::pause::Pauses;
use crate::backend::health::{Health, RETRY_INTERVAL};
use crate::backend::pool::{CheckoutError, PooledConn, ShardPool};
use crate::backend::BackendError;
use crate::config::Failover;
use crate::errors;
use crate::protocol::reply::SqlError;
use crate::stats::FailoverCounters;

/// How a hold ended, when it gave no connection.
pub enum HoldEnd {
    /// A reload replaced the shard map: route the statement again.
    MapChanged,
    Failed(SqlError),
}

/// Whether a failure to connect is worth waiting out.
pub fn passes(e: &BackendError) -> bool {
    match e {
        BackendError::Connect { .. }
        | BackendError::ConnectTimeout { .. }
        | BackendError::Io { .. } => true,
        BackendError::Refused { code, .. } => {
            matches!(code.as_str(), "57P01" | "57P02" | "57P03" | "53300") || code.starts_with("08")
        }
        BackendError::NoPassword { .. }
        | BackendError::Tls { .. }
        | BackendError::Protocol { .. } => false,
    }
}

/// One statement's wait for its shard.
pub struct Hold<'a> {
    pub shard: &'a str,
    pub pool: &'a ShardPool,
    pub health: &'a Health,
    pub pauses: &'a Pauses,
    /// The generation of the routing the statement was routed with.
    pub generation: u64,
    pub config: &'a Failover,
    pub counters: &'a FailoverCounters,
}

impl Hold<'_> {
    /// Waits for a connection after `first` failed. Returns it with the time waited, or why
    /// there is none.
    pub async fn wait(self, first: BackendError) -> Result<(PooledConn, Duration), HoldEnd> {
        let refused = |e: &BackendError, held| {
            errors::shard_unreachable_held(self.shard, &e.to_string(), held)
        };
        let Some(_slot) = self.health.enter_hold(self.config.hold_max_statements) else {
            self.counters.record(Duration::ZERO, false);
            return Err(HoldEnd::Failed(refused(
                &first,
                Err(self.config.hold_max_statements),
            )));
        };
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.config.hold;
        let mut changes = self.pauses.watch();
        let mut last = first;
        loop {
            if self.pauses.generation() != self.generation {
                self.counters.record(started.elapsed(), true);
                return Err(HoldEnd::MapChanged);
            }
            if self.pauses.closing() || tokio::time::Instant::now() >= deadline {
                self.counters.record(started.elapsed(), false);
                return Err(HoldEnd::Failed(refused(&last, Ok(started.elapsed()))));
            }
            // Armed before looking, so that the primary coming up in between is not missed.
            let back = self.health.back();
            if self.health.is_up() || self.health.take_turn() {
                match self.pool.get_timed().await {
                    Ok((conn, _)) => {
                        self.health.up(|| self.pool.endpoint.name());
                        let waited = started.elapsed();
                        self.counters.record(waited, true);
                        return Ok((conn, waited));
                    }
                    Err(CheckoutError::Unreachable(e)) => {
                        self.health.down(&self.pool.endpoint.name(), &e.to_string());
                        if !passes(&e) {
                            self.counters.record(started.elapsed(), false);
                            return Err(HoldEnd::Failed(refused(&e, Ok(started.elapsed()))));
                        }
                        last = e;
                    }
                    Err(CheckoutError::Exhausted { endpoint, waited }) => {
                        self.counters.record(started.elapsed(), false);
                        return Err(HoldEnd::Failed(errors::pool_exhausted(
                            self.shard, &endpoint, waited,
                        )));
                    }
                }
            }
            let tick = tokio::time::Instant::now() + RETRY_INTERVAL;
            tokio::select! {
                _ = back => {}
                _ = changes.changed() => {}
                _ = tokio::time::sleep_until(tick.min(deadline)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: &str) -> BackendError {
        BackendError::Refused {
            endpoint: "db:5432/app".into(),
            code: code.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn only_passing_failures_are_held() {
        let io = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(passes(&BackendError::Connect {
            endpoint: "e".into(),
            source: io()
        }));
        assert!(passes(&BackendError::ConnectTimeout {
            endpoint: "e".into(),
            timeout: Duration::from_secs(1)
        }));
        for code in ["57P01", "57P02", "57P03", "53300", "08006"] {
            assert!(passes(&refused(code)), "{code}");
        }
        for code in ["28P01", "3D000", "28000"] {
            assert!(!passes(&refused(code)), "{code}: waiting would not fix it");
        }
        assert!(!passes(&BackendError::NoPassword {
            endpoint: "e".into()
        }));
    }
}
