//! Whether each primary answers, as the router last saw it: up when its last connection
//! attempt logged in, down (with the reason) when it failed. Kept per endpoint
//! (`host:port/database`) for the life of the process, so a reload that keeps an endpoint keeps
//! what is known of it.
//!
//! Checkouts report what they see (a load and no store while nothing changes, so the hot path
//! shares no written cache line); the server's prober (`crate::server::probe`) tries the
//! endpoints nobody has reached yet and the ones that are down. `/ready`, `SHOW SHARDS` and the
//! `shard_up` metric read it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// One endpoint's health.
#[derive(Default)]
pub struct Health {
    up: AtomicBool,
    /// Has logged in at least once since the router started.
    answered: AtomicBool,
    last_error: Mutex<Option<(SystemTime, String)>>,
}

impl Health {
    /// A connection to the endpoint (named by `endpoint`, called only to log a change) was
    /// had. One load while it was up already: every checkout calls this.
    pub fn up(&self, endpoint: impl FnOnce() -> String) {
        if self.up.load(Ordering::Relaxed) {
            return;
        }
        let was_answered = self.answered.swap(true, Ordering::Relaxed);
        if !self.up.swap(true, Ordering::Relaxed) && was_answered {
            tracing::info!(endpoint = %endpoint(), "primary is reachable again");
        }
    }

    /// Connecting or logging in to the endpoint failed.
    pub fn down(&self, endpoint: &str, why: &str) {
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(%endpoint, "primary is down: {why}");
        }
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((SystemTime::now(), why.to_string()));
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub fn answered(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }

    /// The last failure, and when it happened.
    pub fn last_error(&self) -> Option<(SystemTime, String)> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Every endpoint's health, by `host:port/database`.
#[derive(Default)]
pub struct HealthBoard {
    by_endpoint: Mutex<HashMap<String, Arc<Health>>>,
}

impl HealthBoard {
    /// The health of `endpoint` (created unknown: neither up nor answered).
    pub fn of(&self, endpoint: &str) -> Arc<Health> {
        self.by_endpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(endpoint.to_string())
            .or_default()
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_down_and_back() {
        let board = HealthBoard::default();
        let h = board.of("db:5432/app");
        assert!(!h.is_up() && !h.answered());
        h.down("db:5432/app", "refused");
        assert!(!h.is_up() && !h.answered());
        assert_eq!(h.last_error().map(|(_, why)| why), Some("refused".into()));
        h.up(|| "db:5432/app".into());
        assert!(h.is_up() && h.answered());
        assert!(Arc::ptr_eq(&h, &board.of("db:5432/app")));
        h.down("db:5432/app", "gone");
        assert!(!h.is_up() && h.answered());
    }
}
