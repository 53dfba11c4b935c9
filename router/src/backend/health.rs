//! Whether each primary answers, as the router last saw it: up when its last connection
//! attempt logged in, down (with the reason) when it failed. Kept per endpoint
//! (`host:port/database`) for the life of the process, so a reload that keeps an endpoint keeps
//! what is known of it.
//!
//! Checkouts report what they see (a load and no store while nothing changes, so the hot path
//! shares no written cache line); the server's prober (`crate::routing::probe`) tries the
//! endpoints nobody has reached yet and the ones that are down. `/ready`, `SHOW SHARDS` and the
//! `shard_up` metric read it.
//!
//! While a primary is down, statements held for it (`crate::routing::hold`) take turns trying
//! it: one attempt per endpoint per [`RETRY_INTERVAL`] for the whole router, and every held
//! statement wakes when one of them (or the prober) finds it up again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;

/// How often statements held for a down primary try to reach it (all of them together).
pub const RETRY_INTERVAL: Duration = Duration::from_millis(50);

/// One endpoint's health.
#[derive(Default)]
pub struct Health {
    up: AtomicBool,
    /// Has logged in at least once since the router started.
    answered: AtomicBool,
    last_error: Mutex<Option<(SystemTime, String)>>,
    /// Wakes the statements held for this primary when it is seen up again.
    back: Notify,
    /// Statements held for this primary now.
    held: AtomicUsize,
    /// When held statements may next try to connect (microseconds since [`epoch`]).
    next_try: AtomicU64,
}

/// A statement's place among those held for one primary; given back on drop.
pub struct HoldSlot<'h>(&'h Health);

impl Drop for HoldSlot<'_> {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The process's clock origin for [`Health::take_turn`].
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
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
        self.back.notify_waiters();
    }

    /// A place among the statements held for this primary, unless `max` are held already.
    pub fn enter_hold(&self, max: usize) -> Option<HoldSlot<'_>> {
        let mut now = self.held.load(Ordering::Relaxed);
        loop {
            if now >= max {
                return None;
            }
            match self.held.compare_exchange_weak(
                now,
                now + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(HoldSlot(self)),
                Err(actual) => now = actual,
            }
        }
    }

    /// Statements held for this primary now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Whether the caller may try to connect now: true for one caller per [`RETRY_INTERVAL`],
    /// so that a thousand held statements do not knock on a restarting server a thousand
    /// times at once.
    pub fn take_turn(&self) -> bool {
        let now = epoch().elapsed().as_micros() as u64;
        let next = self.next_try.load(Ordering::Relaxed);
        now >= next
            && self
                .next_try
                .compare_exchange(
                    next,
                    now + RETRY_INTERVAL.as_micros() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Completes when the primary is next seen up (create it before looking, so that a change
    /// in between is not missed).
    pub fn back(&self) -> tokio::sync::futures::Notified<'_> {
        self.back.notified()
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

    #[test]
    fn holds_are_bounded_and_given_back() {
        let h = Health::default();
        let a = h.enter_hold(2).expect("first");
        let b = h.enter_hold(2).expect("second");
        assert!(h.enter_hold(2).is_none(), "a third is over the bound");
        assert_eq!(h.held(), 2);
        drop(a);
        assert_eq!(h.held(), 1);
        assert!(h.enter_hold(2).is_some());
        drop(b);
    }

    #[test]
    fn one_attempt_per_interval() {
        let h = Health::default();
        assert!(h.take_turn(), "the first caller tries");
        assert!(!h.take_turn(), "the next one waits for the interval");
        std::thread::sleep(RETRY_INTERVAL + Duration::from_millis(5));
        assert!(h.take_turn());
    }
}
