//! A router's life as an operator drives it: reloads (SIGHUP) that refuse a bad file and keep
//! serving, change pool settings, and move a range to another server while a transaction in
//! progress finishes where it started; and the drain on SIGTERM, where idle clients end with
//! 57P01 between statements, a transaction may finish, new clients are served through the
//! grace period and refused after it, no statement is cut, and the process exits 0. Its log in a
//! file: plain text without colour codes, or one JSON object per line with `[log] format`.

mod common;

use std::time::{Duration, Instant};

use common::{sqlstate, Env, Router, DATABASE, PASSWORD, USER};
use shardmap::ShardMap;
use tokio_postgres::{Client, NoTls};

/// A client whose connection's own end (an error the server sent unasked, such as a FATAL
/// 57P01, or none) can be awaited.
async fn client_with_end(url: &str) -> (Client, tokio::task::JoinHandle<Option<String>>) {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the router");
    let end = tokio::spawn(async move { conn.await.err().map(|e| sqlstate(&e)) });
    (client, end)
}

fn write_map(router: &Router, map: &ShardMap) {
    std::fs::write(router.dir.join("shardmap.toml"), map.to_toml()).expect("write the shard map");
}

/// The router's config with `sections` in place of its sections (the users and backend stay).
fn write_config(router: &Router, sections: &str) {
    let path = router.config_path();
    let text = std::fs::read_to_string(&path).expect("read router.toml");
    let keep = text.find("\n[pool]").map_or(text.as_str(), |i| &text[..i]);
    std::fs::write(&path, format!("{keep}\n{sections}")).expect("write router.toml");
}

async fn value(client: &Client, id: i64) -> String {
    let rows = common::rows(
        &client
            .simple_query(&format!("SELECT v FROM kv WHERE id = {id}"))
            .await
            .expect("select"),
    );
    rows.first().map(|r| r[0].clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_refuse_bad_files_and_move_a_range_for_new_statements() {
    let env = Env::start(2, 2, 4);
    let router = &env.router;
    let k = env.key_on(0, 1);
    env.on_shard(0, &format!("INSERT INTO kv VALUES ({k}, 'old home')"));
    // The same rows in another database on the other server, but for a marker.
    let moved = &env.cluster.servers()[1];
    moved
        .create_databases(&["moved_000".to_string()])
        .expect("create the new home of shard 0");
    moved.psql("moved_000", common::SCHEMA).expect("schema");
    moved
        .psql(
            "moved_000",
            &format!("INSERT INTO kv VALUES ({k}, 'new home')"),
        )
        .expect("copy");
    let client = router.connect().await;
    assert_eq!(value(&client, k).await, "old home");

    // A file with a problem is refused with its line; the router keeps serving.
    write_config(router, "[pool]\nmax_size = 0\n");
    router.signal(libc::SIGHUP);
    let refused = router.wait_for_log("reload refused", 1);
    assert!(
        refused[0].contains("router.toml:") && refused[0].contains("pool.max_size"),
        "{refused:?}"
    );
    assert_eq!(value(&client, k).await, "old home");

    // A transaction in progress on shard 0 when the range moves finishes where it started.
    let (in_tx, _) = client_with_end(&router.url()).await;
    in_tx.simple_query("BEGIN").await.expect("begin");
    assert_eq!(value(&in_tx, k).await, "old home");

    let mut urls = env.cluster.shard_urls();
    urls[0] = moved.url("moved_000");
    let map = ShardMap::even_split(&urls, common::tables())
        .expect("the new map")
        .with_version(2);
    write_map(router, &map);
    write_config(
        router,
        "[pool]\nmax_size = 2\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n",
    );
    router.signal(libc::SIGHUP);
    let reloaded = router.wait_for_log("reloaded: shard map version 1 -> 2", 1);
    assert!(reloaded[0].contains("2 shards"), "{reloaded:?}");

    // New statements go to the new home, at once and on every client at rest.
    assert_eq!(value(&client, k).await, "new home");
    assert_eq!(value(&in_tx, k).await, "old home", "the transaction stays");
    in_tx.simple_query("COMMIT").await.expect("commit");
    assert_eq!(value(&in_tx, k).await, "new home");
    // Prepared statements follow too (planned again with the new map).
    let stmt = client
        .prepare("SELECT v FROM kv WHERE id = $1")
        .await
        .expect("prepare");
    let row = client.query_one(&stmt, &[&k]).await.expect("execute");
    assert_eq!(row.get::<_, String>(0), "new home");
    assert!(router.is_alive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_idle_clients_lets_transactions_finish_and_exits_0() {
    let env = common::shared_env();
    let router = Router::start_with(
        &env.map,
        "[shutdown]\ndrain_grace_ms = 1500\ndrain_timeout_ms = 20000\n",
    );
    let k = env.key_on(1, 2_000_000);
    let (idle, idle_end) = client_with_end(&router.url()).await;
    idle.simple_query("SELECT 1")
        .await
        .expect("idle client works");
    let (in_tx, in_tx_end) = client_with_end(&router.url()).await;
    in_tx.simple_query("BEGIN").await.expect("begin");
    in_tx
        .simple_query(&format!("INSERT INTO kv VALUES ({k}, 'during the drain')"))
        .await
        .expect("insert in the transaction");

    let sent = Instant::now();
    router.signal(libc::SIGTERM);
    router.wait_for_log("draining", 1);
    // Through the grace period new clients are still served.
    let (late, _) = client_with_end(&router.url()).await;
    late.simple_query("SELECT 1")
        .await
        .expect("served during the grace period");
    // The idle clients end with 57P01 once the listener closes.
    let ended = tokio::time::timeout(Duration::from_secs(20), idle_end)
        .await
        .expect("the idle client is closed")
        .expect("join");
    assert_eq!(ended.as_deref(), Some("57P01"));
    assert!(
        sent.elapsed() >= Duration::from_millis(1400),
        "closed after the grace period"
    );
    // No new clients now.
    let refused = tokio_postgres::connect(&router.url(), NoTls).await;
    assert!(refused.is_err(), "the listener is closed");

    // The transaction goes on and commits, then its session ends at rest.
    in_tx
        .simple_query(&format!("SELECT v FROM kv WHERE id = {k}"))
        .await
        .expect("a statement of the open transaction");
    in_tx.simple_query("COMMIT").await.expect("commit");
    assert_eq!(
        env.on_shard(1, &format!("SELECT v FROM kv WHERE id = {k}")),
        "during the drain"
    );
    let err = in_tx
        .simple_query("SELECT 1")
        .await
        .expect_err("closed at rest");
    let ended = tokio::time::timeout(Duration::from_secs(20), in_tx_end)
        .await
        .expect("ended")
        .expect("join");
    assert!(
        ended.as_deref() == Some("57P01") || sqlstate(&err) == "57P01",
        "{ended:?} {err:?}"
    );
    drop(late);
    let status = router
        .wait_exit(Duration::from_secs(30))
        .expect("the router exits once its clients are gone");
    assert!(status.success(), "{status}:\n{}", router.log_text());
}

/// SIGTERM while clients hammer the router: every statement either completes or is refused
/// whole with 57P01 between statements; none is cut, and the router exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_cuts_no_statement() {
    let env = common::shared_env();
    let router = Router::start_with(&env.map, "");
    let url = router.url();
    let mut workers = Vec::new();
    // Clients that have had an update through: the signal waits for all of them.
    let running = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for w in 0..6i64 {
        let url = url.clone();
        let key = env.key_on((w % 4) as usize, 3_000_000 + w * 10_000);
        let running = running.clone();
        workers.push(tokio::spawn(async move {
            let (client, end) = client_with_end(&url).await;
            client
                .simple_query(&format!("INSERT INTO kv VALUES ({key}, '0')"))
                .await
                .map_err(|e| format!("insert: {e:?}"))?;
            let mut done = 0u64;
            loop {
                let update = format!("UPDATE kv SET v = '{}' WHERE id = {key}", done + 1);
                match client.simple_query(&update).await {
                    Ok(_) => {
                        done += 1;
                        if done == 1 {
                            running.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        let code = e.code().map(|c| c.code().to_string());
                        let end = end.await.ok().flatten();
                        // Refused between statements (57P01), or the connection was closed
                        // after that: never a statement that failed half way.
                        if code.as_deref().is_some_and(|c| c != "57P01") {
                            return Err(format!("statement failed with {code:?}: {e:?}"));
                        }
                        if code.is_none() && end.as_deref() != Some("57P01") {
                            return Err(format!("closed without 57P01 ({end:?}): {e:?}"));
                        }
                        return Ok((key, done));
                    }
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while running.load(std::sync::atomic::Ordering::Relaxed) < 6 {
        assert!(Instant::now() < deadline, "the clients never got going");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    router.signal(libc::SIGTERM);
    for w in workers {
        let (key, done) = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("the client ends")
            .expect("join")
            .unwrap_or_else(|e| panic!("{e}\n{}", router.log_text()));
        // Every update the client saw succeed is there, and nothing after it.
        let shard = env.shard_of(key);
        assert_eq!(
            env.on_shard(shard, &format!("SELECT v FROM kv WHERE id = {key}")),
            done.to_string()
        );
    }
    let status = router
        .wait_exit(Duration::from_secs(30))
        .expect("the router exits");
    assert!(status.success(), "{status}");
    let _ = (USER, PASSWORD, DATABASE);
}

/// A second router on the port of a running one refuses to start ("address in use") instead
/// of silently sharing the port and half of its clients.
#[test]
fn a_second_router_on_a_taken_port_refuses_to_start() {
    let env = common::shared_env();
    let router = Router::start_with(&env.map, "");
    let out = std::process::Command::new(common::shardgate_bin())
        .arg("--config")
        .arg(router.config_path())
        .args(["--threads", "2"])
        .output()
        .expect("run a second router");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{}", router.port))
            && stderr.contains("in use"),
        "{stderr}"
    );
    assert!(router.is_alive());
}

/// SIGHUP never kills the router: not while it starts (before it is ready), not in a burst,
/// not after; each one is a reload, and the router serves throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_never_kills_the_router() {
    let env = common::shared_env();
    let dir = std::env::temp_dir().join(format!("shardgate-sighup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("test dir");
    let port = common::free_port();
    let config = pgharness::router::write_config(
        &dir,
        &env.map.to_toml(),
        port,
        DATABASE,
        (USER, PASSWORD),
        "",
        "",
    )
    .expect("config");
    let log = dir.join("router.log");
    let out = std::fs::File::create(&log).expect("log");
    let mut child = std::process::Command::new(common::shardgate_bin())
        .arg("--config")
        .arg(&config)
        .args(["--threads", "2"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("start a router");
    let pid = child.id() as i32;
    let hup = || {
        // SAFETY: kill(2) on the pid of the child this test started.
        unsafe { libc::kill(pid, libc::SIGHUP) };
    };
    // As soon as it listens (its handlers are installed before it binds), and on until it
    // is ready: the window where a default SIGHUP would have terminated it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the router exited"
        );
        assert!(Instant::now() < deadline, "the router never listened");
        std::thread::sleep(Duration::from_millis(2));
    }
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut sent = 0;
    while !text().contains(pgharness::router::READY) {
        hup();
        sent += 1;
        assert!(Instant::now() < deadline, "never ready:\n{}", text());
        assert!(
            child.try_wait().expect("wait").is_none(),
            "a SIGHUP killed the router while it started:\n{}",
            text()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for _ in 0..20 {
        hup();
        sent += 1;
    }
    let url = format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{port}/{DATABASE}");
    // Reloads are serialized; wait for at least one after ready, then check it serves.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !text().contains("SIGHUP: reloading") {
        assert!(Instant::now() < deadline, "no reload logged:\n{}", text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = common::connect(&url).await.expect("connect after SIGHUPs");
    client.simple_query("SELECT 1").await.expect("serves");
    assert!(
        child.try_wait().expect("wait").is_none(),
        "the router exited after {sent} SIGHUPs:\n{}",
        text()
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A log written to a file has no colour codes; with `[log] format = "json"` every line is one
/// JSON object carrying the router's id, the level, the message and the event's fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_in_a_file_are_plain_text_or_json_lines() {
    let env = common::shared_env();
    let text = Router::start_with(&env.map, "");
    let log = text.log_text();
    assert!(log.contains(pgharness::router::READY), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a file: {log}");

    let json = Router::start_with(&env.map, "router_id = 7\n[log]\nformat = \"json\"\n");
    // A login that fails gives a line with the client's address.
    let _ = common::connect(&json.url_as(USER, "wrong", DATABASE)).await;
    json.wait_for_log("password authentication failed", 1);
    let log = json.log_text();
    let mut lines = 0;
    let mut with_peer = 0;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(v["router_id"], 7, "{line}");
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
        lines += 1;
        with_peer += usize::from(v["peer"].is_string());
    }
    assert!(lines >= 2, "{log}");
    assert!(with_peer >= 1, "no line names the client: {log}");
    assert!(log.contains(pgharness::router::READY));
}
