//! Where a lane hands a session its replies: a channel that never makes the lane wait, with
//! the bytes the session has not taken yet counted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::Reply;

/// Where a session receives its replies. Sending never waits: a lane must not stop for a
/// client that reads slowly. What a session has not taken yet is counted instead, and a request
/// whose replies pile up past [`UNREAD_LIMIT`] is failed alone ([`Reply::Overflow`]).
#[derive(Clone, Debug)]
pub struct Sink {
    tx: mpsc::UnboundedSender<Reply>,
    unread: Arc<AtomicUsize>,
}

/// The session's end of a [`Sink`].
#[derive(Debug)]
pub struct Inbox {
    rx: mpsc::UnboundedReceiver<Reply>,
    unread: Arc<AtomicUsize>,
}

/// A session's channel for the replies of its shared requests (made at the first): the
/// [`Sink`] each request hands its lane, and the session's [`Inbox`].
#[derive(Debug)]
pub struct Channel {
    pub tx: Sink,
    pub rx: Inbox,
}

impl Default for Channel {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let unread = Arc::new(AtomicUsize::new(0));
        Channel {
            tx: Sink {
                tx,
                unread: unread.clone(),
            },
            rx: Inbox { rx, unread },
        }
    }
}

impl Sink {
    /// Hands `reply` over; false when the session is gone, or when frames would pile up past
    /// [`UNREAD_LIMIT`] (then the session is told so instead).
    pub(super) fn deliver(&self, reply: Reply) -> bool {
        if let Reply::Frames(seq, frames) = &reply {
            let len = frames.len();
            if self.unread.fetch_add(len, Ordering::AcqRel) + len > UNREAD_LIMIT {
                self.unread.fetch_sub(len, Ordering::AcqRel);
                let _ = self.tx.send(Reply::Overflow(*seq));
                return false;
            }
        }
        self.tx.send(reply).is_ok()
    }

    /// Wakes the session for a cancel request ([`Reply::CancelAsked`]).
    pub fn cancel_asked(&self) {
        let _ = self.tx.send(Reply::CancelAsked);
    }
}

impl Inbox {
    pub async fn recv(&mut self) -> Option<Reply> {
        let reply = self.rx.recv().await?;
        if let Reply::Frames(_, frames) = &reply {
            self.unread.fetch_sub(frames.len(), Ordering::AcqRel);
        }
        Some(reply)
    }
}

/// Reply bytes a shared request may have waiting for its client: a client that reads a large
/// result slower than Postgres sends it is failed (`54000`) rather than let the lane stop for
/// everyone behind it, or the router hold the result.
pub const UNREAD_LIMIT: usize = 16 << 20;
