//! Warm start, seen from the shards: a router opens `[pool] warm_connections` per worker to
//! every primary before any client asks, says ready only after that, and a reload that brings
//! a new primary has opened its connections by the time RELOAD returns. With sharing (the
//! default), every worker opens its own shared connection to every primary instead, and the
//! first statements open none.

mod common;

use std::time::{Duration, Instant};

use common::{Env, Router, SCHEMA};

const WORKERS: usize = 2;

/// Sharing off: only pooled connections, `warm` per worker and primary.
fn config(warm: usize) -> String {
    config_with(&format!(
        "warm_connections = {warm}\nshared_connections = 0\n"
    ))
}

fn config_with(pool: &str) -> String {
    format!(
        "[[users]]\nname = \"ops\"\npassword = \"ops-secret\"\nadmin = true\n\
         [pool]\nmax_size = 4\n{pool}connect_timeout_ms = 5000\ncheckout_timeout_ms = 5000\n\
         [http]\nlisten = \"127.0.0.1:{}\"\n",
        common::free_port()
    )
}

/// The router's backend connections to a database of `server`, idle or busy (the one that
/// learns the catalog at start may be at work; a probe's may come and go: hence "at least").
fn router_connections(env: &Env, server: usize, database: &str) -> usize {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'shardgate' \
         AND datname = '{database}' AND backend_type = 'client backend'"
    );
    env.cluster.servers()[server]
        .psql("postgres", &sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .trim()
        .parse()
        .expect("a count")
}

/// Waits up to 10 s for `want` connections to `database` (fewer is a failure at the end).
fn wait_for(env: &Env, server: usize, database: &str, want: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = router_connections(env, server, database);
        if n >= want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn http_port(router: &Router) -> u16 {
    let text = std::fs::read_to_string(router.config_path()).expect("config");
    let line = text
        .lines()
        .find(|l| l.starts_with("listen = \"127.0.0.1:") && !l.contains(&router.port.to_string()))
        .expect("the http listen line");
    line.trim_end_matches('"')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port")
}

/// `/ready`'s status once it says 200, or after 10 s.
fn ready(router: &Router) -> u16 {
    let port = http_port(router);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = common::http_get(port, "/ready");
        if got.0 == 200 || Instant::now() > deadline {
            return got.0;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn every_worker_opens_its_connections_to_every_primary_before_clients_come() {
    let env = Env::start_threads(4, 2, &config(2), WORKERS);
    assert_eq!(ready(&env.router), 200, "/ready once warmed");
    // Ready means warmed: every shard database already has 2 per worker, no client has come
    // (on demand, there would be at most the one that learned the catalog).
    for shard in env.cluster.shards() {
        let n = router_connections(&env, shard.server, &shard.database);
        assert!(
            n >= 2 * WORKERS,
            "{n} router connections to {} at ready, want {}",
            shard.database,
            2 * WORKERS
        );
    }
    let log = env.router.log_text();
    assert!(log.contains("warmed the backend pools"), "{log}");
    assert!(log.contains("failed=0"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_warms_the_primaries_it_brings_before_it_returns() {
    reload_warms(&config(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sharing_a_reload_opens_every_workers_shared_connection_to_a_new_primary() {
    // The defaults: the only connections warmed are shared ones, one per worker (the limit, 2,
    // allows one each).
    reload_warms(&config_with("")).await;
}

/// A reload that brings a new primary returns with one connection per worker open to it (of
/// the pools with `[pool] warm_connections`, or the shared ones), and statements for it run.
async fn reload_warms(config: &str) {
    let env = Env::start_threads(2, 1, config, WORKERS);
    for shard in env.cluster.shards() {
        assert!(wait_for(&env, shard.server, &shard.database, WORKERS) >= WORKERS);
    }
    // A new database takes the upper half of shard 1.
    let server = &env.cluster.servers()[0];
    server
        .create_databases(&["warm_extra".to_string()])
        .expect("new database");
    server.psql("warm_extra", SCHEMA).expect("schema");
    let range = env.map.shards()[1].range;
    let low = env.map.shards()[1].primary.url().to_string();
    let split = env
        .map
        .split_shard(&range, &low, &server.url("warm_extra"))
        .expect("split map");
    std::fs::write(env.router.dir.join("shardmap.toml"), split.to_toml()).expect("new map");
    assert_eq!(router_connections(&env, 0, "warm_extra"), 0);
    let admin = common::connect(&env.router.url_as("ops", "ops-secret", "shardgate"))
        .await
        .expect("admin console");
    admin.simple_query("RELOAD").await.expect("reload");
    // No waiting: the reload returned after the new primary's connections were open.
    let n = router_connections(&env, 0, "warm_extra");
    assert!(
        n >= WORKERS,
        "{n} connections to the new primary when RELOAD returns, want one per worker"
    );
    // And statements for it use them.
    let key = (1i64..)
        .find(|k| split.shard_for_key(&shardmap::Key::Int(*k)) == 2)
        .expect("a key of the new shard");
    let client = env.router.connect().await;
    client
        .execute("INSERT INTO kv VALUES ($1, 'x')", &[&key])
        .await
        .expect("insert on the new shard");
    let on_new = server
        .psql("warm_extra", &format!("SELECT v FROM kv WHERE id = {key}"))
        .expect("read back");
    assert_eq!(on_new.trim(), "x");
}

/// `SHOW SERVERS` of the admin console: (state, shard, worker, remote pid) of every row.
async fn servers(admin: &tokio_postgres::Client) -> Vec<[String; 4]> {
    let messages = admin
        .simple_query("SHOW SERVERS")
        .await
        .expect("SHOW SERVERS");
    messages
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                let get = |name: &str| r.get(name).unwrap_or("").to_string();
                Some([get("state"), get("shard"), get("worker"), get("remote_pid")])
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sharing_every_worker_has_its_own_shared_connection_to_every_primary_at_ready() {
    // The defaults: sharing on, no pooled connections warmed.
    let env = Env::start_threads(4, 2, &config_with(""), WORKERS);
    let router = &env.router;
    assert_eq!(tokio::task::block_in_place(|| ready(router)), 200);
    let admin = common::connect(&env.router.url_as("ops", "ops-secret", "shardgate"))
        .await
        .expect("admin console");
    let lanes = |rows: &[[String; 4]]| {
        let mut lanes: Vec<(String, String, String)> = rows
            .iter()
            .filter(|[state, ..]| state == "shared")
            .map(|[_, shard, worker, pid]| (shard.clone(), worker.clone(), pid.clone()))
            .collect();
        lanes.sort();
        lanes
    };
    let at_ready = servers(&admin).await;
    let warmed = lanes(&at_ready);
    for shard in env.map.shards() {
        let workers: Vec<&str> = warmed
            .iter()
            .filter(|(s, ..)| *s == shard.range.to_string())
            .map(|(_, w, _)| w.as_str())
            .collect();
        assert_eq!(workers, ["0", "1"], "shard {}: {at_ready:?}", shard.range);
    }
    // Pooled ones are left to transactions (at most the one that learned the catalog).
    let idle = at_ready
        .iter()
        .filter(|[state, ..]| state == "idle")
        .count();
    assert!(idle <= 1, "{at_ready:?}");
    // Clients, each with a statement for every shard: the shared connections warmed carry them
    // (at the limit, none can be added) and none is replaced.
    let mut clients = Vec::new();
    for _ in 0..2 * WORKERS {
        clients.push(env.router.connect().await);
    }
    let keys: Vec<i64> = (0..env.map.shards().len())
        .map(|s| {
            (1i64..)
                .find(|k| env.map.shard_for_key(&shardmap::Key::Int(*k)) == s)
                .expect("a key of every shard")
        })
        .collect();
    for client in &clients {
        for key in &keys {
            client
                .query("SELECT v FROM kv WHERE id = $1", &[key])
                .await
                .expect("a point select");
        }
    }
    assert_eq!(lanes(&servers(&admin).await), warmed);
}
