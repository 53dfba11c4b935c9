//! Accepting clients: one tokio task per client, which negotiates TLS
//! ([`super::negotiate`]), logs in ([`super::handshake`]) and then runs its [`Session`] until
//! the client leaves.
//!
//! A client's failure (bad protocol, lost connection, bad password) ends that task only; every
//! other client and the router keep running.
//!
//! Two caps guard the door: `[limits] max_clients` counts clients that have logged in, and
//! `max_logins` counts connections still logging in, each of which must finish within
//! `login_timeout_ms`. A flood of sockets that connect and say nothing thus holds at most
//! `max_logins` file descriptors for at most the login timeout, and a client beyond the cap
//! is told `53300` at once rather than waiting behind them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::handshake;
use super::negotiate::{self, Negotiated};
use crate::backend::settings::Settings;
use crate::errors;
use crate::protocol::reply::SqlError;
use crate::protocol::startup::Startup;
use crate::routing::clients::ClientInfo;
use crate::routing::Phase;
use crate::routing::Router;
use crate::session::Session;
use crate::stats::Stats;

/// Accepts clients until the router closes for a drain (the listener is dropped then).
pub async fn serve(listener: TcpListener, shared: Arc<Router>) -> std::io::Result<()> {
    let mut phase = shared.lifecycle.subscribe();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = phase.wait_for(|p| *p == Phase::Closing) => return Ok(()),
            accepted = listener.accept() => accepted,
        };
        if shared.lifecycle.closing() {
            // Accepted as the drain closed the door (on a worker slower to see it than a
            // session that already told its client): refused like any later one.
            return Ok(());
        }
        let (stream, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: wait a moment rather than spin.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            client(stream, shared, peer).await;
        });
    }
}

/// One connection counted in [`Router::logins`] until it has logged in or left.
struct LoggingIn<'a>(Option<&'a Router>);

impl<'a> LoggingIn<'a> {
    /// A place among the connections logging in, or `None` when `max` are already.
    fn enter(shared: &'a Router, max: usize) -> Option<LoggingIn<'a>> {
        let taken = shared.logins.fetch_add(1, Ordering::AcqRel);
        let guard = LoggingIn(Some(shared));
        (taken < max).then_some(guard)
    }

    /// The connection has logged in (or is done with the door): it no longer counts.
    fn leave(&mut self) {
        if let Some(shared) = self.0.take() {
            shared.logins.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for LoggingIn<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Tells a client it is refused at the door and closes; a short write that never waits long
/// (the client may be one of those that never read).
async fn refuse_at_door(mut stream: TcpStream, shared: &Router, err: SqlError) {
    let mut out = Vec::new();
    err.write(&mut out);
    let send = stream.write_all(&out);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), send).await;
    Stats::count(&shared.stats.clients_refused);
}

async fn client(stream: TcpStream, shared: Arc<Router>, peer: std::net::SocketAddr) {
    let _ = stream.set_nodelay(true);
    let limits = shared.routing().config.limits.clone();
    if shared.clients.count() >= limits.max_clients {
        let err = SqlError::fatal(
            errors::TOO_MANY_CONNECTIONS,
            "sorry, too many clients already",
        )
        .with_hint("raise [limits] max_clients in the router config, or use fewer connections");
        return refuse_at_door(stream, &shared, err).await;
    }
    let Some(mut logging_in) = LoggingIn::enter(&shared, limits.max_logins) else {
        tracing::debug!(%peer, "refused: [limits] max_logins connections are logging in");
        return refuse_at_door(stream, &shared, errors::too_many_logins(limits.max_logins)).await;
    };
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let timeout = limits.login_timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    let negotiated =
        handshake::bounded(deadline, timeout, negotiate::run(stream, &mut buf, &shared)).await;
    let door = Door {
        peer,
        deadline,
        timeout,
    };
    match negotiated {
        Ok(Negotiated::Plain(stream, params)) => {
            login_and_serve(stream, false, buf, params, &shared, door, &mut logging_in).await
        }
        Ok(Negotiated::Tls(stream, params)) => {
            login_and_serve(stream, true, buf, params, &shared, door, &mut logging_in).await
        }
        Ok(Negotiated::Done) => {}
        Err(e) => refused(&shared, peer, &e),
    }
}

/// Where a connection came from and until when it may log in.
struct Door {
    peer: std::net::SocketAddr,
    deadline: tokio::time::Instant,
    timeout: std::time::Duration,
}

/// A connection that did not get as far as a session.
fn refused(shared: &Router, peer: std::net::SocketAddr, e: &handshake::HandshakeError) {
    tracing::info!(%peer, "login failed: {e}");
    if !matches!(e, handshake::HandshakeError::Io(_)) {
        Stats::count(&shared.stats.clients_refused);
    }
}

/// Logs the client in and runs its session; one copy of the session code per kind of stream
/// (plain TCP pays nothing for TLS).
async fn login_and_serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    tls: bool,
    mut buf: BytesMut,
    params: negotiate::Params,
    shared: &Arc<Router>,
    door: Door,
    logging_in: &mut LoggingIn<'_>,
) {
    let peer = door.peer;
    let login = handshake::login(&mut stream, &mut buf, shared, params);
    let login = match handshake::bounded(door.deadline, door.timeout, login).await {
        Ok(login) => login,
        Err(e) => return refused(shared, peer, &e),
    };
    logging_in.leave();
    let shared = shared.clone();
    Stats::count(&shared.stats.clients_accepted);
    let id = login.id;
    tracing::debug!(%peer, user = %login.user, client = id, "client logged in");
    login.slot.describe(ClientInfo {
        user: login.user.clone(),
        database: Startup::param(&login.params, "database")
            .unwrap_or(&login.user)
            .to_string(),
        addr: peer,
        application_name: Startup::param(&login.params, "application_name")
            .unwrap_or_default()
            .to_string(),
        connected: std::time::SystemTime::now(),
        tls,
    });
    if login.admin {
        if let Err(e) = crate::admin::run(shared.clone(), stream, buf).await {
            tracing::info!(%peer, client = id, "admin session ended: {e}");
        }
        shared.clients.remove(id);
        return;
    }
    let settings = Settings::from_startup(&login.params);
    let session = Session::new(shared.clone(), stream, buf, login.slot, settings);
    if let Err(e) = session.run().await {
        tracing::info!(%peer, client = id, "session ended: {e}");
    }
    shared.clients.remove(id);
}
