//! `cluster up --spare N`: every server runs with `wal_level = logical`, the spare servers answer
//! on their URLs with one empty database, `status` lists them, a later `up` starts a stopped one
//! again and adds more when asked, and `down` removes them. Real PostgreSQL servers, no router.

use std::path::PathBuf;

mod common;
use common::{cluster, free_ports, pid_alive, stdout, Dir};

/// Connects to `url` and runs `sql`, returning the first column of the first row as text.
async fn query_text(url: &str, sql: &str) -> String {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    let conn = tokio::spawn(conn);
    let row = client
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql} on {url}: {e}"));
    let value: String = row.get(0);
    drop(client);
    let _ = conn.await;
    value
}

fn read_state(dir: &Dir) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.path.join("cluster.json")).expect("cluster.json");
    serde_json::from_str(&text).expect("valid state file")
}

/// The spares recorded in the state file: (url, database, server directory, pid).
fn spares(state: &serde_json::Value) -> Vec<(String, String, PathBuf, u32)> {
    state["spares"]
        .as_array()
        .expect("spares in the state file")
        .iter()
        .map(|s| {
            (
                s["url"].as_str().expect("spare url").to_string(),
                s["database"].as_str().expect("spare database").to_string(),
                PathBuf::from(s["dir"].as_str().expect("spare dir")),
                s["pid"].as_u64().expect("spare pid") as u32,
            )
        })
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn spare_servers_are_empty_logical_and_go_with_the_cluster() {
    // Under the system temp dir: as root the `postgres` user must be able to reach the data.
    let dir = Dir {
        path: std::env::temp_dir().join(format!(
            "shardgate-cluster-cli-spares-test-{}",
            std::process::id()
        )),
        router: PathBuf::new(),
    };
    let _ = std::fs::remove_dir_all(&dir.path);
    let dir_arg = dir.path.to_str().expect("utf-8 temp dir").to_string();
    // One shard server, two spares, and room for a third spare added later.
    let base = free_ports(4);
    let base_arg = base.to_string();
    let up_args = |spare: &'static str| {
        vec![
            "up",
            "--shards",
            "2",
            "--servers",
            "1",
            "--spare",
            spare,
            "--no-router",
            "--dir",
            dir_arg.as_str(),
            "--base-port",
            base_arg.as_str(),
        ]
    };
    let up = cluster(&dir.router, &up_args("2"));
    assert!(up.status.success(), "up --spare 2 failed");

    let state = read_state(&dir);
    assert_eq!(state["server_settings"]["wal_level"], "logical");
    let spare_list = spares(&state);
    assert_eq!(spare_list.len(), 2);
    for (j, (url, database, _, _)) in spare_list.iter().enumerate() {
        assert_eq!(
            *url,
            format!(
                "postgres://postgres:postgres@127.0.0.1:{}/shard_00{}",
                base + 1 + j as u16,
                2 + j
            )
        );
        assert_eq!(*database, format!("shard_00{}", 2 + j));
        assert!(
            stdout(&up).contains(url.as_str()),
            "up does not print {url}"
        );
    }

    // A shard server can be the source of a logical replication split.
    let shard_url = state["shards"][0]["url"].as_str().expect("shard url");
    assert_eq!(query_text(shard_url, "SHOW wal_level").await, "logical");
    assert_eq!(query_text(shard_url, "SHOW max_wal_senders").await, "16");
    assert_eq!(
        query_text(shard_url, "SHOW max_replication_slots").await,
        "16"
    );
    // The spares answer on their URLs, with an empty database (no schema) of that name.
    for (url, database, _, _) in &spare_list {
        assert_eq!(
            query_text(url, "SELECT current_database()::text").await,
            *database
        );
        assert_eq!(query_text(url, "SHOW wal_level").await, "logical");
        let tables = "SELECT count(*)::text FROM pg_tables WHERE schemaname = 'public'";
        assert_eq!(query_text(url, tables).await, "0", "{url} is not empty");
    }
    let shardmap = std::fs::read_to_string(dir.path.join("shardmap.toml")).expect("shard map");
    assert!(!shardmap.contains(&format!(":{}/", base + 1)), "{shardmap}");

    let status = cluster(&dir.router, &["status", "--dir", &dir_arg]);
    assert!(status.status.success());
    let text = stdout(&status);
    for (url, _, _, _) in &spare_list {
        assert!(text.contains(url.as_str()), "status does not list {url}");
    }
    assert_eq!(
        text.lines()
            .filter(|l| l.trim_start().starts_with("spare") && l.contains("accepting connections"))
            .count(),
        2
    );

    // Spare 1 stops; `up` starts it again, and with --spare 3 adds spare 2 after it.
    let (url_1, _, dir_1, _) = &spare_list[1];
    pgharness::Server::attach(dir_1)
        .expect("spare 1's directory")
        .stop()
        .expect("stopping spare 1");
    let status = cluster(&dir.router, &["status", "--dir", &dir_arg]);
    assert!(
        !status.status.success(),
        "status must fail with a spare down"
    );
    let again = cluster(&dir.router, &up_args("3"));
    assert!(again.status.success(), "up --spare 3 failed");
    assert!(stdout(&again).contains("already up"));
    assert!(stdout(&again).contains("spare server 1 (port"));
    assert_eq!(query_text(url_1, "SHOW wal_level").await, "logical");
    let state = read_state(&dir);
    let spare_list = spares(&state);
    assert_eq!(spare_list.len(), 3);
    let (url_2, database_2, _, _) = &spare_list[2];
    assert_eq!(*database_2, "shard_004");
    let tables = "SELECT count(*)::text FROM pg_tables WHERE schemaname = 'public'";
    assert_eq!(query_text(url_2, tables).await, "0");

    let down = cluster(&dir.router, &["down", "--dir", &dir_arg]);
    assert!(down.status.success());
    assert_eq!(stdout(&down).matches("stopped spare server").count(), 3);
    for (j, (_, _, spare_dir, pid)) in spare_list.iter().enumerate() {
        assert!(!pid_alive(*pid), "spare {j} still runs after down");
        assert!(!spare_dir.exists(), "down leaves {}", spare_dir.display());
        assert!(pgharness::check_port_free(base + 1 + j as u16).is_ok());
    }
    assert!(!dir.path.join("cluster.json").exists());
}
