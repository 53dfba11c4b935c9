//! The open-file limit, raised at start.
//!
//! Every client, every backend connection and every listening socket is a file descriptor.
//! Most systems start processes with a soft limit of 1,024, far below what a router serves
//! (`[limits] max_clients` defaults to 10,000), and past it `accept` fails with "Too many open
//! files" for everyone, logged-in clients' new backend connections included. The hard limit is
//! what the operator allows; the soft one is ours to raise up to it, as PgBouncer and Postgres
//! do, so the router does that once before it listens and logs what it got.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and logs both values (old -> new).
/// Failure is logged, never fatal: the router still serves, only fewer clients.
pub fn raise() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct that we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!("cannot read the open-file limit (RLIMIT_NOFILE): {e}");
        return;
    }
    let old = limit.rlim_cur;
    if old >= limit.rlim_max {
        tracing::info!(
            nofile = show(old),
            "open-file limit (RLIMIT_NOFILE) already at its hard limit"
        );
        return;
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads one rlimit struct that we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(
            nofile = show(old),
            "cannot raise the open-file limit (RLIMIT_NOFILE) to {}: {e}",
            show(limit.rlim_max)
        );
        return;
    }
    tracing::info!(
        "open-file limit (RLIMIT_NOFILE) raised: {} -> {}",
        show(old),
        show(limit.rlim_cur)
    );
}

fn show(v: libc::rlim_t) -> String {
    if v == libc::RLIM_INFINITY {
        "unlimited".to_string()
    } else {
        v.to_string()
    }
}
