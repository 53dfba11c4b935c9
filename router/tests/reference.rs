//! Reference tables (`reference = true` in the shard map): whole on every shard. DDL and writes
//! go to every shard, all or nothing, answered once; reads go to one shard; joins with sharded
//! tables run where the sharded rows are; what would differ per shard is refused. Checked on
//! every shard directly, not only through the router.

mod common;

use common::{rows, sqlstate, Env, Router};
use shardmap::{Reference, ShardMap};
use tokio_postgres::Client;

struct Fixture {
    env: Env,
    router: Router,
}

impl Fixture {
    fn start() -> Fixture {
        let env = Env::start(4, 2, 4);
        let map: ShardMap = env
            .map
            .clone()
            .with_references(vec![Reference::new("regions"), Reference::new("plans")])
            .expect("a map with a reference table");
        let router = Router::start(&map, 4);
        Fixture { env, router }
    }

    /// `sql` on every shard directly, one answer per shard.
    fn everywhere(&self, sql: &str) -> Vec<String> {
        (0..self.env.map.shards().len())
            .map(|s| self.env.on_shard(s, sql).trim().to_string())
            .collect()
    }

    /// The regions rows on every shard must be these.
    fn assert_regions(&self, want: &str) {
        for (shard, got) in self
            .everywhere("SELECT string_agg(code || '=' || name, ',' ORDER BY code) FROM regions")
            .into_iter()
            .enumerate()
        {
            assert_eq!(got, want, "regions on shard {shard}");
        }
    }
}

async fn simple(client: &Client, sql: &str) -> Vec<Vec<String>> {
    rows(
        &client
            .simple_query(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}")),
    )
}

async fn refused(client: &Client, sql: &str) -> (String, String) {
    let err = client
        .simple_query(sql)
        .await
        .expect_err(&format!("{sql} should fail"));
    let message = err
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    (sqlstate(&err), message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_tables_are_whole_on_every_shard_and_answer_once() {
    let f = Fixture::start();
    let c = f.router.connect().await;

    // DDL runs on every shard.
    c.batch_execute("CREATE TABLE regions (code text PRIMARY KEY, name text NOT NULL)")
        .await
        .expect("create through the router");
    assert!(f
        .everywhere("SELECT to_regclass('regions') IS NOT NULL")
        .iter()
        .all(|t| t == "t"));

    // A write runs on every shard and answers once: one tag, one set of RETURNING rows.
    let msgs = c
        .simple_query("INSERT INTO regions VALUES ('new', 'North'), ('paid', 'South'), ('x', 'X') RETURNING code")
        .await
        .expect("insert");
    assert_eq!(rows(&msgs).len(), 3, "RETURNING rows of one shard");
    assert!(msgs
        .iter()
        .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::CommandComplete(3))));
    // The extended protocol, with parameters.
    let n = c
        .execute(
            "UPDATE regions SET name = $1 WHERE code = $2",
            &[&"Nord", &"new"],
        )
        .await
        .expect("update with parameters");
    assert_eq!(n, 1, "the row count of one shard, not of four");
    let n = c
        .execute("INSERT INTO regions VALUES ($1, $2) ON CONFLICT (code) DO UPDATE SET name = excluded.name", &[&"x", &"Ex"])
        .await
        .expect("upsert");
    assert_eq!(n, 1);
    f.assert_regions("new=Nord,paid=South,x=Ex");

    // EXPLAIN (ROUTE) says where it would go.
    let route = simple(&c, "EXPLAIN (ROUTE) INSERT INTO regions VALUES ('q', 'Q')").await;
    assert!(
        route
            .iter()
            .flatten()
            .any(|l| l.contains("a write of a reference table")),
        "{route:?}"
    );
    // Reads go to one shard.
    assert_eq!(
        simple(&c, "SELECT count(*) FROM regions").await,
        vec![vec!["3"]]
    );

    // Joins with a sharded table: by key on its shard, without a key on every shard, merged.
    let (k1, k2) = (f.env.key_on(0, 1), f.env.key_on(3, 1));
    c.batch_execute(&format!(
        "INSERT INTO kv VALUES ({k1}, 'new'), ({k2}, 'paid'), ({}, 'new'), ({}, 'nowhere')",
        f.env.key_on(1, 1),
        f.env.key_on(2, 1)
    ))
    .await
    .expect("kv rows on four shards");
    assert_eq!(
        simple(
            &c,
            &format!("SELECT r.name FROM kv JOIN regions r ON r.code = kv.v WHERE kv.id = {k2}")
        )
        .await,
        vec![vec!["South"]]
    );
    assert_eq!(
        simple(&c, "SELECT r.name, count(*) FROM kv JOIN regions r ON r.code = kv.v GROUP BY r.name ORDER BY 1").await,
        vec![vec!["Nord", "2"], vec!["South", "1"]]
    );
    assert_eq!(
        simple(
            &c,
            "SELECT count(*), count(r.code) FROM kv LEFT JOIN regions r ON r.code = kv.v"
        )
        .await,
        vec![vec!["4", "3"]]
    );
    // Rows every shard has, kept by an outer join or read under a sharded subquery: refused.
    for sql in [
        "SELECT r.code, kv.id FROM regions r LEFT JOIN kv ON kv.v = r.code",
        "SELECT code FROM regions WHERE code IN (SELECT v FROM kv)",
        "SELECT 1 WHERE EXISTS (SELECT 1 FROM kv)",
    ] {
        assert_eq!(refused(&c, sql).await.0, "0A000", "{sql}");
    }

    // What would differ per shard is refused before it runs.
    // A date read when each shard runs it, as a literal or as a parameter.
    let (code, message) = refused(
        &c,
        "INSERT INTO regions VALUES ('t', 'now'::timestamptz::text)",
    )
    .await;
    assert!(code == "0A000" && message.contains("'now'"), "{message}");
    let err = c
        .execute(
            "INSERT INTO regions VALUES ('t', $1::text::timestamptz::text)",
            &[&"today"],
        )
        .await
        .expect_err("a parameter 'today' is refused");
    assert_eq!(sqlstate(&err), "0A000", "{err:?}");
    for sql in [
        "INSERT INTO regions VALUES ('t', now()::text)",
        "INSERT INTO regions SELECT v, 'from kv' FROM kv",
    ] {
        let (code, message) = refused(&c, sql).await;
        assert_eq!(code, "0A000", "{sql}: {message}");
        assert!(
            message.contains("reference table regions"),
            "{sql}: {message}"
        );
    }
    f.assert_regions("new=Nord,paid=South,x=Ex");

    c.batch_execute("DROP TABLE regions")
        .await
        .expect("drop through the router");
    assert!(f
        .everywhere("SELECT to_regclass('regions') IS NULL")
        .iter()
        .all(|t| t == "t"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_fails_or_differs_on_one_shard_changes_no_shard() {
    let f = Fixture::start();
    let c = f.router.connect().await;
    c.batch_execute("CREATE TABLE regions (code text PRIMARY KEY, name text NOT NULL)")
        .await
        .expect("create");
    c.batch_execute("INSERT INTO regions VALUES ('a', 'A')")
        .await
        .expect("insert");

    // Shard 2's copy gains a row behind the router's back.
    f.env
        .on_shard(2, "INSERT INTO regions VALUES ('zz', 'only here')");
    // The insert fails there (a duplicate key): no shard keeps it.
    let (code, _) = refused(&c, "INSERT INTO regions VALUES ('zz', 'new')").await;
    assert_eq!(code, "23505");
    assert_eq!(
        f.everywhere("SELECT count(*) FROM regions WHERE code = 'zz'"),
        vec!["0", "0", "1", "0"]
    );
    // An update that changes a different number of rows on one shard: the copies differ, so
    // nothing is applied and the client is told.
    let (code, message) = refused(&c, "UPDATE regions SET name = 'changed'").await;
    assert_eq!(code, "XX000", "{message}");
    assert!(
        message.contains("copies of this reference table differ"),
        "{message}"
    );
    assert_eq!(
        f.everywhere("SELECT count(*) FROM regions WHERE name = 'changed'"),
        vec!["0", "0", "0", "0"]
    );
    f.env.on_shard(2, "DELETE FROM regions WHERE code = 'zz'");

    // Inside a transaction: every shard joins it, and a rollback leaves nothing.
    for sql in ["BEGIN", "INSERT INTO regions VALUES ('b', 'B')", "ROLLBACK"] {
        c.batch_execute(sql).await.expect(sql);
    }
    f.assert_regions("a=A");
    let k = f.env.key_on(1, 100);
    c.batch_execute("BEGIN").await.expect("begin");
    c.batch_execute("INSERT INTO regions VALUES ('b', 'B')")
        .await
        .expect("in tx");
    c.batch_execute(&format!("INSERT INTO kv VALUES ({k}, 'b')"))
        .await
        .expect("kv in tx");
    assert_eq!(
        simple(
            &c,
            &format!("SELECT r.name FROM kv JOIN regions r ON r.code = kv.v WHERE kv.id = {k}")
        )
        .await,
        vec![vec!["B"]],
        "the transaction sees its own write on the key's shard"
    );
    c.batch_execute("COMMIT").await.expect("commit");
    f.assert_regions("a=A,b=B");
    c.batch_execute("DROP TABLE regions").await.expect("drop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_whose_default_differs_per_shard_must_be_given() {
    let f = Fixture::start();
    let c = f.router.connect().await;
    c.batch_execute(
        "CREATE TABLE plans (id serial PRIMARY KEY, name text NOT NULL, \
         created timestamptz DEFAULT now(), tier int DEFAULT 1)",
    )
    .await
    .expect("create through the router");
    // Each shard's sequence and clock would give its own id and time.
    for (sql, column) in [
        ("INSERT INTO plans (name) VALUES ('basic')", "id"),
        (
            "INSERT INTO plans (id, name) VALUES (1, 'basic')",
            "created",
        ),
        ("INSERT INTO plans VALUES (1, 'basic', DEFAULT)", "created"),
    ] {
        let (code, message) = refused(&c, sql).await;
        assert_eq!(code, "0A000", "{sql}: {message}");
        assert!(
            message.contains(&format!("its column {column}")),
            "{sql}: {message}"
        );
    }
    // Given, they are the same everywhere; an immutable default (tier) is fine.
    c.batch_execute(
        "INSERT INTO plans (id, name, created) VALUES (1, 'basic', '2026-12-03 10:00+00')",
    )
    .await
    .expect("insert with the values given");
    for (shard, got) in f
        .everywhere("SELECT id || ',' || name || ',' || created || ',' || tier FROM plans")
        .into_iter()
        .enumerate()
    {
        assert_eq!(
            got, "1,basic,2026-12-03 10:00:00+00,1",
            "plans on shard {shard}"
        );
    }
}

/// COPY FROM STDIN into a reference table: every row reaches every shard, each in a
/// transaction of its own, and they commit together; a COPY that fails on one shard (a row
/// that only that shard already has, a column that does not exist) applies nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_into_a_reference_table_reaches_every_shard_or_none() {
    let f = Fixture::start();
    let c = f.router.connect().await;
    c.batch_execute("CREATE TABLE plans (code text PRIMARY KEY, price numeric)")
        .await
        .expect("create");
    let plans = |f: &Fixture| {
        f.everywhere(
            "SELECT coalesce(string_agg(code || '=' || price, ',' ORDER BY code), '') FROM plans",
        )
    };
    let dir = &f.router.dir;
    let csv = "code,price\nbasic,10\n\"pro, yearly\",99.5\n";
    std::fs::write(dir.join("plans.csv"), csv).expect("csv");
    let psql = |sql: &str| {
        common::run(
            std::process::Command::new(common::pg_program("psql"))
                .arg(f.router.url())
                .args(["-X", "-v", "ON_ERROR_STOP=1", "-c", sql]),
        )
    };
    let copy = format!(
        "\\copy plans FROM '{}' WITH (FORMAT csv, HEADER true)",
        dir.join("plans.csv").display()
    );
    let (ok, out, err) = psql(&copy);
    assert!(ok && out.contains("COPY 2"), "{out}\n{err}");
    assert!(
        plans(&f).iter().all(|p| p == "basic=10,pro, yearly=99.5"),
        "{:?}",
        plans(&f)
    );
    // The text format too, and a row count of one shard's.
    std::fs::write(dir.join("plans.txt"), "team\t250\n").expect("text");
    let (ok, out, err) = psql(&format!(
        "\\copy plans FROM '{}'",
        dir.join("plans.txt").display()
    ));
    assert!(ok && out.contains("COPY 1"), "{out}\n{err}");
    // A row that one shard already has (written there directly): that shard's 23505, and the
    // other shards' rows are rolled back with it.
    f.env.on_shard(2, "INSERT INTO plans VALUES ('gold', 1)");
    std::fs::write(dir.join("more.txt"), "silver\t5\ngold\t50\n").expect("text");
    let (ok, _, err) = psql(&format!(
        "\\copy plans FROM '{}'",
        dir.join("more.txt").display()
    ));
    assert!(!ok && err.contains("duplicate key"), "{err}");
    for (shard, got) in plans(&f).iter().enumerate() {
        assert!(!got.contains("silver"), "shard {shard}: {got}");
    }
    f.env.on_shard(2, "DELETE FROM plans WHERE code = 'gold'");
    // Refused at its start (no such column): Postgres's error, nothing anywhere.
    let (ok, _, err) = psql("\\copy plans (code, nope) FROM STDIN");
    assert!(!ok && err.contains("nope"), "{err}");
    assert!(
        plans(&f)
            .iter()
            .all(|p| p == "basic=10,pro, yearly=99.5,team=250"),
        "{:?}",
        plans(&f)
    );
    // No transaction is left open on any shard, and the router still answers.
    for got in f
        .everywhere("SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'")
    {
        assert_eq!(got, "0");
    }
    let (ok, out, err) = psql("SELECT count(*) FROM plans");
    assert!(ok && out.contains(" 3"), "{out}\n{err}");
}
