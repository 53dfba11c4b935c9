//! The task that drives one lane's connection: writes what is queued in one write, reads,
//! hands the replies out, sends cancels when they are due, and ends the lane with its
//! connection.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;

use super::{now_us, Lane, Reply, ShardMux, Sink, CANCEL_CHECK};
use crate::backend::conn::BackendConn;
use crate::backend::stream::Outgoing;

/// How long a connection that broke is read for what it sent before.
const READ_REST: std::time::Duration = std::time::Duration::from_millis(200);

/// Runs one lane's connection until it ends or its mux is gone.
pub(super) async fn drive(mux: Weak<ShardMux>, lane: Arc<Lane>, mut conn: BackendConn) {
    let why = match run(&mux, &lane, &mut conn).await {
        Ok(()) => "the shared connection was retired".to_string(),
        Err(why) => why,
    };
    tracing::debug!(pid = lane.pid, "shared connection ends: {why}");
    lane.end(why, false);
    if let Some(mux) = mux.upgrade() {
        mux.remove(&lane);
    }
}

async fn run(mux: &Weak<ShardMux>, lane: &Arc<Lane>, conn: &mut BackendConn) -> Result<(), String> {
    let mut wbuf = BytesMut::with_capacity(16 * 1024);
    let mut written = 0;
    // Kept across polls like `written`: a TLS stream may take the bytes and flush later.
    let mut flushed = true;
    let mut cancels: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    // When the first request waiting in the router must be taken out ([`super::now_us`]):
    // the timer for it is set again only when that changes.
    let mut armed = None;
    // Kept between turns, so that a turn allocates nothing for its replies.
    let (mut runs, mut replies) = (Vec::new(), Vec::new());
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    loop {
        // The mux is looked at, not upgraded: an upgrade writes its count, a word the drivers
        // of every worker would pass between their caches on every turn. Its `Drop` wakes
        // the driver to see it gone.
        if mux.strong_count() == 0 {
            return Ok(());
        }
        // Nothing left to write: the turn fills the buffer again.
        let idle_writer = written == wbuf.len() && flushed;
        if idle_writer {
            wbuf.clear();
            written = 0;
        }
        let turn = lane.turn(idle_writer.then_some(&mut wbuf));
        if turn.done {
            return Ok(());
        }
        expired(turn.expired);
        if turn.until != armed {
            if let Some(u) = turn.until {
                let left = Duration::from_micros(u.saturating_sub(now_us()));
                timer.as_mut().reset(tokio::time::Instant::now() + left);
            }
            armed = turn.until;
        }
        if let Some(seq) = turn.cancel {
            let Some(m) = mux.upgrade() else {
                return Ok(());
            };
            cancels.retain(|c| !c.is_finished());
            cancels.push(send_cancel(&m, lane, conn, seq));
        }
        let cancel_waits = turn.cancel_waits;
        let io = std::future::poll_fn(|cx| {
            let mut out = Outgoing::new(&wbuf, written);
            out.flushed = flushed;
            // Always reading: a server that ends an idle connection is noticed at once.
            let r = conn
                .stream
                .poll_exchange(cx, &mut out, &mut conn.rbuf, true);
            written = out.written;
            flushed = out.flushed;
            r
        });
        // Timers only while something waits on one: most turns set up none.
        let broken = tokio::select! {
            biased;
            () = lane.wake.wait() => continue,
            r = io => r.err().map(|e| e.to_string()),
            _ = &mut timer, if armed.is_some() => {
                // The next turn takes out what waited too long; the timer is set again even
                // when the next wait ends at the same time.
                armed = None;
                continue;
            }
            () = cancel_check(), if cancel_waits => continue,
        };
        if broken.is_some() {
            // A server that ends its session with requests unread resets the connection, and
            // a write may see that first; what it sent before (a shutdown's FATAL, which says
            // that nothing behind the running request ran) is still there to read.
            read_rest(conn).await;
        }
        if mux.strong_count() == 0 {
            return Ok(());
        }
        let failure = lane.demux(mux, &mut conn.rbuf, &mut runs, &mut replies);
        for (sink, reply) in replies.drain(..) {
            let seq = match &reply {
                Reply::Frames(seq, _)
                | Reply::Lost { seq, .. }
                | Reply::Overflow(seq)
                | Reply::Refused(seq, _) => *seq,
                Reply::Expired(_) | Reply::CancelAsked => continue,
            };
            if !sink.deliver(reply) {
                // The client left: the rest of its replies are dropped.
                lane.forget_sink(seq);
            }
        }
        if let Some((why, shutdown)) = failure {
            lane.end(why.clone(), shutdown);
            return Err(why);
        }
        if let Some(why) = broken {
            return Err(why);
        }
    }
}

/// The wait before a driver with a cancel due looks again. Its timer is made when first
/// polled: the future of a disabled `select!` branch is still built, on every turn.
async fn cancel_check() {
    tokio::time::sleep(CANCEL_CHECK).await;
}

/// Tells the sessions whose requests waited too long.
fn expired(gone: Vec<(Sink, u64)>) {
    for (sink, seq) in gone {
        sink.deliver(Reply::Expired(seq));
    }
}

/// Sends the cancel of request `seq` (the one running) on its own connection, and tells the
/// lane once it is delivered.
fn send_cancel(
    m: &ShardMux,
    lane: &Arc<Lane>,
    conn: &BackendConn,
    seq: u64,
) -> tokio::task::JoinHandle<()> {
    let (host, port) = (m.endpoint.host.clone(), m.endpoint.port);
    let (pid, secret) = (conn.pid, conn.secret);
    let l = lane.clone();
    tokio::spawn(async move {
        if let Err(e) =
            crate::backend::cancel::send_cancel((host.as_str(), port), pid, secret).await
        {
            tracing::warn!(
                pid,
                "could not cancel a statement on a shared connection: {e}"
            );
        }
        l.cancel_delivered(seq);
    })
}

/// Reads what a broken connection still holds, until it ends (at once, for a reset one).
async fn read_rest(conn: &mut BackendConn) {
    let rest = async {
        while let Ok(n) = conn.stream.read_buf(&mut conn.rbuf).await {
            if n == 0 {
                break;
            }
        }
    };
    // A connection that broke on writing may still be open for reading a while.
    let _ = tokio::time::timeout(READ_REST, rest).await;
}
