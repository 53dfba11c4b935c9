//! Starting a router: load the config and shard map, bind the listener, serve clients.

use std::path::Path;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config;
use crate::shared::Shared;

/// Loads everything, or says precisely what is wrong (file, line, reason).
pub fn load(config_path: &Path) -> Result<Shared, String> {
    let config = config::load(config_path).map_err(|e| e.to_string())?;
    let map = shardmap::load(&config.shardmap).map_err(|e| e.to_string())?;
    Ok(Shared::new(config, map))
}

/// Runs the router until the process is stopped.
pub async fn run(shared: Shared) -> Result<(), String> {
    let listen = shared.config.listen;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let shared = Arc::new(shared);
    tracing::info!(
        %listen,
        shards = shared.map.shards().len(),
        shardmap_version = shared.map.version(),
        database = %shared.config.database,
        "shardgate is ready"
    );
    shared.pools.spawn_maintenance();
    // Learn a real server's ParameterStatus values before the first client asks.
    let warm = shared.clone();
    tokio::spawn(async move {
        for shard in 0..warm.map.shards().len() {
            if let Ok(conn) = warm.pools.for_shard(shard).get().await {
                warm.learn_server_params(&conn.params);
                break;
            }
        }
    });
    crate::frontend::serve(listener, shared)
        .await
        .map_err(|e| format!("listener failed: {e}"))
}
