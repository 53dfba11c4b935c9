//! A new connection's first packets, before any login: SSLRequest (answered `S` and followed by
//! the TLS handshake when `[tls]` is on, `N` otherwise), GSSENCRequest (always `N`),
//! CancelRequest (accepted in plain TCP in every mode, as libpq sends it that way), and the
//! StartupMessage, which ends the negotiation with the client's stream, plain or TLS.
//!
//! Each wait for the client here (its first packet, its TLS ClientHello, its StartupMessage
//! after TLS) is bounded by `[limits] startup_timeout_ms`: a connection that says nothing is
//! closed within seconds, long before the login timeout. The TLS handshake's own computation
//! starts only once a ClientHello has arrived, so a silent socket never costs a handshake.
//!
//! Like Postgres, the router refuses (`08P01`) bytes that arrive after an SSLRequest and before
//! its answer (they were not encrypted and may have been injected), a request for an encryption
//! it refused already or inside TLS, and, with `mode = "require"`, a StartupMessage in plain
//! TCP (`28000`).

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::LazyConfigAcceptor;

use super::handshake::{forward_cancel, read_packet, refuse, HandshakeError};
use crate::config::TlsMode;
use crate::errors;
use crate::protocol::reply::SqlError;
use crate::protocol::startup::Startup;
use crate::routing::door::Ticket;
use crate::routing::Router;
use crate::tls::ClientTls;

/// The client's startup parameters.
pub type Params = Vec<(String, String)>;

/// How a negotiation ended.
pub enum Negotiated {
    Plain(TcpStream, Params),
    /// Boxed: a TLS session is a few kilobytes, moved once here and never again.
    Tls(Box<TlsStream<TcpStream>>, Params),
    /// A cancel request was handled, or the client went away: close quietly.
    Done,
}

/// Reads packets until the StartupMessage, with the TLS settings of the current routing
/// (certificates re-read by a reload apply to clients that connect after it); each wait for
/// the client is bounded by `quiet` (`[limits] startup_timeout_ms`).
pub async fn run(
    mut tcp: TcpStream,
    buf: &mut BytesMut,
    shared: &Router,
    quiet: Duration,
    ticket: &Ticket,
) -> Result<Negotiated, HandshakeError> {
    let tls = shared.routing().tls.clients.clone();
    // What was refused already: each may be asked once (libpq asks for GSSAPI, then TLS).
    let (mut ssl_refused, mut gss_refused) = (false, false);
    loop {
        let Some(packet) = next_packet(&mut tcp, buf, quiet).await? else {
            return Ok(Negotiated::Done);
        };
        let again = match packet {
            Startup::Ssl if ssl_refused => Some("SSL"),
            Startup::GssEnc if gss_refused => Some("GSSAPI"),
            _ => None,
        };
        if let Some(what) = again {
            return Err(refuse(&mut tcp, asked_again(what)).await);
        }
        match packet {
            Startup::Ssl => {
                ticket.asked();
                let Some(tls) = &tls else {
                    tcp.write_all(b"N").await?;
                    ssl_refused = true;
                    continue;
                };
                if !buf.is_empty() {
                    let err = SqlError::fatal(
                        errors::PROTOCOL_VIOLATION,
                        "received unencrypted data after SSL request",
                    )
                    .with_hint("this could be either a client-software bug or evidence of an attempted man-in-the-middle attack");
                    return Err(refuse(&mut tcp, err).await);
                }
                tcp.write_all(b"S").await?;
                let hello = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp);
                let start = tokio::time::timeout(quiet, hello)
                    .await
                    .map_err(|_| HandshakeError::Quiet(quiet, "TLS ClientHello"))?
                    .map_err(HandshakeError::Tls)?;
                ticket.spoke();
                charge_handshake().await;
                let stream = start
                    .into_stream(tls.acceptor.config().clone())
                    .await
                    .map_err(HandshakeError::Tls)?;
                return encrypted(stream, buf, shared, quiet).await;
            }
            Startup::GssEnc => {
                ticket.asked();
                tcp.write_all(b"N").await?;
                gss_refused = true;
            }
            Startup::Cancel { pid, secret } => {
                // Forwarding waits on the network; it has said all it will.
                ticket.spoke();
                forward_cancel(shared, pid, secret).await;
                return Ok(Negotiated::Done);
            }
            Startup::Startup { params } => {
                ticket.spoke();
                if let Some(ClientTls {
                    mode: TlsMode::Require,
                    ..
                }) = tls
                {
                    return Err(refuse(&mut tcp, tls_required()).await);
                }
                return Ok(Negotiated::Plain(tcp, params));
            }
        }
    }
}

/// What a TLS handshake's key exchange and signature count against tokio's cooperative budget:
/// all of a turn's (128; a socket operation counts one). They cost the CPU of many socket
/// operations (about 0.25 ms over ECDSA P-256, 1 ms over RSA 2048) but would count none, so one
/// turn of the worker's logins ([`super::accept::serve`]) ran dozens of them (up to 107 ms,
/// measured over RSA) while the worker's sessions waited; now it runs one. Measured over RSA
/// 2048 during a storm of 10,000 TLS logins, the p99 of clients logged in before went from
/// about 4.8 s to 0.47 s and the storm from 11-12 s to 12.8 s (2026-12-04, against the one
/// future without the charge); on a slower day, against a task per login, from 4.8 s (831
/// statements timed out) to 1.6 s (none), the storm from 11.5 s to 12.7 s (docs/benchmarks.md).
const HANDSHAKE_BUDGET: usize = 128;

/// Counts a handshake against the budget before it runs: when the turn's budget is spent, the
/// handshake waits for the next turn.
async fn charge_handshake() {
    for _ in 0..HANDSHAKE_BUDGET {
        tokio::task::coop::consume_budget().await;
    }
}

/// After the TLS handshake: the StartupMessage (or a cancel request), now encrypted.
async fn encrypted(
    mut stream: TlsStream<TcpStream>,
    buf: &mut BytesMut,
    shared: &Router,
    quiet: Duration,
) -> Result<Negotiated, HandshakeError> {
    match next_packet(&mut stream, buf, quiet).await? {
        None => Ok(Negotiated::Done),
        Some(Startup::Startup { params }) => Ok(Negotiated::Tls(Box::new(stream), params)),
        Some(Startup::Cancel { pid, secret }) => {
            forward_cancel(shared, pid, secret).await;
            Ok(Negotiated::Done)
        }
        Some(Startup::Ssl | Startup::GssEnc) => {
            let err = SqlError::fatal(
                errors::PROTOCOL_VIOLATION,
                "encryption was requested again on a connection that is already encrypted",
            );
            Err(refuse(&mut stream, err).await)
        }
    }
}

/// The client's next startup-phase packet, if it sends one within `quiet`.
async fn next_packet<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    quiet: Duration,
) -> Result<Option<Startup>, HandshakeError> {
    tokio::time::timeout(quiet, read_packet(stream, buf))
        .await
        .map_err(|_| HandshakeError::Quiet(quiet, "startup message"))?
}

/// What a client hears that asks again for an encryption it was refused (Postgres treats the
/// second request as an unknown protocol version).
fn asked_again(what: &str) -> SqlError {
    SqlError::fatal(
        errors::PROTOCOL_VIOLATION,
        format!("{what} encryption was requested again after the server refused it"),
    )
}

/// What a client that logs in without TLS hears under `mode = "require"`.
fn tls_required() -> SqlError {
    SqlError::fatal(
        errors::INVALID_AUTHORIZATION,
        "TLS is required: this router does not accept unencrypted logins",
    )
    .with_hint(
        "connect with TLS, e.g. sslmode=require or sslmode=verify-full in the connection string",
    )
}
