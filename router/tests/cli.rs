//! The shard-map commands of the `shardgate` binary, run as a person or a script would.

mod common;

use std::process::Command;

use common::{run, shardgate_bin};
use shardmap::{Key, KeyRange};

/// A directory for one test's files, removed when the test ends (also when it fails).
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(test: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("shardgate-cli-test-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    fn file(&self, name: &str, text: &str) -> std::path::PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn shardgate(args: &[&str]) -> (bool, String, String) {
    run(Command::new(shardgate_bin()).args(args))
}

#[test]
fn split_check_locate_and_predicate() {
    let tmp = TempDir::new("split");
    let (ok, map_text, err) = shardgate(&[
        "shardmap",
        "split",
        "--shards",
        "3",
        "--primary",
        "postgres://10.0.0.1:5432/shard_{index:3}",
        "--primary",
        "postgres://10.0.0.2:5432/shard_{index:3}",
        "--table",
        "kv:id:bigint",
        "--table",
        "app.users:user_id:uuid",
    ]);
    assert!(ok, "{err}");
    let map = shardmap::parse(&map_text, "split output").expect("split prints a valid map");
    assert_eq!(map.shards().len(), 3);
    assert_eq!(map.shards()[1].primary.host, "10.0.0.2");
    assert_eq!(map.shards()[2].primary.database, "shard_002");
    let file = tmp.file("map.toml", &map_text);
    let file_s = file.to_str().expect("utf-8 path");

    let (ok, out, _) = shardgate(&["shardmap", "check", file_s]);
    assert!(ok);
    assert!(
        out.contains("ok: version 1, 3 shards, 2 sharded tables"),
        "{out}"
    );

    let (ok, out, err) = shardgate(&["locate", "--shardmap", file_s, "--table", "kv", "42", "-7"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2);
    for (line, key) in lines.iter().zip([42i64, -7]) {
        let id = Key::Int(key).keyspace_id();
        let range = &map.shards()[map.shard_for(id)].range;
        assert_eq!(*line, format!("{id} {range}"));
        assert_eq!(line.split(' ').next().map(str::len), Some(16));
    }
    let (ok, out, err) = shardgate(&[
        "locate",
        "--shardmap",
        file_s,
        "--table",
        "users",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1);

    let (ok, out, _) = shardgate(&[
        "shardmap",
        "predicate",
        "--shardmap",
        file_s,
        "--table",
        "kv",
    ]);
    assert!(ok);
    assert_eq!(out.lines().count(), 3);
    assert!(
        out.lines().all(|l| l.contains("hashint8extended(id, 0)")),
        "{out}"
    );
    let range = map.shards()[0].range.to_string();
    let (ok, out, _) = shardgate(&[
        "shardmap",
        "predicate",
        "--shardmap",
        file_s,
        "--table",
        "kv",
        &range,
    ]);
    assert!(ok);
    assert_eq!(
        out.trim(),
        shardmap::predicate::predicate(&map.tables()[0], &map.shards()[0].range)
    );

    // Splitting one shard bumps the version and keeps the map valid.
    let (ok, out, err) = shardgate(&[
        "shardmap",
        "split",
        "--shardmap",
        file_s,
        "--range",
        &range,
        "--high-primary",
        "postgres://10.0.0.3:5432/shard_new",
    ]);
    assert!(ok, "{err}");
    let split = shardmap::parse(&out, "split shard output").expect("valid");
    assert_eq!(split.version(), 2);
    assert_eq!(split.shards().len(), 4);
    let (low, high) = KeyRange::parse(&range)
        .expect("range")
        .halves()
        .expect("halves");
    assert_eq!(split.shards()[0].range, low);
    assert_eq!(split.shards()[1].range, high);
}

#[test]
fn bad_input_gets_a_clear_error() {
    let tmp = TempDir::new("bad-input");
    let bad = tmp.file(
        "bad.toml",
        "version = 1\n[[shards]]\nrange = \"-8\"\nprimary = \"postgres://h/a\"\n",
    );
    let (ok, _, err) = shardgate(&["shardmap", "check", bad.to_str().expect("path")]);
    assert!(!ok);
    assert!(
        err.contains("bad.toml:3:") && err.contains("odd number of hex digits"),
        "{err}"
    );

    let good = tmp.file("good.toml", "version = 1\n[[tables]]\nname = \"kv\"\nkey = \"id\"\ntype = \"bigint\"\n[[shards]]\nrange = \"-\"\nprimary = \"postgres://h/a\"\n");
    let g = good.to_str().expect("path");
    let (ok, _, err) = shardgate(&["locate", "--shardmap", g, "--table", "kv", "abc"]);
    assert!(!ok);
    assert!(err.contains("not a bigint"), "{err}");
    let (ok, _, err) = shardgate(&["locate", "--shardmap", g, "--table", "nope", "1"]);
    assert!(!ok);
    assert!(
        err.contains("no sharded table \"nope\"") && err.contains("kv"),
        "{err}"
    );
    let (ok, _, err) = shardgate(&[
        "shardmap",
        "split",
        "--shards",
        "0",
        "--primary",
        "postgres://h/{index}",
    ]);
    assert!(!ok);
    assert!(err.contains("1 to 4096"), "{err}");
    let (ok, _, err) = shardgate(&[
        "shardmap",
        "split",
        "--shards",
        "2",
        "--primary",
        "postgres://h/{shard}",
    ]);
    assert!(!ok);
    assert!(err.contains("{shard}"), "{err}");
    let (ok, _, err) = shardgate(&["--config", "/nonexistent/router.toml"]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/router.toml"), "{err}");
}

/// `shardgate explain` prints where a statement goes, from the config and its shard map alone.
#[test]
fn explain_without_a_network() {
    let tmp = TempDir::new("explain");
    let (ok, map_text, err) = shardgate(&[
        "shardmap",
        "split",
        "--shards",
        "4",
        "--primary",
        "postgres://10.9.9.9:5432/s{index}",
    ]);
    assert!(ok, "{err}");
    let map = shardmap::parse(&map_text, "split output").expect("a valid map");
    let map_file = tmp.file("explain-map.toml", &map_text);
    let config = tmp.file(
        "explain-router.toml",
        &format!(
            "shardmap = \"{}\"\ndatabase = \"app\"\nauth = \"trust\"\n",
            map_file.display()
        ),
    );
    let config = config.to_str().expect("utf-8 path");
    let (ok, out, err) = shardgate(&[
        "explain",
        "--config",
        config,
        "SELECT * FROM kv WHERE id = 42",
    ]);
    assert!(ok, "{err}");
    let shard = &map.shards()[map.shard_for_key(&Key::Int(42))];
    let id = Key::Int(42).keyspace_id();
    assert!(
        out.contains(&format!(
            "shard {}: kv.id = 42, keyspace id {id}",
            shard.range
        )),
        "{out}"
    );
    assert!(out.contains(&shard.primary.endpoint()), "{out}");
    let (ok, out, _) = shardgate(&[
        "explain",
        "--config",
        config,
        "EXPLAIN (ROUTE) SELECT count(*) FROM kv",
    ]);
    assert!(ok);
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("10.9.9.9:5432/s"))
            .count(),
        4,
        "{out}"
    );
    let (ok, _, err) = shardgate(&[
        "explain",
        "--config",
        "/nonexistent/router.toml",
        "SELECT 1",
    ]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/router.toml"), "{err}");
}
