//! The client's side of a session: its socket (any `AsyncRead + AsyncWrite`, so a session also
//! runs over an in-memory pipe in tests), the bytes read from it and not yet handled, the
//! bytes owed to it, and the meter that sees every byte go out (`crate::stats::meter`).
//!
//! A message longer than the session's `limits.max_message_bytes` is refused from its header,
//! before its body is read. A long message that is allowed is read into one buffer of exactly
//! its size (not grown by doubling), and buffers that grew for it are given back after it
//! ([`ClientIo::trim`]), so one big statement does not stay resident for the session's life.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use crate::multishard::client::ClientError;
use crate::protocol::frame::{frames, next_frame};
use crate::stats::{local, meter::Meter};

/// Answers are flushed to the client once this much is buffered (a big read streams).
pub const FLUSH_AT: usize = 64 * 1024;

/// Buffers that grew beyond this for one long message are shrunk back once it is handled.
pub const KEEP_AT_REST: usize = 256 * 1024;

pub struct ClientIo<S> {
    stream: S,
    /// Bytes from the client not yet handled.
    pub rbuf: BytesMut,
    /// Bytes for the client not yet written.
    pub out: Vec<u8>,
    /// The client's requests: which are open, how each was routed.
    pub meter: Meter,
    /// The longest message accepted (`limits.max_message_bytes`).
    pub max_message: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> ClientIo<S> {
    /// `rbuf` may already hold what the client sent after its login.
    pub fn new(stream: S, rbuf: BytesMut) -> ClientIo<S> {
        ClientIo {
            stream,
            rbuf,
            // Grown by the first replies to what this client's answers need: an idle client of
            // a reconnect storm's 10,000 holds no 16 KiB it never used.
            out: Vec::new(),
            meter: Meter::default(),
            max_message: crate::protocol::MAX_MESSAGE_LEN,
        }
    }

    /// The length (tag included) of the message at the front of `rbuf`, once its header is in
    /// (a negative length is left to [`next_frame`] to refuse as a protocol violation).
    fn announced(&self) -> Option<usize> {
        let b = self.rbuf.get(..5)?;
        let len = i32::from_be_bytes([b[1], b[2], b[3], b[4]]);
        usize::try_from(len).ok().map(|len| len + 1)
    }

    /// The next whole message the client sent, if it has arrived.
    pub fn next_frame(&mut self) -> Result<Option<BytesMut>, ClientError> {
        if let Some(total) = self.announced() {
            if total > self.max_message {
                return Err(ClientError::TooLong {
                    len: total,
                    limit: self.max_message,
                });
            }
        }
        let h = next_frame(&self.rbuf).map_err(ClientError::Protocol)?;
        Ok(h.map(|h| self.rbuf.split_to(h.total)))
    }

    /// Reads what the client sent next; `false` when it closed the connection.
    pub async fn fill(&mut self) -> std::io::Result<bool> {
        match self.announced() {
            // A long message: room for exactly the rest of it, in one allocation.
            Some(total) if total > self.rbuf.capacity() && total <= self.max_message => {
                self.rbuf.reserve(total - self.rbuf.len());
            }
            _ if self.rbuf.capacity() - self.rbuf.len() < 4096 => self.rbuf.reserve(16 * 1024),
            _ => {}
        }
        let n = self.stream.read_buf(&mut self.rbuf).await?;
        self.meter.read(n);
        Ok(n > 0)
    }

    /// The next whole message, reading until it has arrived; `None` when the client left.
    pub async fn read_frame(&mut self) -> Result<Option<BytesMut>, ClientError> {
        loop {
            if let Some(frame) = self.next_frame()? {
                return Ok(Some(frame));
            }
            if !self.fill().await.map_err(ClientError::Io)? {
                return Ok(None);
            }
        }
    }

    /// Writes what is owed to the client.
    pub async fn flush(&mut self) -> std::io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        if tracing::enabled!(tracing::Level::TRACE) {
            let tags: String = frames(&self.out)
                .map_while(Result::ok)
                .map(|f| f[0] as char)
                .collect();
            tracing::trace!(%tags, "to client");
        }
        self.meter
            .sent(&self.out, std::time::Instant::now, local::record);
        self.stream.write_all(&self.out).await?;
        // A TLS stream may hold its last record back until flushed (plain TCP: no-op).
        self.stream.flush().await?;
        self.out.clear();
        Ok(())
    }

    /// The stream, for a session over something other than a socket (a cursor's kept answer).
    pub fn into_stream(mut self) -> S
    where
        S: Default,
    {
        std::mem::take(&mut self.stream)
    }

    /// Reads and drops the rest of a message refused as too long, at most `within`, so that
    /// the client, still writing it, gets to read the error instead of a reset connection.
    /// Nothing of it is held: it goes through a small buffer.
    pub async fn discard_refused(&mut self, within: std::time::Duration) {
        let Some(total) = self.announced() else {
            return;
        };
        let mut left = total.saturating_sub(self.rbuf.len());
        self.rbuf = BytesMut::new();
        let mut scratch = [0u8; 16 * 1024];
        let drain = async {
            while left > 0 {
                match self.stream.read(&mut scratch).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        };
        let _ = tokio::time::timeout(within, drain).await;
    }

    /// Gives back what the buffers grew to for a long message, once it is handled (a few
    /// comparisons when nothing grew).
    pub fn trim(&mut self) {
        if self.rbuf.capacity() > KEEP_AT_REST && self.rbuf.len() < KEEP_AT_REST / 4 {
            let mut fresh = BytesMut::with_capacity(16 * 1024);
            fresh.extend_from_slice(&self.rbuf);
            self.rbuf = fresh;
        }
        if self.out.capacity() > KEEP_AT_REST && self.out.is_empty() {
            self.out = Vec::new();
        }
    }

    /// Flushes once enough is buffered, so that a long answer streams to the client.
    pub async fn flush_if_full(&mut self) -> std::io::Result<()> {
        if self.out.len() >= FLUSH_AT {
            self.flush().await?;
        }
        Ok(())
    }
}

impl<S> Drop for ClientIo<S> {
    /// Bytes after the last request (a Terminate, a last error) are counted too.
    fn drop(&mut self) {
        local::bytes(self.meter.take_bytes());
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> crate::multishard::client::Client for ClientIo<S> {
    fn out(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        ClientIo::flush(self).await
    }

    async fn flush_if_full(&mut self) -> std::io::Result<()> {
        ClientIo::flush_if_full(self).await
    }

    async fn read_frame(&mut self) -> Result<Option<BytesMut>, ClientError> {
        ClientIo::read_frame(self).await
    }

    fn max_message(&self) -> usize {
        self.max_message
    }
}
