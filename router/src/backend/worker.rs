//! Which worker thread this is. Each worker runs its own event loop with its own pools and
//! shared connections: a connection's I/O never leaves the thread that opened it, so a
//! statement never wakes another thread.

thread_local! {
    /// Which worker thread this is (0 outside workers).
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks the calling thread as worker `index` (its sessions use that worker's pools).
pub fn set_worker(index: usize) {
    WORKER.with(|w| w.set(index));
}

/// The worker thread this is.
pub fn worker() -> usize {
    WORKER.with(|w| w.get())
}
