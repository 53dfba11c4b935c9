//! Reads of a sharded table without a key: answered from every shard and merged exactly
//! (rows concatenated, a LIMIT honoured, count() summed), or refused with 0A000 when the merge
//! would not be exact. Never a wrong answer.

mod common;

use common::{lines, rows, shared_env, sqlstate, Router};
use tokio_postgres::SimpleQueryMessage;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_across_shards_merge_exactly() {
    let env = shared_env();
    let client = env.router.connect().await;
    let ids: Vec<i64> = (13_000_000..13_000_200).collect();
    let insert = client
        .prepare("INSERT INTO kv (id, v) VALUES ($1, 'scatter')")
        .await
        .expect("prepare");
    for id in &ids {
        client.execute(&insert, &[id]).await.expect("insert");
    }
    let per_shard: Vec<usize> = (0..4)
        .map(|s| {
            env.on_shard(s, "SELECT count(*) FROM kv WHERE v = 'scatter'")
                .parse()
                .expect("count")
        })
        .collect();
    assert!(per_shard.iter().all(|&n| n > 0), "{per_shard:?}");
    let total: usize = per_shard.iter().sum();
    assert_eq!(total, 200);
    // count(*) in the simple protocol (other tests of this binary write to kv at the same
    // time, so the count is of this test's rows).
    let got = rows(
        &client
            .simple_query("SELECT count(*) FROM kv WHERE id >= 13000000 AND id < 13000200")
            .await
            .expect("count"),
    );
    assert_eq!(got, [["200".to_string()]]);
    let n: i64 = client
        .query_one("SELECT count(*) FROM kv WHERE v = $1", &[&"scatter"])
        .await
        .expect("count")
        .get(0);
    assert_eq!(n, 200);
    let n: i64 = client
        .query_one("SELECT count(v) AS n FROM kv WHERE v = 'scatter'", &[])
        .await
        .expect("count")
        .get("n");
    assert_eq!(n, 200);

    // Plain rows from every shard.
    let got = rows(
        &client
            .simple_query("SELECT id, v FROM kv WHERE v = 'scatter'")
            .await
            .expect("scan"),
    );
    assert_eq!(got.len(), 200);
    let mut seen: Vec<i64> = got.iter().map(|r| r[0].parse().expect("id")).collect();
    seen.sort_unstable();
    assert_eq!(seen, ids);
    let got = client
        .query("SELECT id FROM kv WHERE v = $1", &[&"scatter"])
        .await
        .expect("extended scan");
    assert_eq!(got.len(), 200);
    let got = client
        .query("SELECT id FROM kv WHERE v = 'scatter' LIMIT 7", &[])
        .await
        .expect("limit");
    assert_eq!(got.len(), 7);
    let got = client
        .query("SELECT id FROM kv WHERE v = 'scatter' LIMIT $1", &[&3i64])
        .await
        .expect("limit param");
    assert_eq!(got.len(), 3);
    let none = client
        .query("SELECT id FROM kv WHERE v = 'nothing'", &[])
        .await
        .expect("empty");
    assert!(none.is_empty());

    // count(DISTINCT) of a column other than the key: each value counted once over all shards.
    // Other tests of this binary write kv meanwhile: compared when the values read before and
    // after the count are the same.
    let every_v = || async {
        client
            .query("SELECT v FROM kv", &[])
            .await
            .expect("every v")
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<std::collections::HashSet<String>>()
    };
    let mut compared = false;
    for _ in 0..20 {
        let before = every_v().await;
        let distinct: i64 = client
            .query_one("SELECT count(DISTINCT v) FROM kv", &[])
            .await
            .expect("count distinct")
            .get(0);
        if every_v().await == before {
            assert_eq!(distinct, before.len() as i64);
            compared = true;
            break;
        }
    }
    assert!(compared, "kv's values never stood still around the count");

    // What the merge cannot finish is read in two stages (tests/staged.rs): this test's rows
    // (others write kv at the same time) as they were read back.
    let mine = "FROM kv WHERE id >= 13000000 AND id < 13000200";
    for (sql, want) in [
        (
            format!("SELECT id {mine} ORDER BY v, id LIMIT 2"),
            vec!["13000000", "13000001"],
        ),
        (
            format!("SELECT v, count(*) {mine} GROUP BY v HAVING count(*) > 1"),
            vec!["scatter|200"],
        ),
        (
            format!("SELECT length(string_agg(v, ',')) {mine}"),
            vec!["1599"],
        ),
        (
            format!("SELECT DISTINCT ON (v) v, id {mine} ORDER BY v, id"),
            vec!["scatter|13000000"],
        ),
        (
            format!("SELECT count(DISTINCT id), max(lower(v)) {mine}"),
            vec!["200|scatter"],
        ),
    ] {
        assert_eq!(lines(&client, &sql).await, want, "{sql}");
        let extended = client.query(&sql, &[]).await.expect(&sql);
        assert_eq!(extended.len(), want.len(), "{sql} (extended)");
    }
    // What neither can is refused, and says why (the count of numerics only when the shards
    // describe their values: the merge was planned).
    for sql in [
        "SELECT count(DISTINCT id::numeric) FROM kv",
        "SELECT v FROM kv UNION SELECT v FROM kv",
        "SELECT id FROM kv ORDER BY v FOR UPDATE",
    ] {
        let err = client.simple_query(sql).await.expect_err(sql);
        assert_eq!(sqlstate(&err), "0A000", "{sql}");
        let err = client.query(sql, &[]).await.expect_err(sql);
        assert_eq!(sqlstate(&err), "0A000", "{sql} (extended)");
    }
    // Postgres's own errors come through.
    let err = client
        .simple_query("SELECT nope FROM kv")
        .await
        .expect_err("bad column");
    assert_eq!(sqlstate(&err), "42703");
    // Inside a transaction the read runs on every shard inside it, merged the same way.
    client.simple_query("BEGIN").await.expect("begin");
    let inside = client
        .simple_query("SELECT count(*) FROM kv WHERE id >= 13000000 AND id < 13000200")
        .await
        .expect("in a transaction");
    assert_eq!(rows(&inside), [["200"]]);
    client.simple_query("ROLLBACK").await.expect("rollback");
    client.query_one("SELECT 1", &[]).await.expect("usable");
}

#[test]
fn psql_counts_a_sharded_table() {
    let env = shared_env();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = env.router.connect().await;
        for i in 0..50 {
            client
                .execute(
                    "INSERT INTO names (name, n) VALUES ($1, $2)",
                    &[&format!("psql-{i}"), &i],
                )
                .await
                .expect("insert");
        }
    });
    let (ok, out, err) = common::run(
        std::process::Command::new(common::pg_program("psql"))
            .arg(env.router.url())
            .args([
                "-X",
                "-At",
                "-c",
                "SELECT count(*) FROM names WHERE name LIKE 'psql-%'",
            ]),
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "50");
    let spread = (0..4)
        .filter(|&s| env.on_shard(s, "SELECT count(*) FROM names WHERE name LIKE 'psql-%'") != "0")
        .count();
    assert!(spread > 1, "the names are on several shards");
}

/// UPDATE and DELETE without a key are refused unless the client opts in; then they run on
/// every shard and report the total row count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_every_shard_only_when_asked() {
    let env = shared_env();
    let client = env.router.connect().await;
    let insert = client
        .prepare("INSERT INTO kv (id, v) VALUES ($1, 'sw-old')")
        .await
        .expect("prepare");
    for id in 15_000_000i64..15_000_100 {
        client.execute(&insert, &[&id]).await.expect("insert");
    }
    // A session may refuse them for itself, and a router for everyone.
    client
        .simple_query("SET shardgate.allow_scatter_writes = off")
        .await
        .expect("opt out");
    let err = client
        .execute("UPDATE kv SET v = 'sw-new' WHERE v = 'sw-old'", &[])
        .await
        .expect_err("refused in this session");
    assert_eq!(sqlstate(&err), "0A000");
    assert!(err
        .as_db_error()
        .is_some_and(|e| e.message().contains("allow_scatter_writes")));
    let refusing = Router::start_with(&env.map, "[transactions]\nscatter_writes = \"refuse\"\n");
    let err = refusing
        .connect()
        .await
        .execute("UPDATE kv SET v = 'sw-new' WHERE v = 'sw-old'", &[])
        .await
        .expect_err("refused by that router");
    assert_eq!(sqlstate(&err), "0A000");

    client
        .simple_query("SET shardgate.allow_scatter_writes = on")
        .await
        .expect("opt in");
    let n = client
        .execute("UPDATE kv SET v = 'sw-new' WHERE v = 'sw-old'", &[])
        .await
        .expect("update on every shard");
    assert_eq!(n, 100);
    let changed: usize = (0..4)
        .map(|s| {
            env.on_shard(s, "SELECT count(*) FROM kv WHERE v = 'sw-new'")
                .parse::<usize>()
                .expect("count")
        })
        .sum();
    assert_eq!(changed, 100);
    // A write that fails on one shard (v is NOT NULL) changes nothing on any shard.
    let victim = env.key_on(2, 19_700_000);
    client
        .execute(
            "INSERT INTO kv (id, v) VALUES ($1, 'sw-victim')",
            &[&victim],
        )
        .await
        .expect("victim row");
    let err = client
        .simple_query(&format!(
            "UPDATE kv SET v = CASE WHEN id = {victim} THEN NULL ELSE 'sw-bad' END WHERE v IN ('sw-new', 'sw-victim')"
        ))
        .await
        .expect_err("fails on one shard");
    assert_eq!(sqlstate(&err), "23502");
    for s in 0..4 {
        assert_eq!(
            env.on_shard(s, "SELECT count(*) FROM kv WHERE v = 'sw-bad'"),
            "0",
            "shard {s}"
        );
    }
    client
        .execute("DELETE FROM kv WHERE id = $1", &[&victim])
        .await
        .expect("victim gone");
    let msgs = client
        .simple_query("DELETE FROM kv WHERE v = 'sw-new' RETURNING id")
        .await
        .expect("delete on every shard");
    let returned = msgs
        .iter()
        .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
        .count();
    assert_eq!(returned, 100);
    assert!(msgs
        .iter()
        .any(|m| matches!(m, SimpleQueryMessage::CommandComplete(100))));
    // The default ([transactions] scatter_writes = "allow") runs them, as one Postgres would.
    client
        .simple_query("RESET shardgate.allow_scatter_writes")
        .await
        .expect("back to the default");
    let n = client
        .execute("DELETE FROM kv WHERE v = 'sw-new'", &[])
        .await
        .expect("allowed by default");
    assert_eq!(n, 0);
}

/// count, sum, min and max over all shards merge exactly, in text and in binary results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_merge_across_shards() {
    let env = shared_env();
    let client = env.router.connect().await;
    let ids: Vec<i64> = (18_000_000..18_000_050).collect();
    for id in &ids {
        client
            .execute("INSERT INTO kv (id, v) VALUES ($1, 'agg')", &[id])
            .await
            .expect("insert");
    }
    let spread = (0..4)
        .filter(|&s| env.on_shard(s, "SELECT count(*) FROM kv WHERE v = 'agg'") != "0")
        .count();
    assert!(spread > 1, "rows on several shards");
    let got = rows(
        &client
            .simple_query("SELECT count(*), sum(id), min(id), max(id) FROM kv WHERE v = 'agg'")
            .await
            .expect("aggregates"),
    );
    let sum: i64 = ids.iter().sum();
    assert_eq!(
        got,
        [[
            "50".to_string(),
            sum.to_string(),
            "18000000".into(),
            "18000049".into()
        ]]
    );
    // Binary results (tokio-postgres asks for them): bigint count, min and max.
    let row = client
        .query_one(
            "SELECT count(*), min(id), max(id) FROM kv WHERE v = $1",
            &[&"agg"],
        )
        .await
        .expect("binary aggregates");
    assert_eq!(
        (
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2)
        ),
        (50, 18_000_000, 18_000_049)
    );
    // No rows: count 0, the others NULL, as on one database.
    let got = rows(
        &client
            .simple_query("SELECT count(*), sum(id), max(id) FROM kv WHERE v = 'none at all'")
            .await
            .expect("empty"),
    );
    assert_eq!(got, [["0".to_string(), "NULL".into(), "NULL".into()]]);
    // Text min/max compare by bytes, which is right under the shards' C collation.
    let got = rows(
        &client
            .simple_query("SELECT max(v), min(v) FROM kv WHERE v = 'agg'")
            .await
            .expect("text max"),
    );
    assert_eq!(got, [["agg".to_string(), "agg".into()]]);
}

/// Sums and averages of floats across shards are merged from the text the shards print, which
/// is the exact value only with `extra_float_digits` above 0: below, they are refused (0A000),
/// and min/max (passed through as printed) still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn float_sums_across_shards_need_extra_float_digits_above_0() {
    let env = shared_env();
    let client = env.router.connect().await;
    for id in 18_100_000..18_100_040i64 {
        client
            .execute("INSERT INTO kv (id, v) VALUES ($1, 'fsum')", &[&id])
            .await
            .expect("insert");
    }
    let sum = "SELECT sum(id::float8 / 7) FROM kv WHERE v = 'fsum'";
    let avg = "SELECT avg(id::float8 / 7) FROM kv WHERE v = 'fsum'";
    let extremes = "SELECT min(id::float8 / 7), max(id::float8 / 7) FROM kv WHERE v = 'fsum'";
    for q in [sum, avg, extremes] {
        client
            .simple_query(q)
            .await
            .expect("default extra_float_digits");
    }
    // 18100000 / 7 with 15 + extra_float_digits significant digits, as Postgres prints it.
    for (setting, min) in [("0", "2585714.28571429"), ("-3", "2585714.28571")] {
        client
            .batch_execute(&format!("SET extra_float_digits = {setting}"))
            .await
            .expect("set");
        for q in [sum, avg] {
            let e = client.simple_query(q).await.expect_err("refused");
            assert_eq!(sqlstate(&e), "0A000", "{q}: {e:?}");
        }
        let got = rows(&client.simple_query(extremes).await.expect("min/max"));
        assert_eq!(got[0][0], min, "{setting}");
    }
    client
        .batch_execute("SET extra_float_digits = 3")
        .await
        .expect("set");
    client
        .simple_query(sum)
        .await
        .expect("extra_float_digits 3");
    client
        .batch_execute("RESET extra_float_digits")
        .await
        .expect("reset");
    client.simple_query(avg).await.expect("after RESET");
}

/// Sorted, grouped, distinct and averaged reads across shards give exactly what one Postgres
/// gives for the same rows (the reference runs on one shard over a VALUES list of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_reads_match_one_postgres() {
    let env = shared_env();
    let client = env.router.connect().await;
    let data: Vec<(String, Option<i32>)> = (0..60)
        .map(|i| (format!("mrg-{i:03}"), (i % 11 != 0).then_some(i % 7)))
        .collect();
    let one_postgres = env.names_on_shards(&client, "mrg-", &data).await;
    for sql in [
        "SELECT name, n FROM names WHERE name LIKE 'mrg-%' ORDER BY name",
        "SELECT * FROM names WHERE name LIKE 'mrg-%' ORDER BY n, name DESC",
        "SELECT * FROM names WHERE name LIKE 'mrg-%' ORDER BY 2 DESC, 1 LIMIT 7",
        "SELECT name, n FROM names WHERE name LIKE 'mrg-%' ORDER BY n DESC NULLS LAST, name LIMIT 10 OFFSET 5",
        "SELECT name, n FROM names WHERE name LIKE 'mrg-%' ORDER BY 2, 1 DESC OFFSET 50",
        "SELECT n, count(*), sum(n), avg(n), min(name), max(name) FROM names WHERE name LIKE 'mrg-%' GROUP BY n ORDER BY n",
        "SELECT avg(n) AS mean, count(n), sum(n), count(*) FROM names WHERE name LIKE 'mrg-%'",
        "SELECT DISTINCT n FROM names WHERE name LIKE 'mrg-%' ORDER BY 1 NULLS FIRST",
        "SELECT n, count(*) AS c FROM names WHERE name LIKE 'mrg-%' GROUP BY n ORDER BY c DESC, n LIMIT 3",
        "SELECT n % 3 AS m, avg(n) FROM names WHERE name LIKE 'mrg-%' GROUP BY n % 3 ORDER BY m",
        "SELECT avg(n), count(*) FROM names WHERE name LIKE 'none-%'",
        "SELECT avg(n), n % 2 FROM names WHERE name LIKE 'mrg-%' GROUP BY 2 ORDER BY 2 NULLS FIRST",
    ] {
        let got = lines(&client, sql).await;
        let want = env.on_shard(0, &sql.replace("FROM names", &one_postgres));
        let want: Vec<&str> = want.lines().collect();
        assert_eq!(got, want, "{sql}");
    }
    // The extended protocol, parameters in LIMIT/OFFSET and binary results.
    let rows = client
        .query(
            "SELECT name, n FROM names WHERE name LIKE $1 ORDER BY n DESC NULLS LAST, name LIMIT $2 OFFSET $3",
            &[&"mrg-%", &10i64, &5i64],
        )
        .await
        .expect("sorted, extended");
    let got: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let want = env.on_shard(
        0,
        &format!("SELECT name {one_postgres} ORDER BY n DESC NULLS LAST, name LIMIT 10 OFFSET 5"),
    );
    assert_eq!(got, want.lines().collect::<Vec<_>>());
    let rows = client
        .query(
            "SELECT n, count(*), min(name) FROM names WHERE name LIKE $1 GROUP BY n ORDER BY n NULLS FIRST LIMIT $2",
            &[&"mrg-%", &4i64],
        )
        .await
        .expect("grouped, extended");
    let got: Vec<String> = rows
        .iter()
        .map(|r| {
            let n: Option<i32> = r.get(0);
            let c: i64 = r.get(1);
            let m: String = r.get(2);
            format!("{}|{c}|{m}", n.map(|n| n.to_string()).unwrap_or_default())
        })
        .collect();
    let want = env.on_shard(
        0,
        &format!("SELECT n, count(*), min(name) {one_postgres} GROUP BY n ORDER BY n NULLS FIRST LIMIT 4"),
    );
    assert_eq!(got, want.lines().collect::<Vec<_>>());
}

/// A grouped read across shards holds its groups in the router: `limits.max_merge_groups`
/// bounds them, with 54000 past it, and the client goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_reads_are_bounded() {
    let env = shared_env();
    let router = common::Router::start_with(&env.map, "[limits]\nmax_merge_groups = 3\n");
    let client = router.connect().await;
    for i in 0..8 {
        client
            .execute(
                "INSERT INTO names (name, n) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&format!("cap-{i}"), &i],
            )
            .await
            .expect("insert");
    }
    let got = rows(
        &client
            .simple_query("SELECT n % 3 AS m, count(*) FROM names WHERE name LIKE 'cap-%' GROUP BY n % 3 ORDER BY m")
            .await
            .expect("three groups"),
    );
    assert_eq!(got, [["0", "3"], ["1", "3"], ["2", "2"]]);
    let err = client
        .simple_query("SELECT n, count(*) FROM names WHERE name LIKE 'cap-%' GROUP BY n")
        .await
        .expect_err("eight groups");
    assert_eq!(sqlstate(&err), "54000");
    assert_eq!(
        rows(&client.simple_query("SELECT 1").await.expect("usable")),
        [["1"]]
    );
}
