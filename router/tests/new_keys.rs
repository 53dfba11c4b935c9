//! INSERTs that leave out the sharding key of a table whose key comes from a sequence (serial,
//! identity): the router gives each row a key unique across the fleet, puts the row on the
//! shard of its key, and answers RETURNING as Postgres would; in both protocols, in
//! transactions, across two routers and a router restart.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{sqlstate, Router};
use shardmap::{Key, KeyType, ShardMap, Table};

const SCHEMA: &str = "
CREATE TABLE accounts (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL);
CREATE TABLE notes (id bigserial PRIMARY KEY, body text, n int DEFAULT 7);
CREATE TABLE plain (id bigint PRIMARY KEY, v text);
";

struct Fleet {
    cluster: pgharness::Cluster,
    map: ShardMap,
}

impl Fleet {
    fn start(shards: usize) -> Fleet {
        let cluster = pgharness::Cluster::start(&pgharness::ClusterOptions {
            shards,
            servers: 2,
            schema_sql: Some(pgharness::Schema::Sql(SCHEMA.into())),
            ..Default::default()
        })
        .expect("start the shard cluster");
        let tables = vec![
            Table::new("accounts", "id", KeyType::BigInt),
            Table::new("notes", "id", KeyType::BigInt),
            Table::new("plain", "id", KeyType::BigInt),
        ];
        let map = ShardMap::even_split(&cluster.shard_urls(), tables).expect("shard map");
        Fleet { cluster, map }
    }

    fn shard_of(&self, id: i64) -> usize {
        self.map.shard_for_key(&Key::Int(id))
    }

    /// `table`'s ids on each shard, read there directly.
    fn ids_by_shard(&self, table: &str) -> Vec<Vec<i64>> {
        (0..self.map.shards().len())
            .map(|s| {
                let out = self
                    .cluster
                    .psql_shard(s, &format!("SELECT id FROM {table} ORDER BY id"))
                    .expect("read a shard");
                out.lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| l.trim().parse().expect("an id"))
                    .collect()
            })
            .collect()
    }

    /// Every id of `table` is on the shard it maps to, and no id is on two shards.
    fn placed_once(&self, table: &str) -> HashSet<i64> {
        let mut all = HashSet::new();
        for (shard, ids) in self.ids_by_shard(table).into_iter().enumerate() {
            for id in ids {
                assert_eq!(
                    self.shard_of(id),
                    shard,
                    "{table} id {id} is on the wrong shard"
                );
                assert!(all.insert(id), "{table} id {id} is on two shards");
            }
        }
        all
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_without_keys_get_keys_of_the_router_on_their_shard() {
    let fleet = Fleet::start(4);
    // A row written before the router gave any key: its keys start above it.
    fleet
        .cluster
        .psql_shard(
            fleet.shard_of(5000),
            "INSERT INTO notes (id, body) VALUES (5000, 'old')",
        )
        .expect("an older row");
    let router = Router::start(&fleet.map, 4);
    let c = router.connect().await;

    // Simple protocol, one row, RETURNING.
    let rows = c
        .simple_query("INSERT INTO notes (body) VALUES ('a') RETURNING id, body, n")
        .await
        .expect("insert without its key");
    let got = common::rows(&rows);
    let first: i64 = got[0][0].parse().expect("an id");
    assert!(first > 5000, "{first}");
    assert_eq!(&got[0][1..], ["a", "7"]);

    // Extended protocol, several rows at once: one key each, all on one shard, in VALUES order.
    let rows = c
        .query(
            "INSERT INTO notes (body) VALUES ($1), ($2), ($3) RETURNING id, body",
            &[&"x", &"y", &"z"],
        )
        .await
        .expect("a multi-row insert without keys");
    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    let bodies: Vec<String> = rows.iter().map(|r| r.get(1)).collect();
    assert_eq!(bodies, ["x", "y", "z"]);
    let shards: HashSet<usize> = ids.iter().map(|&i| fleet.shard_of(i)).collect();
    assert_eq!(shards.len(), 1, "{ids:?}");

    // A prepared statement, executed many times: keys differ, rows are found by them.
    let insert = c
        .prepare("INSERT INTO notes (body) VALUES ($1) RETURNING id")
        .await
        .expect("prepare");
    let mut seen = HashSet::new();
    for i in 0..50 {
        let id: i64 = c
            .query_one(&insert, &[&format!("p{i}")])
            .await
            .expect("execute")
            .get(0);
        assert!(seen.insert(id));
        let body: String = c
            .query_one("SELECT body FROM notes WHERE id = $1", &[&id])
            .await
            .expect("found by its key")
            .get(0);
        assert_eq!(body, format!("p{i}"));
    }
    // The client's own unnamed statement still runs as written after the router's.
    let n: i64 = c
        .query_one("SELECT count(*) FROM notes WHERE id = $1", &[&first])
        .await
        .expect("count")
        .get(0);
    assert_eq!(n, 1);

    // GENERATED ALWAYS: the router's keys are taken; a key of the client's is refused as
    // Postgres refuses it.
    let row = c
        .query_one(
            "INSERT INTO accounts (name) VALUES ($1) RETURNING id",
            &[&"ann"],
        )
        .await
        .expect("identity always");
    let ann: i64 = row.get(0);
    let err = c
        .execute("INSERT INTO accounts (id, name) VALUES (1, 'bob')", &[])
        .await
        .expect_err("a key of the client's for GENERATED ALWAYS");
    assert_eq!(sqlstate(&err), "428C9");

    // In a transaction the keys are of the transaction's shard, and it stays there.
    let mut c = c;
    let tx = c.transaction().await.expect("begin");
    tx.execute("UPDATE accounts SET name = 'ann2' WHERE id = $1", &[&ann])
        .await
        .expect("pin the transaction");
    for _ in 0..20 {
        let id: i64 = tx
            .query_one("INSERT INTO accounts (name) VALUES ('t') RETURNING id", &[])
            .await
            .expect("insert in the transaction")
            .get(0);
        assert_eq!(fleet.shard_of(id), fleet.shard_of(ann));
    }
    tx.commit().await.expect("commit");

    // A table whose key has no sequence still needs its key.
    let err = c
        .batch_execute("INSERT INTO plain (v) VALUES ('a')")
        .await
        .expect_err("no key, no sequence");
    assert_eq!(sqlstate(&err), "0A000");
    let message = err.as_db_error().map(|e| e.message().to_string());
    assert!(
        message.as_deref().is_some_and(|m| m.contains("sequence")),
        "{message:?}"
    );

    // EXPLAIN (ROUTE) says what the router does.
    let plan = c
        .simple_query("EXPLAIN (ROUTE) INSERT INTO notes (body) VALUES ('e')")
        .await
        .expect("explain");
    let text = common::rows(&plan).concat().join(" ");
    assert!(text.contains("router gives"), "{text}");

    // Pinned to a shard by hand: keys of that shard.
    for shard in fleet.map.shards() {
        let rows = c
            .simple_query(&format!(
                "/* shard: {} */ INSERT INTO notes (body) VALUES ('pinned') RETURNING id",
                shard.range
            ))
            .await
            .expect("a pinned insert without its key");
        let id: i64 = common::rows(&rows)[0][0].parse().expect("an id");
        assert_eq!(fleet.map.shards()[fleet.shard_of(id)].range, shard.range);
    }

    let notes = fleet.placed_once("notes");
    assert_eq!(notes.len(), 1 + 1 + 3 + 50 + 4);
    assert_eq!(fleet.placed_once("accounts").len(), 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routers_and_a_restart_never_repeat_a_key() {
    let fleet = Fleet::start(4);
    let extra = "[pool]\nmax_size = 4\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n";
    let a = Router::start_with(&fleet.map, extra);
    let b_port = common::free_port();
    let b = Router::start_at(&fleet.map, extra, 2, b_port);
    let urls = [a.url(), b.url()];
    const CLIENTS: usize = 8;
    const INSERTS: usize = 20_000;
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let url = urls[c % 2].clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked: HashMap<i64, String> = HashMap::new();
            let mut failed = 0usize;
            let mut client = None;
            let mut i = 0;
            while i < INSERTS / CLIENTS {
                let conn = match client.take() {
                    Some(conn) => conn,
                    None => match common::connect(&url).await {
                        Ok(conn) => conn,
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            failed += 1;
                            assert!(failed < 400, "client {c} could not get back in");
                            continue;
                        }
                    },
                };
                let body = format!("c{c}-{i}");
                let sent = if i % 2 == 0 {
                    conn.query_one(
                        "INSERT INTO notes (body) VALUES ($1) RETURNING id",
                        &[&body],
                    )
                    .await
                    .map(|r| r.get::<_, i64>(0))
                } else {
                    let sql = format!("INSERT INTO notes (body) VALUES ('{body}') RETURNING id");
                    match conn.simple_query(&sql).await {
                        Ok(m) => Ok(common::rows(&m)[0][0].parse().expect("an id")),
                        Err(e) => Err(e),
                    }
                };
                match sent {
                    Ok(id) => {
                        assert!(acked.insert(id, body).is_none(), "id {id} given twice");
                        client = Some(conn);
                        i += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    // The router went away under it: log in again (the row may or may not be in).
                    Err(_) => failed += 1,
                }
            }
            acked
        }));
    }
    // Router b is killed and started again on its port in the middle.
    while done.load(Ordering::Relaxed) < INSERTS / 3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    b.signal(libc::SIGKILL);
    b.wait_exit(Duration::from_secs(10)).expect("router b gone");
    let b2 = Router::start_at(&fleet.map, extra, 2, b_port);
    let mut acked = HashMap::new();
    for t in tasks {
        for (id, body) in t.await.expect("client task") {
            assert!(
                acked.insert(id, body).is_none(),
                "id {id} given to two clients"
            );
        }
    }
    assert_eq!(acked.len(), INSERTS);
    let stored = fleet.placed_once("notes");
    assert!(
        acked.keys().all(|id| stored.contains(id)),
        "an acknowledged row is missing"
    );
    // Every row holds the body its RETURNING was for.
    let client = b2.connect().await;
    for (id, body) in acked.iter().take(200) {
        let got: String = client
            .query_one("SELECT body FROM notes WHERE id = $1", &[id])
            .await
            .expect("a row by its key")
            .get(0);
        assert_eq!(&got, body);
    }
    // Both routers reserved from the one row of next keys on the default shard.
    let next = fleet
        .cluster
        .psql_shard(
            fleet.map.default_shard(),
            "SELECT next FROM shardgate.key_blocks WHERE name = 'notes'",
        )
        .expect("key_blocks");
    let next: i64 = next.trim().parse().expect("next");
    assert!(acked.keys().all(|&id| id < next));
    drop(a);
}
