//! What clients see when something is wrong: bad logins, statement errors inside
//! transactions, transactions that reach for a second shard, a client killed mid-transaction.
//! Each case checks the exact SQLSTATE and that other clients are unaffected.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{connect, pg_program, shared_env, sqlstate, Router};

/// A client on the shared router that keeps working while the others misbehave.
async fn bystander_works(env: &common::Env) {
    let client = env.router.connect().await;
    let id = 6_000_001i64;
    client
        .execute(
            "INSERT INTO kv (id, v) VALUES ($1, 'ok') ON CONFLICT (id) DO NOTHING",
            &[&id],
        )
        .await
        .expect("bystander insert");
    let row = client
        .query_one("SELECT v FROM kv WHERE id = $1", &[&id])
        .await
        .expect("bystander select");
    assert_eq!(row.get::<_, String>(0), "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_logins_get_the_postgres_sqlstates() {
    let env = shared_env();
    let r = &env.router;
    let err = connect(&r.url_as(common::USER, "wrong", common::DATABASE))
        .await
        .expect_err("wrong password");
    assert_eq!(sqlstate(&err), "28P01");
    assert!(err.as_db_error().is_some_and(|e| e
        .message()
        .contains("password authentication failed for user \"app\"")));

    // An unknown user looks exactly like a wrong password.
    let err = connect(&r.url_as("nobody", "x", common::DATABASE))
        .await
        .expect_err("unknown user");
    assert_eq!(sqlstate(&err), "28P01");

    let err = connect(&r.url_as(common::USER, common::PASSWORD, "other"))
        .await
        .expect_err("unknown database");
    assert_eq!(sqlstate(&err), "3D000");
    assert!(err
        .as_db_error()
        .is_some_and(|e| e.message().contains("database \"other\" does not exist")));

    // psql sees the same, as a person would.
    let (ok, _, stderr) = common::run(
        Command::new(pg_program("psql"))
            .arg(r.url_as(common::USER, "wrong", common::DATABASE))
            .args(["-X", "-c", "SELECT 1"]),
    );
    assert!(!ok);
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );

    bystander_works(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_protocol_is_refused_without_harm() {
    let env = shared_env();
    // Garbage instead of a startup packet.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", env.router.port)).expect("connect");
    s.write_all(&[0, 0, 0, 3, 1, 2, 3]).expect("write");
    let mut buf = Vec::new();
    let _ = std::io::Read::read_to_end(&mut s, &mut buf);
    assert_eq!(
        buf.first(),
        Some(&b'E'),
        "an ErrorResponse, not a silent close"
    );
    assert!(String::from_utf8_lossy(&buf).contains("08P01"));
    bystander_works(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_error_inside_a_transaction() {
    let env = shared_env();
    let mut client = env.router.connect().await;
    let id = 6_100_000i64;
    client
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'first')", &[&id])
        .await
        .expect("seed");

    let tx = client.transaction().await.expect("begin");
    tx.execute("UPDATE kv SET v = 'changed' WHERE id = $1", &[&id])
        .await
        .expect("update");
    let err = tx
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'dup')", &[&id])
        .await
        .expect_err("duplicate key");
    assert_eq!(sqlstate(&err), "23505", "Postgres's own error, forwarded");
    let err = tx
        .query("SELECT v FROM kv WHERE id = $1", &[&id])
        .await
        .expect_err("aborted transaction");
    assert_eq!(sqlstate(&err), "25P02");
    tx.rollback().await.expect("rollback");

    let row = client
        .query_one("SELECT v FROM kv WHERE id = $1", &[&id])
        .await
        .expect("after rollback");
    assert_eq!(
        row.get::<_, String>(0),
        "first",
        "the update was rolled back"
    );
    bystander_works(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_cross_shard_refused_a_transaction_stays_on_its_shard() {
    let env = shared_env();
    let router = Router::start_with(&env.map, "[transactions]\ncross_shard = \"refuse\"\n");
    let mut client = router.connect().await;
    let a = env.key_on(0, 6_200_000);
    let b = env.key_on(1, 6_200_000);

    // Simple protocol: BEGIN is answered by the router and sent with the first statement.
    client.simple_query("BEGIN").await.expect("begin");
    client
        .simple_query(&format!("INSERT INTO kv (id, v) VALUES ({a}, 'in tx')"))
        .await
        .expect("first statement pins shard 0");
    let err = client
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES ({b}, 'other shard')"
        ))
        .await
        .expect_err("second shard");
    assert_eq!(sqlstate(&err), "0A000");
    let msg = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    let (ra, rb) = (
        env.map.shards()[0].range.to_string(),
        env.map.shards()[1].range.to_string(),
    );
    assert!(
        msg.contains(&ra) && msg.contains(&rb),
        "names both shards: {msg}"
    );
    // Raised on the pinned backend, but without the PL/pgSQL context of the DO block that
    // raised it: the client sees the router's error as Postgres would send one.
    let db = err.as_db_error().expect("a database error");
    assert_eq!((db.where_(), db.file(), db.routine()), (None, None, None));
    let err = client
        .simple_query("SELECT 1")
        .await
        .expect_err("transaction is aborted");
    assert_eq!(sqlstate(&err), "25P02");
    client.simple_query("ROLLBACK").await.expect("rollback");
    assert_eq!(
        env.on_shard(0, &format!("SELECT count(*) FROM kv WHERE id = {a}")),
        "0",
        "rolled back"
    );

    // Extended protocol, through a driver's transaction API.
    let tx = client.transaction().await.expect("begin");
    tx.execute("INSERT INTO kv (id, v) VALUES ($1, 'x')", &[&a])
        .await
        .expect("pins");
    let err = tx
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'y')", &[&b])
        .await
        .expect_err("cross shard");
    assert_eq!(sqlstate(&err), "0A000");
    assert_eq!(err.as_db_error().and_then(|e| e.where_()), None);
    tx.rollback().await.expect("rollback");

    // A transaction on one shard commits normally.
    let tx = client.transaction().await.expect("begin");
    tx.execute("INSERT INTO kv (id, v) VALUES ($1, 'committed')", &[&a])
        .await
        .expect("insert");
    tx.execute("UPDATE kv SET v = v || '!' WHERE id = $1", &[&a])
        .await
        .expect("update");
    tx.commit().await.expect("commit");
    assert_eq!(
        env.on_shard(0, &format!("SELECT v FROM kv WHERE id = {a}")),
        "committed!"
    );

    // An empty transaction never needs a shard.
    client
        .simple_query("BEGIN; COMMIT")
        .await
        .expect("empty transaction");
    client.simple_query("BEGIN").await.expect("begin");
    client.simple_query("COMMIT").await.expect("commit");
    bystander_works(env).await;
}

/// psql killed with SIGKILL inside a transaction that holds a row lock: the router must not
/// give its backend connection to anyone else. With a pool of one connection per shard, a
/// leaked connection would put the next client inside the dead client's transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_killed_mid_transaction_leaves_nothing_behind() {
    let env = shared_env();
    let router = Router::start_single_pool(&env.map, 1, "");
    let id = env.key_on(2, 6_300_000);
    let client = router.connect().await;
    client
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'before')", &[&id])
        .await
        .expect("seed");

    let mut psql = Command::new(pg_program("psql"))
        .arg(router.url())
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start psql");
    let mut stdin = psql.stdin.take().expect("psql stdin");
    writeln!(
        stdin,
        "BEGIN;\nUPDATE kv SET v = 'dirty' WHERE id = {id};\nSELECT 'locked';"
    )
    .expect("write to psql");
    stdin.flush().expect("flush");
    // Wait until the update holds its lock on the shard.
    let mut locked = false;
    for _ in 0..200 {
        let n = env.on_shard(2, "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'kv' AND l.mode = 'RowExclusiveLock'");
        if n != "0" {
            locked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(locked, "psql's transaction never took its lock");
    psql.kill().expect("kill psql");
    let _ = psql.wait();
    drop(stdin);

    // The next client gets a clean connection: its update is not blocked by the dead
    // transaction and is committed on its own. (The timeout only guards against a hang.)
    let client = router.connect().await;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
    let update = client.execute("UPDATE kv SET v = 'after' WHERE id = $1", &params);
    let n = tokio::time::timeout(Duration::from_secs(60), update)
        .await
        .expect("the row lock of the killed client was released")
        .expect("update");
    assert_eq!(n, 1);
    assert_eq!(
        env.on_shard(2, &format!("SELECT v FROM kv WHERE id = {id}")),
        "after",
        "committed, outside any old transaction"
    );
    let row = client
        .query_one("SELECT v FROM kv WHERE id = $1", &[&id])
        .await
        .expect("select");
    assert_eq!(row.get::<_, String>(0), "after");
    assert!(router.is_alive());
}

/// Pools are per host and bounded: when shard 0's only connection is held by an open
/// transaction, another client waiting for shard 0 gets 53300 naming the shard after the
/// checkout timeout, while statements for the other shards go straight through. (Sharing
/// off: with it, autocommit statements would not need the pool at all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_says_53300_and_blocks_only_its_shard() {
    let env = shared_env();
    let router = Router::start_threads_pub(
        &env.map,
        "[pool]\nmax_size = 1\ncheckout_timeout_ms = 300\nconnect_timeout_ms = 1000\nshared_connections = 0\n",
        1,
    );
    let a = env.key_on(0, 6_400_000);
    let b = env.key_on(1, 6_400_000);
    let mut holder = router.connect().await;
    let tx = holder.transaction().await.expect("begin");
    tx.execute("INSERT INTO kv (id, v) VALUES ($1, 'held')", &[&a])
        .await
        .expect("pin shard 0");

    let other = router.connect().await;
    let err = other
        .query("SELECT v FROM kv WHERE id = $1", &[&a])
        .await
        .expect_err("shard 0 is busy");
    assert_eq!(sqlstate(&err), "53300");
    let msg = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(
        msg.contains(&env.map.shards()[0].range.to_string()),
        "{msg}"
    );
    other
        .execute(
            "INSERT INTO kv (id, v) VALUES ($1, 'free') ON CONFLICT (id) DO NOTHING",
            &[&b],
        )
        .await
        .expect("shard 1 is not blocked by shard 0");

    tx.commit().await.expect("commit");
    let row = other
        .query_one("SELECT v FROM kv WHERE id = $1", &[&a])
        .await
        .expect("shard 0 is free again");
    assert_eq!(row.get::<_, String>(0), "held");
}

/// The router's statement timeout cancels a long statement on its shard (57014), the
/// slow-statement log names it, and the connection stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_and_slow_statement_log() {
    let env = shared_env();
    let router = Router::start_with(
        &env.map,
        "[limits]\nstatement_timeout_ms = 300\nslow_statement_ms = 100\n",
    );
    let client = router.connect().await;
    let err = client
        .simple_query("SELECT pg_sleep(5)")
        .await
        .expect_err("timed out");
    assert_eq!(sqlstate(&err), "57014");
    client
        .simple_query("SELECT pg_sleep(0.2)")
        .await
        .expect("under the timeout");
    let row = client
        .query_one("SELECT 41 + 1", &[])
        .await
        .expect("usable");
    assert_eq!(row.get::<_, i32>(0), 42);
    let slow = router.log_lines("slow statement");
    assert!(slow.iter().any(|l| l.contains("pg_sleep(0.2)")), "{slow:?}");
    assert!(
        !slow.iter().any(|l| l.contains("41 + 1")),
        "a fast statement after a slow one is not logged: {slow:?}"
    );
}

/// A client's CancelRequest reaches the backend running its statement, and only that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_requests_reach_the_right_backend() {
    let env = shared_env();
    let client = env.router.connect().await;
    let other = env.router.connect().await;
    let token = client.cancel_token();
    let sleeper =
        tokio::spawn(async move { client.simple_query("SELECT pg_sleep(30)").await.map(|_| ()) });
    let bystander =
        tokio::spawn(async move { other.simple_query("SELECT pg_sleep(1)").await.map(|_| ()) });
    // A cancel that arrives before the statement reaches its backend cancels nothing (as on
    // Postgres): send it once the statement runs.
    wait_until_running(env, "SELECT pg_sleep(30)").await;
    token
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("send cancel");
    let result = tokio::time::timeout(Duration::from_secs(20), sleeper)
        .await
        .ok()
        .map(|joined| joined.expect("join"));
    let err = result.expect("the statement ended").expect_err("cancelled");
    assert_eq!(sqlstate(&err), "57014");
    bystander
        .await
        .expect("join")
        .expect("the other client's statement is not cancelled");
}

/// After login, a malformed message ends that session with FATAL 08P01; nothing else notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_after_login_get_08p01() {
    use std::io::Read;
    let env = shared_env();
    let router = Router::start_with(&env.map, "auth = \"trust\"\n");
    let cases: [(&str, Vec<u8>); 3] = [
        ("unknown message type", vec![b'!', 0, 0, 0, 4]),
        ("Bind that ends early", vec![b'B', 0, 0, 0, 6, b'x', 0]),
        (
            "Query without its NUL",
            vec![
                b'Q', 0, 0, 0, 12, b'S', b'E', b'L', b'E', b'C', b'T', b' ', b'1',
            ],
        ),
    ];
    for (what, message) in cases {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", router.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut startup = Vec::new();
        let params = b"user\0app\0database\0app\0\0";
        startup.extend_from_slice(&((8 + params.len()) as i32).to_be_bytes());
        startup.extend_from_slice(&196_608i32.to_be_bytes());
        startup.extend_from_slice(params);
        s.write_all(&startup).expect("startup");
        // Read the greeting up to ReadyForQuery.
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(6).any(|w| w == [b'Z', 0, 0, 0, 5, b'I']) {
            let n = s.read(&mut buf).expect("greeting");
            assert!(n > 0, "closed during login");
            got.extend_from_slice(&buf[..n]);
        }
        s.write_all(&message).expect("send the bad message");
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        assert_eq!(reply.first(), Some(&b'E'), "{what}: {reply:?}");
        let text = String::from_utf8_lossy(&reply);
        assert!(
            text.contains("FATAL") && text.contains("08P01"),
            "{what}: {text}"
        );
    }
    let client = router.connect().await;
    client
        .query_one("SELECT 1", &[])
        .await
        .expect("others unaffected");
    assert!(router.is_alive());
}

/// A fleet of two routers: a cancel request that lands on the other router is passed to the
/// router whose client it is, and cancels that client's statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_sent_to_another_router_of_the_fleet_still_cancels() {
    let env = shared_env();
    let (port_a, port_b) = (common::free_port(), common::free_port());
    let a = Router::start_at(
        &env.map,
        &format!("router_id = 1\n[[peers]]\nid = 2\naddress = \"127.0.0.1:{port_b}\"\n"),
        2,
        port_a,
    );
    let b = Router::start_at(
        &env.map,
        &format!("router_id = 2\n[[peers]]\nid = 1\naddress = \"127.0.0.1:{port_a}\"\n"),
        2,
        port_b,
    );
    let client = a.connect().await;
    let token = client.cancel_token();
    let sleeper =
        tokio::spawn(async move { client.simple_query("SELECT pg_sleep(31)").await.map(|_| ()) });
    wait_until_running(env, "SELECT pg_sleep(31)").await;
    let to_b = tokio::net::TcpStream::connect(("127.0.0.1", b.port))
        .await
        .expect("connect to router b");
    token
        .cancel_query_raw(to_b, tokio_postgres::NoTls)
        .await
        .expect("send the cancel to router b");
    let result = tokio::time::timeout(Duration::from_secs(20), sleeper)
        .await
        .ok()
        .map(|joined| joined.expect("join"));
    let err = result
        .expect("the statement ended")
        .expect_err("cancelled through the other router");
    assert_eq!(sqlstate(&err), "57014");
    // Router b logs the hand-over once router a has acted on it; give it a moment.
    let mut logged = false;
    for _ in 0..100 {
        if !b
            .log_lines("passed a cancel request to its router")
            .is_empty()
        {
            logged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(logged, "{}", b.log_text());
}

/// Waits until a backend of any shard runs `query` (the shards' `pg_stat_activity`).
async fn wait_until_running(env: &common::Env, query: &str) {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = '{}'",
        query.replace('\'', "''")
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let running = (0..env.map.shards().len()).any(|s| env.on_shard(s, &sql) != "0");
        if running {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{query} never started on a shard"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
