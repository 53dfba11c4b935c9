//! Holding statements through a restart (`[failover]`): a shard's primary restarted under load
//! costs its clients latency, not errors (statements wait for it, and statements the shutdown
//! aborted before they ran are sent again); past the hold window, or past the bound on held
//! statements, they fail with 08006 naming why; and statements that need no particular shard
//! never depend on one bad shard.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{http_get, metric, sqlstate, Env};

const POOL: &str = "[pool]\nmax_size = 4\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n";

/// What one client of a [`Load`] runs, over and over, on one key.
#[derive(Clone)]
enum Statement {
    /// A prepared-protocol select of `v`, which must read `want`.
    Select {
        sql: &'static str,
        key: i64,
        want: &'static str,
    },
    /// A simple-protocol `SELECT v FROM kv WHERE id = key`, which must read `want`.
    SimpleSelect { key: i64, want: &'static str },
    /// `v = v + 1` on `key`, counted in `acknowledged` when the client is told it happened.
    Increment {
        key: i64,
        acknowledged: Arc<AtomicU64>,
    },
}

impl Statement {
    async fn run(&self, client: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
        match self {
            Statement::Select { sql, key, want } => {
                let row = client.query_one(*sql, &[key]).await?;
                assert_eq!(row.get::<_, String>(0), *want);
            }
            Statement::SimpleSelect { key, want } => {
                let m = client
                    .simple_query(&format!("SELECT v FROM kv WHERE id = {key}"))
                    .await?;
                assert_eq!(common::rows(&m)[0][0], *want);
            }
            Statement::Increment { key, acknowledged } => {
                let sql = "UPDATE kv SET v = (v::int + 1)::text WHERE id = $1";
                assert_eq!(client.execute(sql, &[key]).await?, 1);
                acknowledged.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// Clients of the router, one per statement, each running its statement until stopped and
/// keeping the errors it saw.
struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    workers: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

impl Load {
    async fn start(env: &Env, statements: Vec<Statement>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::new();
        for statement in statements {
            let client = env.router.connect().await;
            let (stop, done) = (stop.clone(), done.clone());
            workers.push(tokio::spawn(async move {
                let mut errors = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match statement.run(&client).await {
                        Ok(()) => {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            errors.push(format!("{} {e:?}", sqlstate(&e)));
                            if e.is_closed() {
                                break;
                            }
                        }
                    }
                }
                errors
            }));
        }
        Load {
            stop,
            done,
            workers,
        }
    }

    /// Waits until `more` statements beyond those done so far have been answered.
    async fn wait_for(&self, more: u64) {
        let target = self.done.load(Ordering::Relaxed) + more;
        while self.done.load(Ordering::Relaxed) < target {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the clients; the errors they saw.
    async fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        let mut errors = Vec::new();
        for w in self.workers {
            errors.extend(w.await.expect("worker"));
        }
        errors
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_primary_costs_latency_not_errors() {
    restarted_primary("").await;
}

/// The same on shared connections: what was written behind the running statement, which the
/// server never read, is sent again too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_primary_costs_shared_connections_latency_not_errors() {
    restarted_primary("shared_connections = 2\n").await;
}

/// Clients on one shard whose server is restarted twice under them; `pool` is added to the
/// `[pool]` section.
async fn restarted_primary(pool: &str) {
    let http = common::free_port();
    let mut env = Env::start_with(
        2,
        2,
        &format!(
            "{POOL}{pool}[failover]\nhold_ms = 30000\n[http]\nlisten = \"127.0.0.1:{http}\"\n"
        ),
    );
    let key = env.key_on(0, 50_000_000);
    let counter = env.key_on(0, 50_000_001);
    let other = env.key_on(1, 50_000_000);
    let seed = env.router.connect().await;
    for k in [key, other] {
        seed.execute("INSERT INTO kv (id, v) VALUES ($1, 'kept')", &[&k])
            .await
            .expect("seed");
    }
    seed.execute("INSERT INTO kv (id, v) VALUES ($1, '0')", &[&counter])
        .await
        .expect("seed the counter");
    // Prepared point selects, simple-protocol ones, slow ones (in flight when the shutdown
    // comes, so that Postgres aborts them with 57P01) and updates, all on the restarted shard.
    let select = |sql| Statement::Select {
        sql,
        key,
        want: "kept",
    };
    let updates = Arc::new(AtomicU64::new(0));
    let statements = [
        select("SELECT v FROM kv WHERE id = $1"),
        Statement::SimpleSelect { key, want: "kept" },
        select("SELECT v FROM kv, pg_sleep(0.02) WHERE id = $1"),
        Statement::Increment {
            key: counter,
            acknowledged: updates.clone(),
        },
    ];
    let load = Load::start(&env, [&statements[..], &statements[..]].concat()).await;
    load.wait_for(200).await;
    let server = env.cluster.shards()[0].server;
    for _ in 0..2 {
        let restarted = tokio::task::block_in_place(|| env.cluster.servers_mut()[server].restart());
        restarted.expect("restart the shard's server");
        // Statements flow again after each restart.
        load.wait_for(100).await;
    }
    let errors = load.finish().await;
    assert!(
        errors.is_empty(),
        "clients saw errors: {errors:?}\n{}",
        env.router.log_text()
    );
    // Every update the clients were told of happened, once: none was lost or run twice.
    let row = seed
        .query_one("SELECT v FROM kv WHERE id = $1", &[&counter])
        .await
        .expect("the counter");
    let count: u64 = row.get::<_, String>(0).parse().expect("a number");
    assert_eq!(
        count,
        updates.load(Ordering::Relaxed),
        "acknowledged updates"
    );
    // The other shard was never touched, and the router counted what it held.
    let row = seed
        .query_one("SELECT v FROM kv WHERE id = $1", &[&other])
        .await
        .expect("the other shard");
    assert_eq!(row.get::<_, String>(0), "kept");
    let (_, text) = http_get(http, "/metrics");
    assert!(
        metric(&text, "shardgate_failover_held_statements_total") > 0.0,
        "statements were held: {text}"
    );
    assert!(env.router.log_lines("panicked").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_window_or_the_bound_a_held_statement_fails_with_08006() {
    let mut env = Env::start_with(
        2,
        2,
        &format!("{POOL}[failover]\nhold_ms = 400\nhold_max_statements = 1\n"),
    );
    let key = env.key_on(0, 60_000_000);
    let client = env.router.connect().await;
    client
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'x')", &[&key])
        .await
        .expect("seed");
    let server = env.cluster.shards()[0].server;
    env.cluster.servers_mut()[server].stop().expect("stop");

    let err = client
        .query_one("SELECT v FROM kv WHERE id = $1", &[&key])
        .await
        .expect_err("the shard stays down past the window");
    assert_eq!(sqlstate(&err), "08006");
    let message = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(message.contains("waited"), "{message}");

    // Two at once with room for one held statement: one of them is refused at once, naming
    // the bound.
    let second = env.router.connect().await;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&key];
    let (a, b) = tokio::join!(
        client.query_one("SELECT v FROM kv WHERE id = $1", &params),
        second.query_one("SELECT v FROM kv WHERE id = $1", &params),
    );
    let messages: Vec<String> = [a, b]
        .into_iter()
        .map(|r| {
            let e = r.expect_err("still down");
            assert_eq!(sqlstate(&e), "08006");
            e.as_db_error()
                .map(|e| e.message().to_string())
                .unwrap_or_default()
        })
        .collect();
    assert!(
        messages.iter().any(|m| m.contains("hold_max_statements")),
        "{messages:?}"
    );
    // Back up: the same clients go on.
    env.cluster.servers_mut()[server].restart().expect("start");
    let row = client
        .query_one("SELECT v FROM kv WHERE id = $1", &[&key])
        .await
        .expect("back");
    assert_eq!(row.get::<_, String>(0), "x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_waits_for_its_shard_to_come_back() {
    let mut env = Env::start_with(2, 2, &format!("{POOL}[failover]\nhold_ms = 60000\n"));
    let key = env.key_on(1, 70_000_000);
    let client = env.router.connect().await;
    client
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'waited')", &[&key])
        .await
        .expect("seed");
    let server = env.cluster.shards()[1].server;
    env.cluster.servers_mut()[server].stop().expect("stop");
    let held = tokio::spawn(async move {
        client
            .query_one("SELECT v FROM kv WHERE id = $1", &[&key])
            .await
            .map(|r| r.get::<_, String>(0))
    });
    // The statement is held, not failed, while the server is down...
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!held.is_finished(), "held while the shard is down");
    // ...and answered once it is back.
    tokio::task::block_in_place(|| env.cluster.servers_mut()[server].restart()).expect("start");
    let v = held
        .await
        .expect("task")
        .expect("answered after the restart");
    assert_eq!(v, "waited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_for_no_particular_shard_avoid_a_bad_one() {
    // 4 shards on 2 servers: stopping server 1 takes shards 1 and 3 down; shard 0's pool of
    // one connection (one router worker) is held busy by a transaction.
    let mut env = Env::start_threads(
        4,
        2,
        "[pool]\nmax_size = 1\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n\
         [failover]\nhold_ms = 0\n",
        1,
    );
    let down: Vec<usize> = (0..4)
        .filter(|&s| env.cluster.shards()[s].server == 1)
        .collect();
    assert_eq!(down, [1, 3]);
    let healthy = env.key_on(2, 80_000_000);
    let busy_key = env.key_on(0, 80_000_000);
    // The one connection to shard 0 held in a transaction.
    let holder = env.router.connect().await;
    holder
        .batch_execute(&format!("BEGIN; SELECT * FROM kv WHERE id = {busy_key}"))
        .await
        .expect("hold shard 0");
    env.cluster.servers_mut()[1].stop().expect("stop server 1");

    let client = env.router.connect().await;
    for round in 0..24 {
        // Table-less statements, preparing a statement keyed by a parameter, and a healthy
        // shard's key: none of them may fail for the bad shards.
        client
            .simple_query("SELECT 1")
            .await
            .unwrap_or_else(|e| panic!("round {round}: SELECT 1: {e:?}"));
        let stmt = client
            .prepare(&format!(
                "SELECT v FROM kv WHERE id = $1 AND {round} = {round}"
            ))
            .await
            .unwrap_or_else(|e| panic!("round {round}: prepare: {e:?}"));
        client
            .query_opt(&stmt, &[&healthy])
            .await
            .unwrap_or_else(|e| panic!("round {round}: healthy shard: {e:?}"));
    }
    holder.batch_execute("ROLLBACK").await.expect("rollback");
    env.cluster.servers_mut()[1]
        .restart()
        .expect("start server 1");
}

/// A failover: the shard's primary stops, its streaming standby (pg_basebackup) is promoted,
/// and a reloaded shard map names it. Statements for the shard are held while it has no
/// primary and then run on the new one: no client sees an error, and every update the clients
/// were told about is on the new primary exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_takes_over_with_no_error() {
    let mut env = Env::start_with(2, 2, &format!("{POOL}[failover]\nhold_ms = 60000\n"));
    let key = env.key_on(0, 40_000_000);
    let counter = env.key_on(0, key + 1);
    let seed = env.router.connect().await;
    seed.execute(
        "INSERT INTO kv (id, v) VALUES ($1, 'kept'), ($2, '0')",
        &[&key, &counter],
    )
    .await
    .expect("seed");
    let server = env.cluster.shards()[0].server;
    let database = env.cluster.shards()[0].database.clone();
    let standby = tokio::task::block_in_place(|| {
        env.cluster.servers()[server].start_standby(&pgharness::ServerOptions::default())
    })
    .expect("a streaming standby of shard 0's server");

    let updates = Arc::new(AtomicU64::new(0));
    let load = Load::start(
        &env,
        vec![
            Statement::Select {
                sql: "SELECT v FROM kv WHERE id = $1",
                key,
                want: "kept",
            },
            Statement::SimpleSelect { key, want: "kept" },
            Statement::Increment {
                key: counter,
                acknowledged: updates.clone(),
            },
            Statement::Increment {
                key: counter,
                acknowledged: updates.clone(),
            },
        ],
    )
    .await;
    load.wait_for(200).await;
    // The old primary goes away (a fast shutdown streams its last WAL to the standby first);
    // statements for shard 0 are held from here on.
    tokio::task::block_in_place(|| env.cluster.servers_mut()[server].stop()).expect("stop");
    tokio::task::block_in_place(|| standby.promote()).expect("promote the standby");
    let mut urls = env.cluster.shard_urls();
    urls[0] = standby.url(&database);
    let moved = shardmap::ShardMap::even_split(&urls, common::tables())
        .expect("the map after the failover")
        .with_version(env.map.version() + 1);
    std::fs::write(env.router.dir.join("shardmap.toml"), moved.to_toml()).expect("write the map");
    env.router.signal(libc::SIGHUP);
    tokio::task::block_in_place(|| env.router.wait_for_log("reloaded: shard map", 1));
    load.wait_for(200).await;
    let errors = load.finish().await;
    assert!(
        errors.is_empty(),
        "clients saw errors: {errors:?}\n{}",
        env.router.log_text()
    );
    // Every acknowledged update, once, on the new primary (read there directly).
    let on_new_primary = standby
        .psql(&database, &format!("SELECT v FROM kv WHERE id = {counter}"))
        .expect("read the new primary");
    assert_eq!(
        on_new_primary.trim(),
        updates.load(Ordering::Relaxed).to_string(),
        "acknowledged updates"
    );
    assert!(env.router.log_lines("panicked").is_empty());
}

/// `pg_terminate_backend` ends one session with the same FATAL 57P01 a shutdown sends, but the
/// server goes on taking logins: the statement was stopped on purpose and is not sent again.
/// The client gets 57P01 as an error and its session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_ended_on_purpose_is_not_sent_again() {
    let env = Env::start_with(2, 2, &format!("{POOL}[failover]\nhold_ms = 30000\n"));
    let key = env.key_on(0, 30_000_000);
    let client = env.router.connect().await;
    client
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'x')", &[&key])
        .await
        .expect("seed");
    let sleeping = tokio::spawn(async move {
        let r = client
            .query_one(
                "SELECT v FROM kv, pg_sleep(20) WHERE id = $1 /* ended-on-purpose */",
                &[&key],
            )
            .await;
        (client, r.map(|_| ()))
    });
    // Find the statement on shard 0 and end its session there.
    let find = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%ended-on-purpose%' \
                AND state = 'active' AND pid <> pg_backend_pid()";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while env.on_shard(0, find) != "1" {
        assert!(
            std::time::Instant::now() < deadline,
            "the statement never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.on_shard(
        0,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE query LIKE '%ended-on-purpose%' AND pid <> pg_backend_pid()",
    );
    let (client, result) = sleeping.await.expect("task");
    let err = result.expect_err("ended, not sent again");
    assert_eq!(sqlstate(&err), "57P01", "{err:?}");
    assert_eq!(env.on_shard(0, find), "0", "not running again");
    let row = client
        .query_one("SELECT v FROM kv WHERE id = $1", &[&key])
        .await
        .expect("the session goes on");
    assert_eq!(row.get::<_, String>(0), "x");
}
