//! Paused shards (the admin console's `PAUSE [shard]` / `RESUME [shard]`): a checkout for a
//! paused shard waits until it is resumed, up to `[pool] pause_timeout_ms`, while connections
//! already held (transactions in progress) carry on. The building block for moving a shard's
//! primary: pause, wait for its transactions to finish, switch the map, resume.
//!
//! Kept by shard range, for the life of the process: a reload that keeps a range keeps it
//! paused. While nothing is paused a checkout reads one atomic flag.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

#[derive(Default)]
pub struct Pauses {
    /// Something is paused (the only thing a checkout reads otherwise).
    any: AtomicBool,
    /// The router is closing for a drain: waiting checkouts give up (their statements never
    /// started, so the client can be told 57P01).
    closing: AtomicBool,
    /// The generation of the current routing: a statement that waited through a reload must
    /// be routed again with the new shard map.
    generation: AtomicU64,
    state: Mutex<Paused>,
    /// Bumped on every change, for waiting checkouts.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct Paused {
    all: bool,
    ranges: HashSet<String>,
    /// Checkouts waiting, by range.
    waiting: HashMap<String, usize>,
}

impl Pauses {
    fn update(&self, f: impl FnOnce(&mut Paused)) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut state);
        self.any
            .store(state.all || !state.ranges.is_empty(), Ordering::Release);
        drop(state);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Pauses the shard owning `range`, or every shard.
    pub fn pause(&self, range: Option<&str>) {
        self.update(|p| match range {
            Some(r) => {
                p.ranges.insert(r.to_string());
            }
            None => p.all = true,
        });
    }

    /// Resumes the shard owning `range`, or every shard (also those paused one by one).
    pub fn resume(&self, range: Option<&str>) {
        self.update(|p| match range {
            Some(r) => {
                p.ranges.remove(r);
            }
            None => {
                p.all = false;
                p.ranges.clear();
            }
        });
    }

    /// Whether any shard is paused (one atomic load: what a checkout reads first).
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    pub fn is_paused(&self, range: &str) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.all || state.ranges.contains(range)
    }

    /// Whether every shard is paused, and the ranges paused one by one.
    pub fn paused(&self) -> (bool, Vec<String>) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut ranges: Vec<String> = state.ranges.iter().cloned().collect();
        ranges.sort();
        (state.all, ranges)
    }

    /// Checkouts waiting for the shard owning `range`.
    pub fn waiting(&self, range: &str) -> usize {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.waiting.get(range).copied().unwrap_or(0)
    }

    fn count_waiting(&self, range: &str, up: bool) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let n = state.waiting.entry(range.to_string()).or_default();
        if up {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
    }

    /// A reload made routing `generation` current.
    pub fn set_generation(&self, generation: u64) {
        self.generation.store(generation, Ordering::Release);
        self.changed.send_modify(|n| *n += 1);
    }

    /// The generation of the current routing, as the last reload set it (0 before any).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The router closes for a drain: every waiting checkout gives up.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Changes whenever a pause, a resume, a reload or the drain happens.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Whether the router closes for a drain.
    pub fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Waits while the shard owning `range` is paused, at most `timeout`.
    pub async fn wait(&self, range: &str, timeout: Duration) -> Waited {
        if !self.is_paused(range) {
            return Waited::Free;
        }
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        self.count_waiting(range, true);
        let waited = loop {
            if self.closing.load(Ordering::Acquire) {
                break Waited::Closing;
            }
            if !self.is_paused(range) {
                break Waited::Resumed;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                // Timed out (the sender lives as long as `self`).
                _ if !self.is_paused(range) => break Waited::Resumed,
                _ => break Waited::TimedOut,
            }
        };
        self.count_waiting(range, false);
        waited
    }
}

/// How a wait for a paused shard ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// The shard was not paused: nothing waited.
    Free,
    Resumed,
    TimedOut,
    /// The router closes for a drain.
    Closing,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_paused_shard_waits_until_resumed() {
        let pauses = std::sync::Arc::new(Pauses::default());
        assert_eq!(pauses.wait("-80", Duration::ZERO).await, Waited::Free);
        pauses.pause(Some("-80"));
        assert!(pauses.is_paused("-80") && !pauses.is_paused("80-"));
        assert_eq!(
            pauses.wait("-80", Duration::from_millis(20)).await,
            Waited::TimedOut
        );
        assert!(pauses.any());
        assert_eq!(pauses.wait("80-", Duration::ZERO).await, Waited::Free);
        let waiting = {
            let pauses = pauses.clone();
            tokio::spawn(async move { pauses.wait("-80", Duration::from_secs(30)).await })
        };
        while pauses.waiting("-80") == 0 {
            tokio::task::yield_now().await;
        }
        pauses.resume(Some("-80"));
        assert_eq!(waiting.await.unwrap(), Waited::Resumed);
        pauses.pause(None);
        assert!(pauses.is_paused("80-"));
        assert_eq!(pauses.paused(), (true, vec![]));
        pauses.resume(None);
        assert!(!pauses.is_paused("80-"));
        // A drain ends every wait.
        pauses.pause(None);
        let waiting = {
            let pauses = pauses.clone();
            tokio::spawn(async move { pauses.wait("-80", Duration::from_secs(30)).await })
        };
        while pauses.waiting("-80") == 0 {
            tokio::task::yield_now().await;
        }
        pauses.close();
        assert_eq!(waiting.await.unwrap(), Waited::Closing);
    }
}
