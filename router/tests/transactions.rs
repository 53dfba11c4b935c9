//! Transactions that span shards (`[transactions] cross_shard = "multi"`, the default), through
//! a real router in front of a 4-shard cluster: explicit transactions in both protocols commit
//! or roll back on every shard they touched; an extended-protocol batch over several shards is
//! one transaction, as on one Postgres (all of it or nothing at its Sync); a deferred check that
//! fails at COMMIT rolls every shard back; a deadlock across shards ends with the lock timeout;
//! a cancel hits only the statement running; a client gone mid-transaction leaves nothing; a
//! transaction opened by statements that need no shard takes the catalog queries an ORM sends
//! after its SAVEPOINT (SQLAlchemy 2.1's first connection).
//! Each outcome is checked on the shards directly, and no shard is left with a connection
//! idle in a transaction.

mod common;

use std::time::{Duration, Instant};

use common::raw::{bind, execute, parse, sync, Raw};
use common::{rows, shared_env, sqlstate, Env, Router};
use shardmap::Key;
use tokio_postgres::SimpleQueryMessage;

/// One key of kv on each shard, from `from` upwards.
fn keys(env: &Env, from: i64) -> Vec<i64> {
    (0..env.map.shards().len())
        .map(|s| env.key_on(s, from))
        .collect()
}

/// How many rows of kv with these keys each shard holds, read on the shards directly.
fn present(env: &Env, keys: &[i64]) -> Vec<usize> {
    let list = keys
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    (0..env.map.shards().len())
        .map(|s| {
            env.on_shard(s, &format!("SELECT count(*) FROM kv WHERE id IN ({list})"))
                .trim()
                .parse()
                .expect("a count")
        })
        .collect()
}

/// Waits until no shard has a connection of the router idle inside a transaction (a leaked
/// participant), and fails if one stays.
fn no_transaction_left_open(env: &Env) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open: Vec<String> = (0..env.map.shards().len())
            .map(|s| {
                env.on_shard(
                    s,
                    "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%' AND usename = 'app'",
                )
                .trim()
                .to_string()
            })
            .collect();
        if open.iter().all(|n| n == "0") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "connections idle in a transaction per shard: {open:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn trust_router() -> &'static Router {
    static R: std::sync::OnceLock<Router> = std::sync::OnceLock::new();
    R.get_or_init(|| Router::start_with(&shared_env().map, "auth = \"trust\"\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_on_every_shard_commits_on_every_shard() {
    let env = shared_env();
    let client = env.router.connect().await;
    let ks = keys(env, 71_000_000);

    client
        .simple_query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .expect("begin");
    for (i, k) in ks.iter().enumerate() {
        client
            .simple_query(&format!(
                "INSERT INTO kv (id, v) VALUES ({k}, 'simple {i}')"
            ))
            .await
            .unwrap_or_else(|e| panic!("insert on shard {i}: {e}"));
        // The shard joined with the client's own BEGIN.
        let got = rows(
            &client
                .simple_query(&format!(
                    "SELECT current_setting('transaction_isolation') FROM kv WHERE id = {k}"
                ))
                .await
                .expect("isolation"),
        );
        assert_eq!(got, [["repeatable read"]], "shard {i}");
    }
    // Each shard's part sees its own writes; nobody else sees any before the COMMIT.
    for (i, k) in ks.iter().enumerate() {
        let got = rows(
            &client
                .simple_query(&format!("SELECT v FROM kv WHERE id = {k}"))
                .await
                .expect("read back"),
        );
        assert_eq!(got, [[format!("simple {i}")]]);
    }
    assert_eq!(
        present(env, &ks),
        [0, 0, 0, 0],
        "nothing visible before COMMIT"
    );
    client.simple_query("COMMIT").await.expect("commit");
    assert_eq!(present(env, &ks), [1, 1, 1, 1]);

    // The same through a driver's transaction API (extended protocol), back and forth.
    let mut client = client;
    let tx = client.transaction().await.expect("begin");
    for _ in 0..2 {
        for k in &ks {
            tx.execute("UPDATE kv SET v = v || '+' WHERE id = $1", &[k])
                .await
                .expect("update");
        }
    }
    tx.commit().await.expect("commit");
    for (i, k) in ks.iter().enumerate() {
        let row = client
            .query_one("SELECT v FROM kv WHERE id = $1", &[k])
            .await
            .expect("after commit");
        assert_eq!(row.get::<_, String>(0), format!("simple {i}++"));
    }
    no_transaction_left_open(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_or_a_failure_leaves_nothing_on_any_shard() {
    let env = shared_env();
    let mut client = env.router.connect().await;
    let ks = keys(env, 72_000_000);

    // ROLLBACK after writes on three shards.
    let tx = client.transaction().await.expect("begin");
    for k in &ks[..3] {
        tx.execute("INSERT INTO kv (id, v) VALUES ($1, 'rolled back')", &[k])
            .await
            .expect("insert");
    }
    tx.rollback().await.expect("rollback");
    assert_eq!(present(env, &ks), [0, 0, 0, 0]);

    // A unique violation on the third shard fails the whole transaction, as on one Postgres.
    client
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'exists')", &[&ks[2]])
        .await
        .expect("autocommit insert");
    let tx = client.transaction().await.expect("begin");
    for k in &ks[..2] {
        tx.execute("INSERT INTO kv (id, v) VALUES ($1, 'doomed')", &[k])
            .await
            .expect("insert");
    }
    let err = tx
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'dup')", &[&ks[2]])
        .await
        .expect_err("duplicate key");
    assert_eq!(sqlstate(&err), "23505");
    let err = tx
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'after')", &[&ks[3]])
        .await
        .expect_err("aborted transaction");
    assert_eq!(sqlstate(&err), "25P02");
    tx.rollback().await.expect("rollback");
    assert_eq!(present(env, &ks), [0, 0, 1, 0]);

    // COMMIT of a failed transaction rolls back everywhere (the simple protocol's way).
    client.simple_query("BEGIN").await.expect("begin");
    client
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES ({}, 'doomed')",
            ks[0]
        ))
        .await
        .expect("insert");
    let err = client
        .simple_query(&format!("INSERT INTO kv (id, v) VALUES ({}, 'dup')", ks[2]))
        .await
        .expect_err("duplicate");
    assert_eq!(sqlstate(&err), "23505");
    client.simple_query("COMMIT").await.expect("commit answers");
    assert_eq!(present(env, &ks), [0, 0, 1, 0]);
    client
        .simple_query("SELECT 1")
        .await
        .expect("the session goes on");
    no_transaction_left_open(env);
}

/// Several Bind/Execute pairs for keys of every shard before one Sync, as asyncpg's
/// `executemany`, pgjdbc's `executeBatch` and libpq's pipeline mode send them.
#[test]
fn a_batch_over_several_shards_is_one_transaction() {
    let env = shared_env();
    let mut c = Raw::connect(trust_router());
    let ks = keys(env, 73_000_000);
    let insert = "INSERT INTO kv (id, v) VALUES ($1, $2)";

    // All of it commits at the Sync.
    let mut batch = parse("", insert);
    for k in &ks {
        batch.extend(bind("", &[&k.to_string(), "batched"]));
        batch.extend(execute());
    }
    batch.extend(sync());
    c.send(&batch);
    assert_eq!(c.read_until(b'Z'), b"12C2C2C2CZ");
    assert_eq!(c.status, b'I', "no transaction left open for the client");
    assert_eq!(present(env, &ks), [1, 1, 1, 1]);

    // One failing row (a key that exists, on the third shard): the client gets its error, the
    // rest of the batch is skipped, and nothing of the batch remains on any shard.
    let fresh = keys(env, 73_500_000);
    let mut batch = parse("", insert);
    for k in [fresh[0], fresh[1], ks[2], fresh[3]] {
        batch.extend(bind("", &[&k.to_string(), "second"]));
        batch.extend(execute());
    }
    batch.extend(sync());
    c.send(&batch);
    assert_eq!(c.read_until(b'Z'), b"12C2C2EZ");
    assert_eq!(c.status, b'I');
    assert_eq!(present(env, &fresh), [0, 0, 0, 0]);

    // A read in the batch sees the batch's own earlier write on its shard.
    let mut batch = parse("", insert);
    batch.extend(bind("", &[&fresh[0].to_string(), "mine"]));
    batch.extend(execute());
    batch.extend(bind("", &[&fresh[1].to_string(), "mine"]));
    batch.extend(execute());
    batch.extend(parse("", "SELECT v FROM kv WHERE id = $1"));
    batch.extend(bind("", &[&fresh[0].to_string()]));
    batch.extend(execute());
    batch.extend(sync());
    c.send(&batch);
    assert_eq!(c.read_until(b'Z'), b"12C2C12DCZ");
    assert_eq!(present(env, &fresh), [1, 1, 0, 0]);

    // The connections went back clean: a one-shard batch and a plain query go on normally.
    let mut batch = parse("", "SELECT v FROM kv WHERE id = $1");
    batch.extend(bind("", &[&ks[3].to_string()]));
    batch.extend(execute());
    batch.extend(sync());
    c.send(&batch);
    assert_eq!(c.read_until(b'Z'), b"12DCZ");
    no_transaction_left_open(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_check_that_fails_at_commit_rolls_back_every_shard() {
    let env = shared_env();
    let client = env.router.connect().await;
    // Only this test writes `names`: a deferred unique check on n.
    client
        .simple_query(
            "ALTER TABLE names ADD CONSTRAINT names_n_deferred UNIQUE (n) DEFERRABLE INITIALLY DEFERRED",
        )
        .await
        .expect("add a deferred constraint on every shard");
    let shard = |name: &str| env.map.shard_for_key(&Key::Text(name));
    let mut names = (0..).map(|i| format!("deferred-{i}"));
    let first = names.next().expect("a name");
    let other = names
        .by_ref()
        .find(|n| shard(n) != shard(&first))
        .expect("a name on another shard");
    let twin = names
        .find(|n| shard(n) == shard(&other))
        .expect("a second name on that shard");

    client.simple_query("BEGIN").await.expect("begin");
    for (name, n) in [(&first, 1), (&other, 2), (&twin, 2)] {
        client
            .simple_query(&format!(
                "INSERT INTO names (name, n) VALUES ('{name}', {n})"
            ))
            .await
            .expect("deferred: accepted for now");
    }
    let err = client
        .simple_query("COMMIT")
        .await
        .expect_err("the deferred check fails");
    assert_eq!(sqlstate(&err), "23505", "{err}");
    let message = err.as_db_error().map(|e| e.message().to_string());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("rolled back on every shard")),
        "{message:?}"
    );
    for s in 0..env.map.shards().len() {
        assert_eq!(
            env.on_shard(s, "SELECT count(*) FROM names WHERE name LIKE 'deferred-%'"),
            "0",
            "shard {s}"
        );
    }
    client
        .simple_query("SELECT 1")
        .await
        .expect("the session goes on");
    no_transaction_left_open(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_across_shards_ends_with_the_lock_timeout() {
    let env = shared_env();
    let router = Router::start_with(&env.map, "[transactions]\nlock_timeout_ms = 300\n");
    let ks = keys(env, 74_000_000);
    let (a, b) = (ks[0], ks[1]);
    let setup = router.connect().await;
    for k in [a, b] {
        setup
            .execute("INSERT INTO kv (id, v) VALUES ($1, 'lock me')", &[&k])
            .await
            .expect("insert");
    }
    // x holds a's row and wants b's; y holds b's row and wants a's: a cycle across two
    // Postgres servers, which neither can see.
    let x = router.connect().await;
    let y = router.connect().await;
    for (c, k) in [(&x, a), (&y, b)] {
        c.simple_query("BEGIN").await.expect("begin");
        c.simple_query(&format!("UPDATE kv SET v = 'held' WHERE id = {k}"))
            .await
            .expect("first lock");
    }
    let started = Instant::now();
    let (to_b, to_a) = (
        format!("UPDATE kv SET v = 'x' WHERE id = {b}"),
        format!("UPDATE kv SET v = 'y' WHERE id = {a}"),
    );
    let (rx, ry) = tokio::join!(x.simple_query(&to_b), y.simple_query(&to_a));
    let codes: Vec<String> = [&rx, &ry]
        .iter()
        .filter_map(|r| r.as_ref().err().map(sqlstate))
        .collect();
    assert!(
        !codes.is_empty() && codes.iter().all(|c| c == "55P03"),
        "one of them ends with lock_not_available: {codes:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "ended by the timeout, not hanging"
    );
    x.simple_query("ROLLBACK").await.expect("rollback x");
    y.simple_query("ROLLBACK").await.expect("rollback y");
    // A client's own lock_timeout wins over the router's.
    x.simple_query("SET lock_timeout = '4s'")
        .await
        .expect("set");
    x.simple_query("BEGIN").await.expect("begin");
    for k in [a, b] {
        x.simple_query(&format!("SELECT v FROM kv WHERE id = {k}"))
            .await
            .expect("read");
    }
    let got = rows(
        &x.simple_query("SHOW lock_timeout")
            .await
            .expect("show lock_timeout"),
    );
    assert_eq!(got, [["4s"]]);
    x.simple_query("ROLLBACK").await.expect("rollback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_hits_the_statement_running_on_the_shard_the_transaction_moved_to() {
    let env = shared_env();
    let client = env.router.connect().await;
    let ks = keys(env, 75_000_000);
    client
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'sleeper')", &[&ks[1]])
        .await
        .expect("a row to sleep on");
    client.simple_query("BEGIN").await.expect("begin");
    client
        .simple_query(&format!("INSERT INTO kv (id, v) VALUES ({}, 'c')", ks[0]))
        .await
        .expect("insert");
    let token = client.cancel_token();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        token
            .cancel_query(tokio_postgres::NoTls)
            .await
            .expect("send cancel");
    });
    let started = Instant::now();
    let err = client
        .simple_query(&format!("SELECT pg_sleep(20) FROM kv WHERE id = {}", ks[1]))
        .await
        .expect_err("cancelled");
    canceller.await.expect("canceller");
    assert_eq!(sqlstate(&err), "57014");
    assert!(started.elapsed() < Duration::from_secs(15));
    client.simple_query("ROLLBACK").await.expect("rollback");
    assert_eq!(present(env, &ks), [0, 1, 0, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_transaction_commits_nothing() {
    let env = shared_env();
    let ks = keys(env, 76_000_000);
    {
        let client = env.router.connect().await;
        client.simple_query("BEGIN").await.expect("begin");
        for k in &ks {
            let done = client
                .simple_query(&format!("INSERT INTO kv (id, v) VALUES ({k}, 'gone')"))
                .await
                .expect("insert");
            assert!(done
                .iter()
                .any(|m| matches!(m, SimpleQueryMessage::CommandComplete(1))));
        }
    }
    no_transaction_left_open(env);
    assert_eq!(present(env, &ks), [0, 0, 0, 0]);
    let client = env.router.connect().await;
    let got = rows(
        &client
            .simple_query(&format!("SELECT count(*) FROM kv WHERE id = {}", ks[0]))
            .await
            .expect("the router goes on"),
    );
    assert_eq!(got, [["0"]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_on_several_shards_join_the_transaction() {
    let env = shared_env();
    let mut client = env.router.connect().await;
    let (lo, hi) = (77_000_000i64, 77_999_999i64);
    let ks = keys(env, lo);
    let list = ks.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let count = format!("SELECT count(*) FROM kv WHERE id BETWEEN {lo} AND {hi}");

    // A read across shards first: it begins the transaction on every shard.
    client.simple_query("BEGIN").await.expect("begin");
    assert_eq!(
        rows(&client.simple_query(&count).await.expect("count")),
        [["0"]]
    );
    for k in &ks {
        client
            .simple_query(&format!("INSERT INTO kv (id, v) VALUES ({k}, 'own')"))
            .await
            .expect("insert");
    }
    // Reads without a key see the transaction's own writes on every shard, merged.
    assert_eq!(
        rows(&client.simple_query(&count).await.expect("count")),
        [["4"]]
    );
    let mut top: Vec<i64> = ks.clone();
    top.sort_unstable_by(|a, b| b.cmp(a));
    let got = rows(
        &client
            .simple_query(&format!(
                "SELECT id FROM kv WHERE id BETWEEN {lo} AND {hi} ORDER BY id DESC LIMIT 3"
            ))
            .await
            .expect("ordered limit"),
    );
    let want: Vec<Vec<String>> = top[..3].iter().map(|k| vec![k.to_string()]).collect();
    assert_eq!(got, want);
    // A write on several shards at once, in the same transaction.
    let done = client
        .simple_query(&format!("UPDATE kv SET v = 'bulk' WHERE id IN ({list})"))
        .await
        .expect("multi-shard update");
    assert!(
        done.iter()
            .any(|m| matches!(m, SimpleQueryMessage::CommandComplete(4))),
        "{done:?}"
    );
    assert_eq!(present(env, &ks), [0, 0, 0, 0], "nothing visible yet");
    client.simple_query("ROLLBACK").await.expect("rollback");
    assert_eq!(present(env, &ks), [0, 0, 0, 0]);

    // The same through the extended protocol, committed.
    let tx = client.transaction().await.expect("begin");
    for k in &ks {
        tx.execute("INSERT INTO kv (id, v) VALUES ($1, 'own')", &[k])
            .await
            .expect("insert");
    }
    let n: i64 = tx
        .query_one(
            "SELECT count(*) FROM kv WHERE id BETWEEN $1 AND $2",
            &[&lo, &hi],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(n, 4);
    let updated = tx
        .execute("UPDATE kv SET v = 'bulk' WHERE id = ANY($1)", &[&ks])
        .await
        .expect("multi-shard update");
    assert_eq!(updated, 4);
    tx.commit().await.expect("commit");
    for s in 0..env.map.shards().len() {
        assert_eq!(
            env.on_shard(
                s,
                &format!("SELECT count(*) FROM kv WHERE id IN ({list}) AND v = 'bulk'")
            ),
            "1",
            "shard {s}"
        );
    }

    // An error on one shard of a read fails the transaction; its ROLLBACK undoes every shard.
    client.simple_query("BEGIN").await.expect("begin");
    client
        .simple_query(&format!("UPDATE kv SET v = 'doomed' WHERE id = {}", ks[0]))
        .await
        .expect("update");
    let err = client
        .simple_query(&format!(
            "SELECT 1 / (id - {}) FROM kv WHERE id BETWEEN {lo} AND {hi}",
            ks[2]
        ))
        .await
        .expect_err("division by zero on one shard");
    assert_eq!(sqlstate(&err), "22012");
    let err = client.simple_query("SELECT 1").await.expect_err("aborted");
    assert_eq!(sqlstate(&err), "25P02");
    client.simple_query("ROLLBACK").await.expect("rollback");
    assert_eq!(
        env.on_shard(0, &format!("SELECT v FROM kv WHERE id = {}", ks[0])),
        "bulk"
    );
    no_transaction_left_open(env);
}

/// A multi-row INSERT with bound parameters over every shard, as pgjdbc's
/// `reWriteBatchedInserts`, SQLAlchemy's insertmanyvalues and sqlx's `push_values` send it
/// (tokio-postgres sends the values and asks for the rows in binary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_row_insert_with_bound_parameters_is_split_by_shard() {
    let env = shared_env();
    let mut client = env.router.connect().await;
    let ks: Vec<i64> = (0..12)
        .map(|i| env.key_on(i % 4, 78_000_000 + 1000 * i as i64))
        .collect();
    let sql = |n: usize| {
        let rows: Vec<String> = (0..n)
            .map(|i| format!("(${}, ${})", 2 * i + 1, 2 * i + 2))
            .collect();
        format!(
            "INSERT INTO kv (id, v) VALUES {} RETURNING id, v",
            rows.join(", ")
        )
    };
    let values: Vec<String> = ks.iter().map(|k| format!("bound {k}")).collect();
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = Vec::new();
    for (k, v) in ks.iter().zip(&values) {
        params.push(k);
        params.push(v);
    }
    let got = client
        .query(&sql(ks.len()), &params)
        .await
        .expect("split insert");
    let returned: Vec<(i64, String)> = got.iter().map(|r| (r.get(0), r.get(1))).collect();
    let want: Vec<(i64, String)> = ks.iter().cloned().zip(values.iter().cloned()).collect();
    assert_eq!(
        returned, want,
        "RETURNING rows in the order of the input rows"
    );
    assert_eq!(present(env, &ks), [3, 3, 3, 3]);

    // One row failing (an existing key): nothing of the INSERT anywhere.
    let fresh: Vec<i64> = (0..4).map(|s| env.key_on(s, 78_500_000)).collect();
    let (f0, f1, f3) = (fresh[0], fresh[1], fresh[3]);
    let err = client
        .execute(
            "INSERT INTO kv (id, v) VALUES ($1, 'a'), ($2, 'b'), ($3, 'c'), ($4, 'd')",
            &[&f0, &f1, &ks[2], &f3],
        )
        .await
        .expect_err("duplicate key");
    assert_eq!(sqlstate(&err), "23505");
    assert_eq!(present(env, &fresh), [0, 0, 0, 0]);

    // Inside a transaction: part of it, and gone with its ROLLBACK.
    let tx = client.transaction().await.expect("begin");
    let n = tx
        .execute(
            "INSERT INTO kv (id, v) VALUES ($1, 'a'), ($2, 'b'), ($3, 'c'), ($4, 'd')",
            &[&fresh[0], &fresh[1], &fresh[2], &fresh[3]],
        )
        .await
        .expect("in a transaction");
    assert_eq!(n, 4);
    let seen: i64 = tx
        .query_one("SELECT count(*) FROM kv WHERE id = ANY($1)", &[&fresh])
        .await
        .expect("read back")
        .get(0);
    assert_eq!(seen, 4);
    tx.rollback().await.expect("rollback");
    assert_eq!(present(env, &fresh), [0, 0, 0, 0]);
    no_transaction_left_open(env);
}

/// What keeps a transaction on its shard, and what must not leak between its shards: a
/// savepoint, a failed statement, an open portal; settings changed inside it reach the shards
/// it goes on to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn savepoints_failures_portals_and_settings_in_a_transaction_across_shards() {
    let env = shared_env();
    let mut client = env.router.connect().await;
    let ks = keys(env, 79_000_000);

    // A savepoint on one shard works as on Postgres, and keeps the transaction there.
    client.simple_query("BEGIN").await.expect("begin");
    client
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES ({}, 'kept')",
            ks[0]
        ))
        .await
        .expect("insert");
    client
        .simple_query("SAVEPOINT sp")
        .await
        .expect("savepoint");
    let err = client
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES ({}, 'moved')",
            ks[1]
        ))
        .await
        .expect_err("held by the savepoint");
    assert_eq!(sqlstate(&err), "0A000");
    client
        .simple_query("ROLLBACK TO SAVEPOINT sp")
        .await
        .expect("rollback to savepoint");
    client.simple_query("COMMIT").await.expect("commit");
    assert_eq!(present(env, &ks), [1, 0, 0, 0]);

    // A savepoint in a transaction that already spans shards is refused.
    client.simple_query("BEGIN").await.expect("begin");
    for k in &ks[1..3] {
        client
            .simple_query(&format!("INSERT INTO kv (id, v) VALUES ({k}, 'x')"))
            .await
            .expect("insert");
    }
    let err = client
        .simple_query("SAVEPOINT sp")
        .await
        .expect_err("savepoint across shards");
    assert_eq!(sqlstate(&err), "0A000");
    client.simple_query("ROLLBACK").await.expect("rollback");
    assert_eq!(present(env, &ks), [1, 0, 0, 0]);

    // After an error on one shard, a statement for another shard does not run anywhere.
    client.simple_query("BEGIN").await.expect("begin");
    let err = client
        .simple_query(&format!("SELECT 1 / 0 FROM kv WHERE id = {}", ks[0]))
        .await
        .expect_err("division by zero");
    assert_eq!(sqlstate(&err), "22012");
    let err = client
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES ({}, 'after')",
            ks[1]
        ))
        .await
        .expect_err("aborted");
    assert_eq!(sqlstate(&err), "25P02");
    client.simple_query("COMMIT").await.expect("commit answers");
    assert_eq!(present(env, &ks), [1, 0, 0, 0]);

    // A SET inside the transaction reaches the shards it goes on to.
    client.simple_query("BEGIN").await.expect("begin");
    client
        .simple_query(&format!("SELECT v FROM kv WHERE id = {}", ks[0]))
        .await
        .expect("first shard");
    client
        .simple_query("SET LOCAL TimeZone = 'Asia/Tokyo'")
        .await
        .expect("set local");
    let got = rows(
        &client
            .simple_query(&format!(
                "SELECT current_setting('TimeZone') FROM kv WHERE id = {}",
                ks[0]
            ))
            .await
            .expect("read"),
    );
    assert_eq!(got, [["Asia/Tokyo"]]);
    client
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES ({}, current_setting('TimeZone'))",
            ks[3]
        ))
        .await
        .expect("another shard");
    let got = rows(
        &client
            .simple_query(&format!("SELECT v FROM kv WHERE id = {}", ks[3]))
            .await
            .expect("read back"),
    );
    assert_eq!(
        got,
        [["Asia/Tokyo"]],
        "the joining shard got the transaction's SET"
    );
    client.simple_query("ROLLBACK").await.expect("rollback");

    // An open portal keeps the transaction on its shard.
    let tx = client.transaction().await.expect("begin");
    let select = tx
        .prepare("SELECT v FROM kv WHERE id = $1")
        .await
        .expect("prepare");
    let portal = tx.bind(&select, &[&ks[0]]).await.expect("bind a portal");
    let got = tx.query_portal(&portal, 1).await.expect("fetch");
    assert_eq!(got.len(), 1);
    let err = tx
        .execute("INSERT INTO kv (id, v) VALUES ($1, 'p')", &[&ks[2]])
        .await
        .expect_err("held by the portal");
    assert_eq!(sqlstate(&err), "0A000");
    tx.rollback().await.expect("rollback");
    assert_eq!(present(env, &ks), [1, 0, 0, 0]);
    no_transaction_left_open(env);
}

/// Extended-protocol sequences around a transaction that moves: an error in an earlier batch
/// does not spill into the next; a Parse before a read across shards is answered in order; a
/// Query COMMIT in the middle of a batch sends what came before it first.
#[test]
fn extended_batches_around_a_moving_transaction() {
    let env = shared_env();
    let mut c = Raw::connect(trust_router());
    let ks = keys(env, 79_500_000);
    let insert = "INSERT INTO kv (id, v) VALUES ($1, 'raw')";
    let query = |sql: &str| {
        let mut body = sql.as_bytes().to_vec();
        body.push(0);
        common::raw::msg(b'Q', &body)
    };

    c.send(&query("BEGIN"));
    assert_eq!(c.read_until(b'Z'), b"CZ");
    // A batch that fails on its own (a bad Parse), then one over two shards.
    c.send(&[parse("bad", "SELEC 1"), sync()].concat());
    assert_eq!(c.read_until(b'Z'), b"EZ");
    let mut batch = parse("", insert);
    for k in &ks[..2] {
        batch.extend(bind("", &[&k.to_string()]));
        batch.extend(execute());
    }
    batch.extend(sync());
    c.send(&batch);
    assert_eq!(c.read_until(b'Z'), b"12C2CZ");
    assert_eq!(c.status, b'T');
    // A Parse before a read across shards, in the same batch, inside the transaction.
    c.send(
        &[
            parse(
                "",
                "SELECT count(*) FROM kv WHERE id >= 79500000 AND id < 79600000",
            ),
            bind("", &[]),
            execute(),
            sync(),
        ]
        .concat(),
    );
    assert_eq!(c.read_until(b'Z'), b"12DCZ");
    // Bind/Execute for a third shard without a Sync, then a Query COMMIT.
    let mut batch = parse("", insert);
    batch.extend(bind("", &[&ks[2].to_string()]));
    batch.extend(execute());
    batch.extend(query("COMMIT"));
    c.send(&batch);
    assert_eq!(c.read_until(b'Z'), b"12CCZ");
    assert_eq!(c.status, b'I');
    c.send(&sync());
    assert_eq!(c.read_until(b'Z'), b"Z");
    assert_eq!(present(env, &ks), [1, 1, 1, 0]);
    no_transaction_left_open(env);
}

/// `INSERT ... SELECT * FROM UNNEST(arrays)` (Django's bulk_create, by hand too) whose keys
/// fall on several shards is split by shard: bound arrays in binary (tokio-postgres), literal
/// arrays with quoting in the simple protocol; RETURNING in input order; a failing row leaves
/// nothing; arrays of different lengths are refused rather than padded differently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_from_unnest_is_split_by_shard() {
    let env = shared_env();
    let client = env.router.connect().await;
    let ks: Vec<i64> = (0..8)
        .map(|i| env.key_on(i % 4, 83_000_000 + 1000 * i as i64))
        .collect();
    let vs: Vec<String> = ks.iter().map(|k| format!("u{k}")).collect();
    let got = client
        .query(
            "INSERT INTO kv (id, v) SELECT * FROM UNNEST($1::bigint[], $2::text[]) RETURNING id, v",
            &[&ks, &vs],
        )
        .await
        .expect("split unnest");
    let returned: Vec<(i64, String)> = got.iter().map(|r| (r.get(0), r.get(1))).collect();
    let want: Vec<(i64, String)> = ks.iter().cloned().zip(vs.iter().cloned()).collect();
    assert_eq!(returned, want, "RETURNING in the order of the arrays");
    assert_eq!(present(env, &ks), [2, 2, 2, 2]);
    for (k, v) in ks.iter().zip(&vs) {
        let row = client
            .query_one("SELECT v FROM kv WHERE id = $1", &[k])
            .await
            .expect("each row on its key's shard");
        assert_eq!(&row.get::<_, String>(0), v);
    }

    // Literal arrays, quoted elements, E-strings: each shard's part written in the text.
    let lit: Vec<i64> = (0..4).map(|s| env.key_on(s, 83_100_000)).collect();
    let sql = format!(
        "INSERT INTO kv (id, v) SELECT * FROM UNNEST(('{{{},{},{},{}}}'::int8[])::bigint[], (E'{{\"a,b\",\"c\\\\\"d\",e'' f,NULL}}')::text[]) AS t(id, v) WHERE true",
        lit[0], lit[1], lit[2], lit[3]
    );
    // With a WHERE the rows are not the arrays' elements: refused, nothing written.
    let err = client
        .simple_query(&sql)
        .await
        .expect_err("not plain UNNEST");
    assert_eq!(sqlstate(&err), "0A000");
    let sql = sql.replace(" WHERE true", "").replace(",NULL", ",g");
    client.simple_query(&sql).await.expect("literal arrays");
    let vals: Vec<String> = rows(
        &client
            .simple_query(&format!(
                "SELECT v FROM kv WHERE id IN ({},{},{},{}) ORDER BY v",
                lit[0], lit[1], lit[2], lit[3]
            ))
            .await
            .expect("read"),
    )
    .into_iter()
    .map(|r| r[0].clone())
    .collect();
    assert_eq!(vals, ["a,b", "c\"d", "e' f", "g"]);
    assert_eq!(present(env, &lit), [1, 1, 1, 1]);

    // A failing row (an existing key): nothing of the INSERT anywhere.
    let fresh: Vec<i64> = (0..4).map(|s| env.key_on(s, 83_200_000)).collect();
    let dup = vec![fresh[0], fresh[1], ks[2], fresh[3]];
    let err = client
        .execute(
            "INSERT INTO kv (id, v) SELECT * FROM unnest($1::int8[], $2::text[])",
            &[&dup, &vec!["a", "b", "c", "d"]],
        )
        .await
        .expect_err("duplicate key");
    assert_eq!(sqlstate(&err), "23505");
    assert_eq!(present(env, &fresh), [0, 0, 0, 0]);

    // Without a column list, which array fills which column is not certain: refused.
    let err = client
        .execute(
            "INSERT INTO kv SELECT * FROM unnest($1::int8[], $2::text[])",
            &[&fresh, &vec!["a", "b", "c", "d"]],
        )
        .await
        .expect_err("no column list");
    assert_eq!(sqlstate(&err), "0A000");

    // Arrays of different lengths: UNNEST pads with NULLs row by row, which a split would not.
    let err = client
        .execute(
            "INSERT INTO kv (id, v) SELECT * FROM unnest($1::int8[], $2::text[])",
            &[&fresh, &vec!["a", "b"]],
        )
        .await
        .expect_err("lengths differ");
    assert_eq!(sqlstate(&err), "0A000");
    assert_eq!(present(env, &fresh), [0, 0, 0, 0]);

    // Inside a transaction: part of it, gone with its ROLLBACK.
    client.batch_execute("BEGIN").await.expect("begin");
    client
        .execute(
            "INSERT INTO kv (id, v) SELECT * FROM unnest($1::int8[], $2::text[])",
            &[&fresh, &vec!["a", "b", "c", "d"]],
        )
        .await
        .expect("in a transaction");
    client.batch_execute("ROLLBACK").await.expect("rollback");
    assert_eq!(present(env, &fresh), [0, 0, 0, 0]);
    no_transaction_left_open(env);
}

/// SQL cursors: one whose query names one shard lives there (and scrolls, as Postgres's do);
/// one that reads every shard, or WITH HOLD, is held by the router, which merges its rows
/// once at DECLARE and serves FETCH, MOVE and CLOSE from them, forward only. Each answer is
/// compared with what one Postgres gives for the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_on_one_shard_and_across_shards() {
    let env = shared_env();
    let client = env.router.connect().await;
    let ks: Vec<i64> = (0..12)
        .map(|i| env.key_on(i % 4, 83_300_000 + 1000 * i as i64))
        .collect();
    let mut sorted = ks.clone();
    sorted.sort_unstable();
    let (lo, hi) = (sorted[0], sorted[11]);
    client
        .execute(
            "INSERT INTO kv (id, v) SELECT k, 'c' || k FROM unnest($1::int8[]) AS k",
            &[&ks],
        )
        .await
        .expect_err("a computed key is not split");
    client
        .execute(
            "INSERT INTO kv (id, v) SELECT * FROM unnest($1::int8[], $2::text[])",
            &[&ks, &ks.iter().map(|k| format!("c{k}")).collect::<Vec<_>>()],
        )
        .await
        .expect("rows");
    let ids = |msgs: &[SimpleQueryMessage]| -> Vec<i64> {
        rows(msgs)
            .into_iter()
            .map(|r| r[0].parse().expect("an id"))
            .collect()
    };
    let tag = |msgs: &[SimpleQueryMessage]| -> u64 {
        msgs.iter()
            .find_map(|m| match m {
                SimpleQueryMessage::CommandComplete(n) => Some(*n),
                _ => None,
            })
            .expect("a command tag")
    };

    // Across shards, inside a transaction: merged in order, fetched in steps.
    client.batch_execute("BEGIN").await.expect("begin");
    client
        .simple_query(&format!("DECLARE c CURSOR FOR SELECT id, v FROM kv WHERE id BETWEEN {lo} AND {hi} ORDER BY id DESC"))
        .await
        .expect("declare across shards");
    let first = client
        .simple_query("FETCH 5 FROM c")
        .await
        .expect("fetch 5");
    let desc: Vec<i64> = sorted.iter().rev().cloned().collect();
    assert_eq!(ids(&first), desc[..5]);
    assert_eq!(tag(&first), 5);
    let moved = client
        .simple_query("MOVE FORWARD 2 IN c")
        .await
        .expect("move");
    assert_eq!(tag(&moved), 2);
    assert_eq!(
        ids(&client
            .simple_query("FETCH NEXT FROM c")
            .await
            .expect("next")),
        desc[7..8]
    );
    let rest = client.simple_query("FETCH ALL FROM c").await.expect("all");
    assert_eq!(ids(&rest), desc[8..]);
    assert_eq!(
        tag(&client.simple_query("FETCH c").await.expect("past the end")),
        0
    );
    let err = client
        .simple_query("FETCH PRIOR FROM c")
        .await
        .expect_err("backward");
    assert_eq!(sqlstate(&err), "0A000");
    client.batch_execute("ROLLBACK").await.expect("rollback");
    // Gone with its transaction, as in Postgres.
    let err = client
        .simple_query("FETCH 1 FROM c")
        .await
        .expect_err("closed");
    assert_eq!(sqlstate(&err), "34000");

    // Without a transaction and without HOLD: refused as Postgres refuses it.
    let err = client
        .simple_query("DECLARE c CURSOR FOR SELECT id FROM kv")
        .await
        .expect_err("outside a transaction");
    assert_eq!(sqlstate(&err), "25P01");

    // WITH HOLD in autocommit (Django's .iterator()): the router keeps it after the read.
    client
        .simple_query(&format!("DECLARE h NO SCROLL CURSOR WITH HOLD FOR SELECT count(*), min(id) FROM kv WHERE id BETWEEN {lo} AND {hi}"))
        .await
        .expect("declare with hold");
    let row = rows(
        &client
            .simple_query("FETCH ALL FROM h")
            .await
            .expect("fetch"),
    );
    assert_eq!(row, [["12".to_string(), lo.to_string()]]);
    client.simple_query("CLOSE h").await.expect("close");
    let err = client.simple_query("FETCH h").await.expect_err("closed");
    assert_eq!(sqlstate(&err), "34000");

    // One key: the cursor lives on that shard, and scrolls there.
    client.batch_execute("BEGIN").await.expect("begin");
    client
        .simple_query(&format!(
            "DECLARE one SCROLL CURSOR FOR SELECT id FROM kv WHERE id IN ({}, {}) ORDER BY id",
            ks[0], ks[4]
        ))
        .await
        .expect("declare on one shard");
    // The transaction goes on to another shard, and comes back for the cursor.
    client
        .simple_query(&format!("SELECT v FROM kv WHERE id = {}", ks[1]))
        .await
        .expect("another shard");
    let mut pair = [ks[0], ks[4]];
    pair.sort_unstable();
    assert_eq!(
        ids(&client
            .simple_query("FETCH LAST FROM one")
            .await
            .expect("last")),
        [pair[1]]
    );
    assert_eq!(
        ids(&client
            .simple_query("FETCH PRIOR FROM one")
            .await
            .expect("prior")),
        [pair[0]]
    );
    client.simple_query("CLOSE one").await.expect("close");
    client.batch_execute("COMMIT").await.expect("commit");

    // A held cursor ends with its transaction; one WITH HOLD survives its COMMIT only.
    for (hold, end, survives) in [
        ("", "COMMIT", false),
        (" WITH HOLD", "ROLLBACK", false),
        (" WITH HOLD", "COMMIT", true),
    ] {
        client.batch_execute("BEGIN").await.expect("begin");
        client
            .simple_query(&format!("DECLARE e CURSOR{hold} FOR SELECT id FROM kv WHERE id BETWEEN {lo} AND {hi} ORDER BY 1 DESC"))
            .await
            .expect("declare, ordered by position");
        client.batch_execute(end).await.expect("end");
        match client.simple_query("/* app */ FETCH 2 FROM e").await {
            Ok(m) => {
                assert!(survives, "{hold} {end}: the cursor should be gone");
                assert_eq!(ids(&m), desc[..2]);
            }
            Err(e) => {
                assert!(!survives, "{hold} {end}: {e}");
                assert_eq!(sqlstate(&e), "34000");
            }
        }
    }
    client.simple_query("CLOSE e").await.expect("close");

    // A router error on a held cursor fails the transaction where it runs, as Postgres's own
    // error would: nothing of it commits.
    client.batch_execute("BEGIN").await.expect("begin");
    client
        .simple_query(&format!("UPDATE kv SET v = 'changed' WHERE id = {}", ks[0]))
        .await
        .expect("update");
    client
        .simple_query(&format!(
            "DECLARE b CURSOR WITH HOLD FOR SELECT id FROM kv WHERE id = {}",
            ks[0]
        ))
        .await
        .expect("declare with hold on one shard");
    let err = client
        .simple_query("FETCH 0 FROM b")
        .await
        .expect_err("FETCH 0 of a held cursor");
    assert_eq!(sqlstate(&err), "0A000");
    let err = client
        .simple_query("SELECT 1")
        .await
        .expect_err("failed transaction");
    assert_eq!(sqlstate(&err), "25P02");
    client
        .batch_execute("COMMIT")
        .await
        .expect("commit ends it");
    let v = rows(
        &client
            .simple_query(&format!("SELECT v FROM kv WHERE id = {}", ks[0]))
            .await
            .expect("read"),
    );
    assert_eq!(
        v,
        [[format!("c{}", ks[0])]],
        "nothing of the failed transaction committed"
    );
    let err = client
        .simple_query("FETCH b")
        .await
        .expect_err("gone with its rollback");
    assert_eq!(sqlstate(&err), "34000");

    // A second DECLARE of a held name is refused, as Postgres refuses it.
    client.batch_execute("BEGIN").await.expect("begin");
    client
        .simple_query("DECLARE d CURSOR FOR SELECT id FROM kv ORDER BY id LIMIT 1")
        .await
        .expect("declare");
    let err = client
        .simple_query("DECLARE d CURSOR FOR SELECT id FROM kv")
        .await
        .expect_err("duplicate");
    assert_eq!(sqlstate(&err), "42P03");
    client.batch_execute("ROLLBACK").await.expect("rollback");
    no_transaction_left_open(env);
}

/// A cursor over several shards inside a transaction is merged a batch at a time as FETCHes
/// ask, so it reads far more rows than the router would hold for a cursor: with
/// `max_merge_bytes` at 4 KiB, 3000 sorted rows come through in FETCHes of 700, while the same
/// query WITH HOLD (whose rows the router keeps) is refused with 54000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_across_shards_fetches_on_demand() {
    let env = shared_env();
    let router = Router::start_with(&env.map, "[limits]\nmax_merge_bytes = 4096\n");
    let client = router.connect().await;
    let base = 84_000_000i64;
    let ids: Vec<i64> = (base..base + 3000).collect();
    let vs: Vec<String> = ids
        .iter()
        .map(|k| format!("row {k} of a long cursor"))
        .collect();
    client
        .execute(
            "INSERT INTO kv (id, v) SELECT * FROM unnest($1::int8[], $2::text[])",
            &[&ids, &vs],
        )
        .await
        .expect("rows on every shard");
    let query = format!(
        "SELECT id, v FROM kv WHERE id BETWEEN {base} AND {} ORDER BY id",
        base + 2999
    );
    client.batch_execute("BEGIN").await.expect("begin");
    client
        .simple_query(&format!("DECLARE big CURSOR FOR {query}"))
        .await
        .expect("declare");
    let mut seen = Vec::new();
    loop {
        let got = rows(
            &client
                .simple_query("FETCH 700 FROM big")
                .await
                .expect("fetch"),
        );
        if got.is_empty() {
            break;
        }
        seen.extend(got.into_iter().map(|r| r[0].parse::<i64>().expect("an id")));
    }
    assert_eq!(seen, ids, "every row, in order, a batch at a time");
    client.batch_execute("COMMIT").await.expect("commit");

    let err = client
        .simple_query(&format!("DECLARE kept CURSOR WITH HOLD FOR {query}"))
        .await
        .expect_err("too big to hold");
    assert_eq!(sqlstate(&err), "54000");
    client
        .execute("DELETE FROM kv WHERE id = ANY($1)", &[&ids])
        .await
        .expect("clean up");
    no_transaction_left_open(env);
}

/// Cursor names and the extended protocol: a DECLARE across shards with bound parameters
/// answers its batch as Postgres does (ParseComplete, ParameterDescription + NoData,
/// BindComplete, DECLARE CURSOR), Describe of the cursor's portal gives its RowDescription, a
/// name longer than 63 bytes is the same cursor as its first 63, a second DECLARE of a name
/// that lives on a shard is refused, and a savepoint keeps a cursor from spreading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_names_savepoints_and_extended_declare() {
    let env = shared_env();
    let mut raw = Raw::connect(trust_router());
    let q = |sql: &str| common::raw::msg(b'Q', format!("{sql}\0").as_bytes());
    raw.send(&q("BEGIN"));
    assert_eq!(raw.read_until(b'Z'), b"CZ");
    let mut batch = parse(
        "",
        "DECLARE rc CURSOR FOR SELECT id FROM kv WHERE id BETWEEN $1 AND $2 ORDER BY id",
    );
    batch.extend(common::raw::describe_statement(""));
    batch.extend(bind("", &["85000000", "85001000"]));
    batch.extend(execute());
    batch.extend(sync());
    raw.send(&batch);
    let (tags, errors) = raw.until_ready();
    assert_eq!(tags, b"1tn2CZ", "{errors}");
    let mut describe = common::raw::msg(b'D', b"Prc\0");
    describe.extend(sync());
    raw.send(&describe);
    assert_eq!(raw.read_until(b'Z'), b"TZ");
    raw.send(&q("FETCH 2 FROM rc"));
    assert_eq!(
        raw.read_until(b'Z'),
        b"TCZ",
        "no rows in that range: a description, a tag"
    );
    raw.send(&q("ROLLBACK"));
    raw.read_until(b'Z');

    let client = env.router.connect().await;
    let long = "a_cursor_name_that_is_longer_than_the_sixty_three_bytes_postgres_keeps";
    client.batch_execute("BEGIN").await.expect("begin");
    client
        .simple_query(&format!(
            "DECLARE {long} CURSOR FOR SELECT id FROM kv ORDER BY id LIMIT 3"
        ))
        .await
        .expect("declare a long name");
    client
        .simple_query(&format!("FETCH 1 FROM {}", &long[..63]))
        .await
        .expect("the same cursor by its first 63 bytes");
    client.batch_execute("ROLLBACK").await.expect("rollback");

    let k = env.key_on(0, 85_000_000);
    client.batch_execute("BEGIN").await.expect("begin");
    client
        .simple_query(&format!(
            "DECLARE s CURSOR FOR SELECT id FROM kv WHERE id = {k}"
        ))
        .await
        .expect("on one shard");
    let err = client
        .simple_query("DECLARE s CURSOR FOR SELECT id FROM kv ORDER BY id")
        .await
        .expect_err("the name exists");
    assert_eq!(sqlstate(&err), "42P03");
    client.batch_execute("ROLLBACK").await.expect("rollback");

    client.batch_execute("BEGIN").await.expect("begin");
    client
        .simple_query(&format!("SELECT v FROM kv WHERE id = {k}"))
        .await
        .expect("one shard");
    client
        .batch_execute("SAVEPOINT sp")
        .await
        .expect("savepoint");
    let err = client
        .simple_query("DECLARE w CURSOR FOR SELECT id FROM kv ORDER BY id")
        .await
        .expect_err("a savepoint keeps the transaction on its shard");
    assert_eq!(sqlstate(&err), "0A000");
    client.batch_execute("ROLLBACK").await.expect("rollback");
    no_transaction_left_open(env);
}

/// A portal that reads several shards, executed with a row limit inside a transaction (what
/// pgjdbc does with a fetch size): each Execute gets at most its rows and PortalSuspended, the
/// last one its CommandComplete; other statements may run between; Close ends it.
#[test]
fn a_portal_across_shards_runs_a_few_rows_at_a_time() {
    let env = shared_env();
    let ks: Vec<i64> = (0..10)
        .map(|i| env.key_on(i % 4, 86_000_000 + 1000 * i as i64))
        .collect();
    let mut sorted = ks.clone();
    sorted.sort_unstable();
    let mut raw = Raw::connect(trust_router());
    let q = |sql: &str| common::raw::msg(b'Q', format!("{sql}\0").as_bytes());
    let list: Vec<String> = ks.iter().map(|k| format!("({k}, 'p')")).collect();
    raw.send(&q(&format!(
        "INSERT INTO kv (id, v) VALUES {}",
        list.join(", ")
    )));
    assert_eq!(raw.until_ready().1, "");
    let execute = |portal: &str, rows: i32| {
        let mut b = format!("{portal}\0").into_bytes();
        b.extend_from_slice(&rows.to_be_bytes());
        common::raw::msg(b'E', &b)
    };
    raw.send(&q("BEGIN"));
    raw.read_until(b'Z');
    let mut batch = parse(
        "",
        &format!(
            "SELECT id FROM kv WHERE id BETWEEN {} AND {} ORDER BY id",
            sorted[0], sorted[9]
        ),
    );
    let mut b = b"p1\0\0".to_vec();
    b.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    batch.extend(common::raw::msg(b'B', &b));
    batch.extend(common::raw::msg(b'D', b"Pp1\0"));
    batch.extend(execute("p1", 4));
    batch.extend(sync());
    raw.send(&batch);
    let (tags, errors) = raw.until_ready();
    assert_eq!(tags, b"12TDDDDsZ", "{errors}");
    // Another statement of the transaction, on one shard, in between.
    raw.send(&q(&format!("UPDATE kv SET v = 'q' WHERE id = {}", ks[1])));
    assert_eq!(raw.until_ready().1, "");
    let mut next = execute("p1", 4);
    next.extend(sync());
    raw.send(&next);
    assert_eq!(raw.until_ready().0, b"DDDDsZ");
    raw.send(&next);
    assert_eq!(raw.until_ready().0, b"DDCZ", "the last rows, then the end");
    let mut close = common::raw::msg(b'C', b"Pp1\0");
    close.extend(sync());
    raw.send(&close);
    assert_eq!(raw.until_ready().0, b"3Z");
    raw.send(&q("COMMIT"));
    assert_eq!(raw.until_ready().1, "");
    raw.send(&q(&format!(
        "DELETE FROM kv WHERE id BETWEEN {} AND {}",
        sorted[0], sorted[9]
    )));
    assert_eq!(raw.until_ready().1, "");
    no_transaction_left_open(env);
}

/// SQLAlchemy 2.1's first connection (psycopg 3.3), statement for statement as Postgres logs it:
/// `BEGIN`, catalog reads that need no shard, `SAVEPOINT`, then psycopg's type lookup, whose
/// `to_regtype` routes it to the default shard, and the end. A transaction opened by a statement
/// that needs no shard opens on the default shard, so all of it stays in the transaction, on
/// every round (the shard "any" would pick rotates).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlalchemys_first_connection_stays_in_its_transaction() {
    let env = shared_env();
    let client = env.router.connect().await;
    let type_info = "SELECT typname AS name, oid, typarray AS array_oid, \
        oid::regtype::text AS regtype, typdelim AS delimiter \
        FROM pg_type t WHERE t.oid = to_regtype($1) ORDER BY t.oid";
    for round in 0..8 {
        for sql in [
            "BEGIN",
            "select pg_catalog.version()",
            "select current_schema()",
            "show transaction isolation level",
            "show standard_conforming_strings",
            "SAVEPOINT \"_pg3_1\"",
        ] {
            client
                .simple_query(sql)
                .await
                .unwrap_or_else(|e| panic!("round {round}: {sql}: {e:?}"));
        }
        client
            .query(type_info, &[&"hstore"])
            .await
            .unwrap_or_else(|e| panic!("round {round}: the type lookup: {e:?}"));
        for sql in [
            "SELECT count(*) FROM settings",
            "RELEASE \"_pg3_1\"",
            "ROLLBACK",
        ] {
            client
                .simple_query(sql)
                .await
                .unwrap_or_else(|e| panic!("round {round}: {sql}: {e:?}"));
        }
    }
    no_transaction_left_open(env);
}
