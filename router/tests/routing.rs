//! Routing by key through a real router in front of a real 4-shard cluster: rows land on the
//! shard the keyspace says, point selects find them in every protocol mode, and statements
//! that touch no table or unsharded tables go where they should.

mod common;

use common::{shared_env, sqlstate};
use shardmap::{predicate, Key};

/// 10,000 rows inserted through the router, half in the simple protocol and half as a
/// prepared statement, are on exactly the shards the keyspace says, as the placement
/// predicates of the shard map confirm on every shard directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_rows_land_where_the_keyspace_says() {
    let env = shared_env();
    let client = env.router.connect().await;
    let (lo, hi) = (1_000_000i64, 1_010_000i64);
    let insert = client
        .prepare("INSERT INTO kv (id, v) VALUES ($1, $2)")
        .await
        .expect("prepare");
    for id in lo..hi {
        if id % 2 == 0 {
            client
                .simple_query(&format!("INSERT INTO kv (id, v) VALUES ({id}, 'row {id}')"))
                .await
                .unwrap_or_else(|e| panic!("insert {id}: {e}"));
        } else {
            client
                .execute(&insert, &[&id, &format!("row {id}")])
                .await
                .unwrap_or_else(|e| panic!("insert {id}: {e}"));
        }
    }
    let kv = env.map.table_by_name("kv").expect("kv is sharded");
    let mut expected = vec![0usize; env.map.shards().len()];
    for id in lo..hi {
        expected[env.shard_of(id)] += 1;
    }
    let mut total = 0;
    for (i, shard) in env.map.shards().iter().enumerate() {
        let pred = predicate::predicate(kv, &shard.range);
        let here: usize = env
            .on_shard(
                i,
                &format!("SELECT count(*) FROM kv WHERE id >= {lo} AND id < {hi}"),
            )
            .parse()
            .expect("count");
        let misplaced: usize = env
            .on_shard(
                i,
                &format!("SELECT count(*) FROM kv WHERE id >= {lo} AND id < {hi} AND NOT ({pred})"),
            )
            .parse()
            .expect("count");
        assert_eq!(
            misplaced, 0,
            "shard {} holds rows of other shards",
            shard.range
        );
        assert_eq!(here, expected[i], "shard {}", shard.range);
        assert!(
            here > 1000,
            "an even split puts about a quarter of the rows on each shard"
        );
        total += here;
    }
    assert_eq!(total, 10_000);
}

/// Point selects return the right rows in simple, extended (unnamed and named statements)
/// and prepared modes, for bigint, text and uuid keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn point_selects_in_every_protocol_mode() {
    let env = shared_env();
    let client = env.router.connect().await;
    let ids: Vec<i64> = (2_000_000..2_000_200).collect();
    for &id in &ids {
        client
            .execute(
                "INSERT INTO kv (id, v) VALUES ($1, $2)",
                &[&id, &format!("v{id}")],
            )
            .await
            .expect("insert");
    }
    let prepared = client
        .prepare("SELECT v FROM kv WHERE id = $1")
        .await
        .expect("prepare");
    for &id in &ids {
        let want = format!("v{id}");
        // Simple protocol, literal key.
        let rows = client
            .simple_query(&format!("SELECT v FROM kv WHERE id = {id}"))
            .await
            .expect("simple");
        let got: Vec<String> = rows
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .collect();
        assert_eq!(got, std::slice::from_ref(&want), "simple, id {id}");
        // Extended protocol, a fresh statement each time.
        let row = client
            .query_one("SELECT v FROM kv WHERE id = $1", &[&id])
            .await
            .expect("extended");
        assert_eq!(row.get::<_, String>(0), want, "extended, id {id}");
        // The unnamed statement with explicit types.
        let rows = client
            .query_typed(
                "SELECT v FROM kv WHERE id = $1",
                &[(&id, tokio_postgres::types::Type::INT8)],
            )
            .await
            .expect("typed");
        assert_eq!(rows[0].get::<_, String>(0), want, "unnamed, id {id}");
        // One prepared statement, many executions.
        let row = client.query_one(&prepared, &[&id]).await.expect("prepared");
        assert_eq!(row.get::<_, String>(0), want, "prepared, id {id}");
        // A literal key inside an extended-protocol statement.
        let row = client
            .query_one(
                &format!("SELECT v FROM kv WHERE id = {id} AND v = $1"),
                &[&want],
            )
            .await
            .expect("literal in extended");
        assert_eq!(row.get::<_, String>(0), want);
    }

    // int4 parameters hash like int8: the key's declared width does not matter.
    let small: i32 = 2_000_007;
    let row = client
        .query_one("SELECT v FROM kv WHERE id = $1::int4", &[&small])
        .await
        .expect("int4 key");
    assert_eq!(row.get::<_, String>(0), "v2000007");

    // Text and uuid keys.
    for i in 0..100 {
        let name = format!("näme-{i}-漢");
        client
            .execute("INSERT INTO names (name, n) VALUES ($1, $2)", &[&name, &i])
            .await
            .expect("insert name");
        let row = client
            .query_one("SELECT n FROM names WHERE name = $1", &[&name])
            .await
            .expect("name");
        assert_eq!(row.get::<_, i32>(0), i);
        let shard = env.map.shard_for_key(&Key::Text(&name));
        assert_eq!(
            env.on_shard(shard, &format!("SELECT n FROM names WHERE name = '{name}'")),
            i.to_string()
        );

        let id = uuid::Uuid::new_v4();
        client
            .execute(
                "INSERT INTO users (user_id, name) VALUES ($1, $2)",
                &[&id, &name],
            )
            .await
            .expect("insert user");
        let rows = client
            .simple_query(&format!("SELECT name FROM users WHERE user_id = '{id}'"))
            .await
            .expect("user by literal");
        assert!(rows.iter().any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some(name.as_str()))));
        let shard = env.map.shard_for_key(&Key::Uuid(*id.as_bytes()));
        assert_eq!(
            env.on_shard(
                shard,
                &format!("SELECT name FROM users WHERE user_id = '{id}'")
            ),
            name
        );
    }
}

/// Named and unnamed prepared statements on one client, across many pooled connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_and_unnamed_statements_mix() {
    let env = shared_env();
    let client = env.router.connect().await;
    let ins = client
        .prepare("INSERT INTO kv (id, v) VALUES ($1, 'mix')")
        .await
        .expect("prepare insert");
    let sel = client
        .prepare("SELECT count(*) FROM kv WHERE id = $1")
        .await
        .expect("prepare select");
    for id in 3_000_000i64..3_000_100 {
        client.execute(&ins, &[&id]).await.expect("insert");
        let n: i64 = client.query_one(&sel, &[&id]).await.expect("select").get(0);
        assert_eq!(n, 1);
        let rows = client
            .query_typed(
                "SELECT v FROM kv WHERE id = $1",
                &[(&id, tokio_postgres::types::Type::INT8)],
            )
            .await
            .expect("unnamed");
        assert_eq!(rows[0].get::<_, String>(0), "mix");
    }
}

/// Statements without a user table go to any shard; unsharded tables live on the default
/// shard only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_table_and_unsharded_tables() {
    let env = shared_env();
    let client = env.router.connect().await;
    for _ in 0..8 {
        let row = client
            .query_one("SELECT 1 + 1", &[])
            .await
            .expect("no table");
        assert_eq!(row.get::<_, i32>(0), 2);
        client
            .simple_query("SHOW server_version")
            .await
            .expect("show");
        client
            .query("SELECT relname FROM pg_class LIMIT 1", &[])
            .await
            .expect("catalog");
    }
    client
        .execute("INSERT INTO settings (k, v) VALUES ('theme', 'dark') ON CONFLICT (k) DO UPDATE SET v = 'dark'", &[])
        .await
        .expect("unsharded insert");
    let row = client
        .query_one("SELECT v FROM settings WHERE k = 'theme'", &[])
        .await
        .expect("unsharded select");
    assert_eq!(row.get::<_, String>(0), "dark");
    let default = env.map.default_shard();
    for i in 0..env.map.shards().len() {
        let n = env.on_shard(i, "SELECT count(*) FROM settings WHERE k = 'theme'");
        assert_eq!(n, if i == default { "1" } else { "0" }, "shard {i}");
    }
}

/// IN lists and multi-row inserts are routed when all keys share a shard and refused with
/// 0A000 when they do not; several statements in one query likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_multi_statement_queries() {
    let env = shared_env();
    let client = env.router.connect().await;
    let a = env.key_on(0, 4_000_000);
    let b = env.key_on(0, a + 1);
    let c = env.key_on(1, 4_000_000);
    client
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES ({a}, 'a'), ({b}, 'b')"
        ))
        .await
        .expect("multi-row insert on one shard");
    let rows = client
        .query(
            &format!("SELECT v FROM kv WHERE id IN ({a}, {b}) ORDER BY v"),
            &[],
        )
        .await
        .expect("IN on one shard");
    assert_eq!(rows.len(), 2);

    let err = client
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES ({a}, 'x'), ({c}, 'y')"
        ))
        .await
        .expect_err("multi-row insert across shards, one row a duplicate");
    // Split per shard, and the duplicate on shard 0 rolled back the row for shard 1 too.
    assert_eq!(sqlstate(&err), "23505");
    assert_eq!(
        env.on_shard(1, &format!("SELECT count(*) FROM kv WHERE id = {c}")),
        "0"
    );
    // A read whose keys fall on several shards runs on every shard (each key's row lives on
    // one shard only) and its rows are concatenated; a write like that is refused.
    client
        .simple_query(&format!("INSERT INTO kv (id, v) VALUES ({c}, 'c')"))
        .await
        .expect("insert on shard 1");
    let rows = client
        .query(
            &format!("SELECT v FROM kv WHERE id IN ({a}, {b}, {c})"),
            &[],
        )
        .await
        .expect("IN across shards");
    let mut got: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    got.sort();
    assert_eq!(got, ["a", "b", "c"]);
    // Forms the planner cannot pin are either refused or answered from every shard, and then
    // the answer is the right one.
    match client
        .query(
            "SELECT v FROM kv WHERE id = ANY(ARRAY[$1, $2]::bigint[])",
            &[&a, &c],
        )
        .await
    {
        Ok(rows) => {
            let mut got: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            got.sort();
            assert_eq!(got, ["a", "c"]);
        }
        Err(e) => assert_eq!(sqlstate(&e), "0A000"),
    }
    // A write whose keys are on two shards runs on both (see writes_by_key_lists_span_shards).
    let n = client
        .execute(
            &format!("UPDATE kv SET v = 'x' WHERE id IN ({a}, {c})"),
            &[],
        )
        .await
        .expect("a write across shards");
    assert_eq!(n, 2);
    client
        .simple_query(&format!("UPDATE kv SET v = 'a' WHERE id = {a}"))
        .await
        .expect("put a back");

    // Several statements in one simple query, all on one shard.
    let msgs = client
        .simple_query(&format!(
            "UPDATE kv SET v = 'a2' WHERE id = {a}; SELECT v FROM kv WHERE id = {a}"
        ))
        .await
        .expect("two statements, one shard");
    assert!(msgs.iter().any(
        |m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("a2"))
    ));
    let err = client
        .simple_query(&format!(
            "SELECT v FROM kv WHERE id = {a}; SELECT v FROM kv WHERE id = {c}"
        ))
        .await
        .expect_err("two statements, two shards");
    assert_eq!(sqlstate(&err), "0A000");

    // The connection is fine afterwards.
    let row = client
        .query_one("SELECT v FROM kv WHERE id = $1", &[&b])
        .await
        .expect("still usable");
    assert_eq!(row.get::<_, String>(0), "b");
}

/// A sharded table without a pinned key, where the read cannot be merged exactly or the
/// statement writes (in a session that refuses writes on every shard), is refused with 0A000
/// naming the table, and the client's connection keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_statements_are_refused_clearly() {
    let env = shared_env();
    let client = env.router.connect().await;
    // Writes without a key run on every shard by default; this session refuses them.
    client
        .simple_query("SET shardgate.allow_scatter_writes = off")
        .await
        .expect("opt out");
    for sql in [
        "SELECT v FROM kv UNION ALL SELECT v FROM kv",
        "SELECT * FROM kv k1 JOIN kv k2 ON k1.v = k2.v",
        "UPDATE kv SET v = 'y'",
        "DELETE FROM kv WHERE id > 5",
        "UPDATE kv SET v = 'z' WHERE abs(id) = 5",
    ] {
        let err = client.simple_query(sql).await.expect_err(sql);
        assert_eq!(sqlstate(&err), "0A000", "{sql}");
        assert!(
            err.as_db_error()
                .is_some_and(|e| e.message().contains("kv")),
            "{sql}: {err:?}"
        );
        let err = client.query(sql, &[]).await.expect_err(sql);
        assert_eq!(sqlstate(&err), "0A000", "{sql} (extended)");
        client
            .query_one("SELECT 1", &[])
            .await
            .expect("usable after the refusal");
    }
}

/// Operators can pin statements to one shard: a leading `/* shard: RANGE */` comment, or the
/// session setting `shardgate.shard`; a range that is no shard's is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_routing_by_comment_and_setting() {
    let env = shared_env();
    let client = env.router.connect().await;
    for shard in 0..4 {
        let id = env.key_on(shard, 14_000_000);
        client
            .execute(
                "INSERT INTO kv (id, v) VALUES ($1, 'manual-marker')",
                &[&id],
            )
            .await
            .expect("one marker row per shard");
    }
    let count = "SELECT count(*) FROM kv WHERE v = 'manual-marker'";
    for shard in env.map.shards() {
        let msgs = client
            .simple_query(&format!("/* shard: {} */ {count}", shard.range))
            .await
            .expect("pinned by comment");
        let got: Vec<String> = msgs
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .collect();
        assert_eq!(got, ["1"], "shard {}", shard.range);
    }
    let range = env.map.shards()[2].range.to_string();
    client
        .simple_query(&format!("SET shardgate.shard = '{range}'"))
        .await
        .expect("set the manual shard");
    let n: i64 = client
        .query_one(count, &[])
        .await
        .expect("pinned by setting")
        .get(0);
    assert_eq!(n, 1, "only shard {range}");
    client
        .simple_query("RESET shardgate.shard")
        .await
        .expect("reset");
    let n: i64 = client
        .query_one(count, &[])
        .await
        .expect("all shards again")
        .get(0);
    assert_eq!(n, 4, "a scatter count over all shards again");
    let err = client
        .simple_query("/* shard: 12- */ SELECT 1")
        .await
        .expect_err("no such shard");
    assert_eq!(sqlstate(&err), "22023");
}

/// `INSERT INTO kv VALUES (...)` without a column list: the router reads the table's column
/// order from a shard's catalog before it is ready, so the key is found and the row lands on
/// its shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_without_a_column_list() {
    let env = shared_env();
    let client = env.router.connect().await;
    let id = env.key_on(3, 17_000_000);
    // The router read the column order from the catalog before it said it was ready.
    client
        .simple_query(&format!("INSERT INTO kv VALUES ({id}, 'no column list')"))
        .await
        .expect("insert without a column list");
    assert_eq!(
        env.on_shard(3, &format!("SELECT v FROM kv WHERE id = {id}")),
        "no column list"
    );
    let id2 = env.key_on(0, id + 1);
    client
        .execute("INSERT INTO kv VALUES ($1, $2)", &[&id2, &"extended"])
        .await
        .expect("extended protocol too");
    assert_eq!(
        env.on_shard(0, &format!("SELECT v FROM kv WHERE id = {id2}")),
        "extended"
    );
}

/// A multi-row INSERT whose rows belong to several shards is split per shard: every row lands on
/// its own shard, RETURNING gives the rows back in VALUES order, and a failing row leaves no
/// row of the statement anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_row_inserts_split_across_shards() {
    let env = shared_env();
    let client = env.router.connect().await;
    // Rows in an order that alternates shards.
    let keys: Vec<i64> = (0..8)
        .map(|i| env.key_on(i % 4, 52_000_000 + 1000 * i as i64))
        .collect();
    let values: Vec<String> = keys.iter().map(|k| format!("({k}, 'split {k}')")).collect();
    let msgs = client
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES {} RETURNING id, v",
            values.join(", ")
        ))
        .await
        .expect("split insert");
    let returned: Vec<i64> = msgs
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()),
            _ => None,
        })
        .collect();
    assert_eq!(returned, keys, "RETURNING in VALUES order");
    assert!(msgs
        .iter()
        .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::CommandComplete(8))));
    for (i, k) in keys.iter().enumerate() {
        for shard in 0..4 {
            let n = env.on_shard(shard, &format!("SELECT count(*) FROM kv WHERE id = {k}"));
            assert_eq!(
                n,
                if shard == i % 4 { "1" } else { "0" },
                "key {k} on shard {shard}"
            );
        }
    }
    // A bad value in one row (v is NOT NULL): nothing of the statement is anywhere.
    let (x, y) = (env.key_on(2, 53_000_000), env.key_on(3, 53_000_000));
    let err = client
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES ({x}, 'x'), ({y}, NULL)"
        ))
        .await
        .expect_err("bad row");
    assert_eq!(sqlstate(&err), "23502");
    for (shard, k) in [(2, x), (3, y)] {
        assert_eq!(
            env.on_shard(shard, &format!("SELECT count(*) FROM kv WHERE id = {k}")),
            "0"
        );
    }
    // In a transaction it joins the transaction on both shards; the ROLLBACK undoes it.
    client.simple_query("BEGIN").await.expect("begin");
    client
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES ({x}, 'x'), ({y}, 'y')"
        ))
        .await
        .expect("in a transaction");
    client.simple_query("ROLLBACK").await.expect("rollback");
    for (shard, k) in [(2, x), (3, y)] {
        assert_eq!(
            env.on_shard(shard, &format!("SELECT count(*) FROM kv WHERE id = {k}")),
            "0"
        );
    }
    // With bound parameters it is split the same way.
    let n = client
        .execute(
            "INSERT INTO kv (id, v) VALUES ($1, 'x'), ($2, 'y')",
            &[&x, &y],
        )
        .await
        .expect("bound parameters");
    assert_eq!(n, 2);
    assert_eq!(
        env.on_shard(3, &format!("SELECT v FROM kv WHERE id = {y}")),
        "y"
    );
}

/// UPDATE/DELETE whose keys (`IN`, `= ANY`) fall on several shards run on the shards of their
/// keys, each in a transaction, committed only if every shard succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_by_key_lists_span_shards() {
    let env = shared_env();
    let client = env.router.connect().await;
    let keys: Vec<i64> = (0..4).map(|s| env.key_on(s, 54_000_000)).collect();
    for k in &keys {
        client
            .execute("INSERT INTO kv (id, v) VALUES ($1, 'before')", &[k])
            .await
            .expect("insert");
    }
    // = ANY($1) with a bound array (binary), in a read and in a write with RETURNING.
    let rows = client
        .query("SELECT id FROM kv WHERE id = ANY($1)", &[&keys])
        .await
        .expect("read by array");
    let mut got: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    got.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(got, want);
    let rows = client
        .query(
            "UPDATE kv SET v = 'after' WHERE id = ANY($1) RETURNING id",
            &[&keys[1..].to_vec()],
        )
        .await
        .expect("update by array");
    assert_eq!(rows.len(), 3);
    for (shard, k) in keys.iter().enumerate() {
        let v = env.on_shard(shard, &format!("SELECT v FROM kv WHERE id = {k}"));
        assert_eq!(
            v,
            if shard == 0 { "before" } else { "after" },
            "shard {shard}"
        );
    }
    // One shard refuses its part (v is NOT NULL): the other shard's part is rolled back.
    let (a, c) = (keys[0], keys[2]);
    let err = client
        .simple_query(&format!(
            "UPDATE kv SET v = CASE WHEN id = {c} THEN NULL ELSE 'partial' END WHERE id IN ({a}, {c})"
        ))
        .await
        .expect_err("fails on one shard");
    assert_eq!(sqlstate(&err), "23502");
    assert_eq!(
        env.on_shard(0, &format!("SELECT v FROM kv WHERE id = {a}")),
        "before"
    );
    // In a transaction it joins the transaction on both shards, and the ROLLBACK undoes it.
    client.simple_query("BEGIN").await.expect("begin");
    let done = client
        .simple_query(&format!("DELETE FROM kv WHERE id IN ({a}, {c})"))
        .await
        .expect("in a transaction");
    assert!(
        done.iter()
            .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::CommandComplete(2))),
        "{done:?}"
    );
    client.simple_query("ROLLBACK").await.expect("rollback");
    for (shard, k) in [(0, a), (2, c)] {
        assert_eq!(
            env.on_shard(shard, &format!("SELECT count(*) FROM kv WHERE id = {k}")),
            "1",
            "rolled back on shard {shard}"
        );
    }
    // A text array literal in a DELETE.
    let n = client
        .execute(
            &format!(
                "DELETE FROM kv WHERE id = ANY('{{{}}}'::bigint[])",
                keys.iter()
                    .map(|k| k.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            &[],
        )
        .await
        .expect("delete by array literal");
    assert_eq!(n, 4);
    for (shard, k) in keys.iter().enumerate() {
        assert_eq!(
            env.on_shard(shard, &format!("SELECT count(*) FROM kv WHERE id = {k}")),
            "0"
        );
    }
}

/// Two clients writing the same keys on two shards at the same time, over and over: the
/// shards' parts run in shard order, so the writes queue behind each other instead of each
/// holding one shard's row while waiting for the other's (a cycle no single Postgres sees).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_across_shards_do_not_deadlock() {
    let env = shared_env();
    let (a, b) = (env.key_on(0, 56_000_000), env.key_on(1, 56_000_000));
    let setup = env.router.connect().await;
    setup
        .simple_query(&format!(
            "INSERT INTO kv (id, v) VALUES ({a}, '0'), ({b}, '0')"
        ))
        .await
        .expect("rows");
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let client = env.router.connect().await;
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                let n = client
                    .execute(
                        "UPDATE kv SET v = (v::int + 1)::text WHERE id = ANY($1)",
                        &[&vec![a, b]],
                    )
                    .await
                    .expect("update both shards");
                assert_eq!(n, 2);
            }
        }));
    }
    // A deadlock would hang forever; a generous bound turns it into a failure.
    let all = join_tasks(tasks);
    tokio::time::timeout(std::time::Duration::from_secs(120), all)
        .await
        .expect("the writes finished (no cross-shard deadlock)");
    for (shard, k) in [(0, a), (1, b)] {
        assert_eq!(
            env.on_shard(shard, &format!("SELECT v FROM kv WHERE id = {k}")),
            "80"
        );
    }
}

async fn join_tasks(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        t.await.expect("task");
    }
}

/// `EXPLAIN (ROUTE)` is answered by the router: which shard and why, one row per shard, and
/// nothing runs. A plain `EXPLAIN` of a read on every shard gives each shard's plan under a
/// line naming the shard; `EXPLAIN ANALYZE` of a write on several shards is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_routes_and_plans_per_shard() {
    let env = shared_env();
    let client = env.router.connect().await;
    let id = env.key_on(2, 19_000_000);
    let out = client
        .simple_query(&format!("EXPLAIN (ROUTE) SELECT v FROM kv WHERE id = {id}"))
        .await
        .expect("explain route");
    let rows = common::rows(&out);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let shard = &env.map.shards()[2];
    assert_eq!(rows[0][0], shard.range.to_string());
    assert_eq!(rows[0][1], shard.primary.endpoint());
    assert_eq!(rows[0][2], format!("kv.id = {id}"));
    assert_eq!(rows[0][3], shardmap::Key::Int(id).keyspace_id().to_string());
    assert_eq!(rows[0][5], format!("SELECT v FROM kv WHERE id = {id}"));
    // Explaining runs nothing: a write is only described.
    let out = client
        .simple_query(&format!(
            "EXPLAIN (ROUTE) INSERT INTO kv (id, v) VALUES ({id}, 'never')"
        ))
        .await
        .expect("explain route of an insert");
    assert_eq!(common::rows(&out).len(), 1);
    assert_eq!(
        env.on_shard(2, &format!("SELECT count(*) FROM kv WHERE id = {id}")),
        "0"
    );
    // Every shard, and a refusal, as rows.
    let out = client
        .simple_query("EXPLAIN (ROUTE) SELECT count(*) FROM kv")
        .await
        .expect("explain route of a merged read");
    assert_eq!(common::rows(&out).len(), 4);
    let out = client
        .simple_query("EXPLAIN (ROUTE) SELECT * FROM kv JOIN settings ON true")
        .await
        .expect("explain route of a refused statement");
    let rows = common::rows(&out);
    assert!(rows[0][2].starts_with("refused (0A000)"), "{rows:?}");

    // A plain EXPLAIN on every shard: four plans, each under its shard's line.
    let out = client
        .simple_query("EXPLAIN SELECT id FROM kv ORDER BY id")
        .await
        .expect("explain across shards");
    let lines: Vec<String> = common::rows(&out)
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    let labels: Vec<&String> = lines.iter().filter(|l| l.starts_with("shard ")).collect();
    assert_eq!(labels.len(), 4, "{lines:?}");
    for (label, shard) in labels.iter().zip(env.map.shards()) {
        assert!(
            label.starts_with(&format!("shard {} (", shard.range)),
            "{label}"
        );
    }
    assert!(lines.len() > 4, "the plans themselves: {lines:?}");
    assert!(!lines[0].starts_with("Sort") && lines[0].starts_with("shard "));
    let err = client
        .simple_query("EXPLAIN ANALYZE DELETE FROM kv")
        .await
        .expect_err("EXPLAIN ANALYZE of a write on every shard");
    assert_eq!(sqlstate(&err), "0A000");
}

/// Pinning by a key: a leading `/* sharding_key: K */` comment, or `SET shardgate.sharding_key`
/// for the session or (`SET LOCAL`) for the transaction, sends a statement to K's shard, and
/// `EXPLAIN (ROUTE)` names the hint; with `[hints] allow = "admins"` only admin users may pin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_routing_by_key_for_the_session_and_the_transaction() {
    let env = shared_env();
    let mut client = env.router.connect().await;
    let keys: Vec<i64> = (0..4).map(|s| env.key_on(s, 15_100_000)).collect();
    for id in &keys {
        client
            .execute("INSERT INTO kv (id, v) VALUES ($1, 'key-marker')", &[id])
            .await
            .expect("one marker row per shard");
    }
    let count = "SELECT count(*) FROM kv WHERE v = 'key-marker'";
    let first = |msgs: Vec<tokio_postgres::SimpleQueryMessage>| common::rows(&msgs)[0][0].clone();
    for id in &keys {
        let msgs = client
            .simple_query(&format!("/* sharding_key: {id} */ {count}"))
            .await
            .expect("pinned by comment");
        assert_eq!(first(msgs), "1", "key {id}");
    }
    // For the session, in the extended protocol too; EXPLAIN (ROUTE) says why.
    client
        .batch_execute(&format!("SET shardgate.sharding_key = '{}'", keys[2]))
        .await
        .expect("set the key");
    let n: i64 = client.query_one(count, &[]).await.expect("pinned").get(0);
    assert_eq!(n, 1);
    let explained = client
        .simple_query(&format!("EXPLAIN (ROUTE) {count}"))
        .await
        .expect("explain");
    let text = common::rows(&explained).concat().join(" ");
    assert!(
        text.contains(&format!("sharding_key: {}", keys[2])),
        "{text}"
    );
    client
        .batch_execute("RESET shardgate.sharding_key")
        .await
        .expect("reset");
    let n: i64 = client.query_one(count, &[]).await.expect("all").get(0);
    assert_eq!(n, 4);
    // For one transaction: seen by the statements after it, gone after COMMIT.
    let tx = client.transaction().await.expect("begin");
    tx.batch_execute(&format!("SET LOCAL shardgate.sharding_key = '{}'", keys[1]))
        .await
        .expect("set local");
    let n: i64 = tx
        .query_one(count, &[])
        .await
        .expect("pinned in the transaction")
        .get(0);
    assert_eq!(n, 1);
    tx.commit().await.expect("commit");
    let n: i64 = client
        .query_one(count, &[])
        .await
        .expect("all again")
        .get(0);
    assert_eq!(n, 4);

    // Admins only.
    let admins_only = common::Router::start_with(
        &env.map,
        "[[users]]\nname = \"ops\"\npassword = \"ops-secret\"\nadmin = true\n[hints]\nallow = \"admins\"\n",
    );
    let app = admins_only.connect().await;
    let err = app
        .simple_query(&format!("/* sharding_key: {} */ {count}", keys[0]))
        .await
        .expect_err("not an admin");
    assert_eq!(sqlstate(&err), "42501");
    let n: i64 = app
        .query_one(count, &[])
        .await
        .expect("unpinned is fine")
        .get(0);
    assert_eq!(n, 4);
    let ops = common::connect(&admins_only.url_as("ops", "ops-secret", common::DATABASE))
        .await
        .expect("the admin user logs in");
    let msgs = ops
        .simple_query(&format!("/* sharding_key: {} */ {count}", keys[0]))
        .await
        .expect("an admin pins");
    assert_eq!(first(msgs), "1");
}
