//! The memory budget of merged reads across shards: the bytes one read holds while it combines
//! the shards' answers (`limits.max_merge_bytes`) and the bytes all reads in progress hold
//! together (`limits.merge_memory_bytes`), so that neither one large read nor many at once can
//! take the router's memory. Past either, the read ends with `54000` naming the limit.
//!
//! The router-wide sum is one atomic counter; a read's [`Budget`] gives its bytes back when it
//! is dropped, however the read ends (done, error, client gone).

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::errors;
use crate::protocol::reply::SqlError;

/// Bytes held by every merged read in progress, router-wide.
static IN_USE: AtomicUsize = AtomicUsize::new(0);

/// The bytes all merged reads hold now (for tests and the admin console).
pub fn in_use() -> usize {
    IN_USE.load(Ordering::Relaxed)
}

/// One read's share of the budget.
pub struct Budget {
    held: usize,
    per_read: usize,
    router_wide: usize,
}

impl Budget {
    /// A read that may hold `per_read` bytes, while all reads may hold `router_wide`.
    pub fn new(per_read: usize, router_wide: usize) -> Budget {
        Budget {
            held: 0,
            per_read,
            router_wide,
        }
    }

    /// Records that the read now holds `bytes`; an error when that passes either limit (the
    /// read then keeps what it held before, and gives it back on drop).
    pub fn hold(&mut self, bytes: usize) -> Result<(), SqlError> {
        if bytes <= self.held {
            IN_USE.fetch_sub(self.held - bytes, Ordering::Relaxed);
            self.held = bytes;
            return Ok(());
        }
        if bytes > self.per_read {
            return Err(errors::merge_memory(
                "limits.max_merge_bytes",
                self.per_read,
            ));
        }
        let more = bytes - self.held;
        let before = IN_USE.fetch_add(more, Ordering::Relaxed);
        if before.saturating_add(more) > self.router_wide {
            IN_USE.fetch_sub(more, Ordering::Relaxed);
            return Err(errors::merge_memory(
                "limits.merge_memory_bytes",
                self.router_wide,
            ));
        }
        self.held = bytes;
        Ok(())
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        IN_USE.fetch_sub(self.held, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test touches the router-wide counter, so that parallel tests cannot race on it.
    #[test]
    fn limits_per_read_and_router_wide_and_release_on_drop() {
        let base = in_use();
        let mut a = Budget::new(1000, 1500);
        a.hold(800).unwrap();
        let err = a.hold(1001).unwrap_err();
        assert!(
            err.message.contains("limits.max_merge_bytes"),
            "{}",
            err.message
        );
        let mut b = Budget::new(1000, 1500);
        let err = b.hold(800).unwrap_err();
        assert!(
            err.message.contains("limits.merge_memory_bytes"),
            "{}",
            err.message
        );
        assert_eq!(in_use(), base + 800);
        b.hold(600).unwrap();
        a.hold(100).unwrap();
        assert_eq!(in_use(), base + 700);
        drop(a);
        drop(b);
        assert_eq!(in_use(), base);
    }
}
