//! Where the router is in its life ([`Phase`]): serving, draining, closing. Sessions look at
//! it before every statement (one atomic load) and end at rest once it closes; the server's
//! `lifecycle` moves it on (signals, the admin `SHUTDOWN`), and `/ready` reads it.

use std::sync::atomic::{AtomicU8, Ordering};

use tokio::sync::watch;

/// Where the router is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Serving,
    /// Ready says no; everything else serves.
    Draining,
    /// Listeners closed; sessions end when at rest.
    Closing,
}

/// The current phase, for every task to watch.
pub struct Lifecycle {
    tx: watch::Sender<Phase>,
    /// The phase as a number too: sessions look at it before every statement, and an atomic
    /// load shares no lock between the workers (reading the watch channel takes its lock).
    now: AtomicU8,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            tx: watch::Sender::new(Phase::Serving),
            now: AtomicU8::new(Phase::Serving as u8),
        }
    }
}

impl Lifecycle {
    pub fn phase(&self) -> Phase {
        *self.tx.borrow()
    }

    /// Whether the listeners have closed for a drain (one atomic load).
    pub fn closing(&self) -> bool {
        self.now.load(Ordering::Acquire) == Phase::Closing as u8
    }

    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.tx.subscribe()
    }

    /// Moves on to `phase` (never back).
    pub fn advance(&self, phase: Phase) {
        self.tx.send_if_modified(|p| {
            let later = (*p as u8) < (phase as u8);
            if later {
                *p = phase;
                self.now.store(phase as u8, Ordering::Release);
            }
            later
        });
    }
}
