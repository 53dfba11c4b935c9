//! A shard whose Postgres is down: its keys fail fast with 08006/08001 naming the shard,
//! every other shard keeps answering with zero errors, and when the server is back the
//! router uses it again without a restart.

mod common;

use std::time::{Duration, Instant};

use common::{sqlstate, Env};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_shard_fails_alone_and_comes_back() {
    // 4 shards on 2 servers: stopping server 1 takes shards 1 and 3 down.
    // Without holding: this test is about failing fast (tests/failover.rs holds).
    let mut env = Env::start_with(
        4,
        2,
        "[pool]\nmax_size = 4\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n\
         [failover]\nhold_ms = 0\n",
    );
    let client = env.router.connect().await;
    let keys: Vec<i64> = (0..4).map(|s| env.key_on(s, 7_000_000)).collect();
    for &k in &keys {
        client
            .execute("INSERT INTO kv (id, v) VALUES ($1, 'here')", &[&k])
            .await
            .expect("seed");
    }
    let down: Vec<usize> = (0..4)
        .filter(|&s| env.cluster.shards()[s].server == 1)
        .collect();
    assert_eq!(down, [1, 3]);

    env.cluster.servers_mut()[1].stop().expect("stop server 1");

    for round in 0..20 {
        for (s, &k) in keys.iter().enumerate() {
            let started = Instant::now();
            let result = client
                .query_one("SELECT v FROM kv WHERE id = $1", &[&k])
                .await;
            if down.contains(&s) {
                let err = result.expect_err("a key of a stopped shard");
                let code = sqlstate(&err);
                assert!(
                    code == "08006" || code == "08001",
                    "round {round} shard {s}: {code} {err:?}"
                );
                let msg = err
                    .as_db_error()
                    .map(|e| e.message().to_string())
                    .unwrap_or_default();
                assert!(
                    msg.contains(&env.map.shards()[s].range.to_string()),
                    "names the shard: {msg}"
                );
                // Bounded by the connect timeout (1 s in the test config), not by TCP's minutes;
                // the bound here is deliberately loose: it only catches a hang.
                assert!(started.elapsed() < Duration::from_secs(30), "failed fast");
            } else {
                let row = result.unwrap_or_else(|e| {
                    panic!("round {round}: shard {s} must be untouched: {e:?}")
                });
                assert_eq!(row.get::<_, String>(0), "here");
            }
        }
    }
    // Simple protocol too, and the client connection survived all of it.
    let err = client
        .simple_query(&format!("SELECT v FROM kv WHERE id = {}", keys[1]))
        .await
        .expect_err("simple protocol to a stopped shard");
    assert!(matches!(sqlstate(&err).as_str(), "08006" | "08001"));

    env.cluster.servers_mut()[1]
        .restart()
        .expect("start server 1 again");
    for (s, &k) in keys.iter().enumerate() {
        let row = client
            .query_one("SELECT v FROM kv WHERE id = $1", &[&k])
            .await
            .unwrap_or_else(|e| panic!("shard {s} after the restart: {e:?}"));
        assert_eq!(row.get::<_, String>(0), "here");
    }
    assert!(env.router.is_alive());
    let lines = env.router.log_lines("panicked");
    assert!(lines.is_empty(), "{lines:?}");
}
