//! Accepting clients: each worker's one door task ([`serve`]) accepts connections and logs
//! them in (TLS in [`super::negotiate`], the password in [`super::handshake`]); each client
//! that gets in then runs its [`Session`] in a task of its own until it leaves.
//!
//! A client's failure (bad protocol, lost connection, bad password) ends that login or session
//! only; every other client and the router keep running.
//!
//! Until it has logged in, a connection waits in the [`door`](crate::routing::door): every
//! connection gets in, and when `[limits] max_logins` are logging in the one that has done
//! least of its login (oldest first) is closed to make room, so a reconnect storm all logs in
//! and silent sockets cannot lock anyone out; the same when the router runs out of file
//! descriptors and cannot accept. Each wait for a client's first packets is bounded by
//! `startup_timeout_ms`, the whole login by `login_timeout_ms`. `max_clients` is checked once
//! the client has sent its startup message, so the refusal is an ErrorResponse every driver
//! shows with its SQLSTATE.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
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

/// Accepts clients and logs them in until the router closes for a drain (the listener is
/// dropped then, and the logins already under way are finished).
///
/// Every login of this worker runs inside this one future (the worker's root future, polled
/// between batches of the other tasks), not in a task of its own: a storm of thousands of
/// logins then counts in the worker's loop about as much as one busy session, instead of
/// thousands of tasks queued ahead of every session's next statement. Each turn does what
/// tokio's cooperative budget allows (about 128 socket operations: a few dozen login steps, in
/// the order their clients answered) and yields; a TLS handshake takes a whole turn
/// (`negotiate::charge_handshake`). A client that gets in runs its session in a task of its own.
pub async fn serve(listener: TcpListener, shared: Arc<Router>) -> std::io::Result<()> {
    let mut phase = shared.lifecycle.subscribe();
    let closing = phase.wait_for(|p| *p == Phase::Closing);
    tokio::pin!(closing);
    let mut listener = Some(listener);
    // Accepting waits this out after a failed accept (kept across turns, so a login that
    // finishes meanwhile does not cut it short).
    let mut pause: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let mut logins = FuturesUnordered::new();
    loop {
        tokio::select! {
            _ = &mut closing, if listener.is_some() => listener = None,
            () = wait(&mut pause), if pause.is_some() => pause = None,
            accepted = accept(listener.as_ref()), if listener.is_some() && pause.is_none() => {
                let (stream, peer) = match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        pause = Some(Box::pin(tokio::time::sleep(failed(&e, &shared))));
                        continue;
                    }
                };
                if shared.lifecycle.closing() {
                    // Accepted as the drain closed the door (on a worker slower to see it than
                    // a session that already told its client): refused like any later one.
                    listener = None;
                    continue;
                }
                let login = AssertUnwindSafe(log_in(stream, shared.clone(), peer)).catch_unwind();
                logins.push(login.map(move |done| (peer, done)));
            }
            Some((peer, done)) = logins.next(), if !logins.is_empty() => match done {
                Ok(Some(entered)) => {
                    tokio::spawn(serve_client(entered, shared.clone()));
                }
                Ok(None) => {}
                Err(panic) => tracing::error!(
                    %peer,
                    "a login panicked (a bug: {}); its connection is closed, the other logins go on",
                    panic_message(&*panic)
                ),
            },
            else => return Ok(()),
        }
    }
}

/// The next connection from `listener` (`None`: never).
async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// Until `pause` is over (`None`: never).
async fn wait(pause: &mut Option<Pin<Box<tokio::time::Sleep>>>) {
    match pause {
        Some(sleep) => sleep.await,
        None => std::future::pending().await,
    }
}

/// What a failed accept does, and how long accepting then waits.
fn failed(e: &std::io::Error, shared: &Router) -> Duration {
    if out_of_files(e) && shared.door.make_room() {
        // The oldest connection still logging in was told to close; give its login a moment
        // to let go of its descriptor before the next accept.
        tracing::debug!("accept failed: {e}; closed the oldest connection logging in");
        Duration::from_millis(1)
    } else {
        // Out of file descriptors with nobody to close, and the like: wait a moment rather
        // than spin.
        tracing::warn!("accept failed: {e}");
        Duration::from_millis(50)
    }
}

/// The text a panic was raised with, when it is one.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// Whether `accept` failed for want of file descriptors (the process's or the system's).
fn out_of_files(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// A client's stream once it has logged in.
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// A client that has logged in, ready for its session.
struct Entered {
    stream: Stream,
    /// What the client sent after its login, already read.
    buf: BytesMut,
    login: Login,
    peer: SocketAddr,
}

/// Takes a new connection through the door: TLS, the startup message, the password; `None`
/// when it did not get in (it was told why, or closed) or was a cancel request.
async fn log_in(stream: TcpStream, shared: Arc<Router>, peer: SocketAddr) -> Option<Entered> {
    let _ = stream.set_nodelay(true);
    let limits = shared.routing().config.limits.clone();
    let fd = stream.as_raw_fd();
    let (ticket, mut closed) = shared.door.enter(peer.ip(), fd, rules(&limits, peer.ip()));
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let deadline = tokio::time::Instant::now() + limits.login_timeout;
    let door = async {
        let negotiated =
            negotiate::run(stream, &mut buf, &shared, limits.startup_timeout, &ticket).await?;
        Ok(match negotiated {
            Negotiated::Plain(mut s, params) => {
                let login = authenticate(&mut s, &mut buf, &shared, params, &limits).await?;
                Some((Stream::Plain(s), login))
            }
            Negotiated::Tls(mut s, params) => {
                let login = authenticate(&mut *s, &mut buf, &shared, params, &limits).await?;
                Some((Stream::Tls(s), login))
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
        Ok(entered) => entered.map(|(stream, login)| Entered {
            stream,
            buf,
            login,
            peer,
        }),
        Err(e) => {
            refused(&shared, peer, &e);
            None
        }
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
async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
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

/// Runs a logged-in client's session (or admin console) until it ends.
async fn serve_client(entered: Entered, shared: Arc<Router>) {
    let Entered {
        stream,
        buf,
        login,
        peer,
    } = entered;
    match stream {
        Stream::Plain(s) => run_session(s, false, buf, login, &shared, peer).await,
        Stream::Tls(s) => run_session(*s, true, buf, login, &shared, peer).await,
    }
}

/// One copy per kind of stream (plain TCP pays nothing for TLS).
async fn run_session<S: AsyncRead + AsyncWrite + Unpin>(
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
