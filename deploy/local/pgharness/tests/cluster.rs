//! Integration tests of throw-away clusters.

use pgharness::{Cluster, ClusterOptions, Schema};

#[test]
fn cluster_has_schema_on_every_shard() {
    let cluster = Cluster::start(&ClusterOptions {
        shards: 3,
        servers: 2,
        schema_sql: Some(Schema::Sql(
            "CREATE TABLE kv (id bigint PRIMARY KEY, v text NOT NULL);".into(),
        )),
        ..Default::default()
    })
    .expect("start cluster");
    assert_eq!(cluster.servers().len(), 2);
    let names: Vec<&str> = cluster
        .shards()
        .iter()
        .map(|s| s.database.as_str())
        .collect();
    assert_eq!(names, ["shard_000", "shard_001", "shard_002"]);
    assert_eq!(
        cluster
            .shards()
            .iter()
            .map(|s| s.server)
            .collect::<Vec<_>>(),
        [0, 1, 0]
    );
    for (i, shard) in cluster.shards().iter().enumerate() {
        let server = &cluster.servers()[shard.server];
        assert_eq!(
            shard.url,
            format!(
                "postgres://postgres:postgres@127.0.0.1:{}/{}",
                server.port(),
                shard.database
            )
        );
        assert_eq!(
            cluster
                .psql_shard(i, "SELECT count(*) FROM kv")
                .expect("query kv"),
            "0"
        );
        assert_eq!(
            server
                .psql(&shard.database, "SELECT current_database()")
                .expect("query"),
            shard.database
        );
    }
    // Each server holds exactly its own shards (and the scratch schema database is gone).
    let on_first = cluster.servers()[0]
        .psql("postgres", "SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database WHERE datname LIKE 'shard%'")
        .expect("list databases");
    assert_eq!(on_first, "shard_000,shard_002");
}

#[test]
fn bad_schema_fails_and_cleans_up() {
    let err = Cluster::start(&ClusterOptions {
        shards: 2,
        servers: 1,
        schema_sql: Some(Schema::Sql("CREATE TABLE broken (;".into())),
        ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("applying the schema"), "{err}");
}

#[test]
fn database_names_fit_the_shard_count() {
    assert_eq!(pgharness::shard_database_names("s_", 2), ["s_000", "s_001"]);
    assert_eq!(
        pgharness::shard_database_names("s_", 1001)
            .last()
            .map(String::as_str),
        Some("s_1000")
    );
}
