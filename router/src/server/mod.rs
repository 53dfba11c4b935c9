//! Starting and running a router: load the config, shard map and TLS material, then serve
//! clients on one event loop per core ([`accept`]), each client negotiating TLS
//! ([`negotiate`]), logging in ([`handshake`]) and then running its session. [`Router`] is what all sessions share; [`clients`] the table cancel requests use.
//!
//! Each worker thread runs its own single-threaded tokio runtime with its own listening socket
//! on the same address (SO_REUSEPORT: the kernel spreads new connections over them) and its own
//! pools. A client's session, its backend connections and their I/O events all stay on one
//! thread, so a statement never wakes another thread: on these machines the wake-ups of a
//! work-stealing runtime cost more CPU than the routing itself.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

mod accept;
pub mod handshake;
pub mod http;
pub mod lifecycle;
mod lookups;
mod negotiate;
mod nofile;
mod recovery;

use crate::backend::worker::set_worker;
use crate::routing::{probe, Router};

use crate::config;

/// Loads everything (config, shard map, TLS certificates and keys), or says precisely what is
/// wrong (file, line, reason). `workers` is the number of worker threads, each with its own
/// pools.
pub fn load(config_path: &Path, workers: usize) -> Result<Router, String> {
    let config = config::load(config_path).map_err(|e| e.to_string())?;
    let map = shardmap::load(&config.shardmap).map_err(|e| e.to_string())?;
    let tls = crate::tls::load(&config).map_err(|e| e.to_string())?;
    Ok(Router::new(config, map, tls, workers.max(1)))
}

/// Fails when something else listens on `addr` already. The router's own sockets share the
/// port (SO_REUSEPORT), and so would another process's of the same user, silently taking
/// half the clients; a plain bind first makes that an "address in use" at start. Skipped only
/// with `reuse_port = true` in the config.
fn ensure_free(addr: SocketAddr) -> std::io::Result<()> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())
}

/// One listening socket of the router's address; several may be bound at once.
fn listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Runs the router until it has drained (SIGTERM, Ctrl-C or the admin `SHUTDOWN`; see
/// [`lifecycle`]). Binds every worker's socket before it starts, so an address in use is
/// reported at once.
pub fn run(shared: Router) -> Result<(), String> {
    // The main thread's runtime, and the signal handlers, before anything else: from here on
    // a SIGHUP is a reload (queued until the router is ready), never the default "terminate".
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let signals = {
        let _in_runtime = rt.enter();
        lifecycle::Signals::install()
            .map_err(|e| format!("cannot install the signal handlers: {e}"))?
    };
    nofile::raise();
    let routing = shared.routing();
    let listen = routing.config.listen;
    let workers = shared.workers();
    let free = if routing.config.reuse_port {
        tracing::warn!(
            %listen,
            "reuse_port = true: another process may listen on this address too, and the kernel then spreads new clients over both"
        );
        Ok(())
    } else {
        ensure_free(listen)
    };
    let listeners: Vec<std::net::TcpListener> = free
        .and_then(|()| (0..workers).map(|_| listener(listen)).collect())
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let http = routing.config.http.map(http::bind).transpose()?;
    if routing.config.transactions.cross_shard == crate::config::CrossShard::TwoPhase {
        rt.block_on(recovery::check_shards(&routing))?;
    }
    rt.block_on(lookups::check_shards(&routing))?;
    let shared = Arc::new(shared);
    // Worker 0 says when it has asked a shard for what the router learns at start.
    let (warmed, warm) = std::sync::mpsc::channel();
    for (worker, std_listener) in listeners.into_iter().enumerate() {
        let shared = shared.clone();
        let warmed = (worker == 0).then(|| warmed.clone());
        std::thread::Builder::new()
            .name(format!("shardgate-{worker}"))
            .spawn(move || worker_main(worker, std_listener, shared, warmed))
            .map_err(|e| format!("cannot start worker thread {worker}: {e}"))?;
    }
    drop(warmed);
    // Clients may connect already; "ready" means a client need not wait for anything more.
    // With shards down this waits a few connect timeouts at most.
    let catalog = match warm.recv_timeout(routing.config.pool.connect_timeout * 3) {
        Ok(true) => "learned",
        _ => "not reachable yet (INSERTs without a column list wait for the next DDL)",
    };
    tracing::info!(
        %listen,
        workers,
        shards = routing.map.shards().len(),
        shardmap_version = routing.map.version(),
        database = %routing.config.database,
        http = %routing.config.http.map_or("off".to_string(), |a| a.to_string()),
        catalog,
        "shardgate is ready"
    );
    drop(routing);
    rt.block_on(async move {
        let warming = shared.clone();
        tokio::spawn(async move {
            let routing = warming.routing();
            warming.warmer.warm(&routing, false).await;
            warming.set_warmed();
        });
        tokio::spawn(probe::run(shared.clone()));
        if let Some(listener) = http {
            tokio::spawn(http::serve(listener, shared.clone()));
        }
        lifecycle::control(shared, signals).await
    });
    tracing::info!("shutting down");
    Ok(())
}

fn worker_main(
    worker: usize,
    std_listener: std::net::TcpListener,
    shared: Arc<Router>,
    warmed: Option<std::sync::mpsc::Sender<bool>>,
) {
    set_worker(worker);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(worker, "cannot start the worker's runtime: {e}");
            std::process::exit(1);
        }
    };
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(worker, "cannot use the listening socket: {e}");
                std::process::exit(1);
            }
        };
        let counted = shared.clone();
        tokio::spawn(async move { counted.stats.worker().await });
        let warming = shared.clone();
        tokio::spawn(async move { warming.warmer.worker(worker).await });
        let maintained = shared.clone();
        tokio::spawn(async move {
            // Every pool of this worker within its idle limits, in the current routing.
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                maintained.routing().pools().maintain().await;
            }
        });
        if warmed.is_some() {
            // Worker 0 resolves prepared transactions left in doubt, with its own pools.
            tokio::spawn(recovery::run(shared.clone()));
            tokio::spawn(lookups::run(shared.clone()));
        }
        if let Some(warmed) = warmed {
            // Learn a real server's ParameterStatus values before the first client asks.
            let warm = shared.clone();
            tokio::spawn(async move {
                let routing = warm.routing();
                for shard in 0..routing.map.shards().len() {
                    if let Ok(conn) = routing.pools().for_shard(shard).get().await {
                        warm.learn_server_params(&conn.params);
                        break;
                    }
                }
                let learned = crate::routing::catalog::learn(&routing).await;
                let _ = warmed.send(learned);
            });
        }
        if let Err(e) = accept::serve(listener, shared).await {
            tracing::error!(worker, "listener failed: {e}");
            std::process::exit(1);
        }
        // The listener closed for the drain: sessions go on until the process exits.
        std::future::pending::<()>().await;
    });
}
