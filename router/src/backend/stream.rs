//! The byte stream of a backend connection: plain TCP, or TLS over it when `[backend] sslmode`
//! asks for it ([`BackendStream::open`] negotiates with the server's SSLRequest). An enum,
//! not a boxed trait object: the plaintext path costs one branch per read or write, no
//! allocation and no extra system call.
//!
//! [`BackendStream::poll_exchange`] is the one step of an exchange that writes a request and
//! reads its replies at the same time on the same stream (a TLS stream cannot be split into
//! halves that a `select!` could poll separately).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::tls::BackendTls;

pub enum BackendStream {
    Plain(TcpStream),
    /// Boxed: a TLS session is a few kilobytes, and most routers run without it.
    Tls(Box<TlsStream<TcpStream>>),
}

/// What `sslmode` asked for and the server would not give.
#[derive(Debug, thiserror::Error)]
pub enum TlsFailure {
    #[error("the server does not accept TLS (it answered the SSLRequest with {0:?}); [backend] sslmode = \"{1}\" needs TLS on the shards (ssl = on)")]
    Refused(char, &'static str),
    #[error("host name {0:?} cannot be checked against a certificate: {1}")]
    BadName(String, String),
    #[error("TLS handshake failed: {0}")]
    Handshake(io::Error),
    #[error("{0}")]
    Io(io::Error),
}

/// SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

impl BackendStream {
    /// The connection to `host` over `tcp`, encrypted when `tls` says so: an SSLRequest, then
    /// the TLS handshake when the server answers `S`. A server that answers anything else is an
    /// error (the router never falls back to plain TCP when TLS was asked for).
    pub async fn open(
        mut tcp: TcpStream,
        tls: &BackendTls,
        host: &str,
    ) -> Result<BackendStream, TlsFailure> {
        let Some(config) = tls.client_config() else {
            return Ok(BackendStream::Plain(tcp));
        };
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| TlsFailure::BadName(host.to_string(), e.to_string()))?;
        tcp.write_all(&SSL_REQUEST).await.map_err(TlsFailure::Io)?;
        // Exactly one byte: anything after it belongs to the TLS handshake.
        let mut answer = [0u8; 1];
        tcp.read_exact(&mut answer).await.map_err(TlsFailure::Io)?;
        if answer[0] != b'S' {
            return Err(TlsFailure::Refused(char::from(answer[0]), tls.mode.name()));
        }
        let stream = TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
            .map_err(TlsFailure::Handshake)?;
        Ok(BackendStream::Tls(Box::new(stream)))
    }

    /// Writes without waiting, as much as the socket takes now; a TLS stream always says
    /// `WouldBlock` (its records are written by the async path, which also flushes them).
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            BackendStream::Plain(s) => s.try_write(buf),
            BackendStream::Tls(_) => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Writes all of `buf` and flushes it (a TLS stream may hold records back until then).
    pub async fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        self.write_all(buf).await?;
        self.flush().await
    }

    /// Writes `head` (the router's own messages: settings, a BEGIN) and then `body` (the
    /// client's request, shared by every shard it goes to) and flushes. A short body is copied
    /// behind the head, for one write; a long one goes out from where it is, so that a request
    /// for many shards is not copied once per shard.
    pub async fn send_parts(&mut self, head: &[u8], body: &[u8]) -> io::Result<()> {
        if head.is_empty() {
            return self.send(body).await;
        }
        if body.len() <= crate::protocol::LONG {
            let mut out = Vec::with_capacity(head.len() + body.len());
            out.extend_from_slice(head);
            out.extend_from_slice(body);
            return self.send(&out).await;
        }
        self.write_all(head).await?;
        self.write_all(body).await?;
        self.flush().await
    }

    /// Whether an idle connection has nothing to read and is not closed: the server only
    /// talks unprompted to say goodbye. For TLS, the socket under it is probed (anything
    /// there, a close_notify or an error, means the connection is finished). tokio answers
    /// from its readiness state when nothing happened, so this costs no system call.
    pub fn is_idle_quiet(&self) -> bool {
        let tcp = match self {
            BackendStream::Plain(s) => s,
            BackendStream::Tls(s) => s.get_ref().0,
        };
        let mut probe = [0u8; 1];
        matches!(tcp.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Whether this connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, BackendStream::Tls(_))
    }

    /// One step of an exchange: writes more of `out` (and flushes it once all is written) and,
    /// when `read`, reads what the server sent into `rbuf`. Ready once anything moved; an end
    /// of stream while reading or a zero-length write is an error.
    pub fn poll_exchange(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Outgoing<'_>,
        rbuf: &mut BytesMut,
        read: bool,
    ) -> Poll<io::Result<()>> {
        let mut moved = false;
        if out.written < out.len() {
            match Pin::new(&mut *self).poll_write(cx, out.rest()) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(closed())),
                Poll::Ready(Ok(n)) => {
                    out.written += n;
                    out.flushed = false;
                    moved = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
        }
        if out.written == out.len() && !out.flushed {
            match Pin::new(&mut *self).poll_flush(cx) {
                Poll::Ready(Ok(())) => {
                    out.flushed = true;
                    moved = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
        }
        if read {
            match tokio_util::io::poll_read_buf(Pin::new(&mut *self), cx, rbuf) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(closed())),
                Poll::Ready(Ok(_)) => moved = true,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
        }
        if moved {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }
}

/// A request being written by [`BackendStream::poll_exchange`]: `bytes`, then `tail`.
pub struct Outgoing<'a> {
    pub bytes: &'a [u8],
    /// A long client message that follows `bytes`, kept in its own buffer so that it is not
    /// copied behind them.
    pub tail: &'a [u8],
    /// Of `bytes` and then `tail`.
    pub written: usize,
    /// Whether everything written so far has left any buffer of the stream.
    pub flushed: bool,
}

impl<'a> Outgoing<'a> {
    /// `bytes`, of which the first `written` already went out (by [`BackendStream::try_write`],
    /// which buffers nothing).
    pub fn new(bytes: &'a [u8], written: usize) -> Outgoing<'a> {
        Self::with_tail(bytes, &[], written)
    }

    /// `bytes` and then `tail`, of which the first `written` already went out.
    pub fn with_tail(bytes: &'a [u8], tail: &'a [u8], written: usize) -> Outgoing<'a> {
        Outgoing {
            bytes,
            tail,
            written,
            flushed: true,
        }
    }

    fn len(&self) -> usize {
        self.bytes.len() + self.tail.len()
    }

    /// What is left to write (of `bytes`, or once they are out, of `tail`).
    fn rest(&self) -> &'a [u8] {
        match self.bytes.get(self.written..) {
            Some(rest) if !rest.is_empty() => rest,
            _ => {
                &self.tail[self
                    .written
                    .saturating_sub(self.bytes.len())
                    .min(self.tail.len())..]
            }
        }
    }

    /// Whether all of it went out.
    pub fn done(&self) -> bool {
        self.written == self.len() && self.flushed
    }
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection",
    )
}

impl AsyncRead for BackendStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            BackendStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BackendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BackendStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            BackendStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Plain(s) => Pin::new(s).poll_flush(cx),
            BackendStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            BackendStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Outgoing;

    #[test]
    fn a_request_is_written_bytes_first_then_its_tail() {
        let mut out = Outgoing::with_tail(b"abc", b"defg", 0);
        assert_eq!(out.rest(), b"abc");
        out.written = 2;
        assert_eq!(out.rest(), b"c");
        out.written = 3;
        assert_eq!(out.rest(), b"defg");
        out.written = 5;
        assert_eq!(out.rest(), b"fg");
        out.written = 7;
        assert!(out.rest().is_empty() && out.done());
        let plain = Outgoing::new(b"xy", 1);
        assert_eq!((plain.rest(), plain.done()), (&b"y"[..], false));
    }
}
