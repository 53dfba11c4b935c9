//! The admin console as an operator uses it: `psql ... shardgate` as a user marked admin,
//! every command checked against what really happens (the backend pid of a client's
//! transaction, the statements it ran, a statement held by PAUSE and let go by RESUME, a
//! RELOAD refused with the file's line, SHUTDOWN draining the router).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{sqlstate, Env, PASSWORD, USER};
use tokio_postgres::{Client, SimpleQueryMessage};

const ADMIN: &str = "[[users]]\nname = \"ops\"\npassword = \"ops-secret\"\nadmin = true\n";

fn config() -> String {
    format!("{ADMIN}[pool]\nmax_size = 4\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\npause_timeout_ms = 5000\n[shutdown]\ndrain_timeout_ms = 10000\n")
}

/// The rows of an admin answer, each by column name.
async fn table(admin: &Client, sql: &str) -> Vec<HashMap<String, String>> {
    admin
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(
                r.columns()
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.name().to_string(), r.get(i).unwrap_or("").to_string()))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

fn row<'a>(
    rows: &'a [HashMap<String, String>],
    key: &str,
    value: &str,
) -> &'a HashMap<String, String> {
    rows.iter()
        .find(|r| r.get(key).map(String::as_str) == Some(value))
        .unwrap_or_else(|| panic!("no row with {key} = {value} in {rows:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_console_shows_what_runs_and_controls_the_router() {
    let env = Env::start_with(2, 1, &config());
    let router = &env.router;
    let admin_url = router.url_as("ops", "ops-secret", "shardgate");
    let k = env.key_on(0, 1);
    let range0 = env.map.shards()[0].range.to_string();
    env.on_shard(0, &format!("INSERT INTO kv VALUES ({k}, 'zero')"));

    // Only admin users get in, and only to the console.
    let refused = common::connect(&router.url_as(USER, PASSWORD, "shardgate"))
        .await
        .expect_err("not an admin");
    assert_eq!(sqlstate(&refused), "42501");
    let admin = common::connect(&admin_url).await.expect("admin login");
    let version = table(&admin, "SHOW VERSION").await;
    assert!(
        version[0]["version"].starts_with("shardgate "),
        "{version:?}"
    );
    let err = admin
        .simple_query("SELECT 1")
        .await
        .expect_err("not a command");
    assert_eq!(sqlstate(&err), "42601");
    let help = table(&admin, "SHOW HELP").await;
    for command in ["SHOW SHARDS", "RELOAD", "PAUSE [shard]", "SHUTDOWN"] {
        row(&help, "command", command);
    }

    // A client in a transaction on shard 0: the console sees it, its shard and its backend.
    let app = router.connect().await;
    app.simple_query("SELECT count(*) FROM kv")
        .await
        .expect("touch every shard");
    // A point select outside a transaction goes to the shard's shared connections.
    app.simple_query(&format!("SELECT v FROM kv WHERE id = {k}"))
        .await
        .expect("shared");
    app.simple_query("BEGIN").await.expect("begin");
    let pid = common::rows(
        &app.simple_query(&format!("SELECT pg_backend_pid() FROM kv WHERE id = {k}"))
            .await
            .expect("pid"),
    )[0][0]
        .clone();
    // The read across shards gives its connections back as its shards' tasks end, which on a
    // busy machine can be just after the client has its answer.
    let mut shards = table(&admin, "SHOW SHARDS").await;
    for _ in 0..50 {
        if row(&shards, "range", &range0)["sv_active"] == "1" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        shards = table(&admin, "SHOW SHARDS").await;
    }
    assert_eq!(shards.len(), 2);
    assert!(shards.iter().all(|s| s["state"] == "up"), "{shards:?}");
    assert_eq!(row(&shards, "range", &range0)["sv_active"], "1");
    let clients = table(&admin, "SHOW CLIENTS").await;
    let active = row(&clients, "state", "active");
    assert_eq!(
        (
            active["database"].as_str(),
            active["shard"].as_str(),
            active["remote_pid"].as_str()
        ),
        ("app", range0.as_str(), pid.as_str())
    );
    row(&clients, "database", "shardgate");
    let servers = table(&admin, "SHOW SERVERS").await;
    let server = row(&servers, "remote_pid", &pid);
    assert_eq!(
        (server["state"].as_str(), server["link"].as_str()),
        ("active", active["id"].as_str())
    );
    assert!(servers.iter().any(|s| s["state"] == "idle"), "{servers:?}");
    // The shared connection: its shard, the worker it belongs to, what it has queued or running.
    let lane = row(&servers, "state", "shared");
    assert_eq!(lane["shard"], range0, "{servers:?}");
    assert!(
        lane["worker"].parse::<usize>().is_ok_and(|w| w < 2),
        "{lane:?}"
    );
    assert_eq!(lane["load"], "0", "{lane:?}");
    assert!(lane["remote_pid"].parse::<i32>().is_ok(), "{lane:?}");
    assert_eq!(server["worker"], "", "only shared connections have one");
    let pools = table(&admin, "SHOW POOLS").await;
    assert_eq!(pools.len(), 2, "{pools:?}");
    let pool0 = row(&pools, "shards", &range0);
    assert_eq!(
        (pool0["cl_active"].as_str(), pool0["sv_active"].as_str()),
        ("1", "1")
    );
    let config = table(&admin, "SHOW CONFIG").await;
    assert_eq!(
        row(&config, "key", "pool.pause_timeout_ms")["value"],
        "5000"
    );
    assert_eq!(row(&config, "key", "listen")["changeable"], "no");
    // The byte limits, at their defaults.
    for key in [
        "limits.max_merge_bytes",
        "limits.plan_cache_bytes",
        "limits.max_message_bytes",
    ] {
        assert_eq!(row(&config, "key", key)["value"], "67108864", "{key}");
    }
    assert_eq!(
        row(&config, "key", "limits.merge_memory_bytes")["value"],
        "268435456"
    );

    // PAUSE waits for the transaction on the shard to finish.
    let pausing = {
        let admin = common::connect(&admin_url).await.expect("admin");
        let range0 = range0.clone();
        tokio::spawn(async move {
            admin
                .simple_query(&format!("PAUSE '{range0}'"))
                .await
                .map(|_| ())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !pausing.is_finished(),
        "PAUSE returned while a transaction held shard 0"
    );
    app.simple_query("COMMIT").await.expect("commit");
    pausing.await.expect("join").expect("PAUSE");
    assert_eq!(
        row(&table(&admin, "SHOW SHARDS").await, "range", &range0)["state"],
        "paused"
    );

    // New statements for shard 0 wait; shard 1 is served; RESUME lets them go.
    let waiting = {
        let client = router.connect().await;
        tokio::spawn(async move {
            client
                .simple_query(&format!("SELECT v FROM kv WHERE id = {k}"))
                .await
                .map(|m| common::rows(&m))
        })
    };
    let other = env.key_on(1, 1);
    app.simple_query(&format!("SELECT v FROM kv WHERE id = {other}"))
        .await
        .expect("shard 1 is not paused");
    // The statement for shard 0 is held by the pause (seen by the console), not lost.
    while row(&table(&admin, "SHOW SHARDS").await, "range", &range0)["cl_paused"] != "1" {
        assert!(!waiting.is_finished(), "a statement for a paused shard ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admin.simple_query("RESUME").await.expect("resume");
    let rows = waiting.await.expect("join").expect("served after RESUME");
    assert_eq!(rows, [["zero"]]);

    // A statement that stays paused longer than pause_timeout_ms fails with 57P03.
    admin
        .simple_query("PAUSE 0")
        .await
        .expect("pause by number");
    let err = app
        .simple_query(&format!("SELECT v FROM kv WHERE id = {k}"))
        .await
        .expect_err("paused past the timeout");
    assert_eq!(sqlstate(&err), "57P03");
    admin.simple_query("RESUME 0").await.expect("resume");
    let err = admin
        .simple_query("PAUSE 7")
        .await
        .expect_err("no such shard");
    assert_eq!(sqlstate(&err), "42704");

    // SHOW STATS counts the statements of a shard exactly.
    let count = |rows: &[HashMap<String, String>]| -> u64 {
        row(rows, "shard", &range0)["total_query_count"]
            .parse()
            .expect("count")
    };
    let before = count(&table(&admin, "SHOW STATS").await);
    for _ in 0..4 {
        app.simple_query(&format!("SELECT v FROM kv WHERE id = {k}"))
            .await
            .expect("select");
    }
    let stats = table(&admin, "SHOW STATS").await;
    assert_eq!(count(&stats) - before, 4);
    let p99: u64 = row(&stats, "shard", &range0)["last_minute_p99_us"]
        .parse()
        .expect("a p99 over the last minute");
    assert!(p99 > 0);

    // RELOAD: a bad file is refused with its line; a good one is applied.
    let path = router.config_path();
    let good = std::fs::read_to_string(&path).expect("config");
    std::fs::write(&path, format!("{good}\n[limits]\nmax_clients = -1\n")).expect("write");
    let err = admin.simple_query("RELOAD").await.expect_err("refused");
    assert_eq!(sqlstate(&err), "F0000");
    let db = err.as_db_error().expect("a database error");
    assert!(
        db.message().contains("router.toml:") && db.message().contains("limits.max_clients"),
        "{db:?}"
    );
    std::fs::write(&path, &good).expect("write");
    admin.simple_query("RELOAD").await.expect("reload");

    // SHUTDOWN drains: the console session ends like any idle client, the router exits 0.
    drop(app);
    admin.simple_query("SHUTDOWN").await.expect("shutdown");
    let status = router.wait_exit(Duration::from_secs(30)).expect("exits");
    assert!(status.success(), "{status}");
}

/// The move a pause is for: a statement that waited for its paused shard while the map moved
/// the shard's range to another database runs there after RESUME, not on the old primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_held_by_pause_follows_the_map_to_the_new_primary() {
    let env = Env::start_with(2, 1, &config());
    let router = &env.router;
    let k = env.key_on(0, 1);
    let range0 = env.map.shards()[0].range.to_string();
    env.on_shard(0, &format!("INSERT INTO kv VALUES ({k}, 'old home')"));
    let server = &env.cluster.servers()[0];
    server
        .create_databases(&["moved_000".to_string()])
        .expect("the new home");
    server.psql("moved_000", common::SCHEMA).expect("schema");
    server
        .psql(
            "moved_000",
            &format!("INSERT INTO kv VALUES ({k}, 'new home')"),
        )
        .expect("the row");
    let admin = common::connect(&router.url_as("ops", "ops-secret", "shardgate"))
        .await
        .expect("admin");
    admin
        .simple_query(&format!("PAUSE '{range0}'"))
        .await
        .expect("pause");
    let held = {
        let client = router.connect().await;
        tokio::spawn(async move {
            client
                .simple_query(&format!(
                    "UPDATE kv SET v = v || ' (updated)' WHERE id = {k} RETURNING v"
                ))
                .await
                .map(|m| common::rows(&m))
        })
    };
    while row(&table(&admin, "SHOW SHARDS").await, "range", &range0)["cl_paused"] != "1" {
        assert!(!held.is_finished(), "a statement for a paused shard ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut urls = env.cluster.shard_urls();
    urls[0] = server.url("moved_000");
    let moved = shardmap::ShardMap::even_split(&urls, common::tables())
        .expect("map")
        .with_version(env.map.version() + 1);
    std::fs::write(router.dir.join("shardmap.toml"), moved.to_toml()).expect("write the map");
    admin.simple_query("RELOAD").await.expect("reload");
    admin.simple_query("RESUME").await.expect("resume");
    let rows = held.await.expect("join").expect("the held update ran");
    assert_eq!(rows, [["new home (updated)"]]);
    assert_eq!(
        env.on_shard(0, &format!("SELECT v FROM kv WHERE id = {k}")),
        "old home",
        "the old primary was not written"
    );
}
