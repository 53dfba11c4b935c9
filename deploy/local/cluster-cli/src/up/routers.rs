//! The routers' part of `cluster up`: starting every router a cluster wants (first start, or
//! again as it was recorded), checking a router's port, and keeping the routers of a cluster
//! that is already up running. Works on the same [`Up`] context as the other steps.

use std::process::ExitCode;

use super::{print_urls, Up};
use crate::router;
use crate::state::ClusterState;
use crate::Result;

/// `up` on a cluster whose shard servers all run: start the spare servers that stopped and add
/// those `--spare` asks for beyond the cluster's ([`super::spares::keep_spares`]), start the
/// router if it is wanted and not running (it crashed, was killed, or the cluster was made with
/// `--no-router`), change nothing else. A `--http-port` the router would not serve is refused
/// before anything starts ([`check_http_port`]).
pub(super) fn keep_running(up: &mut Up) -> Result<ExitCode> {
    check_http_port(up)?;
    let state = up.state.as_ref().ok_or("internal error: no state")?;
    if up.tls != state.tls {
        println!(
            "note: the cluster was made {} --tls; that was not changed",
            if state.tls { "with" } else { "without" }
        );
    }
    // The router keeps the TLS setting the cluster was made with.
    let tls = state.tls;
    if let Some(r) = up.router.as_mut() {
        r.tls = tls;
    }
    up.tls = tls;
    let state = up.state.as_ref().ok_or("internal error: no state")?;
    println!(
        "cluster in {} is already up: {} servers, {} shards (`cluster down` first to start a different one)",
        up.dir.display(),
        state.servers.len(),
        state.shard_count
    );
    if up.layout_given && (state.shard_count != up.shards || state.servers.len() != up.servers) {
        println!(
            "note: you asked for {} shards on {} servers; the servers were not changed",
            up.shards, up.servers
        );
    }
    // The spares before the routers: a router that fails to start leaves them running.
    super::spares::keep_spares(up)?;
    let state = up.state.as_ref().ok_or("internal error: no state")?;
    match (&state.router, &up.router) {
        (Some(running), wanted) if router::is_running(running) => {
            if wanted.as_ref().is_some_and(|w| w.port != running.port) {
                println!(
                    "note: the router already listens on port {}; it was not moved",
                    running.port
                );
            }
            println!("  router pid {} on 127.0.0.1:{}", running.pid, running.port);
            println!("connect:  psql {}", running.url);
            print_urls(up, running);
        }
        (_, None) => println!("  no router (--no-router)"),
        (previous, Some(wanted)) => {
            match previous {
                Some(old) => println!(
                    "the router (pid {}) is not running any more (see {}); starting a new one",
                    old.pid,
                    old.log_file.display()
                ),
                None => println!("the cluster has no router; starting one"),
            }
            check_router_port(previous.as_ref().map_or(wanted.port, |p| p.port), &[])?;
            let routers = up.routers;
            let state = up.state.as_mut().ok_or("internal error: no state")?;
            if !state.router_wanted {
                // Made with --no-router: the routers asked for now are the cluster's.
                state.routers_wanted = routers;
                println!(
                    "note: the servers were started without a router; their max_connections was not raised for {routers} router(s)"
                );
            }
            start_router(up)?;
            if let Some(r) = up.state.as_ref().and_then(|s| s.router.as_ref()) {
                println!("  router pid {} on 127.0.0.1:{}", r.pid, r.port);
                println!("connect:  psql {}", r.url);
                print_urls(up, r);
            }
        }
    }
    keep_more_routers(up)?;
    Ok(ExitCode::SUCCESS)
}

/// `up --http-port P` on a running cluster: a router that ran before (running now or not) keeps
/// the config it was started with, HTTP port included, so a P it does not serve is an error
/// rather than ignored (nothing would listen on P). A cluster that has no router yet (made with
/// `--no-router`) gets one with P.
fn check_http_port(up: &Up) -> Result<()> {
    let Some(wanted) = up.router.as_ref().and_then(|r| r.http_port) else {
        return Ok(());
    };
    let state = up.state.as_ref().ok_or("internal error: no state")?;
    // A router whose config is gone starts afresh, with this invocation's options.
    let Some(r) = state.router.as_ref().filter(|r| r.config.is_file()) else {
        return Ok(());
    };
    let has = router::configured_http_port(&r.config)?;
    if has == Some(wanted) {
        return Ok(());
    }
    let runs = if router::is_running(r) {
        "runs"
    } else {
        "was started"
    };
    let serves = match has {
        Some(p) => format!("with its HTTP port on 127.0.0.1:{p}"),
        None => "without an HTTP port".into(),
    };
    Err(format!(
        "--http-port {wanted}: the cluster in {} is already up, and its router {runs} {serves} ({}); \
         `up` leaves a running cluster as it is, so nothing would listen on port {wanted}.\n\
         Run `cluster down` first (it deletes the cluster's data), then `cluster up --http-port {wanted}`",
        up.dir.display(),
        r.config.display()
    )
    .into())
}

/// The routers after the first on a running cluster: start those that stopped, as many as the
/// cluster was made with (a different `--routers` now changes nothing).
pub(super) fn keep_more_routers(up: &mut Up) -> Result<()> {
    let state = up.state.as_ref().ok_or("internal error: no state")?;
    let wanted = state.routers_wanted;
    if up.router.is_some() && up.routers != wanted.max(1) {
        println!("note: the cluster was made with {wanted} routers; that was not changed");
    }
    if up.router.is_none() || wanted <= 1 {
        return Ok(());
    }
    let running = |k: usize| state.recorded_router(k).is_some_and(router::is_running);
    let missing = (2..=wanted).filter(|k| !running(*k)).count();
    if missing > 0 {
        println!("{missing} of routers 2 to {wanted} are not running; starting them");
        start_router(up)?;
    }
    let state = up.state.as_ref().ok_or("internal error: no state")?;
    for r in &state.more_routers {
        println!("  router pid {} on 127.0.0.1:{}", r.pid, r.port);
    }
    print_loadgen_targets(state);
    Ok(())
}

/// The router's port must be free and not one the servers will take.
pub(super) fn check_router_port(port: u16, server_ports: &[u16]) -> Result<()> {
    if server_ports.contains(&port) {
        return Err(format!(
            "--router-port {port} is also the port of a PostgreSQL server; pick another --router-port or --base-port"
        )
        .into());
    }
    if pgharness::check_port_free(port).is_err() {
        return Err(format!(
            "port {port} (for the router) is already in use on 127.0.0.1; stop what listens there, pick another --router-port, or pass --no-router"
        )
        .into());
    }
    Ok(())
}

/// Step 9: for every router that is wanted and not running, write its config, start
/// `shardgate` detached, wait until it accepts connections, and record it in the state file.
/// Skipped with `--no-router`.
pub(super) fn start_router(up: &mut Up) -> Result<()> {
    let Some(first) = up.router.clone() else {
        return Ok(());
    };
    let state = up.state.as_mut().ok_or("internal error: no state")?;
    state.router_wanted = true;
    let wanted = state.routers_wanted.max(1);
    // Routers of a running cluster count from the first one's recorded port, not from this
    // invocation's --router-port.
    let mut first = first;
    if let Some(r) = &state.router {
        first.port = r.port;
    }
    for k in 1..=wanted {
        let recorded = state.recorded_router(k).cloned();
        if recorded.as_ref().is_some_and(router::is_running) {
            continue;
        }
        let started = match recorded.filter(|r| r.config.is_file()) {
            // A router that ran before starts again as it was: same config, port, users.
            Some(old) => router::find_binary().and_then(|bin| {
                println!(
                    "starting router {k} of {wanted} again: {} --config {} on 127.0.0.1:{}...",
                    bin.display(),
                    old.config.display(),
                    old.port
                );
                router::restart(&bin, &old)
            }),
            None => first.for_router(k).and_then(|opts| {
                let bin = router::find_binary()?;
                let config = router::write_config(&up.dir, &opts)?;
                println!(
                    "starting router {k} of {wanted}: {} --config {} on 127.0.0.1:{}...",
                    bin.display(),
                    config.display(),
                    opts.port
                );
                router::start(&bin, &up.dir, &config, &opts)
            }),
        };
        match started {
            Ok(r) => state.set_router(k, Some(r)),
            Err(e) => {
                state.set_router(k, None);
                state.save()?;
                return Err(format!(
                    "{e}\nthe PostgreSQL servers are still up: `cluster up` again retries the router, `cluster down` stops everything"
                )
                .into());
            }
        }
        state.save()?;
    }
    Ok(())
}

/// With several routers, the `--target`s that spread loadgen over all of them.
pub(super) fn print_loadgen_targets(state: &ClusterState) {
    if state.more_routers.is_empty() {
        return;
    }
    let targets: Vec<String> = state
        .routers()
        .map(|r| format!("--target {}", r.url))
        .collect();
    println!("all routers (for loadgen): {}", targets.join(" "));
}
