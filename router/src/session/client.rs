//! The client's side of a session: its socket (any `AsyncRead + AsyncWrite`, so a session also
//! runs over an in-memory pipe in tests), the bytes read from it and not yet handled, the
//! bytes owed to it, and the meter that sees every byte go out (`crate::stats::meter`).

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::protocol::frame::{frames, next_frame};
use crate::protocol::FrameError;
use crate::stats::{local, meter::Meter};

/// Answers are flushed to the client once this much is buffered (a big read streams).
pub const FLUSH_AT: usize = 64 * 1024;

pub struct ClientIo<S> {
    stream: S,
    /// Bytes from the client not yet handled.
    pub rbuf: BytesMut,
    /// Bytes for the client not yet written.
    pub out: Vec<u8>,
    /// The client's requests: which are open, how each was routed.
    pub meter: Meter,
}

impl<S: AsyncRead + AsyncWrite + Unpin> ClientIo<S> {
    /// `rbuf` may already hold what the client sent after its login.
    pub fn new(stream: S, rbuf: BytesMut) -> ClientIo<S> {
        ClientIo {
            stream,
            rbuf,
            out: Vec::with_capacity(16 * 1024),
            meter: Meter::default(),
        }
    }

    /// The next whole message the client sent, if it has arrived.
    pub fn next_frame(&mut self) -> Result<Option<BytesMut>, FrameError> {
        Ok(next_frame(&self.rbuf)?.map(|h| self.rbuf.split_to(h.total)))
    }

    /// Reads what the client sent next; `false` when it closed the connection.
    pub async fn fill(&mut self) -> std::io::Result<bool> {
        if self.rbuf.capacity() - self.rbuf.len() < 4096 {
            self.rbuf.reserve(16 * 1024);
        }
        let n = self.stream.read_buf(&mut self.rbuf).await?;
        self.meter.read(n);
        Ok(n > 0)
    }

    /// The next whole message, reading until it has arrived; `None` when the client left.
    pub async fn read_frame(&mut self) -> Result<Option<BytesMut>, ClientError> {
        loop {
            if let Some(frame) = self.next_frame().map_err(ClientError::Protocol)? {
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

/// Why reading from the client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("client connection: {0}")]
    Io(std::io::Error),
    #[error("{0}")]
    Protocol(FrameError),
}
