//! DDL through the router: on a sharded table (and schema-wide) it reaches every shard and the
//! client gets one answer; a failure on some shards names them; on an unsharded table it goes
//! to the default shard only.

mod common;

use common::{shared_env, sqlstate};

fn on_all(env: &common::Env, sql: &str) -> Vec<String> {
    (0..env.map.shards().len())
        .map(|i| env.on_shard(i, sql))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_reaches_every_shard_once() {
    let env = shared_env();
    let client = env.router.connect().await;

    // Simple protocol.
    client
        .batch_execute("CREATE INDEX kv_v_idx ON kv (v)")
        .await
        .expect("create index");
    assert_eq!(
        on_all(
            env,
            "SELECT count(*) FROM pg_indexes WHERE indexname = 'kv_v_idx'"
        ),
        ["1"; 4]
    );
    // The same error on every shard is Postgres's own error, as if there were one database.
    let err = client
        .batch_execute("CREATE INDEX kv_v_idx ON kv (v)")
        .await
        .expect_err("exists");
    assert_eq!(sqlstate(&err), "42P07");
    assert!(err
        .as_db_error()
        .is_some_and(|e| e.message().contains("already exists")));

    // Extended protocol (Parse/Describe/Sync, then Bind/Execute/Sync).
    let n = client
        .execute("ALTER TABLE kv ADD COLUMN note text", &[])
        .await
        .expect("alter");
    assert_eq!(n, 0);
    assert_eq!(
        on_all(env, "SELECT count(*) FROM information_schema.columns WHERE table_name = 'kv' AND column_name = 'note'"),
        ["1"; 4]
    );
    let id = env.key_on(1, 12_000_000);
    client
        .execute(
            "INSERT INTO kv (id, v, note) VALUES ($1, 'x', 'noted')",
            &[&id],
        )
        .await
        .expect("the new column is usable");

    // Schema-wide DDL.
    client
        .batch_execute("CREATE SCHEMA audit")
        .await
        .expect("create schema");
    assert_eq!(
        on_all(
            env,
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'audit'"
        ),
        ["1"; 4]
    );

    // DDL on an unsharded table: the default shard only.
    client
        .batch_execute("CREATE TABLE local_notes (k int PRIMARY KEY)")
        .await
        .expect("unsharded DDL");
    let default = env.map.default_shard();
    for (i, n) in on_all(
        env,
        "SELECT count(*) FROM pg_tables WHERE tablename = 'local_notes'",
    )
    .iter()
    .enumerate()
    {
        assert_eq!(n, if i == default { "1" } else { "0" }, "shard {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_failure_names_the_shards_and_transactions_refuse_ddl() {
    let env = shared_env();
    let client = env.router.connect().await;
    // Shard 2 already has the index: only it fails.
    env.on_shard(2, "CREATE INDEX kv_partial_idx ON kv (id, v)");
    let err = client
        .batch_execute("CREATE INDEX kv_partial_idx ON kv (id, v)")
        .await
        .expect_err("partial");
    assert_eq!(sqlstate(&err), "42P07");
    let msg = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    let range = env.map.shards()[2].range.to_string();
    assert!(
        msg.contains("1 of 4 shards")
            && msg.contains(&range)
            && msg.contains("applied on the other 3"),
        "{msg}"
    );
    assert_eq!(
        on_all(
            env,
            "SELECT count(*) FROM pg_indexes WHERE indexname = 'kv_partial_idx'"
        ),
        ["1"; 4]
    );

    // Inside a transaction, DDL for every shard is refused and aborts the transaction.
    client.batch_execute("BEGIN").await.expect("begin");
    let err = client
        .batch_execute("CREATE INDEX kv_tx_idx ON kv (v)")
        .await
        .expect_err("in transaction");
    assert_eq!(sqlstate(&err), "0A000");
    client.batch_execute("ROLLBACK").await.expect("rollback");
    // Mixed with other statements in one query: refused.
    let err = client
        .batch_execute("CREATE INDEX kv_mixed_idx ON kv (v); SELECT 1")
        .await
        .expect_err("mixed");
    assert_eq!(sqlstate(&err), "0A000");
    assert_eq!(
        on_all(
            env,
            "SELECT count(*) FROM pg_indexes WHERE indexname IN ('kv_tx_idx', 'kv_mixed_idx')"
        ),
        ["0"; 4]
    );
    client
        .query_one("SELECT 1", &[])
        .await
        .expect("still usable");
}

/// With one shard every statement has one place to go: DDL runs inside the client's
/// transaction (and rolls back with it), beside other statements in one Query, and kinds the
/// router cannot place among several shards (DROP INDEX, CREATE AGGREGATE, CREATE RULE) run
/// there, as on one Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_shard_every_statement_runs_there() {
    let env = common::Env::start(1, 1, 4);
    let client = env.router.connect().await;
    client
        .batch_execute("BEGIN; CREATE TABLE one_shard_t (x int); CREATE INDEX one_shard_i ON one_shard_t (x); INSERT INTO one_shard_t VALUES (1); ROLLBACK")
        .await
        .expect("DDL in a transaction");
    assert_eq!(
        env.on_shard(0, "SELECT to_regclass('one_shard_t') IS NULL"),
        "t"
    );
    client
        .batch_execute("BEGIN; CREATE TABLE one_shard_t (x int); CREATE INDEX one_shard_i ON one_shard_t (x); COMMIT")
        .await
        .expect("DDL committed");
    client
        .batch_execute("CREATE INDEX kv_one_shard_i ON kv (v); SELECT 1")
        .await
        .expect("DDL of a sharded table beside another statement");
    client
        .batch_execute(
            "DROP INDEX one_shard_i; DROP INDEX kv_one_shard_i;
             CREATE AGGREGATE one_shard_sum (int) (sfunc = int4pl, stype = int);
             CREATE RULE one_shard_r AS ON DELETE TO one_shard_t DO INSTEAD NOTHING",
        )
        .await
        .expect("DROP INDEX, CREATE AGGREGATE, CREATE RULE");
    assert_eq!(
        env.on_shard(
            0,
            "SELECT count(*) FROM pg_indexes WHERE indexname IN ('one_shard_i', 'kv_one_shard_i')"
        ),
        "0"
    );
    let sum = client
        .query_one(
            "SELECT one_shard_sum(x)::text FROM (VALUES (2), (3)) v(x)",
            &[],
        )
        .await
        .expect("the aggregate");
    assert_eq!(sum.get::<_, String>(0), "5");
    // With several shards the same DROP INDEX is still refused: its table is unknown.
    let several = shared_env().router.connect().await;
    let err = several
        .simple_query("DROP INDEX IF EXISTS no_such_index")
        .await
        .expect_err("several shards");
    assert_eq!(sqlstate(&err), "0A000");
}
