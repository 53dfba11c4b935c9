//! The router's life after it starts, driven from the main thread ([`control`]): it serves;
//! `SIGHUP`, the admin `RELOAD` or a change of the watched files reload the config and the
//! shard map; `SIGTERM`, Ctrl-C or the admin `SHUTDOWN` drain it:
//!
//! 1. [`Phase::Draining`]: `/ready` says no at once, everything else keeps serving for
//!    `drain_grace_ms`, so a load balancer notices and sends no new clients;
//! 2. [`Phase::Closing`]: the listeners close; a session at rest (no transaction, nothing owed)
//!    ends with `57P01` instead of running its next statement; a session in a transaction may
//!    finish it, for up to `drain_timeout_ms`;
//! 3. the process exits 0 (with `1` only when something failed before serving).
//!
//! No statement is cut in the middle while the drain timeout lasts; a second signal exits at
//! once.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::routing::{Phase, Router};
use tokio::signal::unix::{signal, SignalKind};

/// The signals the router handles, installed before it binds its address: without a handler
/// `SIGHUP` terminates a process, so one sent while the router starts (say, by a deploy tool
/// reloading a fleet) would kill it. A signal that arrives before [`control`] runs waits for
/// it.
pub struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers; must run inside a tokio runtime (the main thread's).
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            hup: signal(SignalKind::hangup())?,
            term: signal(SignalKind::terminate())?,
        })
    }
}

/// Runs on the main thread until the router has drained: reloads on `SIGHUP` (and on changed
/// files, when watched), drains on `SIGTERM`, Ctrl-C or `SHUTDOWN`.
pub async fn control(shared: Arc<Router>, signals: Signals) {
    let Signals { mut hup, mut term } = signals;
    let mut phase = shared.lifecycle.subscribe();
    let mut watched = files(&shared);
    let mut tick = tokio::time::interval(shared.routing().config.reload.watch_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading");
                if reload_unless_stopped(&shared, &mut term).await {
                    break;
                }
                watched = files(&shared);
            }
            _ = tick.tick(), if shared.routing().config.reload.watch => {
                let now = files(&shared);
                if now != watched {
                    tracing::info!("the config or the shard map changed: reloading");
                    if reload_unless_stopped(&shared, &mut term).await {
                        break;
                    }
                    watched = files(&shared);
                }
            }
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = phase.changed() => {
                if *phase.borrow() != Phase::Serving {
                    break;
                }
            }
        }
    }
    drain(&shared, &mut term).await;
}

/// Reloads, unless SIGTERM or Ctrl-C comes first (a reload may wait for the warming of new
/// pools, up to `[pool] warm_timeout_ms`): true when the router must stop. A reload given up
/// before its new routing was stored changes nothing.
async fn reload_unless_stopped(shared: &Router, term: &mut tokio::signal::unix::Signal) -> bool {
    tokio::select! {
        reloaded = shared.reload() => {
            if let Err(e) = reloaded {
                tracing::error!("reload refused, the running config and shard map stay: {e}");
            }
            false
        }
        _ = term.recv() => true,
        _ = tokio::signal::ctrl_c() => true,
    }
}

/// The modification times of the config file, the shard map file and the TLS files.
fn files(shared: &Router) -> Vec<Option<SystemTime>> {
    let routing = shared.routing();
    [
        routing.config.source.as_path(),
        routing.config.shardmap.as_path(),
    ]
    .into_iter()
    .chain(crate::tls::files(&routing.config))
    .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
    .collect()
}

async fn drain(shared: &Router, term: &mut tokio::signal::unix::Signal) {
    let config = shared.routing().config.clone();
    let (grace, timeout) = (config.shutdown.drain_grace, config.shutdown.drain_timeout);
    shared.lifecycle.advance(Phase::Draining);
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        clients = shared.clients.count(),
        "draining: not ready any more; serving until the grace period ends"
    );
    tokio::select! {
        _ = tokio::time::sleep(grace) => {}
        _ = term.recv() => {
            tracing::warn!("a second SIGTERM: exiting now");
            return;
        }
    }
    shared.lifecycle.advance(Phase::Closing);
    // Statements waiting for a paused shard never started: they give up now (57P01).
    shared.pauses.close();
    tracing::info!(
        timeout_ms = timeout.as_millis() as u64,
        clients = shared.clients.count(),
        "closing: no new clients; clients end between transactions"
    );
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = shared.clients.count();
        if left == 0 {
            tracing::info!("drained: every client has left");
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                clients = left,
                "drain timeout: exiting with clients still in a transaction"
            );
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            _ = term.recv() => {
                tracing::warn!(clients = left, "a second SIGTERM: exiting now");
                return;
            }
        }
    }
}
