//! Session settings under transaction pooling: with one backend connection per shard shared
//! by two clients, each client always sees its own settings (from SET and from its startup
//! packet) and never the other's.

mod common;

use common::{rows, shared_env, sqlstate, Router};
use tokio_postgres::{Client, SimpleQueryMessage};

async fn show(client: &Client, sql: &str) -> String {
    let msgs = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    msgs.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("NULL").to_string()),
            _ => None,
        })
        .unwrap_or_default()
}

/// Runs `sql` on every shard's database, straight on its server.
fn on_every_shard(env: &common::Env, sql: &str) {
    for shard in 0..env.map.shards().len() {
        env.on_shard(shard, sql);
    }
}

/// Creates `role` on every server unless it exists.
fn role_on_every_shard(env: &common::Env, role: &str) {
    on_every_shard(
        env,
        &format!("DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN CREATE ROLE {role}; END IF; END$$"),
    );
}

/// A router with one worker and one backend connection per shard, and `shared` shared ones
/// (`extra`: top-level settings).
fn one_connection_router(env: &common::Env, shared: usize, extra: &str) -> Router {
    Router::start_threads_pub(
        &env.map,
        &format!("{extra}[pool]\nmax_size = 1\nshared_connections = {shared}\ncheckout_timeout_ms = 3000\n"),
        1,
    )
}

/// `b` takes every backend connection of the router, with its own settings: every shard's
/// shared one (a point select on each) and pooled one (a read of every shard), so that the
/// next statement of another client needs its settings given again wherever it goes.
async fn take_every_connection(env: &common::Env, b: &Client) {
    for shard in 0..env.map.shards().len() {
        let key = env.key_on(shard, 1);
        show(b, &format!("SELECT count(*) FROM kv WHERE id = {key}")).await;
    }
    show(b, "SELECT count(*) FROM kv").await;
}

/// `SET a; SET b` in one Query (as some drivers send at connect) follows the client to every
/// connection; when one of them fails, Postgres undoes the Query's others, and so does the
/// router.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_settings_in_one_query_follow_their_client() {
    let env = shared_env();
    let router = Router::start_single_pool(&env.map, 1, "");
    let a = router.connect().await;
    a.batch_execute("SET TimeZone = 'Asia/Tokyo'; SET app.one = 'x;y'; SET extra_float_digits = 0")
        .await
        .expect("several settings");
    for round in 0..8 {
        // Statements without a table go round robin over the shards' single connections.
        assert_eq!(
            show(&a, "SHOW TimeZone").await,
            "Asia/Tokyo",
            "round {round}"
        );
        assert_eq!(show(&a, "SELECT current_setting('app.one')").await, "x;y");
        assert_eq!(show(&a, "SHOW extra_float_digits").await, "0");
    }
    let err = a
        .batch_execute("SET TimeZone = 'Europe/Paris'; SET no_such_setting = 1")
        .await
        .expect_err("an unknown setting");
    assert_eq!(err.code().map(|c| c.code()), Some("42704"));
    for round in 0..8 {
        assert_eq!(
            show(&a, "SHOW TimeZone").await,
            "Asia/Tokyo",
            "round {round}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_follow_their_client_and_only_their_client() {
    let env = shared_env();
    let router = Router::start_single_pool(&env.map, 1, "");
    let mut config: tokio_postgres::Config = router.url().parse().expect("url");
    config
        .application_name("client-a")
        .options("-c app.origin=startup-a");
    let (a, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect a");
    tokio::spawn(conn);
    let b = router.connect().await;
    let b_default_tz = show(&b, "SHOW TimeZone").await;

    a.simple_query("SET TimeZone = 'Asia/Tokyo'")
        .await
        .expect("set");
    a.simple_query("SET app.username = 'alice'")
        .await
        .expect("set custom");
    a.simple_query("SET search_path TO pg_catalog, public")
        .await
        .expect("set search_path");
    for round in 0..12 {
        // Statements without a table go round robin over the shards, so both clients meet
        // every shard's single connection.
        assert_eq!(
            show(&a, "SHOW TimeZone").await,
            "Asia/Tokyo",
            "round {round}"
        );
        assert_eq!(
            show(&a, "SELECT current_setting('app.username')").await,
            "alice"
        );
        assert_eq!(show(&a, "SHOW application_name").await, "client-a");
        assert_eq!(
            show(&a, "SELECT current_setting('app.origin')").await,
            "startup-a"
        );
        assert_eq!(show(&a, "SHOW search_path").await, "pg_catalog, public");
        assert_eq!(
            show(&b, "SHOW TimeZone").await,
            b_default_tz,
            "round {round}: b must not see a's TimeZone"
        );
        // Postgres keeps a custom setting defined (empty) on a connection once any session set
        // it; the value never crosses over.
        let other = show(&b, "SELECT current_setting('app.username', true)").await;
        assert!(
            other == "NULL" || other.is_empty(),
            "round {round}: b sees {other:?}"
        );
        assert_ne!(show(&b, "SHOW application_name").await, "client-a");
        let origin = show(&b, "SELECT current_setting('app.origin', true)").await;
        assert!(
            origin == "NULL" || origin.is_empty(),
            "round {round}: b sees {origin:?}"
        );
    }
    // Keyed statements too: the setting is there on the key's shard.
    let id = env.key_on(2, 11_000_000);
    a.execute(
        "INSERT INTO kv (id, v) VALUES ($1, current_setting('app.username'))",
        &[&id],
    )
    .await
    .expect("insert");
    assert_eq!(
        env.on_shard(2, &format!("SELECT v FROM kv WHERE id = {id}")),
        "alice"
    );

    // A SET inside a rolled-back transaction is undone; SET LOCAL ends with its transaction.
    a.simple_query("BEGIN").await.expect("begin");
    a.simple_query(&format!("SELECT v FROM kv WHERE id = {id}"))
        .await
        .expect("pin");
    a.simple_query("SET app.username = 'rolled back'")
        .await
        .expect("set in tx");
    a.simple_query("ROLLBACK").await.expect("rollback");
    assert_eq!(
        show(&a, "SELECT current_setting('app.username')").await,
        "alice"
    );
    a.simple_query("BEGIN").await.expect("begin");
    a.simple_query(&format!("SELECT v FROM kv WHERE id = {id}"))
        .await
        .expect("pin");
    a.simple_query("SET LOCAL app.username = 'local'")
        .await
        .expect("set local");
    assert_eq!(
        show(&a, "SELECT current_setting('app.username')").await,
        "local"
    );
    a.simple_query("COMMIT").await.expect("commit");
    assert_eq!(
        show(&a, "SELECT current_setting('app.username')").await,
        "alice"
    );
    a.simple_query("BEGIN").await.expect("begin");
    a.simple_query(&format!("SELECT v FROM kv WHERE id = {id}"))
        .await
        .expect("pin");
    a.simple_query("SET app.username = 'committed'")
        .await
        .expect("set in tx");
    a.simple_query("COMMIT").await.expect("commit");
    assert_eq!(
        show(&a, "SELECT current_setting('app.username')").await,
        "committed"
    );

    // RESET returns to the startup value, RESET ALL to all of them.
    a.simple_query("SET application_name = 'renamed'")
        .await
        .expect("rename");
    assert_eq!(show(&a, "SHOW application_name").await, "renamed");
    a.simple_query("RESET application_name")
        .await
        .expect("reset");
    assert_eq!(show(&a, "SHOW application_name").await, "client-a");
    a.simple_query("RESET ALL").await.expect("reset all");
    assert_eq!(show(&a, "SHOW TimeZone").await, b_default_tz);
    assert_eq!(
        show(&a, "SELECT current_setting('app.origin')").await,
        "startup-a"
    );
    let other = show(&b, "SELECT current_setting('app.username', true)").await;
    assert!(other == "NULL" || other.is_empty(), "b sees {other:?}");
}

/// A client that prepares more distinct statements than a backend connection keeps (1000)
/// still runs every one of them; the connection never holds more than the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_per_connection_are_bounded() {
    let env = shared_env();
    // One connection per shard, so every statement lands on those four.
    let router = Router::start_single_pool(&env.map, 1, "");
    let client = router.connect().await;
    // Every statement runs on shard 0's single connection.
    let range = env.map.shards()[0].range.to_string();
    client
        .simple_query(&format!("SET shardgate.shard = '{range}'"))
        .await
        .expect("pin to one shard");
    let mut statements = Vec::new();
    for i in 0..1100 {
        let stmt = client
            .prepare(&format!("SELECT $1::int + {i}"))
            .await
            .expect("prepare");
        let row = client.query_one(&stmt, &[&1i32]).await.expect("run");
        assert_eq!(row.get::<_, i32>(0), 1 + i);
        statements.push(stmt);
    }
    // The first ones were evicted somewhere along the way: they are prepared again on demand.
    for (i, stmt) in statements.iter().enumerate().take(20) {
        let row = client.query_one(stmt, &[&2i32]).await.expect("run again");
        assert_eq!(row.get::<_, i32>(0), 2 + i as i32);
    }
    let rows = client
        .simple_query("SELECT count(*) FROM pg_prepared_statements")
        .await
        .expect("count");
    let n: i64 = rows
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()),
            _ => None,
        })
        .expect("a count");
    assert!(
        (900..=1000).contains(&n),
        "shard 0's connection holds {n} prepared statements"
    );
}

/// SQL-level PREPARE / EXECUTE / DEALLOCATE: with one connection per shard shared by two
/// clients, each client's names are its own, EXECUTE lands on the shard of the key among its
/// arguments, and errors come with Postgres's SQLSTATEs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_prepare_execute_deallocate() {
    let env = shared_env();
    let router = Router::start_single_pool(&env.map, 1, "");
    let a = router.connect().await;
    let b = router.connect().await;
    // Keys on two different shards.
    let (k0, k3) = (env.key_on(0, 41_000_000), env.key_on(3, 41_000_000));
    for k in [k0, k3] {
        a.execute(
            "INSERT INTO kv (id, v) VALUES ($1, $2)",
            &[&k, &format!("v{k}")],
        )
        .await
        .expect("insert");
    }
    // The same name, different texts, in two clients.
    a.simple_query("PREPARE get (bigint) AS SELECT v FROM kv WHERE id = $1")
        .await
        .expect("prepare a");
    b.simple_query("PREPARE get AS SELECT id, v || '!' FROM kv WHERE id = $1")
        .await
        .expect("prepare b");
    for k in [k0, k3] {
        let got = rows(
            &a.simple_query(&format!("EXECUTE get({k})"))
                .await
                .expect("execute a"),
        );
        assert_eq!(got, [[format!("v{k}")]]);
        let got = rows(
            &b.simple_query(&format!("EXECUTE get ('{k}')"))
                .await
                .expect("execute b"),
        );
        assert_eq!(got, [[k.to_string(), format!("v{k}!")]]);
    }
    // A write, its tag passed through, in a transaction that stays on the key's shard.
    a.simple_query("PREPARE put (bigint, text) AS UPDATE kv SET v = $2 WHERE id = $1")
        .await
        .expect("prepare put");
    let msgs = a
        .simple_query(&format!("BEGIN; EXECUTE put({k0}, 'changed'); COMMIT"))
        .await;
    // Several statements in one query cannot include EXECUTE: refused, nothing ran.
    assert_eq!(sqlstate(&msgs.expect_err("multi-statement")), "0A000");
    a.simple_query("BEGIN").await.expect("begin");
    let done = a
        .simple_query(&format!("EXECUTE put({k0}, 'changed')"))
        .await
        .expect("execute put");
    assert!(
        done.iter()
            .any(|m| matches!(m, SimpleQueryMessage::CommandComplete(1))),
        "{done:?}"
    );
    // The transaction goes on to the other key's shard ([transactions] cross_shard = "multi"),
    // and its ROLLBACK undoes both.
    let done = a
        .simple_query(&format!("EXECUTE put({k3}, 'other shard')"))
        .await
        .expect("other shard in the transaction");
    assert!(
        done.iter()
            .any(|m| matches!(m, SimpleQueryMessage::CommandComplete(1))),
        "{done:?}"
    );
    a.simple_query("ROLLBACK").await.expect("rollback");
    assert_eq!(
        env.on_shard(0, &format!("SELECT v FROM kv WHERE id = {k0}")),
        format!("v{k0}")
    );
    assert_eq!(
        env.on_shard(3, &format!("SELECT v FROM kv WHERE id = {k3}")),
        format!("v{k3}")
    );
    // Postgres's errors: duplicate name, unknown name, wrong argument count, a statement that
    // does not analyze (reported at PREPARE, and the name is not taken).
    let err = a
        .simple_query("PREPARE get AS SELECT 1")
        .await
        .expect_err("duplicate");
    assert_eq!(sqlstate(&err), "42P05");
    let err = b
        .simple_query("EXECUTE put(1, 'x')")
        .await
        .expect_err("b has no put");
    assert_eq!(sqlstate(&err), "26000");
    let err = a
        .simple_query("EXECUTE get(1, 2)")
        .await
        .expect_err("two args");
    assert_eq!(sqlstate(&err), "42601");
    let err = a
        .simple_query("PREPARE bad AS SELECT nope FROM no_such_table")
        .await
        .expect_err("bad statement");
    assert_eq!(sqlstate(&err), "42P01");
    let err = a
        .simple_query("EXECUTE bad")
        .await
        .expect_err("bad was not kept");
    assert_eq!(sqlstate(&err), "26000");
    // SQL and protocol statements share one namespace, as in Postgres.
    let got = a
        .query_one("SELECT 1 WHERE $1::int > 0", &[&1i32])
        .await
        .expect("protocol statement");
    assert_eq!(got.get::<_, i32>(0), 1);
    a.simple_query("DEALLOCATE get").await.expect("deallocate");
    let err = a
        .simple_query(&format!("EXECUTE get({k0})"))
        .await
        .expect_err("gone");
    assert_eq!(sqlstate(&err), "26000");
    let err = a.simple_query("DEALLOCATE get").await.expect_err("gone");
    assert_eq!(sqlstate(&err), "26000");
    // b's statement of the same name is untouched; DEALLOCATE ALL clears b's.
    let got = rows(
        &b.simple_query(&format!("EXECUTE get({k3})"))
            .await
            .expect("b still"),
    );
    assert_eq!(got, [[k3.to_string(), format!("v{k3}!")]]);
    b.simple_query("DEALLOCATE ALL")
        .await
        .expect("deallocate all");
    let err = b
        .simple_query(&format!("EXECUTE get({k3})"))
        .await
        .expect_err("gone");
    assert_eq!(sqlstate(&err), "26000");
    // Through the extended protocol these are refused (a driver's own prepared statements are
    // the way there), never run on one pooled connection and lost.
    let err = a
        .execute("PREPARE x AS SELECT 1", &[])
        .await
        .expect_err("extended");
    assert_eq!(sqlstate(&err), "0A000");
    // Both clients keep working.
    assert_eq!(show(&a, "SELECT 7").await, "7");
    assert_eq!(show(&b, "SELECT 8").await, "8");
}

/// A temporary object outlives its transaction: the session keeps the connection it made it
/// on (as a session pooler would) for every later statement that needs its shard or none, in
/// both protocols, and no other client ever sees it; the connection is closed, never pooled,
/// when the client leaves. Its transactions stay on one shard. LISTEN is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporary_objects_keep_their_sessions_connection_and_only_theirs() {
    let env = shared_env();
    let router = Router::start_single_pool(&env.map, 2, "");
    let a = router.connect().await;
    let b = router.connect().await;
    let default = env.map.default_shard();
    let temp_tables = || {
        env.on_shard(
            default,
            "SELECT count(*) FROM pg_class WHERE relname = 'scratch' AND relpersistence = 't'",
        )
    };
    assert_eq!(temp_tables(), "0");
    a.simple_query("CREATE TEMP TABLE scratch (x int)")
        .await
        .expect("a temporary table");
    a.simple_query("INSERT INTO scratch VALUES (1), (2)")
        .await
        .expect("insert");
    for round in 0..6 {
        // Between its statements the client has no transaction; other clients run theirs.
        assert_eq!(
            show(&a, "SELECT sum(x) FROM scratch").await,
            "3",
            "round {round}"
        );
        assert_eq!(
            show(&b, "SELECT to_regclass('pg_temp.scratch') IS NULL").await,
            "t"
        );
        let row = a
            .query_one("SELECT count(*) FROM scratch WHERE x > $1", &[&0i32])
            .await
            .expect("extended protocol");
        assert_eq!(row.get::<_, i64>(0), 2);
    }
    a.batch_execute("BEGIN; INSERT INTO scratch VALUES (3); COMMIT")
        .await
        .expect("a transaction");
    a.batch_execute("BEGIN; INSERT INTO scratch VALUES (100); ROLLBACK")
        .await
        .expect("a rolled back transaction");
    assert_eq!(show(&a, "SELECT sum(x) FROM scratch").await, "6");
    // A view over it is temporary too (Postgres makes it so), on the same connection.
    a.simple_query("CREATE VIEW scratch_view AS SELECT x FROM scratch")
        .await
        .expect("a view over the temporary table");
    assert_eq!(show(&a, "SELECT count(*) FROM scratch_view").await, "3");
    // Keys on other shards still run where they belong, outside a transaction and inside one.
    let other = (0..env.map.shards().len())
        .find(|&s| s != default)
        .expect("a second shard");
    let (k1, k2) = (env.key_on(other, 900_000), env.key_on(default, 900_000));
    a.simple_query(&format!(
        "INSERT INTO kv (id, v) VALUES ({k1}, 'kept') ON CONFLICT (id) DO UPDATE SET v = 'kept'"
    ))
    .await
    .expect("another shard");
    a.batch_execute(&format!(
        "BEGIN; UPDATE kv SET v = 'kept-tx' WHERE id = {k1}; COMMIT"
    ))
    .await
    .expect("a transaction on another shard");
    assert_eq!(
        env.on_shard(other, &format!("SELECT v FROM kv WHERE id = {k1}")),
        "kept-tx"
    );
    // But never across shards: the kept connection cannot be one part of several.
    a.simple_query("BEGIN").await.expect("begin");
    a.simple_query(&format!("UPDATE kv SET v = 'x' WHERE id = {k1}"))
        .await
        .expect("first shard");
    let err = a
        .simple_query(&format!("UPDATE kv SET v = 'x' WHERE id = {k2}"))
        .await
        .expect_err("a second shard");
    assert_eq!(sqlstate(&err), "0A000");
    a.simple_query("ROLLBACK").await.expect("rollback");
    let err = a.simple_query("LISTEN chan").await.expect_err("listen");
    assert_eq!(sqlstate(&err), "0A000");
    // A temporary table that ends with its transaction needs no keeping.
    b.batch_execute("BEGIN; CREATE TEMP TABLE passing (x int) ON COMMIT DROP; INSERT INTO passing VALUES (1); COMMIT")
        .await
        .expect("ON COMMIT DROP");
    assert_eq!(temp_tables(), "1");
    drop(a);
    // The client left: its connection was closed, and its tables went with it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while temp_tables() != "0" {
        assert!(
            std::time::Instant::now() < deadline,
            "the kept connection outlived its client"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for _ in 0..4 {
        assert_eq!(
            show(&b, "SELECT to_regclass('pg_temp.scratch') IS NULL").await,
            "t"
        );
    }
}

/// `SET ROLE` and `SET SESSION AUTHORIZATION` follow their client to every connection and
/// never reach another client (`RESET ALL` keeps both on Postgres, so the router resets them
/// itself), pooled and shared alike; `SET SESSION CHARACTERISTICS` follows too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_follow_their_client_and_never_reach_another() {
    let env = shared_env();
    for shard in 0..env.map.shards().len() {
        env.on_shard(
            shard,
            "DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sg_reader') THEN CREATE ROLE sg_reader; END IF; END$$",
        );
    }
    for extra in ["", "[pool]\nshared_connections = 0\n"] {
        let router = Router::start_with(&env.map, extra);
        let a = router.connect().await;
        let login = show(&a, "SELECT current_user").await;
        a.simple_query("SET ROLE sg_reader")
            .await
            .expect("set role");
        a.simple_query("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            .await
            .expect("characteristics");
        let mut others = Vec::new();
        for _ in 0..3 {
            others.push(router.connect().await);
        }
        for round in 0..10 {
            assert_eq!(
                show(&a, "SELECT current_user").await,
                "sg_reader",
                "{extra} round {round}"
            );
            assert_eq!(show(&a, "SHOW transaction_read_only").await, "on");
            for b in &others {
                assert_eq!(
                    show(b, "SELECT current_user").await,
                    login,
                    "{extra} round {round}"
                );
                assert_eq!(show(b, "SHOW transaction_read_only").await, "off");
                let row = b
                    .query_one("SELECT current_user::text", &[])
                    .await
                    .expect("extended");
                assert_eq!(row.get::<_, String>(0), login);
            }
        }
        let err = a
            .simple_query("CREATE TABLE not_in_read_only (x int)")
            .await
            .expect_err("read only");
        assert_eq!(sqlstate(&err), "25006");
        // The role's own setting forms, too.
        a.simple_query("SET role = 'sg_reader'")
            .await
            .expect("set role =");
        assert_eq!(show(&a, "SELECT current_user").await, "sg_reader");
        for b in &others {
            assert_eq!(show(b, "SELECT current_user").await, login);
        }
        a.simple_query("RESET ROLE").await.expect("reset role");
        assert_eq!(show(&a, "SELECT current_user").await, login);
        // A ROLLBACK TO SAVEPOINT undoes only what came after the savepoint, and what it undid
        // reaches nobody.
        a.batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE")
            .await
            .expect("read write");
        for sql in ["BEGIN", "SET ROLE sg_reader", "SAVEPOINT s"] {
            a.simple_query(sql).await.expect(sql);
        }
        a.simple_query("SELECT 1/0")
            .await
            .expect_err("division by zero");
        for sql in [
            "ROLLBACK TO SAVEPOINT s",
            "SAVEPOINT t",
            "RESET ROLE",
            "ROLLBACK TO t",
            "COMMIT",
        ] {
            a.simple_query(sql).await.expect(sql);
        }
        for _ in 0..4 {
            assert_eq!(
                show(&a, "SELECT current_user").await,
                "sg_reader",
                "{extra}"
            );
            for b in &others {
                assert_eq!(show(b, "SELECT current_user").await, login, "{extra}");
            }
        }
        a.simple_query("RESET ROLE").await.expect("reset role");
    }
}

/// `RESET` goes back to the client's startup value, as on Postgres, although the backend
/// connection's own default is another (seen with pg_regress, whose libpq sends `DateStyle`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_goes_back_to_the_startup_value() {
    let env = shared_env();
    let router = Router::start_single_pool(&env.map, 1, "");
    let mut config: tokio_postgres::Config = router.url().parse().expect("url");
    config.options("-c DateStyle=Postgres,MDY -c TimeZone=PST8PDT");
    let (a, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    for reset in ["RESET ALL", "RESET DateStyle", "SET DateStyle = DEFAULT"] {
        a.batch_execute("SET DateStyle = 'SQL, DMY'")
            .await
            .expect("set");
        assert_eq!(show(&a, "SHOW DateStyle").await, "SQL, DMY");
        a.batch_execute(reset).await.expect(reset);
        for round in 0..4 {
            assert_eq!(
                show(&a, "SHOW DateStyle").await,
                "Postgres, MDY",
                "{reset} round {round}"
            );
            assert_eq!(
                show(&a, "SHOW TimeZone").await,
                "PST8PDT",
                "{reset} round {round}"
            );
        }
    }
    // A DateStyle of one part keeps the other (Postgres merges them); RESET TIME ZONE.
    a.batch_execute("SET datestyle TO dmy; SET TIME ZONE 'CST7CDT'; RESET TIME ZONE")
        .await
        .expect("datestyle and time zone");
    for round in 0..4 {
        assert_eq!(
            show(&a, "SHOW DateStyle").await,
            "Postgres, DMY",
            "round {round}"
        );
        assert_eq!(show(&a, "SHOW TimeZone").await, "PST8PDT", "round {round}");
    }
}

/// A client's setting that its connection can no longer be given (the text search
/// configuration it names was dropped since) fails the client's statements with the server's
/// error, as `SET` would, rather than letting them run without it: with other settings they
/// could answer differently (here `to_tsvector` would use the server's default configuration).
/// Pooled and shared alike, in and out of a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_that_cannot_be_given_again_fails_the_statement_never_runs_it_without() {
    let env = shared_env();
    for (round, shared) in [(0, 1), (1, 0)] {
        let conf = format!("public.sg_gone_{round}");
        on_every_shard(
            env,
            &format!("CREATE TEXT SEARCH CONFIGURATION {conf} (COPY = simple)"),
        );
        let router = one_connection_router(env, shared, "");
        let a = router.connect().await;
        let b = router.connect().await;
        a.simple_query(&format!("SET default_text_search_config = '{conf}'"))
            .await
            .expect("set");
        let words = "SELECT to_tsvector('the cats')::text";
        // `simple` keeps the stop word and does not stem.
        assert_eq!(show(&a, words).await, "'cats':2 'the':1", "shared {shared}");
        on_every_shard(env, &format!("DROP TEXT SEARCH CONFIGURATION {conf}"));
        take_every_connection(env, &b).await;
        for in_transaction in [false, true, false] {
            if in_transaction {
                a.simple_query("BEGIN").await.expect("begin");
            }
            for _ in 0..3 {
                match a.simple_query(words).await {
                    Err(err) => {
                        // The `SET`'s own error: the statement did not run.
                        assert_eq!(sqlstate(&err), "22023", "shared {shared}: {err:?}");
                        assert!(
                            format!("{err:?}").contains("giving this session's settings"),
                            "{err:?}"
                        );
                    }
                    Ok(rows) => {
                        panic!("shared {shared}: ran without the client's setting: {rows:?}")
                    }
                }
                if in_transaction {
                    break;
                }
            }
            if in_transaction {
                a.simple_query("ROLLBACK").await.expect("rollback");
            }
            take_every_connection(env, &b).await;
        }
        // The client can always get out of it, and the other client never noticed.
        a.simple_query("RESET default_text_search_config")
            .await
            .expect("reset");
        assert_ne!(show(&a, words).await, "", "shared {shared}");
        assert_eq!(show(&b, "SELECT 1").await, "1");
    }
}

/// A `SET ROLE` whose role was dropped since fails the client's statements on every path (one
/// shard, a read of every shard, DDL on every shard, a write on several), never runs them as
/// the router's own user; `RESET ROLE` gets the client out of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_is_gone_fails_every_path_never_runs_as_the_router() {
    let env = shared_env();
    let shards = env.map.shards().len();
    let role = "sg_role_dropped_later";
    role_on_every_shard(env, role);
    on_every_shard(env, &format!("GRANT ALL ON kv TO {role}"));
    let router = one_connection_router(env, 1, "");
    let a = router.connect().await;
    let b = router.connect().await;
    let login = show(&b, "SELECT current_user").await;
    a.simple_query(&format!("SET ROLE {role}"))
        .await
        .expect("set role");
    assert_eq!(show(&a, "SELECT current_user").await, role);
    on_every_shard(env, &format!("REVOKE ALL ON kv FROM {role}"));
    on_every_shard(env, &format!("DROP ROLE IF EXISTS {role}"));
    take_every_connection(env, &b).await;
    for sql in [
        "SELECT current_user",
        "SELECT count(*) FROM kv",
        "CREATE TABLE sg_never_made (id bigint PRIMARY KEY)",
        "UPDATE kv SET v = v WHERE id IN (1, 2, 3, 4, 5, 6, 7, 8)",
    ] {
        match a.simple_query(sql).await {
            Ok(rows) => panic!("{sql} ran without the client's role: {rows:?}"),
            Err(err) => assert!(
                format!("{err:?}").contains("giving this session's settings"),
                "{sql}: {err:?}"
            ),
        }
    }
    for shard in 0..shards {
        assert_eq!(
            env.on_shard(shard, "SELECT to_regclass('sg_never_made') IS NULL"),
            "t"
        );
    }
    a.simple_query("RESET ROLE").await.expect("reset role");
    assert_eq!(show(&a, "SELECT current_user").await, login);
    assert_eq!(show(&b, "SELECT current_user").await, login);
}

/// A client's fragile settings failing on a shared lane leave the lane holding no one's
/// settings (the reset before them ran): the next client's statement gets its own settings
/// again, rather than running on the server's defaults under the lane's old claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_whose_settings_failed_holds_no_ones_settings() {
    let env = shared_env();
    let conf = "public.sg_gone_lane";
    on_every_shard(
        env,
        &format!("CREATE TEXT SEARCH CONFIGURATION {conf} (COPY = simple)"),
    );
    let router = one_connection_router(env, 1, "");
    let a = router.connect().await;
    let b = router.connect().await;
    a.simple_query(&format!("SET default_text_search_config = '{conf}'"))
        .await
        .expect("set");
    b.simple_query("SET search_path = b_only, public")
        .await
        .expect("set");
    on_every_shard(env, &format!("DROP TEXT SEARCH CONFIGURATION {conf}"));
    for round in 0..16 {
        let key = env.key_on(round % env.map.shards().len(), 1);
        a.simple_query(&format!("SELECT 1 FROM kv WHERE id = {key}"))
            .await
            .expect_err("the client's setting is gone");
        // On the same shard's lane as the failed request (an aggregate has its row whether
        // the key is there or not).
        let path =
            format!("SELECT current_setting('search_path'), count(*) FROM kv WHERE id = {key}");
        assert_eq!(show(&b, &path).await, "b_only, public", "round {round}");
    }
}

/// In an extended batch, a `RESET ROLE` after a statement does not let that statement run
/// without the client's role (the way out of settings that cannot be given is a Query alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_later_in_a_batch_does_not_let_what_comes_before_run_without_the_role() {
    use common::raw::{bind, execute, parse, sync, Raw};
    let env = shared_env();
    let role = "sg_role_gone_in_batch";
    role_on_every_shard(env, role);
    let router = one_connection_router(env, 0, "auth = \"trust\"\n");
    let mut a = Raw::connect(&router);
    let b = router.connect().await;
    a.send(&common::raw::msg(
        b'Q',
        format!("SET ROLE {role}\0").as_bytes(),
    ));
    assert_eq!(a.until_ready().1, "");
    on_every_shard(env, &format!("DROP ROLE IF EXISTS {role}"));
    take_every_connection(env, &b).await;
    a.send(
        &[
            parse("q", "SELECT current_user"),
            bind("q", &[]),
            execute(),
            parse("r", "RESET ROLE"),
            bind("r", &[]),
            execute(),
            sync(),
        ]
        .concat(),
    );
    let (tags, errors) = a.until_ready();
    assert!(
        !tags.contains(&b'D'),
        "ran without the role: {tags:?} {errors}"
    );
    assert!(
        errors.contains("giving this session's settings"),
        "{errors}"
    );
    // A Query alone gets the client out.
    a.send(&common::raw::msg(b'Q', b"RESET ROLE\0"));
    assert_eq!(a.until_ready().1, "");
}

/// `SET TIME ZONE INTERVAL ...` has no `SET timezone = ...` form: it is not followed (the
/// connection is reset after it), and the client's other settings still follow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_zone_interval_does_not_lose_the_other_settings() {
    let env = shared_env();
    let router = Router::start_single_pool(&env.map, 1, "");
    let a = router.connect().await;
    let b = router.connect().await;
    a.simple_query("SET application_name = 'mine'")
        .await
        .expect("set");
    a.simple_query("SET TIME ZONE INTERVAL '+02:00' HOUR TO MINUTE")
        .await
        .expect("set time zone");
    for round in 0..8 {
        take_every_connection(env, &b).await;
        assert_eq!(
            show(&a, "SHOW application_name").await,
            "mine",
            "round {round}"
        );
    }
}

/// A list of names given at startup (`options=-c search_path=a,b`, as JDBC's `currentSchema`
/// and Npgsql's `SearchPath` send it) stays a list on every connection, and a comment in a
/// `SET` hides none of the settings given after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_lists_and_commented_settings_follow_their_client() {
    let env = shared_env();
    let router = one_connection_router(env, 0, "");
    let mut config: tokio_postgres::Config = router.url().parse().expect("url");
    config.options("-c search_path=pg_catalog,PUBLIC");
    let (a, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect with options");
    tokio::spawn(conn);
    let b = router.connect().await;
    a.simple_query("SET lock_timeout = '7s' -- a comment\n")
        .await
        .expect("set with a comment");
    a.simple_query("SET statement_timeout = '5s'")
        .await
        .expect("set");
    for round in 0..8 {
        take_every_connection(env, &b).await;
        assert_eq!(
            show(&a, "SELECT current_schemas(false)::text").await,
            "{pg_catalog,public}",
            "round {round}"
        );
        assert_eq!(show(&a, "SHOW lock_timeout").await, "7s");
        assert_eq!(show(&a, "SHOW statement_timeout").await, "5s");
    }
}
