//! `cluster down`: stop the router, then every server the state file lists (spares too), and
//! delete the data.

use std::process::ExitCode;

use pgharness::Server;

use crate::router;
use crate::state::{ClusterState, ServerState};
use crate::{DirArgs, Result};

/// Runs `cluster down`.
pub fn run(args: &DirArgs) -> Result<ExitCode> {
    let dir = args.resolve()?;
    match ClusterState::load(&dir)? {
        None => println!(
            "no cluster in {} (no {}); nothing to stop",
            dir.display(),
            ClusterState::path(&dir).display()
        ),
        Some(state) => {
            teardown(&state)?;
            println!("cluster in {} is down", dir.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Stops the router and deletes every server of `state` (shard servers and spares), then the
/// shard map, the router config and the state file. The router log stays, for a look at what
/// happened.
pub fn teardown(state: &ClusterState) -> Result<()> {
    // The routers first: stopped after the servers they would log every connection failing.
    for r in state.routers() {
        println!("{}", router::stop(r)?);
    }
    // One thread per server: deleting a server's databases is I/O bound.
    let outcomes: Vec<std::result::Result<String, String>> = std::thread::scope(|scope| {
        let servers = state
            .servers
            .iter()
            .map(|s| (s, format!("server {}", s.index)));
        let spares = state
            .spares
            .iter()
            .map(|s| (&s.server, format!("spare server {}", s.server.index)));
        let handles: Vec<_> = servers
            .chain(spares)
            .map(|(s, what)| scope.spawn(move || teardown_server(s, &what)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a teardown thread panicked".into()))
            })
            .collect()
    });
    let mut failures = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(message) => println!("{message}"),
            Err(e) => failures.push(e),
        }
    }
    if !failures.is_empty() {
        return Err(format!(
            "could not stop everything (state file kept):\n  {}",
            failures.join("\n  ")
        )
        .into());
    }
    if state.data_root_external {
        let _ = std::fs::remove_dir(&state.data_root);
    }
    crate::tls::remove(&state.dir)?;
    let routers = state.routers_wanted.max(1 + state.more_routers.len());
    let router_configs = (1..=routers).map(|k| state.dir.join(crate::state::router_files(k).0));
    let files: Vec<std::path::PathBuf> = [state.shardmap.clone(), ClusterState::path(&state.dir)]
        .into_iter()
        .chain(router_configs)
        .collect();
    for path in &files {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("removing {}: {e}", path.display()).into()),
        }
    }
    Ok(())
}

/// Stops and deletes one server (`what`: "server 0", "spare server 1"); returns what was done.
fn teardown_server(s: &ServerState, what: &str) -> std::result::Result<String, String> {
    if !s.dir.exists() {
        return Ok(format!("{what} (port {}): nothing there any more", s.port));
    }
    match Server::attach(&s.dir) {
        Ok(server) => {
            let pid = server.pid();
            server
                .remove()
                .map_err(|e| format!("{what} (port {}): {e}", s.port))?;
            Ok(match pid {
                Some(pid) => format!(
                    "stopped {what} (port {}, pid {pid}), removed {}",
                    s.port,
                    s.dir.display()
                ),
                None => format!(
                    "{what} (port {}) was not running; removed {}",
                    s.port,
                    s.dir.display()
                ),
            })
        }
        // Never initialised (an interrupted `up`): just delete what is there.
        Err(_) => match std::fs::remove_dir_all(&s.dir) {
            Ok(()) => Ok(format!(
                "{what} (port {}) was never started; removed {}",
                s.port,
                s.dir.display()
            )),
            Err(e) => Err(format!("removing {}: {e}", s.dir.display())),
        },
    }
}
