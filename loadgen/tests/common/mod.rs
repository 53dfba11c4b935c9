//! Shared pieces of loadgen's integration tests: real Postgres clusters (pgharness), the
//! loadgen binary, and a real `shardgate` router process (the minimal bits of
//! router/tests/common, copied so loadgen's tests do not depend on the router's).

#![allow(dead_code)]

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// The shardgate binary: target/debug/shardgate, built if missing.
pub fn shardgate_bin() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("debug").join("shardgate");
    if !bin.exists() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-q", "-p", "shardgate", "--bin", "shardgate"])
            .current_dir(&root)
            .status()
            .expect("run cargo build -p shardgate");
        assert!(status.success(), "cargo build -p shardgate failed");
    }
    bin
}

/// A `shardgate` process in front of a cluster; killed on drop.
pub struct Router {
    pub port: u16,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
    log: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Router {
    pub fn start(map: &ShardMap) -> Router {
        let dir = scratch("router");
        std::fs::write(dir.join("shardmap.toml"), map.to_toml()).expect("write shard map");
        let port = free_port();
        let config = format!(
            "listen = \"127.0.0.1:{port}\"\nshardmap = \"shardmap.toml\"\ndatabase = \"{DATABASE}\"\n\n[[users]]\nname = \"{USER}\"\npassword = \"{PASSWORD}\"\n\n[backend]\nuser = \"{}\"\npassword = \"{}\"\n\n[pool]\nmax_size = 8\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n",
            pgharness::SUPERUSER,
            pgharness::PASSWORD
        );
        std::fs::write(dir.join("router.toml"), config).expect("write router config");
        let log = dir.join("router.log");
        let child = Command::new(shardgate_bin())
            .arg("--config")
            .arg(dir.join("router.toml"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("router log"))
            .stderr(
                std::fs::File::options()
                    .append(true)
                    .open(&log)
                    .expect("router log"),
            )
            .spawn()
            .expect("start shardgate");
        let router = Router {
            port,
            dir,
            child: Mutex::new(Some(child)),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = router
                .child
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("shardgate exited with {status}:\n{}", router.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "shardgate did not start listening:\n{}",
                router.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        router
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{DATABASE}",
            self.port
        )
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Pids of `pid` and all its children (a postmaster and its backends).
pub fn process_tree(pid: u32) -> Vec<i32> {
    let mut out = vec![pid as i32];
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            // pid (comm) state ppid ...
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(pid) {
                out.push(child);
            }
        }
    }
    out
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
