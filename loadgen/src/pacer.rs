//! Waiting until a request's intended send time, to within microseconds.
//!
//! tokio's timers tick in whole milliseconds and round every deadline up to the next tick, so a
//! lane that slept with `tokio::time::sleep_until` sent its request 0–2 ms late; at low open-loop
//! rates that lag was most of the latency loadgen reported. A [`Pacer`] is one Linux timerfd
//! per lane, registered with tokio's reactor: the kernel's high-resolution timer makes the fd
//! readable at the deadline and epoll wakes the worker that polls the lane, with no timer slack
//! and no extra thread. Costs one `timerfd_settime` and one `read` per wait; a wait for a time
//! already past costs nothing.
//!
//! What lag remains is measured, not assumed: `run` records every request's send time minus its
//! intended time (the report's `send_lag_us`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

/// One lane's high-resolution timer.
pub struct Pacer {
    fd: AsyncFd<OwnedFd>,
}

impl Pacer {
    /// A disarmed timer on the monotonic clock (the clock `Instant` reads). Must be called
    /// inside the tokio runtime.
    pub fn new() -> io::Result<Pacer> {
        // SAFETY: timerfd_create takes no pointers; the result is checked before use.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the OwnedFd moves into the AsyncFd, so the descriptor stays open and the
        // same for as long as the AsyncFd lives.
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }?;
        Ok(Pacer { fd })
    }

    /// Returns at `deadline` (at once if it has passed). Cancel-safe: dropping the future
    /// leaves the timer armed, and the next wait re-arms it and ignores a stale expiry.
    pub async fn sleep_until(&self, deadline: Instant) -> io::Result<()> {
        loop {
            let now = Instant::now();
            if deadline <= now {
                return Ok(());
            }
            self.arm(deadline - now)?;
            let mut ready = self.fd.readable().await?;
            match ready.try_io(|fd| read_expirations(fd.get_ref())) {
                // Read: the fd is not readable until the next expiry, and the next wait must
                // not find it "ready" from this one.
                Ok(Ok(_)) => ready.clear_ready(),
                // Readiness was stale (an earlier, abandoned wait): wait again.
                Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }

    /// One-shot expiry `after` from now (relative: `Instant` does not expose its raw clock
    /// value, and the few nanoseconds between reading it and arming do not matter).
    fn arm(&self, after: Duration) -> io::Result<()> {
        // A zero it_value would disarm the timer instead of firing it.
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec for the call's duration; the old value is not
        // asked for (null).
        let rc = unsafe {
            libc::timerfd_settime(
                self.fd.get_ref().as_raw_fd(),
                0,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Reads (and so clears) the expiry count.
fn read_expirations(fd: &OwnedFd) -> io::Result<u64> {
    let mut buf = [0u8; 8];
    // SAFETY: `buf` is 8 writable bytes, which is what a timerfd read needs.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_until_the_deadline_and_not_before() {
        let pacer = Pacer::new().expect("timerfd");
        for us in [50u64, 300, 2_500] {
            let deadline = Instant::now() + Duration::from_micros(us);
            pacer.sleep_until(deadline).await.expect("sleep");
            assert!(Instant::now() >= deadline, "woke before {us} µs");
        }
        // A deadline in the past returns at once, without arming.
        pacer
            .sleep_until(Instant::now() - Duration::from_millis(1))
            .await
            .expect("past");
    }

    #[tokio::test]
    async fn an_abandoned_wait_does_not_end_the_next_one_early() {
        let pacer = Pacer::new().expect("timerfd");
        let short = Instant::now() + Duration::from_micros(100);
        // Abandon a wait whose expiry then fires unread.
        let _ = tokio::time::timeout(Duration::ZERO, pacer.sleep_until(short)).await;
        std::thread::sleep(Duration::from_millis(1));
        let deadline = Instant::now() + Duration::from_millis(3);
        pacer.sleep_until(deadline).await.expect("sleep");
        assert!(Instant::now() >= deadline);
    }
}
