//! Starting and running a router: load the config and shard map, then serve clients on one
//! event loop per core ([`accept`]), each client logging in ([`handshake`]) and then running
//! its session. [`Shared`] is what all sessions share; [`clients`] the table cancel requests use.
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
pub mod clients;
pub mod handshake;
mod shared;

pub use shared::{set_worker, Shared};

use crate::config;

/// Loads everything, or says precisely what is wrong (file, line, reason). `workers` is the
/// number of worker threads, each with its own pools.
pub fn load(config_path: &Path, workers: usize) -> Result<Shared, String> {
    let config = config::load(config_path).map_err(|e| e.to_string())?;
    let map = shardmap::load(&config.shardmap).map_err(|e| e.to_string())?;
    Ok(Shared::new(config, map, workers.max(1)))
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

/// Runs the router until SIGTERM or Ctrl-C. Binds every worker's socket before it starts, so
/// an address in use is reported at once.
pub fn run(shared: Shared) -> Result<(), String> {
    let listen = shared.config.listen;
    let workers = shared.workers();
    let listeners = (0..workers)
        .map(|_| listener(listen))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
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
    let catalog = match warm.recv_timeout(shared.config.pool.connect_timeout * 3) {
        Ok(true) => "learned",
        _ => "not reachable yet (INSERTs without a column list wait for the next DDL)",
    };
    tracing::info!(
        %listen,
        workers,
        shards = shared.map.shards().len(),
        shardmap_version = shared.map.version(),
        database = %shared.config.database,
        catalog,
        "shardgate is ready"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(shutdown_signal());
    tracing::info!("shutting down");
    Ok(())
}

fn worker_main(
    worker: usize,
    std_listener: std::net::TcpListener,
    shared: Arc<Shared>,
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
        shared.pools().spawn_maintenance();
        if let Some(warmed) = warmed {
            // Learn a real server's ParameterStatus values before the first client asks.
            let warm = shared.clone();
            tokio::spawn(async move {
                for shard in 0..warm.map.shards().len() {
                    if let Ok(conn) = warm.pools().for_shard(shard).get().await {
                        warm.learn_server_params(&conn.params);
                        break;
                    }
                }
                let learned = crate::backend::catalog::learn_key_positions(&warm).await;
                let _ = warmed.send(learned);
            });
        }
        if let Err(e) = accept::serve(listener, shared).await {
            tracing::error!(worker, "listener failed: {e}");
            std::process::exit(1);
        }
    });
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
