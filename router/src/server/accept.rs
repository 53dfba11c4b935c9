//! Accepting clients: one tokio task per client, which negotiates TLS
//! ([`super::negotiate`]), logs in ([`super::handshake`]) and then runs its [`Session`] until
//! the client leaves.
//!
//! A client's failure (bad protocol, lost connection, bad password) ends that task only; every
//! other client and the router keep running.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::clients::ClientInfo;
use super::handshake;
use super::lifecycle::Phase;
use super::negotiate::{self, Negotiated};
use super::Shared;
use crate::errors;
use crate::protocol::reply::SqlError;
use crate::protocol::startup::Startup;
use crate::session::{Session, Settings};
use crate::stats::Stats;

/// Accepts clients until the router closes for a drain (the listener is dropped then).
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    let mut phase = shared.lifecycle.subscribe();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = phase.wait_for(|p| *p == Phase::Closing) => return Ok(()),
        };
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

async fn client(mut stream: TcpStream, shared: Arc<Shared>, peer: std::net::SocketAddr) {
    let _ = stream.set_nodelay(true);
    if shared.clients.count() >= shared.routing().config.limits.max_clients {
        let mut out = Vec::new();
        SqlError::fatal(
            errors::TOO_MANY_CONNECTIONS,
            "sorry, too many clients already",
        )
        .with_hint("raise [limits] max_clients in the router config, or use fewer connections")
        .write(&mut out);
        let _ = stream.write_all(&out).await;
        Stats::count(&shared.stats.clients_refused);
        return;
    }
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let deadline = tokio::time::Instant::now() + handshake::HANDSHAKE_TIMEOUT;
    match handshake::bounded(deadline, negotiate::run(stream, &mut buf, &shared)).await {
        Ok(Negotiated::Plain(stream, params)) => {
            login_and_serve(stream, false, buf, params, shared, peer, deadline).await
        }
        Ok(Negotiated::Tls(stream, params)) => {
            login_and_serve(stream, true, buf, params, shared, peer, deadline).await
        }
        Ok(Negotiated::Done) => {}
        Err(e) => refused(&shared, peer, &e),
    }
}

/// A connection that did not get as far as a session.
fn refused(shared: &Shared, peer: std::net::SocketAddr, e: &handshake::HandshakeError) {
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
    shared: Arc<Shared>,
    peer: std::net::SocketAddr,
    deadline: tokio::time::Instant,
) {
    let login = handshake::login(&mut stream, &mut buf, &shared, params);
    let login = match handshake::bounded(deadline, login).await {
        Ok(login) => login,
        Err(e) => return refused(&shared, peer, &e),
    };
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
