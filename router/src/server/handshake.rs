//! A client's login, after [`super::negotiate`] has read its StartupMessage (over TLS or not):
//! the database check, SCRAM-SHA-256 authentication, and the greeting (ParameterStatus,
//! BackendKeyData, ReadyForQuery); also the packet reading both share, and cancel requests.
//!
//! The whole handshake, negotiation and TLS included, is bounded by one deadline
//! (`[limits] login_timeout_ms`, see [`bounded`]), like Postgres's `authentication_timeout`, so
//! a client that connects and says nothing cannot hold a slot.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::auth::{AuthError, ScramServer, ScramVerifier};
use crate::config::AuthMethod;
use crate::errors;
use crate::protocol::frame::next_frame;
use crate::protocol::reply::{self, SqlError, TxStatus};
use crate::protocol::startup::{self, Startup};
use crate::routing::clients::{router_of, ClientSlot, Clients};
use crate::routing::door::Crowded;
use crate::routing::Router;

/// The database name of the admin console.
pub const ADMIN_DATABASE: &str = "shardgate";

/// A logged-in client.
pub struct Login {
    pub user: String,
    /// Logged in to the admin console ([`ADMIN_DATABASE`]) rather than the application's.
    pub admin: bool,
    pub params: Vec<(String, String)>,
    pub id: i32,
    pub slot: Arc<ClientSlot>,
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Already reported to the client as a FATAL error.
    #[error("{0}")]
    Refused(SqlError),
    #[error("the client did not finish logging in within {0:?}")]
    Timeout(Duration),
    /// Nothing came from the client for `[limits] startup_timeout_ms`.
    #[error("the client sent no {1} within {0:?} ([limits] startup_timeout_ms)")]
    Quiet(Duration, &'static str),
    /// Closed to make room for newer connections.
    #[error("closed to make room: {0}")]
    MadeRoom(Crowded),
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
}

/// Runs `step` until `deadline` (the one deadline of a client's whole handshake, TLS
/// included; `timeout` is how long it was, for the message).
pub async fn bounded<T>(
    deadline: tokio::time::Instant,
    timeout: Duration,
    step: impl std::future::Future<Output = Result<T, HandshakeError>>,
) -> Result<T, HandshakeError> {
    match tokio::time::timeout_at(deadline, step).await {
        Ok(r) => r,
        Err(_) => Err(HandshakeError::Timeout(timeout)),
    }
}

/// Sends `err` to the client (which then leaves) and returns it, to be logged.
pub(super) async fn refuse<S: AsyncWrite + Unpin>(stream: &mut S, err: SqlError) -> HandshakeError {
    let mut out = Vec::new();
    err.write(&mut out);
    // The client may already be gone; the refusal is logged either way.
    let _ = stream.write_all(&out).await;
    let _ = stream.flush().await;
    HandshakeError::Refused(err)
}

/// Reads until `buf` holds `n` bytes; `false` on a clean EOF before anything arrived.
async fn fill<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    n: usize,
) -> std::io::Result<bool> {
    while buf.len() < n {
        if stream.read_buf(buf).await? == 0 {
            if buf.is_empty() {
                return Ok(false);
            }
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the client left mid-message",
            ));
        }
    }
    Ok(true)
}

/// The next packet of the startup phase (SSLRequest, GSSENCRequest, CancelRequest or
/// StartupMessage); `None` when the client left without sending one. A malformed packet is
/// refused with `08P01`.
pub(super) async fn read_packet<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> Result<Option<Startup>, HandshakeError> {
    loop {
        if !fill(stream, buf, 4).await? {
            return Ok(None);
        }
        let len = match startup::packet_len(buf) {
            Ok(Some(len)) => len,
            Ok(None) => continue,
            Err(e) => {
                return Err(refuse(
                    stream,
                    SqlError::fatal(errors::PROTOCOL_VIOLATION, e.to_string()),
                )
                .await)
            }
        };
        fill(stream, buf, len).await?;
        let packet = startup::decode(&buf[..len]);
        buf.advance(len);
        return match packet {
            Ok(packet) => Ok(Some(packet)),
            Err(e) => Err(refuse(
                stream,
                SqlError::fatal(errors::PROTOCOL_VIOLATION, e.to_string()),
            )
            .await),
        };
    }
}

/// Logs in a client that sent `params` (its StartupMessage): the database check,
/// authentication, and the greeting.
pub async fn login<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    shared: &Router,
    params: Vec<(String, String)>,
) -> Result<Login, HandshakeError> {
    let user = match Startup::param(&params, "user") {
        Some(u) if !u.is_empty() => u.to_string(),
        _ => {
            let err = SqlError::fatal(
                errors::INVALID_AUTHORIZATION,
                "no PostgreSQL user name specified in startup packet",
            );
            return Err(refuse(stream, err).await);
        }
    };
    let database = Startup::param(&params, "database")
        .unwrap_or(&user)
        .to_string();
    let routing = shared.routing();
    let config = &routing.config;
    let admin = database == ADMIN_DATABASE && database != config.database;
    if database != config.database && !admin {
        let err = SqlError::fatal(
            errors::UNKNOWN_DATABASE,
            format!("database \"{database}\" does not exist"),
        )
        .with_hint(format!(
            "this router serves the database \"{}\"",
            config.database
        ));
        return Err(refuse(stream, err).await);
    }

    if config.auth == AuthMethod::ScramSha256 {
        if let Err(e) = authenticate(stream, buf, shared, config, &user).await? {
            let err = SqlError::fatal(e.sqlstate(), e.client_message(&user));
            return Err(refuse(stream, err).await);
        }
    }
    if admin && !config.user(&user).is_some_and(|u| u.admin) {
        let err = SqlError::fatal(
            errors::INSUFFICIENT_PRIVILEGE,
            format!("user \"{user}\" may not use the admin console"),
        )
        .with_hint("mark the user with admin = true in [[users]] of the router config");
        return Err(refuse(stream, err).await);
    }

    let (id, slot) = shared.clients.add();
    // Taken off the table again if the greeting fails or this login is dropped unfinished (the
    // login timeout, or the door closing it to make room).
    let listed = Listed {
        clients: &shared.clients,
        id: Some(id),
    };
    let mut out = Vec::with_capacity(512);
    reply::auth_ok(&mut out);
    let server_params = shared
        .server_params
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for (name, value) in &server_params {
        // What the client asked for itself is what it is told, as Postgres does.
        let value = match name.as_str() {
            "application_name" | "client_encoding" | "DateStyle" | "TimeZone" | "IntervalStyle" => {
                Startup::param(&params, name).unwrap_or(value)
            }
            "session_authorization" => &user,
            _ => value,
        };
        reply::parameter_status(&mut out, name, value);
    }
    reply::backend_key_data(&mut out, id, slot.secret);
    reply::ready_for_query(&mut out, TxStatus::Idle);
    write_flushed(stream, &out).await?;
    listed.keep();
    Ok(Login {
        user,
        admin,
        params,
        id,
        slot,
    })
}

/// A client on the table of clients, until it is kept.
struct Listed<'a> {
    clients: &'a Clients,
    id: Option<i32>,
}

impl Listed<'_> {
    /// The login is done: the session takes the client off the table when it ends.
    fn keep(mut self) {
        self.id = None;
    }
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.clients.remove(id);
        }
    }
}

/// Writes `out` and flushes it (TLS holds records back until a flush).
async fn write_flushed<S: AsyncWrite + Unpin>(stream: &mut S, out: &[u8]) -> std::io::Result<()> {
    stream.write_all(out).await?;
    stream.flush().await
}

/// Runs SCRAM-SHA-256; the outer error is I/O, the inner one a failed login.
async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    shared: &Router,
    config: &crate::config::Config,
    user: &str,
) -> Result<Result<(), AuthError>, HandshakeError> {
    let verifier = match config.user(user) {
        Some(u) => u.secret.verifier().into_owned(),
        // Unknown users go through the same exchange and fail like a wrong password.
        None => ScramVerifier::mock(user, &shared.mock_key),
    };
    let mut scram = ScramServer::new(&verifier, ScramServer::random_nonce());
    let mut out = Vec::new();
    reply::auth_sasl(&mut out, 10, ScramServer::mechanisms());
    write_flushed(stream, &out).await?;

    let body = read_password_message(stream, buf).await?;
    let first = match scram.client_first(&body) {
        Ok(first) => first,
        Err(e) => return Ok(Err(e)),
    };
    out.clear();
    reply::auth_sasl(&mut out, 11, &first);
    write_flushed(stream, &out).await?;

    let body = read_password_message(stream, buf).await?;
    let last = match scram.client_final(&body) {
        Ok(last) => last,
        Err(e) => return Ok(Err(e)),
    };
    out.clear();
    reply::auth_sasl(&mut out, 12, &last);
    write_flushed(stream, &out).await?;
    Ok(Ok(()))
}

/// Reads one `p` message (PasswordMessage / SASLInitialResponse / SASLResponse) body.
async fn read_password_message<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> Result<Vec<u8>, HandshakeError> {
    loop {
        match next_frame(buf) {
            Ok(Some(h)) if h.tag == b'p' && h.total <= 64 * 1024 => {
                let body = buf[h.body()].to_vec();
                buf.advance(h.total);
                return Ok(body);
            }
            Ok(Some(h)) => {
                let err = SqlError::fatal(
                    errors::PROTOCOL_VIOLATION,
                    format!(
                        "expected a password message during authentication, got message type {:?}",
                        char::from(h.tag)
                    ),
                );
                return Err(refuse(stream, err).await);
            }
            Ok(None) => {
                if stream.read_buf(buf).await? == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the client left during authentication",
                    )
                    .into());
                }
            }
            Err(e) => {
                return Err(refuse(
                    stream,
                    SqlError::fatal(errors::PROTOCOL_VIOLATION, e.to_string()),
                )
                .await)
            }
        }
    }
}

/// Sends a CancelRequest to the backend that runs client `pid`'s statement, if the secret
/// matches; like Postgres, says nothing back either way.
pub(super) async fn forward_cancel(shared: &Router, pid: i32, secret: i32) {
    let owner = router_of(pid);
    let routing = shared.routing();
    if owner != routing.config.router_id {
        // Another router's client: pass the request on, as it came.
        let Some(peer) = routing.config.peers.iter().find(|p| p.id == owner) else {
            tracing::debug!(
                pid,
                router = owner,
                "cancel request for a router that is not among [[peers]]"
            );
            return;
        };
        match crate::backend::cancel::send_cancel(peer.address, pid, secret).await {
            Ok(()) => {
                tracing::info!(pid, router = owner, peer = %peer.address, "passed a cancel request to its router")
            }
            Err(e) => {
                tracing::warn!(pid, peer = %peer.address, "could not pass a cancel request on: {e}")
            }
        }
        return;
    }
    let Some(slot) = shared.clients.slot(pid, secret) else {
        tracing::debug!(
            pid,
            "cancel request for an unknown client or with a wrong secret"
        );
        return;
    };
    let Some(target) = slot.running() else {
        // Nothing of the client's runs on a connection of its own: its statement may be on a
        // shared connection, where only its session can tell which one is its.
        slot.ask_cancel();
        tracing::info!(pid, "passed a cancel request to the client's session");
        return;
    };
    let Some(routing) = shared.routing_of(target.generation) else {
        tracing::debug!(pid, "cancel request for a statement whose routing is gone");
        return;
    };
    let endpoint = &routing.pools().for_shard(target.shard).endpoint;
    match crate::backend::cancel::send_cancel(
        (endpoint.host.as_str(), endpoint.port),
        target.pid,
        target.secret,
    )
    .await
    {
        Ok(()) => tracing::info!(pid, backend = %endpoint.name(), "forwarded a cancel request"),
        Err(e) => tracing::warn!(pid, "could not forward a cancel request: {e}"),
    }
}
