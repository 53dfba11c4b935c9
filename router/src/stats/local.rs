//! What one worker thread has counted since its last harvest: a thread-local log its sessions
//! append to without a lock, an atomic or a name lookup (a `Vec` push per request). The
//! worker folds it into the router's totals ([`super::Stats::fold`]) every second and
//! whenever someone reads them (a scrape, `SHOW STATS`), so what is read is exact.

use std::cell::RefCell;

use super::meter::{Event, Request};

/// Requests logged beyond this between two harvests are counted but not kept (a harvest runs
/// every second, so this takes a million requests a second on one thread).
const MAX_LOGGED: usize = 1 << 20;

#[derive(Debug, Default)]
pub struct Log {
    pub requests: Vec<Request>,
    /// SQLSTATE classes of the errors sent to clients.
    pub errors: Vec<[u8; 2]>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Requests that did not fit ([`MAX_LOGGED`]).
    pub dropped: u64,
}

impl Log {
    fn record(&mut self, event: Event) {
        match event {
            Event::Done(r) if self.requests.len() < MAX_LOGGED => self.requests.push(r),
            Event::Done(_) => self.dropped += 1,
            Event::Error(class) if self.errors.len() < MAX_LOGGED => self.errors.push(class),
            Event::Error(_) => self.dropped += 1,
        }
    }

    /// Forgets what has been folded, keeping the buffers' room.
    pub fn clear(&mut self) {
        self.requests.clear();
        self.errors.clear();
        self.bytes_in = 0;
        self.bytes_out = 0;
        self.dropped = 0;
    }
}

thread_local! {
    static LOG: RefCell<Log> = RefCell::new(Log::default());
}

/// Logs a request that ended or an error sent to a client.
pub fn record(event: Event) {
    LOG.with(|log| log.borrow_mut().record(event));
}

/// Counts bytes read from and written to a client that no request has counted (the end of
/// a session).
pub fn bytes((read, written): (u64, u64)) {
    LOG.with(|log| {
        let mut log = log.borrow_mut();
        log.bytes_in += read;
        log.bytes_out += written;
    });
}

/// Swaps this thread's log with `into` (an empty log whose room is reused next time).
pub fn take(into: &mut Log) {
    LOG.with(|log| std::mem::swap(&mut *log.borrow_mut(), into));
}
