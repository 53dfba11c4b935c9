//! Reads across shards that the merge cannot finish, run in two stages: the shards' part
//! (a subquery in FROM, or the table's rows under its WHERE) across shards, the rest on one
//! shard over those rows (array parameters read back with unnest). Each answer is compared
//! with one Postgres holding the same rows; what the router cannot carry exactly is refused,
//! and the session goes on.

mod common;

use common::{lines, rows, shared_env, sqlstate};

/// The message of a database error.
fn message(err: &tokio_postgres::Error) -> String {
    err.as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_else(|| err.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_in_two_stages_match_one_postgres() {
    let env = shared_env();
    let client = env.router.connect().await;
    let data: Vec<(String, Option<i32>)> = (0..48)
        .map(|i| (format!("stg-{i:03}"), (i % 9 != 0).then_some(i % 5)))
        .collect();
    let one_postgres = env.names_on_shards(&client, "stg-", &data).await;
    for sql in [
        // Windows over every shard's rows.
        "SELECT n, count(*), rank() OVER (ORDER BY count(*) DESC, n NULLS FIRST) FROM names WHERE name LIKE 'stg-%' GROUP BY n ORDER BY n NULLS FIRST",
        "SELECT name, sum(n) OVER (ORDER BY name ROWS 2 PRECEDING) FROM names WHERE name LIKE 'stg-%' ORDER BY name",
        // Functions over aggregates, HAVING on another column, DISTINCT ON.
        "SELECT coalesce(sum(n), 0), max(n) - min(n) + 1, round(avg(n), 2) FROM names WHERE name LIKE 'stg-%'",
        "SELECT n % 3 AS m, count(*) FROM names WHERE name LIKE 'stg-%' GROUP BY 1 HAVING count(*) > 2 ORDER BY 1 NULLS FIRST",
        "SELECT DISTINCT ON (n) n, name FROM names WHERE name LIKE 'stg-%' ORDER BY n, name DESC",
        // Subqueries in FROM: groups of groups, a sorted LIMIT re-sorted.
        "SELECT count(*), max(c), sum(c) FROM (SELECT n, count(*) AS c FROM names WHERE name LIKE 'stg-%' GROUP BY n) s",
        "SELECT * FROM (SELECT name, n FROM names WHERE name LIKE 'stg-%' ORDER BY name LIMIT 5) s ORDER BY n NULLS FIRST, name",
        "SELECT s.k, s.c FROM (SELECT n AS k, count(*) FROM names WHERE name LIKE 'stg-%' GROUP BY n) AS s(k, c) WHERE s.c > 1 ORDER BY 1 NULLS LAST",
        // Nothing in the first stage.
        "SELECT row_number() OVER (), name FROM names WHERE name LIKE 'none-%'",
        "SELECT count(*), coalesce(max(c), -1) FROM (SELECT n, count(*) AS c FROM names WHERE name LIKE 'none-%' GROUP BY n) s",
    ] {
        let got = lines(&client, sql).await;
        let want = env.on_shard(0, &sql.replace("FROM names", &one_postgres));
        let want: Vec<&str> = want.lines().collect();
        assert_eq!(got, want, "{sql}");
    }
    // EXPLAIN (ROUTE) says so.
    let plan = lines(
        &client,
        "EXPLAIN (ROUTE) SELECT DISTINCT n, count(*) OVER () FROM names WHERE name LIKE 'stg-%'",
    )
    .await
    .join("\n");
    assert!(
        plan.contains("unnest(<the rows, one array per column>)) AS names"),
        "{plan}"
    );

    // The extended protocol without parameters, binary results: the same rows.
    let sql = "SELECT n, count(*) AS c, (sum(count(*)) OVER ())::int8 AS total FROM names WHERE name LIKE 'stg-%' GROUP BY n ORDER BY n NULLS FIRST";
    let got: Vec<String> = client
        .query(sql, &[])
        .await
        .expect("extended, two stages")
        .iter()
        .map(|r| {
            let n: Option<i32> = r.get(0);
            let c: i64 = r.get(1);
            let total: i64 = r.get(2);
            format!(
                "{}|{c}|{total}",
                n.map(|n| n.to_string()).unwrap_or_default()
            )
        })
        .collect();
    let want = env.on_shard(0, &sql.replace("FROM names", &one_postgres));
    assert_eq!(got, want.lines().collect::<Vec<_>>());
    // With parameters (tokio-postgres leaves their types to the server and sends them in
    // binary): the client's values in both stages, typed as in the whole statement, whichever
    // stage uses them.
    let sql = "SELECT n, count(*) FROM names WHERE name LIKE $1 GROUP BY n HAVING count(*) > $2 ORDER BY n NULLS FIRST";
    let got: Vec<String> = client
        .query(sql, &[&"stg-%", &3i64])
        .await
        .expect("parameters in both stages")
        .iter()
        .map(|r| {
            let n: Option<i32> = r.get(0);
            let c: i64 = r.get(1);
            format!("{}|{c}", n.map(|n| n.to_string()).unwrap_or_default())
        })
        .collect();
    let direct = sql
        .replace("FROM names", &one_postgres)
        .replace("$1", "'stg-%'")
        .replace("$2", "3");
    assert_eq!(got, env.on_shard(0, &direct).lines().collect::<Vec<_>>());
    let sql = "SELECT count(*) FROM (SELECT n, count(*) AS c FROM names WHERE name LIKE $1 GROUP BY n) s WHERE s.c > $2";
    let got: i64 = client
        .query_one(sql, &[&"stg-%", &4i64])
        .await
        .expect("a parameter in each stage")
        .get(0);
    let direct = sql
        .replace("FROM names", &one_postgres)
        .replace("$1", "'stg-%'")
        .replace("$2", "4");
    assert_eq!(got.to_string(), env.on_shard(0, &direct));
    // Postgres's errors come through, from either stage, and the session goes on.
    let err = client
        .query(
            "SELECT n, rank() OVER (ORDER BY n) FROM names WHERE name LIKE 'stg-%' AND n / $1 > 0",
            &[&0i32],
        )
        .await
        .expect_err("division by zero on the shards");
    assert_eq!(sqlstate(&err), "22012");
    let err = client
        .query(
            "SELECT n, 10 / (count(*) - $1) FROM names WHERE name LIKE 'stg-%' GROUP BY n HAVING count(*) > 0",
            &[&(data.iter().filter(|(_, n)| n.is_none()).count() as i64)],
        )
        .await
        .expect_err("division by zero in the second stage");
    assert_eq!(sqlstate(&err), "22012");
    assert_eq!(
        rows(&client.simple_query("SELECT 1").await.expect("usable")),
        [["1"]]
    );

    // Inside a transaction: the first stage sees the transaction's own rows.
    client.batch_execute("BEGIN").await.expect("begin");
    client
        .execute("INSERT INTO names (name, n) VALUES ('stg-new', 4)", &[])
        .await
        .expect("insert in transaction");
    let got = lines(
        &client,
        "SELECT count(*), max(c) FROM (SELECT n, count(*) AS c FROM names WHERE name LIKE 'stg-%' GROUP BY n) s",
    )
    .await;
    client.batch_execute("ROLLBACK").await.expect("rollback");
    let want = env.on_shard(
        0,
        &format!(
            "SELECT count(*), max(c) FROM (SELECT n, count(*) AS c FROM (SELECT * {one_postgres} UNION ALL SELECT 'stg-new', 4) names GROUP BY n) s"
        ),
    );
    assert_eq!(got, want.lines().collect::<Vec<_>>());
}

/// Values cross between the stages in binary, exactly, whatever the session prints: floats
/// rounded by `extra_float_digits`, dates in a day-first style, times in a zone whose
/// abbreviation means another elsewhere, bit strings without a length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_cross_exactly_whatever_the_settings() {
    let env = shared_env();
    let client = env.router.connect().await;
    for i in 0..12 {
        client
            .execute(
                "INSERT INTO names (name, n) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&format!("flt-{i:02}"), &(i * 7 + 1)],
            )
            .await
            .expect("insert");
    }
    let rows_here = "FROM names WHERE name LIKE 'flt-%'";
    let rows_there = "FROM generate_series(0, 11) AS i, LATERAL (SELECT i * 7 + 1 AS n) names";
    let settings = [
        "",
        "SET extra_float_digits = 0; SET DateStyle = 'SQL, DMY'; SET TimeZone = 'Asia/Kolkata'; SET IntervalStyle = 'sql_standard'; ",
    ];
    for set in settings {
        for one in set.split_terminator("; ") {
            client.batch_execute(one).await.expect("a setting");
        }
        for sql in [
            "SELECT x, sum(x) OVER (ORDER BY x) FROM (SELECT n / 3.0::float8 AS x FROM names WHERE name LIKE 'flt-%') s ORDER BY x",
            "SELECT t, d, lag(t) OVER (ORDER BY t), t - lag(t) OVER (ORDER BY t) FROM (SELECT timestamptz '1890-01-01 12:00+00' + n * interval '1 day 7 hours' AS t, date '0003-01-02' + n AS d FROM names WHERE name LIKE 'flt-%') s ORDER BY t",
            "SELECT b, count(*) OVER (PARTITION BY b) FROM (SELECT n::bit(8) & 255::bit(8) AS b FROM names WHERE name LIKE 'flt-%') s ORDER BY b",
        ] {
            let got = lines(&client, sql).await;
            let want = env.on_shard(0, &format!("{set}{}", sql.replace(rows_here, rows_there)));
            assert_eq!(got, want.lines().collect::<Vec<_>>(), "{set}{sql}");
        }
    }
}

/// The first stage's rows are held in the router: `limits.max_merge_bytes` bounds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_stage_is_bounded() {
    let env = shared_env();
    let router = common::Router::start_with(&env.map, "[limits]\nmax_merge_bytes = 2048\n");
    let client = router.connect().await;
    for i in 0..100 {
        client
            .execute(
                "INSERT INTO names (name, n) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&format!("big-{i:03}-{}", "x".repeat(40)), &i],
            )
            .await
            .expect("insert");
    }
    let err = client
        .simple_query(
            "SELECT name, row_number() OVER (ORDER BY name) FROM names WHERE name LIKE 'big-%'",
        )
        .await
        .expect_err("too many rows for the first stage");
    assert_eq!(sqlstate(&err), "54000");
    assert!(message(&err).contains("max_merge_bytes"), "{err}");
    let got = lines(
        &client,
        "SELECT count(*), row_number() OVER () FROM names WHERE name LIKE 'big-00%'",
    )
    .await;
    assert_eq!(got, ["10|1"]);
}
