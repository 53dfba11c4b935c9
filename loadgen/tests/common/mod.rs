//! Shared pieces of loadgen's integration tests: real Postgres clusters (pgharness), the
//! loadgen binary, and a real `shardgate` router process (started by pgharness's launcher, as
//! the router's own tests and the cluster tool start it).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use shardmap::{KeyType, ShardMap, Table};

pub const SCHEMA: &str = "CREATE TABLE kv (id bigint PRIMARY KEY, v text NOT NULL);";
pub const USER: &str = "app";
pub const PASSWORD: &str = "app-secret";
pub const DATABASE: &str = "app";

/// A cluster, its shard map and the map's file.
pub struct Env {
    pub cluster: pgharness::Cluster,
    pub map: ShardMap,
    pub map_file: PathBuf,
    pub dir: PathBuf,
}

static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A scratch directory for this test process.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "loadgen-test-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

impl Env {
    pub fn start(shards: usize, servers: usize) -> Env {
        let cluster = pgharness::Cluster::start(&pgharness::ClusterOptions {
            shards,
            servers,
            schema_sql: Some(pgharness::Schema::Sql(SCHEMA.into())),
            ..Default::default()
        })
        .expect("start the shard cluster");
        let map = ShardMap::even_split(
            &cluster.shard_urls(),
            vec![Table::new("kv", "id", KeyType::BigInt)],
        )
        .expect("shard map");
        let dir = scratch("env");
        let map_file = dir.join("shardmap.toml");
        std::fs::write(&map_file, map.to_toml()).expect("write the shard map");
        Env {
            cluster,
            map,
            map_file,
            dir,
        }
    }

    /// psql in shard `shard`'s database, directly.
    pub fn on_shard(&self, shard: usize, sql: &str) -> String {
        self.cluster
            .psql_shard(shard, sql)
            .unwrap_or_else(|e| panic!("{sql} on shard {shard}: {e}"))
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `loadgen ARGS`, waited for.
pub fn loadgen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run loadgen {args:?}: {e}"))
}

/// Like [`loadgen`] but panics unless it succeeded; returns (stdout, stderr).
pub fn loadgen_ok(args: &[&str]) -> (String, String) {
    let out = loadgen(args);
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "loadgen {args:?} failed:\n{o}\n{e}");
    (o, e)
}

pub fn read_report(path: &Path) -> loadgen::report::Report {
    loadgen::report::Report::read(path).unwrap_or_else(|e| panic!("{e}"))
}

/// The shardgate binary, built fresh (a no-op when it is up to date: never a stale router).
pub fn shardgate_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root");
        pgharness::router::build(root, false).unwrap_or_else(|e| panic!("{e}"))
    })
    .clone()
}

/// A `shardgate` process in front of a cluster; killed on drop.
pub struct Router {
    pub port: u16,
    dir: PathBuf,
    process: pgharness::router::RouterProcess,
}

impl Router {
    pub fn start(map: &ShardMap) -> Router {
        let dir = scratch("router");
        let port = pgharness::free_port().expect("a free port");
        let config = pgharness::router::write_config(
            &dir,
            &map.to_toml(),
            port,
            DATABASE,
            (USER, PASSWORD),
            "",
            "[pool]\nmax_size = 8\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n",
        )
        .expect("write the router config");
        let bin = shardgate_bin();
        let log = dir.join("router.log");
        let process =
            pgharness::router::start(&pgharness::router::Launch::new(&bin, &config, &log))
                .unwrap_or_else(|e| panic!("{e}"));
        Router { port, dir, process }
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{DATABASE}",
            self.port
        )
    }

    pub fn log_text(&self) -> String {
        self.process.log_text()
    }

    /// Sends `signal` to the router.
    pub fn signal(&self, signal: i32) {
        self.process.signal(signal);
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join("router.toml")
    }

    /// The shard map file the router reads (and re-reads on SIGHUP).
    pub fn shardmap_path(&self) -> PathBuf {
        self.dir.join("shardmap.toml")
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Pids of `pid` and all its children (a postmaster and its backends).
pub fn process_tree(pid: u32) -> Vec<i32> {
    std::iter::once(pid)
        .chain(pgharness::proc::children(pid))
        .map(|p| p as i32)
        .collect()
}

/// Sends `signal` to every pid.
pub fn signal_all(pids: &[i32], signal: i32) {
    for &p in pids {
        // SAFETY: kill(2) on processes this test started (a Postgres server and its children).
        unsafe {
            libc::kill(p, signal);
        }
    }
}
