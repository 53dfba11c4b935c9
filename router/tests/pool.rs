//! The per-host pools (`backend::pool`) against real Postgres: clients beyond a pool's size wait
//! their turn and all get through; a connection the server closed while it was idle is replaced
//! without the client noticing; `min_idle` opens connections ahead of use, and `idle_timeout_ms`
//! closes those unused for longer (the pool's maintenance runs every 5 s).

mod common;

use std::time::Duration;

use common::{shared_env, Router};

/// The router's connections to shard 0's database, by state, as its server sees them.
fn router_connections(env: &common::Env, state: &str) -> usize {
    env.on_shard(
        0,
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pool-test' \
             AND datname = current_database() AND state = '{state}'"
        ),
    )
    .trim()
    .parse()
    .unwrap_or(usize::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_beyond_the_pool_wait_their_turn_and_all_get_through() {
    let env = shared_env();
    // One connection per pool, one worker: eight clients at once take turns on it.
    let router = Router::start_threads_pub(
        &env.map,
        "[pool]\nmax_size = 1\ncheckout_timeout_ms = 20000\nshared_connections = 0\n",
        1,
    );
    let key = env.key_on(0, 6_500_000);
    router
        .connect()
        .await
        .execute(
            "INSERT INTO kv (id, v) VALUES ($1, 'turns') ON CONFLICT (id) DO NOTHING",
            &[&key],
        )
        .await
        .expect("insert");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let client = router.connect().await;
        tasks.push(tokio::spawn(async move {
            let row = client
                .query_one(
                    "SELECT $1::int FROM kv, pg_sleep(0.1) WHERE id = $2",
                    &[&i, &key],
                )
                .await
                .expect("every client gets its turn");
            row.get::<_, i32>(0)
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.expect("task"));
    }
    got.sort_unstable();
    assert_eq!(got, (0..8).collect::<Vec<i32>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_while_idle_is_replaced_unseen() {
    let env = shared_env();
    let router = Router::start_threads_pub(
        &env.map,
        "[backend]\napplication_name = \"pool-test\"\n[pool]\nmax_size = 2\nshared_connections = 0\n",
        1,
    );
    let key = env.key_on(0, 6_510_000);
    let client = router.connect().await;
    client
        .execute(
            "INSERT INTO kv (id, v) VALUES ($1, 'idle') ON CONFLICT (id) DO UPDATE SET v = 'idle'",
            &[&key],
        )
        .await
        .expect("insert");
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid() FROM kv WHERE id = $1", &[&key])
        .await
        .expect("pid")
        .get(0);
    // The server ends the (now idle, pooled) connection behind the router's back.
    env.on_shard(0, &format!("SELECT pg_terminate_backend({pid})"));
    for _ in 0..50 {
        if router_connections(env, "idle") == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let row = client
        .query_one("SELECT v, pg_backend_pid() FROM kv WHERE id = $1", &[&key])
        .await
        .expect("the next statement gets a good connection");
    assert_eq!(row.get::<_, String>(0), "idle");
    assert_ne!(row.get::<_, i32>(1), pid, "a new connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_idle_opens_ahead_and_idle_timeout_closes_the_rest() {
    let env = shared_env();
    let router = Router::start_threads_pub(
        &env.map,
        "[backend]\napplication_name = \"pool-test\"\n\
         [pool]\nmax_size = 4\nmin_idle = 1\nidle_timeout_ms = 1000\nwarm_connections = 0\nshared_connections = 0\n",
        1,
    );
    // min_idle opens one ahead of any client (the pool's maintenance, within 5 s).
    assert!(
        wait_for_idle(env, 1, 80).await,
        "min_idle opens a connection ahead of use"
    );
    // Four clients at once: the pool grows past min_idle.
    let key = env.key_on(0, 6_520_000);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let client = router.connect().await;
        tasks.push(tokio::spawn(async move {
            client
                .query(
                    "SELECT pg_sleep(0.3), count(*) FROM kv WHERE id = $1",
                    &[&key],
                )
                .await
                .expect("query");
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let grown = router_connections(env, "idle") + router_connections(env, "active");
    assert!(
        grown >= 2,
        "four clients at once opened more connections: {grown}"
    );
    // Idle past 1 s, all but min_idle close within two maintenance rounds.
    assert!(
        wait_for_idle(env, 1, 150).await,
        "min_idle stays open, the others close: {} idle",
        router_connections(env, "idle")
    );
}

/// Waits up to `tries` × 100 ms until the router has `n` idle connections to shard 0.
async fn wait_for_idle(env: &common::Env, n: usize, tries: usize) -> bool {
    for _ in 0..tries {
        if router_connections(env, "idle") == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
