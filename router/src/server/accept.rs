//! Accepting clients: one tokio task per client, which negotiates TLS
//! ([`super::negotiate`]), logs in ([`super::handshake`]) and then runs its [`Session`] until
//! the client leaves.
//!
//! A client's failure (bad protocol, lost connection, bad password) ends that task only; every
//! other client and the router keep running.
//!
//! Until it has logged in, a connection waits in the [`door`](crate::routing::door): every
//! connection gets in, and when `[limits] max_logins` are logging in the oldest (silent first)
//! is closed to make room, so a reconnect storm all logs in and silent sockets cannot lock
//! anyone out; the same when the router runs out of file descriptors and cannot accept. Each
//! wait for a client's first packets is bounded by `startup_timeout_ms`, the whole login by
//! `login_timeout_ms`. `max_clients` is checked once the client has sent its startup message,
//! so the refusal is an ErrorResponse every driver shows with its SQLSTATE.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

use super::handshake::{self, HandshakeError, Login};
use super::negotiate::{self, Negotiated};
use crate::backend::settings::Settings;
use crate::config::Limits;
use crate::errors;
use crate::protocol::startup::Startup;
use crate::routing::clients::ClientInfo;
use crate::routing::door::Rules;
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
            Err(e) if out_of_files(&e) && shared.door.make_room() => {
                // The oldest connection still logging in was told to close; give its task a
                // moment to let go of its descriptor before the next accept.
                tracing::debug!("accept failed: {e}; closed the oldest connection logging in");
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                continue;
            }
            Err(e) => {
                // Out of file descriptors with nobody to close, and the like: wait a moment
                // rather than spin.
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

/// Whether `accept` failed for want of file descriptors (the process's or the system's).
fn out_of_files(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// A client's stream once it has logged in.
enum Entered {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

async fn client(stream: TcpStream, shared: Arc<Router>, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let limits = shared.routing().config.limits.clone();
    let (ticket, mut closed) = shared.door.enter(peer.ip(), rules(&limits, peer.ip()));
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let deadline = tokio::time::Instant::now() + limits.login_timeout;
    let door = async {
        let negotiated =
            negotiate::run(stream, &mut buf, &shared, limits.startup_timeout, &ticket).await?;
        Ok(match negotiated {
            Negotiated::Plain(mut s, params) => {
                let login = log_in(&mut s, &mut buf, &shared, params, &limits).await?;
                Some((Entered::Plain(s), login))
            }
            Negotiated::Tls(mut s, params) => {
                let login = log_in(&mut *s, &mut buf, &shared, params, &limits).await?;
                Some((Entered::Tls(s), login))
            }
            Negotiated::Done => None,
        })
    };
    let entered = tokio::select! {
        entered = handshake::bounded(deadline, limits.login_timeout, door) => entered,
        crowded = closed.closed() => Err(HandshakeError::MadeRoom(crowded)),
    };
    drop(ticket);
    match entered {
        Ok(Some((Entered::Plain(s), login))) => {
            serve_client(s, false, buf, login, &shared, peer).await
        }
        Ok(Some((Entered::Tls(s), login))) => {
            serve_client(*s, true, buf, login, &shared, peer).await
        }
        Ok(None) => {}
        Err(e) => refused(&shared, peer, &e),
    }
}

/// The door's rules for a connection from `address`.
fn rules(limits: &Limits, address: IpAddr) -> Rules {
    let exempt = limits
        .max_logins_per_address_exempt
        .iter()
        .any(|net| net.contains(&address));
    Rules {
        max: limits.max_logins,
        per_address: if exempt {
            0
        } else {
            limits.max_logins_per_address
        },
    }
}

/// The client limit, then the login itself.
async fn log_in<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    shared: &Router,
    params: negotiate::Params,
    limits: &Limits,
) -> Result<Login, HandshakeError> {
    if shared.clients.count() >= limits.max_clients {
        return Err(handshake::refuse(stream, errors::too_many_clients()).await);
    }
    handshake::login(stream, buf, shared, params).await
}

/// A connection that did not get as far as a session. Silent and crowded-out connections are
/// what a flood of sockets makes: counted, and logged only at debug level.
fn refused(shared: &Router, peer: SocketAddr, e: &HandshakeError) {
    match e {
        HandshakeError::Io(_) => tracing::debug!(%peer, "login failed: {e}"),
        HandshakeError::Quiet(..) | HandshakeError::MadeRoom(_) => {
            tracing::debug!(%peer, "login failed: {e}");
            Stats::count(&shared.stats.clients_refused);
        }
        _ => {
            tracing::info!(%peer, "login failed: {e}");
            Stats::count(&shared.stats.clients_refused);
        }
    }
}

/// Runs a logged-in client's session (or admin console); one copy per kind of stream (plain
/// TCP pays nothing for TLS).
async fn serve_client<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    tls: bool,
    buf: BytesMut,
    login: Login,
    shared: &Arc<Router>,
    peer: SocketAddr,
) {
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
    let session = Session::new(
        shared.clone(),
        stream,
        buf,
        login.slot,
        settings,
        login.user,
    );
    if let Err(e) = session.run().await {
        tracing::info!(%peer, client = id, "session ended: {e}");
    }
    shared.clients.remove(id);
}
