//! A lane's wake-up: many sessions signal, one driver waits. Cheaper than tokio's `Notify`,
//! which serves many waiters and so takes its waiter list's lock on every wait that finds no
//! permit and on every wake of a waiting task: twice a statement on the shared path.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use futures_util::task::AtomicWaker;

/// A wake-up for one waiting task. A signal given while nobody waits is kept (one, however
/// many were given) for the next wait, like `Notify::notify_one`'s permit.
#[derive(Default)]
pub(super) struct Signal {
    set: AtomicBool,
    waker: AtomicWaker,
}

impl Signal {
    /// Wakes the waiting task, or the next one to wait.
    pub(super) fn notify(&self) {
        self.set.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Waits for a signal given since the last wait ended. Only one task waits at a time.
    pub(super) async fn wait(&self) {
        poll_fn(|cx| {
            if self.take() {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            // A signal given between the first look and the registration woke nobody.
            if self.take() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    fn take(&self) -> bool {
        self.set.load(Ordering::Relaxed) && self.set.swap(false, Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_signal_before_the_wait_is_kept_once() {
        let s = Signal::default();
        s.notify();
        s.notify();
        tokio::time::timeout(Duration::from_secs(5), s.wait())
            .await
            .expect("kept");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), s.wait())
                .await
                .is_err(),
            "two signals before one wait are one"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_signal_from_another_thread_wakes_the_waiter() {
        let s = Arc::new(Signal::default());
        for _ in 0..1000 {
            let t = s.clone();
            let waiter = tokio::spawn(async move { t.wait().await });
            tokio::task::yield_now().await;
            s.notify();
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("woken")
                .expect("joined");
        }
    }
}
