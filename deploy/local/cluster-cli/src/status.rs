//! `cluster status`: whether the router, the servers and the spare servers accept connections,
//! how many shards there are, and the spares' URLs.

use std::process::ExitCode;

use pgharness::{Readiness, Server};

use crate::router;
use crate::state::{ClusterState, Phase, RouterState, ServerState};
use crate::{DirArgs, Result};

/// Runs `cluster status`. Exits 1 when the router or a listed server (spares too) does not
/// accept connections.
pub fn run(args: &DirArgs) -> Result<ExitCode> {
    let dir = args.resolve()?;
    let Some(state) = ClusterState::load(&dir)? else {
        println!(
            "no cluster in {} (start one with `deploy/local/cluster up --shards N`)",
            dir.display()
        );
        return Ok(ExitCode::SUCCESS);
    };
    let phase = match state.phase {
        Phase::Up => "up",
        Phase::Starting => "starting (or an interrupted `up`: run `cluster down`)",
    };
    println!("cluster in {}: {phase}", dir.display());
    let mut all_ok = true;
    match &state.router {
        Some(r) => all_ok &= show_router(r),
        None if state.router_wanted => {
            all_ok = false;
            println!(
                "  router    none: its start failed (see {}); `cluster up` tries again",
                dir.join("router.log").display()
            );
        }
        None => println!("  router    none (started with --no-router)"),
    }
    for r in &state.more_routers {
        all_ok &= show_router(r);
    }
    let started = state.routers().count();
    if state.router_wanted && started < state.routers_wanted {
        all_ok = false;
        println!(
            "  routers   {started} of {} started; `cluster up` starts the others",
            state.routers_wanted
        );
    }
    for s in &state.servers {
        let (readiness, pid) = probe(s);
        all_ok &= readiness == Readiness::Accepting;
        let shards = state.shards.iter().filter(|d| d.server == s.index).count();
        println!(
            "  server {}  127.0.0.1:{}  pid {:<8} {:<22} {} shards  data {}",
            s.index,
            s.port,
            pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            readiness.to_string(),
            shards,
            s.data_dir.display()
        );
    }
    // A spare a split has made a shard shows up in the shard map.
    let shardmap = std::fs::read_to_string(&state.shardmap).unwrap_or_default();
    for sp in &state.spares {
        let s = &sp.server;
        let (readiness, pid) = probe(s);
        all_ok &= readiness == Readiness::Accepting;
        let in_map = shardmap.contains(&format!(":{}/{}", s.port, sp.database));
        println!(
            "  spare {}   127.0.0.1:{}  pid {:<8} {:<22} database {} ({})  data {}",
            s.index,
            s.port,
            pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            readiness.to_string(),
            sp.database,
            if in_map {
                "in the shard map"
            } else {
                "not in the shard map"
            },
            s.data_dir.display()
        );
        if readiness == Readiness::NoResponse {
            println!("            (`cluster up` starts it again)");
        }
    }
    println!(
        "  {} shards, shard map {}",
        state.shard_count,
        state.shardmap.display()
    );
    if !state.spares.is_empty() {
        println!(
            "  {} spare servers, to split shards into:",
            state.spares.len()
        );
        for sp in &state.spares {
            println!("    {}", sp.url);
        }
    }
    if !state.wal_level_logical() {
        println!(
            "  note: the shard servers run without wal_level = logical (the cluster was made before `up` set it), which a shard split needs on its source shard; `cluster down` and `up` again to get it"
        );
    }
    if let Some(r) = &state.router {
        println!("connect:  psql {}", r.url);
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Whether a server accepts connections, and its postmaster's pid.
fn probe(s: &ServerState) -> (Readiness, Option<u32>) {
    match Server::attach(&s.dir) {
        Ok(server) => (server.readiness(), server.pid()),
        Err(_) => (Readiness::NoResponse, None),
    }
}

/// One router's line; whether it accepts connections.
fn show_router(r: &RouterState) -> bool {
    let running = router::is_running(r);
    let accepting = running && router::probe(r.port);
    let how = match (running, accepting) {
        (true, true) => "accepting connections",
        (true, false) => "running, not accepting",
        (false, _) => "not running",
    };
    println!(
        "  router    127.0.0.1:{}  pid {:<8} {how:<22} log {}",
        r.port,
        if running {
            r.pid.to_string()
        } else {
            "-".into()
        },
        r.log_file.display()
    );
    if !running {
        println!("            (`cluster up` starts it again)");
    }
    accepting
}
