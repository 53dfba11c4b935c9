//! The spare servers of `cluster up --spare N`: empty PostgreSQL servers beside the shard
//! servers, not in the shard map, for online shard splits to copy into. Each holds one empty
//! database (no schema: a split copies the schema itself) named like the shard that would come
//! next. Spare `j` listens on `--base-port + K + j` (right after the K shard servers) and lives in
//! `DATA/spare-J/`. They start with the shard servers; a later `up` starts a stopped one again
//! (its data kept) and adds spares when asked for more than the cluster has (it never removes
//! one); `status` lists them and `down` removes them with the rest.

use std::path::{Path, PathBuf};

use pgharness::tls::Issued;
use pgharness::{Readiness, Server, ServerOptions};

use super::{Up, SHARD_DATABASE_PREFIX};
use crate::state::{ClusterState, ServerState, SpareState};
use crate::Result;

/// The database of spare `j` in a cluster of `shards` shard databases: the name shard
/// `shards + j` would get (`shard_002` and `shard_003` beside `shard_000` and `shard_001`),
/// zero-padded like the shards' names.
pub fn database_name(shards: usize, j: usize) -> String {
    let width = pgharness::shard_database_names(SHARD_DATABASE_PREFIX, shards.max(1))
        .last()
        .map_or(3, |n| n.len() - SHARD_DATABASE_PREFIX.len());
    format!("{SHARD_DATABASE_PREFIX}{:0width$}", shards + j)
}

/// `postgres://postgres:postgres@127.0.0.1:PORT/DATABASE`, what [`Server::url`] gives once it
/// runs.
fn url(port: u16, database: &str) -> String {
    format!(
        "postgres://{}:{}@{}:{port}/{database}",
        pgharness::SUPERUSER,
        pgharness::PASSWORD,
        pgharness::HOST
    )
}

/// The port of spare `j` after `servers` shard servers from `base_port`.
pub(super) fn port(base_port: u16, servers: usize, j: usize) -> Result<u16> {
    u16::try_from(usize::from(base_port) + servers + j).map_err(|_| {
        format!(
            "base port {base_port} leaves no room for {servers} servers and spare server {j} (ports go up to 65535)"
        )
        .into()
    })
}

/// Spare `j` as planned: where it goes, not started yet (no pid).
pub(super) fn planned(
    data_root: &Path,
    base_port: u16,
    servers: usize,
    shards: usize,
    j: usize,
) -> Result<SpareState> {
    let port = port(base_port, servers, j)?;
    let dir = data_root.join(format!("spare-{j}"));
    let database = database_name(shards, j);
    Ok(SpareState {
        server: ServerState {
            index: j,
            port,
            data_dir: dir.join("data"),
            socket_dir: dir.join("sock"),
            log_file: dir.join("postgres.log"),
            dir,
            pid: None,
        },
        url: url(port, &database),
        database,
    })
}

/// The error of a spare's port that is taken.
pub(super) fn port_taken(j: usize, port: u16) -> Box<dyn std::error::Error> {
    format!(
        "port {port} (for spare server {j}) is already in use on 127.0.0.1; spare servers listen right after the shard servers (--base-port + K + j), so stop what listens there or pick another --base-port"
    )
    .into()
}

/// Starts the planned spares in parallel and creates each one's database. All or nothing: when
/// one fails, those that started are removed again.
pub(super) fn start_all(
    planned: &[SpareState],
    opts: &ServerOptions,
) -> std::result::Result<Vec<SpareState>, String> {
    let outcomes: Vec<std::result::Result<(SpareState, Server), String>> =
        std::thread::scope(|scope| {
            let handles: Vec<_> = planned
                .iter()
                .map(|p| scope.spawn(move || start_one(p, opts)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a thread starting a spare server panicked".into()))
                })
                .collect()
        });
    let mut started = Vec::new();
    let mut first_error = None;
    for outcome in outcomes {
        match outcome {
            Ok(pair) => started.push(pair),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        for (_, server) in started {
            let _ = server.remove();
        }
        return Err(e);
    }
    Ok(started.into_iter().map(|(state, _)| state).collect())
}

/// Starts one spare and creates its empty database (no schema).
fn start_one(
    planned: &SpareState,
    opts: &ServerOptions,
) -> std::result::Result<(SpareState, Server), String> {
    let j = planned.server.index;
    let what = format!("spare server {j} (port {})", planned.server.port);
    let server = Server::start(&ServerOptions {
        port: Some(planned.server.port),
        dir: Some(planned.server.dir.clone()),
        ..opts.clone()
    })
    .map_err(|e| format!("starting {what}: {e}"))?;
    if let Err(e) = server.create_databases(std::slice::from_ref(&planned.database)) {
        let _ = server.remove();
        return Err(format!(
            "{what}: creating database {}: {e}",
            planned.database
        ));
    }
    let state = SpareState {
        server: ServerState {
            index: j,
            port: server.port(),
            dir: server.dir().to_path_buf(),
            data_dir: server.data_dir().to_path_buf(),
            socket_dir: server.socket_dir().to_path_buf(),
            log_file: server.log_file().to_path_buf(),
            pid: server.pid(),
        },
        database: planned.database.clone(),
        url: server.url(&planned.database),
    };
    Ok((state, server))
}

/// `up` on a cluster whose shard servers all run: start the spares that stopped (their data
/// kept), make those whose directory is gone again (empty), and add spares when `--spare` asks
/// for more than the cluster has.
pub(super) fn keep_spares(up: &mut Up) -> Result<()> {
    let state = up.state.as_mut().ok_or("internal error: no state")?;
    for j in 0..state.spares.len() {
        match restart_if_stopped(&mut state.spares[j])? {
            Kept::Running => {}
            Kept::Restarted => state.save()?,
            Kept::Gone => {
                let mut again = state.spares[j].clone();
                again.server.pid = None;
                if pgharness::check_port_free(again.server.port).is_err() {
                    return Err(port_taken(j, again.server.port));
                }
                let opts = options_for(&up.server_options, state)?;
                let started = start_all(std::slice::from_ref(&again), &opts)?;
                state.spares[j] = started
                    .into_iter()
                    .next()
                    .ok_or("internal error: a spare server started without a state")?;
                state.save()?;
            }
        }
    }
    let have = state.spares.len();
    if up.spares > have {
        add(up, have)?;
    } else if up.spares > 0 && up.spares < have {
        println!(
            "note: the cluster has {have} spare servers; --spare {} removes none (`cluster down` removes them all)",
            up.spares
        );
    }
    let state = up.state.as_ref().ok_or("internal error: no state")?;
    print_servers(state);
    print_urls(state);
    Ok(())
}

/// What [`restart_if_stopped`] found.
enum Kept {
    /// The spare runs (or at least its postmaster does).
    Running,
    /// It had stopped and was started again.
    Restarted,
    /// Its directory is gone (deleted, or an interrupted `up` never made it): make it again.
    Gone,
}

/// Starts a spare of a running cluster again when its postmaster is gone.
fn restart_if_stopped(spare: &mut SpareState) -> Result<Kept> {
    let s = &spare.server;
    let what = format!("spare server {} (port {})", s.index, s.port);
    let mut server = match Server::attach(&s.dir) {
        Ok(server) => server,
        Err(_) if s.dir.exists() => {
            return Err(format!(
                "{what}: {} is not a server directory ({} is missing); remove it and run `cluster up` again to make the spare anew, or `cluster down`",
                s.dir.display(),
                pgharness::INFO_FILE
            )
            .into())
        }
        Err(_) => {
            println!(
                "{what}: its directory {} is not there; making it again, with an empty {}...",
                s.dir.display(),
                spare.database
            );
            return Ok(Kept::Gone);
        }
    };
    if server.is_running() {
        if server.readiness() != Readiness::Accepting {
            println!(
                "note: {what} runs but does not accept connections; see {}",
                s.log_file.display()
            );
        }
        return Ok(Kept::Running);
    }
    if pgharness::check_port_free(s.port).is_err() {
        return Err(format!(
            "{what} is not running, and something else listens on its port now; stop that and run `cluster up` again"
        )
        .into());
    }
    println!("{what} is not running; starting it again (its data is kept)...");
    server
        .restart()
        .map_err(|e| format!("starting {what} again: {e}"))?;
    spare.server.pid = server.pid();
    Ok(Kept::Restarted)
}

/// The options of a spare made for a running cluster: this `up`'s, with the TLS certificate of
/// the cluster's servers when it was made with `--tls`.
fn options_for(opts: &ServerOptions, state: &ClusterState) -> Result<ServerOptions> {
    let mut opts = opts.clone();
    if state.tls {
        let first = state
            .servers
            .first()
            .ok_or("the cluster state lists no servers")?;
        opts.tls = Some(server_certificate(&first.data_dir)?);
    }
    Ok(opts)
}

/// Adds spares `have ..` to a running cluster, on the ports after the ones it has.
fn add(up: &mut Up, have: usize) -> Result<()> {
    let state = up.state.as_mut().ok_or("internal error: no state")?;
    let base_port = state
        .servers
        .first()
        .ok_or("the cluster state lists no servers")?
        .port;
    let opts = options_for(&up.server_options, state)?;
    let router_ports: Vec<u16> = state.routers().map(|r| r.port).collect();
    let mut planned_spares = Vec::new();
    for j in have..up.spares {
        let p = planned(
            &state.data_root,
            base_port,
            state.servers.len(),
            state.shard_count,
            j,
        )?;
        let port = p.server.port;
        if router_ports.contains(&port) {
            return Err(format!(
                "spare server {j} would listen on port {port}, the port of a router of this cluster; `cluster down` and `up` again with ports that do not overlap"
            )
            .into());
        }
        if pgharness::check_port_free(port).is_err() {
            return Err(port_taken(j, port));
        }
        if p.server.dir.exists() {
            return Err(format!(
                "{} is in the way of spare server {j}; remove it, or `cluster down` first",
                p.server.dir.display()
            )
            .into());
        }
        planned_spares.push(p);
    }
    if let (Some(first), Some(last)) = (planned_spares.first(), planned_spares.last()) {
        let (a, b) = (&first.server, &last.server);
        if a.index == b.index {
            println!("adding spare server {} on port {}...", a.index, a.port);
        } else {
            println!(
                "adding spare servers {}-{} on ports {}-{}...",
                a.index, b.index, a.port, b.port
            );
        }
    }
    // Recorded before they start, so `down` cleans up after an interrupted `up`.
    state.spares.extend(planned_spares.iter().cloned());
    state.save()?;
    match start_all(&planned_spares, &opts) {
        Ok(started) => {
            state.spares.truncate(have);
            state.spares.extend(started);
            state.save()
        }
        Err(e) => {
            state.spares.truncate(have);
            state.save()?;
            Err(e.into())
        }
    }
}

/// The certificate and key of a TLS cluster's servers (all have the same one), for a spare
/// added later: the cluster's CA key is not kept, so no new certificate can be issued.
fn server_certificate(data_dir: &Path) -> Result<Issued> {
    let read = |name: &str| -> Result<String> {
        let path: PathBuf = data_dir.join(name);
        std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "reading {} for a new spare server of this --tls cluster: {e}",
                path.display()
            )
            .into()
        })
    };
    Ok(Issued {
        cert_pem: read("server.crt")?,
        key_pem: read("server.key")?,
    })
}

/// The spares' lines of `up`'s summary, after the shard servers': port, pid, database.
pub(super) fn print_servers(state: &ClusterState) {
    for sp in &state.spares {
        let s = &sp.server;
        println!(
            "  spare  127.0.0.1:{}  pid {}  database {} (no schema, not in the shard map)  data {}",
            s.port,
            s.pid.map_or_else(|| "?".into(), |p| p.to_string()),
            sp.database,
            s.data_dir.display()
        );
    }
}

/// The spares' URLs, e.g. for `shardgate reshard plan --into URL`.
pub(super) fn print_urls(state: &ClusterState) {
    for sp in &state.spares {
        println!("spare:      {}", sp.url);
    }
}

#[cfg(test)]
mod tests {
    use super::database_name;

    #[test]
    fn spare_databases_continue_the_shard_names() {
        assert_eq!(database_name(2, 0), "shard_002");
        assert_eq!(database_name(2, 1), "shard_003");
        assert_eq!(database_name(1000, 0), "shard_1000");
        assert_eq!(database_name(999, 1), "shard_1000");
        assert_eq!(database_name(1001, 0), "shard_1001");
        assert_eq!(database_name(4096, 3), "shard_4099");
        // As pgharness names the shards: the spare gets what one more shard would be called.
        let names = pgharness::shard_database_names("shard_", 5);
        assert_eq!(database_name(4, 0), names[4]);
    }
}
