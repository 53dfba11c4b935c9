//! Two-phase commit across shards (`[transactions] cross_shard = "two_phase"`), against a real
//! 4-shard cluster on 2 servers: money moved between accounts on every shard by concurrent
//! transactions keeps its total exact, also while the router is killed (SIGKILL) and restarted
//! again and again; a router stopped between PREPARE and the decision, or right after it,
//! leaves transactions that recovery rolls back or commits as decided (also for a write on
//! several shards outside a transaction); no prepared transaction
//! stays behind; a router refuses two-phase mode when a shard does not allow prepared
//! transactions; several routers started at the same instant on fresh shards all start.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{connect, Env, Router, DATABASE, PASSWORD, USER};

const TWO_PHASE: &str = "[transactions]\ncross_shard = \"two_phase\"\nrecovery_interval_ms = 300\nrecovery_grace_ms = 1000\nlock_timeout_ms = 1000\n[pool]\ncheckout_timeout_ms = 3000\nconnect_timeout_ms = 1000\n";

/// [`TWO_PHASE`] with more `[transactions]` settings.
fn two_phase_with(more: &str) -> String {
    TWO_PHASE.replace("[pool]", &format!("{more}[pool]"))
}

const ACCOUNTS: i64 = 40;
const OPENING: i64 = 1000;

fn env() -> &'static Env {
    static ENV: std::sync::OnceLock<Env> = std::sync::OnceLock::new();
    ENV.get_or_init(|| Env::start_with(4, 2, TWO_PHASE))
}

/// Account `i`'s key (kv, balance in v), spread over every shard.
fn account(env: &Env, base: i64, i: i64) -> i64 {
    env.key_on((i % 4) as usize, base + i * 1000)
}

fn open_accounts(env: &Env, base: i64) -> Vec<i64> {
    let keys: Vec<i64> = (0..ACCOUNTS).map(|i| account(env, base, i)).collect();
    for key in &keys {
        env.on_shard(
            env.shard_of(*key),
            &format!("INSERT INTO kv (id, v) VALUES ({key}, '{OPENING}')"),
        );
    }
    keys
}

/// The sum of the balances, read on the shards directly.
fn total(env: &Env, keys: &[i64]) -> i64 {
    let list = keys
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    (0..4)
        .map(|s| {
            let out = env.on_shard(
                s,
                &format!("SELECT coalesce(sum(v::bigint), 0) FROM kv WHERE id IN ({list})"),
            );
            out.trim().parse::<i64>().expect("a sum")
        })
        .sum()
}

/// Prepared transactions on every server of the cluster (each shard's database).
fn prepared(env: &Env) -> Vec<String> {
    (0..4)
        .flat_map(|s| {
            env.on_shard(
                s,
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()",
            )
            .lines()
            .map(str::to_string)
            .filter(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
        })
        .collect()
}

/// Waits until recovery has resolved every prepared transaction.
fn until_none_prepared(env: &Env, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let left = prepared(env);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "prepared transactions left behind: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Eight clients moving money between random accounts until `stop`, reconnecting whenever the
/// router goes away; the number of transfers the router said it committed.
async fn transfers(url: String, keys: Arc<Vec<i64>>, stop: Arc<AtomicBool>) -> u64 {
    let committed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..8u64 {
        let (url, keys, stop, committed) =
            (url.clone(), keys.clone(), stop.clone(), committed.clone());
        tasks.push(tokio::spawn(async move {
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (c + 1);
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            let mut client = None;
            while !stop.load(Ordering::Relaxed) {
                if client
                    .as_ref()
                    .is_none_or(|c: &tokio_postgres::Client| c.is_closed())
                {
                    client = connect(&url).await.ok();
                    if client.is_none() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
                let Some(db) = client.as_ref() else { continue };
                let a = keys[(next() % keys.len() as u64) as usize];
                let mut b = keys[(next() % keys.len() as u64) as usize];
                if a == b {
                    b = keys[((keys.iter().position(|k| *k == a).unwrap_or(0)) + 1) % keys.len()];
                }
                let amount = (next() % 10 + 1) as i64;
                let script = format!(
                    "BEGIN; UPDATE kv SET v = (v::bigint - {amount})::text WHERE id = {a}; \
                     UPDATE kv SET v = (v::bigint + {amount})::text WHERE id = {b}; COMMIT"
                );
                // Statements one by one: each goes to its own key's shard.
                let mut ok = true;
                for sql in script.split("; ") {
                    if db.simple_query(sql).await.is_err() {
                        ok = false;
                        break;
                    }
                }
                if ok {
                    committed.fetch_add(1, Ordering::Relaxed);
                } else {
                    let _ = db.simple_query("ROLLBACK").await;
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    committed.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_keep_the_total_exact_while_the_router_is_killed_and_restarted() {
    let env = env();
    let keys = Arc::new(open_accounts(env, 81_000_000));
    let want = ACCOUNTS * OPENING;

    // Without faults first.
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(transfers(env.router.url(), keys.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::Relaxed);
    let committed = load.await.expect("load");
    assert!(committed > 50, "only {committed} transfers committed");
    until_none_prepared(env, Duration::from_secs(20));
    assert_eq!(total(env, &keys), want, "after {committed} transfers");

    // Now with a router that is killed with SIGKILL every few seconds and started again on the
    // same port, in the middle of whatever it was committing.
    let port = common::free_port();
    let mut router = Some(Router::start_at(&env.map, TWO_PHASE, 2, port));
    let url = router.as_ref().map(Router::url).expect("url");
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(transfers(url, keys.clone(), stop.clone()));
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        if let Some(r) = router.take() {
            r.signal(libc::SIGKILL);
            let _ = r.wait_exit(Duration::from_secs(10));
        }
        router = Some(Router::start_at(&env.map, TWO_PHASE, 2, port));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let committed = load.await.expect("load");
    assert!(committed > 20, "only {committed} transfers committed");
    // The restarted router's recovery resolves whatever the killed ones left prepared.
    until_none_prepared(env, Duration::from_secs(30));
    assert_eq!(
        total(env, &keys),
        want,
        "after {committed} transfers and 5 kills"
    );
}

/// A router that stops after PREPARE (nothing decided) leaves transactions recovery rolls back;
/// one that stops right after the decision leaves transactions recovery commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_finishes_what_a_stopped_router_decided() {
    let env = env();
    for (fault, commits, base) in [
        ("after_prepare", false, 82_000_000),
        ("after_decision", true, 83_000_000),
    ] {
        let (a, b) = (env.key_on(0, base), env.key_on(3, base));
        let faulty = Router::start_with(
            &env.map,
            &two_phase_with(&format!("test_fault = \"{fault}\"\n")),
        );
        let client = faulty.connect().await;
        client.simple_query("BEGIN").await.expect("begin");
        for k in [a, b] {
            client
                .simple_query(&format!("INSERT INTO kv (id, v) VALUES ({k}, '{fault}')"))
                .await
                .expect("insert");
        }
        client
            .simple_query("COMMIT")
            .await
            .expect_err("the router stops during the COMMIT");
        assert!(
            faulty.wait_exit(Duration::from_secs(10)).is_some(),
            "the router stopped ({fault})"
        );
        let left = prepared(env);
        assert!(!left.is_empty(), "{fault}: something is left prepared");
        assert!(left.iter().all(|g| g.starts_with("sg:0:")), "{left:?}");
        // The shared router (two-phase mode) recovers them.
        until_none_prepared(env, Duration::from_secs(20));
        let want = if commits { "1" } else { "0" };
        for (shard, k) in [(0, a), (3, b)] {
            assert_eq!(
                env.on_shard(shard, &format!("SELECT count(*) FROM kv WHERE id = {k}")),
                want,
                "{fault}: shard {shard}"
            );
        }
    }
}

/// A write on several shards outside a transaction (a multi-row INSERT split by shard) also
/// commits with two-phase commit: stopped after PREPARE it is rolled back everywhere, stopped
/// after the decision it is committed everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_on_several_shards_outside_a_transaction_commits_in_two_phases() {
    let env = env();
    for (fault, commits, base) in [
        ("after_prepare", false, 84_000_000),
        ("after_decision", true, 85_000_000),
    ] {
        let (a, b) = (env.key_on(1, base), env.key_on(2, base));
        let faulty = Router::start_with(
            &env.map,
            &two_phase_with(&format!("test_fault = \"{fault}\"\n")),
        );
        let client = faulty.connect().await;
        client
            .simple_query(&format!(
                "INSERT INTO kv (id, v) VALUES ({a}, 'x'), ({b}, 'y')"
            ))
            .await
            .expect_err("the router stops during the commit");
        assert!(
            faulty.wait_exit(Duration::from_secs(10)).is_some(),
            "the router stopped ({fault})"
        );
        assert!(
            !prepared(env).is_empty(),
            "{fault}: something is left prepared"
        );
        until_none_prepared(env, Duration::from_secs(20));
        let want = if commits { "1" } else { "0" };
        for (shard, k) in [(1, a), (2, b)] {
            assert_eq!(
                env.on_shard(shard, &format!("SELECT count(*) FROM kv WHERE id = {k}")),
                want,
                "{fault}: shard {shard}"
            );
        }
    }
}

#[test]
fn a_router_refuses_two_phase_mode_when_a_shard_cannot_prepare() {
    let cluster = pgharness::Cluster::start(&pgharness::ClusterOptions {
        shards: 2,
        servers: 1,
        schema_sql: Some(pgharness::Schema::Sql(common::SCHEMA.into())),
        server: pgharness::ServerOptions {
            settings: vec![("max_prepared_transactions".into(), "0".into())],
            ..Default::default()
        },
        ..Default::default()
    })
    .expect("a cluster without prepared transactions");
    let map = shardmap::ShardMap::even_split(&cluster.shard_urls(), common::tables()).expect("map");
    let dir = std::env::temp_dir().join(format!("shardgate-2pc-refused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = pgharness::router::write_config(
        &dir,
        &map.to_toml(),
        common::free_port(),
        DATABASE,
        (USER, PASSWORD),
        "",
        "[transactions]\ncross_shard = \"two_phase\"\n",
    )
    .expect("config");
    let out = std::process::Command::new(common::shardgate_bin())
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run the router");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("max_prepared_transactions") && stderr.contains("two_phase"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cluster of its own (2 shards on one server, nothing prepared on them yet) and its map.
fn fresh_cluster() -> (pgharness::Cluster, shardmap::ShardMap) {
    let cluster = pgharness::Cluster::start(&pgharness::ClusterOptions {
        shards: 2,
        servers: 1,
        schema_sql: Some(pgharness::Schema::Sql(common::SCHEMA.into())),
        ..Default::default()
    })
    .expect("a fresh cluster");
    let map = shardmap::ShardMap::even_split(&cluster.shard_urls(), common::tables()).expect("map");
    (cluster, map)
}

/// A fleet starts its routers at once (an autoscaling group): each makes sure every shard has
/// the decisions table, all at the same moment, and every one of them starts.
#[test]
fn routers_started_at_the_same_instant_on_fresh_shards_all_start() {
    const ROUTERS: usize = 6;
    let (cluster, map) = fresh_cluster();
    let go = Arc::new(std::sync::Barrier::new(ROUTERS));
    let routers: Vec<Router> = std::thread::scope(|s| {
        let starts: Vec<_> = (0..ROUTERS)
            .map(|_| {
                let (go, map) = (go.clone(), &map);
                s.spawn(move || {
                    go.wait();
                    Router::start_with(map, TWO_PHASE)
                })
            })
            .collect();
        starts
            .into_iter()
            .map(|h| h.join().expect("every router starts"))
            .collect()
    });
    for r in &routers {
        assert!(r.is_alive());
        let log = r.log_text();
        assert!(!log.contains("duplicate key"), "{log}");
    }
    for shard in 0..2 {
        let n = cluster
            .psql_shard(shard, "SELECT count(*) FROM shardgate.prepared_decisions")
            .expect("the table is there");
        assert_eq!(n.trim(), "0");
    }
}

/// A transaction left in doubt that the start's recovery pass finds still within the grace
/// period is resolved as soon as it is past it, not a whole `recovery_interval_ms` (here ten
/// minutes) later: its rows stay locked until then.
#[test]
fn a_transaction_in_doubt_is_resolved_once_past_the_grace_not_an_interval_later() {
    let (cluster, map) = fresh_cluster();
    let range = map.shards()[0].range.to_string();
    // What a router killed between PREPARE and its decision leaves: a prepared transaction of
    // shardgate's, with no decision recorded on its coordinator.
    cluster
        .psql_shard(
            0,
            &format!(
                "BEGIN; INSERT INTO kv (id, v) VALUES (1, 'in doubt'); PREPARE TRANSACTION 'sg:9:1:{range}:{range}'"
            ),
        )
        .expect("prepare a transaction");
    let config = TWO_PHASE
        .replace(
            "recovery_interval_ms = 300",
            "recovery_interval_ms = 600000",
        )
        .replace("recovery_grace_ms = 1000", "recovery_grace_ms = 5000");
    let router = Router::start_with(&map, &config);
    let deadline = Instant::now() + Duration::from_secs(60);
    let left = || {
        cluster
            .psql_shard(
                0,
                "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()",
            )
            .expect("count prepared")
            .trim()
            .to_string()
    };
    while left() != "0" {
        assert!(
            Instant::now() < deadline,
            "still in doubt after 60 s:\n{}",
            router.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // No decision: rolled back.
    let n = cluster
        .psql_shard(0, "SELECT count(*) FROM kv WHERE id = 1")
        .expect("count");
    assert_eq!(n.trim(), "0");
    let log = router.log_text();
    assert!(log.contains("recovery rolled back"), "{log}");
}
